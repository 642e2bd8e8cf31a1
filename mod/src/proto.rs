//! The server's side of the wire protocol to libbunkai-host (layout in
//! mod/include/bunkai_mod.h). One connection is one transaction: dropping a
//! `Host` before commit makes the host undo what this connection staged.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(u32)]
pub enum Msg {
    Hello = 1,
    Resolve = 2,
    Alloc = 3,
    Write = 4,
    Protect = 5,
    Commit = 6,
    Unload = 7,
    Evict = 8,
    Map = 9,
    UnloadName = 10,
    Ok = 100,
    Err = 101,
}

/// What UNLOAD_NAME did.
#[derive(Debug, Clone, PartialEq)]
pub enum UnloadByName {
    Unloaded { id: u32, ns: u64 },
    NotLoaded,
    /// Refused: these modules need it.
    NeededBy(Vec<String>),
}

pub struct Host {
    sock: UnixStream,
    pub path: PathBuf,
}

/// What HELLO says about the host.
#[derive(Debug, Clone)]
pub struct HostState {
    pub pid: u32,
    pub budget: u64,
    pub used: u64,
    /// Interfaces the host calls: (name, text).
    pub expects: Vec<(String, String)>,
    /// Loaded modules: (id, address, bytes, blob).
    pub modules: Vec<(u32, u64, u64, Vec<u8>)>,
}

#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
}

pub struct In<'a> {
    b: &'a [u8],
    off: usize,
}

impl<'a> In<'a> {
    pub fn new(b: &'a [u8]) -> In<'a> {
        In { b, off: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.off + n > self.b.len() {
            bail!("the host sent a short reply (is it the same bunkai version?)");
        }
        let s = &self.b[self.off..self.off + n];
        self.off += n;
        Ok(s)
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn string(&mut self) -> Result<String> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
}

extern "C" {
    fn geteuid() -> u32;
    fn getsockopt(fd: i32, level: i32, name: i32, val: *mut std::ffi::c_void, len: *mut u32) -> i32;
}

/// struct ucred (SO_PEERCRED).
#[repr(C)]
#[derive(Default)]
struct Ucred {
    pid: i32,
    uid: u32,
    gid: u32,
}

/// The uid of this process.
pub fn current_uid() -> u32 {
    unsafe { geteuid() }
}

/// What is wrong with `dir` as a directory of ours alone (None: nothing):
/// it must be a real directory (not a symbolic link to one), owned by us,
/// with no permission for group or others. The host checks the same
/// before it makes its socket there (mod/host/socket.c, private_dir_problem).
pub fn private_dir_problem(dir: &Path) -> Option<String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = dir.display();
    let m = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot use {d}: {e}")),
    };
    let me = current_uid();
    if m.file_type().is_symlink() {
        Some(format!("{d} is a symbolic link, not a directory of ours (remove it)"))
    } else if !m.is_dir() {
        Some(format!("{d} is not a directory (remove it)"))
    } else if m.uid() != me {
        Some(format!(
            "{d} belongs to uid {}, not to us (uid {me}): another user could intercept modules (remove it, or set XDG_RUNTIME_DIR)",
            m.uid()
        ))
    } else if m.permissions().mode() & 0o077 != 0 {
        Some(format!("{d} has mode {:04o}: group and others may use it (chmod 700 {d})", m.permissions().mode() & 0o7777))
    } else {
        None
    }
}

/// $XDG_RUNTIME_DIR/bunkai-mod, when XDG_RUNTIME_DIR is set and is a
/// private directory of ours.
fn xdg_dir() -> Option<PathBuf> {
    let x = PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR")?);
    (x.is_absolute() && private_dir_problem(&x).is_none()).then(|| x.join("bunkai-mod"))
}

/// The default socket directories, the one a host prefers first
/// ($XDG_RUNTIME_DIR/bunkai-mod, else /tmp/bunkai-mod-UID). A host started
/// with another environment may be in either, so both are looked in.
pub fn default_dirs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = xdg_dir().into_iter().collect();
    v.push(PathBuf::from(format!("/tmp/bunkai-mod-{}", current_uid())));
    v
}

/// Whether `dir` is where hosts put their sockets by default (here, or
/// with any XDG_RUNTIME_DIR): such a directory must be private.
fn is_default_dir(dir: &Path) -> bool {
    dir == Path::new(&format!("/tmp/bunkai-mod-{}", current_uid()))
        || dir.file_name().map_or(false, |n| n == "bunkai-mod")
        || default_dirs().iter().any(|d| d == dir)
}

/// The default socket of host `pid` (what bunkai_host_start(NULL) uses):
/// in the first default directory that has it, else the preferred one.
pub fn default_socket(pid: u32) -> PathBuf {
    let dirs = default_dirs();
    let name = format!("{pid}.sock");
    dirs.iter().map(|d| d.join(&name)).find(|p| std::fs::symlink_metadata(p).is_ok()).unwrap_or_else(|| dirs[0].join(&name))
}

/// Sockets of running hosts in the default directories. A default
/// directory that exists but is not ours alone is an error, not a place to
/// look: another user could have put a fake host there.
pub fn running_hosts() -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = Vec::new();
    for dir in default_dirs() {
        if std::fs::symlink_metadata(&dir).is_err() {
            continue;
        }
        if let Some(p) = private_dir_problem(&dir) {
            bail!("{p}");
        }
        let Ok(d) = std::fs::read_dir(&dir) else { continue };
        v.extend(
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().map_or(false, |e| e == "sock"))
                .filter(|p| {
                    p.file_stem()
                        .and_then(|s| s.to_str())
                        .and_then(|s| s.parse::<u32>().ok())
                        .map_or(false, |pid| Path::new(&format!("/proc/{pid}")).exists())
                }),
        );
    }
    v.sort();
    v.dedup();
    Ok(v)
}

/// Who listens at the other end of `sock` (SO_PEERCRED: the process that
/// called listen, as it was then).
fn peer_cred(sock: &UnixStream) -> std::io::Result<Ucred> {
    use std::os::fd::AsRawFd;
    let mut c = Ucred::default();
    let mut len = std::mem::size_of::<Ucred>() as u32;
    // SOL_SOCKET = 1, SO_PEERCRED = 17
    if unsafe { getsockopt(sock.as_raw_fd(), 1, 17, &mut c as *mut Ucred as *mut std::ffi::c_void, &mut len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(c)
}

/// The uid of the process listening at the other end of `sock`.
fn peer_uid(sock: &UnixStream) -> std::io::Result<u32> {
    peer_cred(sock).map(|c| c.uid)
}

impl Host {
    /// Connects to the host at `path`. Nothing is sent before two checks:
    /// a socket in a default directory is only used if that directory is
    /// ours alone, and the process listening must run as us or as root
    /// (SO_PEERCRED): a module is never handed to someone else's process.
    pub fn connect(path: &Path) -> Result<Host> {
        if let Some(dir) = path.parent().filter(|d| is_default_dir(d)) {
            if let Some(p) = private_dir_problem(dir) {
                bail!("{p}");
            }
        }
        let sock = UnixStream::connect(path).with_context(|| {
            format!("cannot reach the host at {} (is it running with libbunkai-host started?)", path.display())
        })?;
        let me = current_uid();
        match peer_uid(&sock) {
            Ok(uid) if uid == me || uid == 0 => {}
            Ok(uid) => bail!(
                "the process listening on {} runs as uid {uid}, not as us (uid {me}) or root: nothing was sent to it (remove the socket, or give the socket of your own host)",
                path.display()
            ),
            Err(e) => bail!("cannot check who listens on {}: {e} (nothing was sent)", path.display()),
        }
        // A host that stops answering must not hang us.
        sock.set_read_timeout(Some(Duration::from_secs(30)))?;
        sock.set_write_timeout(Some(Duration::from_secs(30)))?;
        Ok(Host { sock, path: path.to_path_buf() })
    }

    /// The pid of the process that listens on this host's socket (the
    /// host's process: a fork child listens on a socket of its own).
    pub fn peer_pid(&self) -> Result<u32> {
        let c = peer_cred(&self.sock).with_context(|| format!("cannot check who listens on {}", self.path.display()))?;
        Ok(c.pid as u32)
    }

    fn frame(t: Msg, body: &Out) -> Vec<u8> {
        let mut hdr = Vec::with_capacity(8 + body.0.len());
        hdr.extend_from_slice(&((4 + body.0.len()) as u32).to_le_bytes());
        hdr.extend_from_slice(&(t as u32).to_le_bytes());
        hdr.extend_from_slice(&body.0);
        hdr
    }

    pub fn call(&mut self, t: Msg, body: &Out) -> Result<Vec<u8>> {
        let m = Self::frame(t, body);
        self.sock.write_all(&m).map_err(|e| self.gone(e))?;
        self.reply()
    }

    fn reply(&mut self) -> Result<Vec<u8>> {
        let mut h = [0u8; 8];
        self.sock.read_exact(&mut h).map_err(|e| self.gone(e))?;
        let len = u32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
        let ty = u32::from_le_bytes(h[4..].try_into().unwrap());
        if !(4..=1 << 28).contains(&len) {
            bail!("the host sent a malformed reply");
        }
        let mut b = vec![0u8; len - 4];
        self.sock.read_exact(&mut b).map_err(|e| self.gone(e))?;
        match ty {
            x if x == Msg::Ok as u32 => Ok(b),
            x if x == Msg::Err as u32 => bail!("the host refused: {}", In::new(&b).string()?),
            _ => bail!("the host sent an unknown reply type {ty}"),
        }
    }

    fn gone(&self, e: std::io::Error) -> anyhow::Error {
        anyhow::anyhow!("the host at {} stopped answering: {e} (it may have exited; nothing was changed)", self.path.display())
    }

    pub fn hello(&mut self) -> Result<HostState> {
        let b = self.call(Msg::Hello, &Out::default())?;
        let mut r = In::new(&b);
        let abi = r.u32()?;
        if abi != crate::ABI {
            bail!("the host speaks module ABI {abi}, this bunkai {} (rebuild the host with this bunkai's libbunkai-host)", crate::ABI);
        }
        let pid = r.u32()?;
        let budget = r.u64()?;
        let used = r.u64()?;
        let n = r.u32()?;
        let mut expects = Vec::new();
        for _ in 0..n {
            expects.push((r.string()?, r.string()?));
        }
        let n = r.u32()?;
        let mut modules = Vec::new();
        for _ in 0..n {
            let id = r.u32()?;
            let addr = r.u64()?;
            let len = r.u64()?;
            modules.push((id, addr, len, r.bytes()?.to_vec()));
        }
        Ok(HostState { pid, budget, used, expects, modules })
    }

    pub fn resolve(&mut self, names: &[String]) -> Result<Vec<u64>> {
        let mut o = Out::default();
        o.u32(names.len() as u32);
        for n in names {
            o.str(n);
        }
        let b = self.call(Msg::Resolve, &o)?;
        let mut r = In::new(&b);
        names.iter().map(|_| r.u64()).collect()
    }

    /// Returns (rx address, rw address, host ns).
    pub fn alloc(&mut self, rx: u64, rw: u64) -> Result<(u64, u64, u64)> {
        let b = self.call(Msg::Alloc, Out::default().u64(rx).u64(rw))?;
        let mut r = In::new(&b);
        Ok((r.u64()?, r.u64()?, r.u64()?))
    }

    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<u64> {
        let mut ns = 0;
        // Chunks keep each message small; a 4 MB module is 4 messages.
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            let b = self.call(Msg::Write, Out::default().u64(addr + (i << 20) as u64).bytes(chunk))?;
            ns += In::new(&b).u64()?;
        }
        Ok(ns)
    }

    /// The zero-copy load: the host maps the first `len` bytes of the memfd
    /// `fd` over the memory staged at `rx` (RX part r-x, the rest rw-).
    pub fn map(&mut self, rx: u64, len: u64, fd: std::os::fd::RawFd) -> Result<u64> {
        use std::os::fd::AsRawFd;
        let m = Self::frame(Msg::Map, Out::default().u64(rx).u64(len));
        crate::memfd::send_with_fd(self.sock.as_raw_fd(), &m, fd).map_err(|e| self.gone(e))?;
        let b = self.reply()?;
        In::new(&b).u64()
    }

    pub fn protect(&mut self, rx: u64) -> Result<u64> {
        let b = self.call(Msg::Protect, Out::default().u64(rx))?;
        In::new(&b).u64()
    }

    pub fn evict(&mut self, id: u32) -> Result<()> {
        self.call(Msg::Evict, Out::default().u32(id)).map(|_| ())
    }

    /// Unloads the module called `name` in one round trip, unless other
    /// modules need it.
    pub fn unload_name(&mut self, name: &str) -> Result<UnloadByName> {
        let b = self.call(Msg::UnloadName, Out::default().str(name))?;
        let mut r = In::new(&b);
        Ok(match r.u32()? {
            0 => UnloadByName::Unloaded { id: r.u32()?, ns: r.u64()? },
            1 => UnloadByName::NotLoaded,
            2 => {
                let n = r.u32()?;
                UnloadByName::NeededBy((0..n).map(|_| r.string()).collect::<Result<_>>()?)
            }
            x => bail!("the host sent an unknown UNLOAD_NAME status {x}"),
        })
    }

    pub fn unload(&mut self, id: u32) -> Result<u64> {
        let b = self.call(Msg::Unload, Out::default().u32(id))?;
        In::new(&b).u64()
    }
}
