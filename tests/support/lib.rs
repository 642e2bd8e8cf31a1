//! Helpers for the end-to-end tests: where the real CLI and the test
//! programs are, and how to run a program and capture everything it does.

use std::path::{Path, PathBuf};
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository root.
pub fn root() -> PathBuf {
    match std::env::var_os("BUNKAI_ROOT") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf(),
    }
}

/// The built CLI (`make` puts it at build/bin/bunkai).
pub fn bunkai() -> PathBuf {
    let p = match std::env::var_os("BUNKAI") {
        Some(p) => PathBuf::from(p),
        None => root().join("build/bin/bunkai"),
    };
    assert!(p.exists(), "{} is missing: run `make` first", p.display());
    p
}

pub fn program(rel: &str) -> PathBuf {
    root().join("tests/programs").join(rel)
}

/// What a run did: the things "behaves exactly like the original" compares.
#[derive(Debug, PartialEq, Eq)]
pub struct Behaviour {
    pub stdout: String,
    pub stderr: String,
    pub code: Option<i32>,
}

pub fn behaviour(out: Output) -> Behaviour {
    Behaviour {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code(),
    }
}

/// Whether the test runs in CI (`.ci/run` sets CI=1).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Whether we are root, for a test that needs it (namespaces, mounts). In
/// CI (root, everything installed) not being root is a failure; elsewhere
/// the test is skipped with a line saying why.
pub fn need_root(test: &str, why: &str) -> bool {
    // SAFETY: geteuid has no preconditions
    if unsafe { geteuid() } == 0 {
        return true;
    }
    assert!(!in_ci(), "{test}: {why} needs root, and CI runs as root (run .ci/run as root)");
    eprintln!("{test}: skipped: {why} needs root (run the tests as root)");
    false
}

extern "C" {
    fn geteuid() -> u32;
}

/// How long any program under test may run before the test fails: a hang
/// is a failure, never a stuck CI job.
pub const DEADLINE: Duration = Duration::from_secs(300);

/// The deadline of a `bunkai scatter` run: scattering builds one library
/// per function (demo1 at the paper's size is 65,536 of them, about ten
/// minutes on two cores, see issue 23), so it gets longer than DEADLINE
/// but still an end.
pub const SCATTER_DEADLINE: Duration = Duration::from_secs(1800);

/// Runs `cmd` with `stdin` as its standard input; kills it and panics if it
/// is still running after DEADLINE.
pub fn run_with_stdin(cmd: &mut Command, stdin: Option<&Path>) -> Output {
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).expect("stdin file")),
        None => cmd.stdin(Stdio::null()),
    };
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()));
    finish(child, DEADLINE).0
}

/// Collects a spawned child's piped stdout (unless taken) and stderr until it exits; kills
/// it and panics after `limit`. Returns its output and how long it took.
pub fn finish(mut child: std::process::Child, limit: Duration) -> (Output, Duration) {
    let t0 = Instant::now();
    // stdout may have been taken already (stdout_lines): then it is empty here
    let out = child.stdout.take();
    let mut err = child.stderr.take().expect("stderr must be piped");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut out) = out {
            let _ = out.read_to_end(&mut v);
        }
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let err = t_err.join().unwrap_or_default();
            let tail = String::from_utf8_lossy(&err[err.len().saturating_sub(2000)..]).into_owned();
            panic!("still running after {limit:?}: killed; the end of its stderr:\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = t0.elapsed();
    (Output { status, stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap() }, took)
}

/// The scheduling example of bunkai mod (sched-host and its policy
/// modules), built by make.
pub fn sched_dir() -> PathBuf {
    let d = root().join("build/lib/bunkai/examples/sched");
    assert!(d.join("sched-host").exists(), "{} missing: run make", d.display());
    d
}

/// The lines a spawned child writes to its piped stdout, as they come (a
/// thread reads them; the channel closes when the child closes stdout).
pub fn stdout_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let out = child.stdout.take().expect("stdout must be piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// The command line, for a failure message.
pub fn describe(cmd: &Command) -> String {
    let mut v = vec![cmd.get_program().to_string_lossy().into_owned()];
    v.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    v.join(" ")
}

/// A deadline for a child the test talks to (a server, a session on its
/// pipes): if it still runs after `limit` it is killed, with a line naming
/// it, so a test blocked reading it fails instead of hanging. The same
/// process only: a pid reused meanwhile is left alone.
pub fn kill_after(child: &std::process::Child, limit: Duration, what: &str) {
    kill_pid_after(child.id(), limit, what)
}

/// `kill_after` for a process that is not our child (a daemon a test
/// started: it forked and its parent exited).
pub fn kill_pid_after(pid: u32, limit: Duration, what: &str) {
    kill_after_as(pid, limit, what, false)
}

/// `kill_pid_after` for a daemon that leads its own process group (it
/// called setsid, as memcached -d and httpd do): the whole group is killed,
/// the workers it forked with it.
pub fn kill_group_after(pid: u32, limit: Duration, what: &str) {
    kill_after_as(pid, limit, what, true)
}

fn kill_after_as(pid: u32, limit: Duration, what: &str, group: bool) {
    let started = proc_start(pid);
    let what = what.to_string();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(200).min(limit));
            if proc_start(pid) != started {
                return; // gone
            }
        }
        if started.is_some() && proc_start(pid) == started {
            eprintln!("`{what}` (pid {pid}): no end within {limit:?} (killed)");
            let target = if group { format!("-{pid}") } else { pid.to_string() };
            let _ = Command::new("kill").args(["-KILL", "--", &target]).status();
        }
    });
}

/// A process's start time (field 22 of /proc/PID/stat), which tells it
/// from a later process with the same pid.
fn proc_start(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 2..].split_whitespace().nth(19)?.parse().ok()
}

/// A command that would not start: a missing program is a prerequisite
/// missing, named with its fix.
fn cannot_run(what: &str, e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::NotFound {
        panic!("cannot run `{what}`: the program is not installed (run scripts/install-deps.sh)");
    }
    panic!("cannot run `{what}`: {e}")
}

/// `output()` and `status()` with a deadline: a command still running after
/// it is killed and the test fails naming it. Every process a test starts
/// goes through these, `finish` or `finish_named`.
pub trait Deadline {
    /// As `output()` (stdin empty, stdout and stderr captured).
    fn output_within(&mut self, limit: Duration) -> Output;
    /// As `status()` (stdout and stderr inherited).
    fn status_within(&mut self, limit: Duration) -> std::process::ExitStatus;
}

impl Deadline for Command {
    fn output_within(&mut self, limit: Duration) -> Output {
        let what = describe(self);
        let child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| cannot_run(&what, e));
        finish_named(child, limit, &what)
    }

    fn status_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let what = describe(self);
        let mut child = self.spawn().unwrap_or_else(|e| cannot_run(&what, e));
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st;
            }
            if t0.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{what}` (pid {}): no end within {limit:?} (killed)", child.id());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs bunkai with `args` under DEADLINE (SCATTER_DEADLINE for scatter);
/// a hang fails naming the command.
pub fn bunkai_run(args: &[&str]) -> Output {
    let limit = if args.first() == Some(&"scatter") { SCATTER_DEADLINE } else { DEADLINE };
    Command::new(bunkai()).args(args).output_within(limit)
}

/// `finish`, with the command named when it hangs.
pub fn finish_named(child: std::process::Child, limit: Duration, what: &str) -> Output {
    let pid = child.id();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| finish(child, limit))) {
        Ok((out, _)) => out,
        Err(e) => {
            let why = e.downcast_ref::<String>().cloned().unwrap_or_default();
            panic!("`{what}` (pid {pid}): no end within {limit:?} (killed)\n{why}")
        }
    }
}

/// Runs bunkai with `args`; panics with its stderr unless it succeeds.
pub fn bunkai_ok(args: &[&str]) -> Output {
    let out = bunkai_run(args);
    assert!(
        out.status.success(),
        "bunkai {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs bunkai expecting failure; returns stderr.
pub fn bunkai_fails(args: &[&str]) -> (i32, String) {
    let out = bunkai_run(args);
    assert!(!out.status.success(), "bunkai {args:?} unexpectedly succeeded");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Builds the original program with clang-14 directly (not through bunkai).
pub fn clang_build(srcs: &[PathBuf], flags: &[&str], out: &Path) {
    let st = Command::new("clang-14")
        .args(srcs)
        .args(flags)
        .arg("-o")
        .arg(out)
        .status_within(DEADLINE);
    assert!(st.success(), "clang-14 failed to build {srcs:?}");
}

/// The SQLite amalgamation fetched by `make fetch-sqlite`.
pub fn sqlite_dir() -> PathBuf {
    let d = root().join("build/third_party/sqlite");
    assert!(
        d.join("sqlite3.c").exists() && d.join("shell.c").exists(),
        "{} has no SQLite amalgamation: run `make fetch-sqlite`",
        d.display()
    );
    d
}

pub fn sqlite_flags() -> Vec<String> {
    let f = std::fs::read_to_string(sqlite_dir().join("flags.txt")).expect("flags.txt");
    f.split_whitespace().map(String::from).collect()
}

/// A server process under test (`bunkai scatter serve`, `python3 -m http.server`):
/// started, polled until it prints its URL, killed when dropped.
pub struct ServerProcess {
    child: std::process::Child,
    pub url: String,
}

impl ServerProcess {
    /// Starts `cmd` and waits (up to 30 s) for a stdout line from which
    /// `find_url` extracts the URL it serves.
    pub fn start(cmd: &mut Command, find_url: fn(&str) -> Option<String>) -> ServerProcess {
        use std::io::BufRead;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()));
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = find_url(&line) {
                        return ServerProcess { child, url };
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("{:?} did not announce a URL within 30 s", cmd.get_program());
                }
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Copies a directory tree (cp -a).
pub fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status_within(DEADLINE);
    assert!(st.success(), "cp -a {} {} failed", from.display(), to.display());
}

/// `bunkai scatter -o OUT EXTRA... INPUTS... -- FLAGS...`, which must succeed.
pub fn scatter(out: &Path, inputs: &[PathBuf], extra: &[&str], flags: &[&str]) -> Output {
    let mut args: Vec<String> = vec!["scatter".into(), "-o".into(), out.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(inputs.iter().map(|p| p.display().to_string()));
    args.push("--".into());
    args.extend(flags.iter().map(|s| s.to_string()));
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    bunkai_ok(&a)
}

/// The SQLite shell (shell.c + the amalgamation) scattered into `out` with
/// Debian's flags, as `sqlite3`.
pub fn scatter_sqlite(out: &Path) -> Output {
    let sq = sqlite_dir();
    let mut flags = sqlite_flags();
    flags.push(format!("-I{}", sq.display()));
    let f: Vec<&str> = flags.iter().map(|s| s.as_str()).collect();
    scatter(out, &[sq.join("shell.c"), sq.join("sqlite3.c")], &["--name", "sqlite3"], &f)
}

/// memcached's text protocol, one request at a time: each reply read to
/// its end ("END\r\n" for gets, one line otherwise).
pub const MC_SESSION: &[(&str, &str)] = &[
    ("set greeting 0 0 5\r\nhello\r\n", "\r\n"),
    ("get greeting\r\n", "END\r\n"),
    ("get nothing\r\n", "END\r\n"),
    ("append greeting 0 0 6\r\n world\r\n", "\r\n"),
    ("set n 0 0 2\r\n41\r\n", "\r\n"),
    ("incr n 1\r\n", "\r\n"),
    ("get greeting n\r\n", "END\r\n"),
    ("delete greeting\r\n", "\r\n"),
    ("get greeting\r\n", "END\r\n"),
];

/// MC_SESSION against a memcached on 127.0.0.1:`port`: its replies.
pub fn mc_session(port: u16) -> Vec<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut replies = Vec::new();
    for (req, end) in MC_SESSION {
        s.write_all(req.as_bytes()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(end.as_bytes()) {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the server closed the connection after {req:?}");
            got.extend_from_slice(&buf[..n]);
        }
        replies.push(String::from_utf8(got).unwrap());
    }
    replies
}
