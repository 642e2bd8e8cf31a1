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
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        TraceCmd::Record(r) => bunkai_trace::record::run(&r),
    }
}
