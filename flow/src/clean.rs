//! `bunkai flow clean`: removes the record buffers of processes that have
//! ended. A buffer outlives its process on purpose (report reads it
//! afterwards), so without this they pile up in /dev/shm, each holding the
//! memory its records took (a sparse file keeps what was written).

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `bunkai flow clean`'s options (cmd/clean.rs).
pub struct CleanOptions {
    /// List what would be removed, remove nothing
    pub dry_run: bool,
    /// Also the buffers of processes that still run
    pub all: bool,
    /// One JSON object on stdout instead of the text
    pub json: bool,
}

/// The pid in a buffer's name (bunkai-flow.<pid>.buf).
fn pid_of(p: &Path) -> Option<u32> {
    p.file_name()?.to_str()?.strip_prefix("bunkai-flow.")?.strip_suffix(".buf")?.parse().ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

pub fn clean(a: &CleanOptions) -> Result<ExitCode> {
    let dir = crate::buffer::dir();
    let files: Vec<PathBuf> = match crate::buffer::find(&[], &dir) {
        Ok(f) => f,
        Err(_) if dir.is_dir() => Vec::new(), // nothing to clean
        Err(e) => return Err(e),
    };
    let (mut removed, mut kept, mut bytes) = (0u64, 0u64, 0u64);
    let mut out = String::new();
    let mut listed = Vec::new();
    for f in &files {
        let Some(pid) = pid_of(f) else { continue };
        if !a.all && alive(pid) {
            kept += 1;
            continue;
        }
        // what the file holds in memory (tmpfs), not its sparse length
        let held = std::fs::metadata(f).map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512).unwrap_or(0);
        listed.push(serde_json::json!({ "path": f.display().to_string(), "pid": pid, "bytes": held }));
        if a.dry_run {
            out += &format!("would remove {} (pid {pid}, {} KiB held)\n", f.display(), held >> 10);
        } else if let Err(e) = std::fs::remove_file(f) {
            bail!("cannot remove {}: {e} (is it another user's?)", f.display());
        }
        removed += 1;
        bytes += held;
    }
    if a.json {
        let o = serde_json::json!({
            "dir": dir.display().to_string(), "dry_run": a.dry_run, "removed": listed, "bytes": bytes, "kept": kept,
        });
        crate::stdout(&format!("{o}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    out += &format!(
        "{} {} buffer{} ({} MiB held) in {}; kept {} of running processes\n",
        if a.dry_run { "would remove" } else { "removed" },
        removed,
        if removed == 1 { "" } else { "s" },
        bytes >> 20,
        dir.display(),
        kept
    );
    crate::stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}
