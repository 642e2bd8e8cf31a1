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
    /// Only the join points in this function
    #[arg(long, value_name = "NAME")]
    pub function: Option<String>,
    /// Only the accesses to members of this struct
    #[arg(long = "struct", value_name = "NAME")]
    pub strukt: Option<String>,
}

pub fn run(a: PointsArgs) -> Result<ExitCode> {
    points::run(&a.file, a.json, &points::Filter { function: a.function, strukt: a.strukt })
}
