//! `bunkai trace` and its verbs: the command-line arguments of each verb
//! and the function that runs it, one file a verb. The crate's other
//! modules know nothing of clap.

pub mod calls;
pub mod dump;
pub mod pages;
pub mod record;
pub mod report;

use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    Record(record::RecordArgs),
    Dump(dump::DumpArgs),
    Calls(calls::CallsArgs),
    Report(report::ReportArgs),
    Pages(pages::PagesArgs),
}

impl Args {
    /// Whether the verb runs a program that keeps stdout and gets Ctrl-C:
    /// `record` passes the signal to the traced command, still writes what
    /// was recorded, and prints its --json summary on stderr.
    pub fn runs_a_program(&self) -> bool {
        matches!(self.cmd, Cmd::Record(_))
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.cmd {
        Cmd::Record(a) => record::run(a),
        Cmd::Dump(a) => dump::run(a),
        Cmd::Calls(a) => calls::run(a),
        Cmd::Report(a) => report::run(a),
        Cmd::Pages(a) => pages::run(a),
    }
}
