//! Starting a scattered program over a network (§6): `bunkai serve` and
//! `bunkai run`.
//!
//! The origin is any static HTTP server that serves a grouped scatter output
//! directory as files (`bunkai serve`, nginx, `python3 -m http.server`, an
//! object store). `bunkai run URL` fetches the small index (remote.json),
//! the launcher (compressed) and the group map into a cache directory laid
//! out like the output directory, then runs the launcher with BUNKAI_ORIGIN
//! pointing at the origin's library directory. From there the launcher's
//! manager and the fetch library (runtime/fetch.c) bring the groups: the
//! preload thread in group order, and a miss at once.
//!
//! Everything fetched here is checked against SHA-256 sums: the index names
//! the launcher's and the map's, the map names every group's.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const INDEX: &str = "remote.json";
pub const INDEX_FORMAT: &str = "bunkai-remote/1";
pub const FETCH_LIB: &str = "libbunkai-fetch.so";

/// OUT/remote.json: what `bunkai run` needs before the program starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Index {
    pub format: String,
    pub abi: u32,
    pub name: String,
    pub kind: String,
    pub build: String,
    /// Launcher path relative to the output directory; `.zst` beside it.
    pub launcher: String,
    pub launcher_bytes: u64,
    pub launcher_sha256: String,
    pub launcher_zst_bytes: u64,
    /// Library directory relative to the output directory; holds
    /// groups.map and g<hex>.so(.zst).
    pub libdir: String,
    pub map_bytes: u64,
    pub map_sha256: String,
    /// groups.map.zst beside it.
    pub map_zst_bytes: u64,
    /// groups.dict, the zstd dictionary of the .zst groups (0: none).
    pub dict_bytes: u64,
    pub dict_sha256: String,
}

impl Index {
    pub fn parse(text: &[u8]) -> Result<Index> {
        let i: Index = serde_json::from_slice(text)
            .map_err(|e| anyhow::anyhow!("the origin's {INDEX} is not a bunkai index: {e}"))?;
        if i.format != INDEX_FORMAT {
            bail!("the origin's {INDEX} has format {:?}, not {INDEX_FORMAT}", i.format);
        }
        if i.abi != crate::ABI {
            bail!("the origin serves scatter ABI {}, this bunkai speaks {} (group it with this bunkai)", i.abi, crate::ABI);
        }
        for p in [&i.launcher, &i.libdir] {
            if !safe_relative(p) {
                bail!("the origin's {INDEX} names an unsafe path {p:?}");
            }
        }
        // Printed in the decision log: nothing that moves a terminal.
        let plain = |v: &str| !v.is_empty() && v.len() <= 255 && v.chars().all(|c| c.is_ascii_graphic() && c != '/' && c != '\\');
        if !plain(&i.name) {
            bail!("the origin's {INDEX} has a bad name {:?} (printable ASCII without / or \\)", i.name);
        }
        if i.kind != "exe" && i.kind != "lib" {
            bail!("the origin's {INDEX} has an unknown kind {:?} (exe or lib)", i.kind);
        }
        if !plain(&i.build) || i.build.len() > 64 {
            bail!("the origin's {INDEX} has a bad build id {:?}", i.build);
        }
        let hex = |v: &str| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit());
        for (what, v) in [("launcher_sha256", &i.launcher_sha256), ("map_sha256", &i.map_sha256)] {
            if !hex(v) {
                bail!("the origin's {INDEX} has a bad {what} {v:?} (64 hex digits)");
            }
        }
        if i.dict_bytes > 0 && !hex(&i.dict_sha256) {
            bail!("the origin's {INDEX} has a bad dict_sha256 {:?} (64 hex digits)", i.dict_sha256);
        }
        Ok(i)
    }
}

/// A relative path with no `..`, no root, nothing odd: safe to join.
pub fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 4096
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.chars().any(|ch| ch.is_control() || ch == '\\'))
        && Path::new(p).components().all(|c| matches!(c, Component::Normal(_)))
}

// ---- serve -----------------------------------------------------------------

pub struct Server {
    server: std::sync::Arc<tiny_http::Server>,
    root: PathBuf,
    pub url: String,
}

impl Server {
    /// Binds `listen` (port 0 picks one) over the directory `root`.
    pub fn bind(root: &Path, listen: &str) -> Result<Server> {
        if !root.join(crate::manifest::MANIFEST).exists() {
            bail!("{} is not a scatter output (give the -o directory of bunkai scatter)", root.display());
        }
        if !root.join(INDEX).exists() {
            eprintln!(
                "bunkai serve: warning: {} is not grouped yet; bunkai run needs bunkai profile + bunkai group first",
                root.display()
            );
        }
        let server = tiny_http::Server::from_listener(listener(listen)?, None)
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e} (choose another --listen)"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .context("the server has no IP address")?;
        Ok(Server {
            server: std::sync::Arc::new(server),
            root: root.canonicalize()?,
            url: format!("http://{addr}/"),
        })
    }

    /// Serves until the process ends, on `threads` threads (the preload
    /// thread and a demand fetch come in parallel).
    pub fn serve(self, threads: usize, verbose: bool) -> Result<()> {
        let mut handles = Vec::new();
        for _ in 0..threads.max(1) {
            let server = self.server.clone();
            let root = self.root.clone();
            handles.push(std::thread::spawn(move || loop {
                match server.recv() {
                    Ok(req) => respond(&root, req, verbose),
                    Err(_) => break,
                }
            }));
        }
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }
}

/// A listening socket with TCP_NODELAY, which accepted sockets inherit:
/// tiny_http writes headers and body separately, and with Nagle's algorithm
/// the body then waits for the client's delayed ACK (40 ms per request).
fn listener(listen: &str) -> Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::ToSocketAddrs;
    let addr = listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("{listen} is not an address (give HOST:PORT, e.g. 127.0.0.1:8000)"))?;
    let bad = |e: std::io::Error| anyhow::anyhow!("cannot listen on {listen}: {e} (choose another --listen)");
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(bad)?;
    s.set_reuse_address(true).map_err(bad)?;
    s.set_tcp_nodelay(true).map_err(bad)?;
    s.bind(&addr.into()).map_err(bad)?;
    s.listen(128).map_err(bad)?;
    Ok(s.into())
}

fn respond(root: &Path, req: tiny_http::Request, verbose: bool) {
    use tiny_http::{Header, Method, Response, StatusCode};
    let url = req.url().split('?').next().unwrap_or("").to_string();
    let rel = url.trim_start_matches('/');
    let decoded = rel.to_string(); // our file names never need escapes
    let path = if safe_relative(&decoded) { Some(root.join(&decoded)) } else { None };
    let is_get = matches!(req.method(), Method::Get | Method::Head);
    let file = path
        .as_ref()
        .filter(|_| is_get)
        .filter(|p| p.is_file())
        .and_then(|p| std::fs::File::open(p).ok());
    let status;
    let result = match file {
        Some(f) => {
            status = 200;
            let ctype = Header::from_bytes(&b"Content-Type"[..], &b"application/octet-stream"[..]).unwrap();
            req.respond(Response::from_file(f).with_header(ctype))
        }
        None => {
            status = if is_get { 404 } else { 405 };
            req.respond(Response::from_string("not found\n").with_status_code(StatusCode(status)))
        }
    };
    if verbose {
        eprintln!("bunkai serve: {status} /{rel}{}", if result.is_err() { " (client went away)" } else { "" });
    }
}

// ---- run -------------------------------------------------------------------

pub struct RunOptions {
    pub url: String,
    pub cache: Option<PathBuf>,
    pub preload: bool,
    pub compress: bool,
    pub verbose: bool,
    pub args: Vec<String>,
}

/// GET with retries and backoff (5 attempts, 100 ms doubling). `limit`
/// bounds the body: a bigger answer is not the file we asked for.
pub fn http_get(url: &str, limit: u64) -> Result<Vec<u8>> {
    let mut delay = Duration::from_millis(100);
    let mut last = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            std::thread::sleep(delay);
            delay *= 2;
        }
        match get_once(url, limit) {
            Ok(b) => return Ok(b),
            Err(e) => last = format!("{e:#}"),
        }
    }
    bail!("cannot fetch {url}: {last}, after 5 attempts (check that the origin is up and the URL is right)")
}

fn get_once(url: &str, limit: u64) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut h = curl::easy::Easy::new();
    h.url(url)?;
    h.connect_timeout(Duration::from_secs(10))?;
    h.low_speed_limit(1)?;
    h.low_speed_time(Duration::from_secs(20))?;
    let mut too_big = false;
    {
        let mut t = h.transfer();
        t.write_function(|d| {
            if body.len() as u64 + d.len() as u64 > limit {
                too_big = true;
                return Ok(0);
            }
            body.extend_from_slice(d);
            Ok(d.len())
        })?;
        let r = t.perform();
        drop(t);
        if too_big {
            bail!("the answer is larger than expected ({limit} bytes)");
        }
        r?;
    }
    let code = h.response_code()?;
    if code != 200 {
        bail!("HTTP {code}");
    }
    Ok(body)
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
        bail!("{base} is not an http:// or https:// URL (give the URL bunkai serve printed)");
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
    let map_rel = format!("{}/{}", index.libdir, crate::stubs::GROUP_MAP);
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
    let dict_rel = format!("{}/{}", index.libdir, crate::group::DICT_FILE);
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

/// Stdout helper for `bunkai serve`: print the URL and flush, so scripts
/// can read it as soon as the server is ready.
pub fn announce(url: &str) -> Result<()> {
    let mut o = std::io::stdout();
    writeln!(o, "{url}")?;
    o.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert!(safe_relative("lib/x/g0.so"));
        assert!(!safe_relative("../etc/passwd"));
        assert!(!safe_relative("/etc/passwd"));
        assert!(!safe_relative("a/../../b"));
        assert!(!safe_relative(""));
    }

    #[test]
    fn index_checks() {
        let good = Index {
            format: INDEX_FORMAT.into(),
            abi: crate::ABI,
            name: "x".into(),
            kind: "exe".into(),
            build: "0".repeat(16),
            launcher: "bin/x".into(),
            launcher_bytes: 1,
            launcher_sha256: "0".repeat(64),
            launcher_zst_bytes: 1,
            libdir: "lib/x".into(),
            map_bytes: 1,
            map_sha256: "0".repeat(64),
            map_zst_bytes: 1,
            dict_bytes: 0,
            dict_sha256: String::new(),
        };
        let text = serde_json::to_vec(&good).unwrap();
        assert_eq!(Index::parse(&text).unwrap(), good);
        let mut bad = good.clone();
        bad.launcher = "../../bin/sh".into();
        assert!(Index::parse(&serde_json::to_vec(&bad).unwrap()).is_err());
        assert!(Index::parse(b"<html>").is_err());
        let mut old = good;
        old.abi = 1;
        assert!(Index::parse(&serde_json::to_vec(&old).unwrap()).is_err());
    }

    /// The index comes from the network: mutated indexes (bytes flipped,
    /// cut, JSON punctuation inserted; fields set to hostile values) are
    /// refused in one line naming remote.json, and an accepted one holds
    /// only safe paths and plain names (nothing that escapes the cache or
    /// writes escape sequences to the terminal in the decision log).
    #[test]
    fn mutated_indexes_are_refused_or_safe() {
        let good = Index {
            format: INDEX_FORMAT.into(),
            abi: crate::ABI,
            name: "sqlite3".into(),
            kind: "exe".into(),
            build: "0123456789abcdef".into(),
            launcher: "bin/sqlite3".into(),
            launcher_bytes: 1000,
            launcher_sha256: "a".repeat(64),
            launcher_zst_bytes: 500,
            libdir: "lib/sqlite3".into(),
            map_bytes: 100,
            map_sha256: "b".repeat(64),
            map_zst_bytes: 50,
            dict_bytes: 0,
            dict_sha256: String::new(),
        };
        let text = serde_json::to_vec(&good).unwrap();
        let hostile = [
            "", ".", "..", "../x", "/etc/passwd", "a/../../b", "a\0b", "bin/\u{1b}[2J", "C:\\x", "a//b", "~/x",
            "bin/sqlite3", "lib/x", "\u{202e}x", "x\ny",
        ];
        let mut x = 0x243f6a8885a308d3u64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545F4914F6CDD1D)
        };
        let (mut ok, mut refused) = (0, 0);
        for round in 0..20000 {
            let mut v = text.clone();
            if round % 2 == 0 {
                for _ in 0..1 + next() % 3 {
                    let i = (next() % (v.len() as u64 + 1)) as usize;
                    match next() % 4 {
                        0 if i < v.len() => v[i] ^= 1 << (next() % 8),
                        1 => v.truncate(i),
                        2 => v.insert(i, b"\"{}[],:0-e."[(next() % 11) as usize]),
                        _ if i < v.len() => v[i] = next() as u8,
                        _ => {}
                    }
                }
            } else {
                let mut j: serde_json::Value = serde_json::from_slice(&text).unwrap();
                let fields = ["name", "kind", "build", "launcher", "libdir", "launcher_sha256", "map_sha256", "dict_sha256", "format"];
                let field = fields[(next() % fields.len() as u64) as usize];
                j[field] = serde_json::Value::String(hostile[(next() % hostile.len() as u64) as usize].to_string());
                if next() % 4 == 0 {
                    j["dict_bytes"] = serde_json::json!(7);
                }
                v = serde_json::to_vec(&j).unwrap();
            }
            match Index::parse(&v) {
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.starts_with("the origin") && !e.contains('\n'), "{e}");
                    refused += 1;
                }
                Ok(i) => {
                    assert!(safe_relative(&i.launcher) && safe_relative(&i.libdir), "{i:?}");
                    assert!(!i.launcher.split('/').any(|c| c == ".." || c.is_empty()), "{i:?}");
                    for f in [&i.name, &i.kind, &i.build, &i.launcher_sha256, &i.map_sha256] {
                        assert!(f.chars().all(|c| c.is_ascii_graphic()), "{i:?}");
                    }
                    assert_eq!((i.format.as_str(), i.abi), (INDEX_FORMAT, crate::ABI));
                    ok += 1;
                }
            }
        }
        assert!(ok > 1000 && refused > 1000, "{ok} accepted, {refused} refused");
    }

    #[test]
    fn fetch_log_summary() {
        let s = summarize_fetch_log("1.0\t0\tpreload\t100\n2.5\t3\tdemand\t50\njunk\n");
        assert_eq!(s.last().unwrap(), "1 groups preloaded, 1 fetched on demand, 150 bytes in all");
    }
}
