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
    /// Print what was unwoven as one JSON object on stdout (unwoven, pid, unload_us; processes: pid, parent, unload_us; unchecked: descendants whose host did not answer)
    #[arg(long)]
    pub json: bool,
    /// Unweave only PID, not its descendants (by default every descendant
    /// that has the module loses it too)
    #[arg(long)]
    pub no_descendants: bool,
}

pub fn run(a: UnweaveArgs) -> Result<ExitCode> {
    let UnweaveArgs { pid, name, json, no_descendants } = a;
    weave::unweave(&UnweaveOptions { pid, name, json, no_descendants })
}
