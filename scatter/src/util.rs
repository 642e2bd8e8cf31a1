//! Small file helpers: nothing half-written.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Writes `data` to `path` through a temporary file in the same directory
/// and a rename, so readers see the old file or the new one, never a part.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".bunkai-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(data)?;
    tmp.as_file().sync_all().ok();
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Size of a file in bytes (0 when it is missing).
pub fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}
