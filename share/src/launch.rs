//! How the shared process is started (bunkai_share.h section 1): which
//! program, with which environment, and the BUNKAI_SHARE value that tells
//! the runtime its role on each host.

use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Where the program's threads go (the runtime's `<place>`; the names
/// `--place` takes are in cmd/run.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Round robin over the home host and the nodes; the first thread the
    /// program creates goes to node 1
    RoundRobin,
    /// Round robin over the nodes only
    Remote,
    /// Every thread on the home host (sharing is set up, nothing moves)
    Home,
}

impl Place {
    pub fn as_str(self) -> &'static str {
        match self {
            Place::RoundRobin => "rr",
            Place::Remote => "remote",
            Place::Home => "home",
        }
    }
}

/// The tunable that keeps the kernel from writing rseq areas: a thread's
/// rseq area may live on another host.
pub const RSEQ_OFF: &str = "glibc.pthread.rseq=0";

/// Both BUNKAI_SHARE values are padded with spaces to this length (the
/// runtime stops reading at the token): the home process and its replicas
/// then have environments of the same size, so the kernel lays out their
/// initial stacks, and the stack mapping, identically.
pub const SHARE_VALUE_LEN: usize = 96;

fn pad(mut s: String) -> String {
    while s.len() < SHARE_VALUE_LEN {
        s.push(' ');
    }
    s
}

/// BUNKAI_SHARE for the program on the home host (`key_fd` holds the run
/// key).
pub fn home_value(listen_fd: i32, nodes: usize, stats_fd: i32, place: Place, key_fd: i32) -> String {
    pad(format!("home {listen_fd} {nodes} {stats_fd} {} {key_fd}", place.as_str()))
}

/// BUNKAI_SHARE for the replica on node `host` (1-based).
pub fn replica_value(host: u32, home: &str, key_fd: i32) -> String {
    pad(format!("replica {host} {home} {key_fd}"))
}

/// 16 bytes as 32 hex digits.
pub fn valid_run_id(t: &str) -> bool {
    t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn parse_run_id(t: &str) -> Option<[u8; 16]> {
    if !valid_run_id(t) {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(b)
}

/// The runtime's two libraries, absolute (they must be at the same paths
/// on every host).
pub struct Runtime {
    /// libbunkai-share.so, for LD_PRELOAD
    pub preload: String,
    /// libbunkai-share-audit.so, for LD_AUDIT
    pub audit: String,
}

/// The environment the program gets on every host: ours, with the runtime
/// prepended to LD_PRELOAD and its audit module to LD_AUDIT, rseq turned
/// off in GLIBC_TUNABLES, eager binding (no lazy PLT writes into shared
/// memory), and no BUNKAI_SHARE (each host adds its own). Order is kept;
/// new variables go last.
pub fn program_env(base: &[(String, String)], rt: &Runtime) -> Vec<(String, String)> {
    let runtime = rt.preload.as_str();
    let mut out: Vec<(String, String)> = Vec::with_capacity(base.len() + 4);
    let (mut preload, mut audit, mut tunables, mut bind) = (false, false, false, false);
    for (k, v) in base {
        match k.as_str() {
            "BUNKAI_SHARE" => continue,
            "LD_PRELOAD" => {
                preload = true;
                let v = if v.trim().is_empty() { runtime.to_string() } else { format!("{runtime}:{v}") };
                out.push((k.clone(), v));
            }
            "LD_AUDIT" => {
                audit = true;
                let v = if v.trim().is_empty() { rt.audit.clone() } else { format!("{}:{v}", rt.audit) };
                out.push((k.clone(), v));
            }
            "GLIBC_TUNABLES" => {
                tunables = true;
                let v = if v.is_empty() { RSEQ_OFF.to_string() } else { format!("{v}:{RSEQ_OFF}") };
                out.push((k.clone(), v));
            }
            "LD_BIND_NOW" => {
                bind = true;
                out.push((k.clone(), "1".into()));
            }
            _ => out.push((k.clone(), v.clone())),
        }
    }
    if !preload {
        out.push(("LD_PRELOAD".into(), runtime.into()));
    }
    if !audit {
        out.push(("LD_AUDIT".into(), rt.audit.clone()));
    }
    if !tunables {
        out.push(("GLIBC_TUNABLES".into(), RSEQ_OFF.into()));
    }
    if !bind {
        out.push(("LD_BIND_NOW".into(), "1".into()));
    }
    out
}

/// Our environment as UTF-8 pairs (it travels to the nodes as JSON).
pub fn current_env() -> Result<Vec<(String, String)>> {
    let mut v = Vec::new();
    for (k, val) in std::env::vars_os() {
        let (Some(ks), Some(vs)) = (k.to_str(), val.to_str()) else {
            bail!(
                "environment variable {} is not UTF-8 (unset it: the environment travels to the nodes as JSON)",
                k.to_string_lossy()
            );
        };
        v.push((ks.to_string(), vs.to_string()));
    }
    Ok(v)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(p) {
        Ok(m) => m.is_file() && m.permissions().mode() & 0o111 != 0,
        Err(_) => false,
    }
}

/// PROGRAM as an absolute path: a name with a slash is taken relative to
/// `cwd`, a bare name is looked up in `path` (like execvp). The path is
/// not canonicalized: it must exist as such on every host.
pub fn resolve_program(name: &str, path: Option<&OsStr>, cwd: &Path) -> Result<PathBuf> {
    if name.is_empty() {
        bail!("empty program name (give the program after --)");
    }
    if name.contains('/') {
        // Without "." components (components() drops them), symlinks kept.
        let p: PathBuf = cwd.join(name).components().collect();
        if !p.exists() {
            bail!("program {} does not exist (check the path)", p.display());
        }
        if !is_executable(&p) {
            bail!("program {} is not an executable file (chmod +x it, or give another)", p.display());
        }
        return Ok(p);
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(path) {
            let dir = if dir.as_os_str().is_empty() { cwd.to_path_buf() } else { cwd.join(dir) };
            let p = dir.join(name);
            if is_executable(&p) {
                return Ok(p);
            }
        }
    }
    bail!("program {name} not found in PATH (give its path)")
}

/// The runtime is preloaded, so the program must be dynamically linked:
/// a static one would run unshared on the home host while its replicas
/// waited. Scripts (#!) are fine: their interpreter gets the preload.
pub fn check_loadable(p: &Path) -> Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).with_context(|| format!("cannot read {}", p.display()))?;
    let mut h = [0u8; 64];
    let n = f.read(&mut h).unwrap_or(0);
    if n < 4 || &h[..4] != b"\x7fELF" {
        return Ok(());
    }
    if n < 64 || h[4] != 2 || h[5] != 1 || u16::from_le_bytes([h[18], h[19]]) != 62 {
        bail!("{} is not an x86-64 program (bunkai share runs x86-64 Linux programs)", p.display());
    }
    let phoff = u64::from_le_bytes(h[32..40].try_into().unwrap());
    let phentsize = u16::from_le_bytes([h[54], h[55]]) as u64;
    let phnum = u16::from_le_bytes([h[56], h[57]]) as u64;
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut ph, phoff)
        .with_context(|| format!("{} is a truncated ELF file", p.display()))?;
    let has_interp = (0..phnum).any(|i| {
        let o = (i * phentsize) as usize;
        u32::from_le_bytes(ph[o..o + 4].try_into().unwrap()) == 3 /* PT_INTERP */
    });
    if !has_interp {
        bail!(
            "{} is statically linked (the runtime is preloaded: give a dynamically linked program)",
            p.display()
        );
    }
    Ok(())
}

/// `<libdir>/libbunkai-share.so` and `<libdir>/libbunkai-share-audit.so`,
/// absolute (LD_PRELOAD and LD_AUDIT must name them by the same paths on
/// every host).
pub fn runtime() -> Result<Runtime> {
    let dir = bunkai_common::install::helper_libdir()?;
    let find = |name: &str| -> Result<String> {
        let p = dir.join(name);
        if !p.exists() {
            bail!("runtime {} is missing (run make)", p.display());
        }
        let p = p.canonicalize().unwrap_or(p);
        trusted_library(&p).map_err(anyhow::Error::msg)?;
        p.to_str().map(str::to_string).with_context(|| format!("runtime path {} is not UTF-8", p.display()))
    };
    Ok(Runtime { preload: find(crate::RUNTIME_LIB)?, audit: find(crate::AUDIT_LIB)? })
}

/// A library we are about to load into a program (ours, or one a peer
/// named in LD_PRELOAD or LD_AUDIT): owned by us or root, and neither it nor
/// its directory writable by anyone else, who could otherwise run code as
/// us through it.
pub fn trusted_library(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let me = unsafe { libc::geteuid() };
    let check = |q: &Path, what: &str| -> Result<(), String> {
        let m = std::fs::metadata(q).map_err(|e| format!("cannot read {} ({e})", q.display()))?;
        if m.uid() != me && m.uid() != 0 {
            return Err(format!("{what} {} belongs to uid {} (install it as root or as yourself)", q.display(), m.uid()));
        }
        if m.mode() & 0o022 != 0 && !(m.is_dir() && m.mode() & 0o1000 != 0) {
            return Err(format!("{what} {} can be written by group or others (chmod go-w {})", q.display(), q.display()));
        }
        Ok(())
    };
    check(p, "library")?;
    if let Some(dir) = p.parent() {
        check(dir, "the library's directory")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn rt(dir: &str) -> Runtime {
        Runtime { preload: format!("{dir}/libbunkai-share.so"), audit: format!("{dir}/libbunkai-share-audit.so") }
    }

    #[test]
    fn env_gets_the_runtime_added() {
        let r = rt("/opt/b/lib/bunkai");
        let out = program_env(&env(&[("PATH", "/usr/bin"), ("HOME", "/root")]), &r);
        assert_eq!(
            out,
            env(&[
                ("PATH", "/usr/bin"),
                ("HOME", "/root"),
                ("LD_PRELOAD", &r.preload),
                ("LD_AUDIT", &r.audit),
                ("GLIBC_TUNABLES", "glibc.pthread.rseq=0"),
                ("LD_BIND_NOW", "1"),
            ])
        );
    }

    #[test]
    fn env_keeps_what_was_there() {
        let r = rt("/x");
        let out = program_env(
            &env(&[
                ("LD_PRELOAD", "/usr/lib/libfoo.so"),
                ("LD_AUDIT", "/usr/lib/audit.so"),
                ("BUNKAI_SHARE", "home 3 1 4 rr 5"),
                ("GLIBC_TUNABLES", "glibc.malloc.check=3"),
                ("LD_BIND_NOW", ""),
                ("A", "b=c"),
            ]),
            &r,
        );
        assert_eq!(
            out,
            env(&[
                ("LD_PRELOAD", "/x/libbunkai-share.so:/usr/lib/libfoo.so"),
                ("LD_AUDIT", "/x/libbunkai-share-audit.so:/usr/lib/audit.so"),
                ("GLIBC_TUNABLES", "glibc.malloc.check=3:glibc.pthread.rseq=0"),
                ("LD_BIND_NOW", "1"),
                ("A", "b=c"),
            ])
        );
        let out = program_env(&env(&[("LD_PRELOAD", " "), ("GLIBC_TUNABLES", "")]), &r);
        assert_eq!(out[0].1, r.preload);
        assert_eq!(out[1].1, RSEQ_OFF);
    }

    #[test]
    fn share_values_follow_the_header() {
        let h = home_value(3, 2, 4, Place::RoundRobin, 7);
        assert_eq!(h.trim_end(), "home 3 2 4 rr 7");
        let r = replica_value(2, "10.200.2.1:40000", 7);
        assert_eq!(r.trim_end(), "replica 2 10.200.2.1:40000 7");
        assert_eq!(h.len(), r.len());
        // The longest values still fit.
        let h = home_value(i32::MAX, 15, i32::MAX, Place::Remote, i32::MAX);
        assert_eq!(h.len(), SHARE_VALUE_LEN);
        let r = replica_value(15, "255.255.255.255:65535", i32::MAX);
        assert_eq!(r.len(), SHARE_VALUE_LEN);
        let t = "0123456789abcdef0123456789abcdef";
        assert!(valid_run_id(t) && !valid_run_id("abc") && !valid_run_id(&"g".repeat(32)));
        assert_eq!(parse_run_id(t).unwrap()[..2], [0x01, 0x23]);
    }

    #[test]
    fn libraries_others_can_write_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("libx.so");
        std::fs::write(&lib, b"").unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
        trusted_library(&lib).unwrap();
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = trusted_library(&lib).unwrap_err();
        assert!(e.contains("can be written by group or others (chmod go-w"), "{e}");
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = trusted_library(&lib).unwrap_err();
        assert!(e.starts_with("the library's directory"), "{e}");
    }

    #[test]
    fn programs_resolve_like_execvp() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        let exe = d.join("prog");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = d.join("data");
        std::fs::write(&plain, "").unwrap();
        let path = std::env::join_paths(["/nonexistent", d.to_str().unwrap()]).unwrap();
        assert_eq!(resolve_program("prog", Some(&path), Path::new("/")).unwrap(), exe);
        assert_eq!(resolve_program("./prog", None, &d).unwrap(), exe);
        let e = resolve_program("data", Some(&path), Path::new("/")).unwrap_err().to_string();
        assert_eq!(e, "program data not found in PATH (give its path)");
        let e = resolve_program("./data", None, &d).unwrap_err().to_string();
        assert!(e.contains("is not an executable file"), "{e}");
        let e = resolve_program("./nope", None, &d).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn static_programs_are_refused() {
        // /bin/sh is dynamically linked on Debian; a script is accepted.
        check_loadable(Path::new("/bin/sh")).unwrap();
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let s = d.join("script");
        std::fs::write(&s, "#!/bin/sh\n").unwrap();
        check_loadable(&s).unwrap();
        // A minimal ELF64 x86-64 executable header without PT_INTERP.
        let mut h = vec![0u8; 64 + 56];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[18] = 62;
        h[32..40].copy_from_slice(&64u64.to_le_bytes());
        h[54..56].copy_from_slice(&56u16.to_le_bytes());
        h[56..58].copy_from_slice(&1u16.to_le_bytes());
        h[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        let st = d.join("static");
        std::fs::write(&st, &h).unwrap();
        let e = check_loadable(&st).unwrap_err().to_string();
        assert!(e.ends_with("is statically linked (the runtime is preloaded: give a dynamically linked program)"), "{e}");
        h[64..68].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        std::fs::write(&st, &h).unwrap();
        check_loadable(&st).unwrap();
        h[18] = 3; // i386
        std::fs::write(&st, &h).unwrap();
        assert!(check_loadable(&st).unwrap_err().to_string().contains("not an x86-64 program"));
    }

}
