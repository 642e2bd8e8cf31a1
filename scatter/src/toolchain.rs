//! Where the external tools and bunkai's own helpers are, and how to run them.
//!
//! bunkai drives LLVM 14 as separate programs (clang-14, opt-14, llvm-link-14)
//! plus its own helpers in `build/lib/bunkai/` (the pass plugin, bunkai-lower,
//! the runtime archive). A tool that fails prints its own diagnostics to our
//! stderr; we add one line naming the step.

use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Paths of everything scatter runs.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub clang: PathBuf,
    pub opt: PathBuf,
    pub llvm_link: PathBuf,
    pub strip: PathBuf,
    pub libdir: PathBuf,
}

impl Toolchain {
    pub fn plugin(&self) -> PathBuf {
        self.libdir.join("BunkaiScatter.so")
    }
    pub fn lower(&self) -> PathBuf {
        self.libdir.join("bunkai-lower")
    }
    pub fn runtime(&self) -> PathBuf {
        self.libdir.join("libbunkai-scatter-rt.a")
    }

    /// Finds the tools: LLVM 14 from PATH (or /usr/lib/llvm-14/bin), bunkai's
    /// helpers from `$BUNKAI_LIBDIR` or `<dir of the bunkai binary>/../lib/bunkai`.
    pub fn discover() -> Result<Toolchain> {
        let libdir = bunkai_common::install::helper_libdir()?;
        let tc = Toolchain {
            clang: find_tool("clang-14")?,
            opt: find_tool("opt-14")?,
            llvm_link: find_tool("llvm-link-14")?,
            strip: find_tool("llvm-strip-14")?,
            libdir,
        };
        for p in [tc.plugin(), tc.lower(), tc.runtime()] {
            bunkai_common::install::require(&p)?;
        }
        Ok(tc)
    }
}

fn find_tool(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let llvm_bin = PathBuf::from("/usr/lib/llvm-14/bin");
    let plain = name.trim_end_matches("-14");
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    let p = llvm_bin.join(plain);
    if p.is_file() {
        return Ok(p);
    }
    bail!("{name} not found (run scripts/install-deps.sh)")
}

/// Runs a command; on failure its stderr has already gone to ours, and the
/// error names the step.
pub fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot start {}", program_name(cmd)))?;
    if !status.success() {
        bunkai_common::files::end_if_interrupted(&status);
        bail!("{what} failed ({} exited with {status})", program_name(cmd));
    }
    Ok(())
}

/// Runs a command and returns its stdout and stderr.
pub fn output(cmd: &mut Command) -> Result<(String, String)> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {}", program_name(cmd)))?;
    bunkai_common::files::end_if_interrupted(&out.status);
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

pub fn program_name(cmd: &Command) -> String {
    Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(OsStr::new("?"))
        .to_string_lossy()
        .into_owned()
}
