//! `bunkai flow dump` and `bunkai flow report` (seed 003 §4.1, Table 2):
//! the records STORE_DATA left in the buffers of every process, as they are
//! (dump), or merged by flow ID into per-flow timelines: elapsed µs,
//! process and host, file, line, function. The report also exports Chrome
//! trace / Perfetto JSON (one instant per record, flow arrows linking a
//! flow's records across threads and processes) and OpenTelemetry spans
//! (OTLP JSON: one trace per flow, one span per step), so existing viewers
//! can show them.
//!
//! A record's join point (its index in the program's table) is resolved
//! through the program named in the buffer's header, when it is readable.

use crate::buffer::{self, Buffer, Record};
use crate::joinpoints::{self, JoinPoint};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;

/// Which buffers `dump` prints and how: `bunkai flow dump`'s options
/// (cmd/dump.rs).
pub struct DumpOptions {
    /// Buffer files (default: every bunkai-flow.*.buf in $BUNKAI_FLOW_DIR or /dev/shm)
    pub buffers: Vec<PathBuf>,
    /// One JSON document instead of text
    pub json: bool,
    /// Only each buffer's header line (records, bytes used, dropped), no records
    pub summary: bool,
}

/// Which flows `report` shows and where it writes them: `bunkai flow
/// report`'s options (cmd/report.rs).
pub struct ReportOptions {
    /// Buffer files (default: every bunkai-flow.*.buf in $BUNKAI_FLOW_DIR or /dev/shm)
    pub buffers: Vec<PathBuf>,
    /// Which stored value is the flow ID, counted from 0; negative counts
    /// from the end (default -1: the last, as in STORE_DATA3($pc$, tsc, id))
    pub id_value: i64,
    /// Only this flow (decimal or 0x hex)
    pub flow: Option<String>,
    /// Compare flow IDs on their low N bits only: an ID packed into a header
    /// field of N bits (xin/xout) loses the ones above, so the far side's
    /// steps carry the cut ID (1-64, default 64)
    pub id_bits: u32,
    /// Also write Chrome trace / Perfetto JSON here
    pub chrome: Option<PathBuf>,
    /// Also write OpenTelemetry spans (OTLP JSON) here
    pub otel: Option<PathBuf>,
    /// Also draw the flows here as SVG: a band per flow, a lane per
    /// process, a dot per step along the flow's own time axis, the path
    /// between them, and where each function is first reached (the first
    /// 12 flows, or the one --flow names)
    pub svg: Option<PathBuf>,
    /// One JSON document instead of text
    pub json: bool,
    /// Only the buffers of these processes and of their running descendants
    pub pids: Vec<u32>,
    /// Every buffer in the directory, ended processes' too
    pub all: bool,
}

/// Join points by program path, read once each.
struct Tables(HashMap<String, Option<Vec<JoinPoint>>>);

impl Tables {
    fn jp<'a>(&'a mut self, exe: &str, index: Option<u32>) -> Option<&'a JoinPoint> {
        let i = index? as usize;
        let t = self.0.entry(exe.to_string()).or_insert_with(|| joinpoints::read(std::path::Path::new(exe)).ok());
        t.as_ref()?.get(i)
    }
}

fn load(given: &[PathBuf], json: bool) -> Result<Vec<Buffer>> {
    let files = buffer::find(given, &buffer::dir())?;
    buffer::read_all(&files, progress(json))
}

/// Whether reading shows its progress: on a terminal, and not under --json.
fn progress(json: bool) -> bool {
    use std::io::IsTerminal;
    !json && std::io::stderr().is_terminal()
}

fn place(t: &mut Tables, b: &Buffer, r: &Record) -> (String, String, u32) {
    if !r.is_step() {
        return ("(keys still in a flow table at exit)".into(), "-".into(), 0);
    }
    match t.jp(&b.exe, r.jp) {
        Some(jp) => (jp.function.clone(), jp.file.clone(), jp.line),
        None => ("?".into(), "?".into(), 0),
    }
}

fn short(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub fn dump(a: &DumpOptions) -> Result<ExitCode> {
    let bufs = load(&a.buffers, a.json)?;
    // Streamed, record by record: a buffer may hold tens of millions.
    let out = std::io::stdout();
    let mut w = std::io::BufWriter::with_capacity(1 << 16, out.lock());
    write_dump(a, &bufs, &mut w)?;
    std::io::Write::flush(&mut w)?;
    Ok(ExitCode::SUCCESS)
}

fn write_dump(a: &DumpOptions, bufs: &[Buffer], w: &mut impl std::io::Write) -> Result<()> {
    let mut t = Tables(HashMap::new());
    let t0 = bufs.iter().map(|b| b.started_ns).min().unwrap_or(0);
    if a.json {
        // {"buffers": [{header fields..., "records": [...]}, ...]}: the same
        // document serde_json would make, one record per line
        w.write_all(b"{\"buffers\": [")?;
        for (i, b) in bufs.iter().enumerate() {
            let mut head = json!({"file": b.path.display().to_string(), "pid": b.pid, "host": b.host, "exe": b.exe,
                                  "capacity": b.capacity, "used": b.head.min(b.capacity), "dropped": b.dropped,
                                  "incomplete": b.incomplete, "unwritten": b.unwritten, "started_ns": b.started_ns,
                                  "record_count": b.records.len()})
            .to_string();
            head.pop(); // the closing brace: records follow
            write!(w, "{}\n{head}", if i > 0 { "," } else { "" })?;
            if a.summary {
                w.write_all(b"}")?;
                continue;
            }
            w.write_all(b", \"records\": [")?;
            for (k, r) in b.records.iter().enumerate() {
                let (f, file, line) = place(&mut t, b, r);
                let rec = json!({"ns": r.ns, "pc": format!("{:#x}", r.pc), "tid": r.tid, "jp": r.jp,
                                 "function": f, "file": file, "line": line, "values": r.vals});
                write!(w, "{}\n  {rec}", if k > 0 { "," } else { "" })?;
            }
            w.write_all(b"]}")?;
        }
        w.write_all(b"]}\n")?;
        return Ok(());
    }
    for b in bufs {
        writeln!(
            w,
            "# {}: pid {} on {}, {}: {} records, {} of {} bytes used, {} dropped, {} incomplete{}",
            b.path.display(),
            b.pid,
            b.host,
            b.exe,
            b.records.len(),
            b.head.min(b.capacity),
            b.capacity,
            b.dropped,
            b.incomplete,
            if b.unwritten > 0 { format!(", {} bytes reserved and never written", b.unwritten) } else { String::new() }
        )?;
        if a.summary {
            continue;
        }
        for r in &b.records {
            let (f, file, line) = place(&mut t, b, r);
            let vals: Vec<String> = r.vals.iter().map(|v| format!("{v:#x}")).collect();
            writeln!(
                w,
                "{:>14.3} us  tid {:<7} {:#x}  {}:{} {}  [{}]",
                r.ns.saturating_sub(t0) as f64 / 1e3,
                r.tid,
                r.pc,
                short(&file),
                line,
                f,
                vals.join(" ")
            )?;
        }
    }
    Ok(())
}

/// One step of a flow.
struct Step {
    ns: u64,
    buf: usize,
    tid: u32,
    pc: u64,
    function: String,
    file: String,
    line: u32,
    vals: Vec<u64>,
}

/// A flow ID as a user gives it: decimal or 0x hex, also as copied from a
/// report's heading (`flow 0x1c:`, so a trailing colon is fine).
fn parse_id(s: &str) -> Result<u64> {
    let t = s.trim().trim_end_matches(':');
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    };
    v.map_err(|_| anyhow::anyhow!("--flow {s}: not a flow ID (give it in decimal or 0x hex)"))
}

#[cfg(test)]
mod parse_id_tests {
    #[test]
    fn ids_as_reports_print_them_are_taken() {
        assert_eq!(super::parse_id("0x1c:").unwrap(), 0x1c);
        assert_eq!(super::parse_id("0X1C").unwrap(), 0x1c);
        assert_eq!(super::parse_id("28").unwrap(), 28);
        assert_eq!(super::parse_id("0xffffffffffffffff").unwrap(), u64::MAX);
        for bad in ["", ":", "0x", "0xg1", "1:2", "-1", "0x1c::x"] {
            let e = super::parse_id(bad).unwrap_err().to_string();
            assert!(e.contains("not a flow ID"), "{bad:?}: {e}");
        }
    }
}

pub fn report(a: &ReportOptions) -> Result<ExitCode> {
    let dir = buffer::dir();
    let which = if !a.buffers.is_empty() {
        buffer::Which::Files(&a.buffers)
    } else if !a.pids.is_empty() {
        buffer::Which::Pids(&a.pids)
    } else if a.all {
        buffer::Which::All
    } else {
        buffer::Which::Running
    };
    let (files, left_out) = buffer::select(which, &dir)?;
    if left_out > 0 && !a.json {
        eprintln!(
            "bunkai flow: left out {left_out} buffer{} of ended processes in {} (--all reads them too; bunkai flow clean removes them)",
            if left_out == 1 { "" } else { "s" },
            dir.display()
        );
    }
    let bufs: Vec<Buffer> = buffer::read_all(&files, progress(a.json))?;
    let mask = if a.id_bits >= 64 { u64::MAX } else { (1u64 << a.id_bits) - 1 };
    let only = a.flow.as_deref().map(parse_id).transpose()?.map(|f| f & mask);
    let mut t = Tables(HashMap::new());
    let mut flows: BTreeMap<u64, Vec<Step>> = BTreeMap::new();
    let mut without = 0u64;
    // what tables still held at their process's exit: (buffer, summary)
    let mut live: Vec<(usize, crate::buffer::LiveAtExit)> = Vec::new();
    for (bi, b) in bufs.iter().enumerate() {
        for r in &b.records {
            if !r.is_step() {
                live.extend(r.live_at_exit().map(|l| (bi, l)));
                continue;
            }
            let k = if a.id_value < 0 { r.vals.len() as i64 + a.id_value } else { a.id_value };
            let id = match usize::try_from(k).ok().and_then(|k| r.vals.get(k)) {
                Some(&id) if id & mask != 0 => id & mask,
                _ => {
                    without += 1;
                    continue;
                }
            };
            if only.is_some_and(|o| o != id) {
                continue;
            }
            let (function, file, line) = place(&mut t, b, r);
            flows.entry(id).or_default().push(Step { ns: r.ns, buf: bi, tid: r.tid, pc: r.pc, function, file, line, vals: r.vals.clone() });
        }
    }
    for steps in flows.values_mut() {
        steps.sort_by_key(|s| (s.ns, s.buf, s.tid));
    }
    if flows.is_empty() {
        bail!(
            "no record carries a flow ID (value {} of each record){} (check --id-value, or that the flow's start ran)",
            a.id_value,
            if only.is_some() { " matching --flow" } else { "" }
        );
    }
    let proc_name = |bi: usize| format!("{}/{}", bufs[bi].host, bufs[bi].pid);
    if let Some(p) = &a.chrome {
        bunkai_common::files::write_atomic(p, (serde_json::to_string(&chrome(&bufs, &flows))? + "\n").as_bytes())?;
    }
    if let Some(p) = &a.otel {
        bunkai_common::files::write_atomic(p, (serde_json::to_string(&otel(&bufs, &flows))? + "\n").as_bytes())?;
    }
    if let Some(p) = &a.svg {
        bunkai_common::files::write_atomic(p, svg(&bufs, &flows, SVG_FLOWS)?.as_bytes())?;
    }
    if a.json {
        let v: Vec<Value> = flows
            .iter()
            .map(|(id, steps)| {
                let t0 = steps[0].ns;
                json!({"flow": format!("{id:#x}"), "maybe_cut_short": cut_short(&bufs, steps), "steps": steps.iter().map(|s| json!({
                    "elapsed_us": (s.ns - t0) as f64 / 1e3, "ns": s.ns, "process": proc_name(s.buf),
                    "pid": bufs[s.buf].pid, "host": bufs[s.buf].host, "tid": s.tid, "pc": format!("{:#x}", s.pc),
                    "file": s.file, "line": s.line, "function": s.function, "values": s.vals,
                })).collect::<Vec<_>>()})
            })
            .collect();
        let procs: Vec<Value> = bufs
            .iter()
            .map(|b| json!({"process": format!("{}/{}", b.host, b.pid), "pid": b.pid, "host": b.host, "exe": b.exe,
                            "records": b.records.len(), "dropped": b.dropped, "capacity": b.capacity}))
            .collect();
        let lv: Vec<Value> = live
            .iter()
            .map(|(bi, l)| json!({"process": proc_name(*bi), "pid": bufs[*bi].pid, "table": l.table, "live": l.live,
                                  "sample": l.sample.iter().map(|(k, id)| json!({"key": format!("{k:#x}"), "flow": format!("{id:#x}")})).collect::<Vec<_>>()}))
            .collect();
        crate::stdout(&(serde_json::to_string_pretty(&json!({"flows": v, "records_without_flow": without, "processes": procs, "live_at_exit": lv}))? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut s = String::new();
    for (bi, l) in &live {
        let e = l.sample.first().map(|(k, id)| format!(" (key {k:#x} in flow {id:#x}, ...)")).unwrap_or_default();
        s += &format!(
            "warning: {} ({}) exited with {} key{} still in flow table {}{e}: an object that ends without a <quit> leaves its key, and the next object at its address joins the old flow (add a <quit> where such objects end)\n",
            proc_name(*bi),
            short(&bufs[*bi].exe),
            bunkai_common::fmt::commas(l.live),
            if l.live == 1 { "" } else { "s" },
            l.table
        );
    }
    for b in bufs.iter().filter(|b| b.dropped > 0) {
        s += &format!(
            "{}/{} ({}) dropped {} record{}: its buffer of {} filled (make it larger: bunkai flow weave --buffer-size SIZE, or BUNKAI_FLOW_BUF=SIZE in its environment); flows marked \"cut short?\" had steps there\n",
            b.host,
            b.pid,
            short(&b.exe),
            bunkai_common::fmt::commas(b.dropped),
            if b.dropped == 1 { "" } else { "s" },
            mib(b.capacity + crate::buffer::HEADER as u64)
        );
    }
    for (id, steps) in &flows {
        let t0 = steps[0].ns;
        let mut procs: Vec<usize> = steps.iter().map(|s| s.buf).collect();
        procs.sort();
        procs.dedup();
        s += &format!(
            "flow {id:#x}: {} step{}, {} process{}, {:.1} us{}\n",
            steps.len(),
            if steps.len() == 1 { "" } else { "s" },
            procs.len(),
            if procs.len() == 1 { "" } else { "es" },
            (steps.last().unwrap().ns - t0) as f64 / 1e3,
            if cut_short(&bufs, steps) { ", cut short?" } else { "" }
        );
        let pw = steps.iter().map(|x| proc_name(x.buf).len()).max().unwrap_or(7).max(7);
        let fw = steps.iter().map(|x| short(&x.file).len() + 1 + x.line.to_string().len()).max().unwrap_or(4).max(4);
        s += &format!("  {:>12}  {:<pw$}  {:<fw$}  {}\n", "elapsed [us]", "process", "file:line", "function");
        for x in steps {
            let fl = format!("{}:{}", short(&x.file), x.line);
            s += &format!("  {:>12.1}  {:<pw$}  {:<fw$}  {}\n", (x.ns - t0) as f64 / 1e3, proc_name(x.buf), fl, x.function);
        }
    }
    if without > 0 {
        s += &format!("({without} record{} without a flow ID not shown)\n", if without == 1 { "" } else { "s" });
    }
    crate::stdout(&s)?;
    Ok(ExitCode::SUCCESS)
}

/// A buffer's size as BUNKAI_FLOW_BUF takes it (16K, 64M).
fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Whether a flow may lack steps: it has steps in a process whose buffer
/// filled and dropped records (every record after that was lost, so a flow
/// going on there has no record of how it went on).
fn cut_short(bufs: &[Buffer], steps: &[Step]) -> bool {
    steps.iter().any(|s| bufs[s.buf].dropped > 0)
}

/// Chrome trace event format: an instant per step, and flow events (s, t,
/// f) binding each flow's steps so viewers draw arrows between them.
fn chrome(bufs: &[Buffer], flows: &BTreeMap<u64, Vec<Step>>) -> Value {
    let mut ev = Vec::new();
    for (bi, b) in bufs.iter().enumerate() {
        let dropped = if b.dropped > 0 { format!(", {} records dropped", b.dropped) } else { String::new() };
        ev.push(json!({"ph": "M", "name": "process_name", "pid": bi + 1,
                       "args": {"name": format!("{} pid {} ({}){dropped}", b.host, b.pid, short(&b.exe))}}));
    }
    for (id, steps) in flows {
        let cut = cut_short(bufs, steps);
        for (k, s) in steps.iter().enumerate() {
            let ts = s.ns as f64 / 1e3;
            let (pid, tid) = (s.buf + 1, s.tid);
            let mut args = json!({"flow": format!("{id:#x}"), "file": s.file, "line": s.line, "pc": format!("{:#x}", s.pc), "values": s.vals});
            if cut {
                args["maybe_cut_short"] = json!(true);
            }
            ev.push(json!({"ph": "X", "name": s.function, "cat": "bunkai-flow", "pid": pid, "tid": tid, "ts": ts, "dur": 0.1, "args": args}));
            if steps.len() > 1 {
                let ph = if k == 0 { "s" } else if k + 1 == steps.len() { "f" } else { "t" };
                let mut e = json!({"ph": ph, "name": "flow", "cat": "bunkai-flow", "id": format!("{id:#x}"), "pid": pid, "tid": tid, "ts": ts});
                if ph != "s" {
                    e["bp"] = json!("e");
                }
                ev.push(e);
            }
        }
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ns"})
}

fn kv(key: &str, v: Value) -> Value {
    json!({"key": key, "value": v})
}

/// OTLP JSON: a resource per process, a trace per flow (its ID in the trace
/// ID), a span per step lasting until the flow's next step, each the child
/// of the step before.
fn otel(bufs: &[Buffer], flows: &BTreeMap<u64, Vec<Step>>) -> Value {
    let mut per_buf: Vec<Vec<Value>> = vec![Vec::new(); bufs.len()];
    for (id, steps) in flows {
        let trace_id = format!("{:016x}{:016x}", 0x626b_666c_6f77u64, id); // "bkflow" + the flow ID
        let cut = cut_short(bufs, steps);
        for (k, s) in steps.iter().enumerate() {
            let span_id = format!("{:08x}{:08x}", (*id as u32) ^ (*id >> 32) as u32, k as u32 + 1);
            let end = steps.get(k + 1).map_or(s.ns, |n| n.ns);
            let mut span = json!({
                "traceId": trace_id, "spanId": span_id, "name": s.function, "kind": 1,
                "startTimeUnixNano": s.ns.to_string(), "endTimeUnixNano": end.to_string(),
                "attributes": [
                    kv("bunkai.flow.id", json!({"stringValue": format!("{id:#x}")})),
                    kv("code.function", json!({"stringValue": s.function})),
                    kv("code.filepath", json!({"stringValue": s.file})),
                    kv("code.lineno", json!({"intValue": s.line.to_string()})),
                    kv("thread.id", json!({"intValue": s.tid.to_string()})),
                    kv("bunkai.pc", json!({"stringValue": format!("{:#x}", s.pc)})),
                ],
            });
            if cut {
                // its process's buffer filled: later steps may be missing
                span["attributes"].as_array_mut().unwrap().push(kv("bunkai.flow.maybe_cut_short", json!({"boolValue": true})));
            }
            if k > 0 {
                span["parentSpanId"] = json!(format!("{:08x}{:08x}", (*id as u32) ^ (*id >> 32) as u32, k as u32));
            }
            per_buf[s.buf].push(span);
        }
    }
    let rs: Vec<Value> = bufs
        .iter()
        .zip(per_buf)
        .filter(|(_, spans)| !spans.is_empty())
        .map(|(b, spans)| {
            json!({
                "resource": {"attributes": [
                    kv("host.name", json!({"stringValue": b.host})),
                    kv("process.pid", json!({"intValue": b.pid.to_string()})),
                    kv("process.executable.path", json!({"stringValue": b.exe})),
                    kv("service.name", json!({"stringValue": short(&b.exe)})),
                    kv("bunkai.flow.dropped_records", json!({"intValue": b.dropped.to_string()})),
                ]},
                "scopeSpans": [{"scope": {"name": "bunkai-flow"}, "spans": spans}],
            })
        })
        .collect();
    json!({"resourceSpans": rs})
}

/// Flows drawn by --svg at most.
const SVG_FLOWS: usize = 12;
/// With more flows drawn than this, an overview of them on one clock
/// comes first.
const OVERVIEW_AFTER: usize = 3;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Table 2 as a picture, drawn with plotters' SVG backend: per flow (the
/// first `max`), a lane per process it visits, a dot per step at its time
/// since the flow's first step (round µs ticks, a titled axis), a line
/// through the steps in order (crossing lanes where the flow changes
/// process), and the name of each function where the flow first reaches
/// it, on whichever of three label rows has room. A legend says what the
/// marks are; with more than `OVERVIEW_AFTER` flows, an overview first
/// puts them on one clock, a bar each from its first step to its last.
/// A flow's line in the picture: its steps, the processes it passed and
/// how long it lasted (the overview's note and the flow's own title).
fn flow_summary(steps: &[Step], lanes: &[usize]) -> String {
    let span = (steps.last().unwrap().ns - steps[0].ns) as f64 / 1e3;
    format!(
        "{} steps, {} process{}, {span:.1} µs",
        steps.len(),
        lanes.len(),
        if lanes.len() == 1 { "" } else { "es" }
    )
}

fn svg(bufs: &[Buffer], flows: &BTreeMap<u64, Vec<Step>>, max: usize) -> Result<String> {
    use bunkai_common::plot::{self, FAMILY};
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    const W: u32 = 1100;
    const X0: u32 = 210;
    const LANE: u32 = 46;
    const HEAD: u32 = 26;
    const AXIS: u32 = 40;
    const GAP: u32 = 14;
    const TOP: u32 = 56;
    const ROW: u32 = 18;
    const COLOURS: [RGBColor; 6] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x17, 0xbe, 0xcf),
    ];
    plot::font();
    let ink = RGBColor(30, 30, 30);
    let grey = RGBColor(150, 150, 150);
    let style = |size: f64, c: &RGBColor| {
        let mut t = TextStyle::from((FAMILY, size).into_font());
        t.color = c.to_backend_color();
        t
    };
    // each flow with its lanes: the processes it visits, in order of visit
    let shown: Vec<(&u64, &Vec<Step>, Vec<usize>)> = flows
        .iter()
        .take(max)
        .map(|(id, steps)| {
            let mut lanes: Vec<usize> = Vec::new();
            for s in steps {
                if !lanes.contains(&s.buf) {
                    lanes.push(s.buf);
                }
            }
            (id, steps, lanes)
        })
        .collect();
    let overview = shown.len() > OVERVIEW_AFTER;
    let ov_h = if overview { HEAD + ROW * shown.len() as u32 + AXIS + GAP } else { 0 };
    let height = TOP + ov_h + shown.iter().map(|(_, _, l)| HEAD + LANE * l.len() as u32 + AXIS + GAP).sum::<u32>();
    let lane_name = |b: usize| {
        let name = format!("{}/{} {}", bufs[b].host, bufs[b].pid, short(&bufs[b].exe));
        let name: String = if name.chars().count() > 26 { name.chars().take(25).collect::<String>() + "…" } else { name };
        if bufs[b].dropped > 0 {
            format!("{name} ({} dropped)", bufs[b].dropped)
        } else {
            name
        }
    };
    let mut out = String::new();
    // each step's hover text, in the order its dot is drawn
    let mut titles: Vec<String> = Vec::new();
    {
        let root = SVGBackend::with_string(&mut out, (W, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot::err)?;
        root.draw_text(
            &format!(
                "bunkai flow report: {} of {} flow{}, each on its own time axis (µs since its first step)",
                shown.len(),
                bunkai_common::fmt::commas(flows.len() as u64),
                if flows.len() == 1 { "" } else { "s" }
            ),
            &style(15.0, &ink),
            (10, 8),
        )
        .map_err(plot::err)?;
        // the legend
        let ly = 34;
        let width = |t: &str, size: f64| root.estimate_text_size(t, &style(size, &ink)).map_or(7 * t.len() as i32, |(w, _)| w as i32);
        let mut x = 12;
        root.draw_text("●", &style(12.0, &COLOURS[0]), (x, ly - 1)).map_err(plot::err)?;
        let t = "a step, in its process's colour (hover: function, file:line, time)";
        root.draw_text(t, &style(11.0, &ink), (x + 16, ly)).map_err(plot::err)?;
        x += 16 + width(t, 11.0) + 24;
        root.draw(&PathElement::new(vec![(x, ly + 7), (x + 26, ly + 7)], grey)).map_err(plot::err)?;
        let t = "the flow's path, step to step";
        root.draw_text(t, &style(11.0, &ink), (x + 32, ly)).map_err(plot::err)?;
        x += 32 + width(t, 11.0) + 24;
        root.draw_text("name", &style(10.0, &RGBColor(0x33, 0x33, 0x33)), (x, ly + 1)).map_err(plot::err)?;
        root.draw_text(": a function, where the flow first reaches it", &style(11.0, &ink), (x + width("name", 10.0) + 2, ly))
            .map_err(plot::err)?;
        let mut y = TOP;
        if overview {
            let area = root.clone().shrink((0, y), (W, ov_h - GAP));
            area.draw_text(
                &format!("overview: the {} flows below on one clock, each from its first step to its last", shown.len()),
                &style(12.5, &ink),
                (10, 6),
            )
            .map_err(plot::err)?;
            let area = area.shrink((0, HEAD), (W, ov_h - GAP - HEAD));
            let t0 = shown.iter().map(|(_, s, _)| s[0].ns).min().unwrap_or(0);
            let t1 = shown.iter().map(|(_, s, _)| s.last().unwrap().ns).max().unwrap_or(t0);
            let xmax = ((t1 - t0) as f64 / 1e3).max(1e-3);
            let n = shown.len() as f64;
            let rows: Vec<(f64, String)> =
                shown.iter().enumerate().map(|(i, (id, _, _))| (n - i as f64 - 0.5, format!("flow {id:#x}"))).collect();
            let mut chart = ChartBuilder::on(&area)
                .margin_right(30)
                .y_label_area_size(X0)
                .x_label_area_size(AXIS)
                .build_cartesian_2d(0f64..xmax, 0f64..n)
                .map_err(plot::err)?;
            let us = |v: &f64| plot::us(*v);
            chart
                .configure_mesh()
                .disable_y_mesh()
                .max_light_lines(0)
                .x_labels(8)
                .y_labels(0)
                .x_label_formatter(&us)
                .label_style((FAMILY, 10.5))
                .axis_desc_style((FAMILY, 11.5))
                .x_desc("µs since the first of these flows began")
                .y_desc("flow")
                .draw()
                .map_err(plot::err)?;
            chart
                .draw_series(shown.iter().enumerate().map(|(i, (_, steps, _))| {
                    let yc = n - i as f64 - 0.5;
                    let a = (steps[0].ns - t0) as f64 / 1e3;
                    let b = ((steps.last().unwrap().ns - t0) as f64 / 1e3).max(a + xmax / 400.0);
                    Rectangle::new([(a, yc - 0.3), (b, yc + 0.3)], COLOURS[0].mix(0.75).filled())
                }))
                .map_err(plot::err)?;
            names_left_of(&root, &chart, &rows, &style(10.5, &ink))?;
            let right = Pos::new(HPos::Left, VPos::Center);
            chart
                .draw_series(shown.iter().enumerate().map(|(i, (_, steps, lanes))| {
                    let yc = n - i as f64 - 0.5;
                    let b = (steps.last().unwrap().ns - t0) as f64 / 1e3;
                    let what = format!(" {}", flow_summary(steps, lanes));
                    // past the middle, the note goes left of the bar's start
                    let (x, pos) = if b > xmax * 0.6 {
                        ((steps[0].ns - t0) as f64 / 1e3, Pos::new(HPos::Right, VPos::Center))
                    } else {
                        (b, right)
                    };
                    Text::new(what, (x, yc), style(10.0, &RGBColor(0x33, 0x33, 0x33)).pos(pos))
                }))
                .map_err(plot::err)?;
            y += ov_h;
        }
        for (id, steps, lanes) in &shown {
            let t0 = steps[0].ns;
            let span = (steps.last().unwrap().ns - t0) as f64 / 1e3;
            root.draw_text(
                &format!(
                    "flow {id:#x}: {}{}",
                    flow_summary(steps, lanes),
                    if cut_short(bufs, steps) { ", cut short? (a buffer it passed filled)" } else { "" }
                ),
                &style(12.5, &ink),
                (10, (y + 6) as i32),
            )
            .map_err(plot::err)?;
            let nl = lanes.len() as f64;
            let area = root.clone().shrink((0, y + HEAD), (W, LANE * lanes.len() as u32 + AXIS));
            let lane_y = |buf: usize| nl - lanes.iter().position(|&b| b == buf).unwrap_or(0) as f64 - 0.5;
            let names: Vec<(f64, String)> = lanes.iter().map(|&b| (lane_y(b), lane_name(b))).collect();
            let mut chart = ChartBuilder::on(&area)
                .margin_right(30)
                .y_label_area_size(X0)
                .x_label_area_size(AXIS)
                .build_cartesian_2d(0f64..span.max(1e-3), 0f64..nl)
                .map_err(plot::err)?;
            let us = |v: &f64| plot::us(*v);
            chart
                .configure_mesh()
                .disable_mesh()
                .x_labels(8)
                .y_labels(0)
                .x_label_formatter(&us)
                .label_style((FAMILY, 10.5))
                .axis_desc_style((FAMILY, 11.5))
                .x_desc("µs since the flow's first step")
                .y_desc("process")
                .draw()
                .map_err(plot::err)?;
            let shades = [RGBColor(0xf7, 0xf7, 0xfa), RGBColor(0xee, 0xee, 0xf3)];
            chart
                .draw_series((0..lanes.len()).map(|k| {
                    let top = nl - k as f64;
                    Rectangle::new([(0.0, top), (span.max(1e-3), top - 1.0)], shades[k % 2].filled())
                }))
                .map_err(plot::err)?;
            names_left_of(&root, &chart, &names, &style(10.5, &ink))?;
            let at = |s: &Step| ((s.ns - t0) as f64 / 1e3, lane_y(s.buf));
            chart.draw_series(std::iter::once(PathElement::new(steps.iter().map(at).collect::<Vec<_>>(), grey))).map_err(plot::err)?;
            let colour = |s: &Step| COLOURS[lanes.iter().position(|&b| b == s.buf).unwrap_or(0) % COLOURS.len()];
            chart.draw_series(steps.iter().map(|s| Circle::new(at(s), 3, colour(s).filled()))).map_err(plot::err)?;
            titles.extend(steps.iter().map(|s| {
                format!("{} {}:{} +{:.3} µs", s.function, short(&s.file), s.line, (s.ns - t0) as f64 / 1e3)
            }));
            // labels: three rows per lane (above, below, further above),
            // each keeping where its last label ended, in pixels
            let (px0, px1) = (chart.backend_coord(&(0.0, 0.0)).0, chart.backend_coord(&(span.max(1e-3), 0.0)).0);
            let mut ends: HashMap<(usize, usize), i32> = HashMap::new();
            let mut named: Vec<&str> = Vec::new();
            let label_style = style(10.0, &RGBColor(0x33, 0x33, 0x33));
            for s in steps.iter() {
                if named.contains(&s.function.as_str()) {
                    continue;
                }
                named.push(&s.function);
                let (x, cy) = chart.backend_coord(&at(s));
                let k = lanes.iter().position(|&b| b == s.buf).unwrap_or(0);
                let w = root.estimate_text_size(&s.function, &label_style).map_or(6 * s.function.len() as i32, |(w, _)| w as i32);
                let lx = x.min(px1 - w).max(px0 + 2);
                for (row, dy) in [(0, -16), (1, 5), (2, -27)] {
                    let end = ends.entry((k, row)).or_insert(i32::MIN);
                    if lx > end.saturating_add(4) {
                        *end = lx + w;
                        root.draw_text(&s.function, &label_style, (lx, cy + dy)).map_err(plot::err)?;
                        break;
                    }
                }
            }
            y += HEAD + LANE * lanes.len() as u32 + AXIS + GAP;
        }
        root.present().map_err(plot::err)?;
    }
    Ok(with_titles(&out, &titles))
}

/// Names the rows of a chart (lanes, flows) left of its plot, each
/// centred on its row: plotters' own tick labels are placed on round
/// values, not on categories.
fn names_left_of<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    chart: &plotters::prelude::ChartContext<
        DB,
        plotters::coord::cartesian::Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    names: &[(f64, String)],
    style: &plotters::style::TextStyle,
) -> Result<()> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let st = style.pos(Pos::new(HPos::Right, VPos::Center));
    for (y, name) in names {
        let (x, py) = chart.backend_coord(&(0.0, *y));
        root.draw_text(name, &st, (x - 6, py)).map_err(bunkai_common::plot::err)?;
    }
    Ok(())
}

/// plotters writes no element titles, so each step's hover text is added
/// to its dot afterwards: the dots are the picture's only circles, one a
/// line, in the order they were drawn.
fn with_titles(svg: &str, titles: &[String]) -> String {
    let mut t = titles.iter();
    let mut o = String::with_capacity(svg.len() + titles.iter().map(|x| x.len() + 30).sum::<usize>());
    for line in svg.lines() {
        let dot = line.strip_suffix("/>").filter(|_| line.starts_with("<circle "));
        match dot.and_then(|d| Some((d, t.next()?))) {
            Some((d, title)) => {
                o.push_str(d);
                o.push_str("><title>");
                o.push_str(&esc(title));
                o.push_str("</title></circle>");
            }
            None => o.push_str(line),
        }
        o.push('\n');
    }
    debug_assert!(t.next().is_none(), "fewer dots than steps");
    o
}

#[cfg(test)]
mod svg_tests {
    #[test]
    fn each_dot_gets_its_steps_hover_text() {
        let svg = "<svg>\n<circle cx=\"1\" r=\"3\"/>\n<text>\nf\n</text>\n<circle cx=\"2\" r=\"3\"/>\n</svg>\n";
        let out = super::with_titles(svg, &["a <b> x.c:1".into(), "c".into()]);
        assert_eq!(
            out,
            "<svg>\n<circle cx=\"1\" r=\"3\"><title>a &lt;b&gt; x.c:1</title></circle>\n<text>\nf\n</text>\n<circle cx=\"2\" r=\"3\"><title>c</title></circle>\n</svg>\n"
        );
    }
}
