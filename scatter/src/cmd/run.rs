//! `bunkai scatter run`: a scattered program from a URL, its groups fetched
//! as it runs (run.rs).

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter run http://127.0.0.1:8000/ -- :memory: 'select 1;'
  bunkai scatter run http://origin/sqlite3/ --cache /tmp/c --no-preload -- db.sqlite")]
pub struct RunArgs {
    /// Base URL of a grouped scatter output (as printed by bunkai scatter serve)
    #[arg(value_name = "URL")]
    pub url: String,
    /// Cache directory (default: ~/.cache/bunkai/<hash of URL>)
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Do not preload groups in the background; fetch each when first needed
    #[arg(long)]
    pub no_preload: bool,
    /// Fetch the uncompressed libraries
    #[arg(long)]
    pub no_compress: bool,
    /// Print what was fetched, from where, and when
    #[arg(short, long)]
    pub verbose: bool,
    /// Arguments for the program
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

pub fn run(a: RunArgs) -> Result<ExitCode> {
    use crate::run;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let (mut cmd, log) = run::prepare(&run::RunOptions {
        url: a.url,
        cache: a.cache,
        preload: !a.no_preload,
        compress: !a.no_compress,
        verbose: a.verbose,
        args: a.args,
    })?;
    if !a.verbose {
        let e = cmd.exec();
        anyhow::bail!("cannot start the launcher: {e}");
    }
    for l in &log {
        eprintln!("run: {l}");
    }
    let fetch_log = tempfile::NamedTempFile::new()?;
    cmd.env("BUNKAI_FETCH_LOG", fetch_log.path());
    let status = cmd.status()?;
    for l in run::summarize_fetch_log(&std::fs::read_to_string(fetch_log.path()).unwrap_or_default()) {
        eprintln!("run: {l}");
    }
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(s)) => ExitCode::from(128 + s as u8),
        _ => ExitCode::FAILURE,
    })
}
