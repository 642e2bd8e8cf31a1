//! Module mutants against a running host: what the issue saw (4,000
//! mutants of a valid module loaded into a host crashed it 17 times) must
//! never happen again.
//!
//! The scheduling example's policies (fifo, rr, prio, edf) are mutated by
//! bunkai_mod::fuzz (section headers, symbols, relocations, the ELF header,
//! `.bunkai_mod`, truncations, bits) and each mutant is dry-linked first,
//! both where the host maps modules (the low 2 GB) and where it falls back
//! to (high), since a link can depend on where it lands (an absolute
//! 32-bit relocation fits only low):
//! - the linker refuses it at both: `bunkai mod load` must refuse it too, in one
//!   line `bunkai mod: ...`, and the host must run on unharmed;
//! - it links exactly as the original at both (the mutation touched nothing the
//!   link uses): it is loaded into the host, must schedule a round exactly
//!   as the original does (same decision hash, no bad decision), and is
//!   unloaded; or `bunkai mod load` refuses it in one line (say a changed
//!   interface text);
//! - it links differently, or at one address only: a different program,
//!   which may do anything a module may do (loop, crash its host):
//!   counted, not loaded.
//!
//! After every mutant the host must be alive; every 200 mutants it must
//! list exactly the modules it had. `BUNKAI_MOD_MUTANTS` sets the count
//! (default 1,200 here; bench/mod/mutants.sh runs 100,000), and
//! `BUNKAI_MOD_MUTANTS_REPORT=FILE.md` writes the counts as a benchmark
//! result.

use bunkai_e2e::*;
use bunkai_mod::fuzz::{dry_link_at, mutate, Linked, Rng, RX_HIGH, RX_LOW};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};


struct Host {
    child: Child,
    socket: PathBuf,
    lines: Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Host {
    fn start() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("host.sock");
        let mut child = Command::new(sched_dir().join("sched-host"))
            .arg("--socket")
            .arg(&socket)
            .args(["--pace-us", "200", "--jobs", "60", "--seed", "7"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sched-host (run make)");
        kill_after(&child, Duration::from_secs(3 * 3600), "sched-host");
        let rx = stdout_lines(&mut child);
        let h = Host { child, socket, lines: rx, _dir: dir };
        h.line(|l| l.starts_with("socket ")).expect("sched-host did not start");
        h
    }

    /// The next line matching `f` within 30 s, or None.
    fn line(&self, f: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if f(&l) => return Some(l),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// A round decided by `policy` from its start, after everything
    /// printed so far: (bad decisions, decision hash). Every round has the
    /// same jobs (--seed), so one policy's rounds hash the same.
    fn round(&self, policy: &str) -> (String, String) {
        while self.lines.try_recv().is_ok() {}
        // The first round by it may have begun under the policy before.
        let by = |l: &str| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"round") && f.get(3) == Some(&policy)
        };
        self.line(by).unwrap_or_else(|| panic!("no round by {policy} within 30 s"));
        let l = self.line(by).unwrap_or_else(|| panic!("no second round by {policy} within 30 s"));
        let f: Vec<&str> = l.split_whitespace().collect();
        (f[7].to_string(), f[9].to_string())
    }

    fn sock(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn modules(&self) -> Vec<String> {
        let o = bunkai_ok(&["mod", "list", "--socket", self.sock(), "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let mut n: Vec<String> =
            v["modules"].as_array().unwrap().iter().map(|m| m["record"]["name"].as_str().unwrap().to_string()).collect();
        n.sort();
        n
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The interfaces a module file says it implements.
fn implements(bytes: &[u8]) -> Vec<String> {
    let m = bunkai_mod::link::Module::parse(bytes).ok();
    let meta = m.and_then(|m| m.meta_bytes()).and_then(|b| bunkai_mod::meta::parse(b).ok()).unwrap_or_default();
    meta.implements.into_iter().map(|i| i.iface.name).collect()
}

/// The dry links of a module at the host's two places.
fn both(bytes: &[u8]) -> Result<(Linked, Linked), String> {
    Ok((dry_link_at(bytes, RX_LOW)?, dry_link_at(bytes, RX_HIGH)?))
}

/// A refusal: non-zero, not a panic, one line naming bunkai mod.
fn one_line_refusal(o: &std::process::Output, what: &str) -> Result<(), String> {
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.code() == Some(101) || err.contains("panicked") {
        return Err(format!("{what}: bunkai panicked: {err}"));
    }
    if o.status.success() || o.status.code().is_none() {
        return Err(format!("{what}: expected a refusal, got {:?}: {err}", o.status));
    }
    if err.lines().count() != 1 || !err.starts_with("bunkai mod: ") {
        return Err(format!("{what}: refusal is not one line `bunkai mod: ...`: {err:?}"));
    }
    Ok(())
}

#[test]
fn module_mutants_never_harm_a_running_host() {
    let n: usize = std::env::var("BUNKAI_MOD_MUTANTS").ok().and_then(|s| s.parse().ok()).unwrap_or(1200);
    let t0 = Instant::now();
    let d = tempfile::tempdir().unwrap();
    let mut h = Host::start();
    let sd = sched_dir();
    bunkai_ok(&["mod", "load", "--socket", h.sock(), sd.join("util.o").to_str().unwrap()]);
    let base = h.modules();

    // Each policy's round as the original schedules it.
    let policies = ["fifo", "rr", "prio", "edf"];
    let mut want = Vec::new();
    for p in policies {
        let file = sd.join(format!("{p}.o"));
        let bytes = std::fs::read(&file).unwrap();
        let linked = both(&bytes).unwrap_or_else(|e| panic!("{p}.o: {e}"));
        bunkai_ok(&["mod", "load", "--socket", h.sock(), file.to_str().unwrap()]);
        let (bad, hash) = h.round(p);
        assert_eq!(bad, "0", "{p}");
        bunkai_ok(&["mod", "unload", "--socket", h.sock(), p]);
        want.push((bytes, linked, hash));
    }

    let (mut refused, mut same_ran, mut same_refused, mut changed, mut unused) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut failures: Vec<String> = Vec::new();
    let mut r = Rng(0x5eed_0f_b0ca1);
    let m = d.path().join("m.o");
    for i in 0..n {
        let k = i % policies.len();
        let (orig, linked, hash) = &want[k];
        let (bytes, how) = mutate(&mut r, orig);
        let what = format!("{}.o mutant {i} ({how})", policies[k]);
        std::fs::write(&m, &bytes).unwrap();
        let (low, high) = (dry_link_at(&bytes, RX_LOW), dry_link_at(&bytes, RX_HIGH));
        let same = |l: &Linked, o: &Linked| l.rx == o.rx && l.rw == o.rw && l.entries == o.entries;
        match (low, high) {
            (Err(_), Err(_)) => {
                let o = bunkai_run(&["mod", "load", "--socket", h.sock(), m.to_str().unwrap(), "--json"]);
                match one_line_refusal(&o, &what) {
                    Ok(()) => refused += 1,
                    Err(e) => failures.push(e),
                }
            }
            (Ok(l), Ok(g)) if same(&l, &linked.0) && same(&g, &linked.1) => {
                let o = bunkai_run(&["mod", "load", "--socket", h.sock(), m.to_str().unwrap(), "--json"]);
                if o.status.success() {
                    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                    let name = v["modules"][0]["name"].as_str().unwrap_or("?").to_string();
                    // A mutant whose metadata now names another interface
                    // is loaded and left unused by the host (it asks for
                    // sched_policy only).
                    if implements(&bytes).iter().any(|i| i == "sched_policy") {
                        let (bad, got) = h.round(policies[k]);
                        if bad != "0" || got != *hash {
                            failures.push(format!(
                                "{what}: linked as the original but scheduled differently (bad {bad}, hash {got} not {hash})"
                            ));
                        }
                    } else {
                        unused += 1;
                    }
                    let u = bunkai_run(&["mod", "unload", "--socket", h.sock(), &name]);
                    if !u.status.success() {
                        failures.push(format!("{what}: unload failed: {}", String::from_utf8_lossy(&u.stderr)));
                    }
                    same_ran += 1;
                } else {
                    match one_line_refusal(&o, &what) {
                        Ok(()) => same_refused += 1,
                        Err(e) => failures.push(e),
                    }
                }
            }
            _ => changed += 1,
        }
        if !h.alive() {
            failures.push(format!("{what}: THE HOST DIED ({:?})", h.child.try_wait()));
            break;
        }
        if i % 200 == 199 || i + 1 == n {
            let now = h.modules();
            if now != base {
                failures.push(format!("after {what}: the host has {now:?}, not {base:?}"));
                break;
            }
        }
        if failures.len() >= 20 {
            break;
        }
    }
    let alive = h.alive();
    let secs = t0.elapsed().as_secs_f64();
    let summary = format!(
        "{n} mutants in {secs:.0} s: {refused} refused in one line, {same_ran} linked as the original and loaded ({unused} of them naming another interface, so unused), \
         {same_refused} linked as the original but refused in one line, {changed} linked into a different program (not loaded); \
         host alive: {alive}; failures: {}",
        failures.len()
    );
    eprintln!("mod mutants: {summary}");
    if let Ok(path) = std::env::var("BUNKAI_MOD_MUTANTS_REPORT") {
        write_report(&path, n, secs, [refused, same_ran, same_refused, changed, unused], alive, &failures);
    }
    assert!(failures.is_empty(), "{summary}\n{}", failures.join("\n"));
    assert!(alive);
    // The campaign reached each kind of outcome.
    assert!(refused > 0 && same_ran > 0 && changed > 0, "{summary}");
}

fn write_report(path: &str, n: usize, secs: f64, c: [u64; 5], alive: bool, failures: &[String]) {
    let commit = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "describe", "--always", "--dirty"])
        .output_within(DEADLINE);
    let commit = String::from_utf8_lossy(&commit.stdout).trim().to_string();
    let pass = failures.is_empty() && alive && n >= 100_000;
    let mut s = String::new();
    s.push_str("# bunkai mod: module mutants against a running host\n\n");
    s.push_str(&format!(
        "Generated by `bash bench/mod/mutants.sh` (tests/e2e/mod_mutants.rs with BUNKAI_MOD_MUTANTS={n}) at commit {commit}, in {:.0} minutes.\n\n",
        secs / 60.0
    ));
    s.push_str("The scheduling example's four policies, mutated in turn (a field of a section header, a symbol, a relocation or the ELF header set to a value chosen to hurt; a byte of `.bunkai_mod`; a truncation; a bit anywhere), each dry-linked at fixed addresses, then sent to one running `sched-host` with `bunkai mod load`. A mutant that links exactly as its original must schedule exactly as it (same decision hash); one that links into a different program is a different program (it may do anything a module may) and is counted, not loaded. The host must survive every mutant and keep exactly its modules.\n\n");
    s.push_str("| outcome | mutants |\n|---|---:|\n");
    for (what, k) in [
        ("refused by the linker, and by `bunkai mod load` in one line", c[0]),
        ("linked as the original: loaded, scheduled as the original, unloaded", c[1] - c[4]),
        ("linked as the original, metadata naming another interface: loaded, unused, unloaded", c[4]),
        ("linked as the original but refused in one line (e.g. interface text changed)", c[2]),
        ("linked into a different program: not loaded", c[3]),
    ] {
        s.push_str(&format!("| {what} | {k} |\n"));
    }
    s.push_str(&format!("| **failures** (host crash, panic, refusal not one line, wrong schedule) | **{}** |\n\n", failures.len()));
    s.push_str(&format!(
        "Target: 0 host crashes and 0 panics over at least 100,000 mutants: **{}** (host alive at the end: {alive}).\n",
        if pass { "PASS" } else { "MISS" }
    ));
    for f in failures {
        s.push_str(&format!("\n- {f}"));
    }
    s.push('\n');
    std::fs::write(path, s).unwrap();
}
