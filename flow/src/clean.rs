//! `bunkai flow clean`: removes the record buffers of processes that have
//! ended. A buffer outlives its process on purpose (report reads it
//! afterwards), so without this they pile up in /dev/shm, each holding the
//! memory its records took (a sparse file keeps what was written).

use anyhow::{bail, Result};
use std::path::PathBuf;
use std::os::unix::fs::MetadataExt;
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

use crate::buffer::pid_of;

pub fn clean(a: &CleanOptions) -> Result<ExitCode> {
    let dir = crate::buffer::dir();
    let files: Vec<PathBuf> = match crate::buffer::find(&[], &dir) {
        Ok(f) => f,
        Err(_) if dir.is_dir() => Vec::new(), // nothing to clean
        Err(e) => return Err(e),
    };
    let (mut removed, mut kept, mut others, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut out = String::new();
    let mut listed = Vec::new();
    // our uid as the kernel sees it: /proc/self belongs to the effective uid
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    for f in &files {
        let Some(pid) = pid_of(f) else { continue };
        // only our own buffers: another user's are theirs to clean (even
        // for root: a server's workers that dropped to nobody still write)
        match std::fs::symlink_metadata(f) {
            Ok(m) if m.uid() == me && m.file_type().is_file() => {}
            Ok(_) => {
                others += 1;
                continue;
            }
            Err(_) => continue, // gone meanwhile
        }
        if !a.all && crate::buffer::writer_runs(f) {
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
            "other_users": others,
        });
        crate::stdout(&format!("{o}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    out += &format!(
        "{} {} buffer{} ({} MiB held) in {}; kept {} of running processes{}\n",
        if a.dry_run { "would remove" } else { "removed" },
        removed,
        if removed == 1 { "" } else { "s" },
        bytes >> 20,
        dir.display(),
        kept,
        if others > 0 { format!(" and {others} of other users (theirs to clean)") } else { String::new() }
    );
    crate::stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}
