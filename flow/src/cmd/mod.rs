//! `bunkai flow` and its verbs: the command-line arguments of each verb
//! and the function that runs it, one file a verb. The crate's other
//! modules know nothing of clap.

pub mod cc;
pub mod check;
pub mod clean;
pub mod dump;
pub mod emit;
pub mod points;
pub mod report;
pub mod unweave;
pub mod weave;

use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    #[command(about = cc::ABOUT, long_about = cc::LONG_ABOUT, disable_help_flag = true, disable_version_flag = true)]
    Cc(cc::CcArgs),
    /// List the join points of an executable or shared object (--json for tools)
    Points(points::PointsArgs),
    /// Check an aspect (XML) before weaving: syntax, xflow names, xin/xout
    /// pairs, fields, and with --program the join points each pointcut
    /// selects and the variables visible there
    Check(check::CheckArgs),
    /// The records STORE_DATA left in each process's buffer (--json for tools)
    Dump(dump::DumpArgs),
    /// Per-flow timelines from every process's buffer (Table 2); --chrome and
    /// --otel export them for trace viewers
    Report(report::ReportArgs),
    /// The C of the advice module an aspect makes for a program (what weaving
    /// loads; sleds at their link-time addresses)
    Emit(emit::EmitArgs),
    /// Weave an aspect into a running program (no restart): check it, compile
    /// its advice, load it through bunkai mod, patch the sleds it selects
    Weave(weave::WeaveArgs),
    /// Take a woven aspect out of a running program
    Unweave(unweave::UnweaveArgs),
    /// Remove the record buffers of processes that have ended (--dry-run lists them)
    Clean(clean::CleanArgs),
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.cmd {
        Cmd::Cc(a) => cc::run(a),
        Cmd::Points(a) => points::run(a),
        Cmd::Check(a) => check::run(a),
        Cmd::Dump(a) => dump::run(a),
        Cmd::Report(a) => report::run(a),
        Cmd::Emit(a) => emit::run(a),
        Cmd::Weave(a) => weave::run(a),
        Cmd::Unweave(a) => unweave::run(a),
        Cmd::Clean(a) => clean::run(a),
    }
}
