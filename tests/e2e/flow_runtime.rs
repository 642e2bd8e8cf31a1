//! The flow-ID runtime of `bunkai flow` (flow/runtime/): its C unit
//! tests (flow/runtime/test_flow.c, built by `make` against the shared and
//! the static library), and the rules of a library that lives inside other
//! processes, checked on the built files.

use bunkai_e2e::{root, run_with_stdin, Deadline, DEADLINE};
use std::path::PathBuf;
use std::process::Command;

/// The tests test_flow runs, in its order.
const TESTS: &[&str] = &[
    "ids_threads",
    "ids_processes",
    "ids_fallback",
    "table_basics",
    "paper_patterns",
    "table_growth",
    "table_churn",
    "concurrent",
    "buffer",
    "buffer_reuse",
    "buffer_full",
    "buffer_race",
    "buffer_unavailable",
    "time_stamps",
    "store_tsc",
    "clock_unprivileged",
    "fork",
    "fork_under_load",
    "signal",
    "weave_flags",
    "fork_in_advice",
    "weave_guard",
    "weave_many",
];

fn built(rel: &str) -> PathBuf {
    let p = root().join("build").join(rel);
    assert!(p.exists(), "{} is missing: run `make native` first", p.display());
    p
}

fn run_unit_tests(binary: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(built(&format!("tests/flow/{binary}")));
    cmd.env("BUNKAI_FLOW_DIR", dir.path())
        .env("BUNKAI_FLOW_IDS", dir.path().join("ids"))
        .env("BKF_STRESS_MS", "1500");
    let out = run_with_stdin(&mut cmd, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{binary} failed ({}):\n{stdout}{stderr}", out.status);
    for t in TESTS {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("ok {t} ("))),
            "{binary}: no 'ok {t}' line:\n{stdout}"
        );
    }
    assert!(
        stdout.contains(&format!("test_flow: {} passed", TESTS.len())),
        "{binary}: summary line missing:\n{stdout}"
    );
    // Buffers of the test and of its children are removed by the test.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".buf"))
        .collect();
    assert!(left.is_empty(), "{binary} left buffers behind: {left:?}");
}

#[test]
fn unit_tests_against_the_shared_library() {
    run_unit_tests("test_flow_shared");
}

#[test]
fn unit_tests_against_the_static_library() {
    run_unit_tests("test_flow_static");
}

fn tool(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output_within(DEADLINE);
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const API: &[&str] = &[
    "bkf_table",
    "get_new_flowid",
    "register_flowid",
    "get_flowid",
    "remove_flowid",
    "bkf_table_size",
    "bkf_store",
    "bkf_store_tsc",
    "bkf_buffer_size",
    "bkf_weave",
    "bkf_weave_ex",
    "bkf_weave_guarded",
    "bkf_unweave",
];

/// What a runtime inside other processes may depend on: weak references
/// that are null when nothing defines them.
const WEAK_REFS: &[&str] = &["environ", "gnu_get_libc_version"];

#[test]
fn the_runtime_exports_its_api_and_needs_nothing() {
    let so = built("lib/bunkai/libbunkai-flow.so");
    let a = built("lib/bunkai/libbunkai-flow.a");
    let so_s = so.to_str().unwrap();
    let a_s = a.to_str().unwrap();

    // Exported: the API of bunkai_flow.h and the __bunkai_ prefix.
    let defined = tool("nm", &["-D", "--defined-only", so_s]);
    let mut names = Vec::new();
    for l in defined.lines() {
        let name = l.split_whitespace().last().unwrap_or("");
        assert!(
            API.contains(&name) || name.starts_with("__bunkai_"),
            "libbunkai-flow.so exports {name}, which is neither API nor __bunkai_"
        );
        names.push(name.to_string());
    }
    for f in API {
        assert!(names.iter().any(|n| n == f), "libbunkai-flow.so does not export {f}");
    }

    // Undefined: only weak references, in the .so and in the archive (an
    // advice module linking it must not pull libc functions).
    for (what, listing) in [("libbunkai-flow.so", tool("nm", &["-D", "-u", so_s])), ("libbunkai-flow.a", tool("nm", &["-u", a_s]))] {
        for l in listing.lines().filter(|l| !l.trim().is_empty() && !l.ends_with(':')) {
            let mut w = l.split_whitespace();
            let (kind, name) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
            assert!(kind == "w" && WEAK_REFS.contains(&name), "{what} needs {name} ({kind})");
        }
    }

    // No libraries needed, no TLS, no constructors (bunkai mod refuses
    // modules with either).
    let dynamic = tool("readelf", &["-dW", so_s]);
    assert!(!dynamic.contains("(NEEDED)"), "libbunkai-flow.so needs libraries:\n{dynamic}");
    let sections = tool("readelf", &["-SW", a_s]);
    for bad in [".tbss", ".tdata", ".init_array", ".ctors", ".fini_array"] {
        assert!(!sections.contains(bad), "libbunkai-flow.a has a {bad} section");
    }
}
