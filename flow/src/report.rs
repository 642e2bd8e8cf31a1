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
use std::fmt::Write;
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
        bunkai_common::files::write_atomic(p, svg(&bufs, &flows, SVG_FLOWS).as_bytes())?;
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

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round number of µs near t / 4, for the axis ticks.
fn tick(t: f64) -> f64 {
    let raw = (t / 4.0).max(1e-3);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|&v| v >= raw).unwrap_or(10.0 * p)
}

/// Table 2 as a picture: per flow (the first `max`), a lane per process it
/// visits, a dot per step at its time since the flow's first step, a line
/// through the steps in order (crossing lanes where the flow changes
/// process), and the name of each function where the flow first reaches
/// it, on whichever of three label rows has room.
fn svg(bufs: &[Buffer], flows: &BTreeMap<u64, Vec<Step>>, max: usize) -> String {
    const W: f64 = 1100.0;
    const X0: f64 = 190.0;
    const PW: f64 = W - X0 - 30.0;
    const LANE: f64 = 46.0;
    const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];
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
    let height: f64 = 40.0 + shown.iter().map(|(_, _, lanes)| 30.0 + LANE * lanes.len() as f64 + 26.0).sum::<f64>();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-family=\"monospace\" font-size=\"11\">"
    );
    let _ = writeln!(o, "<rect width=\"{W}\" height=\"{height}\" fill=\"white\"/>");
    let _ = writeln!(
        o,
        "<text x=\"10\" y=\"20\" font-size=\"13\">bunkai flow report: {} of {} flow{}, each on its own time axis (µs since its first step)</text>",
        shown.len(),
        bunkai_common::fmt::commas(flows.len() as u64),
        if flows.len() == 1 { "" } else { "s" }
    );
    let mut y = 40.0;
    for (id, steps, lanes) in &shown {
        let t0 = steps[0].ns;
        let span = (steps.last().unwrap().ns - t0) as f64 / 1e3;
        let scale = if span > 0.0 { PW / span } else { 0.0 };
        let _ = writeln!(
            o,
            "<text x=\"10\" y=\"{}\" font-size=\"12\" font-weight=\"bold\">flow {id:#x}: {} steps, {} process{}, {span:.1} µs{}</text>",
            y + 14.0,
            steps.len(),
            lanes.len(),
            if lanes.len() == 1 { "" } else { "es" },
            if cut_short(bufs, steps) { ", cut short? (a buffer it passed filled)" } else { "" }
        );
        y += 30.0;
        let lane_y = |buf: usize| y + LANE * lanes.iter().position(|&b| b == buf).unwrap_or(0) as f64 + LANE / 2.0;
        for (k, &b) in lanes.iter().enumerate() {
            let ly = y + LANE * k as f64;
            let fill = if k % 2 == 0 { "#f7f7fa" } else { "#eeeef3" };
            let _ = writeln!(o, "<rect x=\"{X0}\" y=\"{ly}\" width=\"{PW}\" height=\"{LANE}\" fill=\"{fill}\"/>");
            let name = format!("{}/{} {}", bufs[b].host, bufs[b].pid, short(&bufs[b].exe));
            let name: String = if name.chars().count() > 26 { name.chars().take(25).collect::<String>() + "~" } else { name };
            let name = if bufs[b].dropped > 0 { format!("{name} ({} dropped)", bufs[b].dropped) } else { name };
            let _ = writeln!(
                o,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"{}\">{}</text>",
                X0 - 8.0,
                ly + LANE / 2.0 + 4.0,
                COLOURS[k % COLOURS.len()],
                esc(&name)
            );
        }
        let x_of = |s: &Step| X0 + (s.ns - t0) as f64 / 1e3 * scale;
        let pts: Vec<String> = steps.iter().map(|s| format!("{:.1},{:.1}", x_of(s), lane_y(s.buf))).collect();
        let _ = writeln!(o, "<polyline points=\"{}\" fill=\"none\" stroke=\"#999\" stroke-width=\"1\"/>", pts.join(" "));
        // labels: three rows per lane (above, below, further above), each
        // keeping where its last label ended
        let mut ends: HashMap<(usize, usize), f64> = HashMap::new();
        let mut named: Vec<&str> = Vec::new();
        for s in steps.iter() {
            let (x, cy) = (x_of(s), lane_y(s.buf));
            let k = lanes.iter().position(|&b| b == s.buf).unwrap_or(0);
            let c = COLOURS[k % COLOURS.len()];
            let _ = writeln!(
                o,
                "<circle cx=\"{x:.1}\" cy=\"{cy:.1}\" r=\"3\" fill=\"{c}\"><title>{} {}:{} +{:.3} µs</title></circle>",
                esc(&s.function),
                esc(short(&s.file)),
                s.line,
                (s.ns - t0) as f64 / 1e3
            );
            if named.contains(&s.function.as_str()) {
                continue;
            }
            named.push(&s.function);
            let w = 6.6 * s.function.chars().count() as f64;
            let lx = x.min(X0 + PW - w).max(X0 + 2.0);
            for (row, dy) in [(0, -7.0), (1, 15.0), (2, -17.0)] {
                let end = ends.entry((k, row)).or_insert(f64::MIN);
                if lx > *end + 4.0 {
                    *end = lx + w;
                    let _ = writeln!(o, "<text x=\"{lx:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"#333\">{}</text>", cy + dy, esc(&s.function));
                    break;
                }
            }
        }
        y += LANE * lanes.len() as f64;
        // the time axis
        let _ = writeln!(o, "<line x1=\"{X0}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#666\"/>", X0 + PW);
        if span > 0.0 {
            let step = tick(span);
            let mut t = 0.0;
            while t <= span * 1.0001 {
                let x = X0 + t * scale;
                let _ = writeln!(o, "<line x1=\"{x:.1}\" y1=\"{y}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#666\"/>", y + 4.0);
                let _ = writeln!(o, "<text x=\"{x:.1}\" y=\"{}\" font-size=\"9\" text-anchor=\"middle\" fill=\"#666\">{}</text>", y + 14.0, fmt_us(t));
                t += step;
            }
        }
        y += 26.0;
    }
    o.push_str("</svg>\n");
    o
}

fn fmt_us(t: f64) -> String {
    if t == 0.0 {
        "0".into()
    } else if t >= 10.0 {
        format!("{t:.0}")
    } else {
        format!("{t:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}
