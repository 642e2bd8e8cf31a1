//! `bunkai flow`: XenLASY (seed 003). `cc` builds a program with the
//! join-point pass; `points` lists the join points it carries; `check`
//! checks an aspect against them.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: FlowCmd,
}

#[derive(clap::Subcommand)]
enum FlowCmd {
    /// Compile and link with clang-14, recording join points and placing sleds (adds -g)
    ///
    /// Every argument goes to clang-14, --help and --version included (this
    /// help is `bunkai help flow cc`). Pass options reach the pass with
    /// -mllvm: -bunkai-flow-structs=a,b -bunkai-flow-functions=f,g
    /// -bunkai-flow-files=x.c -bunkai-flow-kinds=load,store,addr,entry
    /// -bunkai-flow-locals=false -bunkai-flow-max-operands=N -bunkai-flow-verbose.
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Cc(bunkai_flow::cc::CcArgs),
    /// List the join points of an executable or shared object (--json for tools)
    Points(bunkai_flow::points::PointsArgs),
    /// Check an aspect (XML) before weaving: syntax, xflow names, xin/xout
    /// pairs, fields, and with --program the join points each pointcut
    /// selects and the variables visible there
    Check(bunkai_flow::check::CheckArgs),
    /// The records STORE_DATA left in each process's buffer (--json for tools)
    Dump(bunkai_flow::report::DumpArgs),
    /// Per-flow timelines from every process's buffer (Table 2); --chrome and
    /// --otel export them for trace viewers
    Report(bunkai_flow::report::ReportArgs),
    /// The C of the advice module an aspect makes for a program (what weaving
    /// loads; sleds at their link-time addresses)
    Emit(bunkai_flow::weave::EmitArgs),
    /// Weave an aspect into a running program (no restart): check it, compile
    /// its advice, load it through bunkai mod, patch the sleds it selects
    Weave(bunkai_flow::weave::WeaveArgs),
    /// Take a woven aspect out of a running program
    Unweave(bunkai_flow::weave::UnweaveArgs),
    /// Remove the record buffers of processes that have ended (--dry-run lists them)
    Clean(bunkai_flow::clean::CleanArgs),
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        FlowCmd::Cc(c) => bunkai_flow::cc::run(&c),
        FlowCmd::Points(p) => bunkai_flow::points::run(&p),
        FlowCmd::Check(c) => bunkai_flow::check::run(&c),
        FlowCmd::Dump(d) => bunkai_flow::report::dump(&d),
        FlowCmd::Report(r) => bunkai_flow::report::report(&r),
        FlowCmd::Emit(e) => bunkai_flow::weave::emit(&e),
        FlowCmd::Weave(w) => bunkai_flow::weave::weave(&w),
        FlowCmd::Unweave(u) => bunkai_flow::weave::unweave(&u),
        FlowCmd::Clean(c) => bunkai_flow::clean::clean(&c),
    }
}
