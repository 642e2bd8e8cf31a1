//! `bunkai flow unweave`: a woven aspect taken out of a running program
//! (weave.rs).

use crate::weave::{self, UnweaveOptions};
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct UnweaveArgs {
    #[arg(long)]
    pub pid: u32,
    /// The woven module's name (default: the only flow_ module loaded)
    pub name: Option<String>,
}

pub fn run(a: UnweaveArgs) -> Result<ExitCode> {
    let UnweaveArgs { pid, name } = a;
    weave::unweave(&UnweaveOptions { pid, name })
}
