//! End-to-end tests of `bunkai share`'s tool side (seed 002): the CLI's
//! errors, the node daemon's protocol, and the fault cases of the issue
//! (a node that dies, a link that is cut, a signal to the run) on hosts
//! that are network namespaces (bunkai_share::netns; root).
//!
//! Tests that start the real runtime fail, with the fix, when
//! libbunkai-share.so has not been built; the others give the CLI a
//! stand-in library through BUNKAI_LIBDIR (the node only checks that it
//! exists). No sleeps wait for servers: a node is ready when it has printed
//! its address, and everything else is polled with a deadline.
//!
//! One file (over 1,100 lines) on purpose: every test shares the namespace
//! hosts, the node fixture and the checks of a run's `--json` summary, and
//! cargo builds one binary per file.

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
            .output_within(DEADLINE);
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
    if root && !need_root(test, "a network namespace") {
        return false;
    }
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

/// `share key --json`: where the key went, whether it replaced one; a key
/// that exists is not replaced without --force, and says so as JSON.
#[test]
fn key_says_where_it_went_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let k = dir.path().join("cfg/share.key");
    let run = |extra: &[&str]| {
        let mut c = Command::new(bunkai());
        c.args(["share", "key", "--json", "--key"]).arg(&k).args(extra);
        let out = c.output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {:?} {:?}", text(&out.stdout), text(&out.stderr)));
        (out.status.code(), v)
    };
    let (code, v) = run(&[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v, serde_json::json!({"key": k, "replaced": false}));
    let first = std::fs::read_to_string(&k).unwrap();
    let (code, v) = run(&[]);
    assert_eq!(code, Some(1), "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.starts_with("bunkai share: a key exists already") && !e.contains('\n'), "{e}");
    assert_eq!(std::fs::read_to_string(&k).unwrap(), first, "a key was replaced without --force");
    let (code, v) = run(&["--force"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["replaced"], true);
    assert_ne!(std::fs::read_to_string(&k).unwrap(), first);
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
        .output_within(DEADLINE);
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

/// A connection to a node that has passed the handshake with `first`
/// sealed inside it, as the CLI's.
fn authenticated(addr: &str, first: &str) -> bunkai_share::proto::Lines {
    use bunkai_share::{auth, proto};
    let mut s = TcpStream::connect(addr).unwrap();
    let session = auth::client(&mut s, &cluster_key(), auth::ROLE_DAEMON, first.as_bytes()).unwrap();
    let mut c = proto::Lines::new(s);
    c.secure(session.lines);
    c
}

/// The node's side of the protocol, spoken by hand: a program that does
/// not exist there, another protocol version, a line that is not JSON.
#[test]
fn node_refuses_what_it_cannot_run() {
    setup();
    let node = Node::local();
    let ask = |line: &str| -> serde_json::Value {
        let mut c = authenticated(&node.addr, line);
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
    assert!(v["error"].as_str().unwrap().starts_with("not a JSON message"), "{v}");
    let v = ask(r#""GET / HTTP/1.0""#);
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
        for n in ["basic", "sync", "litmus", "stress", "dlopen", "moves", "firsttouch", "uffd_probe"] {
            let out = d.join(n);
            let st = Command::new("clang-14")
                .args(["-O2", "-pthread", "-o"])
                .arg(&out)
                .arg(program(&format!("share/{n}.c")))
                .arg("-ldl")
                .status_within(DEADLINE);
            assert!(st.success(), "building {n}");
        }
        d
    });
    dir.join(name)
}


/// argv run natively in the home namespace, with a deadline.
fn native(h: &Hosts, argv: &[&str], limit: Duration) -> Output {
    let child = h
        .home_exec(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish_named(child, limit, &argv.join(" "))
}

/// argv under `bunkai share run --place place --json` from the home
/// namespace, with a deadline.
fn shared(h: &Hosts, nodes: &[Node], place: &str, argv: &[&str], limit: Duration) -> Output {
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
    finish_named(child, limit, &format!("bunkai share run --place {place} -- {}", argv.join(" ")))
}

/// Runs argv natively in the home namespace and under `bunkai share run`
/// with `place`; returns both outputs.
fn native_and_shared(h: &Hosts, nodes: &[Node], place: &str, argv: &[&str], limit: Duration) -> (Output, Output) {
    (native(h, argv, limit), shared(h, nodes, place, argv, limit))
}

/// Threads that ran on nodes, and pages that moved, in a run's summary.
fn spread(v: &serde_json::Value) -> (u64, u64) {
    let hosts = v["hosts"].as_array().unwrap();
    let on_nodes = hosts[1..].iter().map(|x| x["threads"].as_u64().unwrap_or(0)).sum();
    let moved = hosts.iter().map(|x| x["pages_in"].as_u64().unwrap_or(0)).sum();
    (on_nodes, moved)
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
    let out = h.home_exec("unshare").args(["-m", "sh", "-c", &script]).stdin(Stdio::null()).output_within(DEADLINE);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "file: 4 threads x 50 files, 0 failures\n");
    assert!(!dir.exists(), "the directory leaked out of the home run's mount namespace");
}

/// Text-like data of `len` bytes, the same every time.
fn corpus(len: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(len + 16);
    let mut x: u64 = 0x9E3779B97F4A7C15;
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = (x % 600) as usize;
        data.extend_from_slice(format!("word{w} ").as_bytes());
        if x % 13 == 0 {
            data.push(b'\n');
        }
    }
    data.truncate(len);
    data
}

/// Runs argv `times` times under `bunkai share run --place place` on the
/// hosts of h and checks every run against the native output, byte for
/// byte, and that threads ran on the nodes and pages moved. Returns the
/// native output.
fn same_every_time(h: &Hosts, nodes: &[Node], place: &str, argv: &[&str], times: usize, limit: Duration) -> Vec<u8> {
    let native = native(h, argv, limit);
    assert!(native.status.success(), "{argv:?} natively: {}", text(&native.stderr));
    for run in 1..=times {
        let out = shared(h, nodes, place, argv, limit);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{argv:?} --place {place} run {run} of {times}: {err}");
        assert!(
            out.stdout == native.stdout,
            "{argv:?} --place {place} run {run} of {times}: output differs from the native run ({} against {} bytes)",
            out.stdout.len(),
            native.stdout.len()
        );
        let (on_nodes, moved) = spread(&summary(&err));
        assert!(
            on_nodes >= 1 && moved > 0,
            "{argv:?} --place {place} run {run}: threads on nodes {on_nodes}, pages moved {moved}"
        );
    }
    native.stdout
}

/// Debian's parallel compressors, unmodified, compressing and
/// decompressing across three hosts ten times each: every run's output is
/// the native one (lbzip2's used to be wrong in one run in five).
#[test]
fn real_programs_give_the_native_output_every_time() {
    setup();
    if !can_run("real_programs_give_the_native_output_every_time", true, true) {
        return;
    }
    for p in ["/usr/bin/pigz", "/usr/bin/lbzip2"] {
        assert!(Path::new(p).exists(), "{p} is missing: run scripts/install-deps.sh");
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let work = tempfile::tempdir().unwrap();
    let input = work.path().join("in.txt");
    std::fs::write(&input, corpus(8 << 20)).unwrap();
    let i = input.to_str().unwrap();
    let limit = Duration::from_secs(120);
    let gz = same_every_time(&h, &nodes, "rr", &["pigz", "-p", "3", "-c", i], 10, limit);
    let bz = same_every_time(&h, &nodes, "rr", &["lbzip2", "-n", "3", "-c", i], 10, limit);
    for (name, data) in [("in.gz", &gz), ("in.bz2", &bz)] {
        std::fs::write(work.path().join(name), data).unwrap();
    }
    let gzp = work.path().join("in.gz");
    let bzp = work.path().join("in.bz2");
    let d1 = same_every_time(&h, &nodes, "rr", &["pigz", "-p", "3", "-d", "-c", gzp.to_str().unwrap()], 10, limit);
    let d2 = same_every_time(&h, &nodes, "rr", &["lbzip2", "-n", "3", "-d", "-c", bzp.to_str().unwrap()], 10, limit);
    let data = std::fs::read(&input).unwrap();
    assert!(d1 == data && d2 == data, "decompressed output is not the input");
}

/// The litmus tests across three hosts: none of the outcomes x86-TSO
/// forbids, for each test, layout and kind of access, with the threads on
/// every pair of hosts (skew). And the control, natively: store buffering
/// without the fence shows the relaxed outcome, so the check sees one when
/// it happens.
#[test]
fn litmus_tests_see_no_forbidden_outcome() {
    setup();
    if !can_run("litmus_tests_see_no_forbidden_outcome", true, true) {
        return;
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let litmus = share_program("litmus");
    let l = litmus.to_str().unwrap();
    let control = native(&h, &[l, "sb", "same", "nofence", "300000"], Duration::from_secs(60));
    let forbidden = |out: &[u8]| -> (u64, u64) {
        let t = text(out);
        let last = t.lines().last().unwrap_or("").to_string();
        let w: Vec<&str> = last.split_whitespace().collect();
        assert!(w.len() == 4 && w[0] == "forbidden" && w[2] == "of", "{t}");
        (w[1].parse().unwrap(), w[3].parse().unwrap())
    };
    let (relaxed, _) = forbidden(&control.stdout);
    assert!(relaxed > 0, "store buffering without a fence never showed 0/0 natively: the check may be blind");
    let mut k = 0;
    for test in ["sb", "mp", "lb", "iriw", "2+2w"] {
        for layout in ["same", "split"] {
            for kind in ["plain", "atomic", "lock"] {
                let skew = (k % 3).to_string();
                k += 1;
                let iters = if test == "iriw" { "600" } else { "1500" };
                let argv = [l, test, layout, kind, iters, &skew];
                let out = shared(&h, &nodes, "rr", &argv, Duration::from_secs(120));
                let t = text(&out.stdout);
                let (bad, n) = forbidden(&out.stdout);
                assert_eq!((bad, n.to_string()), (0, iters.to_string()), "{argv:?}: {t}{}", text(&out.stderr));
                assert_eq!(out.status.code(), Some(0), "{argv:?}: {}", text(&out.stderr));
                let counts: u64 = t
                    .lines()
                    .filter(|x| x.starts_with("outcome "))
                    .map(|x| x.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                    .sum();
                assert_eq!(counts.to_string(), iters, "{argv:?}: {t}");
                let (on_nodes, moved) = spread(&summary(&text(&out.stderr)));
                assert!(on_nodes >= 1 && moved > 0, "{argv:?}: nothing ran across hosts");
            }
        }
    }
}

/// Random allocation, filling, passing, checking, growing, dropping and
/// freeing of buffers, beside a region mapped, moved and unmapped under
/// readers: ten seeds across three hosts, every check passes and the
/// transcript is the native one.
#[test]
fn random_memory_stress_across_three_hosts() {
    setup();
    if !can_run("random_memory_stress_across_three_hosts", true, true) {
        return;
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let stress = share_program("stress");
    for seed in 1..=10u64 {
        let seed = format!("{}", seed * 7919);
        let argv = [stress.to_str().unwrap(), "6", "60", &seed];
        let (native, out) = native_and_shared(&h, &nodes, "rr", &argv, Duration::from_secs(120));
        let err = text(&out.stderr);
        assert!(native.status.success(), "{argv:?} natively: {}", text(&native.stderr));
        assert_eq!(out.status.code(), Some(0), "{argv:?}: {err}");
        assert_eq!(text(&out.stdout), text(&native.stdout), "{argv:?}: {err}");
        let v = summary(&err);
        let (on_nodes, moved) = spread(&v);
        assert!(on_nodes >= 2 && moved > 0, "{argv:?}: {v}");
        assert!(v["zapped_pages"].as_u64().unwrap() > 0, "{argv:?}: no page was dropped everywhere: {v}");
    }
}

/// Memory moved under threads on other hosts: a buffer a node holds read-only
/// copies of is moved with mremap and rewritten at home, and the node reads
/// the new contents and its write reaches home (a node's move used to drop
/// the range's userfaultfd registration: it read zeros, its write was
/// lost); and main's stack grows deep and a node's thread uses it (it used
/// to ask home for ever). Both placements, five runs each.
#[test]
fn memory_moved_and_grown_under_remote_threads() {
    setup();
    if !can_run("memory_moved_and_grown_under_remote_threads", true, true) {
        return;
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let moves = share_program("moves");
    for place in ["remote", "rr"] {
        same_every_time(&h, &nodes, place, &[moves.to_str().unwrap()], 5, Duration::from_secs(60));
    }
}

/// The kernel answers the home manager's cheap question "is a mapping
/// change in flight?" (a write protection of an empty range, share/runtime/
/// uffd.c) as the manager needs: EAGAIN while a munmap's or an mremap's
/// event is unread, EINVAL otherwise. A kernel that checked the range first
/// would say EINVAL in both cases, and home would hand out pages the
/// program had just moved; this run fails on such a kernel.
#[test]
fn kernel_flags_a_mapping_change_in_flight() {
    setup();
    if !can_run("kernel_flags_a_mapping_change_in_flight", true, false) {
        return;
    }
    let probe = share_program("uffd_probe");
    let child = Command::new(&probe)
        .arg("40")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish_named(child, Duration::from_secs(60), "uffd_probe 40");
    let line = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{line}{}", text(&out.stderr));
    assert!(
        line.contains("40 rounds, 80 idle answers EINVAL, 40 in-flight answers EAGAIN, 0 wrong"),
        "{line}"
    );
}

/// Regions main maps, fills and unmaps, 200 times, each first touched by
/// two threads of a node at staggered instants: every thread must read
/// main's pattern (a node mapped such a region before registering it, and a
/// second thread touching it in between read the kernel's zero page for
/// good; the same region address every round must not be taken for a
/// fault that repeats). Both placements, three runs each.
#[test]
fn regions_first_touched_by_two_threads_of_a_node() {
    setup();
    if !can_run("regions_first_touched_by_two_threads_of_a_node", true, true) {
        return;
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let ft = share_program("firsttouch");
    for (place, threads) in [("remote", "4"), ("rr", "6")] {
        same_every_time(&h, &nodes, place, &[ft.to_str().unwrap(), threads, "200"], 3, Duration::from_secs(90));
    }
}

/// Libraries loaded with dlopen before the threads start (libz, libcrypto)
/// and by the threads themselves (libsqlite3, liblzma), called from
/// threads on the nodes; and Python threads hashing after `import
/// hashlib`: ten runs, each the native transcript (a thread on a node used
/// to crash on the first call: the library's GOT came from the file,
/// unrelocated).
#[test]
fn dlopen_before_and_after_threads_start() {
    setup();
    if !can_run("dlopen_before_and_after_threads_start", true, true) {
        return;
    }
    let h = Hosts::new(2).unwrap();
    let nodes: Vec<Node> = (1..=2).map(|k| serving(&h, k)).collect();
    let dl = share_program("dlopen");
    same_every_time(&h, &nodes, "rr", &[dl.to_str().unwrap(), "4"], 10, Duration::from_secs(60));
    let py = program("share/hash_threads.py");
    same_every_time(&h, &nodes, "rr", &["/usr/bin/python3", py.to_str().unwrap(), "4"], 3, Duration::from_secs(120));
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

// ---------------------------------------------------------------------------
// Nothing acts for a peer without the key.

/// A node daemon whose stderr (its log, and its replicas') we read.
struct LoggedNode {
    node: Node,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl LoggedNode {
    fn start(mut cmd: Command) -> LoggedNode {
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let err = child.stderr.take().unwrap();
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut g = l2.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut l = String::new();
            let _ = r.read_line(&mut l);
            let _ = tx.send(l);
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("the node did not start within 20 s");
        let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("node said {line:?}")).to_string();
        LoggedNode { node: Node { child, addr }, log }
    }

    fn local() -> LoggedNode {
        setup();
        let mut c = Command::new(bunkai());
        c.args(["share", "node", "--listen", "127.0.0.1:0"]);
        LoggedNode::start(c)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log has `n` lines containing `what`.
    fn wait_for(&self, what: &str, n: usize) {
        wait_until(&format!("{n} log lines with {what:?}"), Duration::from_secs(20), || {
            self.log().lines().filter(|l| l.contains(what)).count() >= n
        });
    }
}

/// Starts `bunkai share run` against addr with the program `touch flag`
/// (at home; the replica never runs the program's main) and waits.
fn touch_run(addr: &str, flag: &Path, key: Option<&Path>) -> Output {
    let mut c = Command::new(bunkai());
    c.args(["share", "run", "--nodes", addr, "--place", "home"]);
    if let Some(k) = key {
        c.arg("--key").arg(k);
    }
    let child = c
        .args(["--", "/bin/sh", "-c"])
        .arg(format!("touch {}", flag.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish_named(child, Duration::from_secs(60), "bunkai share run -- touch")
}

/// Without the key a node runs nothing: a spawn request sent without a
/// handshake, a CLI holding another key (named in one line), and a real
/// run's first flight (hello and sealed request, recorded by a proxy)
/// replayed byte for byte are all refused and logged; the node then
/// serves its owner as before.
#[test]
fn a_node_runs_nothing_for_a_peer_without_the_key() {
    let node = LoggedNode::local();
    let dir = tempfile::tempdir().unwrap();
    // 1. a spawn request without a handshake: the node reads it as a hello,
    //    refuses it and closes
    let flag1 = dir.path().join("no-handshake");
    let req = format!(
        r#"{{"spawn":{{"argv":["/bin/sh","-c","touch {}"],"env":[["PATH","/usr/bin:/bin"]],"cwd":"/","home":"127.0.0.1:9","host":1,"run_id":"0123456789abcdef0123456789abcdef","version":2}}}}"#,
        flag1.display()
    );
    let mut s = TcpStream::connect(&node.node.addr).unwrap();
    let _ = s.write_all(format!("{req}\n").as_bytes());
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 256];
    use std::io::Read;
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "the node answered a peer that made no handshake");
    node.wait_for("refused: not a bunkai share peer of this version", 1);
    // 2. another key: one line from the CLI, naming the fix
    let other = dir.path().join("other.key");
    bunkai_ok(&["share", "key", "--key", other.to_str().unwrap()]);
    let flag2 = dir.path().join("other-key");
    let out = touch_run(&node.node.addr, &flag2, Some(&other));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    one_line(&err);
    assert!(err.contains(&format!("node {}: does not hold our key", node.node.addr)), "{err}");
    node.wait_for("refused: ", 2);
    // 3. a replayed handshake: record what a real run's CLI sends, through
    //    a proxy, and send it again
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = proxy.local_addr().unwrap().to_string();
    let target = node.node.addr.clone();
    let recorder = std::thread::spawn(move || {
        let (mut c, _) = proxy.accept().unwrap();
        let mut n = TcpStream::connect(&target).unwrap();
        let (mut c2, mut n2) = (c.try_clone().unwrap(), n.try_clone().unwrap());
        let back = std::thread::spawn(move || {
            let _ = std::io::copy(&mut n2, &mut c2);
        });
        let mut rec = Vec::new();
        let mut b = [0u8; 65536];
        loop {
            match c.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    rec.extend_from_slice(&b[..k]);
                    if n.write_all(&b[..k]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = n.shutdown(std::net::Shutdown::Both);
        let _ = back.join();
        rec
    });
    let flag3 = dir.path().join("recorded");
    let out = touch_run(&paddr, &flag3, None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(flag3.exists());
    let recorded = recorder.join().unwrap();
    let hello = bunkai_share::auth::HELLO;
    assert!(recorded.len() > hello + 16, "recorded {} bytes", recorded.len());
    let started = node.log().matches(" started: ").count();
    std::fs::remove_file(&flag3).unwrap();
    // The flight again, on a new connection: the node challenges (its
    // nonce is remembered, its ends are another connection's), and without
    // the key the answer to the challenge can only be a guess.
    let flight_len = hello + u32::from_le_bytes(recorded[12..16].try_into().unwrap()) as usize + 16;
    let mut s = TcpStream::connect(&node.node.addr).unwrap();
    let _ = s.write_all(&recorded[..flight_len]);
    let _ = s.write_all(&[0u8; 32]);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    assert!(all.len() >= 4, "no answer to a replayed flight");
    assert_eq!(u32::from_le_bytes(all[..4].try_into().unwrap()), bunkai_share::auth::CHALLENGE, "a replayed flight was not challenged");
    node.wait_for("refused: a challenge not answered (its nonce was seen before", 1);
    assert_eq!(node.log().matches(" started: ").count(), started, "a replayed handshake started a replica: {}", node.log());
    // nothing ran for any of them; the owner is still served
    assert!(!flag1.exists() && !flag2.exists() && !flag3.exists());
    let flag4 = dir.path().join("owner");
    let out = touch_run(&node.node.addr, &flag4, None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(flag4.exists());
}

/// 300 connections that never say anything: the node holds at most 16 of
/// them (the rest are closed at once, with a line each), its threads stay
/// bounded, a run already going is unharmed, and once they are gone the
/// node serves a new run.
#[test]
fn three_hundred_idle_connections_do_not_take_the_node() {
    let node = LoggedNode::local();
    let pid = node.node.child.id();
    let dir = tempfile::tempdir().unwrap();
    // a run in progress: its program waits for a file we create later
    let go = dir.path().join("go");
    let done = dir.path().join("done");
    let mut c = Command::new(bunkai());
    let running = c
        .args(["share", "run", "--nodes", &node.node.addr, "--place", "home", "--", "/bin/sh", "-c"])
        .arg(format!("while [ ! -e {g} ]; do sleep 0.05; done; touch {d}", g = go.display(), d = done.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    node.wait_for(" started: ", 1);
    let idle: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(&node.node.addr).unwrap()).collect();
    node.wait_for("connections are already waiting for their handshake", 250);
    let threads = || -> usize {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Threads:").map(|v| v.trim().parse().unwrap()))
            .unwrap()
    };
    assert!(threads() <= 16 + 4, "the node has {} threads for 300 idle connections", threads());
    std::fs::write(&go, "").unwrap();
    let out = finish_named(running, Duration::from_secs(60), "bunkai share run (during the flood)");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(done.exists());
    drop(idle);
    node.wait_for("refused: the connection ended during the handshake", 1);
    let flag = dir.path().join("after");
    let out = touch_run(&node.node.addr, &flag, None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(flag.exists());
}

/// Captures, in home's namespace, the first bytes a runtime sends to a
/// replica's thread port (the executor's hello and START) and prints
/// "PORT HEX". Prints "ready" once it listens.
const SNIFF: &str = r#"
import socket, struct, sys, time
MAGIC, VERSION = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.settimeout(1)
print("ready", flush=True)
want = struct.pack('<III', MAGIC, VERSION, 2)
NEED = 80 + 32 + 48  # the hello, START's header and its payload
flow, got = None, b''
end = time.monotonic() + 60
while time.monotonic() < end:
    try:
        f = s.recv(65536)
    except socket.timeout:
        continue
    if len(f) < 34 or f[12:14] != b'\x08\x00':
        continue
    ip = f[14:]
    ihl = (ip[0] & 15) * 4
    if ip[9] != 6:
        continue
    tcp = ip[ihl:struct.unpack('>H', ip[2:4])[0]]
    data = tcp[(tcp[12] >> 4) * 4:]
    ports, seq = tcp[0:4], struct.unpack('>I', tcp[4:8])[0]
    if flow is None and data.startswith(want):
        flow, got, first = ports, data, seq
    elif flow == ports and data and seq == (first + len(got)) % 2**32:
        got += data  # the next bytes in order (a retransmission is not)
    if flow is not None and len(got) >= NEED:
        print(struct.unpack('>H', tcp[2:4])[0], got[:NEED].hex(), flush=True)
        sys.exit(0)
sys.exit("no hello seen within 60 s")
"#;

/// During a run, the replica's thread port takes only the home host's
/// executors: a bare START (no handshake), a hello under another key and
/// a real executor's hello and START replayed byte for byte (captured on
/// the link), all sent from the home host's own address, are refused
/// without an answer and logged; the remote thread ran once, and the run
/// ends as it does natively.
#[test]
fn a_replica_port_refuses_bare_messages_other_keys_and_replays() {
    setup();
    if !can_run("a_replica_port_refuses_bare_messages_other_keys_and_replays", true, true) {
        return;
    }
    let h = Hosts::new(1).unwrap();
    let mut c = h.node_exec(1, bunkai());
    c.args(["share", "node", "--listen", &format!("{}:7000", h.node_ip(1))]);
    let node = LoggedNode::start(c);
    let dir = tempfile::tempdir().unwrap();
    let sniff_err = dir.path().join("capture.err");
    let mut sniffer = Command::new("ip")
        .args(["netns", "exec", &h.name(0), "python3", "-c", SNIFF])
        .arg(bunkai_share::stats::BKS_MAGIC.to_string())
        .arg(bunkai_share::stats::BKS_VERSION.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&sniff_err).unwrap())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let sout = sniffer.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(sout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)).expect("the capture did not start within 20 s"), "ready");
    let sync = share_program("sync");
    let run = h
        .home_exec(bunkai())
        .args(["share", "run", "--nodes", &node.node.addr, "--place", "remote", "--"])
        .arg(&sync)
        .args(["sleep", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = rx.recv_timeout(Duration::from_secs(60));
    let _ = sniffer.kill();
    let _ = sniffer.wait();
    let line = line.unwrap_or_else(|_| {
        panic!("no executor hello captured: {}", std::fs::read_to_string(&sniff_err).unwrap_or_default())
    });
    let (port, hello) = line.split_once(' ').unwrap();
    let attack = |script: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", &h.name(0), "python3", "-c", script])
            .output_within(DEADLINE);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let target = format!("('{}', {port})", h.node_ip(1));
    let answer = "s.settimeout(10)\ntry: r=s.recv(100); print('closed' if r == b'' else 'answered')\nexcept ConnectionResetError: print('closed')";
    // a bare START: 32 bytes of header, 48 of payload
    let got = attack(&format!(
        "import socket,struct\ns=socket.create_connection({target})\ns.sendall(struct.pack('<IIQQQ',32,48,0,0,0)+bytes(48))\n{answer}"
    ));
    assert_eq!(got.trim(), "closed", "the replica answered a bare START");
    // a hello in the right form under another key, START behind it
    let got = attack(&format!(
        "import socket,struct,os\ns=socket.create_connection({target})\n(ci,cp),(si,sp)=s.getsockname(),s.getpeername()\ns.sendall(struct.pack('<IIIIIIQ',{m},{v},2,0,1,0,1)+socket.inet_aton(ci)+socket.inet_aton(si)+struct.pack('>HH',cp,sp)+bytes(4)+os.urandom(32)+struct.pack('<IIQQQ',32,48,0,0,0)+bytes(48))\n{answer}",
        m = bunkai_share::stats::BKS_MAGIC,
        v = bunkai_share::stats::BKS_VERSION
    ));
    assert_eq!(got.trim(), "closed", "the replica answered a peer with another key");
    // the executor's own hello and START, again
    let got = attack(&format!(
        "import socket\ns=socket.create_connection({target})\ns.sendall(bytes.fromhex('{hello}'))\n{answer}"
    ));
    assert_eq!(got.trim(), "closed", "the replica answered a replayed hello");
    node.wait_for("refused a thread connection from", 3);
    let log = node.log();
    for why in ["(not a bunkai share runtime of this version)", "(wrong key)", "(a hello seen before, or made for another connection (replayed))"] {
        assert!(log.contains(why), "no refusal {why} in the node's log: {log}");
    }
    let out = finish_named(run, Duration::from_secs(60), "bunkai share run -- sync sleep 4");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "sleep: started\nsleep: done\n", "the remote thread did not run exactly once");
}

/// A node started as root says so, and with --user it reads the key as
/// root, then drops to the account for good (replicas run as it).
#[test]
fn a_root_node_says_so_and_drops_to_a_user() {
    setup();
    if !can_run("a_root_node_says_so_and_drops_to_a_user", true, false) {
        return;
    }
    let node = LoggedNode::local();
    node.wait_for("running as root", 1);
    let mut c = Command::new(bunkai());
    c.args(["share", "node", "--listen", "127.0.0.1:0", "--user", "nobody"]);
    let dropped = LoggedNode::start(c);
    let status = std::fs::read_to_string(format!("/proc/{}/status", dropped.node.child.id())).unwrap();
    let ids = |key: &str| -> Vec<String> {
        status.lines().find(|l| l.starts_with(key)).unwrap().split_whitespace().skip(1).map(String::from).collect()
    };
    assert_eq!(ids("Uid:"), vec!["65534"; 4], "{status}");
    assert!(!ids("Groups:").contains(&"0".to_string()), "{status}");
    assert!(!dropped.log().contains("running as root"), "{}", dropped.log());
    let (code, err) = bunkai_fails(&["share", "node", "--listen", "127.0.0.1:0", "--user", "no-such-user-here"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("bunkai share: --user no-such-user-here: ") && err.trim_end().ends_with("(give an account of this host)"), "{err}");
}
