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

/// Parses a size such as `65536`, `64K`, `64KiB`, `1MiB`, `1.5M` (binary
/// units: K = 1024).
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => anyhow::bail!("bad size {text:?} (use e.g. 65536, 64KiB or 1MiB)"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("bad size {text:?} (use e.g. 65536, 64KiB or 1MiB)"))?;
    if !(v > 0.0) || !v.is_finite() {
        anyhow::bail!("size {text:?} must be positive");
    }
    Ok((v * mult as f64) as u64)
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert_eq!(parse_size("1.5M").unwrap(), 1572864);
        assert!(parse_size("0").is_err());
        assert!(parse_size("64 parsecs").is_err());
        assert!(parse_size("").is_err());
    }
}
