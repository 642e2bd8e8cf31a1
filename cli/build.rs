//! What `bunkai --version` says besides the crate's version: the commit it
//! was built from and the LLVM and Valgrind it was built against (the LLVM
//! passes and the Valgrind tool are built for those exact versions).
use std::process::Command;

fn first_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).lines().next()?.trim().to_string())
}

fn main() {
    let commit = first_line("git", &["rev-parse", "--short=10", "HEAD"])
        .map(|c| {
            let dirty = Command::new("git")
                .args(["diff", "--quiet", "HEAD", "--"])
                .status()
                .map(|s| !s.success())
                .unwrap_or(false);
            if dirty { format!("{c}-dirty") } else { c }
        })
        .unwrap_or_else(|| "unknown commit".into());
    let llvm = first_line("llvm-config-14", &["--version"]).unwrap_or_else(|| "?".into());
    let valgrind = first_line("valgrind", &["--version"])
        .map(|v| v.trim_start_matches("valgrind-").to_string())
        .unwrap_or_else(|| "?".into());
    println!("cargo:rustc-env=BUNKAI_BUILD_INFO={commit}; LLVM {llvm}; Valgrind {valgrind}");
    // A position-dependent executable: the linker resolves the 12,000
    // relative relocations of a PIE itself, so the dynamic loader does not
    // touch (and fault in) the pages holding them at every start
    // (bench/results/cli-startup.md).
    println!("cargo:rustc-link-arg-bins=-no-pie");
    for p in ["../.git/HEAD", "../.git/index", "../.git/refs/heads"] {
        println!("cargo:rerun-if-changed={p}");
    }
}
