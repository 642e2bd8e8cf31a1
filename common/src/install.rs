//! Where bunkai's own helpers and runtimes are: `$BUNKAI_LIBDIR`, else
//! `<directory of the bunkai binary>/../lib/bunkai` (what `make` builds
//! into build/ and what an install lays out).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The directory of helpers and runtimes.
pub fn helper_libdir() -> Result<PathBuf> {
    Ok(match std::env::var_os("BUNKAI_LIBDIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().context("cannot find the bunkai binary")?;
            let bin = exe.parent().unwrap_or(Path::new("."));
            bin.join("../lib/bunkai")
        }
    })
}

/// `name` in the helper directory, which must exist; the one error for a
/// missing helper says how to get it.
pub fn helper(name: &str) -> Result<PathBuf> {
    let p = helper_libdir()?.join(name);
    require(&p)?;
    Ok(p)
}

/// Fails with the missing-helper line unless `p` exists.
pub fn require(p: &Path) -> Result<()> {
    if !p.exists() {
        bail!("{} is missing (run `make` in the bunkai tree, or set BUNKAI_LIBDIR)", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_helper_says_how_to_get_it() {
        let e = super::require(std::path::Path::new("/nonexistent/bunkai-helper")).unwrap_err().to_string();
        assert_eq!(e, "/nonexistent/bunkai-helper is missing (run `make` in the bunkai tree, or set BUNKAI_LIBDIR)");
    }
}
