//! `bunkai flow dump`: the records STORE_DATA left in each process's
//! buffer (report.rs).

use crate::report::{self, DumpOptions};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct DumpArgs {
    /// Buffer files (default: every bunkai-flow.*.buf in $BUNKAI_FLOW_DIR or /dev/shm)
    pub buffers: Vec<PathBuf>,
    /// One JSON document instead of text
    #[arg(long)]
    pub json: bool,
    /// Only each buffer's header line (records, bytes used, dropped), no records
    #[arg(long)]
    pub summary: bool,
}

pub fn run(a: DumpArgs) -> Result<ExitCode> {
    let DumpArgs { buffers, json, summary } = a;
    report::dump(&DumpOptions { buffers, json, summary })
}
