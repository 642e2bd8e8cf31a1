//! Starting a scattered program over a network (§6): `bunkai scatter serve`
//! and `bunkai scatter run`.
//!
//! The origin is any static HTTP server that serves a grouped scatter output
//! directory as files (`bunkai scatter serve`, nginx, `python3 -m http.server`, an
//! object store). `bunkai scatter run URL` fetches the small index (remote.json),
//! the launcher (compressed) and the group map into a cache directory laid
//! out like the output directory, then runs the launcher with BUNKAI_ORIGIN
//! pointing at the origin's library directory. From there the launcher's
//! manager and the fetch library (runtime/fetch.c) bring the groups: the
//! preload thread in group order, and a miss at once.
//!
//! Everything fetched here is checked against SHA-256 sums: the index names
//! the launcher's and the map's, the map names every group's.

use crate::http::http_get;
use crate::index::Index;
use crate::layout::INDEX;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub const FETCH_LIB: &str = "libbunkai-fetch.so";

pub struct RunOptions {
    pub url: String,
    pub cache: Option<PathBuf>,
    pub preload: bool,
    pub compress: bool,
    pub verbose: bool,
    pub args: Vec<String>,
}

fn sha_hex(data: &[u8]) -> String {
    bunkai_common::fmt::hex(&Sha256::digest(data))
}

/// Fetches `rel` from the origin into `cache/rel` unless a copy with the
/// right checksum is there; `zst` fetches `rel.zst` and decompresses.
fn fetch_checked(
    base: &str,
    cache: &Path,
    rel: &str,
    bytes: u64,
    zst_bytes: Option<u64>,
    sha: &str,
    log: &mut Vec<String>,
) -> Result<PathBuf> {
    let dest = cache.join(rel);
    if let Ok(have) = std::fs::read(&dest) {
        if sha_hex(&have) == sha {
            log.push(format!("{rel}: in the cache"));
            return Ok(dest);
        }
    }
    let t = Instant::now();
    let (data, wire) = match zst_bytes {
        Some(zb) => {
            let z = http_get(&format!("{base}{rel}.zst"), zb)?;
            let d = zstd::bulk::decompress(&z, bytes as usize)
                .map_err(|e| anyhow::anyhow!("{base}{rel}.zst does not decompress: {e} (corrupted on the origin?)"))?;
            (d, z.len())
        }
        None => {
            let d = http_get(&format!("{base}{rel}"), bytes)?;
            let n = d.len();
            (d, n)
        }
    };
    if data.len() as u64 != bytes || sha_hex(&data) != sha {
        bail!("{base}{rel} fails its SHA-256 check (corrupted, or the origin changed: run again)");
    }
    std::fs::create_dir_all(dest.parent().unwrap())?;
    bunkai_common::files::write_atomic(&dest, &data)?;
    log.push(format!("{rel}: fetched {wire} bytes in {:.0} ms", t.elapsed().as_secs_f64() * 1e3));
    Ok(dest)
}

/// Default cache: $XDG_CACHE_HOME/bunkai/<key> or ~/.cache/bunkai/<key>,
/// keyed by the URL.
fn default_cache(base: &str) -> Result<PathBuf> {
    let root = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("no HOME or XDG_CACHE_HOME for the cache (give --cache DIR)")?;
    Ok(root.join("bunkai").join(&sha_hex(base.as_bytes())[..16]))
}

/// Prepares the cache and returns the command that runs the program, plus
/// the decision log.
pub fn prepare(o: &RunOptions) -> Result<(Command, Vec<String>)> {
    let mut base = o.url.clone();
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        bail!("{base} is not an http:// or https:// URL (give the URL bunkai scatter serve printed)");
    }
    if !base.ends_with('/') {
        base.push('/');
    }
    let mut log = Vec::new();
    let t = Instant::now();
    let index = Index::parse(&http_get(&format!("{base}{INDEX}"), 1 << 20)?)?;
    log.push(format!(
        "{INDEX}: {} ({}), build {}, fetched in {:.0} ms",
        index.name,
        index.kind,
        index.build,
        t.elapsed().as_secs_f64() * 1e3
    ));
    if index.kind != "exe" {
        bail!("{} is a scattered library, not a program (run the program that loads it)", index.name);
    }
    let cache = match &o.cache {
        Some(c) => c.clone(),
        None => default_cache(&base)?,
    };
    std::fs::create_dir_all(&cache)
        .with_context(|| format!("cannot create the cache {} (give --cache DIR)", cache.display()))?;
    let fetch_lib = bunkai_common::install::helper(FETCH_LIB)?;
    let launcher = fetch_checked(
        &base,
        &cache,
        &index.launcher,
        index.launcher_bytes,
        o.compress.then_some(index.launcher_zst_bytes),
        &index.launcher_sha256,
        &mut log,
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755))?;
    let map_rel = format!("{}/{}", index.libdir, crate::layout::GROUP_MAP);
    fetch_checked(
        &base,
        &cache,
        &map_rel,
        index.map_bytes,
        o.compress.then_some(index.map_zst_bytes),
        &index.map_sha256,
        &mut log,
    )?;
    // The groups' dictionary, once, before the program starts; the fetch
    // library finds it in the cache beside the map.
    let dict_rel = format!("{}/{}", index.libdir, crate::layout::DICT_FILE);
    if o.compress && index.dict_bytes > 0 {
        fetch_checked(&base, &cache, &dict_rel, index.dict_bytes, None, &index.dict_sha256, &mut log)?;
    } else {
        let _ = std::fs::remove_file(cache.join(&dict_rel));
    }

    let mut cmd = Command::new(&launcher);
    cmd.args(&o.args)
        .env("BUNKAI_ORIGIN", format!("{base}{}/", index.libdir))
        .env("BUNKAI_FETCH", &fetch_lib)
        .env("BUNKAI_PRELOAD", if o.preload { "1" } else { "0" })
        .env("BUNKAI_COMPRESS", if o.compress { "1" } else { "0" })
        .env_remove("BUNKAI_PROFILE");
    log.push(format!(
        "running {} from {} (preload {}, compression {})",
        index.name,
        cache.display(),
        if o.preload { "on" } else { "off" },
        if o.compress { "on" } else { "off" }
    ));
    Ok((cmd, log))
}

/// Writes the lines of a fetch log as a short summary (for -v).
pub fn summarize_fetch_log(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut pre, mut dem, mut bytes) = (0, 0, 0u64);
    for l in text.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        if f.len() != 4 {
            continue;
        }
        match f[2] {
            "preload" => pre += 1,
            "demand" => dem += 1,
            _ => {}
        }
        bytes += f[3].parse::<u64>().unwrap_or(0);
        out.push(format!("group {} at {} ms: {} ({} bytes)", f[1], f[0], f[2], f[3]));
    }
    out.push(format!("{pre} groups preloaded, {dem} fetched on demand, {bytes} bytes in all"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_log_summary() {
        let s = summarize_fetch_log("1.0\t0\tpreload\t100\n2.5\t3\tdemand\t50\njunk\n");
        assert_eq!(s.last().unwrap(), "1 groups preloaded, 1 fetched on demand, 150 bytes in all");
    }
}
