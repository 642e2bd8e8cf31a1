//! `bunkai scatter profile`: the first-call order of a scattered program (profile.rs).

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter profile out -- -init /dev/null db.sqlite < workload.sql
  bunkai scatter profile out --append -- other args     # merge a second run
  bunkai scatter profile out --via -- ./workload.sh out/bin/sqlite3 db
  bunkai scatter profile out --json -- args 2> summary.json   # the summary as JSON, on stderr")]
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
    /// The summary as one JSON object on stderr (stdout is the program's)
    #[arg(long)]
    pub json: bool,
    /// Arguments for the program (for a --lib output: the command that loads it)
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

pub fn run(a: ProfileArgs) -> Result<ExitCode> {
    let r = crate::profile::record(&a.out, a.append, a.via, &a.args)?;
    let code = r.status.code();
    let signal = std::os::unix::process::ExitStatusExt::signal(&r.status);
    if a.json {
        eprintln!(
            "{}",
            serde_json::json!({
                "functions": r.functions,
                "new": r.new,
                "runs": r.runs,
                "profile": a.out.join("profile"),
                "exit_code": code,
                "signal": signal,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "bunkai scatter profile: {} functions called ({} new), {} run(s) in {}/profile; the program {}",
        r.functions,
        r.new,
        r.runs,
        a.out.display(),
        match (code, signal) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(s)) => format!("was killed by signal {s}"),
            _ => "ended".to_string(),
        }
    );
    Ok(ExitCode::SUCCESS)
}
