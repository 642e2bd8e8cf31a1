//! `bunkai trace dump`: the trace record by record.
//!
//! The paper's first §2.3 tool simply lists the log: every executed
//! instruction with the addresses it referenced. Here each segment
//! execution is printed with its instructions (address, length, function)
//! and the decoded address of each access, and each event is decoded
//! (syscalls by name). `--lackey` prints exactly what Valgrind's lackey
//! prints with `--trace-mem=yes` for the same execution, so the two can be
//! compared with diff; `--json` prints one JSON object per line.

use crate::decode::{self, access_letter, basename, end_name, Event, Item, Pos, Seg, Stream, Trace, NOT_PERFORMED};
use anyhow::Result;
use serde_json::json;
use std::io::Write;
use std::ops::ControlFlow;

/// What `dump` prints: `bunkai trace dump`'s options (cmd/dump.rs).
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    /// One JSON object per line
    pub json: bool,
    /// What `valgrind --tool=lackey --trace-mem=yes` prints for the same run
    pub lackey: bool,
    /// Only this stream (its number, or a pid)
    pub stream: Option<u64>,
    /// Stop after N records (segment executions and events)
    pub limit: Option<u64>,
    /// Also definitions: each stream's objects and functions, and each
    /// segment's definition the first time it runs
    pub defs: bool,
    /// Only the events (syscalls, interrupts, window, ...), no segment
    /// executions
    pub events: bool,
}

/// x86-64 syscalls: number, name, arguments; the common ones.
const SYSCALLS: &[(u64, &str, usize)] = &[
    (0, "read", 3),
    (1, "write", 3),
    (2, "open", 3),
    (3, "close", 1),
    (4, "stat", 2),
    (5, "fstat", 2),
    (6, "lstat", 2),
    (7, "poll", 3),
    (8, "lseek", 3),
    (9, "mmap", 6),
    (10, "mprotect", 3),
    (11, "munmap", 2),
    (12, "brk", 1),
    (13, "rt_sigaction", 4),
    (14, "rt_sigprocmask", 4),
    (15, "rt_sigreturn", 0),
    (16, "ioctl", 3),
    (17, "pread64", 4),
    (18, "pwrite64", 4),
    (19, "readv", 3),
    (20, "writev", 3),
    (21, "access", 2),
    (22, "pipe", 1),
    (23, "select", 5),
    (24, "sched_yield", 0),
    (25, "mremap", 5),
    (28, "madvise", 3),
    (32, "dup", 1),
    (33, "dup2", 2),
    (35, "nanosleep", 2),
    (39, "getpid", 0),
    (40, "sendfile", 4),
    (41, "socket", 3),
    (42, "connect", 3),
    (43, "accept", 3),
    (44, "sendto", 6),
    (45, "recvfrom", 6),
    (46, "sendmsg", 3),
    (47, "recvmsg", 3),
    (48, "shutdown", 2),
    (49, "bind", 3),
    (50, "listen", 2),
    (51, "getsockname", 3),
    (52, "getpeername", 3),
    (53, "socketpair", 4),
    (54, "setsockopt", 5),
    (55, "getsockopt", 5),
    (56, "clone", 5),
    (57, "fork", 0),
    (58, "vfork", 0),
    (59, "execve", 3),
    (60, "exit", 1),
    (61, "wait4", 4),
    (62, "kill", 2),
    (63, "uname", 1),
    (72, "fcntl", 3),
    (73, "flock", 2),
    (74, "fsync", 1),
    (77, "ftruncate", 2),
    (78, "getdents", 3),
    (79, "getcwd", 2),
    (80, "chdir", 1),
    (82, "rename", 2),
    (83, "mkdir", 2),
    (84, "rmdir", 1),
    (87, "unlink", 1),
    (89, "readlink", 3),
    (90, "chmod", 2),
    (95, "umask", 1),
    (96, "gettimeofday", 2),
    (97, "getrlimit", 2),
    (99, "sysinfo", 1),
    (102, "getuid", 0),
    (104, "getgid", 0),
    (107, "geteuid", 0),
    (108, "getegid", 0),
    (110, "getppid", 0),
    (131, "sigaltstack", 2),
    (137, "statfs", 2),
    (138, "fstatfs", 2),
    (157, "prctl", 5),
    (158, "arch_prctl", 2),
    (186, "gettid", 0),
    (202, "futex", 6),
    (217, "getdents64", 3),
    (218, "set_tid_address", 1),
    (228, "clock_gettime", 2),
    (230, "clock_nanosleep", 4),
    (231, "exit_group", 1),
    (232, "epoll_wait", 4),
    (233, "epoll_ctl", 4),
    (234, "tgkill", 3),
    (247, "waitid", 5),
    (257, "openat", 4),
    (262, "newfstatat", 4),
    (263, "unlinkat", 3),
    (267, "readlinkat", 4),
    (269, "faccessat", 3),
    (270, "pselect6", 6),
    (271, "ppoll", 5),
    (273, "set_robust_list", 2),
    (281, "epoll_pwait", 6),
    (288, "accept4", 4),
    (290, "eventfd2", 2),
    (291, "epoll_create1", 1),
    (292, "dup3", 3),
    (293, "pipe2", 2),
    (302, "prlimit64", 4),
    (318, "getrandom", 3),
    (332, "statx", 5),
    (334, "rseq", 4),
    (435, "clone3", 2),
    (439, "faccessat2", 4),
];

fn syscall_entry(n: u64) -> Option<&'static (u64, &'static str, usize)> {
    SYSCALLS.binary_search_by_key(&n, |e| e.0).ok().map(|i| &SYSCALLS[i])
}

/// The x86-64 name of a syscall number (the common ones).
pub fn syscall_name(n: u64) -> Option<&'static str> {
    syscall_entry(n).map(|e| e.1)
}

/// How many arguments a syscall takes (the common ones).
pub fn syscall_nargs(n: u64) -> Option<usize> {
    syscall_entry(n).map(|e| e.2)
}

/// "write" or "syscall_999".
pub fn syscall_label(n: u64) -> String {
    syscall_name(n).map(str::to_string).unwrap_or_else(|| format!("syscall_{n}"))
}

fn prot(p: u64) -> String {
    let f = |bit, c| if p & bit != 0 { c } else { '-' };
    [f(1, 'r'), f(2, 'w'), f(4, 'x')].iter().collect()
}

/// Prints the selected streams of a trace.
pub fn dump<W: Write>(trace: &Trace, o: &DumpOptions, w: &mut W) -> Result<()> {
    let sel = trace.select(o.stream)?;
    if !o.lackey {
        header(trace, &sel, o, w)?;
    }
    let limit = o.limit.unwrap_or(u64::MAX);
    let mut n = 0u64;
    let mut err: Option<anyhow::Error> = None;
    let mut seen: Vec<Vec<bool>> = trace.streams.iter().map(|s| vec![false; s.segs.len()]).collect();
    let visited = trace.visit(&sel, |pos, item| {
        if n >= limit {
            return ControlFlow::Break(());
        }
        let st = &trace.streams[pos.stream];
        let r = match item {
            Item::Exec { .. } if o.events => return ControlFlow::Continue(()),
            Item::Exec { seg, seg_pos, addrs } => {
                n += 1;
                let first = !std::mem::replace(&mut seen[pos.stream][seg_pos], true);
                if o.lackey {
                    lackey(seg, addrs, w)
                } else if o.json {
                    exec_json(st, pos, seg, addrs, o.defs && first, w)
                } else {
                    exec_text(st, pos, seg, addrs, o.defs && first, w)
                }
            }
            Item::Event(ev) if !o.lackey => {
                n += 1;
                if o.json {
                    event_json(st, pos, ev, w)
                } else {
                    event_text(st, pos, ev, w)
                }
            }
            Item::Event(_) => Ok(()),
        };
        match r {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                err = Some(e.into());
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = err {
        return Err(e);
    }
    if !o.lackey && !visited.stopped {
        for &s in &sel {
            let st = &trace.streams[s];
            match (&st.bye, &st.cut, o.json) {
                (b, c, true) => writeln!(w, "{}", json!({"type": "bye", "stream": st.id, "bye": b, "cut": c}))?,
                (Some(b), _, false) => writeln!(
                    w,
                    "# stream {} BYE: {} instructions, {} memory references, {} dropped ({} instructions), {}",
                    st.id,
                    b.instructions,
                    b.memory_references,
                    b.dropped,
                    b.dropped_instructions,
                    if b.signal != 0 {
                        format!("killed by {}", decode::signal_name(b.signal))
                    } else {
                        format!("exit status {}", b.exit_status)
                    }
                )?,
                (None, Some(c), false) => writeln!(
                    w,
                    "# stream {} CUT: {}{}{}",
                    st.id,
                    c.reason_text(),
                    if c.lost_bytes > 0 { format!("; {} bytes of it lost", c.lost_bytes) } else { String::new() },
                    if c.signal != 0 { format!("; killed by {}", decode::signal_name(c.signal)) } else { String::new() }
                )?,
                (None, None, false) => writeln!(w, "# stream {}: no BYE (killed, or replaced by an exec)", st.id)?,
            }
        }
    }
    Ok(())
}

fn header<W: Write>(trace: &Trace, sel: &[usize], o: &DumpOptions, w: &mut W) -> Result<()> {
    let f = &trace.file;
    if o.json {
        writeln!(
            w,
            "{}",
            json!({"type": "file", "path": f.path.display().to_string(), "version": crate::format::VERSION,
                   "chunks": f.chunks.len(), "bytes": f.file_len, "raw_bytes": f.raw_bytes, "meta": f.meta})
        )?;
    } else {
        writeln!(
            w,
            "# {}: format version {}, {} chunks, {} bytes ({} decompressed)",
            f.path.display(),
            crate::format::VERSION,
            f.chunks.len(),
            f.file_len,
            f.raw_bytes
        )?;
        writeln!(w, "# meta: {}", f.meta)?;
    }
    for &s in sel {
        let st = &trace.streams[s];
        let h = &st.hello;
        if o.json {
            let mut v = json!({"type": "hello", "stream": st.id, "hello": h, "segments": st.segs.len()});
            if o.defs {
                v["objects"] = json!(st.objects.values().collect::<Vec<_>>());
                let mut funcs: Vec<_> = st.funcs.values().collect();
                funcs.sort_by_key(|f| f.id);
                v["funcs"] = json!(funcs);
            }
            writeln!(w, "{v}")?;
            continue;
        }
        let mut flags = Vec::new();
        if h.flags & decode::F_MEM != 0 {
            flags.push("memory references");
        }
        if h.flags & decode::F_BUFFERED != 0 {
            flags.push("buffered");
        }
        writeln!(
            w,
            "# stream {}: pid {} ppid {} {} {:?} (tool version {}, window {}, {}); {} objects, {} functions, {} segments",
            st.id,
            h.pid,
            h.ppid,
            h.executable,
            h.argv,
            h.tool_version,
            if h.window_open { "open" } else { "closed" },
            if flags.is_empty() { "instructions only".to_string() } else { flags.join(", ") },
            st.objects.len(),
            st.funcs.len(),
            st.segs.len()
        )?;
        if o.defs {
            for ob in st.objects.values() {
                writeln!(
                    w,
                    "#   object {} {} {:#x}-{:#x} offset {:#x}",
                    ob.id, ob.name, ob.map_start, ob.map_end, ob.file_offset
                )?;
            }
            let mut funcs: Vec<_> = st.funcs.values().collect();
            funcs.sort_by_key(|f| f.id);
            for fu in funcs {
                writeln!(
                    w,
                    "#   func {} {} {}:{} entry {:#x}",
                    fu.id,
                    if fu.name.is_empty() { "??" } else { &fu.name },
                    if fu.file.is_empty() { "??" } else { &fu.file },
                    fu.line,
                    fu.entry
                )?;
            }
        }
    }
    Ok(())
}

/// lackey's `--trace-mem=yes` lines for one segment execution. Accesses
/// of the instruction in flight come first (its `I` line was printed with
/// the segment before); accesses whose guard failed are not printed, as
/// lackey does not see them.
fn lackey<W: Write>(seg: &Seg, addrs: &[u64], w: &mut W) -> std::io::Result<()> {
    let mut a = lackey_accs(seg, addrs, 0, 0, w)?;
    for (i, insn) in seg.insns.iter().enumerate() {
        writeln!(w, "I  {:08x},{}", insn.addr, insn.len)?;
        a = lackey_accs(seg, addrs, a, i + 1, w)?;
    }
    Ok(())
}

/// Prints the accesses from `a` on made by instruction number `num`;
/// returns the next access.
fn lackey_accs<W: Write>(seg: &Seg, addrs: &[u64], mut a: usize, num: usize, w: &mut W) -> std::io::Result<usize> {
    while a < seg.accs.len() && seg.accs[a].insn as usize == num {
        let acc = &seg.accs[a];
        if addrs[a] != NOT_PERFORMED {
            writeln!(w, " {} {:08x},{}", access_letter(acc.kind), addrs[a], acc.size)?;
        }
        a += 1;
    }
    Ok(a)
}

/// " L 0x7ffd0000,8" text for the accesses of instruction number `num`.
fn acc_text(seg: &Seg, addrs: &[u64], a: &mut usize, num: usize) -> String {
    let mut s = String::new();
    while *a < seg.accs.len() && seg.accs[*a].insn as usize == num {
        let acc = &seg.accs[*a];
        if addrs[*a] == NOT_PERFORMED {
            s += &format!("  {} (not performed),{}", access_letter(acc.kind), acc.size);
        } else {
            s += &format!("  {} {:#x},{}", access_letter(acc.kind), addrs[*a], acc.size);
        }
        *a += 1;
    }
    s
}

/// JSON for the accesses of instruction number `num`.
fn acc_json(seg: &Seg, addrs: &[u64], a: &mut usize, num: usize) -> Vec<serde_json::Value> {
    let mut v = Vec::new();
    while *a < seg.accs.len() && seg.accs[*a].insn as usize == num {
        let x = &seg.accs[*a];
        let mut j = json!({"kind": access_letter(x.kind).to_string(), "addr": addrs[*a], "size": x.size});
        if addrs[*a] == NOT_PERFORMED {
            j["performed"] = json!(false);
        }
        v.push(j);
        *a += 1;
    }
    v
}

fn func_label(st: &Stream, func: u64) -> String {
    match st.func_name(func) {
        "" => "??".into(),
        n => n.to_string(),
    }
}

fn exec_text<W: Write>(st: &Stream, pos: &Pos, seg: &Seg, addrs: &[u64], def: bool, w: &mut W) -> std::io::Result<()> {
    if def {
        writeln!(
            w,
            "# def seg {} in stream {}: {} instructions, {} accesses, ends {} (DEFS chunk at byte {})",
            seg.id,
            st.id,
            seg.insns.len(),
            seg.accs.len(),
            end_name(seg.end),
            seg.def_offset
        )?;
    }
    writeln!(
        w,
        "[{:>10}] s{} t{} seg {} ({} instr, {} acc, ends {})",
        pos.instr,
        st.id,
        pos.tid,
        seg.id,
        seg.insns.len(),
        seg.accs.len(),
        end_name(seg.end)
    )?;
    let mut a = 0;
    let in_flight = acc_text(seg, addrs, &mut a, 0);
    if !in_flight.is_empty() {
        writeln!(w, "    (rest of the instruction in flight){in_flight}")?;
    }
    let mut last_func = u64::MAX;
    for (i, insn) in seg.insns.iter().enumerate() {
        write!(w, "    {:#014x} {:>2}", insn.addr, insn.len)?;
        if insn.func != last_func {
            write!(w, "  {} ({})", func_label(st, insn.func), basename(&st.object_name(insn.obj)))?;
            last_func = insn.func;
        }
        writeln!(w, "{}", acc_text(seg, addrs, &mut a, i + 1))?;
    }
    Ok(())
}

fn exec_json<W: Write>(st: &Stream, pos: &Pos, seg: &Seg, addrs: &[u64], def: bool, w: &mut W) -> std::io::Result<()> {
    let mut a = 0;
    let in_flight = acc_json(seg, addrs, &mut a, 0);
    let insns: Vec<_> = seg
        .insns
        .iter()
        .enumerate()
        .map(|(i, insn)| {
            let acc = acc_json(seg, addrs, &mut a, i + 1);
            json!({"addr": insn.addr, "len": insn.len, "object": insn.obj, "func": insn.func, "accesses": acc})
        })
        .collect();
    let mut v = json!({"type": "exec", "stream": st.id, "tid": pos.tid, "instr": pos.instr, "seg": seg.id,
                       "end": end_name(seg.end), "insns": insns});
    if !in_flight.is_empty() {
        v["in_flight_accesses"] = json!(in_flight);
    }
    if def {
        v["def_offset"] = json!(seg.def_offset);
        let funcs: Vec<_> = seg
            .insns
            .iter()
            .map(|i| i.func)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter_map(|f| st.func(f))
            .collect();
        v["funcs"] = json!(funcs);
    }
    writeln!(w, "{v}")
}

fn event_text<W: Write>(st: &Stream, pos: &Pos, ev: &Event, w: &mut W) -> std::io::Result<()> {
    write!(w, "[{:>10}] s{} t{} ", pos.instr, st.id, pos.tid)?;
    match ev {
        Event::Syscall { tid, sysno, args, result, start_ns, duration_ns } => {
            // The tool sends every argument register; show those the call takes.
            let n = syscall_nargs(*sysno).unwrap_or(args.len()).min(args.len());
            let args: Vec<String> =
                args[..n].iter().map(|&a| if a < 4096 { a.to_string() } else { format!("{a:#x}") }).collect();
            writeln!(
                w,
                "syscall {}({}) = {} (thread {}, at {} ns, {:.3} us)",
                syscall_label(*sysno),
                args.join(", "),
                result,
                tid,
                start_ns,
                *duration_ns as f64 / 1e3
            )
        }
        Event::Signal { tid, signo } => writeln!(w, "signal {signo} ({}) to thread {tid}", decode::signal_name(*signo)),
        Event::Fatal { tid, signo, addr } => writeln!(
            w,
            "fatal signal {signo} ({}) in thread {tid} at {addr:#x}: the process ends",
            decode::signal_name(*signo)
        ),
        Event::Thread { tid } => writeln!(w, "thread {tid} runs"),
        Event::Mmap { addr, len, prot: p, object } => writeln!(
            w,
            "mmap {addr:#x} len {len:#x} {} {}",
            prot(*p),
            if *object == 0 {
                "anonymous".to_string()
            } else {
                format!("object {object} ({})", st.object_name(*object))
            }
        ),
        Event::Munmap { addr, len } => writeln!(w, "munmap {addr:#x} len {len:#x}"),
        Event::Mprotect { addr, len, prot: p } => writeln!(w, "mprotect {addr:#x} len {len:#x} {}", prot(*p)),
        Event::Brk { addr, len, grow } => {
            writeln!(w, "brk {} {addr:#x} by {len:#x}", if *grow { "grows at" } else { "shrinks at" })
        }
        Event::Exec { path } => writeln!(w, "exec {path} (this image ends)"),
        Event::Fork { child } => writeln!(w, "fork: child pid {child}"),
        Event::Window { open, reason, instructions } => writeln!(
            w,
            "window {} ({}) after {instructions} instructions",
            if *open { "opens" } else { "closes" },
            decode::window_reason_name(*reason)
        ),
        Event::Tls { tid, which, base } => {
            writeln!(w, "thread {tid} sets {} base {base:#x}", if *which == 0 { "fs" } else { "gs" })
        }
        Event::ThreadNew { parent, child } => writeln!(w, "thread {parent} creates thread {child}"),
        Event::ThreadExit { tid } => writeln!(w, "thread {tid} exits"),
        Event::CtxSw { voluntary, involuntary } => {
            writeln!(w, "context switches so far: {voluntary} voluntary, {involuntary} involuntary")
        }
        Event::Trap { tid, kind, func } => writeln!(
            w,
            "{} {} (task {tid})",
            decode::trap_kind_name(*kind),
            st.func_name(*func)
        ),
        Event::Asid { tid } => writeln!(w, "address-space switch (task {tid})"),
    }
}

fn event_json<W: Write>(st: &Stream, pos: &Pos, ev: &Event, w: &mut W) -> std::io::Result<()> {
    let mut v = json!(ev);
    v["type"] = json!("event");
    v["stream"] = json!(st.id);
    v["instr"] = json!(pos.instr);
    if !v.get("tid").is_some_and(|t| t.is_u64()) {
        v["tid"] = json!(pos.tid);
    }
    if let Event::Syscall { sysno, .. } = ev {
        v["name"] = json!(syscall_label(*sysno));
    }
    if let Event::Signal { signo, .. } | Event::Fatal { signo, .. } = ev {
        v["signal"] = json!(decode::signal_name(*signo));
    }
    if let Event::Trap { kind, func, .. } = ev {
        v["kind_name"] = json!(decode::trap_kind_name(*kind));
        v["stub"] = json!(st.func_name(*func));
    }
    writeln!(w, "{v}")
}
