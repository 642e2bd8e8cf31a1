//! `bunkai trace calls`: function entries and exits per thread, like
//! uftrace (calls.rs).

use crate::calls::{self, CallsOptions};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Print function entries and exits per thread (like uftrace), as text,
/// JSON or a Chrome/Perfetto trace
#[derive(clap::Args, Debug)]
#[command(long_about = "Rebuild the call tree of every thread from the instruction trace and \
print it like uftrace: `[time] |   function() {` ... `} /* function: N instr */`, with the \
instruction index of the process as time. --chrome writes a Chrome trace / Perfetto JSON file \
(one microsecond = one instruction); --json prints every frame.")]
pub struct CallsArgs {
    /// Trace file written by `bunkai trace record`
    pub file: PathBuf,
    /// Print a JSON array of frames {pid, tid, depth, name, file, line, enter, leave, instructions}
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace (Perfetto, chrome://tracing) JSON file instead of the text
    #[arg(long, value_name = "OUT.json")]
    pub chrome: Option<PathBuf>,
    /// Only this stream (its number, or a pid)
    #[arg(long, value_name = "N")]
    pub stream: Option<u64>,
    /// Show only frames less than N calls deep
    #[arg(long, value_name = "N")]
    pub depth: Option<usize>,
}

pub fn run(a: CallsArgs) -> Result<ExitCode> {
    let CallsArgs { file, json, chrome, stream, depth } = a;
    calls::run(&CallsOptions { file, json, chrome, stream, depth })
}
