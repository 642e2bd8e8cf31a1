//! End-to-end tests of `bunkai trace`: the real CLI and the Valgrind tool on
//! real programs, checked against Valgrind's own callgrind and lackey, and
//! on Debian's Apache httpd (the paper's case study).

use bunkai_e2e::{bunkai, bunkai_fails, bunkai_ok, program, run_with_stdin, Deadline, DEADLINE};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the tool, canonical (the client sees VALGRIND_LIB
/// in its environment, so it must be the same string everywhere).
fn tool_dir() -> PathBuf {
    let b = bunkai();
    b.parent().unwrap().join("../lib/bunkai/valgrind").canonicalize().expect("the Valgrind tool is built")
}

/// A command with a minimal, fixed environment, so that two runs of a
/// program under two Valgrind tools execute the same instructions.
fn clean(cmd: &mut Command) -> &mut Command {
    cmd.env_clear().env("PATH", "/usr/bin:/bin").env("VALGRIND_LIB", tool_dir())
}

fn cc(src: &str, out: &Path, extra: &[&str]) -> PathBuf {
    let st = Command::new("gcc")
        .arg("-O1")
        .arg("-g")
        .arg(program(src))
        .args(extra)
        .arg("-o")
        .arg(out)
        .status_within(DEADLINE);
    assert!(st.success(), "gcc failed on {src}");
    out.to_path_buf()
}

fn record(out: &Path, opts: &[&str], cmd: &[&str]) -> Value {
    let mut c = Command::new(bunkai());
    clean(&mut c).args(["trace", "record", "-o"]).arg(out).arg("--json").args(opts).arg("--").args(cmd);
    let o = run_with_stdin(c.stdout(Stdio::null()), None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "record {cmd:?} failed: {err}");
    let line = err.lines().filter(|l| l.starts_with('{')).last().expect("a JSON summary");
    serde_json::from_str(line).unwrap()
}

fn report(trace: &Path) -> Value {
    let o = bunkai_ok(&["trace", "report", "--json", trace.to_str().unwrap()]);
    serde_json::from_slice(&o.stdout).unwrap()
}

fn dump_json(trace: &Path) -> Vec<Value> {
    let o = bunkai_ok(&["trace", "dump", "--json", trace.to_str().unwrap()]);
    String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn calls_text(trace: &Path) -> String {
    String::from_utf8(bunkai_ok(&["trace", "calls", trace.to_str().unwrap()]).stdout).unwrap()
}

/// callgrind's total Ir for a run of `cmd` in the clean environment.
fn callgrind_total(cmd: &[&str], dir: &Path) -> u64 {
    let out = dir.join("callgrind.out");
    let mut c = Command::new("valgrind");
    clean(&mut c).arg("--tool=callgrind").arg(format!("--callgrind-out-file={}", out.display())).args(cmd);
    let o = run_with_stdin(c.stdout(Stdio::null()), None);
    assert!(o.status.success(), "callgrind failed: {}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    let line = text.lines().find(|l| l.starts_with("summary:")).expect("callgrind summary line");
    line["summary:".len()..].trim().parse().unwrap()
}

#[test]
fn instruction_counts_equal_callgrind() {
    let d = tempfile::tempdir().unwrap();
    let loopbin = cc("trace/window.c", &d.path().join("window"), &[]);
    let staticbin = cc("trace/window.c", &d.path().join("window-static"), &["-static"]);
    for bin in [&loopbin, &staticbin] {
        let cmd = [bin.to_str().unwrap()];
        let cg = callgrind_total(&cmd, d.path());
        let trace = d.path().join("t.bkt");
        let sum = record(&trace, &[], &cmd);
        let rep = report(&trace);
        assert_eq!(rep["total_instructions"].as_u64().unwrap(), sum["instructions"].as_u64().unwrap());
        // callgrind collects a block's cost when the block is left; the last
        // block, which makes the exit_group syscall, is never left. So its
        // total is exactly our count before that block.
        let recs = dump_json(&trace);
        let last = recs.iter().filter(|r| r["type"] == "exec").last().unwrap();
        assert_eq!(last["end"], "syscall");
        assert_eq!(last["instr"].as_u64().unwrap(), cg, "{}: ours before the final block vs callgrind", bin.display());
        let last_len = last["insns"].as_array().unwrap().len() as u64;
        assert_eq!(sum["instructions"].as_u64().unwrap(), cg + last_len);
    }
}

#[test]
fn memory_references_match_lackey_exactly() {
    let d = tempfile::tempdir().unwrap();
    // Static: in a dynamic program ld.so's strcspn reads past the end of
    // the last environment string into the AT_RANDOM bytes, and indexes a
    // table with them, so two lackey runs of it differ from each other.
    let bin = cc("trace/window.c", &d.path().join("window"), &["-static"]);
    let trace = d.path().join("t.bkt");
    record(&trace, &[], &[bin.to_str().unwrap()]);
    let ours = bunkai_ok(&["trace", "dump", "--lackey", trace.to_str().unwrap()]).stdout;
    // lackey with superblock chasing off: with it on, VEX 3.16+ merges
    // `a && b` branches speculatively and lackey then lists instructions
    // that never ran (the "and" side of a branch that was taken).
    let log = d.path().join("lackey.txt");
    let mut c = Command::new("valgrind");
    clean(&mut c)
        .args(["--tool=lackey", "--vex-guest-chase=no", "--trace-mem=yes"])
        .arg(format!("--log-file={}", log.display()))
        .arg(&bin);
    let o = run_with_stdin(c.stdout(Stdio::null()), None);
    assert!(o.status.success());
    let lk: String = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("I ") || l.starts_with(" L") || l.starts_with(" S") || l.starts_with(" M"))
        .map(|l| format!("{l}\n"))
        .collect();
    let ours = String::from_utf8(ours).unwrap();
    assert!(lk.lines().count() > 50_000, "lackey printed too little");
    assert!(ours.lines().any(|l| l.starts_with(" M")), "no modify accesses at all");
    if ours != lk {
        let (i, (a, b)) = ours.lines().zip(lk.lines()).enumerate().find(|(_, (a, b))| a != b).unwrap_or((0, ("", "")));
        panic!("differs from lackey at line {i}: ours {a:?}, lackey {b:?} ({} vs {} lines)", ours.lines().count(), lk.lines().count());
    }
}

#[test]
fn windows_start_and_stop_where_asked() {
    let d = tempfile::tempdir().unwrap();
    let bin = cc("trace/window.c", &d.path().join("window"), &[]);
    let cmd = [bin.to_str().unwrap()];
    let full = d.path().join("full.bkt");
    let all = record(&full, &[], &cmd)["instructions"].as_u64().unwrap();
    assert!(calls_text(&full).contains("phase_outside"));

    // At function entries.
    let t = d.path().join("func.bkt");
    let n = record(&t, &["--start-func", "marker_start", "--stop-func", "marker_stop"], &cmd)["instructions"]
        .as_u64()
        .unwrap();
    let calls = calls_text(&t);
    assert!(calls.contains("work_inside") && calls.contains("inner"), "{calls}");
    assert!(!calls.contains("phase_outside") && !calls.contains("printf"), "{calls}");
    // work_inside: 1000 iterations of a loop calling inner(), a few
    // instructions each; nothing of the 2 x 2000-iteration phases.
    assert!((5_000..40_000).contains(&n), "func window: {n} instructions");

    // At syscalls: from getppid() returning to getuid().
    let t = d.path().join("sys.bkt");
    record(&t, &["--start-syscall", "getppid", "--stop-syscall", "getuid"], &cmd);
    let rep = report(&t);
    assert_eq!(rep["syscalls"], 2, "the start and the stop syscall: {}", rep["syscalls"]);
    let calls = calls_text(&t);
    assert!(calls.contains("work_inside") && !calls.contains("phase_outside"), "{calls}");

    // After N instructions, for N instructions.
    let t = d.path().join("count.bkt");
    let n = record(&t, &["--skip", "20000", "--max", "5000"], &cmd)["instructions"].as_u64().unwrap();
    assert!((5_000..5_000 + 256).contains(&n), "count window: {n}");
    let t = d.path().join("skip.bkt");
    let n = record(&t, &["--skip", "20000"], &cmd)["instructions"].as_u64().unwrap();
    // The window opens at the start of the segment that crosses N.
    assert!(n >= all - 20_000 && n < all - 20_000 + 256, "skip window: {n} of {all}");

    // Only the program's own code.
    let t = d.path().join("obj.bkt");
    record(&t, &["--object", "window"], &cmd);
    let rep = report(&t);
    let names: Vec<&str> = rep["components"].as_array().unwrap().iter().filter(|c| c["kind"] != "kernel").map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["window"], "{names:?}");
}

/// Recording and reading say how far they are, labelled, on a terminal
/// (here at once instead of after a second: BUNKAI_PROGRESS_AFTER_MS=0),
/// and nothing when stderr is not one.
#[test]
fn progress_shows_on_a_terminal_only() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("seq.bkt");
    let png = d.path().join("seq.png");
    let b = bunkai();
    let tty = |cmd: String| -> String {
        let o = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("BUNKAI_PROGRESS_AFTER_MS", "0")
            .env("VALGRIND_LIB", tool_dir())
            .output_within(DEADLINE);
        let shown = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{cmd}: {shown}");
        shown
    };
    // the command's output goes elsewhere, so the run itself shows too
    let shown = tty(format!("{} trace record -o {} -- seq 300000 > /dev/null", b.display(), t.display()));
    assert!(shown.contains("seq under Valgrind") || shown.contains("recording seq: "), "{shown:?}");
    let shown = tty(format!("{} trace report {} > /dev/null", b.display(), t.display()));
    assert!(shown.contains("counting instructions and pages: seq.bkt"), "{shown:?}");
    let shown = tty(format!("{} trace pages {} -o {}", b.display(), t.display(), png.display()));
    assert!(shown.contains("pages: seq.bkt") || shown.contains("cells: seq.bkt"), "{shown:?}");
    for args in [vec!["trace", "report", t.to_str().unwrap()], vec!["trace", "pages", t.to_str().unwrap(), "-o", png.to_str().unwrap()]] {
        let o = Command::new(&b).args(&args).env("BUNKAI_PROGRESS_AFTER_MS", "0").output_within(DEADLINE);
        assert!(o.status.success(), "{o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains(": seq.bkt"), "progress on a pipe: {err:?}");
    }
}

#[test]
fn threads_and_forked_children_are_traced() {
    let d = tempfile::tempdir().unwrap();
    let thr = cc("trace/threads.c", &d.path().join("threads"), &["-pthread"]);
    let t = d.path().join("thr.bkt");
    record(&t, &[], &[thr.to_str().unwrap()]);
    let recs = dump_json(&t);
    let created = recs.iter().filter(|r| r["event"] == "thread_new").count();
    assert!(created >= 3, "3 workers created (and the main thread): {created}");
    let mut tids: Vec<u64> = recs.iter().filter(|r| r["type"] == "exec").map(|r| r["tid"].as_u64().unwrap()).collect();
    tids.sort();
    tids.dedup();
    // Valgrind reuses the slot of a thread that has ended.
    assert!(tids.len() >= 3, "the main thread and workers ran: {tids:?}");
    let calls = calls_text(&t);
    assert!(calls.contains("worker"), "{calls}");

    let fe = cc("trace/forkexec.c", &d.path().join("forkexec"), &[]);
    let t = d.path().join("fe.bkt");
    record(&t, &[], &[fe.to_str().unwrap(), "/bin/true"]);
    let rep = report(&t);
    let streams = rep["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 3, "parent, child before exec, /bin/true: {streams:?}");
    assert_eq!(streams[2]["executable"], "/bin/true");
    assert_eq!(streams[1]["ended"], "exec");
    assert_eq!(streams[0]["pid"], streams[1]["ppid"]);
    let names: Vec<&str> = rep["components"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"forkexec") && names.contains(&"true"), "{names:?}");
}

#[test]
fn fixed_buffer_mode_stops_when_full() {
    let d = tempfile::tempdir().unwrap();
    let bin = cc("trace/window.c", &d.path().join("window"), &[]);
    let t = d.path().join("buf.bkt");
    let s = record(&t, &["--buffer", "64KiB"], &[bin.to_str().unwrap()]);
    assert!(s["dropped_segments"].as_u64().unwrap() > 0, "{s}");
    let rep = report(&t);
    assert!(rep["total_instructions"].as_u64().unwrap() > 10_000);
}

#[test]
fn damaged_traces_are_refused_with_the_offset() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("t.bkt");
    record(&t, &[], &["/bin/true"]);
    let full = std::fs::read(&t).unwrap();

    let cut = d.path().join("cut.bkt");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let (_, err) = bunkai_fails(&["trace", "report", cut.to_str().unwrap()]);
    assert!(err.starts_with("bunkai trace: ") && err.contains("truncated at byte"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let bad = d.path().join("bad.bkt");
    let mut b = full.clone();
    let i = b.len() / 2;
    b[i] ^= 0x55;
    std::fs::write(&bad, &b).unwrap();
    let (_, err) = bunkai_fails(&["trace", "dump", bad.to_str().unwrap()]);
    assert!(err.contains("corrupted at byte") || err.contains("truncated at byte"), "{err}");

    let txt = d.path().join("notes.txt");
    std::fs::write(&txt, "not a trace\n").unwrap();
    let (_, err) = bunkai_fails(&["trace", "calls", txt.to_str().unwrap()]);
    assert!(err.contains("not a bunkai trace"), "{err}");

    let (_, err) = bunkai_fails(&["trace", "record", "-o", d.path().join("x").to_str().unwrap(), "--", "/no/such/program"]);
    assert!(err.contains("no such program"), "{err}");
    assert!(!d.path().join("x").exists());
}

/// The paper's case study in small: Debian's Apache httpd serving the HTML
/// page of Fig. 2, traced from accept() to the close of the connection.
#[test]
fn apache_request_from_accept_to_close() {
    if !Path::new("/usr/sbin/apache2").exists() {
        panic!("apache2 is missing: run scripts/install-deps.sh");
    }
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    std::fs::create_dir_all(root.join("htdocs")).unwrap();
    std::fs::create_dir_all(root.join("run")).unwrap();
    std::fs::write(root.join("htdocs/index.html"), "<HTML><BODY><CENTER>AA</CENTER></BODY></HTML>\n").unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let m = "/usr/lib/apache2/modules";
    let conf = format!(
        "ServerRoot {r}\nServerName localhost\nListen 127.0.0.1:{port}\n\
         LoadModule mpm_prefork_module {m}/mod_mpm_prefork.so\nLoadModule authz_core_module {m}/mod_authz_core.so\n\
         LoadModule mime_module {m}/mod_mime.so\nUser nobody\nGroup nogroup\nPidFile {r}/run/pid\n\
         DefaultRuntimeDir {r}/run\nMutex file:{r}/run default\nErrorLog {r}/run/error.log\n\
         TypesConfig /dev/null\nAddType text/html .html\nDocumentRoot {r}/htdocs\n\
         <Directory />\n Require all granted\n</Directory>\n",
        r = root.display()
    );
    std::fs::write(root.join("httpd.conf"), conf).unwrap();
    // Apache drops to nobody: its files must be readable by it.
    for p in [root.to_path_buf(), root.join("htdocs"), root.join("run"), root.join("htdocs/index.html")] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let trace = root.join("html.bkt");
    let mut rec = Command::new(bunkai())
        .args(["trace", "record", "-o"])
        .arg(&trace)
        .args(["--start-syscall", "accept", "--stop-at-close", "--", "/usr/sbin/apache2", "-X", "-f"])
        .arg(root.join("httpd.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ready when the port is in LISTEN state (read from /proc, so the check
    // is not itself a connection the traced accept() would see).
    let want = format!("0100007F:{port:04X}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
        if tcp.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        }) {
            break;
        }
        if let Some(st) = rec.try_wait().unwrap() {
            panic!("the recorder exited early: {st}");
        }
        assert!(Instant::now() < deadline, "apache did not listen within 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut v = String::new();
        s.read_to_string(&mut v).unwrap();
        v
    };
    assert!(body.starts_with("HTTP/1.1 200") && body.contains("<CENTER>AA</CENTER>"), "{body}");
    // SIGTERM to the recorder: it passes it on to Apache and writes the trace.
    unsafe { kill(rec.id() as i32, 15) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while rec.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the recorder did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rep = report(&trace);
    let comp = |n: &str| rep["components"].as_array().unwrap().iter().find(|c| c["name"] == n).cloned();
    let httpd = comp("apache2").expect("an apache2 component");
    assert_eq!(httpd["kind"], "program");
    assert!(httpd["instructions"].as_u64().unwrap() > 5_000, "{httpd}");
    assert!(comp("libc.so.6").is_some(), "a libc component");
    let syscalls = rep["syscalls"].as_u64().unwrap();
    assert!((5..200).contains(&syscalls), "syscalls in the window: {syscalls}");
    // The window began at accept and ended at the close of that connection.
    let recs = dump_json(&trace);
    let sys: Vec<&Value> = recs.iter().filter(|r| r["event"] == "syscall").collect();
    let first = sys.first().unwrap();
    let last = sys.last().unwrap();
    assert!(first["name"] == "accept4" || first["name"] == "accept", "{first}");
    assert_eq!(last["name"], "close", "{last}");
    assert_eq!(last["args"][0], first["result"], "closed the accepted descriptor");
    let svg = root.join("pages.svg");
    bunkai_ok(&["trace", "pages", trace.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    // The SVG parses; Apache has a band in each panel; the axes and the
    // colour scales are titled.
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("pages.svg is not XML: {e}"));
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(str::trim).collect();
    assert_eq!(texts.iter().filter(|t| t.starts_with("apache2 (")).count(), 2, "{texts:?}");
    for t in ["time: instructions executed (all processes, in trace order)", "pages by address", "references per cell"] {
        assert!(texts.contains(&t), "no {t:?} in {texts:?}");
    }
    let png = root.join("pages.png");
    bunkai_ok(&["trace", "pages", trace.to_str().unwrap(), "-o", png.to_str().unwrap(), "--width", "900", "--height", "600"]);
    let head = std::fs::read(&png).unwrap();
    assert!(head.starts_with(b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR"), "not a PNG");
    let be = |i: usize| u32::from_be_bytes(head[i..i + 4].try_into().unwrap());
    assert_eq!((be(16), be(20)), (900, 600), "the PNG's width and height");
    // What the picture shows, as JSON: two panels, Apache's pages in each,
    // the components adding up to the panel.
    let out = bunkai_ok(&["trace", "pages", trace.to_str().unwrap(), "-o", png.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["output"], png.to_str().unwrap());
    let panels = v["panels"].as_array().unwrap();
    assert_eq!(panels.len(), 2, "{v}");
    for p in panels {
        let comps = p["components"].as_array().unwrap();
        let sum: u64 = comps.iter().map(|c| c["pages"].as_u64().unwrap()).sum();
        assert_eq!(sum, p["pages"].as_u64().unwrap(), "{p}");
        assert!(comps.iter().any(|c| c["name"] == "apache2" && c["pages"].as_u64().unwrap() > 0), "{p}");
    }
    assert_eq!(v["instructions"], rep["total_instructions"], "{v}");
    // Function transitions, exported for Perfetto: Apache's request handler
    // is among the frames.
    let chrome = root.join("calls.json");
    bunkai_ok(&["trace", "calls", trace.to_str().unwrap(), "--chrome", chrome.to_str().unwrap()]);
    let c: Value = serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let names: Vec<&str> = c["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(names.iter().any(|n| n.starts_with("ap_process_") || n.starts_with("ap_run_")), "{:?}", &names[..names.len().min(20)]);
}

/// The children of `pid` (from /proc/*/stat).
fn children(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // "pid (comm) state ppid ...": comm may hold spaces, so from the last ')'
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        if rest.split(' ').nth(1).and_then(|x| x.parse::<u32>().ok()) == Some(pid) {
            v.push(p);
        }
    }
    v
}

/// Waits (at most 120 s) until a descendant of `root` runs `exe` under the
/// tool (its command line names it) and, if `syscalls` is not empty, is
/// inside one of those syscalls; returns its pid.
fn traced_descendant(root: u32, exe: &str, syscalls: &[&str]) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut todo = vec![root];
        while let Some(p) = todo.pop() {
            let kids = children(p);
            todo.extend(&kids);
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            if cmd.split(|&b| b == 0).any(|a| a == exe.as_bytes()) {
                let sys = std::fs::read_to_string(format!("/proc/{p}/syscall")).unwrap_or_default();
                if syscalls.is_empty() || syscalls.contains(&sys.split(' ').next().unwrap_or("")) {
                    return p;
                }
            }
        }
        assert!(Instant::now() < deadline, "{exe} did not start under the tool (or reach {syscalls:?}) within 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `bunkai trace record -o TRACE --json -- CMD` in the clean
/// environment, its output captured.
fn start_record(trace: &Path, cmd: &[&str]) -> std::process::Child {
    let mut c = Command::new(bunkai());
    clean(&mut c)
        .args(["trace", "record", "-o"])
        .arg(trace)
        .arg("--json")
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The JSON summary line of a finished recorder's stderr.
fn summary(out: &std::process::Output) -> Value {
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().filter(|l| l.starts_with('{')).last().unwrap_or_else(|| panic!("no JSON summary: {err}"));
    serde_json::from_str(line).unwrap()
}

/// A SIGKILLed `sleep`, the child of a real shell: its stream is cut but
/// keeps its start-up (it was sent before sleep blocked), the shell goes
/// on, and the summary counts every stream.
#[test]
fn a_sigkilled_child_keeps_what_it_ran() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("k.bkt");
    let rec = start_record(&t, &["sh", "-c", "sleep 100; echo after"]);
    // inside clock_nanosleep (230) or nanosleep (35)
    let sleep = traced_descendant(rec.id(), "/usr/bin/sleep", &["230", "35"]);
    unsafe { kill(sleep as i32, 9) };
    let (out, _) = bunkai_e2e::finish(rec, DEADLINE);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "after\n");
    let sum = summary(&out);
    let rep = report(&t);
    let streams = rep["streams"].as_array().unwrap();
    let sl = streams.iter().find(|s| s["executable"] == "/usr/bin/sleep").expect("a sleep stream");
    assert_eq!(sl["ended"], "cut", "{sl}");
    // The dynamic linker and sleep's start-up, about 300,000 instructions.
    assert!(sl["instructions"].as_u64().unwrap() > 100_000, "{sl}");
    assert_eq!(streams[0]["ended"], "exit");
    assert_eq!(streams[0]["exit_status"], 0);
    let total: u64 = streams.iter().map(|s| s["instructions"].as_u64().unwrap()).sum();
    assert_eq!(sum["instructions"].as_u64().unwrap(), total, "the summary counts every stream: {sum}");
    assert_eq!(sum["cut_streams"], 1, "{sum}");
    let text = String::from_utf8(bunkai_ok(&["trace", "dump", t.to_str().unwrap()]).stdout).unwrap();
    assert!(text.lines().any(|l| l.starts_with("# stream ") && l.contains(" CUT: killed")), "{}", &text[text.len().saturating_sub(600)..]);
}

/// A child killed while it computes (and so, often, while it is sending a
/// message): never an error of the recorder, whatever the moment.
#[test]
fn killing_a_busy_child_never_loses_the_recording() {
    let d = tempfile::tempdir().unwrap();
    for (i, ms) in [300u64, 900, 1700].into_iter().enumerate() {
        let t = d.path().join(format!("busy{i}.bkt"));
        let rec = start_record(&t, &["sh", "-c", "md5sum /dev/zero; echo after"]);
        let md5 = traced_descendant(rec.id(), "/usr/bin/md5sum", &[]);
        std::thread::sleep(Duration::from_millis(ms));
        unsafe { kill(md5 as i32, 9) };
        let (out, _) = bunkai_e2e::finish(rec, DEADLINE);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kill after {ms} ms: {err}");
        let rep = report(&t);
        let s = rep["streams"].as_array().unwrap().iter().find(|s| s["executable"] == "/usr/bin/md5sum").cloned().unwrap();
        assert_eq!(s["ended"], "cut", "{s}");
        assert!(s["instructions"].as_u64().unwrap() > 0, "{s}");
    }
}

/// Exit statuses and fatal signals: a shell's exit 3, a shell that sends
/// itself SIGABRT, and (a tiny C extra) a program that faults: the segment
/// the fault struck is in the trace, up to the faulting instruction.
#[test]
fn exit_status_and_fatal_signals_are_recorded() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("e.bkt");
    let mut c = Command::new(bunkai());
    clean(&mut c).args(["trace", "record", "-o"]).arg(&t).args(["--", "sh", "-c", "exit 3"]);
    let o = run_with_stdin(&mut c, None);
    assert_eq!(o.status.code(), Some(3));
    let s = &report(&t)["streams"][0];
    assert_eq!((s["ended"].as_str(), s["exit_status"].as_u64()), (Some("exit"), Some(3)), "{s}");

    let t = d.path().join("abrt.bkt");
    let mut c = Command::new(bunkai());
    clean(&mut c).args(["trace", "record", "-o"]).arg(&t).args(["--", "sh", "-c", "kill -ABRT $$"]);
    let o = run_with_stdin(&mut c, None);
    assert_eq!(o.status.code(), Some(128 + 6));
    let s = &report(&t)["streams"][0];
    assert_eq!((s["ended"].as_str(), s["signal"].as_str()), (Some("signal"), Some("SIGABRT")), "{s}");
    let recs = dump_json(&t);
    assert!(recs.iter().any(|r| r["event"] == "fatal" && r["signal"] == "SIGABRT"), "no fatal event");

    let bin = cc("trace/crash.c", &d.path().join("crash"), &[]);
    let t = d.path().join("segv.bkt");
    let mut c = Command::new(bunkai());
    clean(&mut c).args(["trace", "record", "-o"]).arg(&t).arg("--").arg(&bin);
    let o = run_with_stdin(&mut c, None);
    assert_eq!(o.status.code(), Some(128 + 11));
    let rep = report(&t);
    let s = &rep["streams"][0];
    assert_eq!((s["ended"].as_str(), s["signal"].as_str()), (Some("signal"), Some("SIGSEGV")), "{s}");
    let recs = dump_json(&t);
    let fatal = recs.iter().find(|r| r["event"] == "fatal").expect("a fatal event");
    let addr = fatal["addr"].as_u64().unwrap();
    // The last execution is the cut segment, in crash(), ending at the
    // instruction the signal struck.
    let last = recs.iter().filter(|r| r["type"] == "exec").last().unwrap();
    assert_eq!(last["end"], "fatal", "{last}");
    let insns = last["insns"].as_array().unwrap();
    assert_eq!(insns.last().unwrap()["addr"].as_u64().unwrap(), addr, "{last}");
    assert!(calls_text(&t).contains("crash"), "crash() is in the calls");
    // Everything executed is counted: the tool's count and the trace's agree.
    assert!(rep["warnings"].as_array().unwrap().iter().all(|w| !w.as_str().unwrap().contains("the tool counted")), "{rep}");
}

/// Window traps: a syscall start alone catches the dynamic linker's
/// openat; after a function (conditions in sequence) it is the program's;
/// an unknown function is refused before anything runs.
#[test]
fn window_conditions_hold_in_sequence_and_unknown_functions_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let cmd = ["cat", "/etc/hostname"];
    let first_openat = |t: &Path| -> (Value, Value) {
        let recs = dump_json(t);
        let sys: Vec<Value> = recs.into_iter().filter(|r| r["event"] == "syscall").collect();
        assert_eq!(sys.first().unwrap()["name"], "openat", "{:?}", sys.first());
        (sys.first().unwrap().clone(), sys.last().unwrap().clone())
    };
    // Alone, the first openat is ld.so's open of ld.so.cache (O_CLOEXEC set).
    let t = d.path().join("alone.bkt");
    record(&t, &["--start-syscall", "openat", "--stop-at-close"], &cmd);
    let (first, _) = first_openat(&t);
    assert_eq!(first["args"][2].as_u64().unwrap() & 0o2000000, 0o2000000, "{first}");
    let names: Vec<String> =
        report(&t)["components"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["ld-linux-x86-64.so.2", "kernel"], "only the dynamic linker ran in that window");
    // setlocale is the first call of cat's main; the first openat after it
    // is cat's own open of its file (O_RDONLY, no O_CLOEXEC).
    let t = d.path().join("seq.bkt");
    record(&t, &["--start-syscall", "openat", "--stop-at-close", "--start-func", "setlocale"], &cmd);
    let (first, last) = first_openat(&t);
    assert_eq!(first["args"][2].as_u64(), Some(0), "{first}");
    assert_eq!(last["name"], "close");
    assert_eq!(last["args"][0], first["result"]);
    let recs = dump_json(&t);
    let sys: Vec<&Value> = recs.iter().filter(|r| r["event"] == "syscall").collect();
    assert!(sys.iter().any(|r| r["name"] == "read"), "cat read its file inside the window");

    // Misspelt, and stripped: one line each, no file.
    let out = d.path().join("x.bkt");
    for (f, want) in [("mian", "no function 'mian'"), ("main", "is stripped")] {
        let (_, err) = bunkai_fails(&["trace", "record", "-o", out.to_str().unwrap(), "--start-func", f, "--", "/bin/true"]);
        assert!(err.starts_with("bunkai trace: --start-func: ") && err.contains(want), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(!out.exists());
    }
    let (_, err) = bunkai_fails(&["trace", "record", "-o", out.to_str().unwrap(), "--stop-func", "malloc@/no/such.so", "--", "/bin/true"]);
    assert!(err.contains("no such file /no/such.so"), "{err}");
}

/// --buffer: when it fills, a buffer-full event closes the window and the
/// summary says how much did not fit; recorded plus dropped is what a
/// streamed run of the same command executes.
#[test]
fn a_full_buffer_says_what_it_dropped() {
    let d = tempfile::tempdir().unwrap();
    let cmd = ["seq", "100000"];
    let all = record(&d.path().join("all.bkt"), &[], &cmd)["instructions"].as_u64().unwrap();
    let t = d.path().join("buf.bkt");
    let s = record(&t, &["--buffer", "1M"], &cmd);
    let (kept, dropped) = (s["instructions"].as_u64().unwrap(), s["dropped_instructions"].as_u64().unwrap());
    assert!(dropped > all / 2 && s["dropped_segments"].as_u64().unwrap() > 100_000, "{s}");
    let diff = (kept + dropped).abs_diff(all);
    assert!(diff * 1000 < all, "kept {kept} + dropped {dropped} vs a streamed run's {all}");
    let recs = dump_json(&t);
    let full = recs.iter().find(|r| r["event"] == "window" && r["reason"] == 5).expect("a buffer-full window event");
    assert_eq!(full["open"], false);
    assert_eq!(report(&t)["total_instructions"].as_u64().unwrap(), kept);
}

/// The recorder's temporary files: a second SIGTERM removes them (and ends
/// the command); those of a SIGKILLed recorder go at the next start.
#[test]
fn a_killed_recorder_leaves_nothing_behind() {
    let d = tempfile::tempdir().unwrap();
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let leftovers = |pid: u32| -> Vec<String> {
        let dot = format!(".bunkai-trace-{pid}-");
        let dir = format!("bunkai-trace-{pid}-");
        std::fs::read_dir(d.path())
            .unwrap()
            .chain(std::fs::read_dir(&tmp).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&dot) || n.starts_with(&dir))
            .collect()
    };
    let start = |name: &str, cmd: &[&str]| {
        let mut c = Command::new(bunkai());
        clean(&mut c)
            .env("TMPDIR", &tmp)
            .args(["trace", "record", "-o"])
            .arg(d.path().join(name))
            .arg("--")
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // A command that ignores SIGTERM: the first one does not end it.
    let rec = start("term.bkt", &["sh", "-c", "trap '' TERM; sleep 100"]);
    let rpid = rec.id();
    let sleep = traced_descendant(rpid, "/usr/bin/sleep", &["230", "35"]);
    assert_eq!(leftovers(rpid).len(), 2, "a socket directory and the unfinished trace while it runs");
    unsafe { kill(rpid as i32, 15) };
    std::thread::sleep(Duration::from_millis(500));
    unsafe { kill(rpid as i32, 15) };
    // The traced sleep holds the recorder's stderr open: it is ended once
    // the recorder has exited, before that stderr is read to its end.
    let mut rec = rec;
    let deadline = Instant::now() + Duration::from_secs(60);
    while rec.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the recorder did not exit within 60 s of the second SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { kill(sleep as i32, 9) };
    let (out, _) = bunkai_e2e::finish(rec, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("bunkai trace: interrupted twice; the trace was not written"), "{err}");
    assert!(leftovers(rpid).is_empty(), "{:?}", leftovers(rpid));
    assert!(!d.path().join("term.bkt").exists());

    // SIGKILL: nothing can be removed then, the next recorder does it.
    let mut rec = start("kill.bkt", &["sleep", "100"]);
    let rpid = rec.id();
    let sleep = traced_descendant(rpid, "/usr/bin/sleep", &["230", "35"]);
    rec.kill().unwrap();
    rec.wait().unwrap();
    unsafe { kill(sleep as i32, 9) };
    assert_eq!(leftovers(rpid).len(), 2);
    let (out, _) = bunkai_e2e::finish(start("true.bkt", &["/bin/true"]), DEADLINE);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("removed 2 temporary file(s) left by recorders that were killed"), "{err}");
    assert!(leftovers(rpid).is_empty(), "{:?}", leftovers(rpid));
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
