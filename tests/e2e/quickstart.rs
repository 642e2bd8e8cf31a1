//! The README's quick starts, run as a reader pastes them: each block
//! marked `<!-- quickstart: NAME -->` is taken from README.md and run by
//! bash (`-e -o pipefail`) in a fresh directory set up as the README's
//! setup block sets up its scratch directory (`build`, `examples` and
//! `tests` linked from the clone, the CLI first on PATH). Each must exit 0
//! within its deadline and print what its expectations below say, in that
//! order, and leave nothing running: it runs in a process group of its own,
//! which must be empty once bash has exited (the group is killed either way).
//!
//! Also: the README's status table says PASS, MISS and "not resolved" as
//! often, for each results file, as the committed file in bench/results/
//! does, and names every results file.

use bunkai_e2e::*;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What each quick start must print (stdout and stderr together, in this
/// order), and how long it may take.
fn expectations(name: &str) -> (Duration, &'static [&'static str]) {
    let min = |m: u64| Duration::from_secs(60 * m);
    match name {
        "scatter" => (
            min(15),
            &[
                "bunkai scatter: demo1 -> out/bin/demo1 + 1025 libraries",
                "demo1 6814976134860721696", // the launcher, as the original prints
                "launcher",                  // stats
                "65 functions called",       // profile: main and the 64 it calls
                "groups at 16384 B",
                "run: running demo1 from cache",
                "demo1 6814976134860721696", // the same program, from the URL
                "fetched on demand",
            ],
        ),
        "trace" => (
            min(5),
            &[
                "hello from /hello",
                "Table 1: dynamic instructions per component",
                "server (program)",
                "ld-linux-x86-64.so.2",
                "read_request() {",
                "parse_request() {",
                "handle_request() {",
                "send_reply() {",
                "free_request() {",
            ],
        ),
        "share" => (
            min(5),
            &[
                "bunkai share: wrote a new key",
                "thread management table",
                "127.0.0.1:", // a thread on the node...
                "done",       // ...that ran to its end
                "program exited with status 0",
                "identical",
            ],
        ),
        "flow" => (
            min(5),
            &[
                "bunkai flow: woven flow_request into",
                "hello from /hello",
                "flow 0x",
                "read_request",
                "parse_request",
                "handle_request",
                "send_reply",
                "free_request",
            ],
        ),
        "mod" => (
            min(5),
            &[
                "loaded rr",
                "loaded sched-util (id 2) as a dependency",
                "loaded edf",
                "rr replaced and unloaded",
                "broken.o: damaged ELF object",
                "refused",
                "2 modules",
                "edf",
                "sched-util",
            ],
        ),
        _ => panic!("README.md has a quick start `{name}` this test has no expectations for: add them"),
    }
}

const NAMES: [&str; 5] = ["scatter", "trace", "share", "flow", "mod"];

fn readme() -> String {
    let p = root().join("README.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The ```sh block right after each line `<!-- MARKER -->` whose marker
/// starts with `prefix`, as (the rest of the marker, the block).
fn marked_blocks(text: &str, prefix: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(m) = l.trim().strip_prefix("<!-- ").and_then(|m| m.strip_suffix(" -->")) else { continue };
        let Some(name) = m.strip_prefix(prefix) else { continue };
        assert_eq!(lines.get(i + 1).map(|l| l.trim()), Some("```sh"), "README.md line {}: {l} is not followed by a ```sh block", i + 1);
        let body: Vec<&str> = lines[i + 2..].iter().take_while(|l| l.trim() != "```").copied().collect();
        assert!(i + 2 + body.len() < lines.len(), "README.md line {}: the block after {l} is not closed", i + 1);
        out.push((name.trim().to_string(), body.join("\n") + "\n"));
    }
    out
}

/// The directory the CLI was built into (BUNKAI=.../build/bin/bunkai, or
/// BUNKAI_ROOT/build/bin/bunkai): what the README's `build` link points at.
fn build_dir() -> PathBuf {
    let b = bunkai();
    let d = b.parent().and_then(Path::parent).expect("the CLI's directory").to_path_buf();
    assert!(d.join("lib/bunkai").is_dir(), "{} has no lib/bunkai: BUNKAI must be a built tree's bin/bunkai", d.display());
    d
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Processes (not zombies) in process group `pgid`, as "pid command".
fn group_members(pgid: u32) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // fields after the name: state, ppid, pgrp
        if f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string() {
            v.push(format!("{} {}", &stat[..open].trim(), &stat[open + 1..close]));
        }
    }
    v
}

/// Quick starts run one at a time: they are timed by their own deadlines
/// and poll servers they start; two at once on two cores only slows both.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run_quickstart(name: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let text = readme();
    let blocks = marked_blocks(&text, "quickstart: ");
    let body = &blocks
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("README.md has no block marked <!-- quickstart: {name} -->"))
        .1;
    let (limit, expect) = expectations(name);

    // the scratch directory of the README's setup block
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::os::unix::fs::symlink(build_dir(), d.join("build")).unwrap();
    std::os::unix::fs::symlink(root().join("examples"), d.join("examples")).unwrap();
    std::os::unix::fs::symlink(root().join("tests"), d.join("tests")).unwrap();
    std::fs::write(d.join("quickstart.sh"), body).unwrap();
    let path = format!("{}:{}", bunkai().parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let log_path = d.join("quickstart.log");
    let log = File::create(&log_path).unwrap();

    let mut cmd = Command::new("bash");
    cmd.args(["-e", "-o", "pipefail", "quickstart.sh"])
        .current_dir(d)
        .env("PATH", path)
        // `bunkai share key` writes here, not to the user's ~/.config
        .env("BUNKAI_SHARE_KEY", d.join("share.key"))
        .env_remove("BUNKAI_HOST_SOCKET")
        .env_remove("BUNKAI_FLOW_DIR")
        .stdin(Stdio::null())
        // one open file for both (as 2>&1): the transcript keeps its order
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .process_group(0);
    let mut child = cmd.spawn().expect("cannot run bash");
    let pgid = child.id();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // what the block left running: given 5 s to go (a SIGTERM on its way)
    let mut left = group_members(pgid);
    let t1 = Instant::now();
    while !left.is_empty() && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        left = group_members(pgid);
    }
    // SAFETY: kill has no memory preconditions; the group is ours
    unsafe { kill(-(pgid as i32), 9) };
    let _ = child.wait();

    let out = std::fs::read_to_string(&log_path).unwrap_or_default();
    let shown = format!("--- quick start `{name}` ---\n{body}--- its output ---\n{out}");
    let Some(status) = status else {
        panic!("quick start `{name}`: still running after {limit:?} (killed)\n{shown}");
    };
    assert!(status.success(), "quick start `{name}`: bash exited with {status}\n{shown}");
    assert!(left.is_empty(), "quick start `{name}` left processes running (killed): {left:?}\n{shown}");
    let mut at = 0;
    for want in expect {
        match out[at..].find(want) {
            Some(i) => at += i + want.len(),
            None => panic!("quick start `{name}`: no `{want}` in its output after byte {at}\n{shown}"),
        }
    }
}

#[test]
fn quickstart_scatter() {
    run_quickstart("scatter");
}

#[test]
fn quickstart_trace() {
    run_quickstart("trace");
}

#[test]
fn quickstart_share() {
    run_quickstart("share");
}

#[test]
fn quickstart_flow() {
    run_quickstart("flow");
}

#[test]
fn quickstart_mod() {
    run_quickstart("mod");
}

/// Every marked block has a test above and expectations, and the setup
/// block is the one this test mirrors.
#[test]
fn every_quickstart_is_tested() {
    let text = readme();
    let mut names: Vec<String> = marked_blocks(&text, "quickstart: ").into_iter().map(|(n, _)| n).collect();
    for n in &names {
        expectations(n);
    }
    names.sort();
    let mut want: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names, want, "the quick starts in README.md, against the tests here");
    let setup = marked_blocks(&text, "quickstart-setup");
    assert_eq!(setup.len(), 1, "README.md needs one block marked <!-- quickstart-setup -->");
    let setup = &setup[0].1;
    for line in ["export PATH=$PWD/build/bin:$PATH", "ln -sfn $R/build $R/examples $R/tests ."] {
        assert!(setup.contains(line), "the setup block no longer says `{line}`, which run_quickstart mirrors:\n{setup}");
    }
}

/// Occurrences of `word` in `text` not inside a longer word.
fn count_word(text: &str, word: &str) -> usize {
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.match_indices(word)
        .filter(|(i, _)| !is_word(text[..*i].chars().next_back()) && !is_word(text[i + word.len()..].chars().next()))
        .count()
}

/// In a verdict cell: each occurrence of `word`, times the `×N` after it.
fn count_verdict(cell: &str, word: &str) -> usize {
    cell.match_indices(word)
        .map(|(i, _)| {
            let rest = &cell[i + word.len()..];
            match rest.strip_prefix(" ×") {
                Some(n) => n.chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap_or(1),
                None => 1,
            }
        })
        .sum()
}

/// The README's status table against bench/results/*.md: per file, as
/// many PASS, MISS and "not resolved" verdicts as the file has, and every
/// results file named.
#[test]
fn status_table_matches_bench_results() {
    let text = readme();
    let section = text.split("\n## Status\n").nth(1).expect("README.md has no `## Status` section");
    let section = section.split("\n## ").next().unwrap();
    let kinds = ["PASS", "MISS", "not resolved"];
    let mut table: std::collections::BTreeMap<String, [usize; 3]> = Default::default();
    for row in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | subsystem | target | result | verdict | results file |
        if cells.len() != 7 || cells[1] == "subsystem" || cells[1].starts_with("---") {
            continue;
        }
        let file = cells[5]
            .split("(bench/results/")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .unwrap_or_else(|| panic!("status row without a bench/results link: {row}"));
        let counts = table.entry(file.to_string()).or_default();
        for (k, kind) in kinds.iter().enumerate() {
            counts[k] += count_verdict(cells[4], kind);
        }
    }
    assert!(!table.is_empty(), "no rows in README.md's status table");
    let dir = root().join("bench/results");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    files.sort();
    let named: Vec<String> = table.keys().cloned().collect();
    assert_eq!(named, files, "results files in README.md's status table, against bench/results/*.md");
    for (file, counts) in &table {
        let body = std::fs::read_to_string(dir.join(file)).unwrap();
        let have = [count_word(&body, "PASS"), count_word(&body, "MISS"), body.matches("not resolved").count()];
        assert_eq!(
            *counts, have,
            "README.md's status table gives {file} {counts:?} verdicts (PASS, MISS, not resolved); the file has {have:?}"
        );
    }
}
