//! `bunkai trace dump`: the trace record by record (dump.rs).

use crate::decode::{self, Trace};
use crate::dump::{dump, DumpOptions};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Print a trace record by record: segment executions with their
/// instructions and memory accesses, and decoded events
#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// Trace file written by `bunkai trace record`
    pub file: PathBuf,
    /// One JSON object per line
    #[arg(long, conflicts_with = "lackey")]
    pub json: bool,
    /// Print what `valgrind --tool=lackey --trace-mem=yes` prints for the same run
    #[arg(long)]
    pub lackey: bool,
    /// Only this stream (its number, or a pid)
    #[arg(long, value_name = "N")]
    pub stream: Option<u64>,
    /// Stop after N records (segment executions and events)
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Also print definitions: each stream's objects and functions, and each
    /// segment's definition the first time it runs
    #[arg(long)]
    pub defs: bool,
    /// Only the events (syscalls, interrupts, exceptions, the window, ...),
    /// without the segment executions
    #[arg(long, conflicts_with = "lackey")]
    pub events: bool,
}

pub fn run(a: DumpArgs) -> Result<ExitCode> {
    let DumpArgs { file, json, lackey, stream, limit, defs, events } = a;
    let trace = Trace::load(&file)?;
    decode::to_stdout(|w| dump(&trace, &DumpOptions { json, lackey, stream, limit, defs, events }, w))?;
    Ok(ExitCode::SUCCESS)
}
