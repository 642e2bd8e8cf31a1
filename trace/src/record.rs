//! `bunkai trace record`: runs a command under the bunkai Valgrind tool and
//! writes the trace file. (Being built.)

use std::process::ExitCode;

/// Record a trace of a command
#[derive(clap::Args, Debug)]
pub struct RecordArgs {
    /// Output trace file
    #[arg(short = 'o', long = "output")]
    pub output: std::path::PathBuf,
    /// The command to trace, after `--`
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

pub fn run(_a: &RecordArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("record is being built")
}
