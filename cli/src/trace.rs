//! `bunkai trace`: record (the Valgrind tool) and the analysis tools.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: TraceCmd,
}

#[derive(clap::Subcommand)]
enum TraceCmd {
    Record(bunkai_trace::record::RecordArgs),
    Dump(bunkai_trace::dump::DumpArgs),
    Calls(bunkai_trace::calls::CallsArgs),
    Report(bunkai_trace::report::ReportArgs),
    Pages(bunkai_trace::pages::PagesArgs),
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        TraceCmd::Record(r) => bunkai_trace::record::run(&r),
        TraceCmd::Dump(d) => bunkai_trace::dump::run(&d),
        TraceCmd::Calls(c) => bunkai_trace::calls::run(&c),
        TraceCmd::Report(r) => bunkai_trace::report::run(&r),
        TraceCmd::Pages(p) => bunkai_trace::pages::run(&p),
    }
}
