//! One pass over the trace: instructions, pages and references per
//! component and per address space (the paper's three analysis programs).

use super::*;

// ---------------------------------------------------------------------------
// Components

/// The object name the QEMU plugin gives the kernel (system mode).
pub const KERNEL_OBJECT: &str = "[kernel]";

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
                    // System mode: the kernel is a component of its own.
                    Some(o) if o.name == KERNEL_OBJECT => ("kernel".to_string(), Kind::Kernel),
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
    /// System mode: address-space switches (BKT_EV_ASID).
    pub asids: u64,
    /// System mode: entry stub name -> (kind, count) of BKT_EV_TRAP.
    pub traps: BTreeMap<String, (u64, u64)>,
    /// System mode: the task (thread id) running when the window opened:
    /// the traced server's.
    pub server_task: Option<u64>,
    /// System mode: kernel instructions run by the server's task, and by
    /// all others (idle, kernel threads, other processes).
    pub kernel_server: u64,
    pub kernel_other: u64,
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
    // System mode: kernel instructions of each segment, to split them by task.
    let kernel_comp = comps.list.iter().position(|c| c.kind == Kind::Kernel).map(|c| c as u32);
    let kernel_insns: Vec<Vec<u64>> = comps
        .insn
        .iter()
        .map(|st| st.iter().map(|seg| seg.iter().filter(|&&c| Some(c) == kernel_comp).count() as u64).collect())
        .collect();
    let mut window_open = vec![false; trace.streams.len()];

    // The (stream, component, page) of the last data reference and how
    // many references in a row fell on it.
    let mut last = (usize::MAX, 0u32, 0u64);
    let mut run = 0u64;
    let all: Vec<usize> = (0..trace.streams.len()).collect();
    let visited = trace.visit_as("counting instructions and pages", &all, |pos, item| {
        let s = pos.stream;
        match item {
            Item::Exec { seg_pos, addrs, .. } => {
                execs[s][seg_pos] += 1;
                let k = kernel_insns[s][seg_pos];
                if k > 0 {
                    let sc = &mut counts[s];
                    if sc.server_task.is_some() && sc.server_task == Some(pos.tid) {
                        sc.kernel_server += k;
                    } else {
                        sc.kernel_other += k;
                    }
                }
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
                    Event::Asid { .. } => sc.asids += 1,
                    Event::Window { open, .. } => window_open[s] = *open,
                    Event::Thread { tid } if window_open[s] && sc.server_task.is_none() => sc.server_task = Some(*tid),
                    Event::Trap { kind, func, .. } => {
                        let name = trace.streams[s].func_name(*func).to_string();
                        sc.traps.entry(name).or_insert((*kind, 0)).1 += 1;
                    }
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
