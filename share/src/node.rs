//! `bunkai share node`: the daemon on each host other than the home host.
//! For each run the CLI connects and proves it holds the cluster key, its
//! spawn request (proto.rs) sealed in the same flight (auth.rs; the node
//! proves it holds the key too), and the node starts a replica: the same program at the same path, with
//! the same environment and working directory, ASLR off, the run key in a
//! pipe and BUNKAI_SHARE telling the runtime its host number and where home
//! is. The replica's runtime connects to the home host itself; the node
//! only watches: it reports the replica's end, and kills it when the CLI
//! asks or goes away.
//!
//! Bounds: at most MAX_PENDING connections may be in their handshake (5 s
//! each, the request, at most 1 MiB, inside it), MAX_RUNS runs served at
//! once. Anything else is closed with one log line.
//!
//! No stray replicas: a replica is killed (SIGKILL) and reaped when its
//! connection ends for any reason, including a dead CLI or a cut link
//! (noticed by keepalive within seconds); it gets SIGKILL by
//! PR_SET_PDEATHSIG if the thread that started it, or the whole node, dies.

use crate::auth::{self, Key};
use crate::launch;
use crate::proto::{self, Exit, Lines, Reply, Request, Spawn};
use crate::sys;
use anyhow::{Context, Result};
use std::io::Write;
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where the daemon listens and as whom: `bunkai share node`'s options
/// (cmd/node.rs).
#[derive(Debug)]
pub struct NodeOptions {
    /// Address to listen on, IP:PORT (port 0 picks a free one)
    pub listen: String,
    /// Serve one run (the first peer that authenticates), then exit
    pub once: bool,
    /// The cluster key (default: $BUNKAI_SHARE_KEY, else ~/.config/bunkai/share.key)
    pub key: Option<PathBuf>,
    /// Drop to this account after reading the key and binding the port:
    /// replicas run as it (for a node started as root)
    pub user: Option<String>,
}

/// Connections that have not finished their handshake: more are closed at
/// once.
pub const MAX_PENDING: usize = 16;
/// Runs served at once.
pub const MAX_RUNS: usize = 64;

fn log(peer: &SocketAddr, what: &str) {
    // One write per line (runs log from their own threads), and no panic
    // on a closed stderr: a node outlives its terminal.
    let line = format!("bunkai share node: {peer}: {what}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Counts a connection while it lives.
struct Slot(Arc<AtomicUsize>);
impl Slot {
    fn take(c: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        let mut n = c.load(Ordering::SeqCst);
        loop {
            if n >= max {
                return None;
            }
            match c.compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(Slot(c.clone())),
                Err(x) => n = x,
            }
        }
    }
}
impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves runs until killed; with `once`, only the first peer that
/// authenticates.
pub fn run(a: &NodeOptions) -> Result<ExitCode> {
    let addr = a
        .listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut v| v.next())
        .with_context(|| format!("--listen {}: not an address (give IP:PORT, e.g. 0.0.0.0:7000)", a.listen))?;
    let key = crate::key::load(&crate::key::path(a.key.as_deref())?)?;
    let user = match &a.user {
        Some(u) => Some(sys::lookup_user(u).map_err(|e| anyhow::anyhow!("--user {u}: {e} (give an account of this host)"))?),
        None => None,
    };
    let l = TcpListener::bind(addr)
        .with_context(|| format!("cannot listen on {addr} (pick another address or port)"))?;
    if let Some(u) = &user {
        sys::become_user(u).with_context(|| format!("cannot become {} (start the node as root to use --user)", u.name))?;
    } else if sys::is_root() {
        let _ = writeln!(
            std::io::stderr(),
            "bunkai share node: running as root: programs started for authenticated peers run as root (give --user NAME to run them as another account)"
        );
    }
    let local = l.local_addr()?;
    {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "listening on {local}");
        let _ = out.flush();
    }
    let pending = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    // Nonces of the handshakes taken without a challenge (auth.rs).
    let fresh = Arc::new(auth::Fresh::new());
    loop {
        let (s, peer) = match l.accept() {
            Ok(c) => c,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "bunkai share node: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Some(slot) = Slot::take(&pending, MAX_PENDING) else {
            log(&peer, &format!("refused: {MAX_PENDING} connections are already waiting for their handshake"));
            continue;
        };
        if a.once {
            if serve(s, peer, &key, &fresh, slot, &runs) {
                return Ok(ExitCode::SUCCESS);
            }
            continue;
        }
        // The thread that starts a replica lives until it is reaped: the
        // replica's parent-death signal is tied to it.
        let runs = runs.clone();
        let fresh = fresh.clone();
        std::thread::spawn(move || serve(s, peer, &key, &fresh, slot, &runs));
    }
}

/// One connection: the handshake, the request, the replica, its end.
/// Returns whether the peer authenticated.
fn serve(mut s: TcpStream, peer: SocketAddr, key: &Key, fresh: &auth::Fresh, pending: Slot, runs: &Arc<AtomicUsize>) -> bool {
    proto::tune(&s);
    let hs = match auth::server(&mut s, key, auth::ROLE_DAEMON, fresh) {
        Ok(h) => h,
        Err(e) => {
            log(&peer, &format!("refused: {e}"));
            return false;
        }
    };
    drop(pending);
    if let Some(why) = hs.challenged {
        log(&peer, &format!("challenged, and answered: {why}"));
    }
    let mut c = Lines::new(s);
    c.secure(hs.lines);
    let Some(_run) = Slot::take(runs, MAX_RUNS) else {
        log(&peer, &format!("refused: {MAX_RUNS} runs are being served"));
        let _ = c.send(&Reply::Error(format!("this node serves {MAX_RUNS} runs already (try again later)")));
        return true;
    };
    // The request came inside the handshake, sealed.
    let line = String::from_utf8_lossy(&hs.first).trim().to_string();
    let spawn = match proto::parse_request(&line) {
        Ok(Request::Spawn(s)) => s,
        Ok(Request::Kill(_)) => return true,
        Err(e) => {
            log(&peer, &e);
            let _ = c.send(&Reply::Error(e));
            return true;
        }
    };
    let mut child = match start_replica(&spawn, key) {
        Ok(ch) => ch,
        Err(e) => {
            log(&peer, &format!("host {}: {e}", spawn.host));
            let _ = c.send(&Reply::Error(e.replace('\n', " ")));
            return true;
        }
    };
    let pid = child.id();
    log(&peer, &format!("host {}: replica {pid} started: {} (home {})", spawn.host, spawn.argv[0], spawn.home));
    let exit = if c.send(&Reply::Spawned { pid }).is_err() {
        end(&mut child)
    } else {
        watch(&mut c, &mut child, &peer)
    };
    log(&peer, &format!("host {}: replica {pid} {}", spawn.host, exit.describe()));
    let _ = c.send(&Reply::Exited(exit));
    true
}

/// SIGKILL and reap.
fn end(child: &mut Child) -> Exit {
    let _ = child.kill();
    match child.wait() {
        Ok(st) => Exit::from_status(st),
        Err(_) => Exit::Signal(libc::SIGKILL),
    }
}

/// Waits for the replica's end or for the CLI's kill (or its going away).
fn watch(c: &mut Lines, child: &mut Child, peer: &SocketAddr) -> Exit {
    let pidfd = sys::pidfd_open(child.id()).ok();
    loop {
        let mut fds = vec![sys::pollfd(c.stream.as_raw_fd())];
        if let Some(p) = &pidfd {
            fds.push(sys::pollfd(p.as_raw_fd()));
        }
        // Without a pidfd (old kernel), look at the child every 100 ms.
        let timeout = if pidfd.is_some() { -1 } else { 100 };
        if sys::poll(&mut fds, timeout).is_err() {
            return end(child);
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Exit::from_status(st);
        }
        if fds[0].revents != 0 {
            match c.fill() {
                Ok(true) => {}
                Ok(false) => return end(child),
                Err(e) => {
                    log(peer, &format!("connection lost ({e}): killing the replica"));
                    return end(child);
                }
            }
            loop {
                let l = match c.next_line() {
                    Ok(Some(l)) => l,
                    Ok(None) => break,
                    Err(e) => {
                        log(peer, &format!("{e}: killing the replica"));
                        return end(child);
                    }
                };
                match proto::parse_request(&l) {
                    Ok(Request::Kill(_)) => return end(child),
                    Ok(Request::Spawn(_)) => {
                        let _ = c.send(&Reply::Error("one run per connection (connect again)".into()));
                    }
                    Err(e) => log(peer, &e),
                }
            }
        }
    }
}

/// Checks the request against this host, then starts the replica with
/// the run key (derived here from the cluster key) in a pipe.
pub fn start_replica(s: &Spawn, cluster: &Key) -> Result<Child, String> {
    let prog = s.argv.first().ok_or("empty argv (nothing to run)")?;
    if !prog.starts_with('/') {
        return Err(format!("program {prog} is not an absolute path (run the same bunkai on every host)"));
    }
    if s.host < 1 || s.host as usize >= crate::stats::BKS_MAX_HOSTS {
        return Err(format!("host number {} out of range 1..{}", s.host, crate::stats::BKS_MAX_HOSTS - 1));
    }
    let Some(run_id) = launch::parse_run_id(&s.run_id) else {
        return Err("the run id is not 32 hex digits (run the same bunkai on every host)".into());
    };
    if s.home.parse::<SocketAddrV4>().is_err() {
        return Err(format!("home address {} is not IPv4 ip:port (the runtime speaks IPv4)", s.home));
    }
    check_program(Path::new(prog))?;
    let cwd = Path::new(&s.cwd);
    if !cwd.is_dir() {
        return Err(format!(
            "working directory {} does not exist on this host (create it, or run from a directory every host has)",
            s.cwd
        ));
    }
    // A preload or audit library that is missing is only a warning to
    // ld.so: the replica would then run the whole program unshared. Refuse
    // instead.
    for var in ["LD_PRELOAD", "LD_AUDIT"] {
        if let Some((_, list)) = s.env.iter().find(|(k, _)| k == var) {
            for lib in list.split([':', ' ']).filter(|l| l.starts_with('/')) {
                if !Path::new(lib).exists() {
                    return Err(format!(
                        "{} library {lib} is missing on this host (install bunkai at the same path on every host)",
                        if var == "LD_PRELOAD" { "preload" } else { "audit" }
                    ));
                }
                launch::trusted_library(Path::new(lib))?;
            }
        }
    }
    let run_key = auth::run_key(cluster, &run_id);
    let kfd = sys::pipe_with(&run_key).map_err(|e| format!("cannot pass the run key: {e}"))?;
    let kraw = kfd.as_raw_fd();
    let parent = std::process::id();
    let stack = s.stack_limit;
    let mut cmd = Command::new(prog);
    cmd.args(&s.argv[1..])
        .env_clear()
        .envs(s.env.iter().filter(|(k, _)| k != "BUNKAI_SHARE").map(|(k, v)| (k, v)))
        .env("BUNKAI_SHARE", launch::replica_value(s.host, &s.home, kraw))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        // Not in the node's process group: a ^C at the node's terminal
        // ends the node, and the replica through its parent-death signal.
        .process_group(0);
    unsafe {
        cmd.pre_exec(move || {
            sys::child_keep_fd(kraw)?;
            sys::child_die_with_parent(parent)?;
            sys::child_no_aslr()?;
            if let Some(l) = stack {
                sys::child_set_stack_limit(l)?;
            }
            sys::child_unblock_signals()
        });
    }
    let child = cmd.spawn().map_err(|e| format!("cannot start {prog}: {e}"));
    drop(kfd);
    child
}

fn check_program(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(p).map_err(|_| {
        format!(
            "program {} does not exist on this host (install it at the same path on every host)",
            p.display()
        )
    })?;
    if !m.is_file() || m.permissions().mode() & 0o111 == 0 {
        return Err(format!("program {} is not executable on this host (chmod +x it there)", p.display()));
    }
    // Permission bits are not the whole story (noexec mounts, ACLs).
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| "bad program path".to_string())?;
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
        return Err(format!("program {} is not executable on this host ({})", p.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const KEY: Key = [5u8; 32];

    fn request(argv: &[&str]) -> Spawn {
        Spawn {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: "/".into(),
            home: "127.0.0.1:9".into(),
            host: 1,
            run_id: "0123456789abcdef0123456789abcdef".into(),
            version: proto::PROTOCOL_VERSION,
            stack_limit: None,
        }
    }

    #[test]
    fn refuses_what_cannot_run_here() {
        let e = start_replica(&request(&["/nonexistent/prog"]), &KEY).unwrap_err();
        assert_eq!(e, "program /nonexistent/prog does not exist on this host (install it at the same path on every host)");
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::write(&data, "").unwrap();
        let e = start_replica(&request(&[data.to_str().unwrap()]), &KEY).unwrap_err();
        assert!(e.contains("is not executable on this host"), "{e}");
        let e = start_replica(&request(&["true"]), &KEY).unwrap_err();
        assert!(e.contains("not an absolute path"), "{e}");
        let mut r = request(&["/bin/true"]);
        r.cwd = "/nonexistent-dir".into();
        assert!(start_replica(&r, &KEY).unwrap_err().starts_with("working directory /nonexistent-dir does not exist"));
        let mut r = request(&["/bin/true"]);
        r.env.push(("LD_PRELOAD".into(), "/nonexistent/libbunkai-share.so".into()));
        let e = start_replica(&r, &KEY).unwrap_err();
        assert!(e.starts_with("preload library /nonexistent/libbunkai-share.so is missing on this host"), "{e}");
        let mut r = request(&["/bin/true"]);
        r.env.push(("LD_AUDIT".into(), "/nonexistent/libbunkai-share-audit.so".into()));
        let e = start_replica(&r, &KEY).unwrap_err();
        assert!(e.starts_with("audit library /nonexistent/libbunkai-share-audit.so is missing on this host"), "{e}");
        let mut r = request(&["/bin/true"]);
        r.home = "[::1]:9".into();
        assert!(start_replica(&r, &KEY).unwrap_err().contains("not IPv4"));
        let mut r = request(&["/bin/true"]);
        r.run_id = "xyz".into();
        assert!(start_replica(&r, &KEY).unwrap_err().contains("run id"));
        let mut r = request(&["/bin/true"]);
        r.host = 16;
        assert!(start_replica(&r, &KEY).unwrap_err().contains("out of range"));
    }

    /// The replica gets exactly the request's environment, its host line,
    /// ASLR off, and the run key derived here on the descriptor
    /// BUNKAI_SHARE names.
    #[test]
    fn replica_gets_exactly_the_environment_the_key_and_no_aslr() {
        // A replica that is a shell: it reports what it got.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut r = request(&[
            "/bin/sh",
            "-c",
            &format!(
                "env > {0}; cat /proc/self/personality >> {0}; pwd >> {0}; set -- $BUNKAI_SHARE; od -An -tx1 -v /proc/self/fd/$4 | tr -d ' \\n' >> {0}; echo >> {0}",
                out.display()
            ),
        ]);
        r.cwd = dir.path().to_str().unwrap().into();
        r.env.push(("BUNKAI_SHARE".into(), "home 1 2 3 rr 4".into()));
        r.env.push(("A".into(), "1".into()));
        let mut c = start_replica(&r, &KEY).unwrap();
        assert!(c.wait().unwrap().success());
        let text = std::fs::read_to_string(&out).unwrap();
        let mut vars: Vec<&str> = text.lines().filter(|l| l.contains('=') && !l.starts_with("PWD=")).collect();
        vars.sort();
        assert_eq!(vars.len(), 3, "{text}");
        assert_eq!(vars[0], "A=1");
        assert!(vars[1].starts_with("BUNKAI_SHARE=replica 1 127.0.0.1:9 "), "{text}");
        assert_eq!(vars[1].len(), "BUNKAI_SHARE=".len() + launch::SHARE_VALUE_LEN, "{text}");
        assert_eq!(vars[2], "PATH=/usr/bin:/bin");
        // ADDR_NO_RANDOMIZE is 0x0040000
        let pers = text.lines().find(|l| l.len() == 8 && l.chars().all(|c| c.is_ascii_hexdigit())).unwrap();
        assert_ne!(u32::from_str_radix(pers, 16).unwrap() & 0x0040000, 0, "{text}");
        assert!(text.lines().any(|l| Path::new(l) == dir.path().canonicalize().unwrap()), "{text}");
        let want = bunkai_common::fmt::hex(&auth::run_key(&KEY, &launch::parse_run_id(&r.run_id).unwrap()));
        assert_eq!(text.lines().last().unwrap(), want, "{text}");
    }

    /// A client that authenticates with its request inside, the way
    /// `bunkai share run` does.
    fn connect(addr: SocketAddr, key: &Key, req: &Request) -> Lines {
        let mut s = TcpStream::connect(addr).unwrap();
        let first = serde_json::to_string(req).unwrap();
        let session = auth::client(&mut s, key, auth::ROLE_DAEMON, first.as_bytes()).unwrap();
        let mut c = Lines::new(s);
        c.secure(session.lines);
        c
    }

    fn daemon() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let pending = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let fresh = Arc::new(auth::Fresh::new());
        std::thread::spawn(move || loop {
            let (s, p) = l.accept().unwrap();
            let Some(slot) = Slot::take(&pending, MAX_PENDING) else { continue };
            let runs = runs.clone();
            let fresh = fresh.clone();
            std::thread::spawn(move || serve(s, p, &KEY, &fresh, slot, &runs));
        });
        addr
    }

    /// The node end to end over loopback: spawn, exited; spawn then kill;
    /// spawn then the CLI goes away; another protocol version.
    #[test]
    fn serves_spawn_kill_and_disconnect() {
        let addr = daemon();
        let soon = || Some(Instant::now() + Duration::from_secs(10));
        let reply = |c: &mut Lines| proto::parse_reply(&c.recv(soon()).unwrap().unwrap()).unwrap();

        let mut c = connect(addr, &KEY, &Request::Spawn(request(&["/bin/sh", "-c", "exit 3"])));
        assert!(matches!(reply(&mut c), Reply::Spawned { .. }));
        assert_eq!(reply(&mut c), Reply::Exited(Exit::Code(3)));
        assert_eq!(c.recv(soon()).unwrap(), None);

        let mut c = connect(addr, &KEY, &Request::Spawn(request(&["/bin/sleep", "60"])));
        let Reply::Spawned { pid } = reply(&mut c) else { panic!() };
        c.send(&Request::Kill(true)).unwrap();
        assert_eq!(reply(&mut c), Reply::Exited(Exit::Signal(9)));
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "replica {pid} not reaped");

        let mut c = connect(addr, &KEY, &Request::Spawn(request(&["/bin/sleep", "60"])));
        let Reply::Spawned { pid } = reply(&mut c) else { panic!() };
        drop(c);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(Instant::now() < deadline, "replica {pid} survived its CLI");
            std::thread::sleep(Duration::from_millis(10));
        }

        let mut bad = request(&["/bin/true"]);
        bad.version = 99;
        let mut c = connect(addr, &KEY, &Request::Spawn(bad));
        let Reply::Error(e) = reply(&mut c) else { panic!() };
        assert!(e.contains("protocol version 99"), "{e}");
    }

    /// Without the key nothing runs: a wrong key, a spawn request sent
    /// without a handshake, a flight changed on the way, a flight replayed.
    #[test]
    fn nothing_runs_without_the_key() {
        let addr = daemon();
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("ran");
        let req = Request::Spawn(request(&["/bin/sh", "-c", &format!("touch {}", flag.display())]));
        let line = serde_json::to_string(&req).unwrap();
        // wrong key
        let mut s = TcpStream::connect(addr).unwrap();
        assert_eq!(auth::client(&mut s, &[6u8; 32], auth::ROLE_DAEMON, line.as_bytes()).err(), Some(auth::AuthError::WrongKey));
        // no handshake: the JSON is taken for a hello and refused
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(format!("{line}\n").as_bytes());
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        use std::io::Read;
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "the node answered a peer without the key");
        // a flight with one byte of its sealed request changed
        let mut s = TcpStream::connect(addr).unwrap();
        let mut f = auth::flight(&KEY, auth::ROLE_DAEMON, line.as_bytes(), &[3; 32], auth::now_ns(), &s.local_addr().unwrap(), &addr).unwrap();
        let last = f.len() - 20;
        f[last] ^= 1;
        let _ = s.write_all(&f);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reply = [0u8; auth::REPLY];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(u32::from_le_bytes(reply[..4].try_into().unwrap()), auth::REFUSED);
        // a flight recorded off the wire and sent again on a new connection
        let mut s = TcpStream::connect(addr).unwrap();
        let f = auth::flight(&KEY, auth::ROLE_DAEMON, line.as_bytes(), &[4; 32], auth::now_ns(), &"127.0.0.1:1".parse().unwrap(), &addr).unwrap();
        let _ = s.write_all(&f);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.read_exact(&mut reply).unwrap();
        assert_eq!(u32::from_le_bytes(reply[..4].try_into().unwrap()), auth::CHALLENGE, "a flight of other ends was taken");
        let _ = s.write_all(&[0u8; 32]);
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "the node answered a replayed flight");
        std::thread::sleep(Duration::from_millis(200));
        assert!(!flag.exists(), "a program ran for a peer without the key");
        // and the node still serves its owner
        let mut c = connect(addr, &KEY, &req);
        let r = proto::parse_reply(&c.recv(Some(Instant::now() + Duration::from_secs(10))).unwrap().unwrap()).unwrap();
        assert!(matches!(r, Reply::Spawned { .. }), "{r:?}");
    }
}
