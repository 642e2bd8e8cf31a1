//! End-to-end tests of `bunkai flow cc` and `bunkai flow points`: the real
//! CLI and the join-point pass on small C programs (tests/programs/flow/),
//! compared with the same programs built by plain clang-14.
//!
//! The programs carry `/* jp FUNCTION: ITEM; ITEM */` comments naming the
//! join points expected at -O2 (syntax at the top of each program); the
//! tests check the table against them, read the sled bytes from the file,
//! look for dynamic relocations, and run every program with all of its
//! sleds patched (sledcheck.c) to check each operand's value at run time.
//!
//! One file (about 1,600 lines) on purpose: the tests share the program
//! corpus, its `jp` comment parser and the sled readers, and cargo builds
//! one binary per file.

use bunkai_e2e::*;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAMS: [&str; 3] = ["packets", "shapes", "locals"];
const UNPATCHED: [u8; 11] = [
    0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
];

fn src(name: &str) -> PathBuf {
    program(&format!("flow/{name}.c"))
}

/// `bunkai flow cc FLAGS SRC -o OUT`.
fn flow_cc(name: &str, flags: &[&str], out: &Path) {
    let mut args: Vec<&str> = vec!["flow", "cc"];
    args.extend_from_slice(flags);
    let s = src(name);
    args.push(s.to_str().unwrap());
    args.push("-o");
    args.push(out.to_str().unwrap());
    bunkai_ok(&args);
}

fn points(file: &Path) -> Vec<Value> {
    let o = bunkai_ok(&["flow", "points", "--json", file.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["version"], 2);
    let jps = v["joinpoints"].as_array().unwrap().clone();
    assert_eq!(v["count"].as_u64().unwrap() as usize, jps.len());
    jps
}

fn location<'a>(jp: &'a Value, name: &str) -> Option<&'a str> {
    jp["operands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == name)
        .map(|o| o["location"].as_str().unwrap())
}

fn what(jp: &Value) -> String {
    if jp["kind"] == "entry" {
        "entry".into()
    } else {
        format!(
            "{}.{}",
            jp["struct"].as_str().unwrap(),
            jp["member"].as_str().unwrap()
        )
    }
}

/// One expected join point from a source comment.
#[derive(Debug)]
struct Expect {
    line: u64,
    function: String,
    what: String,
    access: String,
    ops: Vec<String>,
}

fn markers(name: &str) -> Vec<Expect> {
    let text = std::fs::read_to_string(src(name)).unwrap();
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let Some(at) = l.find("/* jp ") else { continue };
        let body = l[at + 6..].trim_end().trim_end_matches("*/").trim();
        let (function, items) = body.split_once(": ").unwrap();
        for item in items.split(';') {
            let t: Vec<&str> = item.split_whitespace().collect();
            let (what, access, ops) = if t[0] == "entry" {
                ("entry", "entry", &t[1..])
            } else {
                (t[0], t[1], &t[2..])
            };
            out.push(Expect {
                line: i as u64 + 1,
                function: function.to_string(),
                what: what.to_string(),
                access: access.to_string(),
                ops: ops.iter().map(|s| s.to_string()).collect(),
            });
        }
    }
    assert!(out.len() >= 5, "{name}: too few markers");
    out
}

/// Every marker has at least one join point, and every join point matching
/// it satisfies its operand constraints.
fn check_markers(name: &str, jps: &[Value]) {
    for e in markers(name) {
        let found: Vec<&Value> = jps
            .iter()
            .filter(|jp| {
                jp["line"] == e.line
                    && jp["function"] == e.function.as_str()
                    && what(jp) == e.what
                    && jp["access"] == e.access.as_str()
            })
            .collect();
        assert!(!found.is_empty(), "{name}: no join point for {e:?}");
        for jp in found {
            assert!(jp["file"].as_str().unwrap().ends_with(&format!("{name}.c")));
            for op in &e.ops {
                if let Some(absent) = op.strip_prefix('!') {
                    assert!(
                        location(jp, absent).is_none(),
                        "{name}: {absent} listed at {e:?}: {jp}"
                    );
                } else if let Some((a, b)) = op.split_once('=') {
                    let la =
                        location(jp, a).unwrap_or_else(|| panic!("{name}: no {a} at {e:?}: {jp}"));
                    let lb = if b.starts_with('$')
                        && b[1..].starts_with(|c: char| c.is_ascii_digit())
                    {
                        b
                    } else {
                        location(jp, b).unwrap_or_else(|| panic!("{name}: no {b} at {e:?}: {jp}"))
                    };
                    assert_eq!(la, lb, "{name}: {a} and {b} at {e:?}: {jp}");
                } else {
                    assert!(location(jp, op).is_some(), "{name}: no {op} at {e:?}: {jp}");
                }
            }
        }
    }
}

/// (name, address, file offset, size) of every section, from readelf.
fn sections(file: &Path) -> Vec<(String, u64, u64, u64)> {
    let o = Command::new("readelf")
        .arg("-SW")
        .arg(file)
        .output_within(DEADLINE);
    let mut out = Vec::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let Some((_, rest)) = l.split_once(']') else {
            continue;
        };
        let t: Vec<&str> = rest.split_whitespace().collect();
        if t.len() < 5 {
            continue;
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        if let (Some(a), Some(o), Some(s)) = (hex(t[2]), hex(t[3]), hex(t[4])) {
            out.push((t[0].to_string(), a, o, s));
        }
    }
    out
}

fn table_range(file: &Path) -> (u64, u64) {
    let s = sections(file);
    let t = s
        .iter()
        .find(|s| s.0 == "bunkai_flow_jp")
        .expect("a bunkai_flow_jp section");
    (t.1, t.1 + t.3)
}

/// The bytes at each recorded sled address are the unpatched sled, read
/// from the file through readelf's section table (not through bunkai).
fn check_sled_bytes(file: &Path, jps: &[Value]) {
    let data = std::fs::read(file).unwrap();
    let secs = sections(file);
    for jp in jps {
        let addr = jp["sled_addr"].as_u64().unwrap();
        assert_eq!(addr % 2, 0, "sled at an odd address: {jp}");
        let s = secs
            .iter()
            .find(|s| s.0.starts_with(".text") && addr >= s.1 && addr + 11 <= s.1 + s.3)
            .unwrap_or_else(|| panic!("sled outside .text: {jp}"));
        let off = (s.2 + addr - s.1) as usize;
        assert_eq!(data[off..off + 11], UNPATCHED, "bytes at {addr:#x}: {jp}");
    }
}

/// No dynamic relocation in the table, no text relocation anywhere.
fn check_no_dynamic_relocations(file: &Path) {
    let d = Command::new("readelf")
        .arg("-dW")
        .arg(file)
        .output_within(DEADLINE);
    let d = String::from_utf8_lossy(&d.stdout);
    assert!(!d.contains("TEXTREL"), "{}: {d}", file.display());
    let (lo, hi) = table_range(file);
    let r = Command::new("readelf")
        .arg("-rW")
        .arg(file)
        .output_within(DEADLINE);
    for l in String::from_utf8_lossy(&r.stdout).lines() {
        let Some(first) = l.split_whitespace().next() else {
            continue;
        };
        if first.len() != 16 {
            continue;
        }
        if let Ok(off) = u64::from_str_radix(first, 16) {
            assert!(
                !(lo..hi).contains(&off),
                "{}: relocation in the table: {l}",
                file.display()
            );
        }
    }
}

fn run(exe: &Path, args: &[&str], env: &[(&str, &Path)]) -> Behaviour {
    let mut c = Command::new(exe);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    behaviour(run_with_stdin(&mut c, None))
}

#[test]
fn flow_builds_behave_like_plain_clang_builds() {
    let d = tempfile::tempdir().unwrap();
    for name in PROGRAMS {
        for opt in ["-O2", "-O0"] {
            let plain = d.path().join(format!("{name}{opt}.plain"));
            let flow = d.path().join(format!("{name}{opt}.flow"));
            clang_build(&[src(name)], &[opt], &plain);
            flow_cc(name, &[opt], &flow);
            let a = run(&plain, &["300"], &[]);
            let b = run(&flow, &["300"], &[]);
            assert_eq!(a, b, "{name} {opt}");
            assert_eq!(a.code, Some(0), "{name} {opt}: {a:?}");
            let jps = points(&flow);
            assert!(jps.len() >= 10, "{name} {opt}: {} join points", jps.len());
            check_sled_bytes(&flow, &jps);
        }
    }
}

#[test]
fn points_list_the_join_points_the_sources_name() {
    let d = tempfile::tempdir().unwrap();
    for name in PROGRAMS {
        let exe = d.path().join(name);
        flow_cc(name, &["-O2"], &exe);
        let jps = points(&exe);
        check_markers(name, &jps);
        for (i, jp) in jps.iter().enumerate() {
            assert_eq!(jp["index"], i);
            assert!(jp["line"].as_u64().is_some() && jp["function"].as_str().is_some());
            for op in jp["operands"].as_array().unwrap() {
                assert!(
                    ["reg", "mem", "imm"].contains(&op["kind"].as_str().unwrap()),
                    "{op}"
                );
            }
        }
        // Every entry lists $arg0.. in order; every access lists $base first.
        for jp in &jps {
            let first = jp["operands"]
                .get(0)
                .map(|o| o["name"].as_str().unwrap().to_string());
            if jp["kind"] == "access" {
                assert_eq!(first.as_deref(), Some("$base"), "{jp}");
            } else if let Some(f) = first {
                assert!(f == "$arg0" || !f.starts_with('$'), "{jp}");
            }
        }
        // The text table names the same join points.
        let o = bunkai_ok(&["flow", "points", exe.to_str().unwrap()]);
        let text = String::from_utf8(o.stdout).unwrap();
        assert_eq!(text.lines().count(), jps.len() + 1, "{text}");
        assert!(text.lines().next().unwrap().contains("join point"));
        // --function and --struct keep exactly the join points that match
        let e = exe.to_str().unwrap();
        let func = jps[0]["function"].as_str().unwrap().to_string();
        let o = bunkai_ok(&["flow", "points", "--json", "--function", &func, e]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let want = jps.iter().filter(|jp| jp["function"] == func.as_str()).count();
        assert_eq!(v["joinpoints"].as_array().unwrap().len(), want, "--function {func}");
        if let Some(st) = jps.iter().find_map(|jp| jp["struct"].as_str()) {
            let o = bunkai_ok(&["flow", "points", "--json", "--struct", st, e]);
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            let got = v["joinpoints"].as_array().unwrap();
            assert_eq!(got.len(), jps.iter().filter(|jp| jp["struct"] == st).count(), "--struct {st}");
            assert!(got.iter().all(|jp| jp["struct"] == st));
        }
        let (_, err) = bunkai_fails(&["flow", "points", "--function", "no_such_function", e]);
        assert!(err.contains("is in function no_such_function") && err.contains("lists them all"), "{err}");
    }
}

#[test]
fn tables_need_no_dynamic_relocation() {
    let d = tempfile::tempdir().unwrap();
    let pie = d.path().join("packets");
    flow_cc("packets", &["-O2", "-fPIE", "-pie"], &pie);
    check_no_dynamic_relocations(&pie);
    for (ld, tag) in [("-fuse-ld=bfd", "bfd"), ("-fuse-ld=lld", "lld")] {
        let so = d.path().join(format!("libshapes-{tag}.so"));
        flow_cc("shapes", &["-O2", "-fPIC", "-shared", ld], &so);
        check_no_dynamic_relocations(&so);
        let jps = points(&so);
        check_sled_bytes(&so, &jps);
        check_markers("shapes", &jps);
    }
}

/// The values a patched sled finds where the table says: (index, function,
/// line, struct.member|entry, access, {name: value}).
type Hit = (String, u64, String, String, HashMap<String, u64>);

fn patched_run(name: &str, dir: &Path) -> (Behaviour, Behaviour, Vec<Hit>) {
    patched_run_with(name, &[], dir)
}

fn patched_run_with(name: &str, flags: &[&str], dir: &Path) -> (Behaviour, Behaviour, Vec<Hit>) {
    let lib = dir.join("libsledcheck.so");
    if !lib.exists() {
        clang_build(
            &[program("flow/sledcheck.c")],
            &["-O2", "-shared", "-fPIC"],
            &lib,
        );
    }
    let tag = if flags.is_empty() { name.to_string() } else { format!("{name}-{}", flags.len()) };
    let exe = dir.join(&tag);
    let mut all = vec!["-O2"];
    all.extend_from_slice(flags);
    flow_cc(name, &all, &exe);
    let log = dir.join(format!("{tag}.log"));
    let plain = run(&exe, &[], &[]);
    let patched = run(&exe, &[], &[("LD_PRELOAD", &lib), ("BKF_CHECK_LOG", &log)]);
    let hits = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let t: Vec<&str> = l.split(' ').collect();
            let vals = t[5..]
                .iter()
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (
                        k.to_string(),
                        u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap(),
                    )
                })
                .collect();
            (
                t[1].to_string(),
                t[2].parse().unwrap(),
                t[3].to_string(),
                t[4].to_string(),
                vals,
            )
        })
        .collect();
    (plain, patched, hits)
}

fn line_of(name: &str, needle: &str) -> u64 {
    let text = std::fs::read_to_string(src(name)).unwrap();
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle}")) as u64
        + 1
}

#[test]
fn patched_sleds_find_every_operand_where_the_table_says() {
    let d = tempfile::tempdir().unwrap();

    // locals: values the program computes, at every execution.
    let (plain, patched, hits) = patched_run("locals", d.path());
    assert_eq!(plain, patched, "locals with every sled patched");
    let (last, count, total) = (
        line_of("locals", "a->last = v;"),
        line_of("locals", "a->count += n;"),
        line_of("locals", "a->total += big;"),
    );
    let mut seen_v = Vec::new();
    for (f, line, what, _, v) in &hits {
        if f != "add" {
            continue;
        }
        if what != "entry" {
            assert_eq!(v["$base"], v["a"], "{line}");
        }
        if *line == last {
            assert_eq!(v["n"], 7, "the inner n");
            seen_v.push(v["v"]);
        } else if *line == count {
            assert_eq!(v["n"], 3 * v["v"], "the outer n");
        } else if *line == total {
            assert!(v["v"] > 10);
            assert_eq!((v["n"], v["big"]), (3 * v["v"], 3 * v["v"] + 1));
        }
    }
    assert_eq!(seen_v, (0..20).collect::<Vec<u64>>());
    let watch = hits
        .iter()
        .find(|h| h.0 == "watch" && h.3 == "store")
        .expect("watch's store");
    assert!(
        plain
            .stdout
            .contains(&format!("count {} ", watch.4["seen"])),
        "{}",
        plain.stdout
    );

    // shapes: addresses of inner structs, doubles in %xmm, a variable in memory.
    let (plain, patched, hits) = patched_run("shapes", d.path());
    assert_eq!(plain, patched, "shapes with every sled patched");
    let loop_line = line_of("shapes", "s += o->pts[k].x");
    for (f, line, what, _, v) in &hits {
        match (f.as_str(), what.as_str()) {
            ("sum_inner", "inner.x") | ("sum_inner", "inner.y") if *line == loop_line => {
                assert_eq!(v["$base"], v["o"] + 16 + 8 * v["k"], "&o->pts[k]")
            }
            ("sum_inner", "inner.x") | ("sum_inner", "inner.y") => {
                assert_eq!(v["$base"], v["o"] + 8, "&o->in")
            }
            ("weigh", "item.w") | ("weigh", "item.tag") => {
                assert_eq!(v["$base"], v["v"] + 16 * v["i"], "&v[i]")
            }
            ("many", "entry") => {
                assert_eq!((v["a"], v["h"]), (1, 8));
                assert_eq!((f64::from_bits(v["u"]), f64::from_bits(v["v"])), (1.5, 2.0));
            }
            ("escaped", "inner.y") => {
                assert_eq!(v["local"], 11, "the loaded value of an address-taken local")
            }
            _ => {}
        }
    }
    assert!(hits.iter().any(|h| h.0 == "escaped" && h.2 == "inner.y"));

    // packets: thousands of sleds executed, output unchanged, $base the
    // pointer the code dereferences.
    let (plain, patched, hits) = patched_run("packets", d.path());
    assert_eq!(plain, patched, "packets with every sled patched");
    assert!(hits.len() > 1000, "{} join points executed", hits.len());
    for (f, _, what, access, v) in &hits {
        if f == "pkt_clone" && what.starts_with("pkt.") {
            let owner = if access == "load" { "skb" } else { "n" };
            assert_eq!(v["$base"], v[owner], "{what} {access}");
        }
        if what != "entry" {
            assert!(v["$base"] != 0 && v["$base"] % 8 == 0, "{what}: {v:?}");
        }
    }
}

#[test]
fn pass_options_restrict_the_join_points() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("queue-stores");
    flow_cc(
        "packets",
        &[
            "-O2",
            "-mllvm",
            "-bunkai-flow-structs=queue",
            "-mllvm",
            "-bunkai-flow-kinds=store",
        ],
        &exe,
    );
    let jps = points(&exe);
    assert!(!jps.is_empty());
    assert!(
        jps.iter()
            .all(|j| j["struct"] == "queue" && j["access"] == "store"),
        "{jps:?}"
    );

    let exe = d.path().join("clone-only");
    flow_cc(
        "packets",
        &[
            "-O2",
            "-mllvm",
            "-bunkai-flow-functions=pkt_clone",
            "-mllvm",
            "-bunkai-flow-locals=false",
        ],
        &exe,
    );
    let jps = points(&exe);
    assert_eq!(jps.iter().filter(|j| j["kind"] == "entry").count(), 1);
    for j in &jps {
        assert_eq!(j["function"], "pkt_clone");
        for op in j["operands"].as_array().unwrap() {
            assert!(op["name"].as_str().unwrap().starts_with('$'), "{j}");
        }
    }
    // Unrestricted, the same program has more.
    let all = d.path().join("all");
    flow_cc("packets", &["-O2"], &all);
    assert!(points(&all).len() > jps.len() + 10);
}

fn one_line(err: &str) {
    assert!(
        err.starts_with("bunkai flow: ") && err.trim_end().lines().count() == 1,
        "{err:?}"
    );
}

#[test]
fn errors_are_one_clear_line() {
    let d = tempfile::tempdir().unwrap();
    let (_, err) = bunkai_fails(&["flow", "points", "/nonexistent"]);
    one_line(&err);

    // A program built without the pass.
    let plain = d.path().join("plain");
    clang_build(&[src("packets")], &["-O2"], &plain);
    let (_, err) = bunkai_fails(&["flow", "points", plain.to_str().unwrap()]);
    one_line(&err);
    assert!(
        err.contains("no join-point table") && err.contains("bunkai flow cc"),
        "{err}"
    );

    // An object file: offsets are not linked yet.
    let obj = d.path().join("packets.o");
    flow_cc("packets", &["-O2", "-c"], &obj);
    let (_, err) = bunkai_fails(&["flow", "points", obj.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("relocatable"), "{err}");

    // A damaged table: the second record's magic.
    let exe = d.path().join("packets");
    flow_cc("packets", &["-O2"], &exe);
    let (lo, _) = table_range(&exe);
    let sec = sections(&exe)
        .into_iter()
        .find(|s| s.0 == "bunkai_flow_jp")
        .unwrap();
    let mut data = std::fs::read(&exe).unwrap();
    let first_len = u32::from_le_bytes(
        data[sec.2 as usize + 12..sec.2 as usize + 16]
            .try_into()
            .unwrap(),
    ) as usize;
    let second = 16 + ((first_len + 3) & !3);
    data[sec.2 as usize + second + 4] ^= 0xff;
    let bad = d.path().join("damaged");
    std::fs::write(&bad, &data).unwrap();
    let (_, err) = bunkai_fails(&["flow", "points", bad.to_str().unwrap()]);
    one_line(&err);
    assert!(
        err.contains(&format!("offset {:#x}", second + 4)) && err.contains("magic"),
        "{err} (table at {lo:#x})"
    );

    // clang's own errors are clang's, with its exit status.
    let out = Command::new(bunkai())
        .args(["flow", "cc", "-O2", "/nonexistent.c", "-o"])
        .arg(d.path().join("x"))
        .output_within(DEADLINE);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such file"),
        "{out:?}"
    );

    // The pass used directly without -g says what is missing.
    let plugin = bunkai()
        .parent()
        .unwrap()
        .join("../lib/bunkai/BunkaiFlow.so");
    let out = Command::new("clang-14")
        .arg(format!("-fpass-plugin={}", plugin.display()))
        .args(["-O2", "-c"])
        .arg(src("packets"))
        .arg("-o")
        .arg(d.path().join("nog.o"))
        .output_within(DEADLINE);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no full debug info") && err.contains("-g"),
        "{err}"
    );
}

/// Where the runtimes are: beside the bunkai binary.
fn runtime_dir() -> PathBuf {
    bunkai().parent().unwrap().join("../lib/bunkai")
}

/// `flow_cc` for a program that calls the flow runtime itself: its header,
/// and libbunkai-flow.so linked with an rpath.
fn flow_cc_with_runtime(name: &str, flags: &[&str], out: &Path) {
    let lib = runtime_dir();
    let (i, l, r) = (format!("-I{}", root().join("flow/include").display()), format!("-L{}", lib.display()), format!("-Wl,-rpath,{}", lib.display()));
    let mut all: Vec<&str> = flags.to_vec();
    all.extend([i.as_str(), l.as_str(), "-lbunkai-flow", r.as_str()]);
    flow_cc(name, &all, out);
}

/// A program that `bunkai flow weave` can reach: libbunkai-host (its module
/// socket started) and libbunkai-flow preloaded, its buffers in `bufs`,
/// stdin and stdout piped.
fn spawn_weavable(exe: &Path, bufs: &Path) -> std::process::Child {
    let lib = runtime_dir();
    Command::new(exe)
        .env("BUNKAI_HOST", "1")
        .env("LD_PRELOAD", format!("{} {}", lib.join("libbunkai-host.so").display(), lib.join("libbunkai-flow.so").display()))
        .env("BUNKAI_FLOW_DIR", bufs)
        .env("BUNKAI_FLOW_IDS", bufs.join("ids"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map(|c| {
            kill_after(&c, DEADLINE, &exe.display().to_string());
            c
        })
        .unwrap()
}

/// spawn_weavable, with its pid as text and its stdin and stdout apart.
fn weavable_session(
    exe: &Path,
    bufs: &Path,
) -> (std::process::Child, String, std::process::ChildStdin, std::io::BufReader<std::process::ChildStdout>) {
    let mut srv = spawn_weavable(exe, bufs);
    let pid = srv.id().to_string();
    let input = srv.stdin.take().unwrap();
    let output = std::io::BufReader::new(srv.stdout.take().unwrap());
    (srv, pid, input, output)
}

/// pktserver (or a build of it) started weavable, its buffers in a new
/// directory `bufs` under dir, once it has said "ready".
fn pktserver_session(
    exe: &Path,
    dir: &Path,
) -> (std::process::Child, String, std::process::ChildStdin, std::io::BufReader<std::process::ChildStdout>, PathBuf) {
    use std::io::BufRead;
    let bufs = dir.join("bufs");
    std::fs::create_dir(&bufs).unwrap();
    let (srv, pid, input, mut output) = weavable_session(exe, &bufs);
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (srv, pid, input, output, bufs)
}

fn aspect(name: &str) -> PathBuf {
    program(&format!("flow/aspects/{name}.xml"))
}

/// `bunkai flow check` on the packets program: what each pointcut of a
/// good aspect selects, and bad aspects refused with the line and column.
#[test]
fn check_selects_join_points_and_refuses_bad_aspects() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("packets");
    flow_cc("packets", &["-O2"], &exe);
    let good = aspect("packets");
    let o = bunkai_ok(&["flow", "check", "--json", good.to_str().unwrap(), "--program", exe.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    let pcs = v["pointcuts"].as_array().unwrap();
    let count = |what: &str| -> Vec<(String, u64)> {
        let p = pcs.iter().find(|p| p["what"] == what).unwrap_or_else(|| panic!("{what}: {v}"));
        p["joinpoints"].as_array().unwrap().iter().map(|j| (j["function"].as_str().unwrap().to_string(), j["line"].as_u64().unwrap())).collect()
    };
    // start: p->data = buf in pkt_alloc; transit: the two n->len = skb->len
    // accesses; quit: free(p->data); the advice: every access to a pkt.
    assert_eq!(count("xflow pktflow start 1"), vec![("pkt_alloc".to_string(), line_of("packets", "p->data = buf;"))]);
    let clone_line = line_of("packets", "n->len = skb->len;");
    assert_eq!(count("xflow pktflow transit 1"), vec![("pkt_clone".to_string(), clone_line); 2]);
    assert_eq!(count("xflow pktflow quit 1"), vec![("pkt_free".to_string(), line_of("packets", "free(p->data);"))]);
    let jps = points(&exe);
    let pkt_accesses = jps.iter().filter(|j| j["struct"] == "pkt").count();
    assert_eq!(count("advice 1").len(), pkt_accesses);
    assert!(pkt_accesses >= 10);
    let text = String::from_utf8(bunkai_ok(&["flow", "check", good.to_str().unwrap()]).stdout).unwrap();
    assert_eq!(text, format!("{}: ok: 1 advice, 1 xflow (pktflow)\n", good.display()));

    // Bad aspects: each problem on its own line, the last one the error.
    let src = std::fs::read_to_string(&good).unwrap();
    let bad = |name: &str, from: &str, to: &str, progs: &[&str]| -> String {
        assert!(src.contains(from), "{from}");
        let p = d.path().join(format!("{name}.xml"));
        std::fs::write(&p, src.replace(from, to)).unwrap();
        let mut args = vec!["flow", "check", p.to_str().unwrap()];
        for x in progs {
            args.extend(["--program", x]);
        }
        let (_, err) = bunkai_fails(&args);
        for l in err.trim_end().lines() {
            assert!(l.starts_with(&format!("bunkai flow: {}:", p.display())), "{err}");
        }
        err
    };
    let e = exe.to_str().unwrap();
    let err = bad("unknown", "xflow(pktflow, p, id)", "xflow(pkflow, p, id)", &[]);
    assert!(err.contains("unknown.xml:17:45: unknown xflow pkflow (defined here: pktflow)"), "{err}");
    let err = bad("invisible", "<copy from=\"skb\" to=\"n\" />", "<copy from=\"skb\" to=\"next\" />", &[e]);
    assert!(
        err.contains("invisible.xml:10:5: xflow pktflow transit 1: variable next is not visible at ")
            && err.contains(&format!("packets.c:{clone_line} in pkt_clone and 1 more join points (visible there: skb, n)")),
        "{err}"
    );
    let err = bad("nowhere", "within_function(pkt_free)", "within_function(pkt_freed)", &[e]);
    assert!(err.contains("nowhere.xml:13:36: xflow pktflow quit 1: the pointcut selects no join point in "), "{err}");
    // the term that selects nothing, with the nearest name the program has
    assert!(err.contains(": no join point is in a function pkt_freed (did you mean pkt_free?)"), "{err}");
    let err = bad("member", "access(pkt.data) AND within_function(pkt_free)", "access(pkt.dat) AND within_function(pkt_free)", &[e]);
    assert!(err.contains("member.xml:13:15: ") && err.contains("no access to member dat of struct pkt is a join point (did you mean data?)"), "{err}");
    let err = bad("strukt", "access(pkt.data) AND within_function(pkt_free)", "access(packet.data) AND within_function(pkt_free)", &[e]);
    assert!(err.contains("no access to struct packet is a join point"), "{err}");
    let err = bad("together", "access(pkt.data) AND within_function(pkt_free)", "within_function(pkt_alloc) AND within_function(pkt_free)", &[e]);
    assert!(err.contains("together.xml:13:15: ") && err.contains("each of its terms selects join points, but no join point satisfies them together"), "{err}");
    let err = bad("host", "within_function(pkt_free)", "within_function(pkt_free@dom0)", &[e]);
    assert!(err.contains("host.xml:13:36: no program is on host dom0 (give --program EXE@dom0)"), "{err}");
    let with_host = format!("{e}@dom0");
    bunkai_ok(&["flow", "check", d.path().join("host.xml").to_str().unwrap(), "--program", &with_host]);
    let err = bad("syntax", "access(pkt.%) AND target(p)", "access(pkt.%) target(p)", &[]);
    one_line(&err);
    assert!(err.contains("syntax.xml:17:27: unexpected \"target(p)\""), "{err}");
    // an element left open is named where it was opened
    let err = bad("xml", "</quit>", "", &[]);
    one_line(&err);
    assert!(err.contains("xml.xml:12:3: <quit> is not closed before </xflow> (line 15) (add </quit>)"), "{err}");
    let err = bad("noadvice", "</advice>", "", &[]);
    one_line(&err);
    assert!(err.contains("noadvice.xml:16:1: <advice> is never closed (add </advice>)"), "{err}");
    let err = bad("nobefore", "</before>", "", &[]);
    one_line(&err);
    assert!(err.contains("nobefore.xml:18:3: <before> is never closed (add </before> after its code)"), "{err}");
}

/// records.c (built with the runtime in dir) run over n packets with its
/// five functions' entry join points recorded, its buffers (BUNKAI_FLOW_BUF
/// buf) in dir/bufs: returns the program and the buffer directory.
fn records_run(dir: &Path, n: usize, buf: &str) -> (PathBuf, PathBuf) {
    records_run_with(dir, n, buf, &[])
}

fn records_run_with(dir: &Path, n: usize, buf: &str, env: &[(&str, &str)]) -> (PathBuf, PathBuf) {
    let exe = dir.join("records");
    flow_cc_with_runtime("records", &["-O2"], &exe);
    let jps = points(&exe);
    let entry = |f: &str| -> String {
        jps.iter().find(|j| j["kind"] == "entry" && j["function"] == f).unwrap_or_else(|| panic!("{f}"))["index"].to_string()
    };
    let bufs = dir.join("bufs");
    std::fs::create_dir(&bufs).unwrap();
    let mut args = vec![n.to_string()];
    args.extend(["pkt_alloc", "pkt_clone", "front_send", "back_recv", "pkt_free"].iter().map(|f| entry(f)));
    let out = Command::new(&exe)
        .args(&args)
        .env("BUNKAI_FLOW_DIR", &bufs)
        .env("BUNKAI_FLOW_IDS", bufs.join("ids"))
        .env("BUNKAI_FLOW_BUF", buf)
        .envs(env.iter().copied())
        .output_within(DEADLINE);
    assert!(out.status.success(), "{out:?}");
    (exe, bufs)
}

/// `bunkai ARGS` with its buffers in `bufs`, which must succeed.
fn bunkai_in(bufs: &Path, args: &[&str]) -> std::process::Output {
    let o = Command::new(bunkai()).args(args).env("BUNKAI_FLOW_DIR", bufs).output_within(DEADLINE);
    assert!(o.status.success(), "bunkai {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
    o
}

/// A process that exits with keys still in a flow table (objects that ended
/// without their quit: records.c's RECORDS_LEAK leaves 3 clones' keys) gets
/// a warning in `report` naming the table, the count and a key with its
/// flow, and `live_at_exit` in --json; one that removed every key gets
/// none; the runtime's record about it is no step of any flow. (The shared
/// library writes it at exit; records links libbunkai-flow.so.)
#[test]
fn report_warns_of_keys_left_in_a_table_at_exit() {
    let d = tempfile::tempdir().unwrap();
    let (_, bufs) = records_run_with(d.path(), 30, "1M", &[("RECORDS_LEAK", "3")]);
    let text = String::from_utf8(bunkai_in(&bufs, &["flow", "report", "--all"]).stdout).unwrap();
    let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(warnings[0].contains("exited with 3 keys still in flow table pktflow (key 0x") && warnings[0].contains("add a <quit>"), "{text}");
    let v: Value = serde_json::from_slice(&bunkai_in(&bufs, &["flow", "report", "--all", "--json"]).stdout).unwrap();
    let l = v["live_at_exit"].as_array().unwrap();
    assert_eq!(l.len(), 1, "{v}");
    assert_eq!((l[0]["table"].as_str(), l[0]["live"].as_u64()), (Some("pktflow"), Some(3)), "{v}");
    assert_eq!(l[0]["sample"].as_array().unwrap().len(), 3, "{v}");
    // the leaked clones' flows are flows like the others: 30 packets, 30 flows
    assert_eq!(v["flows"].as_array().unwrap().len(), 30, "{v}");
    let flows: Vec<&str> = v["flows"].as_array().unwrap().iter().map(|f| f["flow"].as_str().unwrap()).collect();
    for s in l[0]["sample"].as_array().unwrap() {
        assert!(flows.contains(&s["flow"].as_str().unwrap()), "{s} is not one of the flows");
    }
    // every key removed: no warning
    let d2 = tempfile::tempdir().unwrap();
    let (_, clean) = records_run(d2.path(), 30, "1M");
    let text = String::from_utf8(bunkai_in(&clean, &["flow", "report", "--all"]).stdout).unwrap();
    assert!(!text.contains("warning:"), "{text}");
}

/// Reading buffers shows a count of the bytes read on a terminal (here
/// after 0 ms instead of a second, BUNKAI_PROGRESS_AFTER_MS), and nothing
/// when stderr is not one, or under --json.
#[test]
fn report_shows_its_reading_on_a_terminal_only() {
    let d = tempfile::tempdir().unwrap();
    let (_, bufs) = records_run(d.path(), 30, "1M");
    let report = format!("{} flow report --all > /dev/null", bunkai().display());
    let tty = Command::new("script")
        .args(["-qec", &report, "/dev/null"])
        .env("BUNKAI_FLOW_DIR", &bufs)
        .env("BUNKAI_PROGRESS_AFTER_MS", "0")
        .output_within(DEADLINE);
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{shown}");
    assert!(shown.contains("reading ") && shown.contains(" read ("), "no progress on a terminal: {shown:?}");
    for json in [false, true] {
        let mut c = Command::new(bunkai());
        c.args(["flow", "report", "--all"]).env("BUNKAI_FLOW_DIR", &bufs).env("BUNKAI_PROGRESS_AFTER_MS", "0");
        if json {
            c.arg("--json");
        }
        let o = c.output_within(DEADLINE);
        assert!(o.status.success(), "{o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains(" read ("), "progress on a pipe: {err:?}");
    }
}

/// `bunkai flow dump` and `report` on the buffers of a real two-process
/// run (records.c does by hand what woven advice does): every flow's
/// timeline crosses from the front end to the back end, and the Chrome and
/// OpenTelemetry exports hold every step.
#[test]
fn dump_and_report_follow_flows_across_processes() {
    let d = tempfile::tempdir().unwrap();
    let n = 30;
    let wall = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let started = wall();
    let (exe, bufs) = records_run(d.path(), n, "1M");
    let ended = wall();
    let with_dir = |args: &[&str]| -> std::process::Output {
        let o = Command::new(bunkai()).args(args).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        o
    };

    // dump: two processes' buffers, every record complete
    let v: Value = serde_json::from_slice(&with_dir(&["flow", "dump", "--json"]).stdout).unwrap();
    let b = v["buffers"].as_array().unwrap();
    assert_eq!(b.len(), 2, "{v}");
    let clones = (n + 2) / 3;
    let counts: Vec<usize> = b.iter().map(|x| x["records"].as_array().unwrap().len()).collect();
    let (front, back) = if counts[0] > counts[1] { (0, 1) } else { (1, 0) };
    assert_eq!(counts[front], n + clones + n + clones); // alloc, clone, send, free of the clones
    assert_eq!(counts[back], 2 * n); // recv, free
    for x in b {
        assert_eq!((x["dropped"].as_u64(), x["incomplete"].as_u64(), x["unwritten"].as_u64()), (Some(0), Some(0), Some(0)));
        assert_eq!(x["exe"], exe.to_str().unwrap());
        // times (the TSC where the kernel keeps time by it, converted by
        // dump) lie within the run, in order in each single-threaded process
        let ns: Vec<u64> = x["records"].as_array().unwrap().iter().map(|r| r["ns"].as_u64().unwrap()).collect();
        assert!(ns.iter().all(|&t| (started..=ended).contains(&t)), "times {ns:?} outside the run {started}..{ended}");
        assert!(ns.windows(2).all(|w| w[0] <= w[1]), "times out of order: {ns:?}");
    }

    // report: a flow per packet, crossing the processes in order
    let v: Value = serde_json::from_slice(&with_dir(&["flow", "report", "--all", "--json"]).stdout).unwrap();
    let flows = v["flows"].as_array().unwrap();
    assert_eq!(flows.len(), n);
    let line = |f: &str| line_of("records", &format!("{f}(")) ;
    let mut six = 0;
    for f in flows {
        let steps = f["steps"].as_array().unwrap();
        let names: Vec<&str> = steps.iter().map(|s| s["function"].as_str().unwrap()).collect();
        assert_eq!(names[0], "pkt_alloc", "{f}");
        assert!(names.contains(&"front_send") && names.contains(&"back_recv"), "{f}");
        let send = names.iter().position(|&x| x == "front_send").unwrap();
        let recv = names.iter().position(|&x| x == "back_recv").unwrap();
        assert!(send < recv, "{f}");
        assert_ne!(steps[send]["pid"], steps[recv]["pid"], "{f}");
        assert_eq!(steps[recv]["pid"], b[back]["pid"]);
        for s in steps {
            let fname = s["function"].as_str().unwrap();
            assert_eq!(s["line"].as_u64().unwrap(), line(fname), "{s}");
            assert!(s["file"].as_str().unwrap().ends_with("records.c"));
        }
        let el: Vec<f64> = steps.iter().map(|s| s["elapsed_us"].as_f64().unwrap()).collect();
        assert!(el.windows(2).all(|w| w[0] <= w[1]) && el[0] == 0.0, "{el:?}");
        match steps.len() {
            6 => six += 1,
            4 => {}
            k => panic!("{k} steps: {f}"),
        }
    }
    assert_eq!(six, clones, "flows with a clone");

    // one flow, and the exports
    let first = flows[0]["flow"].as_str().unwrap().to_string();
    let chrome = d.path().join("trace.json");
    let otel = d.path().join("otel.json");
    let o = with_dir(&["flow", "report", "--all", "--flow", &first, "--chrome", chrome.to_str().unwrap(), "--otel", otel.to_str().unwrap()]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.starts_with(&format!("flow {first}: ")), "{text}");
    assert!(text.contains("records.c:") && text.contains("back_recv") && text.contains("elapsed [us]"), "{text}");
    let c: Value = serde_json::from_slice(&std::fs::read(&chrome).unwrap()).unwrap();
    let ev = c["traceEvents"].as_array().unwrap();
    let steps = flows[0]["steps"].as_array().unwrap().len();
    assert_eq!(ev.iter().filter(|e| e["ph"] == "X").count(), steps);
    assert_eq!(ev.iter().filter(|e| e["ph"] == "s").count(), 1);
    assert_eq!(ev.iter().filter(|e| e["ph"] == "f").count(), 1);
    let o: Value = serde_json::from_slice(&std::fs::read(&otel).unwrap()).unwrap();
    let spans: Vec<&Value> = o["resourceSpans"].as_array().unwrap().iter().flat_map(|r| r["scopeSpans"][0]["spans"].as_array().unwrap()).collect();
    assert_eq!(spans.len(), steps);
    assert!(spans.iter().all(|s| s["traceId"] == spans[0]["traceId"] && s["traceId"].as_str().unwrap().len() == 32));
    assert_eq!(spans.iter().filter(|s| s.get("parentSpanId").is_none()).count(), 1);

    // bad input: one line each
    let mut data = std::fs::read(&b[front]["file"].as_str().map(PathBuf::from).unwrap()).unwrap();
    data[384 + 8] = 12; // the first record's size (after the writer's chunk head)
    let bad = d.path().join("bad.buf");
    std::fs::write(&bad, &data).unwrap();
    let (_, err) = bunkai_fails(&["flow", "dump", bad.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("offset 0x188: record size 12"), "{err}");
    let (_, err) = bunkai_fails(&["flow", "report", exe.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("not a bunkai flow buffer"), "{err}");
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = Command::new(bunkai()).args(["flow", "report"]).env("BUNKAI_FLOW_DIR", &empty).output_within(DEADLINE);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    one_line(&err);
    assert!(err.contains("no bunkai-flow.*.buf in"), "{err}");
}

/// A buffer directory with little room (a 1 MiB tmpfs) and a large buffer
/// asked for: the program must not die of SIGBUS when the file system
/// fills; the buffers shrink to fit and count what they drop.
#[test]
fn a_full_buffer_directory_costs_records_not_the_program() {
    if !need_root("a_full_buffer_directory_costs_records_not_the_program", "mounting a tmpfs") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("records");
    flow_cc_with_runtime("records", &["-O2"], &exe);
    let tiny = d.path().join("tiny");
    std::fs::create_dir(&tiny).unwrap();
    let st = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "none"]).arg(&tiny).status_within(DEADLINE);
    assert!(st.success());
    let out = Command::new(&exe)
        .args(["20000", "0", "0", "0", "0", "0"])
        .env("BUNKAI_FLOW_DIR", &tiny)
        .env("BUNKAI_FLOW_IDS", tiny.join("ids"))
        .env("BUNKAI_FLOW_BUF", "64M")
        .output_within(DEADLINE);
    let dump = Command::new(bunkai()).args(["flow", "dump", "--json"]).env("BUNKAI_FLOW_DIR", &tiny).output_within(DEADLINE);
    let _ = Command::new("umount").arg(&tiny).status_within(DEADLINE);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "back end: 20000 packets\nfront end: 20000 packets, 1024 clones\n");
    let v: Value = serde_json::from_slice(&dump.stdout).unwrap();
    let b = v["buffers"].as_array().unwrap();
    assert_eq!(b.len(), 2);
    for x in b {
        assert!(x["dropped"].as_u64().unwrap() > 0 && !x["records"].as_array().unwrap().is_empty(), "{x}");
        assert!(x["capacity"].as_u64().unwrap() < 1 << 20);
    }
}

/// bkf_weave / bkf_unweave in a running program: three threads work on
/// struct items while every sled of the workload is woven and unwoven 300
/// times, every other time vector-free (bkf_weave_ex, no XSAVE); the
/// results are those of the unwoven run, every call comes from the sled it
/// names with the XSAVE area its mode promises, and none comes after the
/// last unweave.
#[test]
fn weaving_and_unweaving_under_load_changes_nothing_but_the_calls() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("weave");
    flow_cc_with_runtime("weave", &["-O2", "-pthread"], &exe);
    let sleds: Vec<String> = points(&exe)
        .iter()
        .filter(|j| j["function"] == "step" || j["function"] == "worker")
        .map(|j| format!("{:#x}", j["sled_addr"].as_u64().unwrap()))
        .collect();
    assert!(sleds.len() >= 10, "{sleds:?}");
    let run = |mode: &str| -> String {
        let o = Command::new(&exe).arg(mode).arg("300").args(&sleds).output_within(DEADLINE);
        assert!(o.status.success(), "{mode}: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let plain = run("plain");
    let woven = run("woven");
    let workers = |s: &str| s.lines().filter(|l| l.starts_with("worker ")).map(String::from).collect::<Vec<_>>();
    assert_eq!(workers(&plain).len(), 3);
    assert_eq!(workers(&woven), workers(&plain), "{woven}");
    assert!(woven.contains("not a sled: refused\n"), "{woven}");
    assert!(woven.contains("weave: 0, again: refused\n"), "{woven}");
    assert!(woven.contains("unknown flag: refused\n"), "{woven}");
    assert!(woven.contains("rounds 300, failed 0, calls seen, vector-free calls seen, bad 0, calls after unweave 0\n"), "{woven}");
}

/// `bunkai flow emit`: the advice module an aspect makes for the packets
/// program compiles, is a module bunkai mod reads, and does at each join
/// point what the xflow definition says (start, copy, quit) before the
/// advice.
#[test]
fn emit_generates_a_module_that_compiles() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("packets");
    flow_cc("packets", &["-O2"], &exe);
    let c = d.path().join("pk.c");
    bunkai_ok(&["flow", "emit", aspect("packets").to_str().unwrap(), "--program", exe.to_str().unwrap(), "-o", c.to_str().unwrap()]);
    let src = std::fs::read_to_string(&c).unwrap();
    let obj = d.path().join("pk.o");
    let st = Command::new("clang-14")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-c"])
        .arg(format!("-I{}", root().join("flow/include").display()))
        .arg(format!("-I{}", root().join("mod/include").display()))
        .arg(&c)
        .arg("-o")
        .arg(&obj)
        .status_within(DEADLINE);
    assert!(st.success(), "{src}");
    let info = String::from_utf8(bunkai_ok(&["mod", "info", obj.to_str().unwrap()]).stdout).unwrap();
    assert!(info.starts_with("flow_packets 1 "), "{info}");
    assert!(info.contains("bkf_weave") && info.contains("register_flowid"), "{info}");
    // each part where its pointcut is, the xflow's code before the advice.
    // A case's labels name its parts in order, one comment line each, and
    // the parts' code follows in the same order (cases with the same code
    // share it: the labels of several sleds, then one body; the body's
    // `case`, then a `/* sled K: join point J */` line a sled)
    let block = |what: &str| -> String {
        let at = src.find(&format!("/* {what} ")).unwrap_or_else(|| panic!("{what}: {src}"));
        let line_start = src[..at].rfind('\n').unwrap() + 1;
        let comment = src[line_start..].lines().next().unwrap().to_string();
        let after: Vec<&str> = src[line_start..].lines().collect();
        // this part's place among the comment lines of its case
        let before = src[..line_start].lines().rev().take_while(|l| l.starts_with("    /* ")).count();
        let rest = after
            .iter()
            .skip_while(|l| l.starts_with("    /* ") || l.starts_with("  case ") || l.starts_with("  /* sled "))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n");
        let part = rest.split("\n    }\n").nth(before).unwrap_or_else(|| panic!("{what}: part {before} of {rest}"));
        format!("{comment}\n{part}")
    };
    let start = block("xflow pktflow start 1");
    assert!(start.contains("pkt_alloc */") && start.contains("register_flowid(T_pktflow, key__, get_new_flowid())"), "{start}");
    let transit = block("xflow pktflow transit 1");
    assert!(transit.contains("pkt_clone */") && transit.contains("register_flowid(T_pktflow, to__, id__)"), "{transit}");
    assert!(!transit.contains("remove_flowid"), "a copy keeps the source's ID: {transit}");
    let quit = block("xflow pktflow quit 1");
    assert!(quit.contains("pkt_free */") && quit.contains("remove_flowid(T_pktflow, key__)"), "{quit}");
    assert!(src.find("xflow pktflow start 1").unwrap() < src.find("advice 1 (line").unwrap());
    assert!(src.contains("STORE_DATA3(bkf_pc__, tsc, id)"), "$pc$ becomes the sled's address");
    // what the handler gets for each sled is its join point above its
    // body's case (no table a sled in the handler): each sled's comment
    // names the join point its value carries, under the case of its body
    let bits: u32 = src.split("uint32_t bkf_jp__ = k__ >> ").nth(1).and_then(|r| r.split(';').next()).and_then(|b| b.parse().ok()).expect(&src);
    let vals: Vec<u64> = src.split("static const uint32_t CASE__[").nth(1).unwrap().split_once("= {").unwrap().1.split('}').next().unwrap().split(", ").map(|v| v.parse().unwrap()).collect();
    let mut body = None;
    let mut seen = 0;
    for l in src.lines() {
        if let Some(b) = l.strip_prefix("  case ").and_then(|r| r.strip_suffix(':')) {
            body = Some(b.parse::<u64>().unwrap());
        } else if let Some((k, j)) = l.strip_prefix("  /* sled ").and_then(|r| r.split_once(": join point ")) {
            let (k, j): (usize, u64) = (k.parse().unwrap(), j.trim_end_matches(" */").parse().unwrap());
            assert_eq!(vals[k], j << bits | body.unwrap(), "sled {k}: {l}");
            seen += 1;
        }
    }
    assert!(seen == vals.len() && seen > 0 && !src.contains("JP__"), "{src}");

    // <after> in a program built without sleds after its accesses: the
    // place and the option that gives them
    let after = d.path().join("after.xml");
    std::fs::write(&after, std::fs::read_to_string(aspect("packets")).unwrap().replace("<before>", "<after>").replace("</before>", "</after>")).unwrap();
    let (_, err) = bunkai_fails(&["flow", "emit", after.to_str().unwrap(), "--program", exe.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("after.xml:") && err.contains("has none (build it with `bunkai flow cc -mllvm -bunkai-flow-after`)"), "{err}");
    let bad = d.path().join("bad.xml");
    std::fs::write(&bad, std::fs::read_to_string(aspect("packets")).unwrap().replace("xflow(pktflow, p, id)", "xflow(nope, p, id)")).unwrap();
    let (_, err) = bunkai_fails(&["flow", "emit", bad.to_str().unwrap(), "--program", exe.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("unknown xflow nope") && err.contains("bunkai flow check"), "{err}");
}

/// `bunkai flow weave` and `unweave` on a running server (pktserver.c, the
/// packets workload driven by stdin) started with libbunkai-host and
/// libbunkai-flow preloaded: its answers never change, the woven round
/// leaves one flow per packet it allocated, and weaving and unweaving five
/// times while it is busy with a long request loses nothing.
#[test]
fn weave_and_unweave_a_running_server() {
    use std::io::{BufRead, Write};
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("pktserver");
    flow_cc("pktserver", &["-O2"], &exe);
    let bufs = d.path().join("bufs");
    std::fs::create_dir(&bufs).unwrap();
    // the expected answers, from a plain run
    let plain = Command::new(&exe).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let script = "go 50\ngo 300000\ngo 50\n";
    let mut plain = plain;
    plain.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let want: Vec<String> = String::from_utf8(plain.wait_with_output().unwrap().stdout).unwrap().lines().skip(1).map(String::from).collect();
    assert_eq!(want.len(), 3);

    let (mut srv, pid, mut input, mut output) = weavable_session(&exe, &bufs);
    let mut line = String::new();
    let mut next = |line: &mut String| {
        line.clear();
        output.read_line(line).unwrap();
        line.trim_end().to_string()
    };
    assert_eq!(next(&mut line), "ready");
    let pk = aspect("packets");
    let weave = || bunkai_ok(&["flow", "weave", "--pid", &pid, pk.to_str().unwrap()]);
    let unweave = || bunkai_ok(&["flow", "unweave", "--pid", &pid]);

    let o = weave();
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("bunkai flow: woven flow_packets into "), "{o:?}");
    input.write_all(b"go 50\n").unwrap();
    assert_eq!(next(&mut line), want[0]);
    unweave();
    let (_, err) = bunkai_fails(&["flow", "unweave", "--pid", &pid]);
    one_line(&err);
    assert!(err.contains("nothing is woven"), "{err}");
    let flows: Value = serde_json::from_slice(
        &Command::new(bunkai()).args(["flow", "report", "--all", "--json"]).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE).stdout,
    )
    .unwrap();
    let flows = flows["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 50, "one flow per packet allocated while woven");
    for f in flows {
        assert_eq!(f["steps"][0]["function"], "pkt_alloc", "{f}");
    }

    // under load: a long request, woven and unwoven five times meanwhile
    input.write_all(b"go 300000\n").unwrap();
    for _ in 0..5 {
        weave();
        unweave();
    }
    assert_eq!(next(&mut line), want[1]);
    input.write_all(b"go 50\n").unwrap();
    assert_eq!(next(&mut line), want[2]);
    drop(input);
    assert!(srv.wait().unwrap().success());

    // a process without the module socket
    let (_, err) = bunkai_fails(&["flow", "weave", "--pid", &std::process::id().to_string(), pk.to_str().unwrap()]);
    one_line(&err);
}

/// xin_move / xout_move across a ring (Fig. 4's netfront -> netback): the
/// woven ring program packs each packet's flow ID into its request header
/// and the back end takes it out; the report (IDs compared on the 56 bits
/// the header carries) follows every packet from front_alloc through
/// front_send to back_recv, and the program's answers do not change. Every
/// sled is guarded but the start: the xout's guard reads the header member
/// for an ID; when that member is a bitfield (no offsetof), the xout's
/// sled is woven unguarded and the flows are the same.
#[test]
fn flow_ids_cross_a_ring_in_a_header_field() {
    flow_ids_cross_the_ring(false);
    flow_ids_cross_the_ring(true);
}

fn flow_ids_cross_the_ring(bitfield: bool) {
    use std::io::{BufRead, Write};
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("ring");
    let progs = root().join("tests/programs/flow");
    let def = if bitfield { "-DRING_TAG_BITFIELD" } else { "-DRING_TAG_PLAIN" };
    flow_cc("ring", &["-O2", def, &format!("-I{}", progs.display())], &exe);
    let bufs = d.path().join("bufs");
    std::fs::create_dir(&bufs).unwrap();
    let (mut srv, pid, mut input, mut output) = weavable_session(&exe, &bufs);
    let mut ask = |cmd: &str| -> String {
        let mut l = String::new();
        if !cmd.is_empty() {
            input.write_all(cmd.as_bytes()).unwrap();
        }
        output.read_line(&mut l).unwrap();
        l
    };
    assert_eq!(ask(""), "ready\n");
    let plain = ask("go 20\n");
    let cflags = format!("{def} -include {}", progs.join("ring.h").display());
    let o = bunkai_ok(&["flow", "weave", "-v", "--pid", &pid, aspect("ring").to_str().unwrap(), "--cflags", &cflags]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let sleds: usize = out.split(" sleds (").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    // the start; the xout's two sleds (back_recv reads and clears the tag)
    // when the member is a bitfield
    let unguarded = if bitfield { 3 } else { 1 };
    assert!(out.contains(&format!(" sleds ({} guarded)", sleds - unguarded)), "{out}{err}");
    assert_eq!(err.contains("2 xout sleds unguarded"), bitfield, "{err}");
    assert_eq!(ask("go 20\n"), plain);
    bunkai_ok(&["flow", "unweave", "--pid", &pid]);
    assert_eq!(ask("go 20\n"), plain);
    drop(input);
    assert!(srv.wait().unwrap().success());

    let report = |bits: &str| -> Vec<Value> {
        let o = Command::new(bunkai()).args(["flow", "report", "--all", "--json", "--id-bits", bits]).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE);
        assert!(o.status.success(), "{o:?}");
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["flows"].as_array().unwrap().clone()
    };
    let flows = report("56");
    assert_eq!(flows.len(), 20, "{flows:?}");
    if !bitfield {
        // the picture: the first 12 flows, a dot per step, each function named
        let svg = d.path().join("flows.svg");
        let o = Command::new(bunkai())
            .args(["flow", "report", "--all", "--id-bits", "56", "--svg", svg.to_str().unwrap()])
            .env("BUNKAI_FLOW_DIR", &bufs)
            .output_within(DEADLINE);
        assert!(o.status.success(), "{o:?}");
        let pic = std::fs::read_to_string(&svg).unwrap();
        let doc = roxmltree::Document::parse(&pic).unwrap_or_else(|e| panic!("not XML: {e}\n{pic}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(str::trim).collect();
        assert!(texts.iter().any(|t| t.contains("12 of 20 flows")), "{texts:?}");
        // a dot per step, each with its hover text
        let steps: usize = flows[..12].iter().map(|f| f["steps"].as_array().unwrap().len()).sum();
        let dots: Vec<_> = doc.descendants().filter(|n| n.has_tag_name("circle")).collect();
        assert_eq!(dots.len(), steps);
        assert!(dots.iter().all(|d| d.children().any(|c| c.has_tag_name("title"))), "a dot without its hover text");
        for f in ["front_alloc", "front_send", "back_recv", "back_free"] {
            assert_eq!(texts.iter().filter(|t| **t == f).count(), 12, "{f} named once per flow");
        }
        // titled time axes with round ticks, the legend, and the overview
        // of the 12 flows on one clock
        assert_eq!(texts.iter().filter(|t| **t == "µs since the flow's first step").count(), 12, "{texts:?}");
        assert!(texts.iter().any(|t| t.starts_with("a step, in its process's colour")), "{texts:?}");
        assert!(texts.iter().any(|t| t.starts_with("overview: the 12 flows")), "{texts:?}");
        assert!(texts.iter().filter(|t| **t == "0").count() >= 13, "{texts:?}");
    }
    for f in &flows {
        let names: Vec<&str> = f["steps"].as_array().unwrap().iter().map(|s| s["function"].as_str().unwrap()).collect();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap_or_else(|| panic!("{n} missing: {f}"));
        assert!(at("front_alloc") < at("front_send") && at("front_send") < at("back_recv"), "{f}");
    }
    // compared on all 64 bits, the cut IDs make each packet two flows
    assert_eq!(report("64").len(), 40);
}

/// The split-driver case study, one command (bench/flow/splitdrv.py) on 200
/// packets: the front end and the back end (another network namespace)
/// woven at run time, every packet one flow from alloc_skb in the front
/// end through the ring to kfree_skb in the back end.
#[test]
fn split_driver_case_study_follows_every_packet_across_the_ring() {
    if !need_root("split_driver_case_study_follows_every_packet_across_the_ring", "the case study's network namespace") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (md, js) = (d.path().join("out.md"), d.path().join("out.json"));
    let o = Command::new("python3")
        .arg(root().join("bench/flow/splitdrv.py"))
        .args(["--packets", "200", "--out", md.to_str().unwrap(), "--json", js.to_str().unwrap()])
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output_within(DEADLINE);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&std::fs::read(&js).unwrap()).unwrap();
    let flows = v["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 200);
    for f in flows {
        let steps = f["steps"].as_array().unwrap();
        let pids: std::collections::BTreeSet<u64> = steps.iter().map(|s| s["pid"].as_u64().unwrap()).collect();
        assert_eq!(pids.len(), 2, "{f}");
        let names: Vec<&str> = steps.iter().map(|s| s["function"].as_str().unwrap()).collect();
        assert_eq!(names[0], "alloc_skb", "{f}");
        assert_eq!(*names.last().unwrap(), "kfree_skb", "{f}");
        assert!(names.contains(&"net_tx_action") && names.contains(&"dev_queue_xmit"), "{f}");
    }
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(text.contains("200 cross from the front end to the back end"), "{text}");
    let left = String::from_utf8(Command::new("ip").args(["netns", "list"]).output_within(DEADLINE).stdout).unwrap();
    assert!(!left.contains("bk-flow-"), "{left}");
}

/// Debian's memcached, from its source package (scripts/fetch-memcached.sh,
/// which `make test` runs): the plain build and the `bunkai flow cc` build.
fn memcached(variant: &str) -> PathBuf {
    let p = root().join("build/third_party/memcached").join(format!("memcached-{variant}"));
    assert!(p.exists(), "{} is missing (run make fetch-memcached)", p.display());
    p
}

/// A free loopback port (bound, then let go, for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A server the test started, killed when the test ends, also by a failed
/// assertion (it would otherwise outlive the test, holding its stderr).
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts memcached on 127.0.0.1:port (one worker thread) and waits, with
/// a deadline, until it accepts connections.
fn start_memcached(exe: &Path, port: u16, weavable_bufs: Option<&Path>) -> Server {
    let mut cmd = Command::new(exe);
    cmd.args(["-U", "0", "-l", "127.0.0.1", "-p", &port.to_string(), "-t", "1", "-m", "64", "-u", "root"]);
    if let Some(bufs) = weavable_bufs {
        let lib = runtime_dir();
        cmd.env("BUNKAI_HOST", "1")
            .env("LD_PRELOAD", format!("{} {}", lib.join("libbunkai-host.so").display(), lib.join("libbunkai-flow.so").display()))
            .env("BUNKAI_FLOW_DIR", bufs)
            .env("BUNKAI_FLOW_IDS", bufs.join("ids"));
    }
    let mut child = Server(cmd.stdout(std::process::Stdio::null()).spawn().unwrap());
    kill_after(&child.0, DEADLINE, &describe(&cmd));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(child.0.try_wait().unwrap().is_none(), "{} exited before it listened", exe.display());
        assert!(std::time::Instant::now() < deadline, "{} does not listen on {port}", exe.display());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}


/// Polls `flow report` (deadline 20 s) until `n` flows in `bufs` have
/// reached resp_finish: the client has its reply once the worker's write
/// is done, and the worker releases the reply only after that.
fn mc_flows_finished(bufs: &Path, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let o = Command::new(bunkai()).args(["flow", "report", "--all", "--json"]).env("BUNKAI_FLOW_DIR", bufs).output_within(DEADLINE);
        let done = serde_json::from_slice::<Value>(&o.stdout).ok().map_or(0, |rep| {
            rep["flows"].as_array().map_or(0, |fs| {
                fs.iter().filter(|f| f["steps"].as_array().and_then(|s| s.last()).and_then(|s| s["function"].as_str()) == Some("resp_finish")).count()
            })
        });
        if done >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{done} of {n} memcached flows reached resp_finish within 20 s: {o:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn memcaslap(port: u16, ops: u32) -> String {
    let o = Command::new("memcaslap")
        .args(["-s", &format!("127.0.0.1:{port}"), "-T", "1", "-c", "8", "-x", &ops.to_string()])
        .output_within(DEADLINE);
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The real-server case study: Debian's memcached built with `bunkai flow
/// cc` answers as the plain build does; woven at run time with
/// aspects/memcached.xml it still does, and each request becomes one flow
/// from its read buffer (try_read_command_ascii) through its reply objects
/// to their release (resp_finish). Woven with --no-guard (every pass calls
/// the handler), the same requests leave the same records at the same
/// places: the sleds' guards lose nothing. Woven and unwoven
/// five times under memcaslap's load, it serves every operation and answers
/// the same after.
#[test]
fn memcached_requests_are_followed_from_read_buffer_to_reply() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let plain = start_memcached(&memcached("plain"), port, None);
    let want = mc_session(port);
    drop(plain);
    assert_eq!(want[1], "VALUE greeting 0 5\r\nhello\r\nEND\r\n");
    assert_eq!(want[6], "VALUE greeting 0 11\r\nhello world\r\nVALUE n 0 2\r\n42\r\nEND\r\n");

    let bufs = d.path().join("bufs");
    std::fs::create_dir(&bufs).unwrap();
    let port = free_port();
    let srv = start_memcached(&memcached("flow"), port, Some(&bufs));
    let pid = srv.0.id().to_string();
    assert_eq!(mc_session(port), want, "flow cc build, nothing woven");
    let asp = aspect("memcached");
    let o = bunkai_ok(&["flow", "weave", "--pid", &pid, asp.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("vector-free trampoline"), "{out}");
    // every sled but the flow's start is filtered on the flow
    let n = |what: &str| -> usize {
        let at = out.find(what).unwrap_or_else(|| panic!("no '{what}' in {out}"));
        out[..at].rsplit(|c: char| !c.is_ascii_digit()).next().and_then(|d| d.parse().ok()).unwrap_or_else(|| panic!("{out}"))
    };
    let (sleds, guarded) = (n(" sleds ("), n(" guarded)"));
    assert!(guarded > 0 && guarded < sleds, "{out}");
    assert_eq!(mc_session(port), want, "woven");
    // the worker writes the reply before it releases it: wait for each
    // request's resp_finish before unweaving, or the last one's is cut off
    mc_flows_finished(&bufs, MC_SESSION.len());
    bunkai_ok(&["flow", "unweave", "--pid", &pid]);
    // the same in JSON, for scripts
    let o = bunkai_ok(&["flow", "weave", "--no-guard", "--json", "--pid", &pid, asp.to_str().unwrap()]);
    let w: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("weave --json: {e}: {o:?}"));
    assert_eq!(w["guarded"], 0, "{w}");
    assert_eq!(w["sleds"].as_u64(), Some(sleds as u64), "{w}");
    assert_eq!(w["pid"].as_u64(), Some(srv.0.id() as u64), "{w}");
    let module = w["woven"].as_str().unwrap().to_string();
    assert_eq!(mc_session(port), want, "woven without guards");
    mc_flows_finished(&bufs, 2 * MC_SESSION.len());
    let o = bunkai_ok(&["flow", "unweave", "--json", "--pid", &pid]);
    let u: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("unweave --json: {e}: {o:?}"));
    assert_eq!(u["unwoven"].as_str(), Some(module.as_str()), "{u}");

    let rep: Value = serde_json::from_slice(&Command::new(bunkai()).args(["flow", "report", "--all", "--json"]).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE).stdout).unwrap();
    let flows = rep["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 2 * MC_SESSION.len(), "one flow per request: {rep}");
    let places = |f: &Value| -> Vec<(String, u64)> {
        f["steps"].as_array().unwrap().iter().map(|s| (s["function"].as_str().unwrap().to_string(), s["line"].as_u64().unwrap())).collect()
    };
    for (g, u) in flows[..MC_SESSION.len()].iter().zip(&flows[MC_SESSION.len()..]) {
        assert_eq!(places(g), places(u), "guarded and unguarded weaves recorded different places");
    }
    for (f, (req, _)) in flows.iter().zip(MC_SESSION) {
        let steps = f["steps"].as_array().unwrap();
        let fns: Vec<&str> = steps.iter().map(|s| s["function"].as_str().unwrap()).collect();
        assert_eq!(fns[0], "try_read_command_ascii", "{req:?}: {fns:?}");
        assert_eq!(*fns.last().unwrap(), "resp_finish", "{req:?}: {fns:?}");
        assert!(fns.contains(&"_transmit_pre"), "{req:?}: {fns:?}");
        if req.starts_with("get greeting") {
            assert!(fns.contains(&"process_get_command"), "{req:?}: {fns:?}");
        }
    }

    // under load: memcaslap while the aspect is woven and unwoven five times
    let load = std::thread::spawn(move || memcaslap(port, 400_000));
    for _ in 0..5 {
        bunkai_ok(&["flow", "weave", "--pid", &pid, asp.to_str().unwrap()]);
        bunkai_ok(&["flow", "unweave", "--pid", &pid]);
    }
    let out = load.join().unwrap();
    assert!(out.contains("Ops: 400000 "), "memcaslap did not get every answer: {out}");
    assert_eq!(mc_session(port), want, "after the load");
    drop(srv);
}

/// With sleds after the accesses and at the returns too, every sled
/// patched: the program behaves the same, the sled after a load finds what
/// it read ($value) and a return's sled the value returned ($retval) where
/// the table says.
#[test]
fn after_sleds_find_the_loaded_value_where_the_table_says() {
    let d = tempfile::tempdir().unwrap();
    let (plain, patched, hits) = patched_run_with("packets", &["-mllvm", "-bunkai-flow-after"], d.path());
    assert_eq!(plain, patched, "packets with every sled, before and after, patched");
    let copy = line_of("packets", "n->len = skb->len;");
    let values: Vec<u64> = hits
        .iter()
        .filter(|(f, line, what, access, _)| f == "pkt_clone" && *line == copy && what == "pkt.len" && access == "load")
        .filter_map(|h| h.4.get("$value").copied())
        .collect();
    // packets.c clones packet i when i % 7 == 0; packet i has 16 + i % 50 bytes
    let want: Vec<u64> = (0..100u64).filter(|i| i % 7 == 0).map(|i| 16 + i % 50).collect();
    assert_eq!(values.iter().map(|v| v & 0xffff_ffff).collect::<Vec<_>>(), want, "what pkt_clone's load of skb->len read");
    // before-only hits have no $value
    assert!(hits.iter().filter(|h| h.3 == "store").all(|h| !h.4.contains_key("$value")));
    // exit sleds: checksum's return finds the checksum main prints, and
    // each function with an exit runs it as often as its entry
    let printed: u64 = plain.stdout.trim().rsplit(' ').next().unwrap().parse().unwrap();
    let rets: Vec<u64> = hits.iter().filter(|h| h.0 == "checksum" && h.3 == "exit").map(|h| h.4["$retval"]).collect();
    assert_eq!(rets, vec![printed], "checksum's $retval");
    for f in ["pkt_alloc", "pkt_clone", "queue_push", "checksum", "pkt_free"] {
        let n = |a: &str| hits.iter().filter(|h| h.0 == f && h.3 == a).count();
        assert!(n("entry") > 0 && n("entry") == n("exit"), "{f}: {} entries, {} exits", n("entry"), n("exit"));
    }
    // pkt_alloc returns the packet it filled: its exit's $retval is the
    // $base of its stores
    let allocs: Vec<u64> = hits.iter().filter(|h| h.0 == "pkt_alloc" && h.3 == "exit").map(|h| h.4["$retval"]).collect();
    let mut stored: Vec<u64> = hits.iter().filter(|h| h.0 == "pkt_alloc" && h.2 == "pkt.next" && h.3 == "store").map(|h| h.4["$base"]).collect();
    stored.dedup(); // the store's sleds before and after it
    assert!(allocs.len() == 100 && allocs == stored, "{} exits, {} stores", allocs.len(), stored.len());
}

/// Returns a sled may not precede, with every sled patched: a musttail
/// call's return gets no exit sled (the program builds: the IR verifier
/// would refuse one), the other returns do and find the value returned.
#[test]
fn exit_sleds_leave_musttail_calls_alone() {
    let d = tempfile::tempdir().unwrap();
    let (plain, patched, hits) = patched_run_with("tailcall", &["-mllvm", "-bunkai-flow-after"], d.path());
    assert_eq!(plain, patched, "tailcall with every sled patched");
    assert_eq!(plain.stdout, "5 5 2 2\n");
    let jps = points(&d.path().join("tailcall-2"));
    let exits = |f: &str| jps.iter().filter(|j| j["function"] == f && j["access"] == "exit").count();
    assert_eq!((exits("step"), exits("leaf"), exits("keep")), (1, 1, 1), "step's musttail return has no exit sled");
    let n = |f: &str, a: &str| hits.iter().filter(|h| h.0 == f && h.3 == a).count();
    assert_eq!((n("step", "entry"), n("step", "exit")), (2, 1), "the second call of step returns through its exit sled");
    let rets = |f: &str| hits.iter().filter(|h| h.0 == f && h.3 == "exit").map(|h| h.4["$retval"] & 0xffff_ffff).collect::<Vec<_>>();
    assert_eq!((rets("leaf"), rets("step"), rets("keep")), (vec![5], vec![5], vec![2]));
}

/// `<after>` on a function entry runs at the function's returns (the
/// paper's after-return; exit sleds come with `-bunkai-flow-after`), once per
/// call, after `<before>` at its entry, and `local_var($retval, r)` points at
/// the value returned: here checksum's result, which the program prints.
#[test]
fn after_advice_on_a_function_entry_runs_at_its_returns_with_the_value_returned() {
    use std::io::{BufRead, Write};
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("pktserver-after");
    flow_cc("pktserver", &["-O2", "-mllvm", "-bunkai-flow-after"], &exe);
    let jps = points(&exe);
    let exits: Vec<&Value> = jps.iter().filter(|j| j["access"] == "exit").collect();
    for x in &exits {
        assert!(x["kind"] == "entry" && x["after"] == true, "{x}");
        assert!(
            jps.iter().any(|e| e["access"] == "entry" && e["function"] == x["function"]),
            "an exit without its function's entry: {x}"
        );
    }
    let cs: Vec<&&Value> = exits.iter().filter(|x| x["function"] == "checksum").collect();
    assert!(!cs.is_empty(), "checksum has no exit sled");
    for x in &cs {
        assert!(x["operands"].as_array().unwrap().iter().any(|o| o["name"] == "$retval"), "{x}");
    }
    // a function that returns nothing has exits without $retval
    let free: Vec<&&Value> = exits.iter().filter(|x| x["function"] == "pkt_free").collect();
    assert!(!free.is_empty() && free.iter().all(|x| x["operands"].as_array().unwrap().iter().all(|o| o["name"] != "$retval")));

    let asp = d.path().join("exit.xml");
    std::fs::write(
        &asp,
        "<advice>\n  <pointcut>within_function(checksum) AND NOT access(pkt.%) AND NOT access(queue.%) AND local_var($retval, r)</pointcut>\n  \
         <before>STORE_DATA2($pc$, 3);</before>\n  <after>STORE_DATA3($pc$, 4, *(uint64_t *)r);</after>\n</advice>\n",
    )
    .unwrap();
    // $retval where nothing is returned: refused, naming the place
    let bad = d.path().join("bad.xml");
    std::fs::write(
        &bad,
        "<advice>\n  <pointcut>within_function(pkt_free) AND NOT access(pkt.%) AND local_var($retval, r)</pointcut>\n  \
         <after>STORE_DATA1(r);</after>\n</advice>\n",
    )
    .unwrap();
    let (_, err) = bunkai_fails(&["flow", "check", bad.to_str().unwrap(), "--program", exe.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("$retval") && err.contains("pkt_free") && err.contains(":2:"), "{err}");

    let (mut srv, pid, mut input, mut output, bufs) = pktserver_session(&exe, d.path());
    let mut line = String::new();
    bunkai_ok(&["flow", "weave", "--pid", &pid, asp.to_str().unwrap()]);
    let mut sums = Vec::new();
    for n in [3, 5, 2] {
        input.write_all(format!("go {n}\n").as_bytes()).unwrap();
        line.clear();
        output.read_line(&mut line).unwrap();
        sums.push(line.trim().rsplit(' ').next().unwrap().parse::<u64>().unwrap_or_else(|_| panic!("{line}")));
    }
    bunkai_ok(&["flow", "unweave", "--pid", &pid]);
    drop(input);
    assert!(srv.wait().unwrap().success());

    let dump: Value = serde_json::from_slice(&Command::new(bunkai()).args(["flow", "dump", "--json"]).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE).stdout).unwrap();
    let recs = dump["buffers"][0]["records"].as_array().unwrap();
    // in buffer order: entry, exit with the sum, once per call
    let seq: Vec<(u64, Option<u64>)> = recs.iter().map(|r| (r["values"][1].as_u64().unwrap(), r["values"].get(2).and_then(|v| v.as_u64()))).collect();
    let want: Vec<(u64, Option<u64>)> = sums.iter().flat_map(|&s| [(3, None), (4, Some(s))]).collect();
    assert_eq!(seq, want, "records {recs:?}");
    for r in recs {
        let jp = &jps[r["jp"].as_u64().unwrap() as usize];
        assert_eq!(jp["function"], "checksum", "{r}");
        assert_eq!(jp["access"], if r["values"][1] == 3 { "entry" } else { "exit" }, "{r} ran at {jp}");
    }
}

/// `<after>` advice: `-mllvm -bunkai-flow-after` puts a second sled right
/// after each access. Woven into the running packet server, an advice's
/// `<before>` code runs at the sled before each selected load and its
/// `<after>` code at the one after it, where `local_var($value, v)` sees
/// what the load read; the answers do not change. A program built without
/// those sleds is refused by check with the option to use.
#[test]
fn after_advice_runs_after_the_access_and_sees_the_loaded_value() {
    use std::io::{BufRead, Write};
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("pktserver-after");
    flow_cc("pktserver", &["-O2", "-mllvm", "-bunkai-flow-after"], &exe);
    let plain = d.path().join("pktserver");
    flow_cc("pktserver", &["-O2"], &plain);

    // every after sled of an access follows a before sled of the same
    // access (the exit sleds at returns have a test of their own)
    let jps = points(&exe);
    let afters: Vec<&Value> = jps.iter().filter(|j| j["after"] == true && j["access"] != "exit").collect();
    assert!(afters.len() >= 10, "{} after sleds", afters.len());
    for a in &afters {
        assert_eq!(a["kind"], "access", "{a}");
        assert!(
            jps.iter().any(|b| b["after"] == false
                && b["struct"] == a["struct"]
                && b["member"] == a["member"]
                && b["line"] == a["line"]
                && b["sled_addr"].as_u64() < a["sled_addr"].as_u64()),
            "no sled before {a}"
        );
    }
    assert!(points(&plain).iter().all(|j| j["after"] == false));

    let asp = d.path().join("after.xml");
    std::fs::write(
        &asp,
        "<advice>\n  <pointcut>access(pkt.len) AND within_function(checksum) AND local_var($value, v)</pointcut>\n  \
         <before>STORE_DATA2($pc$, 1);</before>\n  <after>STORE_DATA3($pc$, 2, *(uint64_t *)v);</after>\n</advice>\n",
    )
    .unwrap();
    let (_, err) = bunkai_fails(&["flow", "check", asp.to_str().unwrap(), "--program", plain.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("-bunkai-flow-after"), "{err}");

    let want = {
        let mut p = Command::new(&plain).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
        p.stdin.take().unwrap().write_all(b"go 3\n").unwrap();
        String::from_utf8(p.wait_with_output().unwrap().stdout).unwrap()
    };
    let (mut srv, pid, mut input, mut output, bufs) = pktserver_session(&exe, d.path());
    let mut line = String::new();
    // woven twice: vector-free (the default for this advice), then with
    // --full-state; -v says which trampoline and why
    for (opts, said, why) in [
        (vec!["-v"], "vector-free trampoline", "the advice is vector-free"),
        (vec!["-v", "--full-state"], "full-state trampoline", "full-state trampoline (XSAVE/XRSTOR): --full-state"),
    ] {
        let mut args = vec!["flow", "weave"];
        args.extend(&opts);
        args.extend(["--pid", &pid, asp.to_str().unwrap()]);
        let o = bunkai_ok(&args);
        assert!(String::from_utf8_lossy(&o.stdout).contains(said), "{o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(why), "{o:?}");
        input.write_all(b"go 3\n").unwrap();
        line.clear();
        output.read_line(&mut line).unwrap();
        assert_eq!(format!("ready\n{line}"), want, "woven ({said}), the answer is the same");
        bunkai_ok(&["flow", "unweave", "--pid", &pid]);
    }
    drop(input);
    assert!(srv.wait().unwrap().success());

    // --summary: the counts without the records
    let summary: Value = serde_json::from_slice(&Command::new(bunkai()).args(["flow", "dump", "--json", "--summary"]).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE).stdout).unwrap();
    assert!(summary["buffers"][0].get("records").is_none(), "{summary}");
    let dump: Value = serde_json::from_slice(&Command::new(bunkai()).args(["flow", "dump", "--json"]).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE).stdout).unwrap();
    let recs = dump["buffers"][0]["records"].as_array().unwrap();
    assert_eq!(summary["buffers"][0]["record_count"].as_u64().unwrap() as usize, recs.len());
    let side = |k: u64| recs.iter().filter(move |r| r["values"][1] == k).collect::<Vec<_>>();
    let (before, after) = (side(1), side(2));
    assert!(!before.is_empty() && before.len() == after.len(), "{} before, {} after", before.len(), after.len());
    // go 3: packets of 16, 17 and 18 bytes, and a clone of the first
    let mut lens: Vec<u64> = after.iter().map(|r| r["values"][2].as_u64().unwrap() & 0xffff_ffff).collect();
    lens.sort();
    lens.dedup();
    assert_eq!(lens, vec![16, 17, 18], "the lengths the loads read");
    // each record names its join point: <after> code ran at after sleds only
    for (recs, at_after) in [(&before, false), (&after, true)] {
        for r in recs {
            let jp = &jps[r["jp"].as_u64().unwrap() as usize];
            assert_eq!(jp["after"], at_after, "{r} ran at {jp}");
            assert_eq!(jp["function"], "checksum", "{r}");
        }
    }
}

/// The xin field must fit in the header member it names: the join-point
/// table records each member's width, so check refuses bits 4..16 of the
/// split driver's 16-bit `flags` with the line of the `<field>`, and takes
/// the paper's bits 4..15.
#[test]
fn check_refuses_an_xin_field_wider_than_its_member() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("splitdrv");
    let inc = format!("-I{}", program("flow").display());
    flow_cc("splitdrv", &["-O2", &inc], &exe);
    let good = aspect("splitdrv");
    bunkai_ok(&["flow", "check", good.to_str().unwrap(), "--program", exe.to_str().unwrap()]);
    let text = std::fs::read_to_string(&good).unwrap();
    assert!(text.contains(r#"<field name="flags" offset="4" size="12" />"#));
    let wide = d.path().join("wide.xml");
    std::fs::write(&wide, text.replace(r#"offset="4" size="12""#, r#"offset="4" size="13""#)).unwrap();
    let (_, err) = bunkai_fails(&["flow", "check", wide.to_str().unwrap(), "--program", exe.to_str().unwrap()]);
    one_line(&err);
    let line = text.lines().position(|l| l.contains("<field name=\"flags\"")).unwrap() + 1;
    assert!(err.contains(&format!("wide.xml:{line}:")), "{err}");
    assert!(err.contains("field flags: bits 4..16 overflow netif_tx_request.flags, which is 16 bits wide"), "{err}");
}

/// `check --program` compiles the advice as weave would, and a C error in
/// it is reported at the aspect's own line and column (the module's
/// `#line` directives), not in a generated temp file; the generated code
/// around it (xin/xout) is left unchecked without the header's struct, and
/// check says so, and checks it with --cflags.
#[test]
fn check_reports_c_errors_at_the_aspects_line() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("packets");
    flow_cc("packets", &["-O2"], &exe);
    let text = std::fs::read_to_string(aspect("packets")).unwrap();
    let bad = d.path().join("bad.xml");
    std::fs::write(&bad, text.replace("STORE_DATA3($pc$, tsc, id);", "STORE_DATA3($pc$, tsc, idd);")).unwrap();
    let line = text.lines().position(|l| l.contains("STORE_DATA3")).unwrap() + 1;
    let (_, err) = bunkai_fails(&["flow", "check", bad.to_str().unwrap(), "--program", exe.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains(&format!("bad.xml:{line}:")), "{err}");
    assert!(err.contains("use of undeclared identifier 'idd'"), "{err}");
    // what weave compiles names the aspect's lines too
    let c = String::from_utf8(bunkai_ok(&["flow", "emit", bad.to_str().unwrap(), "--program", exe.to_str().unwrap()]).stdout).unwrap();
    let before = text.lines().position(|l| l.contains("<before>")).unwrap() + 1;
    assert!(c.contains(&format!("#line {before} \"{}\"", bad.display())), "{c}");
    // xin/xout: the header's struct comes from --cflags
    let inc = format!("-I{}", program("flow").display());
    let drv = d.path().join("splitdrv");
    flow_cc("splitdrv", &["-O2", &inc], &drv);
    let sd = aspect("splitdrv");
    let o = bunkai_ok(&["flow", "check", sd.to_str().unwrap(), "--program", drv.to_str().unwrap()]);
    let note = String::from_utf8_lossy(&o.stderr);
    assert!(note.contains("was not compiled") && note.contains("--cflags"), "{note}");
    let header = format!("-include {}", program("flow").join("splitdrv.h").display());
    let o = bunkai_ok(&["flow", "check", sd.to_str().unwrap(), "--program", drv.to_str().unwrap(), "--cflags", &header]);
    assert!(o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Every aspect the tests and benchmarks weave passes `bunkai flow check`
/// by itself (syntax, flow names, fields): the benchmarks' aspects (Apache's
/// among them) are not woven by any test, and must not rot unseen.
#[test]
fn every_bundled_aspect_passes_check() {
    let dir = root().join("tests/programs/flow/aspects");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "xml"))
        .collect();
    names.sort();
    assert!(names.len() >= 12, "{names:?}");
    for p in &names {
        let o = Command::new(bunkai()).args(["flow", "check", "--json"]).arg(p).output_within(DEADLINE);
        assert!(o.status.success(), "{}: {}", p.display(), String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["ok"], true, "{}: {v}", p.display());
    }
}

/// A buffer that fills drops the records after it: `report` says so per
/// process (text, --json, and both exports) and marks the flows that had
/// steps there, instead of showing cut-short flows as complete.
#[test]
fn report_says_what_was_dropped_and_marks_the_flows() {
    let d = tempfile::tempdir().unwrap();
    let (_, bufs) = records_run(d.path(), 3000, "16K"); // far too small for 3,000 packets
    let with_dir = |args: &[&str]| -> std::process::Output {
        let o = Command::new(bunkai()).args(args).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        o
    };
    let dump: Value = serde_json::from_slice(&with_dir(&["flow", "dump", "--json"]).stdout).unwrap();
    let dropped: std::collections::BTreeMap<u64, u64> = dump["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["pid"].as_u64().unwrap(), b["dropped"].as_u64().unwrap()))
        .collect();
    assert!(dropped.values().any(|&n| n > 0), "nothing dropped with a 16 KiB buffer: {dropped:?}");

    let v: Value = serde_json::from_slice(&with_dir(&["flow", "report", "--all", "--json"]).stdout).unwrap();
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), dropped.len(), "{v}");
    for p in procs {
        assert_eq!(p["dropped"].as_u64(), dropped.get(&p["pid"].as_u64().unwrap()).copied(), "{p}");
    }
    let flows = v["flows"].as_array().unwrap();
    assert!(!flows.is_empty());
    for f in flows {
        let touched_a_full_buffer = f["steps"].as_array().unwrap().iter().any(|s| dropped[&s["pid"].as_u64().unwrap()] > 0);
        assert_eq!(f["maybe_cut_short"].as_bool(), Some(touched_a_full_buffer), "{f}");
    }

    let text = String::from_utf8(with_dir(&["flow", "report", "--all"]).stdout).unwrap();
    for (pid, n) in dropped.iter().filter(|(_, &n)| n > 0) {
        let line = text.lines().find(|l| l.contains(&format!("/{pid} ("))).unwrap_or_else(|| panic!("no line for pid {pid}:\n{text}"));
        let n = n.to_string().as_bytes().rchunks(3).rev().map(|c| std::str::from_utf8(c).unwrap()).collect::<Vec<_>>().join(",");
        assert!(line.contains(&format!("dropped {n} record")) && line.contains("16 KiB") && line.contains("BUNKAI_FLOW_BUF"), "{line}");
    }
    assert!(text.lines().any(|l| l.starts_with("flow ") && l.ends_with(", cut short?")), "{text}");

    let (chrome, otel) = (d.path().join("c.json"), d.path().join("o.json"));
    with_dir(&["flow", "report", "--all", "--chrome", chrome.to_str().unwrap(), "--otel", otel.to_str().unwrap()]);
    let c = std::fs::read_to_string(&chrome).unwrap();
    assert!(c.contains("records dropped"), "the Chrome trace names no drops");
    let o: Value = serde_json::from_str(&std::fs::read_to_string(&otel).unwrap()).unwrap();
    let attrs: Vec<&Value> = o["resourceSpans"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resource"]["attributes"].as_array().unwrap())
        .filter(|a| a["key"] == "bunkai.flow.dropped_records")
        .collect();
    assert!(!attrs.is_empty() && attrs.iter().any(|a| a["value"]["intValue"] != "0"), "{attrs:?}");
    // flows that passed a full buffer are marked in both exports too
    let cut = v["flows"].as_array().unwrap().iter().filter(|f| f["maybe_cut_short"] == true).count();
    assert!(cut > 0);
    let c: Value = serde_json::from_str(&c).unwrap();
    let marked: std::collections::BTreeSet<&str> = c["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["maybe_cut_short"] == true)
        .map(|e| e["args"]["flow"].as_str().unwrap())
        .collect();
    assert_eq!(marked.len(), cut, "Chrome events marked cut short");
    let spans: std::collections::BTreeSet<&str> = o["resourceSpans"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["scopeSpans"][0]["spans"].as_array().unwrap())
        .filter(|s| s["attributes"].as_array().unwrap().iter().any(|a| a["key"] == "bunkai.flow.maybe_cut_short"))
        .map(|s| s["traceId"].as_str().unwrap())
        .collect();
    assert_eq!(spans.len(), cut, "OTLP traces marked cut short");
}

/// `flow clean` removes the buffers of ended processes and keeps those of
/// running ones (unless --all); --dry-run removes nothing.
#[test]
fn clean_removes_only_ended_processes_buffers() {
    let d = tempfile::tempdir().unwrap();
    let bufs = d.path().join("bufs");
    std::fs::create_dir(&bufs).unwrap();
    // two ended processes (a child that has exited, its pid not reused yet)
    // and a running one (this test)
    let mut gone = Vec::new();
    for _ in 0..2 {
        let mut c = Command::new("true").spawn().unwrap();
        gone.push(c.id());
        c.wait().unwrap();
    }
    let me = std::process::id();
    for pid in gone.iter().chain([&me]) {
        std::fs::write(bufs.join(format!("bunkai-flow.{pid}.buf")), vec![1u8; 8192]).unwrap();
    }
    std::fs::write(bufs.join("other.txt"), "not a buffer").unwrap();
    // an ended process's buffer that another user owns: theirs to clean
    let theirs = need_root("clean_removes_only_ended_processes_buffers", "a file of another user (chown)").then(|| {
        let mut c = Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        let f = bufs.join(format!("bunkai-flow.{}.buf", c.id()));
        std::fs::write(&f, vec![1u8; 8192]).unwrap();
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
        f
    });
    let names = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&bufs).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    };
    let run = |args: &[&str]| -> String {
        let o = Command::new(bunkai()).args(args).env("BUNKAI_FLOW_DIR", &bufs).output_within(DEADLINE);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let before = names();
    let out = run(&["flow", "clean", "--dry-run", "--json"]);
    assert_eq!(names(), before, "--dry-run --json removed something");
    let j: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("clean --json: {e}: {out}"));
    let mut pids: Vec<u64> = j["removed"].as_array().unwrap().iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    pids.sort();
    let mut want_pids: Vec<u64> = gone.iter().map(|&p| p as u64).collect();
    want_pids.sort();
    assert_eq!(pids, want_pids, "{j}");
    assert_eq!((j["dry_run"].as_bool(), j["kept"].as_u64()), (Some(true), Some(1)), "{j}");
    let out = run(&["flow", "clean", "--dry-run"]);
    assert_eq!(names(), before, "--dry-run removed something");
    assert!(out.contains("would remove 2 buffers") && out.contains("kept 1 of running processes"), "{out}");
    let out = run(&["flow", "clean"]);
    assert!(out.contains("removed 2 buffers") && out.contains("kept 1"), "{out}");
    if let Some(f) = &theirs {
        assert!(out.contains("and 1 of other users"), "{out}");
        assert!(f.exists(), "clean removed another user's buffer");
        std::fs::remove_file(f).unwrap();
    }
    let mut want = vec![format!("bunkai-flow.{me}.buf"), "other.txt".to_string()];
    want.sort();
    assert_eq!(names(), want);
    let out = run(&["flow", "clean", "--all"]);
    assert!(out.contains("removed 1 buffer "), "{out}");
    assert_eq!(names(), ["other.txt"]);
    let out = run(&["flow", "clean"]);
    assert!(out.contains("removed 0 buffers"), "{out}");
}

/// A process weave cannot reach is told apart from the others, each with its
/// fix: no host library loaded, the library loaded without BUNKAI_HOST=1, a
/// process that has ended (unweave), all one line.
#[test]
fn weave_says_why_a_process_has_no_host() {
    use std::io::BufRead;
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("pktserver");
    flow_cc("pktserver", &["-O2"], &exe);
    let lib = runtime_dir();
    let pk = aspect("packets");
    let start = |env: &[(&str, String)]| -> std::process::Child {
        let mut c = Command::new(&exe);
        c.envs(env.iter().map(|(k, v)| (*k, v.clone())))
            .env("BUNKAI_FLOW_DIR", d.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        kill_after(&child, DEADLINE, "pktserver");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        child
    };
    let preload = format!("{} {}", lib.join("libbunkai-host.so").display(), lib.join("libbunkai-flow.so").display());
    // the fix: the whole start line when the library is missing, only
    // BUNKAI_HOST=1 when the preload is there already
    for (env, want, fix) in [
        (vec![], "libbunkai-host.so is not loaded in it", "BUNKAI_HOST=1 LD_PRELOAD="),
        (vec![("LD_PRELOAD", preload.clone())], "BUNKAI_HOST=1 is not in its environment", "restart it with BUNKAI_HOST=1 beside its LD_PRELOAD"),
    ] {
        let mut srv = start(&env);
        let pid = srv.id().to_string();
        let (_, err) = bunkai_fails(&["flow", "weave", "--pid", &pid, pk.to_str().unwrap()]);
        one_line(&err);
        assert!(err.contains(want) && err.contains(fix), "{err}");
        if !env.is_empty() {
            assert!(!err.contains("LD_PRELOAD=\""), "the preload is there: {err}");
        }
        let (_, err) = bunkai_fails(&["flow", "unweave", "--pid", &pid]);
        assert!(err.contains(want), "{err}");
        srv.kill().unwrap();
        srv.wait().unwrap();
        let (_, err) = bunkai_fails(&["flow", "unweave", "--pid", &pid]);
        one_line(&err);
        assert!(err.contains(&format!("no process {pid} (it has ended")), "{err}");
    }
}

/// Weaving an aspect that is woven already says how to take it out (not a
/// mod swap of a deleted temp file); the same aspect under another name,
/// over the same sleds, names the clash instead of "init returned -1". The
/// program is unharmed: the first weave still works and unweaves.
#[test]
fn weaving_twice_says_what_to_do() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("pktserver");
    flow_cc("pktserver", &["-O2"], &exe);
    let (mut srv, pid, _input, _output, _bufs) = pktserver_session(&exe, d.path());
    let pk = aspect("packets");
    bunkai_ok(&["flow", "weave", "--pid", &pid, pk.to_str().unwrap()]);
    let (_, err) = bunkai_fails(&["flow", "weave", "--pid", &pid, pk.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("flow_packets is woven into process") && err.contains(&format!("bunkai flow unweave --pid {pid} --name flow_packets")), "{err}");
    let (_, err) = bunkai_fails(&["flow", "weave", "--pid", &pid, "--name", "flow_again", pk.to_str().unwrap()]);
    one_line(&err);
    assert!(err.contains("another aspect is woven over some of them") && !err.contains("returned -1"), "{err}");
    let o = bunkai_ok(&["flow", "unweave", "--pid", &pid]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("unwoven flow_packets"), "{o:?}");
    srv.kill().unwrap();
    srv.wait().unwrap();
}
