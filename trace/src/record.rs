//! `bunkai trace record`: runs a command under the bunkai Valgrind tool
//! (trace/tool/bk_main.c) and writes the trace file.
//!
//! Every traced process image (the command, each forked child, each exec'd
//! program) connects to a Unix socket in a private directory and streams
//! its messages (HELLO, DEFS, EVENTS, BYE; see bunkai_trace.h). One thread
//! per connection compresses the messages with zstd, so compression runs on
//! another core while Valgrind records; one writer thread appends the
//! chunks to a temporary file that is renamed into place at the end.

use crate::format::{self, Writer};
use bunkai_common::fmt::commas;
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// What to record and how: `bunkai trace record`'s options (cmd/record.rs).
#[derive(Debug)]
pub struct RecordOptions {
    /// Output trace file (written to a temporary file, renamed at the end)
    pub output: PathBuf,
    /// Open the window when this syscall returns successfully (names or
    /// numbers, comma-separated; "accept" also means accept4)
    pub start_syscall: Option<String>,
    /// Close the window after this syscall (names or numbers)
    pub stop_syscall: Option<String>,
    /// Close the window at the close() of the descriptor the start syscall
    /// returned (TURU's window in §3.1: from accept to the connection's close)
    pub stop_at_close: bool,
    /// Open the window at entry to this function
    pub start_func: Option<String>,
    /// Close the window at entry to this function
    pub stop_func: Option<String>,
    /// Open the window after N instructions
    pub skip: Option<u64>,
    /// Close the window after N instructions inside it
    pub max: Option<u64>,
    /// Record only code of objects whose path contains NAME (repeatable;
    /// e.g. the program's name, or libc)
    pub objects: Vec<String>,
    /// Do not record memory references (instructions and events only)
    pub no_mem: bool,
    /// Hold the trace in a fixed in-memory buffer of this size and write it
    /// at the end, stopping when it is full (TURU's static memory area,
    /// §2.2(3)(a)); default: stream to the file as it runs (§2.2(3)(b))
    pub buffer: Option<String>,
    /// Do not follow forked and exec'd children
    pub no_children: bool,
    /// zstd level of the chunks
    pub level: i32,
    /// Print the summary as one line of JSON on stderr (stdout belongs to
    /// the traced command)
    pub json: bool,
    /// Explain what is being done (the Valgrind command, each stream)
    pub verbose: bool,
    /// The command to trace, after `--`
    pub command: Vec<String>,
}

/// x86-64 syscall numbers of the names a window may name.
pub fn syscall_numbers(spec: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Ok(n) = part.parse::<u32>() {
            out.push(n);
            continue;
        }
        // Names that stand for a family (the libc call and its newer
        // syscall), then any x86-64 syscall name.
        let family: &[u32] = match part {
            "accept" => &[43, 288],
            "open" => &[2, 257],
            "poll" => &[7, 271],
            "select" => &[23, 270],
            "fork" | "clone" => &[56, 57, 435],
            "execve" => &[59, 322],
            "epoll_wait" => &[232, 281],
            "wait" => &[61, 247],
            _ => &[],
        };
        let nums: Vec<u32> = if !family.is_empty() {
            family.to_vec()
        } else {
            match (0..512u32).find(|&n| crate::dump::syscall_name(n as u64) == Some(part)) {
                Some(n) => vec![n],
                None => bail!("unknown syscall name '{part}' (give its number instead, e.g. --start-syscall 43)"),
            }
        };
        out.extend_from_slice(&nums);
    }
    if out.is_empty() {
        bail!("empty syscall list (name one, e.g. accept)");
    }
    Ok(out)
}

fn join(v: &[u32]) -> String {
    v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")
}

/// Where the tool and the links to the stock Valgrind files live.
pub fn tool_dir() -> Result<PathBuf> {
    let d = bunkai_common::install::helper_libdir()?.join("valgrind");
    // Canonical, so that the client's environment (VALGRIND_LIB is in it)
    // is the same as under `valgrind --tool=callgrind` with the same path.
    let d = d.canonicalize().unwrap_or(d);
    if !d.join("bunkai-amd64-linux").exists() {
        bail!("the Valgrind tool is missing from {} (run `make`)", d.display());
    }
    if !d.join("vgpreload_core-amd64-linux.so").exists() {
        bail!("Valgrind's own files are not linked into {} (install valgrind: scripts/install-deps.sh, then `make`)", d.display());
    }
    Ok(d)
}

fn find_command(name: &str) -> Result<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        if p.is_file() {
            return Ok(p);
        }
        bail!("no such program: {name} (check the path)");
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("no such program on PATH: {name} (give its path)")
}

/// The Valgrind command line for these options.
fn valgrind_command(a: &RecordOptions, dir: &Path, tools: &Path, program: &Path) -> Result<Command> {
    let mut c = Command::new("valgrind");
    c.env("VALGRIND_LIB", tools);
    // --vgdb=no: no gdbserver FIFOs in /tmp (a server that drops root
    // could not remove them).
    c.arg("--tool=bunkai").arg("-q").arg("--vgdb=no");
    c.arg(format!("--trace-children={}", if a.no_children { "no" } else { "yes" }));
    c.arg(format!("--bk-dir={}", dir.display()));
    if a.no_mem {
        c.arg("--bk-mem=no");
    }
    if let Some(b) = &a.buffer {
        let n = bunkai_common::fmt::parse_size(b).map_err(|e| anyhow::anyhow!("--buffer: {e}"))?;
        if n < 4096 || n > (1 << 40) {
            bail!("--buffer {b} is out of range (give 4KiB to 1TiB)");
        }
        c.arg(format!("--bk-buffer={n}"));
    }
    if let Some(s) = &a.start_syscall {
        c.arg(format!("--bk-start-syscall={}", join(&syscall_numbers(s)?)));
    }
    if let Some(s) = &a.stop_syscall {
        c.arg(format!("--bk-stop-syscall={}", join(&syscall_numbers(s)?)));
    }
    if a.stop_at_close {
        if a.start_syscall.is_none() {
            bail!("--stop-at-close needs --start-syscall (the descriptor comes from it)");
        }
        c.arg("--bk-stop-close=yes");
    }
    for (opt, v) in [("--bk-start-func", &a.start_func), ("--bk-stop-func", &a.stop_func)] {
        if let Some(f) = v {
            if f.is_empty() || f.contains(char::is_whitespace) {
                bail!("bad function name '{f}' (give a symbol such as main)");
            }
            c.arg(format!("{opt}={f}"));
        }
    }
    if let Some(n) = a.skip {
        c.arg(format!("--bk-skip={n}"));
    }
    if let Some(n) = a.max {
        if n == 0 {
            bail!("--max 0 records nothing (give a positive count)");
        }
        c.arg(format!("--bk-max={n}"));
    }
    if !a.objects.is_empty() {
        if a.objects.iter().any(|o| o.contains(',') || o.is_empty()) {
            bail!("--object names may not be empty or contain commas (repeat --object instead)");
        }
        c.arg(format!("--bk-objects={}", a.objects.join(",")));
    }
    c.arg("--").arg(program).args(&a.command[1..]);
    Ok(c)
}

/// One message from the tool, compressed, on its way to the writer.
struct Msg {
    stream: u32,
    kind: u8,
    raw_len: usize,
    compressed: Option<Vec<u8>>,
    raw: Vec<u8>,
}

/// What the connections saw, for the summary.
#[derive(Default)]
struct Totals {
    streams: AtomicU32,
    byes: AtomicU32,
    instructions: AtomicU64,
    memrefs: AtomicU64,
    dropped: AtomicU64,
}

/// Reads one connection until EOF: HELLO first, then DEFS/EVENTS, BYE.
fn serve_conn(
    mut s: UnixStream,
    next_stream: &AtomicU32,
    tx: mpsc::SyncSender<Msg>,
    level: i32,
    totals: &Totals,
    verbose: bool,
) -> Result<()> {
    let mut stream = 0u32;
    loop {
        let mut h = [0u8; 8];
        match s.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let kind = h[0];
        let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        if !(format::CHUNK_HELLO..=format::CHUNK_BYE).contains(&kind) || h[1..4] != [0, 0, 0] || len > (1 << 30) {
            bail!("the tool sent a malformed message (kind {kind}, {len} bytes)");
        }
        let mut raw = vec![0u8; len];
        s.read_exact(&mut raw).context("a traced process closed its stream inside a message")?;
        if stream == 0 {
            if kind != format::CHUNK_HELLO {
                bail!("the tool did not start its stream with HELLO");
            }
            stream = next_stream.fetch_add(1, Ordering::SeqCst);
            totals.streams.fetch_add(1, Ordering::SeqCst);
            if verbose {
                let mut c = format::Cursor::new(&raw);
                let pid = c.v().unwrap_or(0);
                let ppid = c.v().unwrap_or(0);
                let _ = c.v();
                let exe = c.s().unwrap_or_default();
                eprintln!("bunkai trace: stream {stream}: pid {pid} (parent {ppid}) {exe}");
            }
        }
        if kind == format::CHUNK_BYE {
            let mut c = format::Cursor::new(&raw);
            totals.byes.fetch_add(1, Ordering::SeqCst);
            totals.instructions.fetch_add(c.v().unwrap_or(0), Ordering::SeqCst);
            totals.memrefs.fetch_add(c.v().unwrap_or(0), Ordering::SeqCst);
            totals.dropped.fetch_add(c.v().unwrap_or(0), Ordering::SeqCst);
        }
        let compressed = if raw.len() >= 64 { Some(zstd::bulk::compress(&raw, level)?) } else { None };
        let raw_len = raw.len();
        if tx.send(Msg { stream, kind, raw_len, compressed, raw }).is_err() {
            bail!("the trace writer stopped");
        }
    }
}

/// Runs the command under the tool, writes the trace and prints the
/// summary; the command's exit status is ours.
pub fn run(a: &RecordOptions) -> Result<ExitCode> {
    let program = find_command(&a.command[0])?;
    let tools = tool_dir()?;
    if !(1..=19).contains(&a.level) {
        bail!("--level {} is out of range (give 1 to 19)", a.level);
    }
    let dir = tempfile::Builder::new().prefix("bunkai-trace-").tempdir().context("cannot create a temporary directory")?;
    let sock = dir.path().join("sock");
    let listener = UnixListener::bind(&sock).with_context(|| format!("cannot listen on {}", sock.display()))?;
    listener.set_nonblocking(true)?;
    // Traced servers often drop privileges (Apache runs as nobody) and
    // their children must still reach the socket and leave exec state
    // files: the directory is writable but not listable (like /tmp's
    // sticky bit), its name random.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1733))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))?;

    let mut cmd = valgrind_command(a, dir.path(), &tools, &program)?;
    let meta = serde_json::json!({
        "command": a.command,
        "program": program,
        "tool_version": 1,
        "format_version": format::VERSION,
        "memory_references": !a.no_mem,
        "buffer": a.buffer,
        "window": {
            "start_syscall": a.start_syscall, "stop_syscall": a.stop_syscall,
            "stop_at_close": a.stop_at_close, "start_func": a.start_func,
            "stop_func": a.stop_func, "skip": a.skip, "max": a.max,
        },
        "objects": a.objects,
        "children": !a.no_children,
        "started_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    });
    let mut writer = Writer::create(&a.output, &meta, a.level)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    if a.verbose {
        eprintln!("bunkai trace: VALGRIND_LIB={} {:?}", tools.display(), cmd);
    }
    cmd.stdin(Stdio::inherit()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("cannot start valgrind (install it: scripts/install-deps.sh)")?;
    let child_pid = child.id() as i32;

    // SIGINT/SIGTERM to us go to the traced command, and the trace of what
    // ran until then is still written.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        let _ = ctrlc::set_handler(move || {
            flag.store(true, Ordering::SeqCst);
            unsafe { libc_kill(child_pid, 15) };
        });
    }

    let (tx, rx) = mpsc::sync_channel::<Msg>(64);
    let totals = Arc::new(Totals::default());
    let next_stream = Arc::new(AtomicU32::new(1));
    let writer_thread = std::thread::spawn(move || -> Result<Writer> {
        for m in rx {
            writer.chunk_stored(m.kind, m.stream, m.raw_len, m.compressed.as_deref(), &m.raw)?;
        }
        Ok(writer)
    });

    // Accept connections until the command has exited and every stream has
    // ended; streams of processes that outlive the command get a grace period.
    let mut conns: Vec<std::thread::JoinHandle<Result<()>>> = Vec::new();
    let mut socks: Vec<UnixStream> = Vec::new();
    let mut status = None;
    let mut exited_at: Option<Instant> = None;
    let grace = Duration::from_secs(10);
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                socks.push(s.try_clone()?);
                let (tx, ns, tot, level, verbose) = (tx.clone(), next_stream.clone(), totals.clone(), a.level, a.verbose);
                conns.push(std::thread::spawn(move || serve_conn(s, &ns, tx, level, &tot, verbose)));
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        if status.is_none() {
            if let Some(st) = child.try_wait()? {
                status = Some(st);
                exited_at = Some(Instant::now());
            }
        }
        if status.is_some() {
            let open = conns.iter().filter(|h| !h.is_finished()).count();
            if open == 0 || exited_at.map(|t| t.elapsed() > grace).unwrap_or(false) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = t0.elapsed();
    drop(tx);
    // Processes that outlived the command: their streams end here (without
    // BYE, which the reader reports as "ended abnormally").
    let finished: Vec<bool> = conns.iter().map(|h| h.is_finished()).collect();
    let stragglers = finished.iter().filter(|f| !**f).count();
    for s in &socks {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let mut errors = Vec::new();
    for (h, done) in conns.into_iter().zip(finished) {
        let r = h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a stream reader panicked")));
        if let (Err(e), true) = (r, done) {
            errors.push(format!("{e:#}"));
        }
    }
    if stragglers > 0 {
        eprintln!(
            "bunkai trace: {stragglers} traced process(es) still running {} s after the command exited; their streams end here",
            grace.as_secs()
        );
    }
    let writer = writer_thread.join().map_err(|_| anyhow::anyhow!("the trace writer panicked"))??;
    if let Some(e) = errors.first() {
        bail!("{e}");
    }
    let status = status.unwrap();
    let n = totals.streams.load(Ordering::SeqCst);
    if n == 0 {
        bail!("the traced command produced no trace (is {} a program Valgrind can run?)", program.display());
    }
    let bytes = writer.finish()?;
    let instr = totals.instructions.load(Ordering::SeqCst);
    let mem = totals.memrefs.load(Ordering::SeqCst);
    let dropped = totals.dropped.load(Ordering::SeqCst);
    let per = if instr > 0 { bytes as f64 / instr as f64 } else { 0.0 };
    let code = status.code().unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0));
    if a.json {
        eprintln!(
            "{}",
            serde_json::json!({
                "output": a.output, "bytes": bytes, "instructions": instr, "memory_references": mem,
                "streams": n, "ended_streams": totals.byes.load(Ordering::SeqCst), "dropped_segments": dropped,
                "bytes_per_instruction": per, "seconds": elapsed.as_secs_f64(), "exit_status": code,
                "interrupted": interrupted.load(Ordering::SeqCst),
            })
        );
    } else {
        eprintln!(
            "bunkai trace: {} instructions, {} memory references, {} stream(s) in {:.2} s -> {} ({} bytes, {:.3} B/instruction){}",
            commas(instr),
            commas(mem),
            n,
            elapsed.as_secs_f64(),
            a.output.display(),
            commas(bytes),
            per,
            if dropped > 0 { format!("; buffer full: {} segment executions not recorded", commas(dropped)) } else { String::new() }
        );
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
