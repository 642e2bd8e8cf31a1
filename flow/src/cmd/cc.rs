//! `bunkai flow cc [CLANG_ARGS...]`: clang-14 with the join-point pass
//! (cc.rs).

use crate::cc;
use anyhow::Result;
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CcArgs {
    /// Arguments for clang-14, as you would give them to clang
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CLANG_ARGS"
    )]
    pub args: Vec<OsString>,
}

pub fn run(a: CcArgs) -> Result<ExitCode> {
    cc::run(&a.args)
}
