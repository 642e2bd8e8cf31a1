//! `bunkai trace report`: the paper's Tables 1-6 and its §4 estimate.
//!
//! The paper (§2.3) ran three analysis programs over TURU's log: one
//! counting dynamic instructions per component (Tables 1 and 4), one
//! counting the pages each component touched for code and for data
//! (Tables 2 and 5) and one giving the reference counts per page (Tables 3
//! and 6); §4 then turns page and syscall counts into an estimate of what
//! TLB misses and segment-register reloads cost. This module does all of
//! it in one pass over the trace.
//!
//! Components: a stream's program (the object whose path is its HELLO
//! executable), each shared library, merged by name over all streams, and
//! "kernel", which Valgrind cannot see into: it reports syscalls and the
//! time spent in them instead of instructions and pages. Pages are 4 KiB
//! and counted per address space (each stream is one; a forked child or an
//! exec'd image counts its pages again, as the paper's CR3 would).
//!
//! Speed: a segment execution only bumps a counter (its instructions'
//! pages are expanded from the static definition at the end); a memory
//! reference costs one hash-map update, skipped when it falls on the same
//! (component, page) as the previous one.

use crate::decode::{basename, Event, Item, Trace, NOT_PERFORMED};
use anyhow::{Context, Result};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

pub const PAGE_SHIFT: u32 = 12;

/// Print the paper's Tables 1-6 and its §4 overhead estimate for a trace
#[derive(clap::Args, Debug)]
#[command(long_about = "Print the paper's tables for a trace: dynamic instructions per component \
(Tables 1/4), pages used for code and data (Tables 2/5), references per page (Tables 3/6), and the \
§4 estimate of what TLB misses and syscall/address-space switches cost on a CPU model. The kernel \
row reports syscalls and time in syscalls, since Valgrind cannot see kernel instructions.")]
pub struct ReportArgs {
    /// Trace file written by `bunkai trace record`
    pub file: PathBuf,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
    /// CPU model for the §4 estimate: pentium (the paper's), modern, or a JSON file with the same keys
    #[arg(long, default_value = "pentium", value_name = "pentium|modern|PATH.json")]
    pub cpu: String,
    /// Cycles the traced work took (the paper measured 817,599 for one HTML request)
    #[arg(long, value_name = "N", conflicts_with = "seconds")]
    pub cycles: Option<u64>,
    /// Seconds the traced work took; cycles = seconds x the model's frequency
    #[arg(long, value_name = "S")]
    pub seconds: Option<f64>,
}

pub fn run(a: &ReportArgs) -> Result<ExitCode> {
    let cpu = cpu_model(&a.cpu)?;
    if a.cycles == Some(0) {
        anyhow::bail!("--cycles 0: give the cycles the traced work took (e.g. --cycles 817599)");
    }
    if let Some(s) = a.seconds {
        if !(s.is_finite() && s > 0.0) {
            anyhow::bail!("--seconds {s} is not a positive number of seconds (give e.g. --seconds 0.00818)");
        }
    }
    let trace = Trace::load(&a.file)?;
    let r = report(&trace, &ReportOptions { cpu, cycles: a.cycles, seconds: a.seconds })?;
    crate::decode::to_stdout(|w| {
        if a.json {
            serde_json::to_writer_pretty(&mut *w, &r)?;
            writeln!(w)?;
        } else {
            w.write_all(r.text().as_bytes())?;
        }
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------
// Components

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Program,
    Library,
    Kernel,
}

#[derive(Debug, Clone)]
pub struct Component {
    pub name: String,
    pub kind: Kind,
}

/// Which component every instruction and access of every segment belongs
/// to. Shared by `report` and `pages`.
pub struct Components {
    pub list: Vec<Component>,
    /// Per stream, per segment position: the component of each instruction.
    pub insn: Vec<Vec<Vec<u32>>>,
    /// Per stream, per segment position: the component of each access (that
    /// of the instruction making it).
    pub acc: Vec<Vec<Vec<u32>>>,
}

impl Components {
    pub fn new(trace: &Trace) -> Components {
        let mut list: Vec<Component> = Vec::new();
        let mut by_name: HashMap<String, u32> = HashMap::new();
        let mut insn = Vec::with_capacity(trace.streams.len());
        let mut acc = Vec::with_capacity(trace.streams.len());
        for st in &trace.streams {
            let mut of_obj: FxHashMap<u64, u32> = FxHashMap::default();
            let mut comp_of = |obj: u64| -> u32 {
                if let Some(&c) = of_obj.get(&obj) {
                    return c;
                }
                let (name, kind) = match st.objects.get(&obj) {
                    Some(o) if st.is_program(o) => (basename(&o.name).to_string(), Kind::Program),
                    Some(o) => (basename(&o.name).to_string(), Kind::Library),
                    None => (st.object_name(obj), Kind::Library),
                };
                let c = *by_name.entry(name.clone()).or_insert_with(|| {
                    list.push(Component { name, kind });
                    list.len() as u32 - 1
                });
                if kind == Kind::Program {
                    list[c as usize].kind = Kind::Program;
                }
                of_obj.insert(obj, c);
                c
            };
            let mut si = Vec::with_capacity(st.segs.len());
            let mut sa = Vec::with_capacity(st.segs.len());
            for seg in &st.segs {
                let ic: Vec<u32> = seg.insns.iter().map(|i| comp_of(i.obj)).collect();
                let ac: Vec<u32> = (0..seg.accs.len())
                    .map(|k| match seg.accs[k].index() {
                        Some(i) => ic[i],
                        // The instruction in flight: its object if known, else
                        // the segment's own.
                        None => comp_of(seg.in_flight.or(seg.insns.first().copied()).map_or(0, |i| i.obj)),
                    })
                    .collect();
                sa.push(ac);
                si.push(ic);
            }
            insn.push(si);
            acc.push(sa);
        }
        Components { list, insn, acc }
    }
}

// ---------------------------------------------------------------------------
// Counting

/// Page -> references, for one component in one address space.
pub type PageCounts = FxHashMap<u64, u64>;

/// What one stream (one address space) did.
#[derive(Default)]
pub struct StreamCounts {
    /// Per component: code page -> instruction executions on it.
    pub code: Vec<PageCounts>,
    /// Per component: data page -> references (L, S and M count 1 each).
    pub data: Vec<PageCounts>,
    /// Per component: dynamic instructions.
    pub instructions_by: Vec<u64>,
    pub instructions: u64,
    pub memory_references: u64,
    pub syscalls: u64,
    pub syscall_ns: u64,
    /// First and last BKT_EV_CTXSW (voluntary + involuntary).
    pub ctxsw_first: Option<u64>,
    pub ctxsw_last: Option<u64>,
    /// The stream ended with BKT_EV_EXEC.
    pub exec: bool,
}

impl StreamCounts {
    /// Context switches between the first and the last CTXSW event.
    pub fn context_switches(&self) -> Option<u64> {
        Some(self.ctxsw_last?.saturating_sub(self.ctxsw_first?))
    }
}

/// Counts of a whole trace.
pub struct Analysis {
    pub comps: Components,
    pub streams: Vec<StreamCounts>,
    pub instructions: u64,
    pub memory_references: u64,
    /// Wall time of the pass.
    pub seconds: f64,
}

impl Analysis {
    pub fn records(&self) -> u64 {
        self.instructions + self.memory_references
    }
}

/// One pass over every stream: instructions, pages and references per
/// component, syscalls, context switches.
pub fn analyze(trace: &Trace) -> Result<Analysis> {
    let t0 = Instant::now();
    let comps = Components::new(trace);
    let nc = comps.list.len();
    let mut counts: Vec<StreamCounts> = trace
        .streams
        .iter()
        .map(|_| StreamCounts {
            code: vec![PageCounts::default(); nc],
            data: vec![PageCounts::default(); nc],
            instructions_by: vec![0; nc],
            ..Default::default()
        })
        .collect();
    let mut execs: Vec<Vec<u64>> = trace.streams.iter().map(|s| vec![0u64; s.segs.len()]).collect();

    // The (stream, component, page) of the last data reference and how
    // many references in a row fell on it.
    let mut last = (usize::MAX, 0u32, 0u64);
    let mut run = 0u64;
    let all: Vec<usize> = (0..trace.streams.len()).collect();
    let visited = trace.visit(&all, |pos, item| {
        let s = pos.stream;
        match item {
            Item::Exec { seg_pos, addrs, .. } => {
                execs[s][seg_pos] += 1;
                if !addrs.is_empty() {
                    let acc = &comps.acc[s][seg_pos];
                    for (&a, &c) in addrs.iter().zip(acc) {
                        if a == NOT_PERFORMED {
                            continue;
                        }
                        let page = a >> PAGE_SHIFT;
                        if page == last.2 && c == last.1 && s == last.0 {
                            run += 1;
                        } else {
                            if run > 0 {
                                *counts[last.0].data[last.1 as usize].entry(last.2).or_insert(0) += run;
                            }
                            last = (s, c, page);
                            run = 1;
                        }
                    }
                }
            }
            Item::Event(ev) => {
                let sc = &mut counts[s];
                match ev {
                    Event::Syscall { duration_ns, .. } => {
                        sc.syscalls += 1;
                        sc.syscall_ns = sc.syscall_ns.saturating_add(*duration_ns);
                    }
                    Event::CtxSw { voluntary, involuntary } => {
                        let n = voluntary.saturating_add(*involuntary);
                        sc.ctxsw_first.get_or_insert(n);
                        sc.ctxsw_last = Some(n);
                    }
                    Event::Exec { .. } => sc.exec = true,
                    _ => {}
                }
            }
        }
        ControlFlow::Continue(())
    })?;
    if run > 0 {
        *counts[last.0].data[last.1 as usize].entry(last.2).or_insert(0) += run;
    }

    // Expand segment executions into instruction counts per code page.
    for (s, st) in trace.streams.iter().enumerate() {
        let sc = &mut counts[s];
        for (p, &e) in execs[s].iter().enumerate() {
            if e == 0 {
                continue;
            }
            let seg = &st.segs[p];
            for (insn, &c) in seg.insns.iter().zip(&comps.insn[s][p]) {
                *sc.code[c as usize].entry(insn.addr >> PAGE_SHIFT).or_insert(0) += e;
                sc.instructions_by[c as usize] += e;
            }
            sc.instructions += e * seg.insns.len() as u64;
            sc.memory_references += e * seg.accs.len() as u64;
        }
    }
    Ok(Analysis {
        comps,
        streams: counts,
        instructions: visited.instructions,
        memory_references: visited.memory_references,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

// ---------------------------------------------------------------------------
// CPU models

/// A CPU for the §4 estimate (trace/cpu/*.json).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuModel {
    pub name: String,
    pub frequency_hz: f64,
    pub tlb_miss_cycles_min: f64,
    pub tlb_miss_cycles_max: f64,
    /// Cycles per syscall and per address-space switch.
    pub switch_cycles: f64,
    /// Cycles per instruction, when the cycles are not given.
    pub cpi: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

pub const PENTIUM_JSON: &str = include_str!("../cpu/pentium.json");
pub const MODERN_JSON: &str = include_str!("../cpu/modern.json");

/// "pentium", "modern", or the path of a JSON file with the same keys.
pub fn cpu_model(spec: &str) -> Result<CpuModel> {
    let fix = "give --cpu pentium, --cpu modern, or a JSON file with the keys name, frequency_hz, \
               tlb_miss_cycles_min, tlb_miss_cycles_max, switch_cycles, cpi";
    let (text, what) = match spec {
        "pentium" => (PENTIUM_JSON.to_string(), "pentium".to_string()),
        "modern" => (MODERN_JSON.to_string(), "modern".to_string()),
        path => (
            std::fs::read_to_string(path).with_context(|| format!("cannot read CPU model {path} ({fix})"))?,
            path.to_string(),
        ),
    };
    let m: CpuModel = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("CPU model {what}: {e} ({fix})"))?;
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if !(ok(m.frequency_hz)
        && m.frequency_hz > 0.0
        && ok(m.tlb_miss_cycles_min)
        && ok(m.tlb_miss_cycles_max)
        && ok(m.switch_cycles)
        && ok(m.cpi))
        || m.tlb_miss_cycles_min > m.tlb_miss_cycles_max
    {
        anyhow::bail!("CPU model {what}: values must be non-negative numbers, frequency_hz > 0, min <= max ({fix})");
    }
    Ok(m)
}

// ---------------------------------------------------------------------------
// The report

#[derive(Debug, Clone, Serialize)]
pub struct RefStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
}

fn ref_stats<'a>(pages: impl Iterator<Item = &'a u64>) -> (u64, Option<RefStats>) {
    let (mut n, mut min, mut max, mut sum) = (0u64, u64::MAX, 0u64, 0u128);
    for &r in pages {
        n += 1;
        min = min.min(r);
        max = max.max(r);
        sum += r as u128;
    }
    if n == 0 {
        return (0, None);
    }
    (n, Some(RefStats { min, max, mean: sum as f64 / n as f64 }))
}

/// One row of Tables 1-3.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentRow {
    pub name: String,
    pub kind: Kind,
    /// Dynamic instructions (null for the kernel).
    pub instructions: Option<u64>,
    /// Percent of all user-mode instructions.
    pub percent: Option<f64>,
    pub code_pages: Option<u64>,
    pub data_pages: Option<u64>,
    /// Instruction executions per code page.
    pub code_refs: Option<RefStats>,
    /// References per data page.
    pub data_refs: Option<RefStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscalls: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamRow {
    pub stream: u32,
    pub pid: u64,
    pub ppid: u64,
    pub executable: String,
    pub argv: Vec<String>,
    pub instructions: u64,
    pub memory_references: u64,
    pub syscalls: u64,
    /// Increase of the context-switch counters over the stream.
    pub context_switches: Option<u64>,
    /// "exit" (BYE seen), "exec" (replaced by an exec) or "abnormal".
    pub ended: &'static str,
    pub exit_status: Option<u64>,
    /// Segment executions the tool could not store (buffer mode).
    pub dropped: Option<u64>,
}

/// The §4 estimate.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    pub cpu: CpuModel,
    /// Cycles of the traced work.
    pub cycles: f64,
    pub cycles_source: String,
    pub code_pages: u64,
    pub data_pages: u64,
    /// Code + data pages of the programs and the shared libraries (total),
    /// as the paper sums its Table 2; each costs one TLB miss.
    pub pages: u64,
    pub tlb_cycles_min: f64,
    pub tlb_cycles_max: f64,
    pub tlb_percent_min: f64,
    pub tlb_percent_max: f64,
    pub syscalls: u64,
    pub address_space_switches: u64,
    pub switch_cycles: f64,
    pub switch_percent: f64,
    pub overhead_cycles_min: f64,
    pub overhead_cycles_max: f64,
    pub overhead_percent_min: f64,
    pub overhead_percent_max: f64,
    /// frequency / cycles, if the trace is one request.
    pub requests_per_second_before: f64,
    /// Without the overhead (min and max estimate); null if the overhead
    /// would be all the cycles.
    pub requests_per_second_after_min: Option<f64>,
    pub requests_per_second_after_max: Option<f64>,
}

/// Everything `report` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub trace: String,
    pub streams: Vec<StreamRow>,
    pub components: Vec<ComponentRow>,
    /// All libraries as one component, the paper's "shared libraries";
    /// pages are distinct over the libraries of each address space.
    pub shared_libraries_total: ComponentRow,
    /// User-mode instructions (Valgrind sees no kernel instructions).
    pub total_instructions: u64,
    pub memory_references: u64,
    pub syscalls: u64,
    pub syscall_seconds: f64,
    /// Sum over streams of the context switches measured under Valgrind
    /// between the first and the last BKT_EV_CTXSW of the stream.
    pub address_space_switches: u64,
    pub address_space_switches_note: String,
    pub estimate: Estimate,
    /// Instructions + memory references decoded.
    pub records: u64,
    /// Seconds the decoding and counting took.
    pub seconds: f64,
    pub records_per_second: f64,
    pub warnings: Vec<String>,
}

/// Options of the §4 estimate.
pub struct ReportOptions {
    pub cpu: CpuModel,
    pub cycles: Option<u64>,
    pub seconds: Option<f64>,
}

const LIBS_TOTAL: &str = "shared libraries (total)";
const KERNEL_NOTE: &str = "Valgrind runs the program on a simulated CPU in user mode and cannot see \
kernel instructions or pages; the kernel row gives the syscalls and the time spent in them instead \
(measured under Valgrind, so slower than native).";
const SWITCH_NOTE: &str = "context switches measured under Valgrind (voluntary + involuntary, \
/proc/self/status), summed over the streams; the paper counted CR3 changes";

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// Builds a component row from per-address-space page maps.
fn row(
    name: String,
    kind: Kind,
    instructions: u64,
    total: u64,
    code: &[&PageCounts],
    data: &[&PageCounts],
) -> ComponentRow {
    let (code_pages, code_refs) = ref_stats(code.iter().flat_map(|m| m.values()));
    let (data_pages, data_refs) = ref_stats(data.iter().flat_map(|m| m.values()));
    ComponentRow {
        name,
        kind,
        instructions: Some(instructions),
        percent: Some(pct(instructions as f64, total as f64)),
        code_pages: Some(code_pages),
        data_pages: Some(data_pages),
        code_refs,
        data_refs,
        syscalls: None,
        syscall_seconds: None,
        note: None,
    }
}

/// Union of page maps (one address space), adding the counts.
fn union(maps: impl Iterator<Item = PageCounts>) -> PageCounts {
    let mut u = PageCounts::default();
    for m in maps {
        for (p, n) in m {
            *u.entry(p).or_insert(0) += n;
        }
    }
    u
}

/// Analyses a trace and computes the tables and the estimate.
pub fn report(trace: &Trace, opts: &ReportOptions) -> Result<Report> {
    let a = analyze(trace)?;
    Ok(report_from(trace, &a, opts))
}

pub fn report_from(trace: &Trace, a: &Analysis, opts: &ReportOptions) -> Report {
    let total = a.instructions;
    let mut components = Vec::new();
    for (c, comp) in a.comps.list.iter().enumerate() {
        let instructions: u64 = a.streams.iter().map(|s| s.instructions_by[c]).sum();
        if instructions == 0 {
            continue;
        }
        let code: Vec<&PageCounts> = a.streams.iter().map(|s| &s.code[c]).collect();
        let data: Vec<&PageCounts> = a.streams.iter().map(|s| &s.data[c]).collect();
        components.push(row(comp.name.clone(), comp.kind, instructions, total, &code, &data));
    }
    components.sort_by(|x, y| {
        (x.kind != Kind::Program, std::cmp::Reverse(x.instructions), &x.name).cmp(&(
            y.kind != Kind::Program,
            std::cmp::Reverse(y.instructions),
            &y.name,
        ))
    });

    // The libraries as one component: pages distinct per address space.
    let libs: Vec<usize> = (0..a.comps.list.len()).filter(|&c| a.comps.list[c].kind == Kind::Library).collect();
    let lib_code: Vec<PageCounts> = a.streams.iter().map(|s| union(libs.iter().map(|&c| s.code[c].clone()))).collect();
    let lib_data: Vec<PageCounts> = a.streams.iter().map(|s| union(libs.iter().map(|&c| s.data[c].clone()))).collect();
    let lib_instr: u64 = a.streams.iter().map(|s| libs.iter().map(|&c| s.instructions_by[c]).sum::<u64>()).sum();
    let shared_libraries_total = row(
        LIBS_TOTAL.into(),
        Kind::Library,
        lib_instr,
        total,
        &lib_code.iter().collect::<Vec<_>>(),
        &lib_data.iter().collect::<Vec<_>>(),
    );

    let syscalls: u64 = a.streams.iter().map(|s| s.syscalls).sum();
    let syscall_ns: u64 = a.streams.iter().map(|s| s.syscall_ns).fold(0, u64::saturating_add);
    let syscall_seconds = syscall_ns as f64 / 1e9;
    components.push(ComponentRow {
        name: "kernel".into(),
        kind: Kind::Kernel,
        instructions: None,
        percent: None,
        code_pages: None,
        data_pages: None,
        code_refs: None,
        data_refs: None,
        syscalls: Some(syscalls),
        syscall_seconds: Some(syscall_seconds),
        note: Some(KERNEL_NOTE.into()),
    });
    let address_space_switches: u64 = a.streams.iter().filter_map(|s| s.context_switches()).sum();

    let mut warnings = Vec::new();
    let mut streams = Vec::new();
    for (st, sc) in trace.streams.iter().zip(&a.streams) {
        let ended = match (&st.bye, sc.exec) {
            (Some(_), _) => "exit",
            (None, true) => "exec",
            (None, false) => "abnormal",
        };
        if let Some(b) = &st.bye {
            if b.dropped > 0 {
                warnings.push(format!(
                    "stream {} (pid {}): {} segment executions did not fit the tool's buffer and are missing",
                    st.id, st.hello.pid, b.dropped
                ));
            } else if b.instructions != sc.instructions || b.memory_references != sc.memory_references {
                warnings.push(format!(
                    "stream {} (pid {}): the tool counted {} instructions and {} references, the trace holds {} and {}",
                    st.id, st.hello.pid, b.instructions, b.memory_references, sc.instructions, sc.memory_references
                ));
            }
        } else if ended == "abnormal" {
            warnings.push(format!(
                "stream {} (pid {}, {}): no BYE, the process was killed or the recording cut short",
                st.id,
                st.hello.pid,
                st.program_name()
            ));
        }
        streams.push(StreamRow {
            stream: st.id,
            pid: st.hello.pid,
            ppid: st.hello.ppid,
            executable: st.hello.executable.clone(),
            argv: st.hello.argv.clone(),
            instructions: sc.instructions,
            memory_references: sc.memory_references,
            syscalls: sc.syscalls,
            context_switches: sc.context_switches(),
            ended,
            exit_status: st.bye.as_ref().map(|b| b.exit_status),
            dropped: st.bye.as_ref().map(|b| b.dropped),
        });
    }
    if trace.streams.iter().any(|s| s.hello.flags & crate::decode::F_MEM == 0) {
        warnings.push("some streams were recorded without memory references: their data pages are 0".into());
    }

    // §4: pages as the paper sums them (programs + the libraries as one).
    let (mut code_pages, mut data_pages) = (0u64, 0u64);
    for r in components.iter().filter(|r| r.kind == Kind::Program).chain([&shared_libraries_total]) {
        code_pages += r.code_pages.unwrap_or(0);
        data_pages += r.data_pages.unwrap_or(0);
    }
    let estimate = estimate(&opts.cpu, opts, total, code_pages, data_pages, syscalls, address_space_switches);
    let records = a.records();
    Report {
        trace: trace.file.path.display().to_string(),
        streams,
        components,
        shared_libraries_total,
        total_instructions: total,
        memory_references: a.memory_references,
        syscalls,
        syscall_seconds,
        address_space_switches,
        address_space_switches_note: SWITCH_NOTE.into(),
        estimate,
        records,
        seconds: a.seconds,
        records_per_second: if a.seconds > 0.0 { records as f64 / a.seconds } else { 0.0 },
        warnings,
    }
}

/// The paper's §4 arithmetic.
pub fn estimate(
    cpu: &CpuModel,
    opts: &ReportOptions,
    instructions: u64,
    code_pages: u64,
    data_pages: u64,
    syscalls: u64,
    switches: u64,
) -> Estimate {
    let (cycles, cycles_source) = match (opts.cycles, opts.seconds) {
        (Some(c), _) => (c as f64, "given (--cycles)".to_string()),
        (None, Some(s)) => (s * cpu.frequency_hz, format!("{s} s x {} Hz (--seconds)", cpu.frequency_hz)),
        (None, None) => (
            instructions as f64 * cpu.cpi,
            format!(
                "estimated: {instructions} user-mode instructions x CPI {} (kernel instructions not included; give --cycles or --seconds)",
                cpu.cpi
            ),
        ),
    };
    let pages = code_pages + data_pages;
    let tlb_min = pages as f64 * cpu.tlb_miss_cycles_min;
    let tlb_max = pages as f64 * cpu.tlb_miss_cycles_max;
    let sw = (syscalls + switches) as f64 * cpu.switch_cycles;
    let rps = |c: f64| if c > 0.0 { Some(cpu.frequency_hz / c) } else { None };
    Estimate {
        cpu: cpu.clone(),
        cycles,
        cycles_source,
        code_pages,
        data_pages,
        pages,
        tlb_cycles_min: tlb_min,
        tlb_cycles_max: tlb_max,
        tlb_percent_min: pct(tlb_min, cycles),
        tlb_percent_max: pct(tlb_max, cycles),
        syscalls,
        address_space_switches: switches,
        switch_cycles: sw,
        switch_percent: pct(sw, cycles),
        overhead_cycles_min: tlb_min + sw,
        overhead_cycles_max: tlb_max + sw,
        overhead_percent_min: pct(tlb_min + sw, cycles),
        overhead_percent_max: pct(tlb_max + sw, cycles),
        requests_per_second_before: rps(cycles).unwrap_or(0.0),
        requests_per_second_after_min: rps(cycles - tlb_min - sw),
        requests_per_second_after_max: rps(cycles - tlb_max - sw),
    }
}

// ---------------------------------------------------------------------------
// Text

/// Thousands separators: 1234567 -> "1,234,567".
use bunkai_common::fmt::commas;

fn fcommas(v: f64) -> String {
    if v.is_finite() && v >= 0.0 {
        commas(v.round() as u64)
    } else {
        format!("{v}")
    }
}

/// A note wrapped at 100 columns, indented.
fn wrap(head: &str, text: &str) -> String {
    let mut out = String::new();
    let mut line = format!("  {head}");
    let indent = " ".repeat(line.len());
    for word in text.split_whitespace() {
        if line.len() + word.len() + 1 > 100 && line.trim().len() > head.trim().len() {
            out += line.trim_end();
            out.push('\n');
            line = indent.clone();
        }
        if !line.ends_with(' ') {
            line.push(' ');
        }
        line += word;
    }
    out += line.trim_end();
    out.push('\n');
    out
}

/// A percentage with two decimals below 1%.
fn pc(v: f64) -> String {
    if v.abs() < 1.0 {
        format!("{v:.2}%")
    } else {
        format!("{v:.1}%")
    }
}

/// Columns aligned: the first left, the others right.
pub fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let n = head.len();
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from("  ");
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i == 0 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str("  ");
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(head.to_vec());
    for r in rows {
        out += &line(r.iter().map(|s| s.as_str()).collect());
    }
    out
}

fn opt(v: Option<u64>) -> String {
    v.map(commas).unwrap_or_else(|| "n/a".into())
}

fn stats(s: &Option<RefStats>, pages: Option<u64>) -> [String; 3] {
    match (s, pages) {
        (Some(s), _) => [commas(s.min), commas(s.max), fcommas(s.mean)],
        (None, None) => ["n/a".into(), "n/a".into(), "n/a".into()],
        (None, Some(_)) => ["-".into(), "-".into(), "-".into()],
    }
}

impl Report {
    /// The tables as the paper lays them out.
    pub fn text(&self) -> String {
        let mut o = String::new();
        o += &format!("bunkai trace report: {}\n", self.trace);
        o += &format!("  {} stream(s):\n", self.streams.len());
        for s in &self.streams {
            let status = match (s.ended, s.exit_status) {
                ("exit", Some(x)) => format!("exited {x}"),
                ("exec", _) => "exec'd".into(),
                _ => "no BYE".into(),
            };
            o += &format!(
                "    stream {:<3} pid {:<7} {:<24} {:>14} instr {:>14} refs {:>6} syscalls  {}\n",
                s.stream,
                s.pid,
                basename(&s.executable),
                commas(s.instructions),
                commas(s.memory_references),
                s.syscalls,
                status
            );
        }
        let kernel = self.components.iter().find(|c| c.kind == Kind::Kernel);
        let user: Vec<&ComponentRow> = self.components.iter().filter(|c| c.kind != Kind::Kernel).collect();
        let with_libs = || {
            let mut v: Vec<&ComponentRow> = user.clone();
            let at = v.iter().position(|c| c.kind == Kind::Library).unwrap_or(v.len());
            v.insert(at, &self.shared_libraries_total);
            v
        };

        o += "\nTable 1: dynamic instructions per component (the paper's Tables 1 and 4)\n";
        let mut rows: Vec<Vec<String>> = with_libs()
            .iter()
            .map(|c| vec![label(c), opt(c.instructions), format!("{:.1}%", c.percent.unwrap_or(0.0))])
            .collect();
        if let Some(k) = kernel {
            rows.push(vec![
                "kernel".into(),
                "n/a".into(),
                "n/a".into(),
                format!(
                    "{} syscalls, {:.3} ms in syscalls",
                    commas(k.syscalls.unwrap_or(0)),
                    k.syscall_seconds.unwrap_or(0.0) * 1e3
                ),
            ]);
        }
        rows.push(vec!["total (user mode)".into(), commas(self.total_instructions), "100.0%".into()]);
        o += &table(&["component", "instructions", "percent", ""], &rows);
        o += &wrap("note: ", KERNEL_NOTE);

        o += "\nTable 2: pages used per component, 4 KiB pages (the paper's Tables 2 and 5)\n";
        let mut rows: Vec<Vec<String>> =
            with_libs().iter().map(|c| vec![label(c), opt(c.code_pages), opt(c.data_pages)]).collect();
        rows.push(vec!["kernel".into(), "n/a".into(), "n/a".into()]);
        o += &table(&["component", "instruction pages", "data pages"], &rows);

        o += "\nTable 3: references per page, min / max / mean (the paper's Tables 3 and 6)\n";
        let mut rows: Vec<Vec<String>> = with_libs()
            .iter()
            .map(|c| {
                let mut r = vec![label(c)];
                r.extend(stats(&c.code_refs, c.code_pages));
                r.extend(stats(&c.data_refs, c.data_pages));
                r
            })
            .collect();
        rows.push(["kernel", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a"].iter().map(|s| s.to_string()).collect());
        o += &table(&["component", "instr min", "instr max", "instr mean", "data min", "data max", "data mean"], &rows);

        let e = &self.estimate;
        o += &format!("\n§4 estimate: TLB misses and switches of a TURU-style tracer on {}\n", e.cpu.name);
        o += &format!("  cycles: {} ({})\n", fcommas(e.cycles), e.cycles_source);
        o += &format!(
            "  TLB: ({} instruction + {} data pages) x {}-{} cycles = {}-{} cycles = {}-{} of all cycles\n",
            commas(e.code_pages),
            commas(e.data_pages),
            e.cpu.tlb_miss_cycles_min,
            e.cpu.tlb_miss_cycles_max,
            fcommas(e.tlb_cycles_min),
            fcommas(e.tlb_cycles_max),
            pc(e.tlb_percent_min),
            pc(e.tlb_percent_max)
        );
        o += &format!(
            "  switches: ({} syscalls + {} address-space switches) x {} cycles = {} cycles = {} of all cycles\n",
            commas(e.syscalls),
            commas(e.address_space_switches),
            e.cpu.switch_cycles,
            fcommas(e.switch_cycles),
            pc(e.switch_percent)
        );
        o += &wrap("  address-space switches: ", &self.address_space_switches_note);
        o += &format!("  together: {}-{} of all cycles\n", pc(e.overhead_percent_min), pc(e.overhead_percent_max));
        match (e.requests_per_second_after_min, e.requests_per_second_after_max) {
            (Some(lo), Some(hi)) => {
                o += &format!(
                    "  requests/s (if the trace is one request): {:.1} -> {lo:.1}-{hi:.1} without that overhead\n",
                    e.requests_per_second_before
                )
            }
            _ => {
                o += &format!(
                    "  requests/s (if the trace is one request): {:.1}; the estimated overhead exceeds the cycles \
                     (give the measured --cycles or --seconds)\n",
                    e.requests_per_second_before
                )
            }
        }
        o += &format!(
            "\n  {} records (instructions + memory references) in {:.3} s ({:.1} M records/s)\n",
            commas(self.records),
            self.seconds,
            self.records_per_second / 1e6
        );
        for w in &self.warnings {
            o += &format!("  warning: {w}\n");
        }
        o
    }
}

fn label(c: &ComponentRow) -> String {
    match c.kind {
        Kind::Program => format!("{} (program)", c.name),
        Kind::Library if c.name != LIBS_TOTAL => format!("  {}", c.name),
        _ => c.name.clone(),
    }
}

/// Reads the file and builds the report with a CPU model ("pentium",
/// "modern" or a JSON file), cycles estimated from the instructions.
pub fn report_file(path: &Path, cpu: &str) -> Result<Report> {
    let trace = Trace::load(path)?;
    report(&trace, &ReportOptions { cpu: cpu_model(cpu)?, cycles: None, seconds: None })
}
