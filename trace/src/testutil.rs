//! Synthetic traces for tests: builds HELLO, DEFS, EVENTS and BYE payloads
//! the way the Valgrind tool encodes them (trace/include/bunkai_trace.h)
//! and writes a trace file with `format::Writer`, so the analysis tools can
//! be checked against traces whose every count is known.
//!
//! ```text
//! let mut d = Defs::new();
//! d.object(1, "/bin/prog", 0x400000, 0x401000, 0);
//! d.func(1, "main", "prog.c", 3, 0x401000);
//! d.seg(1, &[(0x401000, 4, 1, 1), (0x401004, 3, 1, 1)], &[(2, ACC_LOAD, 8)], END_RET);
//! let mut e = Events::new();
//! e.exec(1, &[0x7ffd0000]);
//! let mut b = Builder::new();
//! b.hello(1, 100, 1, "/bin/prog", &["prog"], true, F_MEM).defs(1, &d).events(1, &e).bye(1, 2, 1, 0, 0);
//! b.write(&path)?;
//! ```

use crate::decode::*;
use crate::format::{self, put_s, put_v, put_z};
use std::path::Path;

/// DEFS payload.
#[derive(Default, Clone)]
pub struct Defs {
    pub buf: Vec<u8>,
    /// What the next packed segment is encoded against (`segp`).
    pk: (u64, u64, u64, u64),
    /// `run` writes packed segments (DEF_SEGP), as the QEMU plugin does.
    pub packed: bool,
}

impl Defs {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn object(&mut self, id: u64, name: &str, start: u64, end: u64, offset: u64) -> &mut Self {
        put_v(&mut self.buf, DEF_OBJECT);
        put_v(&mut self.buf, id);
        put_s(&mut self.buf, name);
        put_v(&mut self.buf, start);
        put_v(&mut self.buf, end);
        put_v(&mut self.buf, offset);
        self
    }
    pub fn func(&mut self, id: u64, name: &str, file: &str, line: u64, entry: u64) -> &mut Self {
        put_v(&mut self.buf, DEF_FUNC);
        put_v(&mut self.buf, id);
        put_s(&mut self.buf, name);
        put_s(&mut self.buf, file);
        put_v(&mut self.buf, line);
        put_v(&mut self.buf, entry);
        self
    }
    /// `insns`: (address, length, object id, func id); `accs`: (instruction
    /// number from 1, or 0 for the instruction in flight; ACC_* kind; size).
    pub fn seg(&mut self, id: u64, insns: &[(u64, u64, u64, u64)], accs: &[(u64, u8, u64)], end: u8) -> &mut Self {
        put_v(&mut self.buf, DEF_SEG);
        put_v(&mut self.buf, id);
        put_v(&mut self.buf, insns.len() as u64);
        let mut prev = 0u64;
        for (i, &(addr, len, obj, func)) in insns.iter().enumerate() {
            put_v(&mut self.buf, if i == 0 { addr } else { addr.wrapping_sub(prev) });
            prev = addr;
            put_v(&mut self.buf, len);
            put_v(&mut self.buf, obj);
            put_v(&mut self.buf, func);
        }
        put_v(&mut self.buf, accs.len() as u64);
        for &(i, kind, size) in accs {
            put_v(&mut self.buf, i);
            put_v(&mut self.buf, kind as u64);
            put_v(&mut self.buf, size);
        }
        put_v(&mut self.buf, end as u64);
        self
    }
    /// The same segment as `seg`, packed (DEF_SEGP), the way the QEMU
    /// plugin encodes it: against the message's previous packed segment.
    pub fn segp(&mut self, id: u64, insns: &[(u64, u64, u64, u64)], accs: &[(u64, u8, u64)], end: u8) -> &mut Self {
        let (pid, pfirst, mut pobj, mut pfunc) = self.pk;
        put_v(&mut self.buf, DEF_SEGP);
        put_z(&mut self.buf, id.wrapping_sub(pid.wrapping_add(1)) as i64);
        put_v(&mut self.buf, insns.len() as u64);
        let first = insns.first().map_or(pfirst, |i| i.0);
        put_z(&mut self.buf, first.wrapping_sub(pfirst) as i64);
        let mut next = None;
        for &(addr, len, obj, func) in insns {
            let jump = next.is_some_and(|n| n != addr);
            put_v(&mut self.buf, len << 3 | (jump as u64) << 2 | ((obj != pobj) as u64) << 1 | (func != pfunc) as u64);
            if jump {
                put_z(&mut self.buf, addr.wrapping_sub(next.unwrap()) as i64);
            }
            if obj != pobj {
                put_v(&mut self.buf, obj);
            }
            if func != pfunc {
                put_v(&mut self.buf, func);
            }
            (pobj, pfunc, next) = (obj, func, Some(addr.wrapping_add(len)));
        }
        put_v(&mut self.buf, accs.len() as u64);
        let mut prev = 0;
        for &(i, kind, size) in accs {
            let code = if size.is_power_of_two() && size <= 64 { size.trailing_zeros() as u64 } else { SEGP_SIZE_FOLLOWS };
            put_v(&mut self.buf, (i - prev) << 5 | (kind as u64) << 3 | code);
            if code == SEGP_SIZE_FOLLOWS {
                put_v(&mut self.buf, size);
            }
            prev = i;
        }
        put_v(&mut self.buf, end as u64);
        self.pk = (id, first, pobj, pfunc);
        self
    }
    #[allow(clippy::too_many_arguments)]
    /// A straight run of `n` instructions of `len` bytes from `start`.
    pub fn run(
        &mut self,
        id: u64,
        start: u64,
        n: u64,
        len: u64,
        obj: u64,
        func: u64,
        accs: &[(u64, u8, u64)],
        end: u8,
    ) -> &mut Self {
        let insns: Vec<_> = (0..n).map(|i| (start + i * len, len, obj, func)).collect();
        if self.packed {
            self.segp(id, &insns, accs, end)
        } else {
            self.seg(id, &insns, accs, end)
        }
    }
}

/// EVENTS payload; like the tool, it delta-codes segment ids and access
/// addresses from 0 at the start of each message.
#[derive(Default, Clone)]
pub struct Events {
    pub buf: Vec<u8>,
    prev_seg: u64,
    prev_addr: u64,
}

impl Events {
    pub fn new() -> Self {
        Self::default()
    }
    /// One execution of segment `id` with these access addresses.
    pub fn exec(&mut self, id: u64, addrs: &[u64]) -> &mut Self {
        let d = id.wrapping_sub(self.prev_seg) as i64;
        self.prev_seg = id;
        put_v(&mut self.buf, format::zigzag(d) << 1);
        for &a in addrs {
            put_z(&mut self.buf, a.wrapping_sub(self.prev_addr) as i64);
            self.prev_addr = a;
        }
        self
    }
    /// An event with its fields already encoded.
    pub fn event(&mut self, tag: u64, fields: &[u8]) -> &mut Self {
        put_v(&mut self.buf, (tag << 1) | 1);
        self.buf.extend_from_slice(fields);
        self
    }
    fn event_v(&mut self, tag: u64, vs: &[u64]) -> &mut Self {
        put_v(&mut self.buf, (tag << 1) | 1);
        for &v in vs {
            put_v(&mut self.buf, v);
        }
        self
    }
    pub fn syscall(
        &mut self,
        tid: u64,
        sysno: u64,
        args: &[u64],
        result: i64,
        start_ns: u64,
        duration_ns: u64,
    ) -> &mut Self {
        let mut f = Vec::new();
        put_v(&mut f, tid);
        put_v(&mut f, sysno);
        put_v(&mut f, args.len() as u64);
        for &a in args {
            put_v(&mut f, a);
        }
        put_z(&mut f, result);
        put_v(&mut f, start_ns);
        put_v(&mut f, duration_ns);
        self.event(EV_SYSCALL, &f)
    }
    pub fn signal(&mut self, tid: u64, signo: u64) -> &mut Self {
        self.event_v(EV_SIGNAL, &[tid, signo])
    }
    pub fn fatal(&mut self, tid: u64, signo: u64, addr: u64) -> &mut Self {
        self.event_v(EV_FATAL, &[tid, signo, addr])
    }
    pub fn thread(&mut self, tid: u64) -> &mut Self {
        self.event_v(EV_THREAD, &[tid])
    }
    pub fn mmap(&mut self, addr: u64, len: u64, prot: u64, object: u64) -> &mut Self {
        self.event_v(EV_MMAP, &[addr, len, prot, object])
    }
    pub fn exec_event(&mut self, path: &str) -> &mut Self {
        let mut f = Vec::new();
        put_s(&mut f, path);
        self.event(EV_EXEC, &f)
    }
    pub fn fork(&mut self, child: u64) -> &mut Self {
        self.event_v(EV_FORK, &[child])
    }
    pub fn window(&mut self, open: bool, reason: u64, instructions: u64) -> &mut Self {
        self.event_v(EV_WINDOW, &[open as u64, reason, instructions])
    }
    pub fn thread_exit(&mut self, tid: u64) -> &mut Self {
        self.event_v(EV_THREAD_EXIT, &[tid])
    }
    pub fn ctxsw(&mut self, voluntary: u64, involuntary: u64) -> &mut Self {
        self.event_v(EV_CTXSW, &[voluntary, involuntary])
    }
}

/// A whole trace: chunks in the order they are added.
#[derive(Default, Clone)]
pub struct Builder {
    pub chunks: Vec<(u8, u32, Vec<u8>)>,
}

impl Builder {
    pub fn new() -> Self {
        Self::default()
    }
    #[allow(clippy::too_many_arguments)]
    pub fn hello(
        &mut self,
        stream: u32,
        pid: u64,
        ppid: u64,
        exe: &str,
        argv: &[&str],
        window_open: bool,
        flags: u64,
    ) -> &mut Self {
        let mut p = Vec::new();
        put_v(&mut p, pid);
        put_v(&mut p, ppid);
        put_v(&mut p, 1);
        put_s(&mut p, exe);
        put_v(&mut p, argv.len() as u64);
        for a in argv {
            put_s(&mut p, a);
        }
        put_v(&mut p, window_open as u64);
        put_v(&mut p, flags);
        self.raw(format::CHUNK_HELLO, stream, p)
    }
    pub fn defs(&mut self, stream: u32, d: &Defs) -> &mut Self {
        self.raw(format::CHUNK_DEFS, stream, d.buf.clone())
    }
    pub fn events(&mut self, stream: u32, e: &Events) -> &mut Self {
        self.raw(format::CHUNK_EVENTS, stream, e.buf.clone())
    }
    pub fn bye(&mut self, stream: u32, instructions: u64, refs: u64, dropped: u64, status: u64) -> &mut Self {
        let mut p = Vec::new();
        for v in [instructions, refs, dropped, status] {
            put_v(&mut p, v);
        }
        self.raw(format::CHUNK_BYE, stream, p)
    }
    /// A version 2 BYE: with the fatal signal and the dropped instructions.
    #[allow(clippy::too_many_arguments)]
    pub fn bye2(
        &mut self,
        stream: u32,
        instructions: u64,
        refs: u64,
        dropped: u64,
        status: u64,
        signal: u64,
        dropped_instructions: u64,
    ) -> &mut Self {
        let mut p = Vec::new();
        for v in [instructions, refs, dropped, status, signal, dropped_instructions] {
            put_v(&mut p, v);
        }
        self.raw(format::CHUNK_BYE, stream, p)
    }
    /// The recorder's CUT.
    pub fn cut(&mut self, stream: u32, reason: u64, lost: u64, signal: u64) -> &mut Self {
        let mut p = Vec::new();
        for v in [reason, lost, signal] {
            put_v(&mut p, v);
        }
        self.raw(format::CHUNK_CUT, stream, p)
    }
    pub fn raw(&mut self, kind: u8, stream: u32, payload: Vec<u8>) -> &mut Self {
        self.chunks.push((kind, stream, payload));
        self
    }
    /// Writes the trace file (zstd level 1).
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let mut w = format::Writer::create(path, &serde_json::json!({"command": ["synthetic"], "tool_version": 1}), 1)?;
        for (kind, stream, p) in &self.chunks {
            w.chunk(*kind, *stream, p)?;
        }
        w.finish()?;
        Ok(())
    }
}
