//! `bunkai flow cc [CLANG_ARGS...]`: clang-14 with the join-point pass.
//!
//! Adds `-fpass-plugin=<libdir>/BunkaiFlow.so` (the pass runs at the end of
//! the optimisation pipeline) and `-g` last, so that a `-g0` or
//! `-gline-tables-only` among the arguments cannot take away the member and
//! variable names the pass needs. When the arguments pass `-mllvm
//! -bunkai-flow-...` options, the plugin is also loaded with `-Xclang
//! -load`: clang parses -mllvm before it loads pass plugins. Linking needs
//! nothing else: the table is plain read-only data with PC-relative
//! offsets.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

pub const PLUGIN: &str = "BunkaiFlow.so";

/// The pass plugin: `$BUNKAI_LIBDIR/BunkaiFlow.so` or beside the CLI.
pub fn plugin() -> Result<PathBuf> {
    let p = bunkai_common::install::helper(PLUGIN)?;
    Ok(p.canonicalize().unwrap_or(p))
}

pub fn clang() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join("clang-14");
        if p.is_file() {
            return Ok(p);
        }
    }
    let p = PathBuf::from("/usr/lib/llvm-14/bin/clang");
    if p.is_file() {
        return Ok(p);
    }
    bail!("clang-14 not found (run scripts/install-deps.sh)")
}

/// The full clang command line for `args`.
pub fn command_line(plugin: &std::path::Path, args: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![format!("-fpass-plugin={}", plugin.display()).into()];
    if args.iter().any(|a| a == "-mllvm") {
        for a in ["-Xclang", "-load", "-Xclang"] {
            out.push(a.into());
        }
        out.push(plugin.as_os_str().to_owned());
    }
    // -g goes last, but before a "--" that ends clang's options.
    match args.iter().position(|a| a == "--") {
        Some(i) => {
            out.extend_from_slice(&args[..i]);
            out.push("-g".into());
            out.extend_from_slice(&args[i..]);
        }
        None => {
            out.extend_from_slice(args);
            out.push("-g".into());
        }
    }
    out
}

/// Runs clang-14 with the pass on `args` (as clang would take them); its
/// exit status is ours.
pub fn run(args: &[OsString]) -> Result<ExitCode> {
    if args.is_empty() {
        bail!("nothing to compile (usage: bunkai flow cc [CLANG_ARGS...], e.g. bunkai flow cc -O2 prog.c -o prog)");
    }
    // With LTO, the link-time inliner drops the noredzone the pass puts on
    // functions with sleds (LLVM 14 has no merge rule for it), and a patched
    // sled's call would then overwrite a caller's red zone.
    let lto = args.iter().filter_map(|x| x.to_str()).filter(|x| x.starts_with("-flto") || *x == "-fno-lto").last();
    if let Some(f) = lto.filter(|x| x.starts_with("-flto")) {
        bail!("{f} is not supported: link-time inlining would lose the sleds' red-zone protection (build without LTO, or add -fno-lto after it)");
    }
    let plugin = plugin()?;
    let clang = clang()?;
    let status = Command::new(&clang)
        .args(command_line(&plugin, args))
        .status()
        .with_context(|| format!("cannot start {}", clang.display()))?;
    // clang has said what went wrong; its exit status is ours.
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::from(1),
    })
}
