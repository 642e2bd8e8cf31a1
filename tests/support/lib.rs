//! Helpers for the end-to-end tests: where the real CLI and the test
//! programs are, and how to run a program and capture everything it does.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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

/// Runs `cmd` with `stdin` as its standard input.
pub fn run_with_stdin(cmd: &mut Command, stdin: Option<&Path>) -> Output {
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).expect("stdin file")),
        None => cmd.stdin(Stdio::null()),
    };
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()))
}

/// Runs bunkai with `args`; panics with its stderr unless it succeeds.
pub fn bunkai_ok(args: &[&str]) -> Output {
    let out = Command::new(bunkai())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run bunkai");
    assert!(
        out.status.success(),
        "bunkai {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs bunkai expecting failure; returns stderr.
pub fn bunkai_fails(args: &[&str]) -> (i32, String) {
    let out = Command::new(bunkai())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run bunkai");
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
        .status()
        .expect("run clang-14");
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
