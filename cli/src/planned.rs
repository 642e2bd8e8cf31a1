//! Subcommands that are planned but not built yet (trace, share, flow, mod).
//! Each gets its own module here when its issue is done.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Arguments for the subcommand, once it exists
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

pub fn run(_a: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet (planned: see the README's tour of subcommands)")
}
