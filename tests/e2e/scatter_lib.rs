//! End-to-end tests of `bunkai scatter --lib` as a drop-in shared library:
//! Debian's zlib scattered with its own link flags (soname, version script,
//! Debian's -z relro), then Debian's own pigz, unmodified and linked with
//! the system libz.so.1, run on it through LD_LIBRARY_PATH; and results the
//! dynamic loader would refuse, which scatter must refuse itself.

use bunkai_e2e::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's zlib, configured as debian/rules does (`make fetch-zlib`).
fn zlib_dir() -> PathBuf {
    let d = root().join("build/third_party/zlib");
    assert!(
        d.join(".complete").exists(),
        "{} has no configured zlib source: run `make fetch-zlib`",
        d.display()
    );
    d
}

fn words(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Runs `cmd` (under the deadline) and returns its output.
fn run(cmd: &mut Command) -> std::process::Output {
    run_with_stdin(cmd, None)
}

/// `readelf -W --dyn-syms FILE`: the defined dynamic symbols, as
/// `name`, `name@@VERSION` or `name@VERSION`, without bunkai's own.
fn exports(file: &Path) -> BTreeSet<String> {
    let o = run(Command::new("readelf").args(["-W", "--dyn-syms"]).arg(file));
    assert!(o.status.success(), "readelf failed on {} (install binutils)", file.display());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            (f.len() >= 8 && f[0].ends_with(':') && f[0].trim_end_matches(':').parse::<u32>().is_ok() && f[6] != "UND" && f[4] != "LOCAL").then(|| f[7].to_string())
        })
        .filter(|n| !n.starts_with("__bunkai_"))
        .collect()
}

/// The SONAME in `readelf -d FILE`, if any.
fn soname(file: &Path) -> Option<String> {
    let o = run(Command::new("readelf").arg("-d").arg(file));
    assert!(o.status.success(), "readelf -d failed on {}", file.display());
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = text.lines().find(|l| l.contains("(SONAME)"))?;
    Some(line.split('[').nth(1)?.trim_end_matches(']').to_string())
}

/// pigz, Debian's, linked with the system libz.so.1.
fn pigz() -> PathBuf {
    let p = PathBuf::from("/usr/bin/pigz");
    assert!(p.exists(), "pigz is missing (run scripts/install-deps.sh)");
    let o = run(Command::new("ldd").arg(&p));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("libz.so.1 => /")),
        "pigz does not load the system libz.so.1:\n{text}"
    );
    p
}

/// Test inputs: text, incompressible bytes, long runs, a binary, nothing.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut text = String::new();
    for i in 0..60_000u32 {
        text.push_str(&format!("{i} {} line of text\n", i.wrapping_mul(2654435761) % 977));
    }
    let mut x = 0x9e3779b97f4a7c15u64;
    let noise: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let runs: Vec<u8> = (0..400_000u32).map(|i| if (i / 4096) % 2 == 0 { b'a' } else { (i % 7) as u8 }).collect();
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("text.txt", text.into_bytes()),
        ("noise.bin", noise),
        ("runs.bin", runs),
        ("pigz.elf", std::fs::read("/usr/bin/pigz").unwrap()),
        ("empty", Vec::new()),
    ];
    files
        .into_iter()
        .map(|(n, data)| {
            let p = dir.join(n);
            std::fs::write(&p, data).unwrap();
            p
        })
        .collect()
}

/// pigz ARGS FILE, natively or on the scattered library; stdout, stderr and
/// status.
fn pigz_run(pigz: &Path, args: &[&str], file: &Path, libdir: Option<&Path>) -> (Vec<u8>, String, Option<i32>) {
    let mut c = Command::new(pigz);
    c.args(args).arg(file).env_remove("LD_PRELOAD");
    match libdir {
        Some(d) => c.env("LD_LIBRARY_PATH", d),
        None => c.env_remove("LD_LIBRARY_PATH"),
    };
    let o = run(&mut c);
    (o.stdout, String::from_utf8_lossy(&o.stderr).into_owned(), o.status.code())
}

/// Compresses and decompresses every input with pigz natively and on the
/// scattered library in `libdir`: identical bytes, nothing on stderr.
fn pigz_same(pigz: &Path, inputs: &[PathBuf], libdir: &Path, dir: &Path, what: &str) {
    for input in inputs {
        let name = input.file_name().unwrap().to_string_lossy().into_owned();
        for args in [&["-c", "-p", "2", "-b", "64"][..], &["-c", "-9"], &["-c", "-1", "-z"], &["-c", "-p", "1", "-6"]] {
            let native = pigz_run(pigz, args, input, None);
            assert_eq!(native.2, Some(0), "native pigz {args:?} {name}: {}", native.1);
            let ours = pigz_run(pigz, args, input, Some(libdir));
            assert!(ours.1.is_empty(), "{what}: pigz {args:?} {name} printed on stderr:\n{}", ours.1);
            assert_eq!(ours.2, Some(0), "{what}: pigz {args:?} {name} exited {:?}", ours.2);
            assert!(ours.0 == native.0, "{what}: pigz {args:?} {name}: output differs from the native run");
            // And back: the native output, decompressed on the scattered library.
            let z = dir.join(format!("{name}.z"));
            std::fs::write(&z, &native.0).unwrap();
            let back_args: &[&str] = if args.contains(&"-z") { &["-dc", "-z"] } else { &["-dc"] };
            let back = pigz_run(pigz, back_args, &z, Some(libdir));
            assert!(back.1.is_empty(), "{what}: pigz -d {name} printed on stderr:\n{}", back.1);
            assert_eq!(back.2, Some(0), "{what}: pigz -d {name} exited {:?}", back.2);
            assert!(back.0 == std::fs::read(input).unwrap(), "{what}: pigz -d {name} gave other bytes");
        }
    }
}

#[test]
fn zlib_scattered_with_its_own_flags_is_a_drop_in_for_debian_pigz() {
    let z = zlib_dir();
    let pigz = pigz();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let srcs: Vec<PathBuf> = words(&z.join("sources.txt")).into_iter().map(PathBuf::from).collect();
    let mut flags = words(&z.join("cflags.txt"));
    let ld = words(&z.join("ldflags.txt"));
    assert!(ld.iter().any(|f| f.starts_with("-Wl,-soname,libz.so.1,--version-script,")), "{ld:?}");
    flags.extend(ld);
    let f: Vec<&str> = flags.iter().map(|s| s.as_str()).collect();
    scatter(&out, &srcs, &["--lib", "--name", "z"], &f);

    // The launcher library is the library zlib's flags ask for: its SONAME,
    // with a link by that name, the original's exports and versions, which
    // are Debian's libz.so.1's API; the function libraries have no SONAME.
    let lib = out.join("lib/libz.so");
    assert_eq!(soname(&lib).as_deref(), Some("libz.so.1"));
    assert_eq!(std::fs::read_link(out.join("lib/libz.so.1")).unwrap(), PathBuf::from("libz.so"));
    let ours = exports(&lib);
    assert_eq!(ours, exports(&out.join("original/libz.so")), "exports differ from the original's");
    // GNU ld (Debian's build) adds one absolute symbol per version; lld does not.
    let debian: BTreeSet<String> = exports(Path::new("/lib/x86_64-linux-gnu/libz.so.1"))
        .into_iter()
        .filter(|s| !s.starts_with("ZLIB_"))
        .collect();
    assert_eq!(ours, debian, "exports differ from Debian's libz.so.1");
    assert!(ours.contains("deflatePending@@ZLIB_1.2.5.1") && ours.contains("inflateBack@@ZLIB_1.2.0"));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let fns = m["functions"].as_array().unwrap();
    assert!(fns.len() > 100, "only {} functions extracted", fns.len());
    for f in fns.iter().take(5) {
        assert_eq!(soname(&out.join(f["library"].as_str().unwrap())), None, "{f}");
    }

    // Debian's pigz loads it through LD_LIBRARY_PATH (ldd says so) and
    // behaves as on the system's.
    let libdir = out.join("lib");
    let o = run(Command::new("ldd").arg(&pigz).env("LD_LIBRARY_PATH", &libdir));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let want = format!("libz.so.1 => {}", libdir.join("libz.so.1").display());
    assert!(text.contains(&want), "ldd pigz does not show {want}:\n{text}");
    let ins = inputs(d.path());
    pigz_same(&pigz, &ins, &libdir, d.path(), "per function");

    // Grouped from a profile of pigz, it is still a drop-in.
    let o = out.to_str().unwrap();
    let text = ins[0].to_str().unwrap();
    let ld_path = format!("LD_LIBRARY_PATH={}", libdir.display());
    bunkai_ok(&["scatter", "profile", o, "--via", "--", "env", &ld_path, pigz.to_str().unwrap(), "-c", text]);
    bunkai_ok(&["scatter", "group", o, "--threshold", "16KiB"]);
    assert!(out.join("lib/z/groups.map").exists());
    pigz_same(&pigz, &ins, &libdir, d.path(), "grouped");
}

/// A one-line failure of `bunkai scatter` that leaves no output.
fn fails_in_one_line(out: &Path, args: &[&str]) -> String {
    let (code, err) = bunkai_fails(args);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line:\n{err}");
    assert!(err.starts_with("bunkai scatter: "), "{err}");
    assert!(!out.exists(), "{} was written", out.display());
    err.trim_end().to_string()
}

#[test]
fn results_the_loader_would_refuse_fail_in_one_line() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("t.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n\
         static int helper(int x) { return x * 3; }\n\
         int twice(int x) { return helper(x) * 2; }\n\
         int api(int x) { printf(\"api %d\\n\", twice(x)); return 0; }\n",
    )
    .unwrap();
    let map = d.path().join("t.map");
    std::fs::write(&map, "T_1 {\n  global: api; twice;\n  local: *;\n};\n").unwrap();
    let s = src.to_str().unwrap();

    // Its own flags, -z defs included, are the launcher's only: it works.
    let good = d.path().join("good");
    let own = format!("-Wl,-soname,libt.so.7,--version-script,{},-z,defs", map.display());
    scatter(&good, &[src.clone()], &["--lib", "--name", "t"], &["-O1", &own]);
    assert_eq!(soname(&good.join("lib/libt.so")).as_deref(), Some("libt.so.7"));
    assert_eq!(
        exports(&good.join("lib/libt.so")),
        ["api@@T_1", "twice@@T_1"].iter().map(|s| s.to_string()).collect::<BTreeSet<_>>()
    );
    // A program linked with it, through its SONAME, runs.
    let host = d.path().join("host.c");
    std::fs::write(&host, "int api(int);\nint main(void) { return api(5); }\n").unwrap();
    let libdir = good.join("lib");
    let exe = d.path().join("host");
    clang_build(&[host], &[&format!("-L{}", libdir.display()), "-lt"], &exe);
    let o = run(Command::new(&exe).env("LD_LIBRARY_PATH", &libdir));
    assert_eq!(behaviour(o), Behaviour { stdout: "api 30\n".into(), stderr: String::new(), code: Some(0) });

    // The version script in a response file reaches the function libraries
    // too: its `local: *` hides their bodies.
    let rsp = d.path().join("link.rsp");
    std::fs::write(&rsp, format!("--version-script={}\n", map.display())).unwrap();
    let out = d.path().join("hidden-body");
    let rsp_flag = format!("-Wl,@{}", rsp.display());
    let err = fails_in_one_line(&out, &["scatter", "--lib", "--name", "t", "-o", out.to_str().unwrap(), s, "--", "-O1", &rsp_flag]);
    assert!(err.contains("(twice) does not export __bunkai_f") && err.contains("its body"), "{err}");

    // A function named in llvm.used stays in the launcher under its own
    // name, which the script hides: the library that calls it would not load.
    let used = d.path().join("used.c");
    std::fs::write(
        &used,
        "__attribute__((used, noinline)) int keep_me(int x) { return x + 1; }\n\
         int twice(int x) { return keep_me(x) * 2; }\n\
         int api(int x) { return twice(x); }\n",
    )
    .unwrap();
    let out = d.path().join("hidden-symbol");
    let script = format!("-Wl,--version-script,{}", map.display());
    let err = fails_in_one_line(
        &out,
        &["scatter", "--lib", "--name", "t", "-o", out.to_str().unwrap(), used.to_str().unwrap(), "--", "-O1", &script],
    );
    assert!(err.contains("(twice) needs keep_me, which lib/libt.so does not export"), "{err}");
}
