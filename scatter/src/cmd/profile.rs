//! `bunkai scatter profile`: the first-call order of a scattered program (profile.rs).

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter profile out -- -init /dev/null db.sqlite < workload.sql
  bunkai scatter profile out --append -- other args     # merge a second run
  bunkai scatter profile out --via -- ./workload.sh out/bin/sqlite3 db")]
pub struct ProfileArgs {
    /// A scatter output directory
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Merge this run into an existing profile instead of replacing it
    #[arg(long)]
    pub append: bool,
    /// ARGS is a whole command that runs the launcher (e.g. a workload script); implied for --lib outputs
    #[arg(long)]
    pub via: bool,
    /// Arguments for the program (for a --lib output: the command that loads it)
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

pub fn run(a: ProfileArgs) -> Result<ExitCode> {
    let r = crate::profile::record(&a.out, a.append, a.via, &a.args)?;
    eprintln!(
        "bunkai profile: {} functions called ({} new), {} run(s) in {}/profile; the program {}",
        r.functions,
        r.new,
        r.runs,
        a.out.display(),
        match (r.status.code(), std::os::unix::process::ExitStatusExt::signal(&r.status)) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(s)) => format!("was killed by signal {s}"),
            _ => "ended".to_string(),
        }
    );
    Ok(ExitCode::SUCCESS)
}
