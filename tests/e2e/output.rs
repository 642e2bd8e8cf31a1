//! Every command that prints, with its output going nowhere: a pipe whose
//! reader has gone (as `| head -c1` leaves it) ends the command quietly
//! with status 0; a full disk (/dev/full) is one line and a non-zero
//! status. Never a panic, a backtrace or a bare "Broken pipe".

use bunkai_e2e::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs bunkai with `args`, its stdout a pipe nobody reads (the read end
/// closed before it starts, so every write fails with EPIPE).
fn into_closed_pipe(dir: &Path, args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let child = Command::new(bunkai())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bunkai");
    wait_stderr(child, args)
}

/// Runs bunkai with `args`, its stdout /dev/full (every write: ENOSPC).
fn into_full_disk(dir: &Path, args: &[&str]) -> std::process::Output {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let child = Command::new(bunkai())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(full))
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bunkai");
    wait_stderr(child, args)
}

/// Waits for a child whose stdout is not ours, under DEADLINE.
fn wait_stderr(mut child: std::process::Child, args: &[&str]) -> std::process::Output {
    use std::io::Read;
    let mut err = child.stderr.take().unwrap();
    let t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`bunkai {}`: no end within {DEADLINE:?} (killed)", args.join(" "));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    std::process::Output { status, stdout: Vec::new(), stderr: t.join().unwrap() }
}

#[test]
fn no_command_panics_on_a_closed_pipe_or_a_full_disk() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let ds = |p: &str| dir.join(p).to_str().unwrap().to_string();
    // what the commands read: a trace, a scatter output with a profile, a module
    bunkai_ok(&["trace", "record", "-o", &ds("t.bkt"), "--", "/bin/true"]);
    let (f, o) = (program("features/features.c"), program("features/other.c"));
    bunkai_ok(&["scatter", "-o", &ds("sc"), f.to_str().unwrap(), o.to_str().unwrap(), "--", "-O1", "-lm", "-lpthread"]);
    let prof = Command::new(bunkai())
        .args(["scatter", "profile", &ds("sc"), "--"])
        .current_dir(dir)
        .output_within(DEADLINE);
    assert!(prof.status.success(), "bunkai scatter profile: {}", String::from_utf8_lossy(&prof.stderr));
    let module = root().join("build/lib/bunkai/examples/sched/rr.o");
    assert!(module.exists(), "{} is missing (run make)", module.display());
    let m = module.to_str().unwrap();
    let sc = ds("sc");
    let cmds: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec!["trace", "--help"],
        vec!["trace", "calls", "t.bkt"],
        vec!["trace", "calls", "t.bkt", "--json"],
        vec!["trace", "dump", "t.bkt"],
        vec!["trace", "report", "t.bkt"],
        vec!["trace", "report", "t.bkt", "--json"],
        vec!["scatter", "stats", &sc],
        vec!["scatter", "stats", &sc, "--json"],
        vec!["scatter", "group", &sc, "--json"],
        vec!["scatter", "group", &sc],
        vec!["scatter", "-o", "sc2", f.to_str().unwrap(), o.to_str().unwrap(), "--json", "--", "-O1", "-lm", "-lpthread"],
        vec!["mod", "info", m],
        vec!["mod", "info", m, "--json"],
        vec!["flow", "report", "--help"],
    ];
    for args in &cmds {
        let what = args.join(" ");
        let normal = Command::new(bunkai()).args(args).current_dir(dir).output_within(DEADLINE);
        assert!(normal.status.success(), "`bunkai {what}`: {}", String::from_utf8_lossy(&normal.stderr));
        let said = String::from_utf8_lossy(&normal.stderr);
        let o = into_closed_pipe(dir, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "`bunkai {what}` into a closed pipe: {err}");
        assert_eq!(err, said, "`bunkai {what}` into a closed pipe: stderr not as in a normal run");
        let o = into_full_disk(dir, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{err}");
        if normal.stdout.is_empty() {
            // nothing goes to stdout (group prints its summary on stderr)
            assert_eq!(o.status.code(), Some(0), "`bunkai {what}` into /dev/full: {err}");
            continue;
        }
        assert_eq!(o.status.code(), Some(1), "`bunkai {what}` into /dev/full: {err}");
        let last = err.lines().last().unwrap_or("");
        assert!(
            last.starts_with("bunkai") && last.contains("cannot write the output: No space left on device"),
            "`bunkai {what}` into /dev/full: {err}"
        );
        assert_eq!(err.lines().count(), said.lines().count() + 1, "`bunkai {what}` into /dev/full: {err}");
    }
}

/// An output that cannot be written is refused before the work: `trace
/// record -o DIR` used to trace the whole program and then fail, `mod
/// calibrate --model DIR` to calibrate and then leave DIR.json.tmp.
#[test]
fn outputs_are_checked_before_the_work() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    let ds = dir.to_str().unwrap();
    let (_, err) = bunkai_fails(&["trace", "record", "-o", ds, "--", "/bin/true"]);
    assert!(err.starts_with("bunkai trace: ") && err.lines().count() == 1 && err.contains("is a directory"), "{err}");
    let (_, err) = bunkai_fails(&["mod", "calibrate", "--quick", "--model", ds]);
    assert!(err.starts_with("bunkai mod: ") && err.lines().count() == 1 && err.contains("is a directory"), "{err}");
    let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["out"], "nothing else written beside the directory");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written into it");
}

/// Usage errors behave as in perf or git: `bunkai` or `bunkai trace` with
/// no verb shows the help on stderr and exits 2 (not 0: a script that
/// forgot the verb did not succeed); a nested command's error names its own
/// help; a bad value lists the allowed ones; stdout stays empty.
#[test]
fn usage_errors_exit_2_and_point_to_the_right_help() {
    for args in [&[][..], &["trace"], &["share"], &["flow"], &["mod"]] {
        let out = bunkai_run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "bunkai {args:?}: {err}");
        assert!(out.stdout.is_empty(), "bunkai {args:?} wrote to stdout");
        assert!(err.contains("Usage: bunkai"), "bunkai {args:?}: no usage on stderr: {err}");
    }
    let (code, err) = bunkai_fails(&["trace", "record"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.lines().count() == 1 && err.starts_with("bunkai trace: "), "{err}");
    assert!(err.contains("--output") && err.contains("(see 'bunkai trace record --help')"), "{err}");
    let (code, err) = bunkai_fails(&["share", "run", "--place", "mars", "--", "/bin/true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("'mars'") && err.contains("rr, remote, home") && err.contains("'bunkai share run --help'"), "{err}");
    let (code, err) = bunkai_fails(&["scatter"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("bunkai scatter: ") && err.contains("<INPUT>") && err.contains("'bunkai help scatter'"), "{err}");
    // --help and --version are what was asked for: stdout, status 0
    for args in [&["--help"][..], &["trace", "--help"], &["--version"]] {
        let out = bunkai_ok(args);
        assert!(!out.stdout.is_empty(), "bunkai {args:?} printed nothing");
    }
}

/// scatter's verbs are nested (`bunkai scatter stats`); the old top-level
/// spellings work for one more release, after exactly one line on stderr
/// saying the new one. `bunkai scatter` with no verb is `build`.
#[test]
fn scatter_verbs_nest_and_the_old_spellings_still_work() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("hello.c");
    let c = "#include <stdio.h>\nstatic int twice(int x) { return 2 * x; }\n\
             int main(void) { printf(\"%d\\n\", twice(21)); return 0; }\n";
    std::fs::write(&src, c).unwrap();
    let (out, out2) = (d.path().join("out"), d.path().join("out2"));
    let (o, o2) = (out.to_str().unwrap(), out2.to_str().unwrap());
    bunkai_ok(&["scatter", "build", "-o", o, src.to_str().unwrap(), "--", "-O1"]);
    bunkai_ok(&["scatter", "-o", o2, src.to_str().unwrap(), "--", "-O1"]);
    assert!(out.join("bin/hello").exists() && out2.join("bin/hello").exists());
    let new = bunkai_ok(&["scatter", "stats", o]);
    assert!(String::from_utf8_lossy(&new.stdout).contains("of the original"));
    assert!(new.stderr.is_empty(), "{}", String::from_utf8_lossy(&new.stderr));
    let old = bunkai_ok(&["stats", o]);
    assert_eq!(old.stdout, new.stdout, "bunkai stats and bunkai scatter stats differ");
    assert_eq!(
        String::from_utf8_lossy(&old.stderr),
        "bunkai: `bunkai stats` is now `bunkai scatter stats` (the old spelling goes in the next release)\n"
    );
    // an old spelling's error is as before, after the same one line
    let (code, err) = bunkai_fails(&["run", "ftp://example/x"]);
    assert_eq!(code, 1, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert_eq!(lines[0], "bunkai: `bunkai run` is now `bunkai scatter run` (the old spelling goes in the next release)");
    assert!(lines[1].starts_with("bunkai run: ") && lines[1].contains("http://"), "{err}");
    // the nested verbs' errors are `bunkai scatter: ...`, usage errors point to the verb's help
    let (_, err) = bunkai_fails(&["scatter", "run", "ftp://example/x"]);
    assert!(err.starts_with("bunkai scatter: ") && err.lines().count() == 1, "{err}");
    let (code, err) = bunkai_fails(&["scatter", "run"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("bunkai scatter: ") && err.contains("(see 'bunkai scatter run --help')"), "{err}");
    // the help shows the verbs; the old spellings are hidden
    let h = String::from_utf8_lossy(&bunkai_ok(&["scatter", "--help"]).stdout).to_string();
    for verb in ["build", "stats", "profile", "group", "serve", "run"] {
        assert!(h.lines().any(|l| l.trim_start().starts_with(verb)), "{verb} missing from: {h}");
    }
    let h = String::from_utf8_lossy(&bunkai_ok(&["--help"]).stdout).to_string();
    assert!(!h.lines().any(|l| l.trim_start().starts_with("stats")), "{h}");
}

/// Ctrl-C ends a command with one line and exit status 130 (what a shell
/// reports for a command the signal ended): a node daemon waiting for
/// work, and a mod command waiting for a host that never answers. A
/// command that hands the signal to a program (share run, trace record) is
/// tested with that program in its own suite.
#[test]
fn ctrl_c_exits_130_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    let out = Command::new(bunkai()).args(["share", "key", "--key"]).arg(&key).output_within(DEADLINE);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // a unix socket that accepts and never answers: mod list waits on it
    let sock = dir.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "share node",
            vec!["share".into(), "node".into(), "--listen".into(), "127.0.0.1:0".into(), "--key".into(), key.display().to_string()],
            "listening on ",
        ),
        ("mod list", vec!["mod".into(), "list".into(), "--socket".into(), sock.display().to_string()], ""),
    ];
    for (what, args, ready) in cases {
        let mut child = Command::new(bunkai())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if ready.is_empty() {
            // nothing to wait for on stdout: wait until it has connected
            let (_conn, _) = listener.accept().unwrap();
            interrupt(&child);
            let out = finish_named(child, DEADLINE, what);
            check_interrupted(what, &out);
        } else {
            let lines = stdout_lines(&mut child);
            let first = lines.recv_timeout(DEADLINE).unwrap_or_else(|_| panic!("{what}: no '{ready}' line"));
            assert!(first.starts_with(ready), "{what}: {first}");
            interrupt(&child);
            let out = finish_named(child, DEADLINE, what);
            check_interrupted(what, &out);
        }
    }
}

/// Ctrl-C (SIGINT to the foreground group) while scatter compiles SQLite: its temporary
/// directory goes, no output directory is left half-written, and the one
/// line says so (the handler that removes directories replaces the plain
/// one when scatter registers its temporary directory).
#[test]
fn ctrl_c_during_scatter_removes_the_unfinished_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sq = sqlite_dir();
    let mut args: Vec<String> = vec!["scatter".into(), "-o".into(), out.display().to_string(), "--name".into(), "sqlite3".into()];
    args.push(sq.join("shell.c").display().to_string());
    args.push(sq.join("sqlite3.c").display().to_string());
    args.push("--".into());
    args.extend(sqlite_flags());
    args.push(format!("-I{}", sq.display()));
    // a group of its own: Ctrl-C at a terminal signals the whole
    // foreground group (scatter and the compilers it runs)
    use std::os::unix::process::CommandExt;
    let child = Command::new(bunkai()).args(&args).process_group(0).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    kill_after(&child, DEADLINE, "bunkai scatter (sqlite3)");
    // its temporary directory beside the output, with files in it
    let tmp = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".out.bunkai-tmp-")).collect()
    };
    let t0 = std::time::Instant::now();
    while !tmp().iter().any(|t| std::fs::read_dir(t).map(|mut d| d.next().is_some()).unwrap_or(false)) {
        assert!(t0.elapsed() < std::time::Duration::from_secs(300), "scatter made no temporary directory within 300 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let st = Command::new("kill").args(["-INT", "--", &format!("-{}", child.id())]).status().unwrap();
    assert!(st.success());
    let o = finish_named(child, DEADLINE, "bunkai scatter (sqlite3)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert_eq!(err.lines().last(), Some("bunkai scatter: interrupted; removed the unfinished output"), "{err}");
    assert!(tmp().is_empty(), "the temporary directory is left: {:?}", tmp());
    assert!(!out.exists(), "a half-written output directory is left");
}

/// What Ctrl-C sends.
fn interrupt(child: &std::process::Child) {
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
}

fn check_interrupted(what: &str, out: &std::process::Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{what}: {:?} {err}", out.status);
    let last = err.lines().last().unwrap_or("");
    let sub = what.split(' ').next().unwrap();
    assert_eq!(last, format!("bunkai {sub}: interrupted"), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// `bunkai flow cc --help` is ours (what it adds, its pass options,
/// examples), not clang's 1,175 lines; `--version` is clang's, as build
/// systems probing `$CC --version` expect.
#[test]
fn flow_cc_help_is_ours_and_version_is_clangs() {
    let out = Command::new(bunkai()).args(["flow", "cc", "--help"]).output_within(DEADLINE);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("Compile and link with clang-14"), "{text}");
    assert!(text.contains("-bunkai-flow-structs") && text.contains("Usage: bunkai flow cc"), "{text}");
    assert!(!text.contains("OVERVIEW: clang") && text.lines().count() < 60, "{text}");
    let out = Command::new(bunkai()).args(["flow", "cc", "--version"]).output_within(DEADLINE);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("clang version 14"), "{text}");
}

/// Under --json an error is also one JSON object, `{"error": LINE}`, where
/// the command's JSON would have gone (stdout; stderr for trace record and
/// share run, whose stdout is the program's), with the same line as
/// stderr's: a failure at work and a usage error alike.
#[test]
fn errors_under_json_are_one_object() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.bkt");
    let m = missing.to_str().unwrap();
    for (args, code, on_stderr) in [
        (vec!["mod", "list", "--json", "--socket", m], 1, false),
        (vec!["trace", "report", "--json", m], 1, false),
        (vec!["mod", "list", "--json", "--bogus"], 2, false),
        (vec!["share", "run", "--json", "--nodes", "127.0.0.1:1", "--", "/nonexistent/program"], 1, true),
    ] {
        let out = Command::new(bunkai()).args(&args).output_within(DEADLINE);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = err.lines().find(|l| l.starts_with("bunkai ")).unwrap_or_else(|| panic!("{args:?}: {err}"));
        let json_text = if on_stderr {
            err.lines().find(|l| l.starts_with('{')).unwrap_or_default().to_string()
        } else {
            stdout.trim().to_string()
        };
        let v: serde_json::Value =
            serde_json::from_str(&json_text).unwrap_or_else(|e| panic!("{args:?}: not one JSON object ({e}): {json_text:?}"));
        assert_eq!(v["error"].as_str(), Some(line), "{args:?}");
        if on_stderr {
            assert!(stdout.is_empty(), "{args:?}: stdout {stdout:?}");
        }
    }
}
