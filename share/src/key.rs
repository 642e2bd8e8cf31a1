//! The cluster key: 32 random bytes that every host of a `bunkai share`
//! cluster holds, like an SSH key. `bunkai share key` writes one; the CLI
//! and the node daemon read it and refuse one that others could read.
//!
//! ```text
//! $ bunkai share key
//! bunkai share: wrote a new key to /root/.config/bunkai/share.key (copy it to the same path on every host, mode 600)
//! $ cat ~/.config/bunkai/share.key
//! 3f1c...64 hex digits
//! ```
//!
//! Where: `--key FILE`, else `$BUNKAI_SHARE_KEY`, else
//! `$XDG_CONFIG_HOME/bunkai/share.key`, else `~/.config/bunkai/share.key`.
//! What is checked before it is trusted: a regular file owned by us, no
//! permission bits for group or others, in a directory owned by us or root
//! that group and others cannot write.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const KEY_BYTES: usize = 32;

/// The key file to use: `given`, else the environment's, else the default.
pub fn path(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("BUNKAI_SHARE_KEY").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let config = match std::env::var_os("XDG_CONFIG_HOME").filter(|p| !p.is_empty()) {
        Some(c) => PathBuf::from(c),
        None => {
            let home = std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .context("no HOME to find the key in (give --key FILE or set BUNKAI_SHARE_KEY)")?;
            PathBuf::from(home).join(".config")
        }
    };
    Ok(config.join("bunkai").join("share.key"))
}

fn euid() -> u32 {
    unsafe { libc::geteuid() }
}

/// Reads and checks the key at `p`.
pub fn load(p: &Path) -> Result<[u8; KEY_BYTES]> {
    let d = p.display();
    let m = match std::fs::metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no key at {d} (run `bunkai share key` on one host and copy the file to the same path on the others)")
        }
        Err(e) => bail!("cannot read the key {d}: {e}"),
    };
    check_file(p, &m)?;
    let text = std::fs::read_to_string(p).with_context(|| format!("cannot read the key {d}"))?;
    parse(text.trim()).with_context(|| format!("the key {d} is damaged (write a new one with `bunkai share key --force`)"))
}

fn check_file(p: &Path, m: &std::fs::Metadata) -> Result<()> {
    let d = p.display();
    if !m.is_file() {
        bail!("the key {d} is not a regular file (give the key file itself)");
    }
    if m.uid() != euid() {
        bail!("the key {d} belongs to uid {}, not to us (uid {}) (chown it, or use a key of your own)", m.uid(), euid());
    }
    if m.mode() & 0o077 != 0 {
        bail!("the key {d} has mode {:03o}: group or others can use it (chmod 600 {d})", m.mode() & 0o777);
    }
    if let Some(dir) = p.parent().filter(|x| !x.as_os_str().is_empty()) {
        let dm = std::fs::metadata(dir).with_context(|| format!("cannot read the key's directory {}", dir.display()))?;
        if dm.uid() != euid() && dm.uid() != 0 {
            bail!("the key's directory {} belongs to uid {} (keep the key in a directory of yours)", dir.display(), dm.uid());
        }
        if dm.mode() & 0o022 != 0 && dm.mode() & 0o1000 == 0 {
            bail!(
                "the key's directory {} can be written by group or others, who could replace the key (chmod go-w {})",
                dir.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// 64 hex digits.
pub fn parse(text: &str) -> Result<[u8; KEY_BYTES]> {
    if text.len() != 2 * KEY_BYTES || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("not {} hex digits", 2 * KEY_BYTES);
    }
    let mut k = [0u8; KEY_BYTES];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap();
    }
    Ok(k)
}

/// Writes a new random key at `p` (mode 600, its directory 700 if we make
/// it). Refuses to replace one unless `force`.
pub fn create(p: &Path, force: bool) -> Result<()> {
    let d = p.display();
    if p.exists() && !force {
        bail!("a key exists already at {d} (every host holds a copy: give --force to replace it)");
    }
    if let Some(dir) = p.parent().filter(|x| !x.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    let mut k = [0u8; KEY_BYTES];
    crate::sys::random_bytes(&mut k).context("cannot get random bytes")?;
    // Written whole under a temporary name, then renamed: never half a key.
    let tmp = p.with_extension("key.tmp");
    let _ = std::fs::remove_file(&tmp);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(format!("{}\n", bunkai_common::fmt::hex(&k)).as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, p).with_context(|| format!("cannot write {d}"))?;
    load(p).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_is_private_and_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/share.key");
        create(&p, false).unwrap();
        let k = load(&p).unwrap();
        assert_ne!(k, [0u8; KEY_BYTES]);
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(p.parent().unwrap()).unwrap().mode() & 0o777, 0o700);
        let e = create(&p, false).unwrap_err().to_string();
        assert!(e.contains("a key exists already") && e.contains("--force"), "{e}");
        create(&p, true).unwrap();
        assert_ne!(load(&p).unwrap(), k, "--force wrote the same key");
        assert!(!p.with_extension("key.tmp").exists());
    }

    #[test]
    fn keys_others_could_read_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("share.key");
        create(&p, false).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("has mode 640") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("can be written by group or others"), "{e}");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(&p, "not a key\n").unwrap();
        let e = format!("{:#}", load(&p).unwrap_err());
        assert!(e.contains("is damaged") && e.contains("not 64 hex digits"), "{e}");
        let e = load(&d.path().join("none")).unwrap_err().to_string();
        assert!(e.starts_with("no key at ") && e.contains("bunkai share key"), "{e}");
    }

    #[test]
    fn the_path_follows_flag_environment_default() {
        assert_eq!(path(Some(Path::new("/x/k"))).unwrap(), PathBuf::from("/x/k"));
        assert!(parse(&"ab".repeat(32)).is_ok() && parse("ab").is_err() && parse(&"zz".repeat(32)).is_err());
    }
}
