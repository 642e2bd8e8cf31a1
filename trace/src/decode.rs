//! Loading a trace and walking its records: the one reader every analysis
//! tool (dump, calls, report, pages) is built on.
//!
//! In the paper (§2.3) TURU's analysis programs all read the same raw log
//! of executed instructions and referenced addresses. Here `Trace::load`
//! reads each stream's HELLO, definitions (objects, functions, segments)
//! and BYE up front, and `Trace::visit` streams the EVENTS chunks in file
//! order, decompressing the next chunk on a second thread while the
//! current one is decoded. It hands the caller one `Item` per record: a
//! segment execution (the segment's static definition plus the decoded
//! absolute address of every memory access) or an event (syscall, signal,
//! thread switch, mmap, ...). The layout is in trace/include/bunkai_trace.h.
//!
//! Every malformed input is an error naming the file offset of the chunk
//! it lies in (in the same words as the file reader's own errors); nothing
//! here panics on any input, and no allocation is sized from a count the
//! file claims without checking it against the bytes that remain.
//!
//! One piece on purpose (over 800 lines): the record decoder and the walk
//! over streams share the per-stream state (definitions seen so far, the
//! segment table, the position in each chunk), and every bounds check of
//! the format lives here, beside the code it guards.

use crate::format::{self, unzigzag, ChunkRef, Cursor, CursorError, TraceFile};
use anyhow::Result;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::ops::ControlFlow;
use std::path::Path;

// Constants of bunkai_trace.h.
pub const F_MEM: u64 = 1;
pub const F_BUFFERED: u64 = 2;
pub const F_SYSTEM: u64 = 4;

pub const DEF_OBJECT: u64 = 1;
pub const DEF_FUNC: u64 = 2;
pub const DEF_SEG: u64 = 3;
/// A segment packed (format version 4): see trace/include/bunkai_trace.h.
pub const DEF_SEGP: u64 = 4;

pub const ACC_LOAD: u8 = 0;
pub const ACC_STORE: u8 = 1;
pub const ACC_MODIFY: u8 = 2;

pub const END_BRANCH: u8 = 0;
pub const END_CALL: u8 = 1;
pub const END_RET: u8 = 2;
pub const END_SYSCALL: u8 = 3;
pub const END_OTHER: u8 = 4;
pub const END_FATAL: u8 = 5;

pub const EV_SYSCALL: u64 = 1;
pub const EV_SIGNAL: u64 = 2;
pub const EV_THREAD: u64 = 3;
pub const EV_MMAP: u64 = 4;
pub const EV_MUNMAP: u64 = 5;
pub const EV_MPROTECT: u64 = 6;
pub const EV_BRK: u64 = 7;
pub const EV_EXEC: u64 = 8;
pub const EV_FORK: u64 = 9;
pub const EV_WINDOW: u64 = 10;
pub const EV_TLS: u64 = 11;
pub const EV_THREAD_NEW: u64 = 12;
pub const EV_THREAD_EXIT: u64 = 13;
pub const EV_CTXSW: u64 = 14;
pub const EV_FATAL: u64 = 15;
pub const EV_TRAP: u64 = 16;
pub const EV_ASID: u64 = 17;

pub const TRAP_INTERRUPT: u64 = 1;
pub const TRAP_EXCEPTION: u64 = 2;

pub const CUT_PARTIAL: u64 = 1;
pub const CUT_CLOSED: u64 = 2;
pub const CUT_RUNNING: u64 = 3;

pub const WIN_START: u64 = 0;
pub const WIN_SYSCALL: u64 = 1;
pub const WIN_FUNC: u64 = 2;
pub const WIN_COUNT: u64 = 3;
pub const WIN_CLOSE_FD: u64 = 4;
pub const WIN_FULL: u64 = 5;
pub const WIN_EXIT: u64 = 6;

/// The address the tool records for a guarded access whose guard did not
/// hold (a conditional load or store that did not happen): all ones.
pub const NOT_PERFORMED: u64 = u64::MAX;

/// Most arguments a syscall event may carry (x86-64 has six).
const MAX_SYSCALL_ARGS: u64 = 16;
/// Segment ids below this are looked up in a dense table, others hashed.
const DENSE_SEG_IDS: u64 = 1 << 22;

/// The letter lackey uses for an access kind.
pub fn access_letter(kind: u8) -> char {
    match kind {
        ACC_LOAD => 'L',
        ACC_STORE => 'S',
        _ => 'M',
    }
}

pub fn end_name(end: u8) -> &'static str {
    match end {
        END_BRANCH => "branch",
        END_CALL => "call",
        END_RET => "ret",
        END_SYSCALL => "syscall",
        END_FATAL => "fatal",
        _ => "other",
    }
}

pub fn window_reason_name(r: u64) -> &'static str {
    match r {
        WIN_START => "start",
        WIN_SYSCALL => "syscall",
        WIN_FUNC => "function",
        WIN_COUNT => "count",
        WIN_CLOSE_FD => "close-fd",
        WIN_FULL => "buffer-full",
        WIN_EXIT => "exit",
        _ => "unknown",
    }
}

fn chunk_kind_name(kind: u8) -> &'static str {
    match kind {
        format::CHUNK_HELLO => "HELLO",
        format::CHUNK_DEFS => "DEFS",
        format::CHUNK_EVENTS => "EVENTS",
        format::CHUNK_CUT => "CUT",
        _ => "BYE",
    }
}

/// "interrupt" or "exception" (a BKT_EV_TRAP's kind).
pub fn trap_kind_name(kind: u64) -> &'static str {
    match kind {
        TRAP_INTERRUPT => "interrupt",
        TRAP_EXCEPTION => "exception",
        _ => "trap",
    }
}

/// The last path component ("/usr/lib/x86_64-linux-gnu/libc.so.6" ->
/// "libc.so.6"); names such as "[anon]" stay as they are.
pub fn basename(path: &str) -> &str {
    if path.starts_with('[') {
        return path;
    }
    match path.trim_end_matches('/').rsplit('/').next() {
        Some(b) if !b.is_empty() => b,
        _ => path,
    }
}

/// HELLO: who this stream is.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Hello {
    pub pid: u64,
    pub ppid: u64,
    pub tool_version: u64,
    pub executable: String,
    pub argv: Vec<String>,
    pub window_open: bool,
    pub flags: u64,
}

/// BYE: the tool's own totals when the process ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Bye {
    pub instructions: u64,
    pub memory_references: u64,
    /// Segment executions that did not fit the buffer (buffer mode).
    pub dropped: u64,
    /// The process's exit status (0..255; 0 also when `signal` is set).
    pub exit_status: u64,
    /// The signal that ended the process, 0 if it exited (version 2).
    pub signal: u64,
    /// Instructions of the dropped executions (version 2).
    pub dropped_instructions: u64,
}

/// CUT: the recorder's note that a stream ended without BYE.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cut {
    /// CUT_PARTIAL, CUT_CLOSED or CUT_RUNNING.
    pub reason: u64,
    /// Bytes of an unfinished message that were dropped.
    pub lost_bytes: u64,
    /// The signal that ended the process, when the recorder knows it.
    pub signal: u64,
}

impl Cut {
    pub fn reason_text(&self) -> &'static str {
        match self.reason {
            CUT_PARTIAL => "killed while sending (the unfinished message is dropped)",
            CUT_CLOSED => "killed (its stream closed without BYE)",
            CUT_RUNNING => "still running when the recording ended",
            _ => "cut",
        }
    }
}

/// How a stream ended, from its BYE, its CUT and whether it exec'd.
pub fn ending(bye: Option<&Bye>, cut: Option<&Cut>, exec: bool) -> &'static str {
    match (bye, cut, exec) {
        (Some(b), _, _) if b.signal != 0 => "signal",
        (Some(_), _, _) => "exit",
        (None, _, true) => "exec",
        (None, Some(_), false) => "cut",
        (None, None, false) => "abnormal",
    }
}

/// The name of a Linux x86-64 signal ("SIGSEGV"), or "signal N".
pub fn signal_name(n: u64) -> String {
    const NAMES: [&str; 32] = [
        "", "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL", "SIGUSR1",
        "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGSTKFLT", "SIGCHLD", "SIGCONT", "SIGSTOP",
        "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",
        "SIGPWR", "SIGSYS",
    ];
    match NAMES.get(n as usize) {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => format!("signal {n}"),
    }
}

/// A mapped file (or "[anon]", "[vdso]", ...).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Object {
    pub id: u64,
    pub name: String,
    pub map_start: u64,
    pub map_end: u64,
    pub file_offset: u64,
}

/// A function, as far as the debug information names it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Func {
    pub id: u64,
    /// "" when unknown (a PLT stub, stripped code).
    pub name: String,
    pub file: String,
    pub line: u64,
    /// 0 when unknown.
    pub entry: u64,
}

/// One instruction of a segment definition.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Insn {
    pub addr: u64,
    pub len: u32,
    pub obj: u64,
    pub func: u64,
}

/// One memory access of a segment definition.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Access {
    /// The instruction making it, 1-based into the segment's instructions;
    /// 0 is the instruction in flight (see `Seg::in_flight`).
    pub insn: u32,
    /// ACC_LOAD, ACC_STORE or ACC_MODIFY.
    pub kind: u8,
    pub size: u32,
}

/// A segment: a straight run of instructions with its memory accesses.
#[derive(Debug, Clone)]
pub struct Seg {
    pub id: u64,
    /// May be empty: a segment can hold only the rest of an instruction
    /// cut by a side exit (a rep loop's test).
    pub insns: Vec<Insn>,
    /// In execution order; `insn` is non-decreasing.
    pub accs: Vec<Access>,
    /// How the segment ends (END_*).
    pub end: u8,
    /// File offset of the DEFS chunk defining it.
    pub def_offset: u64,
    /// The instruction whose accesses numbered 0 are: the last instruction
    /// of the segment before it in the same superblock (id - 1, or earlier
    /// if that one has no instructions), which ran just before it when its
    /// side exit was not taken. None if that segment is not in the trace.
    pub in_flight: Option<Insn>,
}

impl Access {
    /// 0-based index into `Seg::insns`, None for the instruction in flight.
    pub fn index(&self) -> Option<usize> {
        (self.insn as usize).checked_sub(1)
    }
}

impl Seg {
    /// The last instruction executed by the segment (its own, or the one in
    /// flight if it has none).
    pub fn last_insn(&self) -> Option<Insn> {
        self.insns.last().copied().or(self.in_flight)
    }
    /// The address after the last instruction (a call's return address).
    pub fn next_addr(&self) -> Option<u64> {
        self.last_insn().map(|i| i.addr.wrapping_add(i.len as u64))
    }
    /// The instruction making access `k`.
    pub fn insn_of(&self, k: usize) -> Option<Insn> {
        match self.accs.get(k)?.index() {
            Some(i) => self.insns.get(i).copied(),
            None => self.in_flight,
        }
    }
}

/// One process image: its HELLO, definitions, BYE and EVENTS chunks.
pub struct Stream {
    /// Stream number from the chunk headers (1 is the first connection).
    pub id: u32,
    pub hello: Hello,
    /// None: the process was killed, or it exec'd (see `ended_by_exec`).
    pub bye: Option<Bye>,
    /// The recorder's note on a stream without BYE (version 2).
    pub cut: Option<Cut>,
    pub objects: BTreeMap<u64, Object>,
    pub funcs: FxHashMap<u64, Func>,
    /// Segment definitions in definition order; `seg_pos` maps an id here.
    pub segs: Vec<Seg>,
    dense: Vec<u32>,
    sparse: FxHashMap<u64, u32>,
    /// The EVENTS chunks, in file order.
    pub events: Vec<ChunkRef>,
    /// Offset of the first chunk of the stream (for messages).
    pub first_offset: u64,
}

impl Stream {
    /// Position in `segs` of the segment with this id.
    #[inline]
    pub fn seg_pos(&self, id: u64) -> Option<usize> {
        if id < DENSE_SEG_IDS {
            match self.dense.get(id as usize) {
                Some(&p) if p != 0 => Some(p as usize - 1),
                _ => None,
            }
        } else {
            self.sparse.get(&id).map(|&p| p as usize)
        }
    }

    pub fn seg(&self, id: u64) -> Option<&Seg> {
        self.seg_pos(id).map(|p| &self.segs[p])
    }

    pub fn func(&self, id: u64) -> Option<&Func> {
        self.funcs.get(&id)
    }

    /// The name of a function, or "" when unknown.
    pub fn func_name(&self, id: u64) -> &str {
        self.funcs.get(&id).map(|f| f.name.as_str()).unwrap_or("")
    }

    /// The path of an object ("[object N]" for an id never defined).
    pub fn object_name(&self, id: u64) -> String {
        match self.objects.get(&id) {
            Some(o) => o.name.clone(),
            None if id == 0 => "[unknown]".into(),
            None => format!("[object {id}]"),
        }
    }

    /// Whether this object is the stream's program: its path is the HELLO
    /// executable (or, when no object has exactly that path, the same
    /// basename, for an executable started by a relative path).
    pub fn is_program(&self, obj: &Object) -> bool {
        let exe = &self.hello.executable;
        if exe.is_empty() {
            return false;
        }
        if obj.name == *exe {
            return true;
        }
        if self.objects.values().any(|o| o.name == *exe) || obj.name.starts_with('[') {
            return false;
        }
        // Through symlinks (/bin/sh -> /usr/bin/dash), if the trace is read
        // on the machine it was recorded on; else by basename.
        match std::fs::canonicalize(exe) {
            Ok(real) if real.as_os_str() == obj.name.as_str() => true,
            _ => basename(&obj.name) == basename(exe),
        }
    }

    /// Short name of the program: the executable's basename.
    pub fn program_name(&self) -> &str {
        basename(&self.hello.executable)
    }

    /// Sets `in_flight` of every segment with accesses numbered 0.
    fn resolve_in_flight(&mut self) {
        let found: Vec<Option<Insn>> = self
            .segs
            .iter()
            .map(|seg| {
                if !seg.accs.iter().any(|a| a.insn == 0) {
                    return None;
                }
                let mut id = seg.id;
                for _ in 0..16 {
                    id = id.checked_sub(1)?;
                    let prev = self.seg(id)?;
                    if let Some(last) = prev.insns.last() {
                        return Some(*last);
                    }
                }
                None
            })
            .collect();
        for (seg, f) in self.segs.iter_mut().zip(found) {
            seg.in_flight = f;
        }
    }

    fn add_seg(&mut self, seg: Seg) -> Result<(), String> {
        let id = seg.id;
        if let Some(p) = self.seg_pos(id) {
            let old = &self.segs[p];
            if old.insns.len() == seg.insns.len()
                && old.accs.len() == seg.accs.len()
                && old.end == seg.end
                && old.insns.iter().zip(&seg.insns).all(|(a, b)| a.addr == b.addr && a.len == b.len)
            {
                return Ok(());
            }
            return Err(format!("segment {id} defined twice, differently"));
        }
        let pos = self.segs.len();
        if pos >= u32::MAX as usize - 1 {
            return Err("too many segments".into());
        }
        if id < DENSE_SEG_IDS {
            let i = id as usize;
            if i >= self.dense.len() {
                self.dense.resize(i + 1, 0);
            }
            self.dense[i] = pos as u32 + 1;
        } else {
            self.sparse.insert(id, pos as u32);
        }
        self.segs.push(seg);
        Ok(())
    }
}

/// A decoded event (BKT_EV_*). Times are CLOCK_MONOTONIC nanoseconds.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Syscall { tid: u64, sysno: u64, args: Vec<u64>, result: i64, start_ns: u64, duration_ns: u64 },
    Signal { tid: u64, signo: u64 },
    Thread { tid: u64 },
    Mmap { addr: u64, len: u64, prot: u64, object: u64 },
    Munmap { addr: u64, len: u64 },
    Mprotect { addr: u64, len: u64, prot: u64 },
    Brk { addr: u64, len: u64, grow: bool },
    Exec { path: String },
    Fork { child: u64 },
    Window { open: bool, reason: u64, instructions: u64 },
    Tls { tid: u64, which: u64, base: u64 },
    ThreadNew { parent: u64, child: u64 },
    ThreadExit { tid: u64 },
    CtxSw { voluntary: u64, involuntary: u64 },
    /// The process ends by this signal; `addr` is the instruction it struck (0 unknown).
    Fatal { tid: u64, signo: u64, addr: u64 },
    /// System mode: an interrupt or exception (`kind`: TRAP_*) entered at
    /// the entry stub `func` (a function id of the stream).
    Trap { tid: u64, kind: u64, func: u64 },
    /// System mode: an address-space switch (a CR3 load).
    Asid { tid: u64 },
}

/// One record handed to a visitor.
pub enum Item<'a> {
    /// One execution of `seg`; `addrs[i]` is the address of `seg.accs[i]`.
    Exec {
        seg: &'a Seg,
        seg_pos: usize,
        addrs: &'a [u64],
    },
    Event(&'a Event),
}

/// Where a record lies.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pos {
    /// Index into `Trace::streams`.
    pub stream: usize,
    /// The thread running (the last BKT_EV_THREAD; 1 until then).
    pub tid: u64,
    /// Instructions this stream executed before this record.
    pub instr: u64,
    /// Instructions all visited streams executed before this record, in
    /// file order.
    pub global: u64,
    /// File offset of the chunk holding the record.
    pub chunk: u64,
}

/// Totals of one visit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Visited {
    pub instructions: u64,
    pub memory_references: u64,
    pub executions: u64,
    pub events: u64,
    /// The visitor asked to stop.
    pub stopped: bool,
}

impl Visited {
    /// Records: instructions plus memory references.
    pub fn records(&self) -> u64 {
        self.instructions + self.memory_references
    }
}

/// A loaded trace.
pub struct Trace {
    pub file: TraceFile,
    pub streams: Vec<Stream>,
    /// Whether a visit shows its progress on stderr (after a second): the
    /// commands set it on a terminal, when nothing streams to stdout.
    pub progress: bool,
}

enum DecErr {
    At(usize),
    Msg(String),
}

impl From<CursorError> for DecErr {
    fn from(e: CursorError) -> Self {
        DecErr::At(e.0)
    }
}

impl From<String> for DecErr {
    fn from(s: String) -> Self {
        DecErr::Msg(s)
    }
}

impl Trace {
    /// Opens a trace and reads every stream's HELLO, DEFS and BYE.
    pub fn load(path: &Path) -> Result<Trace> {
        let file = TraceFile::open(path).map_err(one_line)?;
        Self::from_file(file)
    }

    pub fn from_file(file: TraceFile) -> Result<Trace> {
        let mut streams: Vec<Stream> = Vec::new();
        let mut index: FxHashMap<u32, usize> = FxHashMap::default();
        for c in &file.chunks {
            let si = match index.get(&c.stream) {
                Some(&i) => i,
                None => {
                    if c.kind != format::CHUNK_HELLO {
                        return Err(corrupt(
                            &file,
                            c,
                            format!("{} chunk of stream {} before its HELLO", chunk_kind_name(c.kind), c.stream),
                        ));
                    }
                    let raw = file.read_chunk(c).map_err(one_line)?;
                    let hello = parse_hello(&raw).map_err(|e| dec_error(&file, c, e, 0))?;
                    index.insert(c.stream, streams.len());
                    streams.push(Stream {
                        id: c.stream,
                        hello,
                        bye: None,
                        cut: None,
                        objects: BTreeMap::new(),
                        funcs: FxHashMap::default(),
                        segs: Vec::new(),
                        dense: Vec::new(),
                        sparse: FxHashMap::default(),
                        events: Vec::new(),
                        first_offset: c.offset,
                    });
                    continue;
                }
            };
            let st = &mut streams[si];
            match c.kind {
                format::CHUNK_HELLO => {
                    return Err(corrupt(&file, c, format!("second HELLO for stream {}", c.stream)));
                }
                format::CHUNK_DEFS => {
                    let raw = file.read_chunk(c).map_err(one_line)?;
                    parse_defs(st, &raw, c.offset).map_err(|(e, at)| dec_error(&file, c, e, at))?;
                }
                format::CHUNK_EVENTS => {
                    if st.bye.is_some() || st.cut.is_some() {
                        return Err(corrupt(&file, c, format!("EVENTS of stream {} after its BYE", c.stream)));
                    }
                    st.events.push(*c);
                }
                format::CHUNK_CUT => {
                    if st.bye.is_some() || st.cut.is_some() {
                        return Err(corrupt(&file, c, format!("CUT for stream {} after its end", c.stream)));
                    }
                    let raw = file.read_chunk(c).map_err(one_line)?;
                    st.cut = Some(parse_cut(&raw).map_err(|e| dec_error(&file, c, e, 0))?);
                }
                _ => {
                    if st.bye.is_some() || st.cut.is_some() {
                        return Err(corrupt(&file, c, format!("second BYE for stream {}", c.stream)));
                    }
                    let raw = file.read_chunk(c).map_err(one_line)?;
                    st.bye = Some(parse_bye(&raw).map_err(|e| dec_error(&file, c, e, 0))?);
                }
            }
        }
        for st in &mut streams {
            st.resolve_in_flight();
        }
        Ok(Trace { file, streams, progress: false })
    }

    /// The index of the stream with this stream id, or else of the first
    /// stream of this pid.
    pub fn find_stream(&self, n: u64) -> Option<usize> {
        self.streams
            .iter()
            .position(|s| s.id as u64 == n)
            .or_else(|| self.streams.iter().position(|s| s.hello.pid == n))
    }

    /// The stream indices to visit: all, or the one named by `--stream N`.
    pub fn select(&self, stream: Option<u64>) -> Result<Vec<usize>> {
        match stream {
            None => Ok((0..self.streams.len()).collect()),
            Some(n) => match self.find_stream(n) {
                Some(i) => Ok(vec![i]),
                None => {
                    let ids: Vec<String> =
                        self.streams.iter().map(|s| format!("{} (pid {})", s.id, s.hello.pid)).collect();
                    anyhow::bail!(
                        "{}: no stream or pid {n} (the trace holds streams {})",
                        self.file.path.display(),
                        if ids.is_empty() { "none".to_string() } else { ids.join(", ") }
                    )
                }
            },
        }
    }

    /// Walks the EVENTS chunks of the given streams (indices into
    /// `streams`) in file order and calls `f` for every record. `f` returns
    /// `ControlFlow::Break` to stop early.
    pub fn visit<F>(&self, streams: &[usize], f: F) -> Result<Visited>
    where
        F: FnMut(&Pos, Item<'_>) -> ControlFlow<()>,
    {
        self.visit_as("reading the trace", streams, f)
    }

    /// `visit`, its progress (with `progress` set) labelled `what`: the
    /// stored bytes of the chunks decoded, of all.
    pub fn visit_as<F>(&self, what: &str, streams: &[usize], mut f: F) -> Result<Visited>
    where
        F: FnMut(&Pos, Item<'_>) -> ControlFlow<()>,
    {
        let mut wanted = vec![false; self.streams.len()];
        for &s in streams {
            if let Some(w) = wanted.get_mut(s) {
                *w = true;
            }
        }
        let by_id: FxHashMap<u32, usize> = self.streams.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
        let chunks: Vec<(usize, ChunkRef)> = self
            .file
            .chunks_of(format::CHUNK_EVENTS)
            .filter_map(|c| by_id.get(&c.stream).map(|&i| (i, *c)))
            .filter(|(i, _)| wanted[*i])
            .collect();

        let progress = bunkai_common::progress::Progress::new(
            "  {msg} {bar:30} {bytes}/{total_bytes} ({eta} left)",
            Some(chunks.iter().map(|(_, c)| c.stored_len as u64).sum()),
            self.progress,
        );
        progress.phase(format!("{what}: {}", self.file.path.file_name().unwrap_or_default().to_string_lossy()));
        let mut tid = vec![1u64; self.streams.len()];
        let mut instr = vec![0u64; self.streams.len()];
        let mut total = Visited::default();
        let mut addrs: Vec<u64> = Vec::new();

        std::thread::scope(|scope| -> Result<Visited> {
            // Decompression runs one chunk ahead, on the second core.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(2);
            let file = &self.file;
            let list = &chunks;
            scope.spawn(move || {
                let mut fh = match std::fs::File::open(&file.path) {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::anyhow!("{}: {e}", file.path.display())));
                        return;
                    }
                };
                for (_, c) in list {
                    let r = read_stored(&mut fh, file, c);
                    let stop = r.is_err();
                    if tx.send(r).is_err() || stop {
                        return;
                    }
                }
            });
            for (si, c) in &chunks {
                let raw = match rx.recv() {
                    Ok(r) => r?,
                    Err(_) => anyhow::bail!("{}: the chunk reader stopped", self.file.path.display()),
                };
                let st = &self.streams[*si];
                let mut pos =
                    Pos { stream: *si, tid: tid[*si], instr: instr[*si], global: total.instructions, chunk: c.offset };
                let r = decode_events(st, &raw, &mut pos, &mut total, &mut addrs, &mut f);
                progress.bar().inc(c.stored_len as u64);
                tid[*si] = pos.tid;
                instr[*si] = pos.instr;
                match r {
                    Ok(ControlFlow::Continue(())) => {}
                    Ok(ControlFlow::Break(())) => {
                        total.stopped = true;
                        break;
                    }
                    Err((e, at)) => return Err(dec_error(&self.file, c, e, at)),
                }
            }
            Ok(total)
        })
    }
}

/// Reads and decompresses one chunk through an open file handle.
fn read_stored(fh: &mut std::fs::File, file: &TraceFile, c: &ChunkRef) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| anyhow::anyhow!("{}: {e}", file.path.display());
    fh.seek(SeekFrom::Start(c.offset + format::CHUNK_HEADER)).map_err(io)?;
    let mut stored = vec![0u8; c.stored_len as usize];
    fh.read_exact(&mut stored).map_err(io)?;
    file.decode_chunk(c, stored).map_err(one_line)
}

/// A reader error as one line (the I/O variant would repeat its cause).
fn one_line(e: format::TraceError) -> anyhow::Error {
    match e {
        format::TraceError::Io { path, source } => anyhow::anyhow!("cannot read {path} ({source}; check the path)"),
        other => anyhow::anyhow!("{other}"),
    }
}

fn corrupt(file: &TraceFile, c: &ChunkRef, what: String) -> anyhow::Error {
    format::TraceError::Corrupt { path: file.path.display().to_string(), offset: c.offset, what }.into()
}

/// An error inside a chunk payload; `record` is where the record began.
fn dec_error(file: &TraceFile, c: &ChunkRef, e: DecErr, record: usize) -> anyhow::Error {
    let what = match e {
        DecErr::At(p) => format!("record ends early or is malformed at payload byte {p}"),
        DecErr::Msg(m) => m,
    };
    corrupt(
        file,
        c,
        format!("{} chunk of stream {}: {what} (record at payload byte {record})", chunk_kind_name(c.kind), c.stream),
    )
}

fn parse_hello(raw: &[u8]) -> Result<Hello, DecErr> {
    let mut c = Cursor::new(raw);
    let pid = c.v()?;
    let ppid = c.v()?;
    let tool_version = c.v()?;
    let executable = c.s()?;
    let nargs = c.v()?;
    let mut argv = Vec::new();
    for _ in 0..nargs {
        argv.push(c.s()?);
    }
    let window_open = c.v()? != 0;
    let flags = c.v()?;
    if !c.done() {
        return Err(DecErr::Msg(format!("{} bytes after the HELLO fields", raw.len() - c.pos)));
    }
    Ok(Hello { pid, ppid, tool_version, executable, argv, window_open, flags })
}

fn parse_bye(raw: &[u8]) -> Result<Bye, DecErr> {
    let mut c = Cursor::new(raw);
    let mut b = Bye {
        instructions: c.v()?,
        memory_references: c.v()?,
        dropped: c.v()?,
        exit_status: c.v()?,
        signal: 0,
        dropped_instructions: 0,
    };
    // Version 1 ends here.
    if !c.done() {
        b.signal = c.v()?;
        b.dropped_instructions = c.v()?;
    }
    if !c.done() {
        return Err(DecErr::Msg(format!("{} bytes after the BYE fields", raw.len() - c.pos)));
    }
    Ok(b)
}

fn parse_cut(raw: &[u8]) -> Result<Cut, DecErr> {
    let mut c = Cursor::new(raw);
    let cut = Cut { reason: c.v()?, lost_bytes: c.v()?, signal: c.v()? };
    if !(CUT_PARTIAL..=CUT_RUNNING).contains(&cut.reason) {
        return Err(DecErr::Msg(format!("unknown CUT reason {}", cut.reason)));
    }
    if !c.done() {
        return Err(DecErr::Msg(format!("{} bytes after the CUT fields", raw.len() - c.pos)));
    }
    Ok(cut)
}

fn small(v: u64, what: &str) -> Result<u32, DecErr> {
    u32::try_from(v).map_err(|_| DecErr::Msg(format!("{what} {v} is too large")))
}

fn parse_defs(st: &mut Stream, raw: &[u8], offset: u64) -> Result<(), (DecErr, usize)> {
    let mut c = Cursor::new(raw);
    let mut pk = Packed::default();
    while !c.done() {
        let at = c.pos;
        parse_def(st, &mut c, offset, &mut pk).map_err(|e| (e, at))?;
    }
    Ok(())
}

/// What a packed segment (DEF_SEGP) leaves out, carried from the DEFS
/// message's previous one: all zero at the start of every message.
#[derive(Default)]
pub struct Packed {
    pub id: u64,
    pub first: u64,
    pub obj: u64,
    pub func: u64,
}

/// DEF_SEGP's access word: (instruction delta) << 5 | kind << 3 | size code
/// (0-6: 1 << code bytes; 7: the size follows as a varint).
pub const SEGP_SIZE_FOLLOWS: u64 = 7;

fn parse_segp(st: &mut Stream, c: &mut Cursor, offset: u64, pk: &mut Packed) -> Result<(), DecErr> {
    let id = pk.id.wrapping_add(1).wrapping_add(c.z()? as u64);
    pk.id = id;
    let n = c.v()?;
    let left = (c.buf.len() - c.pos) as u64;
    // A packed instruction takes at least a byte, an access too.
    if n > left {
        return Err(DecErr::Msg(format!("segment {id} claims {n} instructions in {left} bytes")));
    }
    let first = pk.first.wrapping_add(c.z()? as u64);
    pk.first = first;
    let mut insns: Vec<Insn> = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let w = c.v()?;
        let len = small(w >> 3, "instruction length")?;
        let addr = match insns.last() {
            None if w & 4 != 0 => return Err(DecErr::Msg(format!("segment {id}: its first instruction jumps"))),
            None => first,
            Some(p) => {
                let next = p.addr.wrapping_add(p.len as u64);
                if w & 4 != 0 {
                    next.wrapping_add(c.z()? as u64)
                } else {
                    next
                }
            }
        };
        if w & 2 != 0 {
            pk.obj = c.v()?;
        }
        if w & 1 != 0 {
            pk.func = c.v()?;
        }
        insns.push(Insn { addr, len, obj: pk.obj, func: pk.func });
    }
    let nacc = c.v()?;
    let left = (c.buf.len() - c.pos) as u64;
    if nacc > left {
        return Err(DecErr::Msg(format!("segment {id} claims {nacc} accesses in {left} bytes")));
    }
    let mut accs = Vec::with_capacity(nacc as usize);
    let mut insn = 0u64;
    for _ in 0..nacc {
        let a = c.v()?;
        insn = insn.checked_add(a >> 5).filter(|&i| i <= n).ok_or_else(|| {
            DecErr::Msg(format!("segment {id}: an access past its last instruction (the segment has {n})"))
        })?;
        let kind = (a >> 3) & 3;
        if kind > ACC_MODIFY as u64 {
            return Err(DecErr::Msg(format!("segment {id}: unknown access kind {kind}")));
        }
        let size = match a & 7 {
            SEGP_SIZE_FOLLOWS => small(c.v()?, "access size")?,
            code => 1u32 << code,
        };
        accs.push(Access { insn: insn as u32, kind: kind as u8, size });
    }
    let end = c.v()?;
    if end > END_FATAL as u64 {
        return Err(DecErr::Msg(format!("segment {id}: unknown end kind {end}")));
    }
    st.add_seg(Seg { id, insns, accs, end: end as u8, def_offset: offset, in_flight: None })?;
    Ok(())
}

fn parse_def(st: &mut Stream, c: &mut Cursor, offset: u64, pk: &mut Packed) -> Result<(), DecErr> {
    match c.v()? {
        DEF_SEGP => parse_segp(st, c, offset, pk)?,
        DEF_OBJECT => {
            let o = Object { id: c.v()?, name: c.s()?, map_start: c.v()?, map_end: c.v()?, file_offset: c.v()? };
            st.objects.insert(o.id, o);
        }
        DEF_FUNC => {
            let f = Func { id: c.v()?, name: c.s()?, file: c.s()?, line: c.v()?, entry: c.v()? };
            st.funcs.insert(f.id, f);
        }
        DEF_SEG => {
            let id = c.v()?;
            let n = c.v()?;
            let left = (c.buf.len() - c.pos) as u64;
            // An instruction takes at least 4 bytes, an access 3.
            if n > left / 4 {
                return Err(DecErr::Msg(format!("segment {id} claims {n} instructions in {left} bytes")));
            }
            let mut insns = Vec::with_capacity(n as usize);
            let mut addr = 0u64;
            for i in 0..n {
                let a = c.v()?;
                addr = if i == 0 { a } else { addr.wrapping_add(a) };
                let len = small(c.v()?, "instruction length")?;
                let obj = c.v()?;
                let func = c.v()?;
                insns.push(Insn { addr, len, obj, func });
            }
            let nacc = c.v()?;
            let left = (c.buf.len() - c.pos) as u64;
            if nacc > left / 3 {
                return Err(DecErr::Msg(format!("segment {id} claims {nacc} accesses in {left} bytes")));
            }
            let mut accs = Vec::with_capacity(nacc as usize);
            let mut prev = 0u64;
            for _ in 0..nacc {
                let insn = c.v()?;
                if insn > n || insn < prev {
                    return Err(DecErr::Msg(format!(
                        "segment {id}: access of instruction {insn} (the segment has {n}, numbered from 1; numbers must not decrease)"
                    )));
                }
                prev = insn;
                let kind = c.v()?;
                if kind > ACC_MODIFY as u64 {
                    return Err(DecErr::Msg(format!("segment {id}: unknown access kind {kind}")));
                }
                let size = small(c.v()?, "access size")?;
                accs.push(Access { insn: insn as u32, kind: kind as u8, size });
            }
            let end = c.v()?;
            if end > END_FATAL as u64 {
                return Err(DecErr::Msg(format!("segment {id}: unknown end kind {end}")));
            }
            st.add_seg(Seg { id, insns, accs, end: end as u8, def_offset: offset, in_flight: None })?;
        }
        tag => return Err(DecErr::Msg(format!("unknown definition tag {tag}"))),
    }
    Ok(())
}

fn parse_event(tag: u64, c: &mut Cursor) -> Result<Event, DecErr> {
    Ok(match tag {
        EV_SYSCALL => {
            let tid = c.v()?;
            let sysno = c.v()?;
            let n = c.v()?;
            if n > MAX_SYSCALL_ARGS {
                return Err(DecErr::Msg(format!("syscall event with {n} arguments")));
            }
            let mut args = Vec::with_capacity(n as usize);
            for _ in 0..n {
                args.push(c.v()?);
            }
            Event::Syscall { tid, sysno, args, result: c.z()?, start_ns: c.v()?, duration_ns: c.v()? }
        }
        EV_SIGNAL => Event::Signal { tid: c.v()?, signo: c.v()? },
        EV_THREAD => Event::Thread { tid: c.v()? },
        EV_MMAP => Event::Mmap { addr: c.v()?, len: c.v()?, prot: c.v()?, object: c.v()? },
        EV_MUNMAP => Event::Munmap { addr: c.v()?, len: c.v()? },
        EV_MPROTECT => Event::Mprotect { addr: c.v()?, len: c.v()?, prot: c.v()? },
        EV_BRK => Event::Brk { addr: c.v()?, len: c.v()?, grow: c.v()? != 0 },
        EV_EXEC => Event::Exec { path: c.s()? },
        EV_FORK => Event::Fork { child: c.v()? },
        EV_WINDOW => Event::Window { open: c.v()? != 0, reason: c.v()?, instructions: c.v()? },
        EV_TLS => Event::Tls { tid: c.v()?, which: c.v()?, base: c.v()? },
        EV_THREAD_NEW => Event::ThreadNew { parent: c.v()?, child: c.v()? },
        EV_THREAD_EXIT => Event::ThreadExit { tid: c.v()? },
        EV_CTXSW => Event::CtxSw { voluntary: c.v()?, involuntary: c.v()? },
        EV_FATAL => Event::Fatal { tid: c.v()?, signo: c.v()?, addr: c.v()? },
        EV_TRAP => Event::Trap { tid: c.v()?, kind: c.v()?, func: c.v()? },
        EV_ASID => Event::Asid { tid: c.v()? },
        _ => return Err(DecErr::Msg(format!("unknown event tag {tag}"))),
    })
}

/// Decodes one EVENTS payload. On error returns it with the payload offset
/// of the record where it happened.
#[inline(never)]
fn decode_events<F>(
    st: &Stream,
    raw: &[u8],
    pos: &mut Pos,
    total: &mut Visited,
    addrs: &mut Vec<u64>,
    f: &mut F,
) -> Result<ControlFlow<()>, (DecErr, usize)>
where
    F: FnMut(&Pos, Item<'_>) -> ControlFlow<()>,
{
    let mut c = Cursor::new(raw);
    let mut prev_seg = 0u64;
    let mut prev_addr = 0u64;
    while !c.done() {
        let at = c.pos;
        let h = c.v().map_err(|e| (e.into(), at))?;
        if h & 1 == 0 {
            let id = prev_seg.wrapping_add(unzigzag(h >> 1) as u64);
            prev_seg = id;
            let Some(p) = st.seg_pos(id) else {
                return Err((DecErr::Msg(format!("segment {id} executed but never defined")), at));
            };
            let seg = &st.segs[p];
            addrs.clear();
            for _ in 0..seg.accs.len() {
                let d = c.z().map_err(|e| (e.into(), at))?;
                prev_addr = prev_addr.wrapping_add(d as u64);
                addrs.push(prev_addr);
            }
            let flow = f(pos, Item::Exec { seg, seg_pos: p, addrs });
            let n = seg.insns.len() as u64;
            pos.instr += n;
            pos.global += n;
            total.instructions += n;
            total.memory_references += seg.accs.len() as u64;
            total.executions += 1;
            if flow.is_break() {
                return Ok(flow);
            }
        } else {
            let ev = parse_event(h >> 1, &mut c).map_err(|e| (e, at))?;
            if let Event::Thread { tid } = ev {
                pos.tid = tid;
            }
            total.events += 1;
            if f(pos, Item::Event(&ev)).is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// Buffered, locked standard output.
pub type Stdout = std::io::BufWriter<std::io::StdoutLock<'static>>;

/// Runs a printer on buffered stdout. A closed pipe (`| head`) comes back
/// as an error, which the CLI's main ends quietly, as for every command.
pub fn to_stdout(print: impl FnOnce(&mut Stdout) -> Result<()>) -> Result<()> {
    let mut w = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    print(&mut w)?;
    std::io::Write::flush(&mut w)?;
    Ok(())
}
