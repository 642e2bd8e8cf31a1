//! `bunkai flow unweave`: a woven aspect taken out of a running program
//! (weave.rs).

use crate::weave::{self, UnweaveOptions};
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct UnweaveArgs {
    /// The process the aspect is woven into
    #[arg(long)]
    pub pid: u32,
    /// The woven module's name (default: the only flow_ module loaded)
    pub name: Option<String>,
    /// Print what was unwoven as one JSON object on stdout (unwoven, pid, unload_us)
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: UnweaveArgs) -> Result<ExitCode> {
    let UnweaveArgs { pid, name, json } = a;
    weave::unweave(&UnweaveOptions { pid, name, json })
}
