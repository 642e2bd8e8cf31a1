//! Tests of the analysis tools on synthetic traces whose counts are known.

use crate::calls::{self, Frame};
use crate::decode::*;
use crate::dump::{dump, DumpOptions};
use crate::format::{self, TraceFile};
use crate::pages::{Format, Picture};
use crate::report::{self, cpu_model, ReportOptions};
use crate::testutil::{Builder, Defs, Events};
use std::path::{Path, PathBuf};

const PROG: &str = "/usr/sbin/prog";
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const STACK: u64 = 0x7ffd_0000_0000;
const HEAP: u64 = 0x60_1000;

/// Objects, functions and segments of the "prog" scenario:
/// main calls helper, returns, calls puts through a PLT stub, returns.
fn prog_defs() -> Defs {
    prog_defs_as(false)
}

/// The prog's objects and functions.
fn prog_names() -> Defs {
    let mut d = Defs::new();
    d.object(1, PROG, 0x400000, 0x410000, 0)
        .object(2, LIBC, 0x7f00_0000_0000, 0x7f00_0020_0000, 0)
        .func(1, "main", "prog.c", 10, 0x401000)
        .func(2, "helper", "prog.c", 3, 0x401100)
        .func(3, "", "", 0, 0)
        .func(4, "puts", "ioputs.c", 35, 0x7f00_0000_1000);
    d
}

/// `packed`: the segments as the QEMU plugin writes them (DEF_SEGP).
fn prog_defs_as(packed: bool) -> Defs {
    let mut d = prog_names();
    d.packed = packed;
    d.run(1, 0x401000, 4, 4, 1, 1, &[(1, ACC_LOAD, 8), (3, ACC_STORE, 4)], END_CALL) // -> helper, ret 0x401010
        .run(2, 0x401100, 3, 4, 1, 2, &[(2, ACC_MODIFY, 8)], END_RET)
        .run(3, 0x401010, 2, 4, 1, 1, &[], END_CALL) // -> plt, ret 0x401018
        .run(4, 0x400500, 1, 6, 1, 3, &[], END_BRANCH) // plt stub -> puts
        .run(5, 0x7f00_0000_1000, 5, 2, 2, 4, &[(1, ACC_LOAD, 8), (5, ACC_STORE, 8)], END_RET)
        .run(6, 0x401018, 2, 4, 1, 1, &[], END_RET);
    d
}

/// One round of the scenario: 17 instructions, 5 references.
fn prog_round(e: &mut Events) {
    e.exec(1, &[STACK, HEAP])
        .exec(2, &[STACK + 8])
        .exec(3, &[])
        .exec(4, &[])
        .exec(5, &[HEAP + 8, HEAP + 0x1000])
        .exec(6, &[]);
}

/// Stream 1: two rounds in two EVENTS chunks, syscalls and context
/// switches; stream 2: a forked child running segment 1 once, its
/// segments packed (DEF_SEGP), so the fuzzer damages both encodings.
fn prog_trace() -> Builder {
    let d = prog_defs();
    let mut b = Builder::new();
    b.hello(1, 100, 1, PROG, &["prog", "-x"], true, F_MEM).defs(1, &d);
    let mut e = Events::new();
    e.ctxsw(5, 1).thread(1);
    prog_round(&mut e);
    e.syscall(1, 1, &[1, 0x601000, 5], 5, 1000, 2500).fork(101);
    b.events(1, &e);
    b.hello(2, 101, 100, PROG, &["prog", "-x"], true, F_MEM).defs(2, &prog_defs_as(true));
    let mut e2 = Events::new();
    e2.exec(1, &[STACK, HEAP]);
    b.events(2, &e2).bye(2, 4, 2, 0, 0);
    let mut e = Events::new();
    prog_round(&mut e);
    e.syscall(1, 231, &[0], 0, 5000, 500).ctxsw(8, 2);
    b.events(1, &e).bye(1, 34, 10, 0, 0);
    b
}

fn write(b: &Builder, dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    b.write(&p).unwrap();
    p
}

fn pentium() -> ReportOptions {
    ReportOptions { cpu: cpu_model("pentium").unwrap(), cycles: None, seconds: None }
}

#[test]
fn instruction_and_page_counts() {
    let d = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&prog_trace(), d.path(), "t.bkt")).unwrap();
    assert_eq!(t.streams.len(), 2);
    let r = report::report(&t, &pentium()).unwrap();
    assert_eq!(r.total_instructions, 2 * 17 + 4);
    assert_eq!(r.memory_references, 2 * 5 + 2);
    assert_eq!(r.records, 38 + 12);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    let prog = r.components.iter().find(|c| c.name == "prog").unwrap();
    assert_eq!(prog.kind, report::Kind::Program);
    assert_eq!(prog.instructions, Some(2 * 12 + 4));
    // Code: pages 0x401 and 0x400 in stream 1, 0x401 in stream 2.
    assert_eq!(prog.code_pages, Some(3));
    let cr = prog.code_refs.as_ref().unwrap();
    assert_eq!((cr.min, cr.max), (2, 22));
    // Data: stack and heap page in each address space.
    assert_eq!(prog.data_pages, Some(4));
    let dr = prog.data_refs.as_ref().unwrap();
    assert_eq!((dr.min, dr.max), (1, 4));
    assert!((dr.mean - 8.0 / 4.0).abs() < 1e-9);

    let libc = r.components.iter().find(|c| c.name == "libc.so.6").unwrap();
    assert_eq!(libc.kind, report::Kind::Library);
    assert_eq!(libc.instructions, Some(10));
    assert_eq!((libc.code_pages, libc.data_pages), (Some(1), Some(2)));
    assert_eq!(r.shared_libraries_total.instructions, Some(10));
    assert_eq!(r.shared_libraries_total.data_pages, Some(2));
    let pct: f64 = r.components.iter().filter_map(|c| c.percent).sum();
    assert!((pct - 100.0).abs() < 1e-9);

    let k = r.components.iter().find(|c| c.kind == report::Kind::Kernel).unwrap();
    assert_eq!(k.instructions, None);
    assert_eq!(k.syscalls, Some(2));
    assert!((k.syscall_seconds.unwrap() - 3e-6).abs() < 1e-12);
    assert_eq!(r.address_space_switches, 4);

    // §4: (3 + 1 code, 4 + 2 data pages) x 9..13, (2 + 4) x 234.
    let e = &r.estimate;
    assert_eq!((e.code_pages, e.data_pages), (4, 6));
    assert_eq!((e.tlb_cycles_min, e.tlb_cycles_max), (90.0, 130.0));
    assert_eq!(e.switch_cycles, 6.0 * 234.0);
    assert!((e.cycles - 38.0 * 2.693).abs() < 1e-6);
    let text = r.text();
    for s in
        ["Table 1: dynamic instructions per component", "Table 2:", "Table 3:", "shared libraries (total)", "n/a", "§4"]
    {
        assert!(text.contains(s), "missing {s:?} in\n{text}");
    }
}

#[test]
fn paper_estimate_arithmetic() {
    // The paper's HTML numbers: 130 + 884 pages, 48 syscalls, 817,599 cycles.
    let cpu = cpu_model("pentium").unwrap();
    let o = ReportOptions { cpu: cpu.clone(), cycles: Some(817_599), seconds: None };
    let e = report::estimate(&cpu, &o, 303_579, 130, 884, 48, 0);
    assert_eq!((e.tlb_cycles_min, e.tlb_cycles_max), (9_126.0, 13_182.0));
    assert_eq!(e.switch_cycles, 11_232.0);
    assert!((e.overhead_percent_min - 2.49).abs() < 0.01, "{}", e.overhead_percent_min);
    assert!((e.requests_per_second_before - 122.3).abs() < 0.05);
    assert!((e.requests_per_second_after_max.unwrap() - 126.0).abs() < 0.5);
    // CGI: 199 + 7,348 pages, 127 syscalls + 10 switches, 2,810,292 cycles.
    let o = ReportOptions { cpu: cpu.clone(), cycles: Some(2_810_292), seconds: None };
    let e = report::estimate(&cpu, &o, 0, 199, 7_348, 127, 10);
    assert_eq!((e.tlb_cycles_min, e.tlb_cycles_max), (67_923.0, 98_111.0));
    assert_eq!(e.switch_cycles, 32_058.0);
    assert!((e.requests_per_second_before - 35.6).abs() < 0.1);
    assert!(cpu_model("modern").unwrap().frequency_hz > 1e9);
    assert!(cpu_model("/nonexistent.json").unwrap_err().to_string().contains("--cpu pentium"));
    // A user file with the same keys; a bad one names the keys.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cpu.json");
    std::fs::write(&p, report::MODERN_JSON.replace("3000000000", "2000000000")).unwrap();
    assert_eq!(cpu_model(p.to_str().unwrap()).unwrap().frequency_hz, 2e9);
    std::fs::write(&p, r#"{"name": "x", "frequency_hz": 1}"#).unwrap();
    assert!(cpu_model(p.to_str().unwrap()).unwrap_err().to_string().contains("tlb_miss_cycles_min"));
}

#[test]
fn report_json_keys() {
    let d = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&prog_trace(), d.path(), "t.bkt")).unwrap();
    let r = report::report(&t, &pentium()).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    for k in [
        "components",
        "total_instructions",
        "syscalls",
        "address_space_switches",
        "estimate",
        "records",
        "seconds",
        "shared_libraries_total",
        "streams",
    ] {
        assert!(v.get(k).is_some(), "no key {k}");
    }
    for c in v["components"].as_array().unwrap() {
        for k in ["name", "kind", "instructions", "percent", "code_pages", "data_pages", "code_refs", "data_refs"] {
            assert!(c.get(k).is_some(), "component without {k}: {c}");
        }
    }
    let k = v["components"].as_array().unwrap().iter().find(|c| c["kind"] == "kernel").unwrap();
    assert!(k["instructions"].is_null() && k["code_pages"].is_null());
    assert_eq!(k["syscalls"], 2);
    for k in ["tlb_cycles_min", "tlb_cycles_max", "switch_cycles", "requests_per_second_before", "cpu"] {
        assert!(v["estimate"].get(k).is_some(), "estimate without {k}");
    }
}

/// How streams end: a fatal signal (BYE with its signal, the FATAL event,
/// the cut segment), a stream the recorder cut (killed while sending), and
/// one cut with nothing after it; report and dump say which is which.
#[test]
fn fatal_signals_and_cut_streams() {
    let d = tempfile::tempdir().unwrap();
    let mut defs = prog_defs();
    defs.run(7, 0x401020, 2, 4, 1, 1, &[], END_FATAL);
    let mut b = Builder::new();
    b.hello(1, 100, 1, PROG, &["prog"], true, F_MEM).defs(1, &defs);
    let mut e = Events::new();
    prog_round(&mut e);
    e.exec(7, &[]).fatal(1, 11, 0x401024);
    b.events(1, &e).bye2(1, 19, 5, 0, 0, 11, 0);
    b.hello(2, 101, 100, PROG, &["prog"], true, F_MEM).defs(2, &defs);
    let mut e = Events::new();
    prog_round(&mut e);
    b.events(2, &e).cut(2, CUT_PARTIAL, 1234, 9);
    b.hello(3, 102, 100, PROG, &["prog"], true, F_MEM).cut(3, CUT_RUNNING, 0, 0);
    let t = Trace::load(&write(&b, d.path(), "t.bkt")).unwrap();
    let r = report::report(&t, &pentium()).unwrap();
    assert_eq!(r.total_instructions, 17 + 2 + 17);
    let s: Vec<(&str, Option<u64>, Option<String>)> =
        r.streams.iter().map(|s| (s.ended, s.exit_status, s.signal.clone())).collect();
    assert_eq!(
        s,
        vec![("signal", None, Some("SIGSEGV".into())), ("cut", None, Some("SIGKILL".into())), ("cut", None, None)]
    );
    assert!(r.warnings.iter().any(|w| w.contains("stream 2") && w.contains("killed while sending")), "{:?}", r.warnings);
    let text = r.text();
    assert!(text.contains("killed by SIGSEGV") && text.contains("cut (killed by SIGKILL)"), "{text}");
    let out = dump_string(&t, &DumpOptions::default());
    assert!(out.contains("ends fatal") && out.contains("fatal signal 11 (SIGSEGV) in thread 1 at 0x401024"), "{out}");
    assert!(out.contains("# stream 2 CUT: killed while sending") && out.contains("1234 bytes of it lost"), "{out}");
    assert!(out.contains("# stream 1 BYE: 19 instructions, 5 memory references, 0 dropped (0 instructions), killed by SIGSEGV"), "{out}");
    let js = dump_string(&t, &DumpOptions { json: true, ..Default::default() });
    assert!(js.lines().any(|l| l.contains(r#""event":"fatal""#) && l.contains(r#""signal":"SIGSEGV""#)), "{js}");

    // A CUT after a BYE, or with an unknown reason, is damage.
    let mut bad = Builder::new();
    bad.hello(1, 100, 1, PROG, &["prog"], true, F_MEM).bye(1, 0, 0, 0, 0).cut(1, CUT_CLOSED, 0, 0);
    let e = Trace::load(&write(&bad, d.path(), "bad.bkt")).err().unwrap().to_string();
    assert!(e.contains("corrupted at byte") && e.contains("CUT for stream 1 after its end"), "{e}");
    let mut bad = Builder::new();
    bad.hello(1, 100, 1, PROG, &["prog"], true, F_MEM).cut(1, 7, 0, 0);
    let e = Trace::load(&write(&bad, d.path(), "bad2.bkt")).err().unwrap().to_string();
    assert!(e.contains("unknown CUT reason 7") && !e.contains('\n'), "{e}");
}

fn dump_string(t: &Trace, o: &DumpOptions) -> String {
    let mut out = Vec::new();
    dump(t, o, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn lackey_output() {
    let d = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&prog_trace(), d.path(), "t.bkt")).unwrap();
    let s = dump_string(&t, &DumpOptions { lackey: true, stream: Some(2), ..Default::default() });
    assert_eq!(s, "I  00401000,4\n L 7ffd00000000,8\nI  00401004,4\nI  00401008,4\n S 00601000,4\nI  0040100c,4\n");
    let s = dump_string(&t, &DumpOptions { lackey: true, stream: Some(1), limit: Some(2), ..Default::default() });
    assert!(s.ends_with("I  00401100,4\nI  00401104,4\n M 7ffd00000008,8\nI  00401108,4\n"), "{s}");
    assert_eq!(s.lines().filter(|l| l.starts_with("I  ")).count(), 7);

    // Text and JSON lines mention every event and parse.
    let s = dump_string(&t, &DumpOptions { defs: true, ..Default::default() });
    assert!(s.contains("syscall write(1, 0x601000, 5) = 5"), "{s}");
    assert!(s.contains("syscall exit_group(0)"));
    assert!(s.contains("fork: child pid 101"));
    assert!(s.contains("# def seg 5"));
    let s = dump_string(&t, &DumpOptions { json: true, ..Default::default() });
    let lines: Vec<serde_json::Value> = s.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.iter().any(|v| v["type"] == "event" && v["name"] == "write"));
    assert_eq!(lines.iter().filter(|v| v["type"] == "exec").count(), 13);
}

#[test]
fn in_flight_and_guarded_accesses() {
    // Segment 11 holds only the rest of segment 10's last instruction (a rep
    // loop cut by a side exit); segment 12's store is guarded and did not
    // happen.
    let mut d = Defs::new();
    d.object(1, PROG, 0x400000, 0x600000, 0).object(2, LIBC, 0x7f00_0000_0000, 0x7f00_0100_0000, 0);
    d.func(1, "memcpy", "", 0, 0).func(2, "main", "", 0, 0);
    d.run(10, 0x7f00_0000_0000, 2, 4, 2, 1, &[(2, ACC_LOAD, 8)], END_BRANCH)
        .seg(11, &[], &[(0, ACC_STORE, 8), (0, ACC_LOAD, 4)], END_BRANCH)
        .run(12, 0x500010, 1, 4, 1, 2, &[(1, ACC_STORE, 8)], END_OTHER);
    let mut e = Events::new();
    e.exec(10, &[HEAP]).exec(11, &[HEAP + 8, HEAP + 0x2000]).exec(12, &[NOT_PERFORMED]);
    let mut b = Builder::new();
    b.hello(1, 5, 1, PROG, &["prog"], true, F_MEM).defs(1, &d).events(1, &e);
    let dir = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&b, dir.path(), "f.bkt")).unwrap();
    let seg11 = t.streams[0].seg(11).unwrap();
    assert_eq!(seg11.in_flight.map(|i| i.addr), Some(0x7f00_0000_0004));
    assert_eq!(seg11.next_addr(), Some(0x7f00_0000_0008));
    let s = dump_string(&t, &DumpOptions { lackey: true, ..Default::default() });
    assert_eq!(s, "I  7f0000000000,4\nI  7f0000000004,4\n L 00601000,8\n S 00601008,8\n L 00603000,4\nI  00500010,4\n");
    let r = report::report(&t, &pentium()).unwrap();
    assert_eq!(r.total_instructions, 3);
    let libc = r.components.iter().find(|c| c.name == "libc.so.6").unwrap();
    assert_eq!((libc.instructions, libc.data_pages), (Some(2), Some(2)));
    assert_eq!(libc.data_refs.as_ref().unwrap().max, 2);
    let prog = r.components.iter().find(|c| c.name == "prog").unwrap();
    assert_eq!((prog.instructions, prog.data_pages), (Some(1), Some(0)));
    let text = dump_string(&t, &DumpOptions::default());
    assert!(text.contains("(rest of the instruction in flight)  S 0x601008,8  L 0x603000,4"), "{text}");
    assert!(text.contains("S (not performed),8"), "{text}");
    let f = calls::frames(&t, &[0]).unwrap();
    assert_eq!(names(&f), vec![(0, "memcpy", 0, 2), (0, "main", 2, 3)]);
}

fn names(frames: &[Frame]) -> Vec<(usize, &str, u64, u64)> {
    frames.iter().map(|f| (f.depth, f.name.as_str(), f.enter, f.leave)).collect()
}

#[test]
fn calls_call_ret_and_plt_rename() {
    let d = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&prog_trace(), d.path(), "t.bkt")).unwrap();
    let f = calls::frames(&t, &[0]).unwrap();
    assert_eq!(
        names(&f),
        vec![
            (0, "main", 0, 17),
            (1, "helper", 4, 7),
            (1, "puts", 9, 15),
            (0, "main", 17, 34),
            (1, "helper", 21, 24),
            (1, "puts", 26, 32),
        ]
    );
    assert_eq!(f[2].instructions, 6);
    assert_eq!(f[2].file, "ioputs.c");
}

#[test]
fn calls_tail_call_and_longjmp() {
    let mut d = Defs::new();
    d.object(1, "/bin/j", 0, 0x10000, 0);
    for (id, name, entry) in
        [(1, "a", 0x1000), (2, "b", 0x2000), (3, "c", 0x3000), (4, "d", 0x4000), (5, "longjmp", 0x5000)]
    {
        d.func(id, name, "j.c", id, entry);
    }
    d.run(1, 0x1000, 2, 4, 1, 1, &[], END_CALL) // a calls b, ret 0x1008
        .run(2, 0x2000, 2, 4, 1, 2, &[], END_BRANCH) // b tail-calls c
        .run(3, 0x3000, 2, 4, 1, 3, &[], END_CALL) // c calls d, ret 0x3008
        .run(4, 0x4000, 1, 4, 1, 4, &[], END_CALL) // d calls longjmp, ret 0x4004
        .run(5, 0x5000, 1, 4, 1, 5, &[], END_BRANCH) // longjmp jumps into a
        .run(6, 0x1010, 1, 4, 1, 1, &[], END_CALL) // a (not at entry) calls b, ret 0x1014
        .run(7, 0x2000, 1, 4, 1, 2, &[], END_CALL) // b calls c, ret 0x2004
        .run(8, 0x3000, 1, 4, 1, 3, &[], END_RET) // c returns past b, to a
        .run(9, 0x1014, 1, 4, 1, 1, &[], END_OTHER);
    let mut e = Events::new();
    for s in 1..=9 {
        e.exec(s, &[]);
    }
    let mut b = Builder::new();
    b.hello(1, 7, 1, "/bin/j", &["j"], true, 0).defs(1, &d).events(1, &e);
    let dir = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&b, dir.path(), "j.bkt")).unwrap();
    let f = calls::frames(&t, &[0]).unwrap();
    assert_eq!(
        names(&f),
        vec![
            (0, "a", 0, 12),
            (1, "b", 2, 4),
            (1, "c", 4, 8),
            (2, "d", 6, 8),
            (3, "longjmp", 7, 8),
            (1, "b", 9, 11),
            (2, "c", 10, 11),
        ]
    );
}

#[test]
fn chrome_trace_is_json() {
    let d = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&prog_trace(), d.path(), "t.bkt")).unwrap();
    let f = calls::frames(&t, &[0, 1]).unwrap();
    let out = d.path().join("c.json");
    calls::write_chrome(&t, &f, &out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    assert_eq!(ev.iter().filter(|e| e["ph"] == "X").count(), f.len());
    assert!(v["otherData"]["time_unit"].as_str().unwrap().contains("instruction"));
}

/// The text of every `<text>` element of an SVG, trimmed.
fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text").skip(1).filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_string())).collect()
}

#[test]
fn pages_picture() {
    let d = tempfile::tempdir().unwrap();
    let t = Trace::load(&write(&prog_trace(), d.path(), "t.bkt")).unwrap();
    let pic = Picture::build(&t, 640, 400).unwrap();
    let png = d.path().join("p.png");
    pic.write(&png, Format::Png).unwrap();
    let dec = png::Decoder::new(std::fs::File::open(&png).unwrap());
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (640, 400));
    // Some cell is coloured (neither white, grey nor the band shade).
    assert!(buf.chunks(3).any(|p| p[0] > 200 && p[2] < 150));
    let svg_path = d.path().join("p.svg");
    pic.write(&svg_path, Format::Svg).unwrap();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg"));
    let texts = svg_texts(&svg);
    for label in ["prog (3)", "libc.so.6 (1)", "prog (4)", "libc.so.6 (2)"] {
        assert!(texts.iter().any(|t| t == label), "no band {label}: {texts:?}");
    }
    // Titled axes, round time ticks, the colour scale's title.
    for t in ["pages by address", "time: instructions executed (all processes, in trace order)", "references per cell"] {
        assert!(texts.iter().any(|x| x == t), "no {t:?}: {texts:?}");
    }
    assert!(texts.iter().any(|t| t == "0"), "{texts:?}");
    assert!(Format::of(Path::new("x.gif")).unwrap_err().to_string().contains(".svg or .png"));
    assert!(Picture::build(&t, 10, 10).is_err());
}

#[test]
fn damage_names_the_chunk_offset() {
    let dir = tempfile::tempdir().unwrap();
    let check = |b: &Builder, want: &str| {
        let p = write(b, dir.path(), "bad.bkt");
        let err = Trace::load(&p)
            .and_then(|t| report::report(&t, &pentium()).map(|_| ()))
            .expect_err("damage must be an error");
        let off = TraceFile::open(&p).unwrap().chunks.last().unwrap().offset;
        let msg = format!("{err:#}");
        assert!(msg.contains(&format!("corrupted at byte {off}:")), "{msg}");
        assert!(msg.contains(want), "{msg}");
        assert!(!msg.contains('\n'));
    };
    let base = || {
        let mut b = Builder::new();
        b.hello(1, 1, 0, PROG, &[], true, F_MEM).defs(1, &prog_defs());
        b
    };
    let mut e = Events::new();
    e.exec(99, &[]);
    check(base().events(1, &e), "segment 99 executed but never defined");
    let mut e = Events::new();
    e.exec(3, &[]).event(77, &[]);
    check(base().events(1, &e), "unknown event tag 77");
    let mut e = Events::new();
    e.exec(1, &[STACK]); // one address short
    check(base().events(1, &e), "record ends early");
    let mut e = Events::new();
    e.exec(3, &[]);
    e.buf.push(0x80); // trailing garbage
    check(base().events(1, &e), "record ends early");
    let mut d = Defs::new();
    d.run(1, 0x1000, 2, 4, 1, 1, &[(3, ACC_LOAD, 8)], END_BRANCH);
    check(base().defs(1, &d), "access of instruction 3");
    check(base().raw(format::CHUNK_DEFS, 1, vec![9]), "unknown definition tag 9");
    check(base().raw(format::CHUNK_EVENTS, 2, vec![]), "before its HELLO");
}

/// xorshift64*: deterministic and good enough to pick mutations.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Runs every tool on a file; returns whether it decoded.
fn run_all(p: &Path, pictures: bool) -> bool {
    let Ok(t) = Trace::load(p) else { return false };
    let ok = report::report(&t, &pentium()).is_ok();
    for o in [
        DumpOptions::default(),
        DumpOptions { json: true, defs: true, ..Default::default() },
        DumpOptions { lackey: true, ..Default::default() },
    ] {
        let _ = dump(&t, &o, &mut std::io::sink());
    }
    let all: Vec<usize> = (0..t.streams.len()).collect();
    if let Ok(f) = calls::frames(&t, &all) {
        let _ = calls::write_chrome(&t, &f, &p.with_extension("json"));
    }
    if pictures {
        if let Ok(pic) = Picture::build(&t, 320, 240) {
            let _ = pic.png(&mut std::io::sink());
            let _ = pic.svg();
        }
    }
    ok
}

/// A packed segment (DEF_SEGP) decodes to what the plain one does: the
/// prog's six segments, and one with what packing carries least well (a
/// jump inside it, a change of object and function mid-segment, an access
/// of the instruction in flight, a 10-byte and a 64-byte access, a
/// modify), each in a message of its own and all in one; and it is
/// a third smaller at least.
#[test]
fn packed_segments_decode_as_the_plain_ones() {
    let dir = tempfile::tempdir().unwrap();
    let odd = |d: &mut Defs| {
        let insns = [(0x401000, 4, 1, 1), (0x401004, 15, 1, 1), (0x401100, 1, 1, 2), (0x7f00_0000_1000, 3, 2, 4)];
        let accs = [(0, ACC_LOAD, 8), (2, ACC_STORE, 10), (2, ACC_MODIFY, 64), (4, ACC_LOAD, 1)];
        if d.packed {
            d.segp(9, &insns, &accs, END_FATAL);
        } else {
            d.seg(9, &insns, &accs, END_FATAL);
        }
    };
    let mut segs = Vec::new();
    let mut sizes = Vec::new();
    for packed in [false, true] {
        let mut d = prog_defs_as(packed);
        odd(&mut d);
        let mut apart = Defs::new();
        apart.packed = packed;
        odd(&mut apart);
        let mut b = Builder::new();
        b.hello(1, 100, 1, PROG, &["prog"], true, F_MEM).defs(1, &d).defs(1, &apart);
        let mut e = Events::new();
        prog_round(&mut e);
        e.exec(9, &[HEAP, STACK, STACK + 64, HEAP + 4096]);
        b.events(1, &e).bye(1, 17 + 4, 9, 0, 0);
        let t = Trace::load(&write(&b, dir.path(), &format!("p{packed}.bkt"))).unwrap();
        let st = &t.streams[0];
        segs.push(format!("{:?}", st.segs));
        sizes.push(d.buf.len() - prog_names().buf.len());
        let r = report::report(&t, &pentium()).unwrap();
        assert_eq!((r.total_instructions, r.memory_references), (17 + 4, 5 + 4), "packed {packed}");
    }
    assert_eq!(segs[0], segs[1]);
    assert!(segs[0].contains("addr: 4198656") && segs[0].contains("size: 10"), "{}", segs[0]);
    assert!(sizes[1] * 3 < sizes[0] * 2, "packed {} bytes, plain {}", sizes[1], sizes[0]);
}

#[test]
fn fuzz_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let base = prog_trace();
    let path = dir.path().join("f.bkt");
    base.write(&path).unwrap();
    assert!(run_all(&path, true));
    let file = std::fs::read(&path).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut decoded = 0;
    for i in 0..3000 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match i % 3 {
                // Byte flips and truncations of the file.
                0 => {
                    let mut b = file.clone();
                    for _ in 0..1 + rng.below(4) {
                        let at = rng.below(b.len());
                        b[at] ^= 1 << rng.below(8);
                    }
                    if rng.below(4) == 0 {
                        b.truncate(rng.below(b.len()));
                    }
                    std::fs::write(&path, &b).unwrap();
                }
                // Damaged payloads inside valid chunk framing.
                _ => {
                    let mut b = base.clone();
                    let k = rng.below(b.chunks.len());
                    let p = &mut b.chunks[k].2;
                    match rng.below(5) {
                        0 => {
                            for _ in 0..1 + rng.below(3) {
                                if !p.is_empty() {
                                    let at = rng.below(p.len());
                                    p[at] = rng.next() as u8;
                                }
                            }
                        }
                        1 => p.truncate(rng.below(p.len() + 1)),
                        2 => {
                            let at = rng.below(p.len() + 1);
                            let junk: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
                            p.splice(at..at, junk);
                        }
                        3 => *p = (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
                        _ => {
                            let kind = 1 + rng.below(4) as u8;
                            let payload = (0..rng.below(32)).map(|_| (rng.next() as u8) & 0x7f).collect();
                            b.chunks.insert(rng.below(b.chunks.len() + 1), (kind, 1 + rng.below(2) as u32, payload));
                        }
                    }
                    b.write(&path).unwrap();
                }
            }
            run_all(&path, i % 10 == 0)
        }));
        match r {
            Ok(true) => decoded += 1,
            Ok(false) => {}
            Err(_) => panic!("mutation {i} panicked"),
        }
    }
    // Both outcomes occur: the fuzzing reaches the analysis tools.
    assert!(decoded > 100, "only {decoded} mutations decoded");
}

/// The version and magics of trace/include/bunkai_trace.h as a C compiler
/// reads them (every byte of each magic, its NUL included), against their
/// Rust mirrors.
#[test]
fn version_matches_the_compiled_header() {
    use crate::format::*;
    let inc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let got = bunkai_common::c_header::run(
        &inc,
        "bunkai_trace.h",
        r#"
#define BYTES(s) do { for (size_t i = 0; i + 1 < sizeof s; i++) printf("%02x", (unsigned char)s[i]); printf(" "); } while (0)
  printf("%d ", BKT_VERSION);
  BYTES(BKT_FILE_MAGIC);
  BYTES(BKT_CHUNK_MAGIC);
  BYTES(BKT_END_MAGIC);
  printf("\n");"#,
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(got, format!("{VERSION} {} {} {} \n", hex(FILE_MAGIC), hex(CHUNK_MAGIC), hex(END_MAGIC)));
}

/// Every constant of trace/include/bunkai_trace.h (the Valgrind tool's side
/// of the format) has its Rust mirror here with the same value: a header
/// changed on one side only fails this test instead of misreading traces.
#[test]
fn constants_match_the_shared_header() {
    use crate::decode::*;
    use crate::format::*;
    let h = include_str!("../include/bunkai_trace.h");
    let defines: std::collections::BTreeMap<&str, &str> = h
        .lines()
        .filter_map(|l| l.strip_prefix("#define BKT_"))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?, it.next()?))
        })
        .collect();
    let num = |name: &str| -> u64 {
        let v = defines.get(name).unwrap_or_else(|| panic!("BKT_{name} not in bunkai_trace.h"));
        let v = v.trim_end_matches("ull").trim_end_matches('u');
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
            None => v.parse().unwrap(),
        }
    };
    let text = |name: &str| -> Vec<u8> {
        let v = defines.get(name).unwrap_or_else(|| panic!("BKT_{name} not in bunkai_trace.h"));
        let inner = v.trim_matches('"');
        inner.replace("\\0", "\0").into_bytes()
    };
    assert_eq!(num("VERSION"), VERSION as u64);
    assert_eq!(text("FILE_MAGIC"), FILE_MAGIC.to_vec());
    assert_eq!(text("CHUNK_MAGIC"), CHUNK_MAGIC.to_vec());
    assert_eq!(text("END_MAGIC"), END_MAGIC.to_vec());
    let mirrored: &[(&str, u64)] = &[
        ("CHUNK_HELLO", CHUNK_HELLO as u64),
        ("CHUNK_DEFS", CHUNK_DEFS as u64),
        ("CHUNK_EVENTS", CHUNK_EVENTS as u64),
        ("CHUNK_BYE", CHUNK_BYE as u64),
        ("CHUNK_CUT", CHUNK_CUT as u64),
        ("CUT_PARTIAL", CUT_PARTIAL),
        ("CUT_CLOSED", CUT_CLOSED),
        ("CUT_RUNNING", CUT_RUNNING),
        ("F_MEM", F_MEM),
        ("F_BUFFERED", F_BUFFERED),
        ("DEF_OBJECT", DEF_OBJECT),
        ("DEF_FUNC", DEF_FUNC),
        ("DEF_SEG", DEF_SEG),
        ("DEF_SEGP", DEF_SEGP),
        ("SEGP_SIZE_FOLLOWS", SEGP_SIZE_FOLLOWS),
        ("ACC_LOAD", ACC_LOAD as u64),
        ("ACC_STORE", ACC_STORE as u64),
        ("ACC_MODIFY", ACC_MODIFY as u64),
        ("NOT_PERFORMED", NOT_PERFORMED),
        ("END_BRANCH", END_BRANCH as u64),
        ("END_CALL", END_CALL as u64),
        ("END_RET", END_RET as u64),
        ("END_SYSCALL", END_SYSCALL as u64),
        ("END_OTHER", END_OTHER as u64),
        ("END_FATAL", END_FATAL as u64),
        ("EV_SYSCALL", EV_SYSCALL),
        ("EV_SIGNAL", EV_SIGNAL),
        ("EV_THREAD", EV_THREAD),
        ("EV_MMAP", EV_MMAP),
        ("EV_MUNMAP", EV_MUNMAP),
        ("EV_MPROTECT", EV_MPROTECT),
        ("EV_BRK", EV_BRK),
        ("EV_EXEC", EV_EXEC),
        ("EV_FORK", EV_FORK),
        ("EV_WINDOW", EV_WINDOW),
        ("EV_TLS", EV_TLS),
        ("EV_THREAD_NEW", EV_THREAD_NEW),
        ("EV_THREAD_EXIT", EV_THREAD_EXIT),
        ("EV_CTXSW", EV_CTXSW),
        ("EV_FATAL", EV_FATAL),
        ("EV_TRAP", EV_TRAP),
        ("EV_ASID", EV_ASID),
        ("TRAP_INTERRUPT", TRAP_INTERRUPT),
        ("TRAP_EXCEPTION", TRAP_EXCEPTION),
        ("F_SYSTEM", F_SYSTEM),
        ("WIN_START", WIN_START),
        ("WIN_SYSCALL", WIN_SYSCALL),
        ("WIN_FUNC", WIN_FUNC),
        ("WIN_COUNT", WIN_COUNT),
        ("WIN_CLOSE_FD", WIN_CLOSE_FD),
        ("WIN_FULL", WIN_FULL),
        ("WIN_EXIT", WIN_EXIT),
    ];
    for (name, v) in mirrored {
        assert_eq!(num(name), *v, "BKT_{name}");
    }
    // Every define of the header is mirrored (a new one needs its Rust twin).
    let covered: std::collections::BTreeSet<&str> = mirrored
        .iter()
        .map(|(n, _)| *n)
        .chain(["VERSION", "FILE_MAGIC", "CHUNK_MAGIC", "END_MAGIC"])
        .collect();
    let missing: Vec<&&str> = defines.keys().filter(|k| !covered.contains(**k)).collect();
    assert!(missing.is_empty(), "defines of bunkai_trace.h with no Rust mirror here: {missing:?}");
}
