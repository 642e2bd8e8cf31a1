//! The report: Tables 1-6 as rows, from an analysis.

use super::*;

// ---------------------------------------------------------------------------
// The report

#[derive(Debug, Clone, Serialize)]
pub struct RefStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
}

pub(super) fn ref_stats<'a>(pages: impl Iterator<Item = &'a u64>) -> (u64, Option<RefStats>) {
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
    /// "exit" (BYE seen), "signal" (BYE seen, ended by a fatal signal),
    /// "exec" (replaced by an exec), "cut" (the recorder's CUT: killed, or
    /// still running at the end) or "abnormal" (neither, a version 1 trace).
    pub ended: &'static str,
    pub exit_status: Option<u64>,
    /// The signal that ended the process (from BYE, or the recorder's CUT).
    pub signal: Option<String>,
    /// Why a cut stream was cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<&'static str>,
    /// Segment executions the tool could not store (buffer mode).
    pub dropped: Option<u64>,
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
    /// A full-system trace (`record --system`): the kernel is measured.
    pub system: bool,
    /// System mode: interrupts and exceptions by entry stub, most first.
    pub traps: Vec<TrapRow>,
    /// System mode: kernel instructions run by the traced server's task
    /// (its syscalls, faults, and interrupts that struck it), and by other
    /// tasks inside the window (idle loop, kernel threads, other processes).
    pub kernel_server_task: u64,
    pub kernel_other_tasks: u64,
    pub estimate: Estimate,
    /// Instructions + memory references decoded.
    pub records: u64,
    /// Seconds the decoding and counting took.
    pub seconds: f64,
    pub records_per_second: f64,
    pub warnings: Vec<String>,
}

/// Interrupts or exceptions entered at one stub (system mode).
#[derive(Debug, Clone, Serialize)]
pub struct TrapRow {
    pub stub: String,
    /// "interrupt" or "exception".
    pub kind: String,
    pub count: u64,
}

/// Options of the §4 estimate.
pub struct ReportOptions {
    pub cpu: CpuModel,
    pub cycles: Option<u64>,
    pub seconds: Option<f64>,
}

pub(super) const LIBS_TOTAL: &str = "shared libraries (total)";
pub(super) const KERNEL_NOTE: &str = "Valgrind runs the program on a simulated CPU in user mode and cannot see \
kernel instructions or pages; the kernel row gives the syscalls and the time spent in them instead \
(measured under Valgrind, so slower than native).";
pub(super) const KERNEL_SYSTEM_NOTE: &str = "full system (QEMU TCG): kernel instructions, pages and \
references as recorded; syscalls counted at their handlers (no durations: the plugin reads no registers).";
pub(super) const SWITCH_SYSTEM_NOTE: &str = "switch_mm_irqs_off reached (the kernel \
loads CR3 there), as the paper counted CR3 changes";
pub(super) const SWITCH_NOTE: &str = "context switches measured under Valgrind (voluntary + involuntary, \
/proc/self/status), summed over the streams; the paper counted CR3 changes";

pub(super) fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// Builds a component row from per-address-space page maps.
pub(super) fn row(
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
pub(super) fn union(maps: impl Iterator<Item = PageCounts>) -> PageCounts {
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
    let system = trace.streams.iter().any(|s| s.hello.flags & crate::decode::F_SYSTEM != 0);
    if let Some(k) = components.iter_mut().find(|r| r.kind == Kind::Kernel) {
        // Measured (system mode): the syscalls beside the instructions.
        k.syscalls = Some(syscalls);
        k.note = Some(KERNEL_SYSTEM_NOTE.into());
    } else {
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
    }
    let address_space_switches: u64 = if system {
        a.streams.iter().map(|s| s.asids).sum()
    } else {
        a.streams.iter().filter_map(|s| s.context_switches()).sum()
    };
    let mut traps: BTreeMap<String, (String, u64)> = BTreeMap::new();
    for sc in &a.streams {
        for (name, (kind, n)) in &sc.traps {
            traps.entry(name.clone()).or_insert((crate::decode::trap_kind_name(*kind).to_string(), 0)).1 += n;
        }
    }
    let mut traps: Vec<TrapRow> = traps.into_iter().map(|(stub, (kind, count))| TrapRow { stub, kind, count }).collect();
    traps.sort_by(|x, y| (std::cmp::Reverse(x.count), &x.stub).cmp(&(std::cmp::Reverse(y.count), &y.stub)));

    let mut warnings = Vec::new();
    let mut streams = Vec::new();
    for (st, sc) in trace.streams.iter().zip(&a.streams) {
        let ended = crate::decode::ending(st.bye.as_ref(), st.cut.as_ref(), sc.exec);
        if let Some(b) = &st.bye {
            if b.dropped > 0 {
                warnings.push(format!(
                    "stream {} (pid {}): the tool's buffer filled; {} segment executions ({} instructions) did not fit and are missing",
                    st.id, st.hello.pid, b.dropped, b.dropped_instructions
                ));
            } else if b.instructions != sc.instructions || b.memory_references != sc.memory_references {
                warnings.push(format!(
                    "stream {} (pid {}): the tool counted {} instructions and {} references, the trace holds {} and {}",
                    st.id, st.hello.pid, b.instructions, b.memory_references, sc.instructions, sc.memory_references
                ));
            }
        } else if ended == "cut" {
            warnings.push(format!(
                "stream {} (pid {}, {}): cut, {}; what it had not sent is missing",
                st.id,
                st.hello.pid,
                st.program_name(),
                st.cut.as_ref().map(|c| c.reason_text()).unwrap_or("")
            ));
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
            exit_status: st.bye.as_ref().filter(|b| b.signal == 0).map(|b| b.exit_status),
            signal: st
                .bye
                .as_ref()
                .map(|b| b.signal)
                .or(st.cut.as_ref().map(|c| c.signal))
                .filter(|&s| s != 0)
                .map(crate::decode::signal_name),
            cut: if ended == "cut" { st.cut.as_ref().map(|c| c.reason_text()) } else { None },
            dropped: st.bye.as_ref().map(|b| b.dropped),
        });
    }
    if trace.streams.iter().any(|s| s.hello.flags & crate::decode::F_MEM == 0) {
        warnings.push("some streams were recorded without memory references: their data pages are 0".into());
    }

    // §4: pages as the paper sums them (programs + the libraries as one).
    let (mut code_pages, mut data_pages) = (0u64, 0u64);
    // A system trace adds the kernel's pages (measured there).
    for r in components
        .iter()
        .filter(|r| r.kind == Kind::Program || (system && r.kind == Kind::Kernel))
        .chain([&shared_libraries_total])
    {
        code_pages += r.code_pages.unwrap_or(0);
        data_pages += r.data_pages.unwrap_or(0);
    }
    let mut estimate = estimate(&opts.cpu, opts, total, code_pages, data_pages, syscalls, address_space_switches);
    if system {
        estimate.cycles_source = estimate
            .cycles_source
            .replace("user-mode instructions", "instructions (kernel and user mode)")
            .replace(" (kernel instructions not included; give --cycles or --seconds)", "");
    }
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
        address_space_switches_note: if system { SWITCH_SYSTEM_NOTE.into() } else { SWITCH_NOTE.into() },
        system,
        traps,
        kernel_server_task: a.streams.iter().map(|s| s.kernel_server).sum(),
        kernel_other_tasks: a.streams.iter().map(|s| s.kernel_other).sum(),
        estimate,
        records,
        seconds: a.seconds,
        records_per_second: if a.seconds > 0.0 { records as f64 / a.seconds } else { 0.0 },
        warnings,
    }
}
