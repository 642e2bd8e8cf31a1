//! `bunkai flow points FILE [--json]`: the join points of a program
//! (points.rs).

use crate::points;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct PointsArgs {
    /// An executable or shared object built with `bunkai flow cc`
    pub file: PathBuf,
    /// One JSON document: {"file", "version", "count", "joinpoints": [...]}
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: PointsArgs) -> Result<ExitCode> {
    points::run(&a.file, a.json)
}
