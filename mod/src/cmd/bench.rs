//! `bunkai mod bench`: the evaluation: Table 1, measurement 2, prediction error, dlopen beside ours.

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Fewer sizes and repetitions (about a minute)
    #[arg(long)]
    pub quick: bool,
    /// Print the results as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
    /// Also write the markdown tables here
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
}

pub fn run(a: BenchArgs) -> Result<ExitCode> {
    let BenchArgs { quick, json, markdown } = a;
    crate::bench::bench(quick, json, markdown.as_deref())?;
    Ok(ExitCode::SUCCESS)
}
