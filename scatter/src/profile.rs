//! `bunkai scatter profile`: the tracing run of §5.1. The manager writes the id of
//! every function at its first call (BUNKAI_PROFILE); this module turns those
//! raw logs into OUT/profile, stamped with the build it belongs to.
//!
//! OUT/profile is text:
//!
//! ```text
//! # bunkai profile: functions in first-call order
//! format bunkai-profile/1
//! build 3f2a9c0d17e4b6a1
//! runs 2
//! 1a	812	main
//! 3	12044	sqlite3_open
//! ```
//!
//! One line per function: hex id, size in bytes (its library's size minus
//! the per-library overhead, §5.1), name. `build` is the first 16 hex digits
//! of the SHA-256 of the launcher: a profile of another build is refused.

use crate::layout::PROFILE;
use crate::manifest::Manifest;
use bunkai_common::files::write_atomic;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, ExitStatus};

const FORMAT_LINE: &str = "format bunkai-profile/1";

#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub build: String,
    pub runs: u32,
    /// (id, size) in first-call order, each id once.
    pub order: Vec<(u32, u64)>,
}

/// The build id of a scatter output: it changes whenever the launcher does.
pub fn build_id(out: &Path, m: &Manifest) -> Result<String> {
    let launcher = out.join(&m.launcher);
    let bytes = std::fs::read(&launcher).with_context(|| {
        format!("cannot read the launcher {} (scatter the program again)", launcher.display())
    })?;
    let d = Sha256::digest(&bytes);
    Ok(d.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// A function's size for grouping (§5.1): library size minus the overhead.
pub fn function_size(m: &Manifest, id: u32) -> u64 {
    m.functions
        .get(id as usize)
        .map(|f| f.size.saturating_sub(m.library_overhead_bytes))
        .unwrap_or(0)
}

/// Parses OUT/profile. Every line is checked: ids must exist in a program of
/// `nfuncs` functions and appear once.
pub fn parse(text: &str, nfuncs: usize) -> Result<Profile> {
    let mut build = None;
    let mut runs = None;
    let mut seen_format = false;
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line == FORMAT_LINE {
            seen_format = true;
            continue;
        }
        if !seen_format {
            bail!("line {n}: not a bunkai profile (expected {FORMAT_LINE:?} first)");
        }
        if let Some(b) = line.strip_prefix("build ") {
            if b.len() != 16 || !b.bytes().all(|c| c.is_ascii_hexdigit()) {
                bail!("line {n}: bad build id {b:?}");
            }
            build = Some(b.to_string());
            continue;
        }
        if let Some(r) = line.strip_prefix("runs ") {
            runs = Some(r.parse::<u32>().map_err(|_| anyhow::anyhow!("line {n}: bad run count {r:?}"))?);
            continue;
        }
        let mut f = line.splitn(3, '\t');
        let (id, size) = (f.next().unwrap_or(""), f.next());
        let id = u32::from_str_radix(id, 16).map_err(|_| anyhow::anyhow!("line {n}: bad function id {id:?}"))?;
        let size: u64 = size
            .ok_or_else(|| anyhow::anyhow!("line {n}: missing size"))?
            .parse()
            .map_err(|_| anyhow::anyhow!("line {n}: bad size"))?;
        if id as usize >= nfuncs {
            bail!("line {n}: function id {id:x} does not exist in this program");
        }
        if !seen.insert(id) {
            bail!("line {n}: function id {id:x} appears twice");
        }
        order.push((id, size));
    }
    if !seen_format {
        bail!("empty file, not a bunkai profile");
    }
    Ok(Profile {
        build: build.context("no build line")?,
        runs: runs.context("no runs line")?,
        order,
    })
}

pub fn render(p: &Profile, m: &Manifest) -> String {
    let mut t = format!(
        "# bunkai profile: functions of {} in first-call order (id, size, name)\n{FORMAT_LINE}\nbuild {}\nruns {}\n",
        m.name, p.build, p.runs
    );
    for (id, size) in &p.order {
        let name = m.functions.get(*id as usize).map(|f| f.name.as_str()).unwrap_or("?");
        t.push_str(&format!("{id:x}\t{size}\t{name}\n"));
    }
    t
}

/// Reads OUT/profile and checks that it belongs to this build.
pub fn read(out: &Path, m: &Manifest) -> Result<Profile> {
    let path = out.join(PROFILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!("{} has no profile (run bunkai scatter profile {} -- ARGS... first)", out.display(), out.display())
    })?;
    let damaged = |e: anyhow::Error| anyhow::anyhow!("{} is damaged: {e:#} (profile again)", path.display());
    // The build first: a profile of another program fails here, with the
    // message that says what to do, before its ids are checked.
    let p = parse(&text, usize::MAX).map_err(damaged)?;
    let build = build_id(out, m)?;
    if p.build != build {
        bail!(
            "{} was recorded for another build ({}, this output is {build}; profile again: bunkai scatter profile {} -- ARGS...)",
            path.display(),
            p.build,
            out.display()
        );
    }
    parse(&text, m.functions.len()).map_err(damaged)
}

/// Ids from the manager's raw log ("<hex>\n" per first call), deduplicated
/// in order. Lines of forked children interleave whole (O_APPEND).
pub fn parse_raw(text: &str, nfuncs: usize) -> Vec<u32> {
    let mut seen = HashSet::new();
    text.lines()
        .filter_map(|l| u32::from_str_radix(l.trim(), 16).ok())
        .filter(|id| (*id as usize) < nfuncs && seen.insert(*id))
        .collect()
}

pub struct Recorded {
    pub status: ExitStatus,
    pub functions: usize,
    pub new: usize,
    pub runs: u32,
}

/// Runs the program once with the manager recording first calls and merges
/// the result into OUT/profile (`append`) or replaces it.
/// `via`: `args` is a whole command that runs the launcher (a workload
/// script, or a program that loads a scattered library); the variable is
/// inherited by its children.
pub fn record(out: &Path, append: bool, via: bool, args: &[String]) -> Result<Recorded> {
    let m = Manifest::read(out)?;
    let build = build_id(out, &m)?;
    let mut base = if append && out.join(PROFILE).exists() {
        read(out, &m)?
    } else {
        Profile { build: build.clone(), runs: 0, order: Vec::new() }
    };
    let raw = tempfile::Builder::new()
        .prefix(".bunkai-profile-")
        .tempfile_in(out)
        .with_context(|| format!("cannot write in {}", out.display()))?;
    let mut cmd = if m.kind == "exe" && !via {
        let mut c = Command::new(out.join(&m.launcher));
        c.args(args);
        c
    } else {
        // A launcher library is profiled through a program that loads it.
        let Some((prog, rest)) = args.split_first() else {
            bail!("give the command that runs {} after --", m.name);
        };
        let mut c = Command::new(prog);
        c.args(rest);
        c
    };
    cmd.env("BUNKAI_PROFILE", raw.path()).env_remove("BUNKAI_ORIGIN");
    let status = cmd.status().with_context(|| {
        format!("cannot start {} (check the output directory)", out.join(&m.launcher).display())
    })?;
    let ids = parse_raw(&std::fs::read_to_string(raw.path())?, m.functions.len());
    let have: HashSet<u32> = base.order.iter().map(|(id, _)| *id).collect();
    let mut new = 0;
    for id in &ids {
        if !have.contains(id) {
            base.order.push((*id, function_size(&m, *id)));
            new += 1;
        }
    }
    base.runs += 1;
    write_atomic(&out.join(PROFILE), render(&base, &m).as_bytes())?;
    Ok(Recorded { status, functions: ids.len(), new, runs: base.runs })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# c\nformat bunkai-profile/1\nbuild 0123456789abcdef\nruns 2\n1a\t812\tmain\n3\t0\tf\n";

    #[test]
    fn parses_a_profile() {
        let p = parse(GOOD, 100).unwrap();
        assert_eq!(p.build, "0123456789abcdef");
        assert_eq!(p.runs, 2);
        assert_eq!(p.order, vec![(0x1a, 812), (3, 0)]);
    }

    #[test]
    fn refuses_damaged_profiles() {
        assert!(parse("", 10).is_err());
        assert!(parse("hello\n", 10).is_err());
        assert!(parse(GOOD, 5).unwrap_err().to_string().contains("does not exist"));
        let dup = format!("{GOOD}1a\t1\tx\n");
        assert!(parse(&dup, 100).unwrap_err().to_string().contains("twice"));
        let nobuild = GOOD.replace("build 0123456789abcdef\n", "");
        assert!(parse(&nobuild, 100).is_err());
        assert!(parse(&GOOD.replace("\t812", ""), 100).is_err());
        assert!(parse(&GOOD.replace("812", "-1"), 100).is_err());
    }

    #[test]
    fn parser_survives_arbitrary_bytes() {
        // A cheap stand-in for the fuzz target: random and mutated inputs
        // must give Ok or Err, never a panic.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let mut b = GOOD.as_bytes().to_vec();
            for _ in 0..(next() % 8) {
                let i = (next() as usize) % b.len();
                b[i] = (next() & 0xff) as u8;
            }
            let t = String::from_utf8_lossy(&b);
            let _ = parse(&t, 64);
            let _ = parse_raw(&t, 64);
        }
    }

    #[test]
    fn raw_log_keeps_first_calls_once() {
        assert_eq!(parse_raw("3\n1\n3\nzz\n2\nffffff\n", 10), vec![3, 1, 2]);
    }
}
