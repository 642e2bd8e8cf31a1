//! `make install` and `make deb` as a packager uses them: the tree installed
//! under a fresh DESTDIR and the package unpacked into a fresh directory
//! each run on their own (helpers found beside the installed binary, not in
//! the build tree: a trace recorded with the installed Valgrind tool), with
//! man pages, completions and docs in place; the package's dependencies
//! resolve on this machine (apt's simulation) and name the tools bunkai
//! runs.
use bunkai_e2e::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

fn ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output_within(LIMIT);
    assert!(
        out.status.success(),
        "{what}: exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The installed CLI at `prefix` (under `root`) works on its own: its
/// version names the toolchain, and a trace recorded with its own helpers
/// (BUNKAI_LIBDIR unset: the CLI finds them beside itself) holds the
/// program's instructions.
fn installed_tool_works(root: &Path, prefix: &str) {
    let bin = root.join(prefix.trim_start_matches('/')).join("bin/bunkai");
    let v = ok(Command::new(&bin).arg("--version"), "bunkai --version");
    assert!(v.starts_with("bunkai ") && v.contains("LLVM 14.") && v.contains("Valgrind 3."), "{v}");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("true.bkt");
    let mut rec = Command::new(&bin);
    rec.env_remove("BUNKAI_LIBDIR")
        .args(["trace", "record", "--json", "-o"])
        .arg(&trace)
        .args(["--", "/bin/true"]);
    let out = rec.output_within(LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "installed trace record: {err}");
    let libdir = root.join(prefix.trim_start_matches('/')).join("lib/bunkai");
    let summary: serde_json::Value = err
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON summary from the installed trace record: {err}"));
    let n = summary["instructions"].as_u64().unwrap_or(0);
    assert!(n > 10_000, "the installed tool recorded {n} instructions of /bin/true: {summary}");
    let dump = ok(
        Command::new(&bin).env_remove("BUNKAI_LIBDIR").args(["trace", "dump", "--limit", "3"]).arg(&trace),
        "installed trace dump",
    );
    assert!(!dump.trim().is_empty(), "the installed tool's dump printed nothing");
    assert!(libdir.join("valgrind").is_dir(), "{} has no valgrind tool", libdir.display());
}

fn installed_files(base: &Path) {
    for f in [
        "bin/bunkai",
        "lib/bunkai/libbunkai-share.so",
        "lib/bunkai/libbunkai-flow.so",
        "lib/bunkai/libbunkai-host.so",
        "lib/bunkai/BunkaiScatter.so",
        "lib/bunkai/include/bunkai_mod.h",
        "share/man/man1/bunkai.1",
        "share/man/man1/bunkai-trace-record.1",
        "share/man/man1/bunkai-share-run.1",
        "share/doc/bunkai/README.md",
        "share/doc/bunkai/LICENSE",
        "share/doc/bunkai/CHANGELOG.md",
        "share/doc/bunkai/docs/share.md",
    ] {
        assert!(base.join(f).exists(), "{} is not installed", base.join(f).display());
    }
    for (f, word) in [
        ("share/bash-completion/completions/bunkai", "_bunkai"),
        ("share/zsh/vendor-completions/_bunkai", "#compdef bunkai"),
        ("share/fish/vendor_completions.d/bunkai.fish", "complete -c bunkai"),
    ] {
        let text = std::fs::read_to_string(base.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(text.contains(word) && text.contains("record"), "{f} is not a completion script for bunkai");
    }
    let man = std::fs::read_to_string(base.join("share/man/man1/bunkai-share-run.1")).unwrap();
    assert!(man.contains(".TH") && man.contains("\\-\\-nodes"), "bunkai-share-run.1 is not a man page of share run");
}

#[test]
fn make_install_lays_out_a_working_tool_and_uninstall_removes_it() {
    let dest = tempfile::tempdir().unwrap();
    ok(
        Command::new("bash").arg(root().join("scripts/install.sh")).arg("/usr/local").arg(dest.path()),
        "scripts/install.sh /usr/local DESTDIR",
    );
    installed_files(&dest.path().join("usr/local"));
    installed_tool_works(dest.path(), "/usr/local");
    ok(
        Command::new("bash").arg(root().join("scripts/install.sh")).args(["--uninstall", "/usr/local"]).arg(dest.path()),
        "scripts/install.sh --uninstall",
    );
    let left: Vec<_> = walk(&dest.path().join("usr/local")).into_iter().filter(|p| p.is_file()).collect();
    assert!(left.is_empty(), "uninstall left {left:?}");
    // a relative prefix is refused in one line
    let out = Command::new("bash")
        .arg(root().join("scripts/install.sh"))
        .arg("usr/local")
        .arg(dest.path())
        .output_within(LIMIT);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PREFIX must be an absolute path"));
}

fn walk(p: &Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let q = e.path();
            if q.is_dir() {
                v.extend(walk(&q));
            }
            v.push(q);
        }
    }
    v
}

#[test]
fn make_deb_builds_a_package_that_installs_and_runs() {
    let out = ok(Command::new("bash").arg(root().join("scripts/make-deb.sh")), "scripts/make-deb.sh");
    let deb = out
        .split_whitespace()
        .find(|w| w.ends_with(".deb") && !w.starts_with("./"))
        .map(|w| root().join(w))
        .unwrap_or_else(|| panic!("make-deb named no package: {out}"));
    assert!(deb.exists(), "{} is missing", deb.display());
    let info = ok(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Depends"), "dpkg-deb -f Depends");
    for dep in ["libc6", "clang-14", "lld-14", "llvm-14", "valgrind", "iproute2"] {
        assert!(info.contains(dep), "the package does not depend on {dep}: {info}");
    }
    // apt resolves every dependency on this machine (a simulation: nothing installed)
    let sim = ok(Command::new("apt-get").args(["install", "-s"]).arg(&deb), "apt-get install -s");
    assert!(sim.contains("Inst bunkai"), "{sim}");
    // unpacked into a fresh directory, the tool runs from there
    let dir = tempfile::tempdir().unwrap();
    ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(dir.path()), "dpkg-deb -x");
    installed_files(&dir.path().join("usr"));
    installed_tool_works(dir.path(), "/usr");
    let _ = std::fs::remove_file(&deb);
}
