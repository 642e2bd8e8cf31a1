//! `bunkai flow check ASPECT.xml [--program EXE[@HOST]]...`: what can be
//! known about an aspect before it is woven (check.rs).

use crate::check::{self, CheckOptions};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The aspect (XML, the paper's notation)
    pub aspect: PathBuf,
    /// A program built with `bunkai flow cc` that the aspect will be woven
    /// into, optionally on a named host (for @HOST in within_file and
    /// within_function); repeat for several
    #[arg(long = "program", value_name = "EXE[@HOST]")]
    pub programs: Vec<String>,
    /// One JSON document: the pointcuts and the join points each selects
    #[arg(long)]
    pub json: bool,
    /// Extra flags for compiling the advice, as `weave --cflags` (e.g. -I
    /// and -include for the header structs xin/xout write)
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    pub cflags: Option<String>,
}

pub fn run(a: CheckArgs) -> Result<ExitCode> {
    let CheckArgs { aspect, programs, json, cflags } = a;
    check::run(&CheckOptions { aspect, programs, json, cflags })
}
