//! `bunkai trace calls`: function entries and exits per thread, like
//! uftrace, rebuilt from the instruction trace.
//!
//! The paper's §2.3 tools attribute every instruction to a component;
//! this one goes a level further and follows the dynamic call tree, so a
//! request can be read as "accept -> ap_process_request -> ... -> close".
//! Each thread has a stack. A segment ending in a call (BKT_END_CALL)
//! makes the thread's next segment the entry of a callee, whose return
//! address is the address after the call instruction; a segment ending in
//! a return (BKT_END_RET) pops back to the frame whose return address the
//! next segment starts at (several frames for longjmp-like unwinding). A
//! change of function without call or return is a tail call (the top frame
//! is replaced) or, if the top frame's function is unnamed and has made
//! no calls (a PLT stub jumping into its target), a rename; landing in the middle of a deeper
//! frame's function (longjmp, exceptions, sigreturn) pops down to it.
//! Times are instruction indices of the stream (process image).

use crate::decode::{basename, Event, Insn, Item, Seg, Stream, Trace, END_CALL, END_RET};
use anyhow::Result;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

/// What `run` prints: `bunkai trace calls`'s options (cmd/calls.rs).
#[derive(Debug)]
pub struct CallsOptions {
    /// Trace file written by `bunkai trace record`
    pub file: PathBuf,
    /// Print a JSON array of frames
    pub json: bool,
    /// Write a Chrome trace (Perfetto, chrome://tracing) JSON file here
    /// instead of the text
    pub chrome: Option<PathBuf>,
    /// Only this stream (its number, or a pid)
    pub stream: Option<u64>,
    /// Show only frames less than N calls deep
    pub depth: Option<usize>,
}

/// Prints the call tree of the trace's threads as text, as JSON, or writes
/// it as a Chrome trace.
pub fn run(a: &CallsOptions) -> Result<ExitCode> {
    let mut trace = Trace::load(&a.file)?;
    // Progress only while the frames are collected for --chrome: the
    // plain listing streams to stdout as it goes.
    trace.progress = a.chrome.is_some() && !a.json && bunkai_common::progress::on_terminal();
    let sel = trace.select(a.stream)?;
    let max_depth = a.depth.unwrap_or(usize::MAX);
    if a.json || a.chrome.is_some() {
        let mut frames = Vec::new();
        walk(&trace, &sel, &mut Collect(&mut frames))?;
        sort_frames(&mut frames);
        frames.retain(|f| f.depth < max_depth);
        if let Some(out) = &a.chrome {
            write_chrome(&trace, &frames, out)?;
            eprintln!("bunkai trace calls: wrote {} ({} frames)", out.display(), frames.len());
        }
        if a.json {
            crate::decode::to_stdout(|w| {
                serde_json::to_writer(&mut *w, &frames)?;
                writeln!(w)?;
                Ok(())
            })?;
        }
    } else {
        crate::decode::to_stdout(|w| {
            let mut p = Printer { w, trace: &trace, max_depth, last: None };
            walk(&trace, &sel, &mut p)
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One function activation.
#[derive(Debug, Clone, Serialize)]
pub struct Frame {
    pub stream: u32,
    pub pid: u64,
    pub tid: u64,
    /// 0 for the outermost frame seen.
    pub depth: usize,
    pub name: String,
    pub file: String,
    pub line: u64,
    /// Instruction index of the stream at entry.
    pub enter: u64,
    /// Instruction index of the stream at exit.
    pub leave: u64,
    /// Instructions this thread executed while the frame was on its stack.
    pub instructions: u64,
}

/// Receives frames as the walk finds them.
pub trait CallSink {
    /// A frame that has callees opens (its `leave` is not known yet).
    fn enter(&mut self, f: &Frame) -> Result<()>;
    /// A frame closes; `leaf` if it had no callees (and `enter` was not
    /// called for it).
    fn leave(&mut self, f: &Frame, leaf: bool) -> Result<()>;
}

/// Collects every closed frame.
pub struct Collect<'a>(pub &'a mut Vec<Frame>);

impl CallSink for Collect<'_> {
    fn enter(&mut self, _: &Frame) -> Result<()> {
        Ok(())
    }
    fn leave(&mut self, f: &Frame, _: bool) -> Result<()> {
        self.0.push(f.clone());
        Ok(())
    }
}

/// Orders frames by stream, thread, entry, depth.
pub fn sort_frames(frames: &mut [Frame]) {
    frames.sort_by_key(|f| (f.stream, f.tid, f.enter, f.depth));
}

/// All frames of the selected streams (indices into `trace.streams`).
pub fn frames(trace: &Trace, sel: &[usize]) -> Result<Vec<Frame>> {
    let mut v = Vec::new();
    walk(trace, sel, &mut Collect(&mut v))?;
    sort_frames(&mut v);
    Ok(v)
}

// ---------------------------------------------------------------------------
// The stacks

struct Open {
    func: u64,
    obj: u64,
    /// Address where the function was entered (names unnamed code).
    start: u64,
    /// Where the matching return lands; None for roots and signal handlers.
    ret: Option<u64>,
    enter: u64,
    enter_thread: u64,
    /// `enter` was reported (the frame has had callees).
    shown: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Pending {
    None,
    /// A call; the return address (None if unknown).
    Call(Option<u64>),
    Ret,
    Signal,
}

struct Thread {
    stack: Vec<Open>,
    pending: Pending,
    /// Instructions this thread executed.
    instr: u64,
}

/// A point in time: stream instruction index and the thread's own count.
#[derive(Clone, Copy)]
struct Clock {
    t: u64,
    ti: u64,
}

struct Tracker<'a, S: CallSink> {
    trace: &'a Trace,
    sink: &'a mut S,
    threads: FxHashMap<(usize, u64), Thread>,
    /// Per stream: instructions so far.
    now: Vec<u64>,
}

fn unnamed(st: &Stream, func: u64) -> bool {
    st.func_name(func).is_empty()
}

/// Whether `addr` is the (known) entry of `func`.
fn is_entry(st: &Stream, func: u64, addr: u64) -> bool {
    st.func(func).is_some_and(|f| f.entry != 0 && f.entry == addr)
}

fn frame_of(st: &Stream, tid: u64, depth: usize, o: &Open, leave: Option<Clock>) -> Frame {
    let (name, file, line) = match st.func(o.func) {
        Some(f) if !f.name.is_empty() => (f.name.clone(), f.file.clone(), f.line),
        _ => (format!("{:#x}@{}", o.start, basename(&st.object_name(o.obj))), String::new(), 0),
    };
    Frame {
        stream: st.id,
        pid: st.hello.pid,
        tid,
        depth,
        name,
        file,
        line,
        enter: o.enter,
        leave: leave.map_or(o.enter, |c| c.t),
        instructions: leave.map_or(0, |c| c.ti.saturating_sub(o.enter_thread)),
    }
}

impl<S: CallSink> Tracker<'_, S> {
    /// Opens a frame for the function of instruction `at`.
    fn push(&mut self, s: usize, tid: u64, at: Insn, ret: Option<u64>, c: Clock) -> Result<()> {
        let st = &self.trace.streams[s];
        let th = self.threads.get_mut(&(s, tid)).expect("thread exists");
        // The caller now has a callee: its opening line is due.
        let depth = th.stack.len();
        if let Some(top) = th.stack.last_mut() {
            if !top.shown {
                top.shown = true;
                self.sink.enter(&frame_of(st, tid, depth - 1, top, None))?;
            }
        }
        th.stack.push(Open {
            func: at.func,
            obj: at.obj,
            start: at.addr,
            ret,
            enter: c.t,
            enter_thread: c.ti,
            shown: false,
        });
        Ok(())
    }

    /// Closes the frames from `keep` upwards.
    fn pop_to(&mut self, s: usize, tid: u64, keep: usize, c: Clock) -> Result<()> {
        let st = &self.trace.streams[s];
        let th = self.threads.get_mut(&(s, tid)).expect("thread exists");
        while th.stack.len() > keep {
            let o = th.stack.pop().expect("non-empty");
            let f = frame_of(st, tid, th.stack.len(), &o, Some(c));
            self.sink.leave(&f, !o.shown)?;
        }
        Ok(())
    }

    fn stack_len(&self, s: usize, tid: u64) -> usize {
        self.threads.get(&(s, tid)).map_or(0, |t| t.stack.len())
    }

    /// Execution moves to instruction `at` without a call or a return.
    fn change(&mut self, s: usize, tid: u64, at: Insn, c: Clock) -> Result<()> {
        let (func, obj, addr) = (at.func, at.obj, at.addr);
        let st = &self.trace.streams[s];
        let th = self.threads.get_mut(&(s, tid)).expect("thread exists");
        let n = th.stack.len();
        let Some(top) = th.stack.last_mut() else {
            return self.push(s, tid, at, None, c);
        };
        if top.func == func {
            return Ok(());
        }
        if unnamed(st, top.func) && !top.shown {
            // A PLT stub (or other unnamed code without callees) jumping to
            // its target: the frame was the target's all along.
            top.func = func;
            top.obj = obj;
            top.start = addr;
            return Ok(());
        }
        let ret = top.ret;
        if !is_entry(st, func, addr) {
            if let Some(k) = th.stack[..n - 1].iter().rposition(|o| o.func == func) {
                // Back into a deeper frame's function: longjmp, exception, sigreturn.
                return self.pop_to(s, tid, k + 1, c);
            }
        }
        // Tail call: the new function takes the frame's place.
        self.pop_to(s, tid, n - 1, c)?;
        self.push(s, tid, at, ret, c)
    }

    fn exec(&mut self, s: usize, tid: u64, t: u64, seg: &Seg) -> Result<()> {
        let th = self.threads.entry((s, tid)).or_insert(Thread { stack: Vec::new(), pending: Pending::None, instr: 0 });
        let pending = std::mem::replace(&mut th.pending, Pending::None);
        let c = Clock { t, ti: th.instr };
        let st = &self.trace.streams[s];
        let end = match seg.end {
            END_CALL => Pending::Call(seg.next_addr()),
            END_RET => Pending::Ret,
            _ => Pending::None,
        };
        let Some(&first) = seg.insns.first() else {
            // Only the rest of the instruction in flight: no function change.
            if let Some(th) = self.threads.get_mut(&(s, tid)) {
                th.pending = if end == Pending::None { pending } else { end };
            }
            return Ok(());
        };
        match pending {
            Pending::Call(ret) => self.push(s, tid, first, ret, c)?,
            Pending::Signal => {
                let th = &self.threads[&(s, tid)];
                let same = th.stack.last().is_some_and(|o| o.func == first.func);
                // No handler ran if execution goes on inside the same function.
                if !same || is_entry(st, first.func, first.addr) {
                    self.push(s, tid, first, None, c)?;
                }
            }
            Pending::Ret => {
                let th = &self.threads[&(s, tid)];
                let keep = match th.stack.iter().rposition(|o| o.ret == Some(first.addr)) {
                    Some(k) => k,
                    None => th.stack.len().saturating_sub(1),
                };
                self.pop_to(s, tid, keep, c)?;
            }
            Pending::None => {}
        }
        if self.stack_len(s, tid) == 0 {
            self.push(s, tid, first, None, c)?;
        }
        let mut prev = u64::MAX;
        for (i, insn) in seg.insns.iter().enumerate() {
            if insn.func != prev {
                let ci = Clock { t: t + i as u64, ti: c.ti + i as u64 };
                self.change(s, tid, *insn, ci)?;
                prev = insn.func;
            }
        }
        let th = self.threads.get_mut(&(s, tid)).expect("thread exists");
        th.instr += seg.insns.len() as u64;
        th.pending = end;
        Ok(())
    }

    /// Closes every frame of one thread.
    fn close_thread(&mut self, s: usize, tid: u64, t: u64) -> Result<()> {
        if let Some(ti) = self.threads.get(&(s, tid)).map(|th| th.instr) {
            self.pop_to(s, tid, 0, Clock { t, ti })?;
            self.threads.remove(&(s, tid));
        }
        Ok(())
    }
}

/// Walks the selected streams and reports every frame to `sink`.
pub fn walk<S: CallSink>(trace: &Trace, sel: &[usize], sink: &mut S) -> Result<()> {
    let mut tr = Tracker { trace, sink, threads: FxHashMap::default(), now: vec![0; trace.streams.len()] };
    let mut err = None;
    trace.visit_as("following the calls", sel, |pos, item| {
        let s = pos.stream;
        let r = match item {
            Item::Exec { seg, .. } => {
                tr.now[s] = pos.instr + seg.insns.len() as u64;
                tr.exec(s, pos.tid, pos.instr, seg)
            }
            Item::Event(Event::Signal { tid, .. }) => {
                if let Some(th) = tr.threads.get_mut(&(s, *tid)) {
                    th.pending = Pending::Signal;
                }
                Ok(())
            }
            Item::Event(Event::ThreadExit { tid }) => tr.close_thread(s, *tid, pos.instr),
            _ => Ok(()),
        };
        match r {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                err = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = err {
        return Err(e);
    }
    let mut open: Vec<(usize, u64)> = tr.threads.keys().copied().collect();
    open.sort();
    for (s, tid) in open {
        let t = tr.now[s];
        tr.close_thread(s, tid, t)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Output

/// uftrace-like text.
struct Printer<'a, W: Write> {
    w: &'a mut W,
    trace: &'a Trace,
    max_depth: usize,
    /// (stream, tid) of the last line.
    last: Option<(u32, u64)>,
}

impl<W: Write> Printer<'_, W> {
    fn thread_line(&mut self, f: &Frame) -> Result<()> {
        if self.last != Some((f.stream, f.tid)) {
            let exe = self
                .trace
                .streams
                .iter()
                .find(|s| s.id == f.stream)
                .map(|s| s.program_name().to_string())
                .unwrap_or_default();
            writeln!(self.w, "# stream {} pid {} tid {} ({exe})", f.stream, f.pid, f.tid)?;
            self.last = Some((f.stream, f.tid));
        }
        Ok(())
    }
}

impl<W: Write> CallSink for Printer<'_, W> {
    fn enter(&mut self, f: &Frame) -> Result<()> {
        if f.depth >= self.max_depth {
            return Ok(());
        }
        self.thread_line(f)?;
        writeln!(self.w, "[{:>9}] | {:indent$}{}() {{", f.enter, "", f.name, indent = 2 * f.depth)?;
        Ok(())
    }
    fn leave(&mut self, f: &Frame, leaf: bool) -> Result<()> {
        if f.depth >= self.max_depth {
            return Ok(());
        }
        self.thread_line(f)?;
        if leaf {
            writeln!(
                self.w,
                "[{:>9}] | {:indent$}{}(); /* {} instr */",
                f.enter,
                "",
                f.name,
                f.instructions,
                indent = 2 * f.depth
            )?;
        } else {
            writeln!(
                self.w,
                "[{:>9}] | {:indent$}}} /* {}: {} instr */",
                f.leave,
                "",
                f.name,
                f.instructions,
                indent = 2 * f.depth
            )?;
        }
        Ok(())
    }
}

/// Writes frames as Chrome trace "X" events (via a temporary file).
pub fn write_chrome(trace: &Trace, frames: &[Frame], out: &std::path::Path) -> Result<()> {
    // An exec'd image keeps its pid: its times continue after the old image's.
    let mut offset: FxHashMap<u32, u64> = FxHashMap::default();
    let mut end_of_pid: FxHashMap<u64, u64> = FxHashMap::default();
    for st in &trace.streams {
        let last = frames.iter().filter(|f| f.stream == st.id).map(|f| f.leave).max().unwrap_or(0);
        let base = *end_of_pid.get(&st.hello.pid).unwrap_or(&0);
        offset.insert(st.id, base);
        end_of_pid.insert(st.hello.pid, base + last);
    }
    bunkai_common::files::write_atomic_with(out, |w| {
        write!(w, "{{\"traceEvents\":[")?;
        let mut first = true;
        let mut sep = |w: &mut dyn Write| -> std::io::Result<()> {
            if !std::mem::replace(&mut first, false) {
                w.write_all(b",\n")?;
            }
            Ok(())
        };
        // One name per pid: its images in order ("sh, echo" after an exec).
        let mut names: std::collections::BTreeMap<u64, Vec<&str>> = Default::default();
        for st in &trace.streams {
            if frames.iter().any(|f| f.stream == st.id) {
                let v = names.entry(st.hello.pid).or_default();
                if !v.contains(&st.program_name()) {
                    v.push(st.program_name());
                }
            }
        }
        for (pid, v) in &names {
            sep(w)?;
            let name = format!("{} (pid {pid})", v.join(", "));
            serde_json::to_writer(
                &mut *w,
                &serde_json::json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}),
            )?;
        }
        for f in frames {
            sep(w)?;
            let ts = f.enter + offset.get(&f.stream).copied().unwrap_or(0);
            serde_json::to_writer(
                &mut *w,
                &serde_json::json!({"name": f.name, "cat": "function", "ph": "X", "pid": f.pid, "tid": f.tid,
                    "ts": ts, "dur": f.leave.saturating_sub(f.enter),
                    "args": {"file": f.file, "line": f.line, "instructions": f.instructions, "depth": f.depth, "stream": f.stream}}),
            )?;
        }
        write!(
            w,
            "],\n\"displayTimeUnit\":\"ns\",\"otherData\":{{\"time_unit\":\"1 us = 1 instruction executed by the process (instruction index, not wall time)\",\"source\":{}}}}}\n",
            serde_json::to_string(&trace.file.path.display().to_string())?
        )?;
        Ok(())
    })
}
