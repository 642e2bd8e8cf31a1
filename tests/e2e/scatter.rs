//! End-to-end tests of `bunkai scatter` and `bunkai scatter stats`: the real
//! CLI on real programs, compared with the same program built normally.

use bunkai_e2e::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn features_srcs() -> Vec<PathBuf> {
    vec![program("features/features.c"), program("features/other.c")]
}

/// Runs the original and the scattered program with the same arguments and
/// checks stdout, stderr, exit status and the file it writes.
fn same_behaviour(orig: &Path, scattered: &Path, dir: &Path) {
    let f1 = dir.join("orig.txt");
    let f2 = dir.join("scat.txt");
    let a = behaviour(run_with_stdin(Command::new(orig).arg(&f1), None));
    let b = behaviour(run_with_stdin(Command::new(scattered).arg(&f2), None));
    assert_eq!(a, b, "scattered program behaves differently");
    assert_eq!(std::fs::read(&f1).unwrap(), std::fs::read(&f2).unwrap());
    assert!(a.stdout.contains("threads: total"), "the program ran to the end");
}

#[test]
fn features_program_behaves_like_the_original_at_each_opt_level() {
    for opt in ["-O0", "-O2"] {
        let d = tempfile::tempdir().unwrap();
        let orig = d.path().join("orig");
        clang_build(&features_srcs(), &[opt, "-lm", "-lpthread"], &orig);
        let out = d.path().join("out");
        scatter(&out, &features_srcs(), &[], &[opt, "-lm", "-lpthread"]);
        same_behaviour(&orig, &out.join("bin/features"), d.path());
        // Every function went to a library; none stayed behind.
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap())
                .unwrap();
        let n = m["functions"].as_array().unwrap().len();
        assert!(n >= 15, "{opt}: only {n} functions extracted");
        for f in m["functions"].as_array().unwrap() {
            assert!(out.join(f["library"].as_str().unwrap()).exists());
        }
    }
}

#[test]
fn features_program_scattered_as_a_shared_library() {
    // features.c as a library: other.c + a main that calls into it.
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    scatter(
        &out,
        &[program("features/features.c")],
        &["--lib", "--name", "feat"],
        &["-O1", "-Dmain=features_main", "-lm", "-lpthread"],
    );
    let lib = out.join("lib/libfeat.so");
    assert!(lib.exists());
    let host = d.path().join("host.c");
    std::fs::write(
        &host,
        "int features_main(int, char **);\nint main(int c, char **v) { return features_main(c, v); }\n",
    )
    .unwrap();
    let scattered = d.path().join("host-scattered");
    let libdir = out.join("lib");
    let srcs = vec![host.clone(), program("features/other.c")];
    clang_build(
        &srcs,
        &[
            "-O1",
            &format!("-L{}", libdir.display()),
            "-lfeat",
            &format!("-Wl,-rpath,{}", libdir.display()),
            "-lm",
            "-lpthread",
        ],
        &scattered,
    );
    let orig = d.path().join("orig");
    let orig_srcs = vec![program("features/features.c"), program("features/other.c")];
    clang_build(&orig_srcs, &["-O1", "-lm", "-lpthread"], &orig);
    same_behaviour(&orig, &scattered, d.path());
}

#[test]
fn verbose_log_is_deterministic_and_explains_decisions() {
    let d = tempfile::tempdir().unwrap();
    let logs: Vec<String> = (0..2)
        .map(|i| {
            let out = d.path().join(format!("out{i}"));
            let o = scatter(&out, &features_srcs(), &["-v"], &["-O0", "-lm", "-lpthread"]);
            let s = String::from_utf8_lossy(&o.stderr).into_owned();
            s.lines().filter(|l| l.starts_with("scatter: ")).collect::<Vec<_>>().join("\n")
        })
        .collect();
    assert_eq!(logs[0], logs[1], "the -v log differs between two runs");
    let log = &logs[0];
    assert!(log.contains("scatter: extracted "), "{log}");
    assert!(log.contains("stayed in the launcher"), "{log}");
    // names[] is used by name_of only: it moves with it.
    assert!(log.contains("global names -> library of name_of: its only user"), "{log}");
    // shared_state is used by two functions: merged into the launcher.
    assert!(log.contains("global shared_state -> launcher __bunkai_"), "{log}");
    // thread-locals cannot be merged into a struct: exported as themselves.
    assert!(log.contains("global tls_counter -> launcher, exported as __bunkai_g"), "{log}");
    assert!(log.contains("rename cube -> __bunkai_s"), "{log}");
}

/// A whole program given as one bitcode file (LTO pre-link IR, the way
/// scripts/fetch-vim.sh makes Vim's): clang optimises it once, the scatter
/// splits that module, and the original is code-generated from it: byte for
/// byte what `clang-14 -c -O2 whole.bc` and its link make.
#[test]
fn whole_program_bitcode_is_optimised_once_and_the_original_is_clangs() {
    let d = tempfile::tempdir().unwrap();
    let mut objs = Vec::new();
    for (i, src) in features_srcs().iter().enumerate() {
        let o = d.path().join(format!("tu{i}.bc"));
        let st = Command::new("clang-14")
            .args(["-O2", "-flto=full", "-c"])
            .arg(src)
            .arg("-o")
            .arg(&o)
            .status_within(DEADLINE);
        assert!(st.success(), "clang-14 -flto=full -c {}", src.display());
        objs.push(o);
    }
    let whole = d.path().join("features.bc");
    let st = Command::new("llvm-link-14").args(&objs).arg("-o").arg(&whole).status_within(DEADLINE);
    assert!(st.success(), "llvm-link-14");
    // What clang makes of it, as scatter's original is built: compile, link
    // with lld and the same flags, strip.
    let obj = d.path().join("plain.o");
    let st = Command::new("clang-14").args(["-c", "-O2"]).arg(&whole).arg("-o").arg(&obj).status_within(DEADLINE);
    assert!(st.success());
    let plain = d.path().join("plain");
    let st = Command::new("clang-14")
        .args(["-fuse-ld=lld", "-O2", "-lm", "-lpthread", "-o"])
        .arg(&plain)
        .arg(&obj)
        .status_within(DEADLINE);
    assert!(st.success());
    let stripped = d.path().join("plain.stripped");
    let st = Command::new("llvm-strip-14").arg("-o").arg(&stripped).arg(&plain).status_within(DEADLINE);
    assert!(st.success());

    let out = d.path().join("out");
    let o = scatter(&out, &[whole], &["--json"], &["-O2", "-lm", "-lpthread"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = j["phases"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"optimise") && names.contains(&"original"), "phases: {names:?}");
    assert!(!names.iter().any(|n| n.contains("beside link bitcode")), "the input was optimised twice: {names:?}");
    assert!(
        std::fs::read(out.join("original/features")).unwrap() == std::fs::read(&stripped).unwrap(),
        "original/features is not what clang-14 -c -O2 features.bc makes"
    );
    same_behaviour(&plain, &out.join("bin/features"), d.path());
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let n = m["functions"].as_array().unwrap().len();
    assert!(n >= 10, "only {n} functions extracted");
}

/// Issue 23: `-v` ends with how long each phase took (`time:` lines, apart
/// from the decision log), `--json` gives them as `phases`; on a terminal
/// the phases show their progress (here after 0 ms instead of a second,
/// BUNKAI_PROGRESS_AFTER_MS), and nothing is drawn when stderr is not one.
#[test]
fn phases_are_timed_and_shown_on_a_terminal_only() {
    let d = tempfile::tempdir().unwrap();
    let srcs: Vec<String> = features_srcs().iter().map(|p| p.display().to_string()).collect();
    let out = d.path().join("out");
    let o = scatter(&out, &features_srcs(), &["-v"], &["-O0", "-lm", "-lpthread"]);
    let err = String::from_utf8_lossy(&o.stderr);
    let times: Vec<&str> = err.lines().filter(|l| l.starts_with("time: ")).collect();
    for phase in ["compile to bitcode", "split", "original (beside", "libraries", "check"] {
        assert!(times.iter().any(|l| l.contains(&format!(" s {phase}"))), "no time for {phase}: {err}");
    }
    assert!(!err.contains("lowering") && !err.contains('\r'), "progress on a pipe: {err:?}");
    let j: serde_json::Value =
        serde_json::from_slice(&scatter(&out, &features_srcs(), &["--json"], &["-O0", "-lm", "-lpthread"]).stdout).unwrap();
    let phases = j["phases"].as_array().unwrap();
    assert!(phases.iter().any(|p| p["name"] == "libraries" && p["seconds"].as_f64().unwrap() > 0.0), "{j}");
    let cmd = format!("{} scatter -o {} {} -- -O0 -lm -lpthread", bunkai().display(), out.display(), srcs.join(" "));
    let tty = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("BUNKAI_PROGRESS_AFTER_MS", "0")
        .output_within(DEADLINE);
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{shown}");
    assert!(shown.contains("compiling to bitcode") && shown.contains("lowering"), "no progress on a terminal: {shown:?}");
}

#[test]
fn stats_reports_sizes_from_the_files() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    scatter(&out, &features_srcs(), &[], &["-O2", "-lm", "-lpthread"]);
    let o = bunkai_ok(&["scatter", "stats", out.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let launcher = std::fs::metadata(out.join("bin/features")).unwrap().len();
    assert_eq!(v["launcher_bytes"].as_u64().unwrap(), launcher);
    let libs = m["functions"].as_array().unwrap();
    assert_eq!(v["libraries"].as_u64().unwrap() as usize, libs.len());
    let total: u64 = libs
        .iter()
        .map(|f| std::fs::metadata(out.join(f["library"].as_str().unwrap())).unwrap().len())
        .sum();
    assert_eq!(v["library_bytes"].as_u64().unwrap(), total);
    let orig = std::fs::metadata(out.join("original/features")).unwrap().len();
    assert_eq!(v["original_bytes"].as_u64().unwrap(), orig);
    let text = bunkai_ok(&["scatter", "stats", out.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("of the original"));
    // profile --json: the program keeps stdout (the original's output),
    // the summary is one object on stderr and agrees with the profile.
    let native = std::process::Command::new(out.join("original/features")).output().unwrap();
    let p = bunkai_ok(&["scatter", "profile", out.to_str().unwrap(), "--json"]);
    assert_eq!(p.stdout, native.stdout, "the program's output under profile");
    let err = String::from_utf8_lossy(&p.stderr);
    let v: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v["runs"], 1, "{v}");
    assert_eq!(v["exit_code"], native.status.code().unwrap(), "{v}");
    let prof = std::fs::read_to_string(out.join("profile")).unwrap();
    let listed = prof.lines().filter(|l| l.split('\t').count() == 3).count();
    assert_eq!(v["functions"].as_u64().unwrap() as usize, listed, "{v}\n{prof}");
    assert!(listed > 1, "{prof}");
}

#[test]
fn demo1_and_demo2_behave_like_the_originals() {
    let d = tempfile::tempdir().unwrap();
    // demo1 at the paper's size (65,535 functions), unoptimised like the paper.
    let demo1 = d.path().join("demo1.c");
    let st = Command::new("python3")
        .arg(program("demo/gen-demo1.py"))
        .arg(&demo1)
        .status_within(DEADLINE);
    assert!(st.success());
    let out1 = d.path().join("out1");
    scatter(&out1, &[demo1.clone()], &[], &["-O0"]);
    let orig1 = out1.join("original/demo1");
    let a = behaviour(run_with_stdin(&mut Command::new(&orig1), None));
    let b = behaviour(run_with_stdin(&mut Command::new(out1.join("bin/demo1")), None));
    assert_eq!(a, b);
    assert!(a.stdout.starts_with("demo1 "));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out1.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["functions"].as_array().unwrap().len(), 65536, "65,535 functions + main");

    let out2 = d.path().join("out2");
    scatter(&out2, &[program("demo/demo2.c")], &[], &["-O0"]);
    let orig2 = d.path().join("demo2");
    clang_build(&[program("demo/demo2.c")], &["-O0"], &orig2);
    let a = behaviour(run_with_stdin(Command::new(&orig2).arg("300"), None));
    let b = behaviour(run_with_stdin(Command::new(out2.join("bin/demo2")).arg("300"), None));
    assert_eq!(a, b);
    assert_eq!(a.stdout, "demo2 300 10000\n");
}

#[test]
fn sqlite_shell_gives_identical_output_on_a_substantial_script() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    scatter_sqlite(&out);
    let orig = out.join("original/sqlite3");
    let scattered = out.join("bin/sqlite3");
    let script = program("sqlite/full.sql");
    let a = behaviour(run_with_stdin(Command::new(&orig).arg(":memory:"), Some(&script)));
    let b = behaviour(run_with_stdin(Command::new(&scattered).arg(":memory:"), Some(&script)));
    assert_eq!(a.code, b.code);
    assert_eq!(a.stderr, b.stderr, "error messages differ");
    assert_eq!(a.stdout, b.stdout, "query output differs");
    assert!(a.stdout.lines().count() > 200, "the script produced little output");
    assert!(!a.stderr.is_empty(), "the script's failing statements reported nothing");

    // The paper's SQLite3-query workload on a database file.
    let q = program("sqlite/workload-query.sql");
    let db1 = d.path().join("a.db");
    let db2 = d.path().join("b.db");
    let a = behaviour(run_with_stdin(Command::new(&orig).arg(&db1), Some(&q)));
    let b = behaviour(run_with_stdin(Command::new(&scattered).arg(&db2), Some(&q)));
    assert_eq!(a, b);
    assert_eq!(std::fs::read(&db1).unwrap(), std::fs::read(&db2).unwrap(), "database files differ");

    // The launcher is small: the paper's target for SQLite is <= 20%.
    let o = bunkai_ok(&["scatter", "stats", out.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ratio = v["launcher_ratio"].as_f64().unwrap();
    assert!(ratio <= 20.0, "SQLite launcher is {ratio:.1}% of the original");
}

#[test]
fn missing_library_is_one_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    scatter(&out, &features_srcs(), &[], &["-O0", "-lm", "-lpthread"]);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let fib = m["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "fib")
        .unwrap();
    let lib = out.join(fib["library"].as_str().unwrap());
    std::fs::remove_file(&lib).unwrap();
    let o = run_with_stdin(&mut Command::new(out.join("bin/features")), None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "stderr: {err}");
    // what it printed before the call (stdout a pipe: fully buffered) is kept
    let out_text = String::from_utf8_lossy(&o.stdout);
    assert!(out_text.starts_with("start: argc 1 "), "stdout lost: {out_text:?}");
    let line = err.lines().find(|l| l.starts_with("bunkai:")).expect(&err);
    assert!(line.contains("function fib"), "{line}");
    assert!(line.contains(lib.file_name().unwrap().to_str().unwrap()), "{line}");
    assert!(line.ends_with("(the scattered output is incomplete: copy the launcher's library directory with it)"), "{line}");
}

#[test]
fn library_from_another_build_is_named_as_such() {
    // fib's library replaced by another function's: it loads, but does not
    // define fib's body. Copying or scattering again would not help.
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    scatter(&out, &features_srcs(), &[], &["-O0", "-lm", "-lpthread"]);
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let lib_of = |name: &str| {
        let f = m["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).unwrap();
        out.join(f["library"].as_str().unwrap())
    };
    std::fs::copy(lib_of("cube"), lib_of("fib")).unwrap();
    let o = run_with_stdin(&mut Command::new(out.join("bin/features")), None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "stderr: {err}");
    let line = err.lines().find(|l| l.starts_with("bunkai:")).expect(&err);
    assert!(line.contains("function fib") && line.contains("undefined symbol: __bunkai_f"), "{line}");
    assert!(line.ends_with("(the launcher and this library come from different scatter outputs, or one was changed: install both from the same one)"), "{line}");
}

#[test]
fn bad_inputs_fail_cleanly_and_leave_nothing() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let o = out.to_str().unwrap();

    let txt = d.path().join("notes.txt");
    std::fs::write(&txt, "hello").unwrap();
    let (code, err) = bunkai_fails(&["scatter", "-o", o, txt.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.starts_with("bunkai scatter: "), "{err}");
    assert!(err.contains("not C source or LLVM bitcode"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let fake = d.path().join("fake.bc");
    std::fs::write(&fake, "int x;").unwrap();
    let (_, err) = bunkai_fails(&["scatter", "-o", o, fake.to_str().unwrap()]);
    assert!(err.contains("not LLVM bitcode"), "{err}");

    let broken = d.path().join("broken.c");
    std::fs::write(&broken, "int main(void) { return nope; }\n").unwrap();
    let (_, err) = bunkai_fails(&["scatter", "-o", o, broken.to_str().unwrap()]);
    let last = err.trim_end().lines().last().unwrap();
    assert!(last.starts_with("bunkai scatter: "), "{err}");
    assert!(last.contains("does not compile"), "{last}");

    let (_, err) = bunkai_fails(&["scatter", "--bogus", "-o", o, broken.to_str().unwrap()]);
    assert!(err.starts_with("bunkai scatter: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    // Nothing half-written: no output directory, no temporary left over.
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("bunkai"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    // A directory that is not a scatter output is never overwritten.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("precious"), "x").unwrap();
    let (_, err) = bunkai_fails(&["scatter", "-o", o, program("demo/demo2.c").to_str().unwrap()]);
    assert!(err.contains("not a scatter output"), "{err}");
    assert!(out.join("precious").exists());
}

#[test]
fn cli_basics() {
    let v = bunkai_ok(&["--version"]);
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("bunkai "));
    let h = bunkai_ok(&["help", "scatter"]);
    let h = String::from_utf8_lossy(&h.stdout);
    assert!(h.contains("--lib") && h.contains("CLANG_FLAGS"), "{h}");
    let (_, err) = bunkai_fails(&["scatter", "stats", "/nonexistent-dir"]);
    assert!(err.starts_with("bunkai scatter: ") && err.contains("manifest.json"), "{err}");
    let (_, err) = bunkai_fails(&["flow", "points", "/nonexistent"]);
    assert!(err.starts_with("bunkai flow: ") && err.trim_end().lines().count() == 1, "{err}");
    let (_, err) = bunkai_fails(&["trace", "report", "/nonexistent.bkt"]);
    assert!(err.starts_with("bunkai trace: ") && err.trim_end().lines().count() == 1, "{err}");
}

#[test]
fn calls_between_groups_go_through_slots_and_behave_like_the_original() {
    // Issue 23: grouped at 1 KiB, the features program's functions land in
    // many groups: calls inside a group go straight to the body, calls
    // between groups through the calling group's slots, which the manager
    // fills (a slot left empty, or pointing at the wrong body, changes the
    // program's behaviour or crashes it).
    let d = tempfile::tempdir().unwrap();
    let orig = d.path().join("orig");
    clang_build(&features_srcs(), &["-O2", "-lm", "-lpthread"], &orig);
    let out = d.path().join("out");
    scatter(&out, &features_srcs(), &[], &["-O2", "-lm", "-lpthread"]);
    let o = out.to_str().unwrap();
    let prof_out = d.path().join("profile-run.txt");
    bunkai_ok(&["scatter", "profile", o, "--", prof_out.to_str().unwrap()]);
    bunkai_ok(&["scatter", "group", o, "--threshold", "1KiB"]);
    same_behaviour(&orig, &out.join("bin/features"), d.path());
    let groups: Vec<PathBuf> = std::fs::read_dir(out.join("lib/features"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with('g') && n.ends_with(".so")
        })
        .collect();
    assert!(groups.len() >= 4, "only {} groups", groups.len());
    let with_slots = groups
        .iter()
        .filter(|g| {
            let nm = Command::new("nm").arg("-D").arg(g).output().unwrap();
            String::from_utf8_lossy(&nm.stdout).contains("__bunkai_gimp")
        })
        .count();
    assert!(with_slots > 0, "no group library calls another through its slots");
}

/// The dynamic symbols `path` defines (`nm -D --defined-only`).
fn defined_dynamic_symbols(path: &Path) -> Vec<String> {
    let o = Command::new("nm").args(["-D", "--defined-only"]).arg(path).output().unwrap();
    assert!(o.status.success(), "nm -D {}", path.display());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(|s| s.split('@').next().unwrap().to_string()))
        .collect()
}

#[test]
fn launcher_exports_a_stub_only_when_a_library_takes_its_address() {
    // Issue 23, launcher size: a library calls another library's function
    // through its own slot, never through the stub's symbol, so the launcher
    // exports no dynamic symbol for a function the libraries only call. A
    // function whose address a library takes keeps its exported stub, and
    // pointers to it taken in two libraries and in the launcher's data
    // compare equal. As an executable and as a shared library.
    let d = tempfile::tempdir().unwrap();
    let lib_c = d.path().join("calls.c");
    std::fs::write(
        &lib_c,
        r#"#include <stdio.h>
typedef int (*fn)(int);
static int twice(int x) { return 2 * x; }           /* only called */
static int thrice(int x) { return 3 * x; }          /* address taken in two libraries */
static int quad(int x) { return 4 * x; }            /* address taken in shared data */
fn table[] = {quad, thrice};                        /* used by two functions: stays */
int only_called(int x) { return twice(x) + 1; }     /* public, only called */
fn pick(int k) { return k ? thrice : 0; }
int is_thrice(fn f) { return f == thrice; }
int via_table(int i, int x) { return table[i](x); }
int table_has(fn f) { return table[0] == f || table[1] == f; }
int run(int n) {
  fn f = pick(n);
  printf("%d %d %d %d %d %d\n", only_called(n), f(n), is_thrice(f), is_thrice(pick(0)),
         via_table(0, n), table_has(f));
  return 0;
}
"#,
    )
    .unwrap();
    let main_c = d.path().join("main.c");
    std::fs::write(&main_c, "int run(int);\nint main(int argc, char **argv) { (void)argv; return run(argc); }\n")
        .unwrap();
    let orig = d.path().join("orig");
    clang_build(&[lib_c.clone(), main_c.clone()], &["-O0"], &orig);
    let native = Command::new(&orig).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&native.stdout), "3 3 1 0 4 1\n");

    let stub_of = |out: &Path, name: &str| -> String {
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
        m["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name} not extracted"))["stub"]
            .as_str()
            .unwrap()
            .to_string()
    };

    // An executable launcher.
    let out = d.path().join("out");
    scatter(&out, &[lib_c.clone(), main_c.clone()], &["--name", "calls"], &["-O0"]);
    let scat = Command::new(out.join("bin/calls")).output().unwrap();
    assert_eq!(behaviour(scat), behaviour(native.clone()), "scattered program behaves differently");
    let syms = defined_dynamic_symbols(&out.join("bin/calls"));
    for f in ["thrice", "twice"] {
        let s = stub_of(&out, f);
        assert!(s.starts_with("__bunkai_s"), "{f}'s stub is {s}");
    }
    assert!(syms.contains(&stub_of(&out, "thrice")), "thrice's stub, whose address a library takes, is exported: {syms:?}");
    for f in ["twice", "only_called", "quad", "pick", "is_thrice", "run"] {
        assert!(!syms.contains(&stub_of(&out, f)), "{f} is only called by the libraries, yet exported: {syms:?}");
    }
    // The original exports no variable of its own: the launcher neither;
    // `table`, public and used by two functions, is merged like static data.
    assert!(!syms.contains(&"table".to_string()), "{syms:?}");
    let v = bunkai_ok(&["scatter", "-v", "-o", d.path().join("out-v").to_str().unwrap(), "--name", "calls",
                        lib_c.to_str().unwrap(), main_c.to_str().unwrap(), "--", "-O0"]);
    let log = String::from_utf8_lossy(&v.stderr);
    assert!(log.contains("hide table: the original does not export it"), "{log}");
    assert!(log.contains("global table -> launcher __bunkai_"), "{log}");

    // Its relative relocations are packed (DT_RELR) when the C library reads them.
    let dynamic = |f: &Path| {
        let o = Command::new("readelf").arg("-d").arg(f).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let libc = Command::new("clang-14").arg("-print-file-name=libc.so.6").output().unwrap();
    let libc = String::from_utf8_lossy(&libc.stdout).trim().to_string();
    let vers = Command::new("readelf").arg("-V").arg(&libc).output().unwrap();
    let relr = String::from_utf8_lossy(&vers.stdout).contains("GLIBC_ABI_DT_RELR");
    assert_eq!(dynamic(&out.join("bin/calls")).contains("(RELR)"), relr, "DT_RELR where {libc} reads it");
    assert!(!dynamic(&out.join("bin/calls")).contains("(HASH)"), "one hash table, GNU's");

    // A shared-library launcher: the same, and its public functions stay
    // exported. No DT_RELR here: GNU ld, linking the program below against
    // it, could not resolve the symbol that asks for glibc's support.
    let out = d.path().join("out-lib");
    scatter(&out, &[lib_c.clone()], &["--lib", "--name", "calls"], &["-O0"]);
    let lib = out.join("lib/libcalls.so");
    let syms = defined_dynamic_symbols(&lib);
    for f in ["only_called", "pick", "is_thrice", "via_table", "table_has", "run", "table"] {
        assert!(syms.contains(&f.to_string()), "{f} is public: {syms:?}");
    }
    assert!(syms.contains(&stub_of(&out, "thrice")), "{syms:?}");
    assert!(!syms.contains(&stub_of(&out, "twice")), "twice is only called, yet exported: {syms:?}");
    let host = d.path().join("host");
    let st = Command::new("clang-14")
        .args(["-O0", "-o"])
        .arg(&host)
        .arg(&main_c)
        .arg(format!("-L{}", out.join("lib").display()))
        .arg(format!("-Wl,-rpath,{}", out.join("lib").display()))
        .arg("-lcalls")
        .status()
        .unwrap();
    assert!(st.success(), "linking a program against the scattered library");
    assert!(!dynamic(&lib).contains("(RELR)"));
    let scat = Command::new(&host).output().unwrap();
    assert_eq!(behaviour(scat), behaviour(native), "the program on the scattered library behaves differently");
}
