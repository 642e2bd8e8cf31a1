//! End-to-end tests of `bunkai scatter profile`, `scatter group`, `scatter
//! serve` and `scatter run` (seed 000, §5–6): the SQLite shell profiled with one
//! workload, grouped, served over HTTP on loopback and run from its URL.

use bunkai_e2e::*;
use std::process::Command;

fn bunkai_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(bunkai());
    c.args(args);
    c
}

fn bunkai_serve_url(line: &str) -> Option<String> {
    line.starts_with("http://").then(|| line.trim().to_string())
}

/// python3 -m http.server prints "Serving HTTP on 127.0.0.1 port N (http://127.0.0.1:N/) ...".
fn python_url(line: &str) -> Option<String> {
    let start = line.find("(http://")? + 1;
    let end = line[start..].find(')')? + start;
    Some(line[start..end].to_string())
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

#[test]
fn sqlite_profiled_grouped_and_run_over_http() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    scatter_sqlite(&out);
    let o = out.to_str().unwrap();
    let orig = out.join("original/sqlite3");
    let query = program("sqlite/workload-query.sql");
    let full = program("sqlite/full.sql");

    // Profile with the query workload only.
    let p = run_with_stdin(&mut bunkai_cmd(&["scatter", "profile", o, "--", d.path().join("p.db").to_str().unwrap()]), Some(&query));
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    let prof = std::fs::read_to_string(out.join("profile")).unwrap();
    let called = prof.lines().filter(|l| !l.starts_with('#') && l.contains('\t')).count();
    assert!(called > 100, "the profile saw only {called} functions");

    // Group at 64 KiB: every function in exactly one group, files on disk.
    let g = json(&bunkai_ok(&["scatter", "group", o, "--threshold", "64KiB", "--json"]));
    let groups = g["list"].as_array().unwrap();
    assert!(groups.len() >= 4, "{} groups", groups.len());
    let nfuncs = json(&bunkai_ok(&["scatter", "stats", o, "--json"]))["libraries"].as_u64().unwrap() as usize;
    let mut seen = vec![0; nfuncs];
    for gr in groups {
        let fs = gr["functions"].as_array().unwrap();
        for id in fs {
            seen[id.as_u64().unwrap() as usize] += 1;
        }
        let file = out.join(gr["file"].as_str().unwrap());
        assert_eq!(std::fs::metadata(&file).unwrap().len(), gr["raw_bytes"].as_u64().unwrap());
        assert!(file.with_extension("so.zst").exists());
        // §5.1: only a function larger than the threshold makes a group
        // larger than the threshold, and then it is alone.
        if fs.len() > 1 {
            assert!(gr["raw_bytes"].as_u64().unwrap() < 3 * 65536, "group {} is too big", gr["id"]);
        }
    }
    assert!(seen.iter().all(|n| *n == 1), "a function is in no group or in two");

    // Grouped, run locally: same behaviour on the big script.
    let want_full = behaviour(run_with_stdin(Command::new(&orig).arg(":memory:"), Some(&full)));
    let local = behaviour(run_with_stdin(Command::new(out.join("bin/sqlite3")).arg(":memory:"), Some(&full)));
    assert_eq!(want_full, local, "grouped SQLite behaves differently");

    // Over HTTP from bunkai scatter serve, preload + compression: the full script is
    // a wrong prediction (profiled with the query workload only).
    let srv = ServerProcess::start(&mut bunkai_cmd(&["scatter", "serve", o, "--listen", "127.0.0.1:0"]), bunkai_serve_url);
    let c1 = d.path().join("cache1");
    let net = behaviour(run_with_stdin(
        &mut bunkai_cmd(&["scatter", "run", &srv.url, "--cache", c1.to_str().unwrap(), "--", ":memory:"]),
        Some(&full),
    ));
    assert_eq!(want_full, net, "SQLite run over HTTP behaves differently");

    // The query workload on a database file, on demand, uncompressed.
    let db_orig = d.path().join("orig.db");
    let db_net = d.path().join("net.db");
    let want_q = behaviour(run_with_stdin(Command::new(&orig).arg(&db_orig), Some(&query)));
    let c2 = d.path().join("cache2");
    let got_q = behaviour(run_with_stdin(
        &mut bunkai_cmd(&[
            "scatter", "run", &srv.url, "--cache", c2.to_str().unwrap(), "--no-preload", "--no-compress", "--",
            db_net.to_str().unwrap(),
        ]),
        Some(&query),
    ));
    assert_eq!(want_q, got_q);
    assert_eq!(std::fs::read(&db_orig).unwrap(), std::fs::read(&db_net).unwrap(), "database files differ");
    // On demand without preload, only the groups it needed came down.
    let fetched = std::fs::read_dir(c2.join("lib/sqlite3"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".so"))
        .count();
    assert!(fetched < groups.len(), "fetched all {fetched} groups on demand");

    // Any static server works as the origin.
    let py = ServerProcess::start(
        Command::new("python3")
            .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", o]),
        python_url,
    );
    let c3 = d.path().join("cache3");
    let db_py = d.path().join("py.db");
    let got_py = behaviour(run_with_stdin(
        &mut bunkai_cmd(&["scatter", "run", &py.url, "--cache", c3.to_str().unwrap(), "--", db_py.to_str().unwrap()]),
        Some(&query),
    ));
    assert_eq!(want_q, got_py, "SQLite from python's http.server behaves differently");

    // A short program over HTTP, forty times with an empty cache: it exits
    // while the preload thread is still bringing groups, and must end with
    // its own status and output every time (the thread hashing a group
    // while exit tore OpenSSL down crashed 14 runs in 60).
    let one = d.path().join("one.sql");
    std::fs::write(&one, "select 1;\n").unwrap();
    for run in 1..=40 {
        let c = d.path().join(format!("short{run}"));
        let r = run_with_stdin(&mut bunkai_cmd(&["scatter", "run", &srv.url, "--cache", c.to_str().unwrap(), "--", ":memory:"]), Some(&one));
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(0), "short run {run}: {err}");
        assert_eq!(String::from_utf8_lossy(&r.stdout), "1\n", "short run {run}: {err}");
        std::fs::remove_dir_all(&c).unwrap();
    }

    // A corrupted group on the origin is refused and never lands in the
    // cache under its name: one line, exit 127.
    let libdir = out.join("lib/sqlite3");
    for name in ["g0.so", "g0.so.zst"] {
        let p = libdir.join(name);
        let mut b = std::fs::read(&p).unwrap();
        let mid = b.len() / 2;
        for x in &mut b[mid..mid + 16] {
            *x ^= 0x5a;
        }
        std::fs::write(&p, b).unwrap();
    }
    for (extra, cache) in [(None, "cache4"), (Some("--no-compress"), "cache5")] {
        let c = d.path().join(cache);
        let mut args = vec!["scatter", "run", &srv.url, "--cache", c.to_str().unwrap()];
        args.extend(extra);
        args.extend(["--", ":memory:"]);
        let r = run_with_stdin(&mut bunkai_cmd(&args), Some(&query));
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(127), "{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].starts_with("bunkai: ") && lines[0].contains("g0.so"), "{err}");
        assert!(lines[0].contains("SHA-256") || lines[0].contains("decompress"), "{err}");
        assert!(r.stdout.is_empty(), "the program ran: {}", String::from_utf8_lossy(&r.stdout));
        assert!(!c.join("lib/sqlite3/g0.so").exists(), "corrupted group written to the cache");
    }
    drop(py);
    drop(srv);
}

#[test]
fn profiles_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let srcs = [program("features/features.c"), program("features/other.c")];
    let a = d.path().join("a");
    let b = d.path().join("b");
    scatter(&a, &srcs, &[], &["-O0", "-lm", "-lpthread"]);
    scatter(&b, &srcs, &[], &["-O2", "-lm", "-lpthread"]);
    let (ao, bo) = (a.to_str().unwrap(), b.to_str().unwrap());

    let (code, err) = bunkai_fails(&["scatter", "group", bo, "--threshold", "4KiB"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("bunkai scatter: ") && err.contains("no profile") && err.contains("bunkai scatter profile"), "{err}");

    let p = run_with_stdin(&mut bunkai_cmd(&["scatter", "profile", ao, "--", d.path().join("x.txt").to_str().unwrap()]), None);
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    // --append merges a second run: the count of runs goes up, ids stay unique.
    let p = run_with_stdin(&mut bunkai_cmd(&["scatter", "profile", ao, "--append", "--", d.path().join("y.txt").to_str().unwrap()]), None);
    assert!(p.status.success());
    let prof = std::fs::read_to_string(a.join("profile")).unwrap();
    assert!(prof.contains("\nruns 2\n"), "{prof}");

    // A profile of another build is refused, with what to do.
    std::fs::copy(a.join("profile"), b.join("profile")).unwrap();
    let (_, err) = bunkai_fails(&["scatter", "group", bo, "--threshold", "4KiB"]);
    assert!(err.contains("another build") && err.contains("profile again"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!b.join("lib/features/groups.map").exists());

    // A damaged profile too.
    std::fs::write(b.join("profile"), "format bunkai-profile/1\nbuild zz\n").unwrap();
    let (_, err) = bunkai_fails(&["scatter", "group", bo]);
    assert!(err.contains("damaged"), "{err}");

    // Bad thresholds and URLs: one line each.
    let (code, err) = bunkai_fails(&["scatter", "group", ao, "--threshold", "lots"]);
    assert_eq!((code, err.lines().count()), (1, 1), "{err}");
    let (_, err) = bunkai_fails(&["scatter", "run", "ftp://example/x"]);
    assert!(err.starts_with("bunkai scatter: ") && err.contains("http://"), "{err}");
    let (_, err) = bunkai_fails(&["scatter", "serve", d.path().to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert!(err.contains("not a scatter output"), "{err}");

    // Grouped at a tiny threshold the program still behaves the same.
    bunkai_ok(&["scatter", "group", ao, "--threshold", "1KiB"]);
    let orig = a.join("original/features");
    let f1 = d.path().join("o1.txt");
    let f2 = d.path().join("o2.txt");
    let want = behaviour(run_with_stdin(Command::new(&orig).arg(&f1), None));
    let got = behaviour(run_with_stdin(Command::new(a.join("bin/features")).arg(&f2), None));
    assert_eq!(want, got);
    assert!(a.join("lib/features/g1.so").exists());

    // A damaged group map is one clear error, not a crash and never the
    // wrong function: 300 mutants (bytes flipped, fields set to other valid
    // values, a function moved to another group or slot, cut, extended),
    // each run; every run behaves as the original or exits 127 with one
    // line naming the map and the fix.
    let map = a.join("lib/features/groups.map");
    let good = std::fs::read(&map).unwrap();
    let nf = u32::from_le_bytes(good[8..12].try_into().unwrap()) as usize;
    let ng = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    assert!(ng >= 2, "the map needs two groups for this test ({ng})");
    let mut x = 0x9e3779b97f4a7c15u64;
    let mut next = move |n: usize| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        (x.wrapping_mul(0x2545F4914F6CDD1D) % n.max(1) as u64) as usize
    };
    let (mut refused, mut same) = (0, 0);
    for i in 0..300 {
        let mut m = good.clone();
        let put = |m: &mut Vec<u8>, at: usize, v: u32| m[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let how = match i % 6 {
            0 => {
                let at = next(m.len());
                m[at] ^= 1 << next(8);
                format!("bit at {at}")
            }
            1 => {
                let f = next(nf);
                let g = (u32::from_le_bytes(m[16 + 4 * f..20 + 4 * f].try_into().unwrap()) as usize + 1 + next(ng - 1)) % ng;
                put(&mut m, 16 + 4 * f, g as u32);
                format!("function {f:x} moved to group {g}")
            }
            2 => {
                let f = next(nf);
                let at = 16 + 4 * nf + 4 * f;
                let s = u32::from_le_bytes(m[at..at + 4].try_into().unwrap()) ^ (1 + next(3) as u32);
                put(&mut m, at, s);
                format!("function {f:x} to slot {s}")
            }
            3 => {
                let n = next(m.len());
                m.truncate(n);
                format!("cut to {n}")
            }
            4 => {
                let at = [8, 12][next(2)];
                let v = [0, 1, nf as u32 + 1, ng as u32 - 1, u32::MAX][next(5)];
                put(&mut m, at, v);
                format!("header word at {at} = {v}")
            }
            _ => {
                m.extend_from_slice(&[0; 8]);
                "8 bytes added".to_string()
            }
        };
        std::fs::write(&map, &m).unwrap();
        let r = run_with_stdin(Command::new(a.join("bin/features")).arg(&f2), None);
        let err = String::from_utf8_lossy(&r.stderr);
        if behaviour(r.clone()) == want {
            same += 1;
            continue;
        }
        let last = err.lines().last().unwrap_or("");
        assert_eq!(r.status.code(), Some(127), "map mutant {i} ({how}): {err}");
        assert!(last.contains("groups.map") && last.contains("bunkai scatter group)"), "map mutant {i} ({how}): {err}");
        refused += 1;
    }
    assert!(refused >= 250, "{refused} refused, {same} ran as the original");
    std::fs::write(&map, &good).unwrap();
}
