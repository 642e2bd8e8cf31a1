//! `bunkai share run`: the home host's side of a shared run.
//!
//! 1. Resolve the program, find the runtime, build the environment
//!    (launch.rs), create the runtime's listener and the stats memfd.
//! 2. Connect to every node (in parallel, 10 s) and have each start its
//!    replica; every node must answer `spawned` before the program starts.
//! 3. Start the program with BUNKAI_SHARE=home ..., the listener and the
//!    memfd inherited, ASLR off. Then wait for it while watching the nodes:
//!    a replica that ends, or a node connection that drops, while the
//!    program still runs fails the run (the program is killed). A replica
//!    ending right after the program did is the normal end (the runtime's
//!    connections close and the replicas exit), so a node's report gets a
//!    short grace period to see whether the program is ending too.
//! 4. Tell the nodes to kill their replicas and wait for their answer, so
//!    that no replica outlives the command; read the stats page.
//!
//! SIGINT and SIGTERM sent to us go to the program (a terminal's ^C reaches
//! it directly, as the whole foreground group gets it). We exit with the
//! program's status, 128 + signal if a signal ended it, like a shell.

use crate::auth::{self, Key};
use crate::launch::{self, Place};
use crate::proto::{self, Exit, Lines, Reply, Request, Spawn};
use crate::stats;
use crate::sys;
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// What to run where: `bunkai share run`'s options (cmd/run.rs).
#[derive(Debug)]
pub struct RunOptions {
    /// The nodes, HOST:PORT, comma-separated; node i is host i (1-based)
    pub nodes: Option<String>,
    /// Where the program's threads go: rr (round robin over home and the
    /// nodes, also "round-robin"), remote (the nodes only), home (all at
    /// home: sharing set up, nothing moves)
    pub place: Place,
    /// Address for the replicas to reach this host, IP or IP:PORT (default:
    /// all addresses, a free port; each node is told the address it was
    /// reached from)
    pub listen: Option<String>,
    /// Print a summary as one JSON object on stderr (exit status, wall time,
    /// per-host counters, threads)
    pub json: bool,
    /// Print the replicas as they start, then the thread management table
    /// and per-host counters, on stderr
    pub verbose: bool,
    /// The cluster key (default: $BUNKAI_SHARE_KEY, else ~/.config/bunkai/share.key)
    pub key: Option<std::path::PathBuf>,
    /// The program and its arguments, after `--`
    pub command: Vec<String>,
}

/// How long after a node's report the program may take to end on its own.
const GRACE: Duration = Duration::from_millis(1000);
/// How long the nodes get to confirm their replicas are gone.
const SHUTDOWN: Duration = Duration::from_secs(3);

/// The nodes as given: at least one, at most BKS_MAX_HOSTS - 1.
pub fn parse_nodes(nodes: Option<&str>) -> Result<Vec<String>> {
    let list: Vec<String> = nodes
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if list.is_empty() {
        bail!("no nodes given (give --nodes HOST:PORT,...; start `bunkai share node --listen ADDR` on each)");
    }
    let max = stats::BKS_MAX_HOSTS - 1;
    if list.len() > max {
        bail!("{} nodes given, at most {max} (drop some from --nodes)", list.len());
    }
    Ok(list)
}

/// The listener the runtime inherits, and the address to tell the nodes
/// (None: each node's own view of us).
fn listener(listen: Option<&str>) -> Result<(TcpListener, Option<Ipv4Addr>)> {
    let Some(spec) = listen else {
        let l = TcpListener::bind("0.0.0.0:0").context("cannot listen for the replicas")?;
        return Ok((l, None));
    };
    let addr: SocketAddr = match spec.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, 0),
        Err(_) => spec
            .parse()
            .map_err(|_| anyhow::anyhow!("--listen {spec}: not an IP or IP:PORT (give e.g. 10.0.0.1)"))?,
    };
    let IpAddr::V4(ip) = addr.ip() else {
        bail!("--listen {spec}: the runtime speaks IPv4 (give an IPv4 address)");
    };
    if ip.is_unspecified() {
        let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr} (pick another port)"))?;
        return Ok((l, None));
    }
    let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr} (give an address of this host)"))?;
    Ok((l, Some(ip)))
}

/// The one-line reason a connection to a node failed, with the fix.
fn connect_error(addr: &str, e: &io::Error) -> String {
    let what = match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => {
            return format!("connection refused (start `bunkai share node --listen {addr}` on that host)")
        }
        Some(libc::ENETUNREACH) => "network unreachable",
        Some(libc::EHOSTUNREACH) => "host unreachable",
        Some(libc::ECONNRESET) => "connection reset",
        _ if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock => {
            "no answer within 10 s"
        }
        _ => return format!("{e} (check the address and that `bunkai share node` runs there)"),
    };
    format!("{what} (check the address and that the host is up)")
}

/// A node with its replica started.
struct Node {
    addr: String,
    conn: Lines,
    pid: u32,
    /// How its replica ended, once we know (None: still running).
    ended: Option<Ended>,
    /// The node challenged our hello (one round trip more).
    challenged: bool,
}

#[derive(Clone, Debug)]
enum Ended {
    Exit(Exit),
    Lost(String),
}

/// Connects to one node, proves the key, and has it start replica `host`.
fn start_node(
    addr: &str,
    host: u32,
    req: &Spawn,
    key: &Key,
    listen_ip: Option<Ipv4Addr>,
    port: u16,
    deadline: Instant,
) -> Result<Node, String> {
    let sa = match addr.to_socket_addrs() {
        Ok(v) => {
            let v: Vec<SocketAddr> = v.collect();
            match v.iter().find(|a| a.is_ipv4()).or(v.first()) {
                Some(a) => *a,
                None => return Err("no address for that name (check the name)".into()),
            }
        }
        Err(_) if !addr.contains(':') => return Err("no port (give HOST:PORT, e.g. 10.0.0.2:7000)".into()),
        Err(e) => return Err(format!("cannot resolve the name: {e} (check the name)")),
    };
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut s = TcpStream::connect_timeout(&sa, left).map_err(|e| connect_error(addr, &e))?;
    proto::tune(&s);
    let home_ip = match listen_ip {
        Some(ip) => ip,
        None => match s.local_addr().map(|a| a.ip()) {
            Ok(IpAddr::V4(ip)) => ip,
            Ok(IpAddr::V6(ip)) => match ip.to_ipv4_mapped() {
                Some(ip) => ip,
                None => return Err("reached over IPv6, the runtime speaks IPv4 (give the node's IPv4 address)".into()),
            },
            Err(e) => return Err(format!("{e}")),
        },
    };
    let mut req = req.clone();
    req.host = host;
    req.home = format!("{home_ip}:{port}");
    // The request travels sealed inside the handshake (auth.rs): no round
    // trip is spent before it.
    let first = serde_json::to_string(&Request::Spawn(req)).map_err(|e| e.to_string())?;
    let session = auth::client(&mut s, key, auth::ROLE_DAEMON, first.as_bytes()).map_err(|e| match e {
        auth::AuthError::WrongKey => "does not hold our key, or is not our node (make sure it is, then copy ~/.config/bunkai/share.key to it, or give --key)".to_string(),
        auth::AuthError::Closed | auth::AuthError::Protocol => {
            "closed the connection during the handshake (it runs another version of bunkai: run the same one on every host)".to_string()
        }
        e => format!("handshake failed: {e} (check that `bunkai share node` runs there)"),
    })?;
    let challenged = session.challenged;
    let mut conn = Lines::new(s);
    conn.secure(session.lines);
    let line = match conn.recv(Some(deadline)) {
        Ok(Some(l)) => l,
        Ok(None) => return Err("closed the connection (is it a `bunkai share node` of the same version?)".into()),
        Err(e) => return Err(connect_error(addr, &e)),
    };
    match proto::parse_reply(&line)? {
        Reply::Spawned { pid } => Ok(Node { addr: addr.to_string(), conn, pid, ended: None, challenged }),
        Reply::Error(e) => Err(e),
        Reply::Exited(x) => Err(format!("the replica {} at once", x.describe())),
    }
}

/// What the runtime's `failed_err` (a negative errno, or another negative
/// value for a closed connection) means, in words.
fn link_error(err: i32) -> String {
    match -err {
        e if e == libc::ETIMEDOUT => "connection timed out".into(),
        e if e == libc::ECONNRESET => "connection reset by the node".into(),
        e if e > 1 && e < 4096 => io::Error::from_raw_os_error(e).to_string(),
        _ => "the node closed the connection".into(),
    }
}

/// Reads what a node sent; records how its replica ended.
fn read_node(n: &mut Node) {
    match n.conn.fill() {
        Ok(true) => {}
        Ok(false) => {
            if n.ended.is_none() {
                n.ended = Some(Ended::Lost("the node closed the connection".into()));
            }
            return;
        }
        Err(e) => {
            if n.ended.is_none() {
                n.ended = Some(Ended::Lost(format!("connection lost: {e}")));
            }
            return;
        }
    }
    loop {
        let l = match n.conn.next_line() {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                if n.ended.is_none() {
                    n.ended = Some(Ended::Lost(format!("{e}")));
                }
                return;
            }
        };
        if let Ok(Reply::Exited(x)) = proto::parse_reply(&l) {
            if n.ended.is_none() {
                n.ended = Some(Ended::Exit(x));
            }
        }
    }
}

fn failure(n: &Node) -> String {
    match &n.ended {
        Some(Ended::Exit(x)) => format!(
            "node {}: replica {} {} while the program ran (see the node's log)",
            n.addr,
            n.pid,
            x.describe()
        ),
        Some(Ended::Lost(why)) => format!(
            "node {}: replica {} vanished: {why} (check that the node runs and is reachable)",
            n.addr, n.pid
        ),
        None => format!("node {}: replica {} still running", n.addr, n.pid),
    }
}

/// Asks every node to kill its replica and waits (SHUTDOWN) for each to
/// answer or close, so that no replica outlives us.
fn stop_nodes(nodes: &mut [Node]) {
    for n in nodes.iter_mut() {
        if n.ended.is_none() {
            let _ = n.conn.send(&Request::Kill(true));
        }
    }
    let deadline = Instant::now() + SHUTDOWN;
    let mut open: Vec<bool> = nodes.iter().map(|_| true).collect();
    loop {
        let idx: Vec<usize> = (0..nodes.len()).filter(|&i| open[i]).collect();
        if idx.is_empty() {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut fds: Vec<libc::pollfd> = idx.iter().map(|&i| sys::pollfd(nodes[i].conn.stream.as_raw_fd())).collect();
        if sys::poll(&mut fds, left.as_millis() as i32 + 1).is_err() {
            break;
        }
        for (k, &i) in idx.iter().enumerate() {
            if fds[k].revents == 0 {
                continue;
            }
            match nodes[i].conn.fill() {
                Ok(true) => {
                    while let Ok(Some(_)) = nodes[i].conn.next_line() {}
                }
                _ => open[i] = false,
            }
        }
    }
    for n in nodes.iter() {
        let _ = n.conn.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Runs the program across the home host and the nodes; its exit status
/// (128 + signal if a signal ended it) is ours.
pub fn run(a: &RunOptions) -> Result<ExitCode> {
    let node_addrs = parse_nodes(a.nodes.as_deref())?;
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let cwd_s = cwd
        .to_str()
        .with_context(|| format!("the working directory {} is not UTF-8 (run from another)", cwd.display()))?
        .to_string();
    let program = launch::resolve_program(&a.command[0], std::env::var_os("PATH").as_deref(), &cwd)?;
    launch::check_loadable(&program)?;
    let program_s = program
        .to_str()
        .with_context(|| format!("program path {} is not UTF-8 (rename it)", program.display()))?
        .to_string();
    let runtime = launch::runtime()?;
    let key = crate::key::load(&crate::key::path(a.key.as_deref())?)?;
    let env = launch::program_env(&launch::current_env()?, &runtime);
    let (listener, listen_ip) = listener(a.listen.as_deref())?;
    let port = listener.local_addr()?.port();
    let stats_file = sys::memfd("bunkai-share-stats", stats::BKS_STATS_SIZE).context("cannot create the stats memfd")?;
    let mut run_id = [0u8; 16];
    sys::random_bytes(&mut run_id).context("cannot get random bytes for the run id")?;
    let run_key = auth::run_key(&key, &run_id);
    // Unlimited (u64::MAX, RLIM_INFINITY) too: it selects the legacy layout.
    let stack_limit = sys::stack_limit().ok().map(|(soft, _)| soft);
    let mut argv = vec![program_s.clone()];
    argv.extend(a.command[1..].iter().cloned());
    let req = Spawn {
        argv: argv.clone(),
        env: env.clone(),
        cwd: cwd_s,
        home: String::new(),
        host: 0,
        run_id: bunkai_common::fmt::hex(&run_id),
        version: proto::PROTOCOL_VERSION,
        stack_limit,
    };

    // 2. The replicas, all at once. On an error the connections close as
    // we return, and each node kills what it started.
    let deadline = Instant::now() + proto::NODE_TIMEOUT;
    let results: Vec<Result<Node, String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = node_addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| {
                let (req, key) = (&req, &key);
                sc.spawn(move || start_node(addr, i as u32 + 1, req, key, listen_ip, port, deadline))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("internal error".into()))).collect()
    });
    let mut nodes = Vec::new();
    for (r, addr) in results.into_iter().zip(&node_addrs) {
        match r {
            Ok(n) => nodes.push(n),
            Err(e) => bail!("node {addr}: {e}"),
        }
    }
    if a.verbose {
        for (i, n) in nodes.iter().enumerate() {
            eprintln!("bunkai share: host {}: node {}: replica {}", i + 1, n.addr, n.pid);
            if n.challenged {
                eprintln!(
                    "bunkai share: host {}: node {} challenged our hello: one round trip more (its clock is more than {} s from ours, it restarted a moment ago, or an address is translated between us)",
                    i + 1,
                    n.addr,
                    auth::WINDOW.as_secs()
                );
            }
        }
    }

    // 3. The program. Signals are blocked from here on (read from the
    // signalfd); the child unblocks them before exec.
    let sigfd = sys::signalfd(&[libc::SIGINT, libc::SIGTERM]).context("cannot set up signal handling")?;
    let lfd = listener.as_raw_fd();
    let sfd = stats_file.as_raw_fd();
    let key_pipe = sys::pipe_with(&run_key).context("cannot pass the run key")?;
    let kfd = key_pipe.as_raw_fd();
    let parent = std::process::id();
    let mut cmd = Command::new(&program);
    cmd.args(&a.command[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("BUNKAI_SHARE", launch::home_value(lfd, nodes.len(), sfd, a.place, kfd));
    unsafe {
        cmd.pre_exec(move || {
            sys::child_keep_fd(lfd)?;
            sys::child_keep_fd(sfd)?;
            sys::child_keep_fd(kfd)?;
            sys::child_no_aslr()?;
            // If we are killed, the program goes too (and the nodes, seeing
            // our connections close, kill the replicas).
            sys::child_die_with_parent(parent)?;
            sys::child_unblock_signals()
        });
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("cannot start {program_s}"))?;
    drop(listener);
    drop(key_pipe);
    let pid = child.id();
    let pidfd = sys::pidfd_open(pid).ok();

    let mut reported: Option<(usize, Instant)> = None;
    let mut killed_for: Option<usize> = None;
    let status = loop {
        let mut fds = vec![sys::pollfd(sigfd.as_raw_fd())];
        if let Some(p) = &pidfd {
            fds.push(sys::pollfd(p.as_raw_fd()));
        }
        let base = fds.len();
        let live: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].ended.is_none()).collect();
        fds.extend(live.iter().map(|&i| sys::pollfd(nodes[i].conn.stream.as_raw_fd())));
        let mut timeout: i32 = if pidfd.is_some() { -1 } else { 50 };
        if let Some((_, at)) = reported {
            let left = (at + GRACE).saturating_duration_since(Instant::now()).as_millis() as i32 + 1;
            timeout = if timeout < 0 { left } else { timeout.min(left) };
        }
        sys::poll(&mut fds, timeout)?;
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if fds[0].revents != 0 {
            while let Some((sig, code)) = sys::read_signal(&sigfd) {
                if code <= 0 {
                    sys::kill(pid, sig);
                }
            }
        }
        for (k, &i) in live.iter().enumerate() {
            if fds[base + k].revents != 0 {
                read_node(&mut nodes[i]);
                if nodes[i].ended.is_some() && reported.is_none() {
                    reported = Some((i, Instant::now()));
                }
            }
        }
        if let Some((i, at)) = reported {
            if at.elapsed() >= GRACE {
                sys::kill(pid, libc::SIGKILL);
                killed_for = Some(i);
                break child.wait()?;
            }
        }
    };
    let wall = t0.elapsed();
    let exit = Exit::from_status(status);

    // A node that reported before the program ended, other than a replica
    // exiting cleanly within the grace period (the normal end), failed.
    let mut failed: Option<usize> = killed_for.or_else(|| {
        nodes.iter().position(|n| match &n.ended {
            None => false,
            Some(Ended::Exit(Exit::Code(0))) => false,
            Some(_) => true,
        })
    });

    // 4. The nodes; then what the runtime wrote.
    stop_nodes(&mut nodes);
    let mut page = vec![0u8; stats::BKS_STATS_SIZE as usize];
    let st = stats_file
        .read_exact_at(&mut page, 0)
        .map_err(|e| e.to_string())
        .and_then(|_| stats::parse(&page));
    let mut names = vec!["home".to_string()];
    names.extend(nodes.iter().map(|n| n.addr.clone()));
    let st = match st {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bunkai share: {e}");
            None
        }
    };
    // The runtime's keepalive may see a node go before ours does: the same
    // failure, reported the same way (the node, its replica, why).
    let runtime_blamed = st.as_ref().map(|s| s.failed_host as usize).filter(|&h| h >= 1 && h <= nodes.len());
    if let (Some(h), Some(s)) = (runtime_blamed, &st) {
        let n = &mut nodes[h - 1];
        if n.ended.is_none() {
            n.ended = Some(Ended::Lost(format!("connection lost: {}", link_error(s.failed_err))));
        }
        failed = failed.or(Some(h - 1));
    }
    if let Some(s) = &st {
        if !s.error.is_empty() && runtime_blamed.is_none() {
            eprintln!("bunkai share: {}", s.error);
        }
        if a.verbose {
            eprint!("{}", stats::render(s, &names));
        }
    } else if a.verbose {
        eprintln!("bunkai share: the runtime left no stats (it did not start in {program_s})");
    }
    let failure_line = failed.map(|i| failure(&nodes[i]));
    if a.json {
        eprintln!("{}", summary_json(exit, wall, &names, st.as_ref(), failure_line.as_deref()));
    }
    if let Some(f) = failure_line {
        bail!("{f}");
    }
    if a.verbose {
        eprintln!("bunkai share: program {} in {:.3} s", exit.describe(), wall.as_secs_f64());
    }
    Ok(ExitCode::from(exit.shell_code().clamp(0, 255) as u8))
}

fn summary_json(exit: Exit, wall: Duration, names: &[String], st: Option<&stats::Stats>, failure: Option<&str>) -> String {
    let hosts: Vec<serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(h, name)| {
            let c = st.and_then(|s| s.host.get(h)).cloned().unwrap_or_default();
            serde_json::json!({
                "host": h, "name": name,
                "threads": c.threads, "syscalls": c.syscalls,
                "read_faults": c.read_faults, "write_faults": c.write_faults,
                "pages_in": c.pages_in, "pages_out": c.pages_out,
                "invalidations": c.invalidations, "fault_ns": c.fault_ns,
                "fresh_pages": c.fresh_pages,
            })
        })
        .collect();
    let threads: Vec<serde_json::Value> = st
        .map(|s| {
            s.threads
                .iter()
                .map(|t| serde_json::json!({"thread": t.thread, "host": t.host, "tid": t.tid, "done": t.done, "syscalls": t.syscalls}))
                .collect()
        })
        .unwrap_or_default();
    let (code, signal) = match exit {
        Exit::Code(c) => (Some(c), None),
        Exit::Signal(s) => (None, Some(s)),
    };
    let mut v = serde_json::json!({
        "exit_status": exit.shell_code(),
        "exit_code": code,
        "signal": signal,
        "wall_s": wall.as_secs_f64(),
        "runtime": st.is_some(),
        "mappings": st.map(|s| s.mappings).unwrap_or(0),
        "converted": st.map(|s| s.converted).unwrap_or(0),
        "retries": st.map(|s| s.retries).unwrap_or(0),
        "zapped_pages": st.map(|s| s.zapped_pages).unwrap_or(0),
        "refused": st.map(|s| s.refused).unwrap_or(0),
        "hosts": hosts,
        "threads": threads,
    });
    let mut errors = String::new();
    if let Some(s) = st.filter(|s| !s.error.is_empty()) {
        errors.push_str(&s.error);
    }
    if let Some(f) = failure {
        if !errors.is_empty() {
            errors.push_str("; ");
        }
        let _ = write!(errors, "{f}");
    }
    if !errors.is_empty() {
        v["error"] = serde_json::Value::String(errors);
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_parsed_and_bounded() {
        assert_eq!(parse_nodes(Some("a:1, b:2,")).unwrap(), ["a:1", "b:2"]);
        for bad in [None, Some(""), Some(" , ")] {
            let e = parse_nodes(bad).unwrap_err().to_string();
            assert!(e.starts_with("no nodes given ("), "{e}");
        }
        let many = (0..16).map(|i| format!("h{i}:1")).collect::<Vec<_>>().join(",");
        assert_eq!(parse_nodes(Some(&many)).unwrap_err().to_string(), "16 nodes given, at most 15 (drop some from --nodes)");
    }

    #[test]
    fn runtime_link_errors_in_words() {
        // the runtime's end of stream is -1: a closed connection, not EPERM
        assert_eq!(link_error(-1), "the node closed the connection");
        assert_eq!(link_error(-libc::ETIMEDOUT), "connection timed out");
        assert_eq!(link_error(-libc::ECONNRESET), "connection reset by the node");
        assert!(link_error(-libc::EPIPE).contains("roken pipe"));
        assert_eq!(link_error(0), "the node closed the connection");
    }

    #[test]
    fn listen_addresses() {
        let (l, ip) = listener(None).unwrap();
        assert!(l.local_addr().unwrap().ip().is_unspecified() && ip.is_none());
        let (l, ip) = listener(Some("127.0.0.1")).unwrap();
        assert_eq!(ip, Some(Ipv4Addr::LOCALHOST));
        assert_ne!(l.local_addr().unwrap().port(), 0);
        assert_eq!(listener(Some("0.0.0.0:0")).unwrap().1, None);
        let e = listener(Some("::1")).unwrap_err().to_string();
        assert_eq!(e, "--listen ::1: the runtime speaks IPv4 (give an IPv4 address)");
        let e = listener(Some("home")).unwrap_err().to_string();
        assert!(e.starts_with("--listen home: not an IP or IP:PORT"), "{e}");
    }

    #[test]
    fn connect_errors_say_what_to_do() {
        let refused = io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(
            connect_error("10.0.0.2:7000", &refused),
            "connection refused (start `bunkai share node --listen 10.0.0.2:7000` on that host)"
        );
        let t = io::Error::new(io::ErrorKind::TimedOut, "x");
        assert_eq!(connect_error("h:1", &t), "no answer within 10 s (check the address and that the host is up)");
    }

    #[test]
    fn json_summary_has_every_host() {
        let v: serde_json::Value = serde_json::from_str(&summary_json(
            Exit::Signal(15),
            Duration::from_millis(1500),
            &["home".into(), "n1:7000".into()],
            None,
            Some("node n1:7000: replica 5 vanished"),
        ))
        .unwrap();
        assert_eq!(v["exit_status"], 143);
        assert_eq!(v["signal"], 15);
        assert_eq!(v["wall_s"], 1.5);
        assert_eq!(v["runtime"], false);
        assert_eq!(v["hosts"].as_array().unwrap().len(), 2);
        assert_eq!(v["hosts"][1]["name"], "n1:7000");
        assert_eq!(v["error"], "node n1:7000: replica 5 vanished");
    }
}
