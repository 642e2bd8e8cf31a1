//! `bunkai flow emit`: the C of the advice module an aspect makes for a
//! program (weave.rs, advice.rs).

use crate::weave::{self, EmitOptions};
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct EmitArgs {
    /// The aspect (XML, the paper's notation)
    pub aspect: std::path::PathBuf,
    /// The program built with `bunkai flow cc` (EXE[@HOST])
    #[arg(long = "program", value_name = "EXE[@HOST]")]
    pub program: String,
    /// Write the C here instead of standard output
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// The module's name (default: flow_ASPECT)
    #[arg(long)]
    pub name: Option<String>,
}

pub fn run(a: EmitArgs) -> Result<ExitCode> {
    let EmitArgs { aspect, program, out, name } = a;
    weave::emit(&EmitOptions { aspect, program, out, name })
}
