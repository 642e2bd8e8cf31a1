//! End-to-end tests of `bunkai share`'s tool side (seed 002): the CLI's
//! errors, the node daemon's protocol, and the fault cases of the issue
//! (a node that dies, a link that is cut, a signal to the run) on hosts
//! that are network namespaces (bunkai_share::netns; root).
//!
//! Tests that start the real runtime skip, with a message, when
//! libbunkai-share.so has not been built; the others give the CLI a
//! stand-in library through BUNKAI_LIBDIR (the node only checks that it
//! exists). No sleeps wait for servers: a node is ready when it has printed
//! its address, and everything else is polled with a deadline.

use bunkai_e2e::*;
use bunkai_share::netns::{self, Hosts};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Every run here uses one cluster key, made once per test binary run
/// (nodes and runs inherit BUNKAI_SHARE_KEY).
fn setup() {
    static KEY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let d = root().join("build/tests/share");
        std::fs::create_dir_all(&d).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let k = d.join("share.key");
        let out = Command::new(bunkai())
            .args(["share", "key", "--force", "--key"])
            .arg(&k)
            .output()
            .expect("bunkai share key");
        assert!(out.status.success(), "bunkai share key: {}", text(&out.stderr));
        std::env::set_var("BUNKAI_SHARE_KEY", &k);
        k
    });
}

/// The runtime next to the CLI under test (the CLI looks there too).
fn runtime() -> PathBuf {
    bunkai().parent().unwrap().join("../lib/bunkai/libbunkai-share.so")
}

/// What a test needs; a missing prerequisite fails it with the fix (CI
/// runs as root with everything built, so a skip could only hide a broken
/// build).
fn can_run(test: &str, root: bool, runtime_needed: bool) -> bool {
    assert!(
        !root || bunkai_share::sys::is_root(),
        "{test}: network and mount namespaces need root (run the tests as root)"
    );
    if runtime_needed {
        for lib in [runtime(), runtime().with_file_name("libbunkai-share-audit.so")] {
            assert!(lib.exists(), "{test}: {} is missing (run make)", lib.display());
        }
    }
    true
}

/// A directory holding empty runtime libraries, for runs that fail before
/// any program starts.
fn stand_in_libdir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("libbunkai-share.so"), b"").unwrap();
    std::fs::write(d.path().join("libbunkai-share-audit.so"), b"").unwrap();
    d
}

/// Runs a `bunkai share run` that must fail before any program starts,
/// with the stand-in runtime: exit 1 and one line. Returns it and the time.
fn run_fails_with_stand_in(cmd: &mut Command) -> (String, Duration) {
    let lib = stand_in_libdir();
    let child = cmd
        .env("BUNKAI_LIBDIR", lib.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, took) = finish(child, Duration::from_secs(30));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    one_line(&err);
    (err, took)
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn alive(pid: u32) -> bool {
    // A zombie is gone for our purposes (it runs nothing).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A `bunkai share node` child, ready (it printed its address).
struct Node {
    child: Child,
    addr: String,
}

impl Node {
    fn start(mut cmd: Command) -> Node {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start bunkai share node");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut l = String::new();
            let _ = r.read_line(&mut l);
            let _ = tx.send(l);
            // Keep draining: replicas inherit the node's stdout.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("the node did not start within 20 s");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("node said {line:?}"))
            .to_string();
        Node { child, addr }
    }

    fn local() -> Node {
        let mut c = Command::new(bunkai());
        c.args(["share", "node", "--listen", "127.0.0.1:0"]);
        Node::start(c)
    }

    fn in_host(h: &Hosts, k: usize) -> Node {
        let mut c = h.node_exec(k, bunkai());
        c.args(["share", "node", "--once", "--listen", &format!("{}:7000", h.node_ip(k))]);
        Node::start(c)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn one_line(err: &str) {
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("bunkai share: "), "{err}");
}

#[test]
fn cli_errors_are_one_line() {
    setup();
    let (code, err) = bunkai_fails(&["share", "run", "--bogus", "--", "true"]);
    assert_eq!(code, 2);
    one_line(&err);
    assert!(err.contains("'--bogus'"), "{err}");
    for nodes in [&["share", "run", "--", "true"][..], &["share", "run", "--nodes", ",", "--", "true"]] {
        let (code, err) = bunkai_fails(nodes);
        assert_eq!(code, 1);
        one_line(&err);
        assert!(err.starts_with("bunkai share: no nodes given (give --nodes HOST:PORT,..."), "{err}");
    }
    let (code, err) = bunkai_fails(&["share", "run", "--nodes", "h:1", "--place", "everywhere", "--", "true"]);
    assert_eq!(code, 2);
    one_line(&err);
    assert!(err.contains("'everywhere'"), "{err}");
    let (_, err) = bunkai_fails(&["share", "run", "--nodes", "h:1", "--", "no-such-program-anywhere"]);
    assert_eq!(err, "bunkai share: program no-such-program-anywhere not found in PATH (give its path)\n");
    let (_, err) = bunkai_fails(&["share", "node", "--listen", "not-an-address"]);
    one_line(&err);
}

#[test]
fn missing_runtime_is_named() {
    setup();
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(bunkai())
        .args(["share", "run", "--nodes", "127.0.0.1:9", "--", "true"])
        .env("BUNKAI_LIBDIR", empty.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        err,
        format!("bunkai share: runtime {}/libbunkai-share.so is missing (run make)\n", empty.path().display())
    );
}

/// A node address nobody listens on: one line naming the node and the
/// fix, at once.
#[test]
fn closed_port_fails_fast() {
    setup();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let (err, took) = run_fails_with_stand_in(Command::new(bunkai()).args(["share", "run", "--nodes", &addr, "--", "true"]));
    assert_eq!(
        err.trim_end(),
        format!("bunkai share: node {addr}: connection refused (start `bunkai share node --listen {addr}` on that host)")
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// The cluster key every run here uses.
fn cluster_key() -> bunkai_share::auth::Key {
    setup();
    bunkai_share::key::load(Path::new(&std::env::var_os("BUNKAI_SHARE_KEY").unwrap())).unwrap()
}

/// A connection to a node that has passed the handshake, as the CLI's.
fn authenticated(addr: &str) -> bunkai_share::proto::Lines {
    use bunkai_share::{auth, proto};
    let mut s = TcpStream::connect(addr).unwrap();
    let session = auth::client(&mut s, &cluster_key(), auth::ROLE_DAEMON).unwrap();
    let mut c = proto::Lines::new(s);
    c.secure(auth::LineMac::new(session, true));
    c
}

/// The node's side of the protocol, spoken by hand after the handshake: a
/// program that does not exist there, another protocol version, a line
/// that is not JSON.
#[test]
fn node_refuses_what_it_cannot_run() {
    setup();
    let node = Node::local();
    let ask = |line: &str| -> serde_json::Value {
        let mut c = authenticated(&node.addr);
        let sealed = line.to_string();
        // send the raw line through the MAC'd channel
        c.send(&serde_json::from_str::<serde_json::Value>(&sealed).unwrap_or(serde_json::Value::String(sealed.clone())))
            .unwrap();
        let soon = Some(Instant::now() + Duration::from_secs(20));
        let reply = c.recv(soon).unwrap().expect("an answer");
        let v: serde_json::Value = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{reply:?}: {e}"));
        // One answer, then the node closes.
        assert_eq!(c.recv(soon).unwrap(), None);
        v
    };
    let spawn = |argv: &str, version: u32| {
        format!(
            r#"{{"spawn":{{"argv":[{argv}],"env":[["PATH","/usr/bin:/bin"]],"cwd":"/","home":"127.0.0.1:9","host":1,"run_id":"0123456789abcdef0123456789abcdef","version":{version}}}}}"#
        )
    };
    let v = ask(&spawn(r#""/nonexistent/bunkai-test-prog""#, 2));
    assert_eq!(
        v["error"],
        "program /nonexistent/bunkai-test-prog does not exist on this host (install it at the same path on every host)"
    );
    let v = ask(&spawn(r#""/bin/true""#, 1));
    assert_eq!(v["error"], "protocol version 1, this node speaks 2 (run the same bunkai on every host)");
    let v = ask("GET / HTTP/1.0");
    assert!(v["error"].as_str().unwrap().starts_with("bad request"), "{v}");
}

/// The same through the CLI: the program exists on the home host but not
/// on the node (the node runs in a mount namespace where the program's
/// directory is an empty tmpfs).
#[test]
fn run_names_the_node_missing_the_program() {
    setup();
    if !can_run("run_names_the_node_missing_the_program", true, false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("prog");
    std::fs::copy("/bin/true", &prog).unwrap();
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none '{}' && exec '{}' share node --once --listen 127.0.0.1:0",
            dir.path().display(),
            bunkai().display()
        ));
    let node = Node::start(c);
    let (err, _) = run_fails_with_stand_in(Command::new(bunkai()).args(["share", "run", "--nodes", &node.addr, "--"]).arg(&prog));
    assert_eq!(
        err.trim_end(),
        format!(
            "bunkai share: node {}: program {} does not exist on this host (install it at the same path on every host)",
            node.addr,
            prog.display()
        )
    );
}

/// Three hosts; the run starts a replica on each node and the program at
/// home; nothing moves (--place home), so any program works.
#[test]
fn run_starts_replicas_and_returns_the_status() {
    setup();
    if !can_run("run_starts_replicas_and_returns_the_status", true, true) {
        return;
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| Node::in_host(&h, k)).collect();
    let list = nodes.iter().map(|n| n.addr.clone()).collect::<Vec<_>>().join(",");
    let child = h
        .home_exec(bunkai())
        .args(["share", "run", "--nodes", &list, "--place", "home", "--json", "--", "sh", "-c", "echo hi; exit 3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, _) = finish(child, Duration::from_secs(60));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(text(&out.stdout), "hi\n");
    let v: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap_or_else(|e| panic!("{err}: {e}"));
    assert_eq!(v["exit_status"], 3);
    assert_eq!(v["runtime"], true, "{v}");
    assert_eq!(v["hosts"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["hosts"][2]["name"], nodes[1].addr.as_str());
    // --once: each node served its run and exited, its replica reaped.
    for (k, mut n) in nodes.into_iter().enumerate() {
        let st = n.child.wait().unwrap();
        assert!(st.success(), "node {} {st}", k + 1);
    }
    for k in 0..=2 {
        assert_eq!(h.pids(k), Vec::<u32>::new(), "host {k}");
    }
}

/// What a fault test saw: the run's output, and every process it started.
struct Fault {
    out: Output,
    took: Duration,
    started: Vec<u32>,
}

/// Runs `sleep 600` shared with one node, waits until it runs everywhere,
/// does `fault`, and returns how the run ended. Checks that nothing is
/// left: no process in any namespace, no namespace.
fn fault_case(name: &str, fault: impl FnOnce(&Hosts, &mut Node, &Child)) -> Option<Fault> {
    if !can_run(name, true, true) {
        return None;
    }
    let h = Hosts::new(1).unwrap();
    let names: Vec<String> = (0..=1).map(|k| h.name(k)).collect();
    let mut node = Node::in_host(&h, 1);
    let run = h
        .home_exec(bunkai())
        .args(["share", "run", "--nodes", &node.addr, "--place", "home", "-v", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Running everywhere: the CLI and the program at home, the node and
    // the replica on node 1.
    wait_until("the program and its replica", Duration::from_secs(30), || {
        h.pids(0).len() >= 2 && h.pids(1).len() >= 2
    });
    let mut started: Vec<u32> = h.pids(0);
    started.extend(h.pids(1));
    started.push(node.child.id());
    let t0 = Instant::now();
    fault(&h, &mut node, &run);
    let (out, _) = finish(run, Duration::from_secs(60));
    let took = t0.elapsed();
    // The node (--once) ends when the run has, or when keepalive tells it
    // its CLI is gone (a cut link).
    wait_until("the node's end", Duration::from_secs(30), || !alive(node.child.id()) || node.child.try_wait().unwrap().is_some());
    wait_until("every process of the run to go", Duration::from_secs(10), || started.iter().all(|&p| !alive(p)));
    for k in 0..=1 {
        assert_eq!(h.pids(k), Vec::<u32>::new(), "host {k}");
    }
    drop(node);
    drop(h);
    let left = netns::list();
    assert!(names.iter().all(|n| !left.contains(n)), "namespaces left: {left:?}");
    Some(Fault { out, took, started })
}

#[test]
fn node_vanishing_fails_the_run() {
    setup();
    let Some(f) = fault_case("node_vanishing_fails_the_run", |_, node, _| {
        let _ = node.child.kill();
    }) else {
        return;
    };
    let err = text(&f.out.stderr);
    assert_eq!(f.out.status.code(), Some(1), "{err}");
    let last = err.trim_end().lines().last().unwrap();
    assert!(
        last.starts_with("bunkai share: node ") && last.contains(": replica ") && last.contains(" vanished: "),
        "{err}"
    );
    assert!(f.took < Duration::from_secs(10), "took {:?}", f.took);
    assert!(f.started.len() >= 4);
}

#[test]
fn cut_link_fails_the_run() {
    setup();
    let Some(f) = fault_case("cut_link_fails_the_run", |h, _, _| h.cut_link(1).unwrap()) else {
        return;
    };
    let err = text(&f.out.stderr);
    assert_eq!(f.out.status.code(), Some(1), "{err}");
    let last = err.trim_end().lines().last().unwrap();
    assert!(last.starts_with("bunkai share: node ") && last.contains(" vanished: connection lost"), "{err}");
    // Keepalive: 2 s idle, then 3 probes 1 s apart.
    assert!(f.took < Duration::from_secs(20), "took {:?}", f.took);
}

/// SIGTERM to the CLI reaches the program; the run ends as a shell would
/// report it, and the replica goes with it.
#[test]
fn sigterm_stops_the_run_everywhere() {
    setup();
    let Some(f) = fault_case("sigterm_stops_the_run_everywhere", |_, _, run| {
        bunkai_share::sys::kill(run.id(), 15);
    }) else {
        return;
    };
    let err = text(&f.out.stderr);
    assert_eq!(f.out.status.code(), Some(128 + 15), "{err}");
    assert!(err.contains("bunkai share: program was killed by signal 15 (SIGTERM) in "), "{err}");
    assert!(!err.contains("vanished"), "{err}");
    assert!(f.took < Duration::from_secs(10), "took {:?}", f.took);
}

// ---------------------------------------------------------------------------
// The runtime: real programs across hosts, compared with their native runs.

/// A node that serves any number of runs (no --once).
fn serving(h: &Hosts, k: usize) -> Node {
    let mut c = h.node_exec(k, bunkai());
    c.args(["share", "node", "--listen", &format!("{}:7000", h.node_ip(k))]);
    Node::start(c)
}

/// The share test programs, built once per test binary run into
/// build/tests/share (a temporary directory held by a static was never
/// removed: statics are not dropped at exit).
fn share_program(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = root().join("build/tests/share");
        std::fs::create_dir_all(&d).unwrap();
        for n in ["basic", "sync"] {
            let out = d.join(n);
            let st = Command::new("clang-14")
                .args(["-O2", "-pthread", "-o"])
                .arg(&out)
                .arg(program(&format!("share/{n}.c")))
                .status()
                .expect("clang-14");
            assert!(st.success(), "building {n}");
        }
        d
    });
    dir.join(name)
}

/// Runs argv natively in the home namespace and under `bunkai share run`
/// with `place`; returns both outputs and the run's stderr.
fn native_and_shared(h: &Hosts, nodes: &[Node], place: &str, argv: &[&str], limit: Duration) -> (Output, Output) {
    let native = h.home_exec(argv[0]).args(&argv[1..]).stdin(Stdio::null()).output().unwrap();
    let list = nodes.iter().map(|n| n.addr.clone()).collect::<Vec<_>>().join(",");
    let child = h
        .home_exec(bunkai())
        .args(["share", "run", "--nodes", &list, "--place", place, "--json", "--"])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (shared, _) = finish(child, limit);
    (native, shared)
}

fn summary(err: &str) -> serde_json::Value {
    let last = err.trim_end().lines().last().unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("no JSON summary ({e}): {err}"))
}

/// pthread_create/join, mutex + condition variable ping-pong, atomics,
/// malloc/free, mmap/munmap beside readers, nested creation, a node's new
/// mapping first-touched out of order (past the fresh-range bound) and
/// invalid calls: on three hosts, the same transcript as alone, and threads really
/// ran on the nodes.
#[test]
fn threads_run_on_the_nodes_with_the_native_transcript() {
    setup();
    if !can_run("threads_run_on_the_nodes_with_the_native_transcript", true, true) {
        return;
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let basic = share_program("basic");
    let sync = share_program("sync");
    let cases: Vec<Vec<&str>> = vec![
        vec![basic.to_str().unwrap()],
        vec![sync.to_str().unwrap(), "pingpong"],
        vec![sync.to_str().unwrap(), "atomic"],
        vec![sync.to_str().unwrap(), "malloc"],
        vec![sync.to_str().unwrap(), "mmap"],
        vec![sync.to_str().unwrap(), "nested"],
        vec![sync.to_str().unwrap(), "fresh"],
        vec![sync.to_str().unwrap(), "badcall"],
    ];
    for argv in &cases {
        let (native, shared) = native_and_shared(&h, &nodes, "rr", argv, Duration::from_secs(120));
        let err = text(&shared.stderr);
        assert!(native.status.success(), "{argv:?} natively: {}", text(&native.stderr));
        assert_eq!(shared.status.code(), Some(0), "{argv:?}: {err}");
        assert_eq!(text(&shared.stdout), text(&native.stdout), "{argv:?}: {err}");
        let v = summary(&err);
        let on_nodes: u64 = v["hosts"].as_array().unwrap()[1..].iter().map(|x| x["threads"].as_u64().unwrap_or(0)).sum();
        assert!(on_nodes >= 1, "{argv:?}: no thread ran on a node: {v}");
        if argv.len() == 1 || argv[1] != "badcall" {
            let moved: u64 = v["hosts"].as_array().unwrap().iter().map(|x| x["pages_in"].as_u64().unwrap_or(0)).sum();
            assert!(moved > 0, "{argv:?}: no page moved: {v}");
        }
    }
}

/// Files that exist only on the home host (a tmpfs in the home run's own
/// mount namespace): threads on the nodes open, write, read and unlink them.
#[test]
fn remote_threads_use_files_only_the_home_host_has() {
    setup();
    if !can_run("remote_threads_use_files_only_the_home_host_has", true, true) {
        return;
    }
    let h = Hosts::new(1).unwrap();
    let node = serving(&h, 1);
    let mnt = tempfile::Builder::new().prefix("bk-share-home").tempdir().unwrap();
    let dir = mnt.path().join("home-only");
    let sync = share_program("sync");
    let script = format!(
        "mount -t tmpfs none {m} && mkdir {d} && exec {b} share run --nodes {n} --place remote -- {s} file {d}",
        m = mnt.path().display(),
        d = dir.display(),
        b = bunkai().display(),
        n = node.addr,
        s = sync.display()
    );
    let out = h.home_exec("unshare").args(["-m", "sh", "-c", &script]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "file: 4 threads x 50 files, 0 failures\n");
    assert!(!dir.exists(), "the directory leaked out of the home run's mount namespace");
}

/// pigz -p 3 from Debian, unmodified, compressing and decompressing across
/// three hosts: byte-identical to the native run.
#[test]
fn pigz_across_three_hosts_is_byte_identical() {
    setup();
    if !can_run("pigz_across_three_hosts_is_byte_identical", true, true) {
        return;
    }
    assert!(Path::new("/usr/bin/pigz").exists(), "pigz is missing: run scripts/install-deps.sh");
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let work = tempfile::tempdir().unwrap();
    // 8 MB of text-like data, deterministic.
    let mut data = Vec::with_capacity(8 << 20);
    let mut x: u64 = 0x9E3779B97F4A7C15;
    while data.len() < 8 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = (x % 600) as usize;
        data.extend_from_slice(format!("word{w} ").as_bytes());
        if x % 13 == 0 {
            data.push(b'\n');
        }
    }
    let input = work.path().join("in.txt");
    std::fs::write(&input, &data).unwrap();
    let (native, shared) =
        native_and_shared(&h, &nodes, "rr", &["pigz", "-p", "3", "-c", input.to_str().unwrap()], Duration::from_secs(180));
    assert_eq!(shared.status.code(), Some(0), "{}", text(&shared.stderr));
    assert!(!native.stdout.is_empty());
    assert!(native.stdout == shared.stdout, "compressed output differs ({} vs {} bytes)", native.stdout.len(), shared.stdout.len());
    let gz = work.path().join("in.gz");
    std::fs::write(&gz, &native.stdout).unwrap();
    let (native_d, shared_d) =
        native_and_shared(&h, &nodes, "rr", &["pigz", "-p", "3", "-d", "-c", gz.to_str().unwrap()], Duration::from_secs(180));
    assert_eq!(shared_d.status.code(), Some(0), "{}", text(&shared_d.stderr));
    assert!(shared_d.stdout == data && native_d.stdout == data, "decompressed output differs");
}

/// A real fault in a thread on a node ends the run as it ends natively
/// (SIGSEGV), with a line naming the thread and the address.
#[test]
fn a_crash_on_a_node_ends_the_run_with_its_signal() {
    setup();
    if !can_run("a_crash_on_a_node_ends_the_run_with_its_signal", true, true) {
        return;
    }
    let h = Hosts::new(1).unwrap();
    let nodes = vec![serving(&h, 1)];
    let sync = share_program("sync");
    let (native, shared) = native_and_shared(&h, &nodes, "remote", &[sync.to_str().unwrap(), "crash"], Duration::from_secs(60));
    let err = text(&shared.stderr);
    assert_eq!(native.status.code(), None, "natively it dies by a signal");
    assert_eq!(shared.status.code(), Some(128 + 11), "{err}");
    assert!(err.contains("thread 1 on node 1: signal 11 at address 0x10"), "{err}");
    assert!(!text(&shared.stdout).contains("survived"));
}

/// The node dies while a thread runs there: the run fails with one line
/// and nothing is left behind.
#[test]
fn a_node_dying_under_a_remote_thread_fails_the_run() {
    setup();
    if !can_run("a_node_dying_under_a_remote_thread_fails_the_run", true, true) {
        return;
    }
    let h = Hosts::new(1).unwrap();
    let names: Vec<String> = (0..=1).map(|k| h.name(k)).collect();
    let mut node = serving(&h, 1);
    let sync = share_program("sync");
    let mut run = h
        .home_exec(bunkai())
        .args(["share", "run", "--nodes", &node.addr, "--place", "remote", "--"])
        .arg(&sync)
        .args(["sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the program runs (it says so), then some page traffic.
    let mut first = String::new();
    BufReader::new(run.stdout.as_mut().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first, "sleep: started\n");
    let started: Vec<u32> = h.pids(0).into_iter().chain(h.pids(1)).collect();
    let t0 = Instant::now();
    let _ = node.child.kill();
    let (out, _) = finish(run, Duration::from_secs(60));
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.trim_end().lines().last().unwrap().starts_with("bunkai share: node "), "{err}");
    assert!(err.contains("vanished"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(15), "took {:?}", t0.elapsed());
    wait_until("every process of the run to go", Duration::from_secs(10), || started.iter().all(|&p| !alive(p)));
    drop(node);
    drop(h);
    let left = netns::list();
    assert!(names.iter().all(|n| !left.contains(n)), "namespaces left: {left:?}");
}
