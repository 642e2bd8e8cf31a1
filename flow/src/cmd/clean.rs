//! `bunkai flow clean`: the record buffers of processes that have ended,
//! removed (clean.rs).

use crate::clean::{self, CleanOptions};
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  bunkai flow clean              # buffers of ended processes in $BUNKAI_FLOW_DIR or /dev/shm\n  bunkai flow clean --dry-run    # only list them\n  bunkai flow clean --all        # running processes' too (they keep writing to the removed file)")]
pub struct CleanArgs {
    /// List what would be removed, remove nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Also the buffers of processes that still run
    #[arg(long)]
    pub all: bool,
    /// One JSON object on stdout: dir, dry_run, removed (path, pid, bytes), bytes, kept
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CleanArgs) -> Result<ExitCode> {
    let CleanArgs { dry_run, all, json } = a;
    clean::clean(&CleanOptions { dry_run, all, json })
}
