//! `make demo`'s demo, scripts/demo.sh, run as make runs it (after the
//! build): every step must print its line and be ok within the five
//! minutes, the summary must say so, what each step wrote must be what it
//! claims (the scattered program prints what the native build prints, the
//! pictures parse as SVG, the compressed file decompresses to its input,
//! the module rounds show each policy), and the demo must leave nothing
//! behind: no changed file in the repository, no process, no namespace.
//! Ctrl-C in the middle of the share step also leaves nothing, and bad
//! usage is one line.

use bunkai_e2e::*;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bound on the demo after the build.
const FIVE_MINUTES: Duration = Duration::from_secs(300);

/// Each step, and what its line must say (besides not FAILED), in order.
const STEPS: [(&str, &[&str]); 5] = [
    (
        "scatter",
        &[
            "demo1 (1,024 functions) split into a launcher + 1025 libraries",
            "groups in first-call order",
            "started from http://127.0.0.1:",
            "fetched on demand",
            "printed what the native build prints",
            "/scatter/scattered.out",
        ],
    ),
    (
        "trace",
        &["one request to examples/server.c, traced from accept to close: ", " instructions, ", "pages drawn in ", "/trace/pages.svg"],
    ),
    (
        "share",
        &["pigz -p 3 compressed 1,000,000 lines across three hosts", "threads: home ", "pages moved", "the output decompresses to the input", "/share/numbers.gz"],
    ),
    (
        "flow",
        &["examples/request.xml woven into a running server", "one request followed: flow 0x", "from read_request to free_request", "/flow/report.txt", "flows.svg"],
    ),
    (
        "mod",
        &["into a running sched-host", "rr loaded, swapped for edf", "a damaged module refused in one line", "both unloaded", "the host kept scheduling", "/mod/rounds.log"],
    ),
];

/// The demo runs alone: it times itself, and two at once on two cores
/// would only slow both.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
    fn signal(sig: i32, handler: usize) -> usize;
}
const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;

fn git_status() -> String {
    let out = Command::new("git").arg("-C").arg(root()).args(["status", "--porcelain"]).output_within(Duration::from_secs(60));
    assert!(out.status.success(), "git status: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// scripts/demo.sh ARGS, as `make demo` runs it (the CLI under test as
/// $BUNKAI), in a process group of its own, its stdout and stderr in one
/// transcript.
fn start_demo(args: &[&str], dir: Option<&Path>, log: &Path) -> std::process::Child {
    let f = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/demo.sh"))
        .args(args)
        .current_dir(root())
        .env("BUNKAI", bunkai())
        .env_remove("BUNKAI_SHARE_KEY")
        .env_remove("BUNKAI_FLOW_DIR")
        .env_remove("BUNKAI_HOST_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f))
        .process_group(0);
    // The demo's Ctrl-C handling is bash's trap, and bash cannot trap a
    // signal ignored when it starts: a test run from a background job of
    // a non-interactive shell (`make test &`) inherits SIGINT ignored.
    // SAFETY: signal() is async-signal-safe; SIG_DFL is 0
    unsafe {
        cmd.pre_exec(|| {
            signal(SIGINT, 0);
            Ok(())
        });
    }
    match dir {
        Some(d) => cmd.env("BUNKAI_DEMO_DIR", d),
        None => cmd.env_remove("BUNKAI_DEMO_DIR"),
    };
    cmd.spawn().expect("cannot run bash")
}

/// Waits for the demo; past `limit` it gets Ctrl-C (so that it cleans up),
/// then SIGKILL, and the test fails naming it.
fn wait_demo(child: &mut std::process::Child, limit: Duration, log: &Path) -> (ExitStatus, Duration) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st, t0.elapsed());
        }
        if t0.elapsed() > limit {
            let pg = child.id() as i32;
            // SAFETY: kill has no memory preconditions; the group is ours
            unsafe { kill(-pg, SIGINT) };
            let t1 = Instant::now();
            while child.try_wait().unwrap().is_none() && t1.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(50));
            }
            // SAFETY: as above
            unsafe { kill(-pg, SIGKILL) };
            let _ = child.wait();
            panic!("`bash scripts/demo.sh` (pid {pg}): no end within {limit:?} (interrupted)\n{}", transcript(log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn transcript(log: &Path) -> String {
    format!("--- its output ---\n{}", std::fs::read_to_string(log).unwrap_or_default())
}

/// Processes other than this test whose command line or working directory
/// names `dir`, as "pid command".
fn processes_in(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy().into_owned();
    let me = std::process::id().to_string();
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default();
        let cwd = std::fs::read_link(e.path().join("cwd")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        if cmdline.contains(&d) || cwd.starts_with(&d) {
            v.push(format!("{name} {}", cmdline.trim()));
        }
    }
    v
}

/// Namespaces the demo (owner: its pid) made, still there.
fn namespaces_of(pid: u32) -> Vec<String> {
    bunkai_share::netns::list().into_iter().filter(|n| bunkai_share::netns::owner_of(n) == Some(pid)).collect()
}

/// Nothing left: no process in `dir`, no namespace of `pid`, nobody in its
/// process group (given 5 s to go); what is left is killed, then the test fails.
fn assert_nothing_left(pid: u32, dir: &Path, log: &Path) {
    let t0 = Instant::now();
    let mut left = processes_in(dir);
    while !left.is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        left = processes_in(dir);
    }
    // SAFETY: kill has no memory preconditions; the group was the demo's
    unsafe { kill(-(pid as i32), SIGKILL) };
    let ns = namespaces_of(pid);
    if !ns.is_empty() {
        bunkai_share::netns::destroy(&ns);
    }
    assert!(left.is_empty(), "the demo left processes running: {left:?}\n{}", transcript(log));
    assert!(ns.is_empty(), "the demo left namespaces: {ns:?}\n{}", transcript(log));
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// An SVG picture that parses, with at least `min` elements.
fn assert_svg(p: PathBuf, min: usize) {
    let text = read(p.clone());
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: not XML: {e}", p.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg", "{}: not an SVG picture", p.display());
    let n = doc.descendants().filter(|n| n.is_element()).count();
    assert!(n >= min, "{}: {n} elements, fewer than {min}: an empty picture", p.display());
}

#[test]
fn demo_shows_every_subsystem_within_five_minutes_and_leaves_nothing() {
    if !need_root("demo_shows_every_subsystem_within_five_minutes_and_leaves_nothing", "the share step's network namespaces") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = git_status();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let log = tmp.path().join("demo.log");
    let mut child = start_demo(&[], Some(&dir), &log);
    let pid = child.id();
    let (status, took) = wait_demo(&mut child, FIVE_MINUTES, &log);
    let out = read(log.clone());
    let shown = transcript(&log);
    assert_nothing_left(pid, &dir, &log);
    assert!(status.success(), "the demo exited with {status}\n{shown}");
    assert!(took <= FIVE_MINUTES, "the demo took {took:?}\n{shown}");
    assert_eq!(git_status(), before, "the demo changed the repository's files\n{shown}");

    // the lines, in order: a header naming the directory, one per step, the summary
    let lines: Vec<&str> = out.lines().collect();
    let dir_s = dir.to_string_lossy().into_owned();
    assert!(lines[0].starts_with("bunkai demo: ") && lines[0].ends_with(&format!("output in {dir_s}")), "first line: {}\n{shown}", lines[0]);
    for (i, (name, want)) in STEPS.iter().enumerate() {
        let prefix = format!("[{}/5] {name}: ", i + 1);
        let line = lines.get(i + 1).copied().unwrap_or_default();
        assert!(line.starts_with(&prefix), "line {}: want `{prefix}...`, got `{line}`\n{shown}", i + 2);
        assert!(!line.contains("FAILED"), "{line}\n{shown}");
        let mut at = 0;
        for w in *want {
            match line[at..].find(w) {
                Some(k) => at += k + w.len(),
                None => panic!("{name}: no `{w}` in its line after byte {at}: {line}\n{shown}"),
            }
        }
    }
    let sum = lines.iter().position(|l| *l == format!("bunkai demo: summary (output in {dir_s})")).unwrap_or_else(|| panic!("no summary\n{shown}"));
    assert_eq!(lines[sum + 1].split_whitespace().collect::<Vec<_>>(), ["step", "time", "result"], "{shown}");
    let mut total_steps = 0.0;
    for (k, (name, _)) in STEPS.iter().enumerate() {
        let f: Vec<&str> = lines[sum + 2 + k].split_whitespace().collect();
        assert_eq!((f[0], f[2], f[3]), (*name, "s", "ok"), "summary row: {}\n{shown}", lines[sum + 2 + k]);
        total_steps += f[1].parse::<f64>().unwrap_or_else(|_| panic!("summary row: {}", lines[sum + 2 + k]));
    }
    let f: Vec<&str> = lines[sum + 7].split_whitespace().collect();
    assert_eq!((f[0], f[2], f[3], f[4]), ("total", "s", "5", "ok"), "{shown}");
    let total: f64 = f[1].parse().unwrap();
    assert!(total + 0.5 >= total_steps && total <= took.as_secs_f64() + 0.5, "total {total} s, steps {total_steps} s, measured {took:?}\n{shown}");
    assert_eq!(lines.len(), sum + 8, "lines after the summary\n{shown}");

    // scatter: the run from the URL printed what the native build prints
    let native = read(dir.join("scatter/native.out"));
    assert!(native.starts_with("demo1 ") && native.ends_with('\n'), "native.out: {native:?}");
    assert_eq!(read(dir.join("scatter/scattered.out")), native, "the scattered run's output");
    assert!(read(dir.join("scatter/run.txt")).contains("fetched on demand"));

    // trace: the report's JSON, the pages picture
    let report: serde_json::Value = serde_json::from_str(&read(dir.join("trace/report.json"))).expect("trace/report.json");
    let ins = report["streams"][0]["instructions"].as_u64().unwrap_or(0);
    assert!(ins > 1000, "trace: {ins} instructions for a request");
    assert!(out.contains(&format!("{} instructions", commas(ins))), "the trace line's count is not the report's {ins}\n{shown}");
    assert_svg(dir.join("trace/pages.svg"), 100);
    let calls = read(dir.join("trace/calls.txt"));
    for f in ["read_request() {", "free_request() {"] {
        assert!(calls.contains(f), "trace/calls.txt has no `{f}`:\n{calls}");
    }

    // share: the compressed file decompresses to the input; threads ran on nodes
    let numbers = read(dir.join("share/numbers"));
    let want: String = (1..=1_000_000).map(|i| format!("{i}\n")).collect();
    assert!(numbers == want, "share/numbers is not seq 1000000");
    let gz = Command::new("pigz").arg("-dc").arg(dir.join("share/numbers.gz")).output_within(Duration::from_secs(60));
    assert!(gz.status.success() && gz.stdout == want.as_bytes(), "share/numbers.gz does not decompress to the input");
    let run = read(dir.join("share/run.txt"));
    let summary: serde_json::Value =
        serde_json::from_str(run.lines().filter(|l| l.starts_with('{')).last().expect("share/run.txt: no JSON summary")).unwrap();
    let hosts = summary["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 3, "share: {summary}");
    let on_nodes: u64 = hosts[1..].iter().map(|h| h["threads"].as_u64().unwrap_or(0)).sum();
    assert!(on_nodes >= 1 && summary["exit_status"] == 0, "share: {summary}");
    assert!(!std::fs::read_to_string(dir.join("share/share.key")).unwrap_or_default().is_empty(), "the demo's key is in its directory");

    // flow: the report follows the request; the picture parses
    let report = read(dir.join("flow/report.txt"));
    assert!(report.starts_with("flow 0x"), "flow/report.txt:\n{report}");
    let (a, b) = (report.find("read_request").unwrap_or(usize::MAX), report.rfind("free_request").unwrap_or(0));
    assert!(a < b, "flow/report.txt does not go from read_request to free_request:\n{report}");
    assert_svg(dir.join("flow/flows.svg"), 10);

    // mod: rounds by rr, then edf, then the builtin policy again
    let rounds = read(dir.join("mod/rounds.log"));
    let policies: Vec<&str> = rounds.lines().filter_map(|l| l.split_whitespace().nth(3)).collect();
    let (rr, edf) = (policies.iter().position(|p| *p == "rr"), policies.iter().position(|p| *p == "edf"));
    let last_edf = policies.iter().rposition(|p| *p == "edf");
    assert!(rr.is_some() && edf.is_some() && rr < edf, "mod/rounds.log: no rr round before an edf round");
    assert!(policies[last_edf.unwrap()..].contains(&"builtin"), "mod/rounds.log: no builtin round after the unload");
    let refused = read(dir.join("mod/refused.txt"));
    assert!(refused.starts_with("bunkai mod: ") && refused.lines().count() == 1, "mod/refused.txt: {refused}");
    eprintln!("the demo took {took:?}");
}

fn commas(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Ctrl-C while the share step's nodes run in their namespaces: exit 130,
/// one line, and no process or namespace left.
#[test]
fn ctrl_c_during_the_share_step_leaves_nothing() {
    if !need_root("ctrl_c_during_the_share_step_leaves_nothing", "the share step's network namespaces") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let log = tmp.path().join("demo.log");
    let mut child = start_demo(&["--only", "share,mod"], Some(&dir), &log);
    let pid = child.id();
    let node = dir.join("share/node2.txt");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&node).unwrap_or_default().starts_with("listening on") {
        if t0.elapsed() > Duration::from_secs(60) || child.try_wait().unwrap().is_some() {
            // SAFETY: kill has no memory preconditions; the group is ours
            unsafe { kill(-(pid as i32), SIGINT) };
            let _ = wait_demo(&mut child, Duration::from_secs(30), &log);
            assert_nothing_left(pid, &dir, &log);
            panic!("the share step's second node did not listen within 60 s\n{}", transcript(&log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!namespaces_of(pid).is_empty(), "the share step runs, but the demo's namespaces are not there");
    // SAFETY: as above: Ctrl-C, as a terminal sends it to its foreground group
    unsafe { kill(-(pid as i32), SIGINT) };
    let (status, took) = wait_demo(&mut child, Duration::from_secs(30), &log);
    let out = read(log.clone());
    assert_nothing_left(pid, &dir, &log);
    assert_eq!(status.code(), Some(130), "{}", transcript(&log));
    assert!(took < Duration::from_secs(15), "Ctrl-C took {took:?} to end the demo");
    assert_eq!(out.lines().filter(|l| l.contains("interrupted")).count(), 1, "{out}");
    assert!(out.lines().last().unwrap_or_default().starts_with("bunkai demo: interrupted"), "{out}");
    assert!(!out.contains("[1/2]"), "a step line for an interrupted step:\n{out}");
}

/// Bad usage: one line `bunkai demo: ... (...)`, exit 2, nothing made.
#[test]
fn bad_usage_is_one_line() {
    let before = git_status();
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("keep"), "mine").unwrap();
    let inside = root().join("build/demo-inside-the-repo");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![inside.display().to_string()], "is inside the repository (give a directory outside it)"),
        (vec![full.display().to_string()], "is not empty (give a new or empty directory)"),
        (vec!["--only".into(), "scatter,nothing".into(), tmp.path().join("x").display().to_string()], "no step `nothing`"),
        (vec!["--frobnicate".into()], "unknown option --frobnicate"),
    ];
    for (args, want) in cases {
        let out = Command::new("bash")
            .arg(root().join("scripts/demo.sh"))
            .args(&args)
            .env("BUNKAI", bunkai())
            .env_remove("BUNKAI_DEMO_DIR")
            .output_within(Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: printed {}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(err.starts_with("bunkai demo: ") && err.contains(want) && err.trim_end().ends_with(')'), "{args:?}: {err}");
    }
    assert!(!inside.exists(), "the demo made {}", inside.display());
    assert!(!tmp.path().join("x").exists(), "the demo made a directory for bad usage");
    assert_eq!(std::fs::read_to_string(full.join("keep")).unwrap(), "mine");
    assert_eq!(git_status(), before, "bad usage changed the repository's files");
}
