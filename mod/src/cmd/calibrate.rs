//! `bunkai mod calibrate`: fit the load-time model on this machine (loads modules of 1 KB to 4 MB).

use crate::model;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// Where to write the model (default: ~/.cache/bunkai/mod-model.json)
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Fewer sizes and repetitions
    #[arg(long)]
    pub quick: bool,
    /// Print the fitted model as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CalibrateArgs) -> Result<ExitCode> {
    let CalibrateArgs { model: path, quick, json } = a;
    let path = path.unwrap_or_else(model::default_path);
    // where the model goes is checked before the minutes of work:
    // a directory, or a place we cannot write, is refused now
    if path.is_dir() {
        bail!("{} is a directory (give a file name, e.g. {})", path.display(), path.join("model.json").display());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".bunkai-mod-model-")
        .tempfile_in(&dir)
        .with_context(|| format!("cannot write in {} (give --model a writable place)", dir.display()))?;
    let m = crate::bench::calibrate(quick)?;
    std::fs::write(tmp.path(), serde_json::to_string_pretty(&m)?)?;
    tmp.persist(&path).map_err(|e| anyhow::anyhow!("cannot write {}: {}", path.display(), e.error))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&m)?);
    } else {
        eprintln!(
            "bunkai mod: model written to {}: load = {:.3} us per 4 KB + {:.0} us (R² {:.3})",
            path.display(),
            m.total.slope,
            m.total.intercept,
            m.total.r2
        );
    }
    Ok(ExitCode::SUCCESS)
}
