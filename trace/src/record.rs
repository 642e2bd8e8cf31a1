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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
fn valgrind_command(
    a: &RecordOptions,
    dir: &Path,
    tools: &Path,
    program: &Path,
    funcs: &[(&str, String)],
) -> Result<Command> {
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
    for (opt, f) in funcs {
        c.arg(format!("--bk-{}={f}", opt.trim_start_matches("--")));
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
pub(crate) struct Msg {
    pub(crate) stream: u32,
    pub(crate) kind: u8,
    pub(crate) raw_len: usize,
    pub(crate) compressed: Option<Vec<u8>>,
    pub(crate) raw: Vec<u8>,
}

/// What the connections saw, for the summary.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) streams: AtomicU32,
    pub(crate) byes: AtomicU32,
    pub(crate) instructions: AtomicU64,
    pub(crate) memrefs: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) dropped_instructions: AtomicU64,
    /// Bytes of messages received, for the progress line.
    pub(crate) received: AtomicU64,
}

/// How one connection ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ConnEnd {
    /// Its stream number (0: it closed before its HELLO was complete, and
    /// nothing of it is in the trace).
    pub stream: u32,
    /// The pid its HELLO named.
    pub pid: u64,
    /// It sent BYE.
    pub bye: bool,
    /// Bytes of a message it did not finish (it was killed while sending).
    pub partial: u64,
    /// Its last message holds only an EXEC event: it exec'd.
    pub exec: bool,
}

/// Whether an EVENTS payload is one EXEC event and nothing else (what the
/// tool sends last before an exec).
/// The thread that writes the streams' chunks into the trace file, in the
/// order they come (both recorders: Valgrind's and the system mode's); it
/// gives the writer back when every sender is gone.
pub(crate) fn spawn_writer(mut writer: Writer) -> (mpsc::SyncSender<Msg>, std::thread::JoinHandle<Result<Writer>>) {
    let (tx, rx) = mpsc::sync_channel::<Msg>(64);
    let t = std::thread::spawn(move || -> Result<Writer> {
        for m in rx {
            writer.chunk_stored(m.kind, m.stream, m.raw_len, m.compressed.as_deref(), &m.raw)?;
        }
        Ok(writer)
    });
    (tx, t)
}

fn only_exec(raw: &[u8]) -> bool {
    let mut c = format::Cursor::new(raw);
    c.v().ok() == Some((crate::decode::EV_EXEC << 1) | 1) && c.s().is_ok() && c.done()
}

/// Reads until `buf` is full or the stream ends; returns how much it read.
fn read_full(s: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads one connection until EOF: HELLO first, then DEFS/EVENTS, BYE. A
/// connection that ends inside a message (its process was killed while
/// sending) ends its stream there: what came before is kept.
pub(crate) fn serve_conn(
    mut s: impl Read,
    next_stream: &AtomicU32,
    tx: mpsc::SyncSender<Msg>,
    level: i32,
    totals: &Totals,
    verbose: bool,
) -> Result<ConnEnd> {
    let mut end = ConnEnd::default();
    // One compression context for the connection's chunks: a context made
    // per chunk (zstd::bulk::compress) allocated and cleared its tables
    // every time.
    let mut zc = zstd::bulk::Compressor::new(level)?;
    loop {
        let mut h = [0u8; 8];
        let got = read_full(&mut s, &mut h)?;
        if got < h.len() {
            end.partial = got as u64;
            return Ok(end);
        }
        let kind = h[0];
        let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        if !(format::CHUNK_HELLO..=format::CHUNK_BYE).contains(&kind) || h[1..4] != [0, 0, 0] || len > (1 << 30) {
            bail!("the tool sent a malformed message (kind {kind}, {len} bytes)");
        }
        let mut raw = vec![0u8; len];
        let got = read_full(&mut s, &mut raw)?;
        totals.received.fetch_add(8 + got as u64, Ordering::Relaxed);
        if got < len {
            end.partial = (8 + got) as u64;
            return Ok(end);
        }
        if end.bye {
            bail!("the tool sent a message after its BYE");
        }
        let stream = end.stream;
        if stream == 0 {
            if kind != format::CHUNK_HELLO {
                bail!("the tool did not start its stream with HELLO");
            }
            end.stream = next_stream.fetch_add(1, Ordering::SeqCst);
            totals.streams.fetch_add(1, Ordering::SeqCst);
            let mut c = format::Cursor::new(&raw);
            end.pid = c.v().unwrap_or(0);
            if verbose {
                let ppid = c.v().unwrap_or(0);
                let _ = c.v();
                let exe = c.s().unwrap_or_default();
                eprintln!("bunkai trace: stream {}: pid {} (parent {ppid}) {exe}", end.stream, end.pid);
            }
        }
        let stream = end.stream;
        end.exec = kind == format::CHUNK_EVENTS && only_exec(&raw);
        if kind == format::CHUNK_BYE {
            let mut c = format::Cursor::new(&raw);
            end.bye = true;
            totals.byes.fetch_add(1, Ordering::SeqCst);
            totals.instructions.fetch_add(c.v().unwrap_or(0), Ordering::SeqCst);
            totals.memrefs.fetch_add(c.v().unwrap_or(0), Ordering::SeqCst);
            totals.dropped.fetch_add(c.v().unwrap_or(0), Ordering::SeqCst);
            let (_status, _signal) = (c.v().unwrap_or(0), c.v().unwrap_or(0));
            totals.dropped_instructions.fetch_add(c.v().unwrap_or(0), Ordering::SeqCst);
        }
        let compressed = if raw.len() >= 64 { Some(zc.compress(&raw)?) } else { None };
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
    // Misspelt or unnamed functions are refused before anything runs.
    let mut a_checked = Vec::new();
    for (opt, f) in [("--start-func", &a.start_func), ("--stop-func", &a.stop_func)] {
        if let Some(f) = f {
            a_checked.push((opt, crate::symbols::check_function(opt, f, &program)?));
        }
    }
    let out_dir = match a.output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let removed = remove_stale(&out_dir, &std::env::temp_dir());
    if removed > 0 {
        eprintln!("bunkai trace: removed {removed} temporary file(s) left by recorders that were killed");
    }
    let me = std::process::id();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{me}-"))
        .tempdir()
        .context("cannot create a temporary directory")?;
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

    let mut cmd = valgrind_command(a, dir.path(), &tools, &program, &a_checked)?;
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
    let writer = Writer::create(&a.output, &meta, a.level)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    let unfinished = vec![writer.temp_path().to_path_buf(), dir.path().to_path_buf()];
    if a.verbose {
        eprintln!("bunkai trace: VALGRIND_LIB={} {:?}", tools.display(), cmd);
    }
    cmd.stdin(Stdio::inherit()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("cannot start valgrind (install it: scripts/install-deps.sh)")?;
    let child_pid = child.id() as i32;

    // The first SIGINT/SIGTERM goes to the traced command, and the trace of
    // what ran until then is still written. A second one gives up: the
    // command is killed, the unfinished trace and the socket directory are
    // removed.
    let interrupted = Arc::new(AtomicU32::new(0));
    {
        let count = interrupted.clone();
        let _ = ctrlc::set_handler(move || {
            if count.fetch_add(1, Ordering::SeqCst) == 0 {
                unsafe { libc_kill(child_pid, 15) };
                return;
            }
            unsafe { libc_kill(child_pid, 9) };
            for p in &unfinished {
                let _ = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
            }
            eprintln!("bunkai trace: interrupted twice; the trace was not written (removed the unfinished output)");
            std::process::exit(130);
        });
    }

    let (tx, writer_thread) = spawn_writer(writer);
    let totals = Arc::new(Totals::default());
    let next_stream = Arc::new(AtomicU32::new(1));
    // Progress on a terminal; while the command runs only if its output
    // (our stdout, which it inherits) is not that terminal, so that the
    // progress line and the program's own lines do not interleave.
    let on_tty = !a.json && bunkai_common::progress::on_terminal();
    let quiet_run = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let spinner = || bunkai_common::progress::Progress::spinner(on_tty);
    let mut progress = if quiet_run { None } else { Some(spinner()) };
    let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(p) = &progress {
        p.phase(format!("starting {name} under Valgrind"));
    }
    let mut shown = Instant::now();

    // Accept connections until the command has exited and every stream has
    // ended; streams of processes that outlive the command get a grace period.
    let mut conns: Vec<std::thread::JoinHandle<Result<ConnEnd>>> = Vec::new();
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
        if shown.elapsed() > Duration::from_millis(200) {
            shown = Instant::now();
            let got = indicatif::HumanBytes(totals.received.load(Ordering::Relaxed));
            let streams = totals.streams.load(Ordering::Relaxed);
            if status.is_some() {
                progress
                    .get_or_insert_with(spinner)
                    .phase(format!("{name} exited; waiting for its processes' streams to end ({got} received)"));
            } else if let Some(p) = &progress {
                p.phase(format!("recording {name}: {streams} stream(s), {got} received"));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = t0.elapsed();
    let status = status.unwrap();
    // Processes that outlived the command: their streams end here.
    let finished: Vec<bool> = conns.iter().map(|h| h.is_finished()).collect();
    let stragglers = finished.iter().filter(|f| !**f).count();
    for s in &socks {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    // The command's own pid is the pid of its streams (Valgrind runs in the
    // process it traces): the recorder knows the signal that ended it.
    let command_signal = std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0) as u64;
    let mut errors = Vec::new();
    let mut cut: Vec<u32> = Vec::new();
    let mut no_bye: Vec<u32> = Vec::new();
    for (h, done) in conns.into_iter().zip(finished) {
        let r = h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a stream reader panicked")));
        if let Ok(end) = &r {
            if end.stream != 0 && !end.bye {
                no_bye.push(end.stream);
            }
        }
        match r {
            Ok(end) if end.stream != 0 && !end.bye && !(end.exec && done) => {
                let reason = if !done {
                    CUT_RUNNING
                } else if end.partial > 0 {
                    CUT_PARTIAL
                } else {
                    CUT_CLOSED
                };
                let signal = if end.pid == child_pid as u64 && done { command_signal } else { 0 };
                let mut p = Vec::new();
                for v in [reason, end.partial, signal] {
                    format::put_v(&mut p, v);
                }
                let raw_len = p.len();
                if tx.send(Msg { stream: end.stream, kind: format::CHUNK_CUT, raw_len, compressed: None, raw: p }).is_err() {
                    errors.push("the trace writer stopped".to_string());
                }
                cut.push(end.stream);
            }
            Ok(_) => {}
            Err(e) if done => errors.push(format!("{e:#}")),
            Err(_) => {}
        }
    }
    drop(tx);
    let progress = progress.unwrap_or_else(spinner);
    progress.phase("writing the trace");
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
    let n = totals.streams.load(Ordering::SeqCst);
    if n == 0 {
        bail!("the traced command produced no trace (is {} a program Valgrind can run?)", program.display());
    }
    let bytes = writer.finish()?;
    let mut instr = totals.instructions.load(Ordering::SeqCst);
    let mut mem = totals.memrefs.load(Ordering::SeqCst);
    // Streams without BYE (cut, or exec'd) have no totals of the tool's:
    // count what the trace holds of them.
    if !no_bye.is_empty() {
        progress.phase("counting the streams that ended without their totals");
        let t = crate::decode::Trace::load(&a.output)?;
        let sel: Vec<usize> = (0..t.streams.len()).filter(|&i| no_bye.contains(&t.streams[i].id)).collect();
        let v = t.visit(&sel, |_, _| std::ops::ControlFlow::Continue(()))?;
        instr += v.instructions;
        mem += v.memory_references;
    }
    drop(progress);
    let dropped = totals.dropped.load(Ordering::SeqCst);
    let dropped_instr = totals.dropped_instructions.load(Ordering::SeqCst);
    let per = if instr > 0 { bytes as f64 / instr as f64 } else { 0.0 };
    let code = status.code().unwrap_or(128 + command_signal as i32);
    if a.json {
        eprintln!(
            "{}",
            serde_json::json!({
                "output": a.output, "bytes": bytes, "instructions": instr, "memory_references": mem,
                "streams": n, "ended_streams": totals.byes.load(Ordering::SeqCst), "cut_streams": cut.len(),
                "dropped_segments": dropped, "dropped_instructions": dropped_instr,
                "bytes_per_instruction": per, "seconds": elapsed.as_secs_f64(), "exit_status": code,
                "interrupted": interrupted.load(Ordering::SeqCst) > 0,
            })
        );
    } else {
        eprintln!(
            "bunkai trace: {} instructions, {} memory references, {} stream(s){} in {:.2} s -> {} ({} bytes, {:.3} B/instruction){}",
            commas(instr),
            commas(mem),
            n,
            if cut.is_empty() { String::new() } else { format!(" ({} cut: see `bunkai trace report`)", cut.len()) },
            elapsed.as_secs_f64(),
            a.output.display(),
            commas(bytes),
            per,
            if dropped > 0 {
                format!(
                    "; buffer full: {} instructions ({} segment executions) not recorded",
                    commas(dropped_instr),
                    commas(dropped)
                )
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Names of what a recorder leaves while it runs: its socket directory in
/// the temporary directory, and the unfinished trace beside the output.
/// Both carry the recorder's pid, so a later recorder can tell whether the
/// one that made them is still alive.
pub(crate) const DIR_PREFIX: &str = "bunkai-trace-";
pub(crate) const TEMP_PREFIX: &str = ".bunkai-trace-";

/// Removes the socket directories (in `tmp`) and unfinished traces (in
/// `out_dir`) of recorders that were killed (SIGKILL leaves them): only
/// those owned by this user whose recorder pid is no longer a running
/// bunkai. Returns how many it removed.
pub(crate) fn remove_stale(out_dir: &Path, tmp: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let uid = unsafe { geteuid() };
    let mut removed = 0;
    for (dir, prefix, want_dir) in [(tmp, DIR_PREFIX, true), (out_dir, TEMP_PREFIX, false)] {
        let Ok(rd) = std::fs::read_dir(dir) else { continue };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else { continue };
            let Some(pid) = rest.split_once('-').and_then(|(p, _)| p.parse::<u32>().ok()) else { continue };
            let Ok(md) = e.path().symlink_metadata() else { continue };
            if md.uid() != uid || md.is_dir() != want_dir || recorder_alive(pid) {
                continue;
            }
            let r = if want_dir { std::fs::remove_dir_all(e.path()) } else { std::fs::remove_file(e.path()) };
            if r.is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Whether `pid` is a running bunkai (a reused pid is another program).
fn recorder_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) => comm.trim_end() == "bunkai",
        Err(_) => false,
    }
}

const CUT_PARTIAL: u64 = crate::decode::CUT_PARTIAL;
const CUT_CLOSED: u64 = crate::decode::CUT_CLOSED;
const CUT_RUNNING: u64 = crate::decode::CUT_RUNNING;

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
    fn geteuid() -> u32;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut m = vec![kind, 0, 0, 0];
        m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(payload);
        m
    }

    fn hello(pid: u64) -> Vec<u8> {
        let mut p = Vec::new();
        for v in [pid, 1, 1] {
            format::put_v(&mut p, v);
        }
        format::put_s(&mut p, "/bin/x");
        for v in [0, 1, 1] {
            format::put_v(&mut p, v);
        }
        msg(format::CHUNK_HELLO, &p)
    }

    fn serve(bytes: &[u8]) -> (Result<ConnEnd>, Vec<u8>) {
        let (tx, rx) = mpsc::sync_channel(64);
        let (n, t) = (AtomicU32::new(1), Totals::default());
        let r = serve_conn(bytes, &n, tx, 1, &t, false);
        (r, rx.try_iter().map(|m| m.kind).collect())
    }

    /// A process killed while it sends: the messages before the cut are
    /// kept, the unfinished one is counted, and it is not an error.
    #[test]
    fn a_connection_cut_inside_a_message_ends_its_stream() {
        let events = msg(format::CHUNK_EVENTS, &[0u8; 100]);
        let mut s = hello(42);
        s.extend_from_slice(&events);
        for cut in [0, 3, 8, 50] {
            let mut b = s.clone();
            b.extend_from_slice(&events[..cut]);
            let (r, kinds) = serve(&b);
            let end = r.unwrap();
            assert_eq!(end, ConnEnd { stream: 1, pid: 42, bye: false, partial: cut as u64, exec: false }, "cut {cut}");
            assert_eq!(kinds, vec![format::CHUNK_HELLO, format::CHUNK_EVENTS]);
        }
        // Killed inside its HELLO: no stream at all.
        let (r, kinds) = serve(&s[..5]);
        assert_eq!(r.unwrap().stream, 0);
        assert!(kinds.is_empty());
        // An exec: the last message is the EXEC event alone.
        let mut ex = Vec::new();
        format::put_v(&mut ex, (crate::decode::EV_EXEC << 1) | 1);
        format::put_s(&mut ex, "/bin/true");
        let mut b = s.clone();
        b.extend_from_slice(&msg(format::CHUNK_EVENTS, &ex));
        assert!(serve(&b).0.unwrap().exec);
        // A message after BYE is still the tool's error.
        let mut b = s.clone();
        b.extend_from_slice(&msg(format::CHUNK_BYE, &[0, 0, 0, 0, 0, 0]));
        b.extend_from_slice(&events);
        assert!(serve(&b).0.unwrap_err().to_string().contains("after its BYE"));
    }

    /// What a SIGKILLed recorder leaves is removed by the next one: only
    /// names with the pid of a process that is not a running bunkai.
    #[test]
    fn stale_files_of_dead_recorders_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let (out, tmp) = (d.path().join("out"), d.path().join("tmp"));
        std::fs::create_dir_all(&out).unwrap();
        std::fs::create_dir_all(&tmp).unwrap();
        // A pid that is not running: past the kernel's pid_max.
        let dead = 4_194_305u32;
        let me = std::process::id();
        std::fs::write(out.join(format!("{TEMP_PREFIX}{dead}-abc")), b"x").unwrap();
        std::fs::write(out.join(format!("{TEMP_PREFIX}{me}-abc")), b"x").unwrap();
        std::fs::write(out.join(".bunkai-trace-old"), b"x").unwrap();
        std::fs::create_dir_all(tmp.join(format!("{DIR_PREFIX}{dead}-xyz"))).unwrap();
        std::fs::write(tmp.join(format!("{DIR_PREFIX}{dead}-xyz/sock")), b"").unwrap();
        std::fs::create_dir_all(tmp.join(format!("{DIR_PREFIX}{me}-xyz"))).unwrap();
        assert_eq!(remove_stale(&out, &tmp), 2);
        let mut left: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .chain(std::fs::read_dir(&tmp).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = vec![".bunkai-trace-old".to_string(), format!("{TEMP_PREFIX}{me}-abc"), format!("{DIR_PREFIX}{me}-xyz")];
        want.sort();
        assert_eq!(left, want);
    }
}
