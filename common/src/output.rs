//! A command's result on standard output. Errors are returned as they are:
//! the CLI's main turns a closed pipe (`| head`) into a quiet exit 0 and a
//! full disk into one line, for every command alike.

use anyhow::Result;
use std::io::Write;

/// Writes `text` to standard output and flushes it.
pub fn stdout(text: &str) -> Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())?;
    o.flush()?;
    Ok(())
}
