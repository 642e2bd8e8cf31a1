//! `bunkai scatter stats`: the paper's Tables 3 and 4 for one output (stats.rs).

use crate::stats as st;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct StatsArgs {
    /// A scatter output directory
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Print JSON (keys: launcher_bytes, original_bytes, libraries, library_bytes, ...)
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: StatsArgs) -> Result<ExitCode> {
    let s = st::compute(&a.out)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", st::render(&s));
    }
    Ok(ExitCode::SUCCESS)
}
