//! c_header.rs: what a C compiler reads in one of the subsystems' versioned
//! headers (`<subsystem>/include/`). Each subsystem's crate pins its header
//! against its Rust mirror with a test that compiles a small program
//! including the header and compares what it prints: the preprocessor, not a
//! line parser, says what a name means (an alias, a magic pasted from a
//! version number, a struct's offsets).

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the compiler, and then the program, may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// Compiles a program whose `main` runs `body` (C statements; `<stdio.h>`,
/// `<stddef.h>` and `<string.h>` are included) against `header`, found in
/// `include`, with the system's cc, runs it and returns its standard output.
pub fn run(include: &Path, header: &str, body: &str) -> Result<String> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let src = dir.path().join("probe.c");
    let exe = dir.path().join("probe");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include <string.h>\n#include \"{header}\"\n\
             int main(void) {{\n{body}\n  return 0;\n}}\n"
        ),
    )?;
    let mut cc = Command::new("cc");
    cc.arg("-Wall").arg("-I").arg(include).arg(&src).arg("-o").arg(&exe);
    let (ok, _, err) = within(cc, dir.path(), "cc").context("cannot run cc (install gcc: scripts/install-deps.sh)")?;
    if !ok {
        bail!("cannot compile {header} with cc: {}", err.trim());
    }
    let (ok, out, err) = within(Command::new(&exe), dir.path(), "probe")?;
    if !ok {
        bail!("the program compiled against {header} failed: {}", err.trim());
    }
    Ok(out)
}

/// Runs `cmd` with its output in files under `dir`, killed after DEADLINE:
/// (success, stdout, stderr).
fn within(mut cmd: Command, dir: &Path, name: &str) -> Result<(bool, String, String)> {
    let (out, err) = (dir.join(format!("{name}.out")), dir.join(format!("{name}.err")));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{name} took longer than {} s", DEADLINE.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok((status.success(), std::fs::read_to_string(out)?, std::fs::read_to_string(err)?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_a_program_against_a_header() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("h.h"), "#define V 7\n#define W \"x\" \"y\"\n").unwrap();
        let out = super::run(dir.path(), "h.h", r#"printf("%d %s %zu\n", V, W, sizeof W);"#).unwrap();
        assert_eq!(out, "7 xy 3\n");
        let e = super::run(dir.path(), "h.h", "no_such_function();").unwrap_err();
        assert!(format!("{e:#}").contains("cannot compile h.h with cc"), "{e:#}");
    }
}
