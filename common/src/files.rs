//! Files written whole: readers see the old file or the new one, never a
//! part; an interrupted command removes what it had not finished.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Writes `data` to `path` through a temporary file in the same directory
/// and a rename, so readers see the old file or the new one, never a part.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| Ok(w.write_all(data)?))
}

/// Like `write_atomic`, for output produced piece by piece: `write` fills a
/// buffered temporary file that is renamed over `path` only if it succeeds.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".bunkai-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {} (check the directory exists and is writable)", dir.display()))?;
    let mut w = std::io::BufWriter::new(tmp);
    write(&mut w)?;
    let tmp = w.into_inner().map_err(|e| anyhow::anyhow!("cannot write {} ({})", path.display(), e.error()))?;
    tmp.as_file().sync_all().ok();
    // tempfile creates 0600; outputs are served by any static web server,
    // so they get the usual 0644.
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).ok();
    }
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Directories to remove if the user interrupts us (Ctrl-C, SIGTERM): the
/// temporary build directories of scatter and group.
static IN_PROGRESS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers `dir` for removal on interrupt until the guard is dropped.
pub struct InterruptCleanup(PathBuf);

pub fn remove_on_interrupt(dir: &Path) -> InterruptCleanup {
    IN_PROGRESS.lock().unwrap().push(dir.to_path_buf());
    InterruptCleanup(dir.to_path_buf())
}

impl Drop for InterruptCleanup {
    fn drop(&mut self) {
        IN_PROGRESS.lock().unwrap().retain(|p| p != &self.0);
    }
}

/// Installs the SIGINT/SIGTERM handler every command without handling of
/// its own gets: it removes the registered directories (an interrupted run
/// leaves nothing half-written behind), says so in one line and exits 130,
/// as a shell reports a command that Ctrl-C ended.
pub fn install_interrupt_cleanup(who: &'static str) {
    let _ = ctrlc::set_handler(move || {
        let dirs: Vec<PathBuf> = IN_PROGRESS.lock().map(|v| v.clone()).unwrap_or_default();
        for d in &dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        if dirs.is_empty() {
            eprintln!("bunkai {who}: interrupted");
        } else {
            eprintln!("bunkai {who}: interrupted; removed the unfinished output");
        }
        std::process::exit(130);
    });
}

/// Size of a file in bytes (0 when it is missing).
pub fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}
