//! Reading the record buffers that STORE_DATA fills (bunkai_flow.h §3):
//! one file per process, BKF_BUF_DIR/bunkai-flow.<pid>.buf. A buffer is
//! untrusted input (a process may have died mid-write, a file may be cut
//! or damaged), so every field is checked and a damaged one is named with
//! its byte offset.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub const BUF_MAGIC: u32 = 0x4655_4246;
/// BKF_BUF_VERSION of bunkai_flow.h (the buffer's own; the join-point table
/// has BKF_VERSION).
pub const VERSION: u32 = 4;
pub const HEADER: usize = 384;
/// BKF_CLOCK_NS, BKF_CLOCK_TSC: what a record's time holds.
pub const CLOCK_NS: u32 = 0;
pub const CLOCK_TSC: u32 = 1;
pub const REC_HEADER: usize = 32;
pub const REC_DONE: u16 = 1;
/// A writer's chunk: records follow its 8-byte head, up to its size or a
/// zero word.
pub const REC_CHUNK: u16 = 2;
/// BKF_JP_LIVE_AT_EXIT: a record that is no step, but what a table still
/// held at the process's exit (live keys, the table's name in 3 words, up
/// to BKF_LIVE_SAMPLE (key, flow ID) pairs).
pub const JP_LIVE_AT_EXIT: u32 = 0xffff_fffe;
pub const LIVE_SAMPLE: usize = 4;
/// The runtime cuts a record's values at this many.
pub const MAX_VALS: usize = 1024;
/// Where buffers are unless BUNKAI_FLOW_DIR says otherwise.
pub const DEFAULT_DIR: &str = "/dev/shm";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// CLOCK_REALTIME when the advice ran (converted from the TSC when the
    /// buffer's clock is the TSC).
    pub ns: u64,
    /// The sled's address ($pc$).
    pub pc: u64,
    pub tid: u32,
    /// Index in the program's join-point table, or None (~0).
    pub jp: Option<u32>,
    pub vals: Vec<u64>,
    /// Byte offset of the record in the file.
    pub offset: usize,
}

#[derive(Debug, Clone)]
pub struct Buffer {
    pub path: PathBuf,
    pub pid: u32,
    pub host_tag: u32,
    pub host: String,
    pub exe: String,
    pub capacity: u64,
    /// Bytes reserved (may run past capacity when records were dropped).
    pub head: u64,
    pub dropped: u64,
    pub started_ns: u64,
    pub records: Vec<Record>,
    /// Records reserved but never completed (a writer was interrupted or
    /// died), skipped.
    pub incomplete: u64,
    /// Bytes reserved but never written, from where the walk found a zero
    /// word outside any chunk to the head: a chunk or record whose writer
    /// was stopped before its first word (a live process: being written;
    /// a dead one: the records after it are lost).
    pub unwritten: u64,
}

fn u16_at(d: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(d[o..o + 2].try_into().unwrap())
}
fn u32_at(d: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(d[o..o + 4].try_into().unwrap())
}
fn u64_at(d: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(d[o..o + 8].try_into().unwrap())
}
fn cstr(d: &[u8]) -> String {
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    String::from_utf8_lossy(&d[..end]).into_owned()
}

/// Parses a buffer's bytes. `Err` names what is wrong and where.
pub fn parse(d: &[u8]) -> std::result::Result<Buffer, String> {
    parse_prefix(d, d.len() as u64)
}

/// Parses the first bytes of a buffer file of `file_len` bytes: its
/// header and at least the area up to the head it read first (`read`
/// reads no further: the rest is capacity not used yet).
fn parse_prefix(d: &[u8], file_len: u64) -> std::result::Result<Buffer, String> {
    if d.len() < HEADER {
        return Err(format!("{} bytes, shorter than the {HEADER}-byte header", d.len()));
    }
    let magic = u32_at(d, 0);
    if magic != BUF_MAGIC {
        return Err(if magic == 0 {
            "no header yet (magic 0: the process is creating it, or died first)".into()
        } else {
            format!("offset 0: magic {magic:#x}, not a bunkai flow buffer")
        });
    }
    let version = u32_at(d, 4);
    if version != VERSION {
        return Err(format!("offset 4: buffer version {version}, this bunkai reads {VERSION}"));
    }
    let capacity = u64_at(d, 16);
    let head = u64_at(d, 24);
    let area = file_len.max(d.len() as u64) - HEADER as u64;
    if capacity > area {
        return Err(format!(
            "offset 16: capacity {capacity} but the file holds {area} bytes after the header (cut short?)"
        ));
    }
    // (a live process's head may have moved on since the prefix was read:
    // what was reserved before is all there)
    let limit = head.min(capacity).min((d.len() - HEADER) as u64) as usize;
    let time = clock(d)?;
    let mut b = Buffer {
        path: PathBuf::new(),
        pid: u32_at(d, 8),
        host_tag: u32_at(d, 12),
        host: cstr(&d[128..192]),
        exe: cstr(&d[192..384]),
        capacity,
        head,
        dropped: u64_at(d, 32),
        started_ns: u64_at(d, 40),
        records: Vec::new(),
        incomplete: 0,
        unwritten: 0,
    };
    // The area holds reservations back to back: records, and writers'
    // chunks of records. A zero word is space not written yet: it ends the
    // walk (at the top) or the chunk.
    let mut off = 0usize;
    while off + 8 <= limit {
        let at = HEADER + off;
        let size = u32_at(d, at) as usize;
        if size == 0 {
            b.unwritten = (limit - off) as u64;
            break;
        }
        if u16_at(d, at + 6) & REC_CHUNK != 0 {
            if u16_at(d, at + 6) != REC_CHUNK || u16_at(d, at + 4) != 0 || size < 8 || size % 8 != 0 || off + size > limit {
                return Err(format!("offset {at:#x}: chunk of {size} bytes (damaged buffer)"));
            }
            let end = off + size;
            let mut o = off + 8;
            while o + 8 <= end {
                match record(d, o, end, &time, &mut b)? {
                    0 => break,
                    n => o += n,
                }
            }
            off = end;
        } else {
            off += record(d, off, limit, &time, &mut b)?;
        }
    }
    // A thread's records are in order in its chunks; across threads, by time.
    b.records.sort_by_key(|r| (r.ns, r.offset));
    Ok(b)
}

/// The record at `off` of the area, which must end by `limit`: its size
/// (0: not written yet), pushed to `b` when complete.
fn record(d: &[u8], off: usize, limit: usize, time: &Clock, b: &mut Buffer) -> std::result::Result<usize, String> {
    let at = HEADER + off;
    let size = u32_at(d, at) as usize;
    if size == 0 {
        return Ok(0);
    }
    let nvals = u16_at(d, at + 4) as usize;
    let flags = u16_at(d, at + 6);
    if size < REC_HEADER || size % 8 != 0 || off + size > limit {
        return Err(format!("offset {at:#x}: record size {size} (damaged buffer)"));
    }
    if flags & !REC_DONE != 0 {
        return Err(format!("offset {:#x}: record flags {flags:#x} (damaged buffer)", at + 6));
    }
    if flags == 0 {
        b.incomplete += 1;
        return Ok(size);
    }
    if nvals > MAX_VALS || REC_HEADER + 8 * nvals != size {
        return Err(format!("offset {:#x}: {nvals} values in a {size}-byte record (damaged buffer)", at + 4));
    }
    let jp = u32_at(d, at + 28);
    b.records.push(Record {
        ns: time.ns(u64_at(d, at + 8)),
        pc: u64_at(d, at + 16),
        tid: u32_at(d, at + 24),
        jp: (jp != u32::MAX).then_some(jp),
        vals: (0..nvals).map(|k| u64_at(d, at + REC_HEADER + 8 * k)).collect(),
        offset: at,
    });
    Ok(size)
}

/// How a record's time becomes CLOCK_REALTIME ns (bunkai_flow.h §3).
enum Clock {
    Ns,
    /// ns0 + (t - tsc0) * dmono / dtsc: the wall clock at creation plus the
    /// time since, at CLOCK_MONOTONIC's rate between the pair at creation
    /// and the latest one
    Tsc { tsc0: u64, ns0: u64, dtsc: i128, dmono: i128 },
}

impl Clock {
    fn ns(&self, t: u64) -> u64 {
        match *self {
            Clock::Ns => t,
            Clock::Tsc { tsc0, ns0, dtsc, dmono } => {
                // a damaged record's time saturates, it does not overflow
                let d = (t.wrapping_sub(tsc0) as i64 as i128).saturating_mul(dmono) / dtsc;
                (ns0 as i128).saturating_add(d).clamp(0, u64::MAX as i128) as u64
            }
        }
    }
}

/// The header's clock: CLOCK_REALTIME, or the TSC with its pairs, which
/// must give a rate a TSC can have (10 MHz to 100 GHz).
fn clock(d: &[u8]) -> std::result::Result<Clock, String> {
    match u32_at(d, 56) {
        CLOCK_NS => Ok(Clock::Ns),
        CLOCK_TSC => {
            let (tsc0, ns0, mono0) = (u64_at(d, 64), u64_at(d, 72), u64_at(d, 80));
            // even: cal[seq/2 % 2]; odd: a writer fills the other one
            let slot = 96 + 16 * ((u32_at(d, 60) as usize >> 1) & 1);
            let (tsc1, mono1) = (u64_at(d, slot), u64_at(d, slot + 8));
            let dtsc = tsc1 as i128 - tsc0 as i128;
            let dmono = mono1 as i128 - mono0 as i128;
            if dtsc <= 0 || dmono <= 0 || dmono * 100 < dtsc || dmono > dtsc * 100 {
                return Err(format!(
                    "offset {slot}: time stamp pairs ({tsc0}, {mono0}) and ({tsc1}, {mono1}) give no TSC rate (damaged buffer)"
                ));
            }
            Ok(Clock::Tsc { tsc0, ns0, dtsc, dmono })
        }
        c => Err(format!("offset 56: clock {c}, neither CLOCK_REALTIME (0) nor the TSC (1) (damaged buffer)")),
    }
}

/// Reads a buffer file: its header, then the area up to the head (not the
/// capacity past it, which may be gigabytes of zeros).
pub fn read(path: &Path) -> Result<Buffer> {
    read_counted(path, &indicatif::ProgressBar::hidden())
}

/// `read`, counting the bytes it reads on `bar` (a process's buffer may
/// hold gigabytes: `report` and `dump` show how far they are).
pub fn read_counted(path: &Path, bar: &indicatif::ProgressBar) -> Result<Buffer> {
    use std::io::Read;
    let cannot = || format!("cannot read {}", path.display());
    let f = std::fs::File::open(path).with_context(cannot)?;
    let file_len = f.metadata().with_context(cannot)?.len();
    let mut d = Vec::new();
    let mut f = f.take(HEADER as u64);
    f.read_to_end(&mut d).with_context(cannot)?;
    if d.len() == HEADER && u32_at(&d, 0) == BUF_MAGIC {
        let used = u64_at(&d, 24).min(u64_at(&d, 16)).min(file_len - HEADER as u64);
        f.set_limit(used);
        d.reserve_exact(used as usize);
        bar.wrap_read(f).read_to_end(&mut d).with_context(cannot)?;
        bar.set_message(format!("parsing {}", path.display()));
    }
    match parse_prefix(&d, file_len) {
        Ok(mut b) => {
            b.path = path.to_path_buf();
            Ok(b)
        }
        Err(e) => bail!("{}: {e}", path.display()),
    }
}

/// Reads the buffer files. With `progress` (stderr a terminal, no --json),
/// a count of the bytes read shows on stderr once the reading has taken a
/// second (BUNKAI_PROGRESS_AFTER_MS), so that small buffers read in
/// silence.
pub fn read_all(files: &[PathBuf], progress: bool) -> Result<Vec<Buffer>> {
    if !progress {
        return files.iter().map(|p| read(p)).collect();
    }
    let p = bunkai_common::progress::Progress::new("  {spinner} {msg}: {bytes} read ({bytes_per_sec})", None, true);
    files
        .iter()
        .map(|f| {
            p.phase(format!("reading {}", f.display()));
            read_counted(f, p.bar())
        })
        .collect()
}

/// The buffer directory: BUNKAI_FLOW_DIR, else /dev/shm.
pub fn dir() -> PathBuf {
    match std::env::var_os("BUNKAI_FLOW_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

/// The buffers to read: the files given, else every bunkai-flow.*.buf in
/// the buffer directory (sorted by name).
pub fn find(given: &[PathBuf], dir: &Path) -> Result<Vec<PathBuf>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bunkai-flow.") && n.ends_with(".buf"))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        bail!(
            "no bunkai-flow.*.buf in {} (run the woven program first, or give the buffer files; BUNKAI_FLOW_DIR moves them)",
            dir.display()
        );
    }
    Ok(v)
}

/// The pid in a buffer's name (bunkai-flow.<pid>.buf).
pub fn pid_of(p: &Path) -> Option<u32> {
    p.file_name()?.to_str()?.strip_prefix("bunkai-flow.")?.strip_suffix(".buf")?.parse().ok()
}

/// Whether the process that wrote buffer `p` still runs: its pid is alive,
/// not a zombie, on this host, and runs the program the header names (a pid
/// reused by another program is not it). A header that cannot be read
/// counts as the pid's.
pub fn writer_runs(p: &Path) -> bool {
    let Some(pid) = pid_of(p) else { return false };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    if stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()) == Some("Z") {
        return false;
    }
    let mut head = [0u8; HEADER];
    let read = std::fs::File::open(p).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
    if read.is_err() || u32::from_le_bytes(head[0..4].try_into().unwrap()) != BUF_MAGIC {
        return true;
    }
    let cstr = |b: &[u8]| String::from_utf8_lossy(&b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]).into_owned();
    let (host, exe) = (cstr(&head[128..192]), cstr(&head[192..384]));
    let here = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    if !host.is_empty() && !here.trim().is_empty() && host != here.trim() {
        return false;
    }
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(now) => exe.is_empty() || now.to_string_lossy() == exe,
        Err(_) => true, // another user's process: its pid is all we can see
    }
}

/// Which buffers `report` reads.
pub enum Which<'a> {
    /// These files
    Files(&'a [PathBuf]),
    /// The buffers of these processes and of their running descendants
    Pids(&'a [u32]),
    /// Every buffer in the directory
    All,
    /// The buffers of processes that still run (the default)
    Running,
}

/// The buffers `which` names, and how many buffers of ended processes the
/// default left out.
pub fn select(which: Which, dir: &Path) -> Result<(Vec<PathBuf>, usize)> {
    match which {
        Which::Files(f) if !f.is_empty() => Ok((f.to_vec(), 0)),
        Which::Files(_) | Which::All => Ok((find(&[], dir)?, 0)),
        Which::Pids(pids) => {
            let mut v = Vec::new();
            for &p in pids {
                let mut tree = vec![p];
                tree.extend(crate::weave::descendants(p));
                let mine: Vec<PathBuf> =
                    tree.iter().map(|q| dir.join(format!("bunkai-flow.{q}.buf"))).filter(|f| f.exists()).collect();
                if mine.is_empty() {
                    bail!(
                        "no buffer of process {p}{} in {} (was advice woven into it and run? BUNKAI_FLOW_DIR must be the process's; --all reads every buffer there)",
                        if tree.len() > 1 { " or its descendants" } else { "" },
                        dir.display()
                    );
                }
                for f in mine {
                    if !v.contains(&f) {
                        v.push(f);
                    }
                }
            }
            Ok((v, 0))
        }
        Which::Running => {
            let every = find(&[], dir)?;
            let (run, ended): (Vec<PathBuf>, Vec<PathBuf>) = every.into_iter().partition(|f| writer_runs(f));
            if run.is_empty() {
                bail!(
                    "no running process has a buffer in {}, which holds {} of ended processes (read them with --all, or name them: --pid PID or the files; bunkai flow clean removes them)",
                    dir.display(),
                    ended.len()
                );
            }
            Ok((run, ended.len()))
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A buffer as the runtime writes it.
    pub fn make(pid: u32, host: &str, exe: &str, cap: usize, recs: &[(u64, u64, u32, u32, Vec<u64>)]) -> Vec<u8> {
        let mut d = vec![0u8; HEADER + cap];
        d[0..4].copy_from_slice(&BUF_MAGIC.to_le_bytes());
        d[4..8].copy_from_slice(&VERSION.to_le_bytes());
        d[8..12].copy_from_slice(&pid.to_le_bytes());
        d[16..24].copy_from_slice(&(cap as u64).to_le_bytes());
        d[40..48].copy_from_slice(&1_000u64.to_le_bytes());
        d[128..128 + host.len()].copy_from_slice(host.as_bytes());
        d[192..192 + exe.len()].copy_from_slice(exe.as_bytes());
        let mut off = 0usize;
        for r in recs {
            off += put_record(&mut d, HEADER + off, r);
        }
        d[24..32].copy_from_slice(&(off as u64).to_le_bytes());
        d
    }

    /// Puts one record at byte `at` of the file; its size.
    fn put_record(d: &mut [u8], at: usize, (ns, pc, tid, jp, vals): &(u64, u64, u32, u32, Vec<u64>)) -> usize {
        let size = 32 + 8 * vals.len();
        d[at..at + 4].copy_from_slice(&(size as u32).to_le_bytes());
        d[at + 4..at + 6].copy_from_slice(&(vals.len() as u16).to_le_bytes());
        d[at + 6..at + 8].copy_from_slice(&REC_DONE.to_le_bytes());
        d[at + 8..at + 16].copy_from_slice(&ns.to_le_bytes());
        d[at + 16..at + 24].copy_from_slice(&pc.to_le_bytes());
        d[at + 24..at + 28].copy_from_slice(&tid.to_le_bytes());
        d[at + 28..at + 32].copy_from_slice(&jp.to_le_bytes());
        for (k, v) in vals.iter().enumerate() {
            d[at + 32 + 8 * k..at + 40 + 8 * k].copy_from_slice(&v.to_le_bytes());
        }
        size
    }

    /// A buffer whose writers kept chunks of `chunk` bytes: each element of
    /// `chunks` is one chunk's records (a chunk's unused tail stays zero).
    pub fn make_chunked(chunk: usize, chunks: &[Vec<(u64, u64, u32, u32, Vec<u64>)>]) -> Vec<u8> {
        let mut d = make(1, "h", "e", chunk * chunks.len(), &[]);
        for (i, recs) in chunks.iter().enumerate() {
            let at = HEADER + i * chunk;
            d[at..at + 4].copy_from_slice(&(chunk as u32).to_le_bytes());
            d[at + 6..at + 8].copy_from_slice(&REC_CHUNK.to_le_bytes());
            let mut o = at + 8;
            for r in recs {
                o += put_record(&mut d, o, r);
            }
            assert!(o <= at + chunk);
        }
        d[24..32].copy_from_slice(&((chunk * chunks.len()) as u64).to_le_bytes());
        d
    }

    #[test]
    fn records_round_trip() {
        let d = make(42, "linuxU", "/bin/x", 4096, &[(5_000, 0x401000, 7, 3, vec![1, 2, 3]), (6_000, 0x401100, 8, u32::MAX, vec![])]);
        let b = parse(&d).unwrap();
        assert_eq!((b.pid, b.host.as_str(), b.exe.as_str(), b.dropped), (42, "linuxU", "/bin/x", 0));
        assert_eq!(b.records.len(), 2);
        assert_eq!(b.records[0], Record { ns: 5_000, pc: 0x401000, tid: 7, jp: Some(3), vals: vec![1, 2, 3], offset: HEADER });
        assert_eq!(b.records[1].jp, None);
        assert_eq!((b.incomplete, b.unwritten), (0, 0));
    }

    #[test]
    fn incomplete_records_are_skipped_and_damage_is_named() {
        let mut d = make(1, "h", "e", 4096, &[(1, 2, 3, 4, vec![9]), (5, 6, 7, 8, vec![10])]);
        d[HEADER + 6] = 0; // the first record was never finished
        let b = parse(&d).unwrap();
        assert_eq!((b.records.len(), b.incomplete), (1, 1));
        assert_eq!(b.records[0].vals, vec![10]);

        let mut bad = make(1, "h", "e", 4096, &[(1, 2, 3, 4, vec![9])]);
        bad[HEADER] = 12; // size not a multiple of 8
        assert!(parse(&bad).unwrap_err().contains(&format!("offset {HEADER:#x}: record size 12")));
        let mut bad = make(1, "h", "e", 4096, &[(1, 2, 3, 4, vec![9])]);
        bad[HEADER + 4] = 5; // 5 values in a 40-byte record
        assert!(parse(&bad).unwrap_err().contains("5 values in a 40-byte record"));
        let good = make(1, "h", "e", 4096, &[]);
        assert!(parse(&good[..HEADER + 100]).unwrap_err().contains("cut short"));
        assert!(parse(&good[..100]).unwrap_err().contains("shorter than"));
        let mut other = good.clone();
        other[0] = 1;
        assert!(parse(&other).unwrap_err().contains("not a bunkai flow buffer"));
        let mut v2 = good.clone();
        v2[4] = 2;
        assert!(parse(&v2).unwrap_err().contains("buffer version 2, this bunkai reads 4"));
        let mut clock = good.clone();
        clock[56] = 7;
        assert!(parse(&clock).unwrap_err().contains("offset 56: clock 7"));
        let mut tsc = good;
        tsc[56] = CLOCK_TSC as u8; // and no pairs
        assert!(parse(&tsc).unwrap_err().contains("offset 96: time stamp pairs"));
    }

    /// With the TSC, times are the wall clock at creation plus the time
    /// since at the monotonic clock's rate, from the pair at creation
    /// and the latest pair (cal_seq picks it; odd: the other slot is being
    /// written).
    #[test]
    fn tsc_times_are_converted_by_the_latest_pair() {
        let mut d = make(1, "h", "e", 4096, &[(3_000_000, 2, 3, 4, vec![]), (1_000_000, 6, 7, 8, vec![])]);
        let put = |d: &mut Vec<u8>, o: usize, v: u64| d[o..o + 8].copy_from_slice(&v.to_le_bytes());
        d[56..60].copy_from_slice(&CLOCK_TSC.to_le_bytes());
        put(&mut d, 64, 1_000_000); // tsc0
        put(&mut d, 72, 5_000_000_000); // ns0: the wall clock
        put(&mut d, 80, 700_000); // mono0: the monotonic clock
        put(&mut d, 96, 2_000_000); // cal[0]: an older pair (1 cycle a ns)
        put(&mut d, 104, 1_700_000);
        put(&mut d, 112, 3_000_000); // cal[1]: 2 cycles a ns
        put(&mut d, 120, 1_700_000);
        for (seq, want) in [(2u32, 5_001_000_000u64), (3, 5_001_000_000), (4, 5_002_000_000), (5, 5_002_000_000)] {
            d[60..64].copy_from_slice(&seq.to_le_bytes());
            let b = parse(&d).unwrap();
            let ns = |pc| b.records.iter().find(|r| r.pc == pc).unwrap().ns;
            assert_eq!((ns(2), ns(6)), (want, 5_000_000_000), "seq {seq}");
        }
        put(&mut d, 120, 600_000); // the monotonic clock went back: damaged
        d[60..64].copy_from_slice(&2u32.to_le_bytes());
        assert!(parse(&d).unwrap_err().contains("offset 112: time stamp pairs"));
    }

    #[test]
    fn a_full_buffer_reads_up_to_capacity() {
        let mut d = make(1, "h", "e", 64, &[(1, 2, 3, 4, vec![9])]);
        d[24..32].copy_from_slice(&1000u64.to_le_bytes()); // head ran past capacity
        d[32..40].copy_from_slice(&7u64.to_le_bytes());
        let b = parse(&d).unwrap();
        assert_eq!((b.records.len(), b.dropped), (1, 7));
    }

    /// Two threads' chunks and a record of its own between them: every
    /// complete record once, in time order; a chunk's zero tail ends it;
    /// damaged chunks are named.
    #[test]
    fn chunks_are_read_and_records_come_out_by_time() {
        let a = vec![(10, 1, 7, 0, vec![1]), (30, 2, 7, 0, vec![]), (50, 3, 7, 0, vec![2, 3])];
        let b = vec![(20, 4, 8, 0, vec![]), (40, 5, 8, 0, vec![4])];
        let mut d = make_chunked(256, &[a, b.clone(), b]);
        // the third chunk is a record of its own instead (a signal handler's)
        let third = HEADER + 512;
        d[third..third + 256].fill(0);
        put_record(&mut d, third, &(25, 6, 7, 0, vec![9]));
        // and after it, up to the head, bytes reserved whose writer never
        // wrote their first word (zeros): the walk ends there and says so
        let buf = parse(&d).unwrap();
        let order: Vec<u64> = buf.records.iter().map(|r| r.pc).collect();
        assert_eq!(order, vec![1, 4, 6, 2, 5, 3]);
        assert_eq!((buf.incomplete, buf.unwritten), (0, 256 - 40));
        assert_eq!(buf.records[2].offset, third);

        let mut inner = d.clone();
        inner[HEADER + 8 + 40 + 6] = 0; // the second record of the first chunk, unfinished
        let r = parse(&inner).unwrap();
        assert_eq!((r.records.len(), r.incomplete), (5, 1));

        let mut big = d.clone();
        big[HEADER + 1] = 0x10; // a chunk of 4096 bytes in a 768-byte area
        assert!(parse(&big).unwrap_err().contains(&format!("offset {HEADER:#x}: chunk of 4096 bytes")));
        let mut nested = d.clone();
        nested[HEADER + 8 + 6] = (REC_CHUNK | REC_DONE) as u8; // a chunk inside a chunk
        assert!(parse(&nested).unwrap_err().contains("record flags 0x3"));
        let mut over = d;
        over[HEADER + 8] = 0; // a record running out of its chunk
        over[HEADER + 9] = 1;
        assert!(parse(&over).unwrap_err().contains("record size 256"));
    }

    /// `read` reads the header and the area up to the head, not the unused
    /// capacity, and still finds a file cut short; a prefix read while the
    /// head moved on gives what it holds.
    #[test]
    fn files_are_read_up_to_the_head() {
        let cap = 1 << 20;
        let d = make(9, "h", "e", cap, &[(1, 2, 3, 4, vec![9]), (5, 6, 7, 8, vec![10, 11])]);
        let dir = std::env::temp_dir().join(format!("bunkai-flow-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bunkai-flow.9.buf");
        std::fs::write(&path, &d).unwrap();
        let b = read(&path).unwrap();
        assert_eq!((b.records.len(), b.capacity, b.path.clone()), (2, cap as u64, path.clone()));
        assert_eq!(b.records, parse(&d).unwrap().records);
        std::fs::write(&path, &d[..HEADER + cap - 8]).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("cut short"), "{e}");
        std::fs::write(&path, &d[..100]).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("shorter than the 384-byte header"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        // the first record only, as if the second came after the prefix was read
        let b = parse_prefix(&d[..HEADER + 40], d.len() as u64).unwrap();
        assert_eq!((b.records.len(), b.records[0].vals.clone()), (1, vec![9]));
    }

    /// Mutated buffers never panic the reader.
    #[test]
    fn fuzzed_buffers_fail_cleanly() {
        let plain = make(9, "host", "/exe", 2048, &[(1, 2, 3, 4, vec![5, 6]), (7, 8, 9, 10, vec![]), (11, 12, 13, 14, vec![15])]);
        let chunked = make_chunked(96, &[vec![(1, 2, 3, 4, vec![5, 6])], vec![(7, 8, 9, 10, vec![])]]);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..40_000 {
            let mut d = if i % 2 == 0 { plain.clone() } else { chunked.clone() };
            for _ in 0..(seed % 4 + 1) {
                crate::xorshift(&mut seed);
                let at = (seed % (HEADER as u64 + 200)) as usize;
                if seed % 7 == 0 {
                    d.truncate(at);
                } else if at < d.len() {
                    d[at] = (seed >> 16) as u8;
                }
            }
            let _ = parse(&d);
        }
    }

    /// Which buffers report reads by default: a running writer's (this
    /// process, this program, this host), not an ended one's, nor one whose
    /// pid now runs another program or is on another host; --all reads all.
    #[test]
    fn the_default_reads_running_writers_buffers() {
        let d = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let exe = std::fs::read_link("/proc/self/exe").unwrap().to_string_lossy().into_owned();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let gone = c.id();
        c.wait().unwrap();
        let write = |name: &str, pid: u32, host: &str, exe: &str| {
            let f = d.path().join(name);
            std::fs::write(&f, make(pid, host, exe, 4096, &[])).unwrap();
            f
        };
        let mine = write(&format!("bunkai-flow.{me}.buf"), me, &host, &exe);
        let ended = write(&format!("bunkai-flow.{gone}.buf"), gone, &host, &exe);
        assert!(writer_runs(&mine) && !writer_runs(&ended));
        let (v, left) = select(Which::Running, d.path()).unwrap();
        assert_eq!((v, left), (vec![mine.clone()], 1));
        // the same pid running another program, or on another host: ended
        let other = write(&format!("bunkai-flow.{me}.buf"), me, &host, "/usr/sbin/not-this");
        assert!(!writer_runs(&other));
        let e = select(Which::Running, d.path()).unwrap_err().to_string();
        assert!(e.contains("no running process has a buffer") && e.contains("2 of ended processes") && e.contains("--all"), "{e}");
        write(&format!("bunkai-flow.{me}.buf"), me, "elsewhere", &exe);
        assert!(!writer_runs(&mine));
        assert_eq!(select(Which::All, d.path()).unwrap().0.len(), 2);
        let e = select(Which::Pids(&[gone]), d.path()).unwrap();
        assert_eq!(e.0, vec![ended]);
        let e = select(Which::Pids(&[4_000_000]), d.path()).unwrap_err().to_string();
        assert!(e.contains("no buffer of process 4000000"), "{e}");
    }
}

/// What a table still held when its process exited (a BKF_JP_LIVE_AT_EXIT
/// record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAtExit {
    pub table: String,
    pub live: u64,
    /// Up to LIVE_SAMPLE (key, flow ID) pairs.
    pub sample: Vec<(u64, u64)>,
}

impl Record {
    /// A step of a flow (not a record the runtime writes about itself).
    pub fn is_step(&self) -> bool {
        self.jp != Some(JP_LIVE_AT_EXIT)
    }

    /// The table summary this record holds, if it is one (None when it is
    /// a step, or too short to be one).
    pub fn live_at_exit(&self) -> Option<LiveAtExit> {
        if self.is_step() || self.vals.len() < 4 {
            return None;
        }
        let mut name: Vec<u8> = self.vals[1..4].iter().flat_map(|w| w.to_le_bytes()).collect();
        if let Some(z) = name.iter().position(|&c| c == 0) {
            name.truncate(z);
        }
        let sample = self.vals[4..].chunks_exact(2).take(LIVE_SAMPLE).map(|p| (p[0], p[1])).collect();
        Some(LiveAtExit { table: String::from_utf8_lossy(&name).into_owned(), live: self.vals[0], sample })
    }
}
