//! `bunkai trace record --system`: the whole machine, kernel and server,
//! in one trace (issue 22; TURU, seed 001, traced Linux and Apache
//! together). The guest of trace/guest/ (Debian's kernel, an initramfs with
//! Apache) boots under QEMU's TCG with the plugin of trace/qemu/ loaded;
//! the plugin streams the same messages as the Valgrind tool over the same
//! kind of socket, and the connection is served by record.rs's
//! `serve_conn` (zstd on the recorder's side, the same writer).
//!
//! The plugin reads no registers (QEMU 7.2's plugin API cannot): what it
//! learns of the kernel comes from control flow reaching addresses of the
//! guest's System.map. This file decides which addresses (the watch file),
//! boots the guest, gives the plugin the server's /proc/PID/maps (printed
//! by the guest's init, saved before the request is sent; the plugin only
//! watches the kernel's entry points until it sees them, then flushes
//! QEMU's translations and instruments every block), sends one HTTP
//! GET through QEMU's user network on 127.0.0.1, and waits for the plugin
//! to close the window (the server's close of the connection), each step
//! with a deadline.

use crate::format::{self, Writer};
use crate::record::{serve_conn, ConnEnd, Msg, Totals};
use anyhow::{bail, Context, Result};
use bunkai_common::fmt::commas;
use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::AtomicU32;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// `record --system`'s options.
#[derive(Debug)]
pub struct SystemOptions {
    /// None with `count_only`.
    pub output: Option<PathBuf>,
    /// Directory with vmlinuz, initrd.gz, System.map (`make guest`).
    pub guest: PathBuf,
    /// The HTTP path to GET inside the window.
    pub get: String,
    /// Requests of the same path sent first, unrecorded (a warm server).
    pub warmup: u32,
    pub no_mem: bool,
    pub level: i32,
    pub json: bool,
    pub verbose: bool,
    /// Deadline of the boot, in seconds.
    pub boot_timeout: u64,
    /// Deadline of the request (sent to window closed), in seconds.
    pub timeout: u64,
    /// A window on a program's own syscalls instead of Apache's accept to
    /// close: from the return of the first of these (any task)...
    pub start_syscall: Option<String>,
    /// ...to the same task's return from this one.
    pub stop_syscall: Option<String>,
    /// Record nothing: the plugin follows the window and counts its
    /// instructions (QEMU's own speed through it, the baseline).
    pub count_only: bool,
}

/// One text symbol of System.map.
#[derive(Debug, Clone)]
pub struct Sym {
    pub addr: u64,
    pub name: String,
}

/// The text symbols of a System.map (or /proc/kallsyms), sorted.
pub fn read_system_map(path: &Path) -> Result<Vec<Sym>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut v: Vec<Sym> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let addr = u64::from_str_radix(it.next()?, 16).ok()?;
            let ty = it.next()?;
            let name = it.next()?;
            (matches!(ty, "t" | "T" | "w" | "W") && addr >= 0xffff_8000_0000_0000)
                .then(|| Sym { addr, name: name.to_string() })
        })
        .collect();
    v.sort_by_key(|s| s.addr);
    Ok(v)
}

/// The plugin's watch file ("START END KIND VALUE" lines) from the
/// kernel's symbols: what each letter means is in trace/qemu/bk_qemu.h.
pub fn watch_lines(syms: &[Sym]) -> Result<String> {
    let mut out = String::new();
    let by_name: std::collections::HashMap<&str, usize> =
        syms.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let range = |i: usize| -> (u64, u64) {
        let s = syms[i].addr;
        let e = syms[i + 1..].iter().map(|n| n.addr).find(|&a| a > s).unwrap_or(s + 1);
        (s, e)
    };
    let need = |name: &str| -> Result<usize> {
        by_name.get(name).copied().with_context(|| {
            format!("the guest's System.map has no {name} (it must be the running kernel's symbols: rebuild the guest with `make guest`)")
        })
    };
    let entry = by_name.get("entry_SYSCALL_64_safe_stack").copied().map_or_else(|| need("entry_SYSCALL_64"), Ok)?;
    let (s, e) = range(entry);
    out.push_str(&format!("{s:x} {e:x} e 0\n"));
    let after = need("entry_SYSCALL_64_after_hwframe")?;
    out.push_str(&format!("{:x} {:x} a 0\n", syms[after].addr, syms[after].addr + 1));
    let (s, e) = range(need("__switch_to_asm")?);
    out.push_str(&format!("{s:x} {e:x} w 0\n"));
    for (name, kind) in [("switch_mm_irqs_off", 'm'), ("sock_close", 'k')] {
        let a = syms[need(name)?].addr;
        out.push_str(&format!("{a:x} {:x} {kind} 0\n", a + 1));
    }
    let mut nsys = 0;
    for n in 0..512u64 {
        if let Some(name) = crate::dump::syscall_name(n) {
            if let Some(&i) = by_name.get(format!("__x64_sys_{name}").as_str()) {
                out.push_str(&format!("{:x} {:x} s {n}\n", syms[i].addr, syms[i].addr + 1));
                nsys += 1;
            }
        }
    }
    if nsys < 100 {
        bail!("the guest's System.map names only {nsys} syscall handlers (rebuild the guest with `make guest`)");
    }
    for s in syms {
        let kind = if s.name.starts_with("asm_exc_") {
            'x'
        } else if s.name == "asm_common_interrupt" || s.name.starts_with("asm_sysvec_") || s.name == "asm_spurious_interrupt" {
            'i'
        } else {
            continue;
        };
        out.push_str(&format!("{:x} {:x} {kind} 0\n", s.addr, s.addr + 1));
    }
    Ok(out)
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs the guest, records one request, writes the trace.
pub fn run(o: &SystemOptions) -> Result<ExitCode> {
    if !(1..=19).contains(&o.level) {
        bail!("--level {} is out of range (give 1 to 19)", o.level);
    }
    if !o.get.starts_with('/') || o.get.contains(char::is_whitespace) {
        bail!("--get {} is not an HTTP path (give one like /index.html)", o.get);
    }
    if o.warmup > 0 && (o.start_syscall.is_some() || o.stop_syscall.is_some()) {
        // the plugin lets warm-up windows pass only on Apache's accept to
        // close; a syscall window would open during a warm-up request
        bail!("--warmup applies to Apache's accept-to-close window, not to --start-syscall/--stop-syscall (give one or the other)");
    }
    let g = &o.guest;
    for f in ["vmlinuz", "initrd.gz", "System.map"] {
        if !g.join(f).is_file() {
            bail!("no {} in the guest directory {} (build the guest: make guest)", f, g.display());
        }
    }
    let plugin = bunkai_common::install::helper_libdir()?.join("bunkai-qemu.so");
    if !plugin.is_file() {
        bail!("the QEMU plugin is missing: {} (run `make`)", plugin.display());
    }
    let plugin = plugin.canonicalize().unwrap_or(plugin);
    let syms = read_system_map(&g.join("System.map"))?;
    if syms.is_empty() {
        bail!(
            "{} has no kernel symbols (Debian's /boot/System.map is a stub: rebuild the guest with `make guest`, which reads the kernel's own)",
            g.join("System.map").display()
        );
    }
    let watch = watch_lines(&syms)?;
    let syscall_window = match (&o.start_syscall, &o.stop_syscall) {
        (None, None) => None,
        (Some(a), Some(b)) => Some((crate::record::syscall_numbers(a)?[0], crate::record::syscall_numbers(b)?[0])),
        _ => bail!("--system takes --start-syscall and --stop-syscall together (or neither: Apache's accept to close)"),
    };

    let me = std::process::id();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{}{me}-", crate::record::DIR_PREFIX))
        .tempdir()
        .context("cannot create a temporary directory")?;
    let sock = dir.path().join("sock");
    let watch_path = dir.path().join("watch");
    let maps_path = dir.path().join("maps");
    std::fs::write(&watch_path, watch)?;
    // --count-only: the plugin still says HELLO and BYE; that trace stays here.
    let output = match &o.output {
        Some(p) if !o.count_only => p.clone(),
        _ => dir.path().join("count.bkt"),
    };
    let listener = UnixListener::bind(&sock).with_context(|| format!("cannot listen on {}", sock.display()))?;
    listener.set_nonblocking(true)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();

    let mut plugin_arg = plugin.as_os_str().to_os_string();
    for (k, v) in [("sock", &sock), ("ksyms", &g.join("System.map")), ("watch", &watch_path), ("maps", &maps_path)] {
        plugin_arg.push(format!(",arg={k}={}", v.display()));
    }
    if o.no_mem {
        plugin_arg.push(",arg=mem=off");
    }
    if o.count_only {
        plugin_arg.push(",arg=count=on");
    }
    if o.warmup > 0 {
        plugin_arg.push(format!(",arg=skip={}", o.warmup));
    }
    if let Some((a, b)) = syscall_window {
        // Not Apache's task: its maps do not apply; all user code is "[user]".
        plugin_arg.push(format!(",arg=start={a},arg=stop={b},arg=exe=[user]"));
    }
    let mut q = Command::new("qemu-system-x86_64");
    q.args(["-accel", "tcg", "-icount", "shift=0,sleep=off", "-smp", "1", "-m", "512", "-nographic", "-no-reboot", "-kernel"])
        .arg(g.join("vmlinuz"))
        .arg("-initrd")
        .arg(g.join("initrd.gz"))
        .args(["-append", "console=ttyS0 quiet panic=-1 nokaslr", "-netdev"])
        .arg(format!("user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:80"))
        .args(["-device", "e1000,netdev=n0", "-plugin"])
        .arg(&plugin_arg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if o.verbose {
        eprintln!("bunkai trace: {q:?}");
    }
    let meta = serde_json::json!({
        "command": ["qemu-system-x86_64", "(guest)", format!("GET {}", o.get)],
        "program": "/usr/sbin/apache2",
        "system": true,
        "guest": g,
        "request": o.get,
        "warmup_requests": o.warmup,
        "tool_version": 1,
        "format_version": format::VERSION,
        "memory_references": !o.no_mem,
        "window": match &syscall_window {
            Some((a, b)) => serde_json::json!({"start_syscall": a, "stop_syscall": b}),
            None => serde_json::json!({"start_syscall": "accept", "stop_at_close": true}),
        },
        "started_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    });
    let out_dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let removed = crate::record::remove_stale(&out_dir, &std::env::temp_dir());
    if removed > 0 {
        eprintln!("bunkai trace: removed {removed} temporary file(s) left by recorders that were killed");
    }
    // QEMU dies with the recorder, however the recorder ends (a guest left
    // running would keep its port and a core).
    // SAFETY: prctl in the child before exec, async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut q, || {
            prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0);
            Ok(())
        });
    }
    let writer = Writer::create(&output, &meta, o.level).with_context(|| format!("cannot write {}", output.display()))?;
    // Every phase is labelled on a terminal (boot alone takes about a minute).
    let progress = bunkai_common::progress::Progress::spinner(!o.json && bunkai_common::progress::on_terminal());
    progress.phase("starting QEMU");
    let t0 = Instant::now();
    let mut child = q.spawn().context("cannot start qemu-system-x86_64 (install it: scripts/install-deps.sh)")?;
    let stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let fail = |child: &mut Child, what: String| -> anyhow::Error {
        kill(child);
        anyhow::anyhow!(what)
    };

    // The plugin connects while QEMU starts.
    let conn = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(fail(&mut child, format!("cannot accept the plugin's connection: {e}"))),
        }
        if let Some(st) = child.try_wait()? {
            let err = err_thread.join().unwrap_or_default();
            let last = err.lines().last().unwrap_or("").to_string();
            bail!("qemu-system-x86_64 ended ({st}) before the plugin connected: {last}");
        }
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(fail(&mut child, "the plugin did not connect within 30 s (is QEMU built with plugin support?)".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    conn.set_nonblocking(false)?;
    let conn_ctl = conn.try_clone()?;
    let (tx, writer_thread) = crate::record::spawn_writer(writer);
    let totals = Arc::new(Totals::default());
    let next_stream = Arc::new(AtomicU32::new(1));
    let conn_thread = {
        let (tx, ns, tot, level, verbose) = (tx.clone(), next_stream.clone(), totals.clone(), o.level, o.verbose);
        std::thread::spawn(move || serve_conn(conn, &ns, tx, level, &tot, verbose))
    };

    // The console: the server's maps, then GUEST-READY.
    let stdout = child.stdout.take().unwrap();
    let (ltx, lrx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if ltx.send(l).is_err() {
                break;
            }
        }
    });
    progress.phase("booting the guest to Apache (QEMU's TCG, about a minute)");
    let boot_deadline = t0 + Duration::from_secs(o.boot_timeout);
    let mut maps = String::new();
    let mut console = Vec::new();
    let pid = loop {
        let left = boot_deadline.saturating_duration_since(Instant::now());
        match lrx.recv_timeout(left) {
            Ok(l) => {
                let l = l.trim_end_matches('\r').to_string();
                if let Some(m) = l.strip_prefix("GUEST-MAP ") {
                    maps.push_str(m);
                    maps.push('\n');
                } else if let Some(rest) = l.strip_prefix("GUEST-READY apache ") {
                    break rest.split_whitespace().next().and_then(|p| p.parse::<u64>().ok()).unwrap_or(0);
                }
                console.push(l);
            }
            Err(_) => {
                let tail = console.iter().rev().take(3).rev().cloned().collect::<Vec<_>>().join(" | ");
                return Err(fail(
                    &mut child,
                    format!("the guest did not say GUEST-READY within {} s (console: {tail}; rebuild it with `make guest`)", o.boot_timeout),
                ));
            }
        }
    };
    let booted = t0.elapsed();
    if maps.is_empty() {
        return Err(fail(&mut child, "the guest's init printed no GUEST-MAP lines (rebuild it with `make guest`)".into()));
    }
    let tmp = dir.path().join("maps.tmp");
    if syscall_window.is_some() {
        std::fs::write(&tmp, "pid 0\n")?;
    } else {
        std::fs::write(&tmp, format!("pid {pid}\n{maps}"))?;
    }
    std::fs::rename(&tmp, &maps_path)?;
    // The plugin instruments every block once it sees the maps (at the
    // next interrupt) and says so; the request waits for that.
    progress.phase("waiting for the plugin to arm");
    let armed = dir.path().join("maps.armed");
    let arm_deadline = Instant::now() + Duration::from_secs(60);
    while !armed.exists() {
        if Instant::now() > arm_deadline || child.try_wait()?.is_some() {
            return Err(fail(&mut child, "the plugin did not arm within 60 s of the maps being written".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let armed_after = t0.elapsed() - booted;

    // Warm-up requests (the plugin lets their windows pass), then the
    // request, and the window the plugin closes.
    for i in 0..o.warmup {
        progress.phase(format!("warm-up GET {} ({} of {})", o.get, i + 1, o.warmup));
        if let Err(e) = http_get(port, &o.get, Duration::from_secs(o.timeout)) {
            return Err(fail(&mut child, format!("warm-up GET {} ({} of {}) failed: {e:#}", o.get, i + 1, o.warmup)));
        }
    }
    progress.phase(format!("GET {}: recording its window", o.get));
    let t_req = Instant::now();
    let req_ns = monotonic_ns();
    let deadline = t_req + Duration::from_secs(o.timeout);
    let response = match http_get(port, &o.get, Duration::from_secs(o.timeout)) {
        Ok(r) => r,
        Err(e) => return Err(fail(&mut child, format!("GET {} from the guest failed: {e:#}", o.get))),
    };
    let responded = t_req.elapsed();
    while !conn_thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let window_done = conn_thread.is_finished();
    let recorded = t_req.elapsed();
    let _ = conn_ctl.shutdown(std::net::Shutdown::Both);
    kill(&mut child);
    let end: ConnEnd = conn_thread.join().map_err(|_| anyhow::anyhow!("the stream reader panicked"))??;
    if end.stream != 0 && !end.bye {
        let mut p = Vec::new();
        let reason = if window_done { crate::decode::CUT_CLOSED } else { crate::decode::CUT_RUNNING };
        for v in [reason, end.partial, 0] {
            format::put_v(&mut p, v);
        }
        let raw_len = p.len();
        let _ = tx.send(Msg { stream: end.stream, kind: format::CHUNK_CUT, raw_len, compressed: None, raw: p });
    }
    drop(tx);
    progress.phase("writing the trace");
    let writer = writer_thread.join().map_err(|_| anyhow::anyhow!("the trace writer panicked"))??;
    if end.stream == 0 {
        drop(writer);
        bail!(
            "the window never opened: the plugin saw no accept return before the response (status: {})",
            response.status_line
        );
    }
    let bytes = writer.finish()?;
    if !window_done {
        if !o.count_only {
            eprintln!("bunkai trace: the window did not close within {} s of the request (the trace ends there, marked cut)", o.timeout);
        }
    }
    // The window's host times and the plugin's instruction count (written
    // at its close; the count is --count-only's figure).
    let (open_s, window_s, counted) = match std::fs::read_to_string(dir.path().join("maps.window")) {
        Ok(w) => {
            let v: Vec<u64> = w.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            match v[..] {
                [open, close, n] => ((open.saturating_sub(req_ns)) as f64 / 1e9, (close.saturating_sub(open)) as f64 / 1e9, n),
                _ => (0.0, 0.0, 0),
            }
        }
        Err(_) => (0.0, 0.0, 0),
    };
    if o.count_only {
        drop(progress);
        return count_only_summary(o, booted, window_done, counted, window_s, &response);
    }
    // Counts from the trace itself: kernel share, syscalls, traps.
    progress.phase("counting what the trace holds");
    let t = crate::decode::Trace::load(&output)?;
    let c = count(&t)?;
    drop(progress);
    let per = if c.instructions > 0 { bytes as f64 / c.instructions as f64 } else { 0.0 };
    let rate = if window_s > 0.0 { c.instructions as f64 / window_s / 1e6 } else { 0.0 };
    let kshare = if c.instructions > 0 { 100.0 * c.kernel as f64 / c.instructions as f64 } else { 0.0 };
    if o.json {
        eprintln!(
            "{}",
            serde_json::json!({
                "output": output, "bytes": bytes, "instructions": c.instructions, "kernel_instructions": c.kernel,
                "memory_references": c.memrefs, "syscalls": c.syscalls, "interrupts": c.interrupts,
                "exceptions": c.exceptions, "address_space_switches": c.asids,
                "bytes_per_instruction": per, "boot_seconds": booted.as_secs_f64(),
                "arm_seconds": armed_after.as_secs_f64(),
                "response_seconds": responded.as_secs_f64(), "recorded_seconds": recorded.as_secs_f64(),
                "window_opened_after_seconds": open_s, "window_seconds": window_s,
                "million_instructions_per_second": rate, "window_closed": window_done,
                "http_status": response.status_line, "response_bytes": response.body_len,
                "seconds": t0.elapsed().as_secs_f64(),
            })
        );
    } else {
        eprintln!(
            "bunkai trace: system: guest booted in {:.1} s; GET {} ({}, {} bytes) answered in {:.2} s, window of {:.2} s: {} instructions ({:.1}% kernel), {} memory references, {} syscalls, {} interrupts, {} exceptions, {} address-space switches -> {} ({} bytes, {:.3} B/instruction, {:.1} M instructions/s)",
            booted.as_secs_f64(),
            o.get,
            response.status_line,
            response.body_len,
            responded.as_secs_f64(),
            window_s,
            commas(c.instructions),
            kshare,
            commas(c.memrefs),
            c.syscalls,
            c.interrupts,
            c.exceptions,
            c.asids,
            output.display(),
            commas(bytes),
            per,
            rate
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `--count-only`'s summary: QEMU's own speed through the window.
fn count_only_summary(
    o: &SystemOptions,
    booted: Duration,
    window_done: bool,
    instructions: u64,
    window_s: f64,
    response: &Response,
) -> Result<ExitCode> {
    if !window_done {
        bail!("the window did not close within {} s of the request: nothing was counted (give a larger --timeout)", o.timeout);
    }
    if instructions == 0 || window_s <= 0.0 {
        bail!("the window closed but the plugin wrote no count (QEMU ended first? run again with -v to see its command)");
    }
    let rate = instructions as f64 / window_s / 1e6;
    if o.json {
        eprintln!(
            "{}",
            serde_json::json!({
                "count_only": true, "instructions": instructions, "window_seconds": window_s,
                "million_instructions_per_second": rate, "boot_seconds": booted.as_secs_f64(),
                "http_status": response.status_line, "response_bytes": response.body_len,
            })
        );
    } else {
        eprintln!(
            "bunkai trace: system, counting only: guest booted in {:.1} s; GET {} ({}), window of {:.3} s: {} instructions, {:.1} M instructions/s (QEMU with the plugin loaded, nothing recorded)",
            booted.as_secs_f64(),
            o.get,
            response.status_line,
            window_s,
            commas(instructions),
            rate
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn monotonic_ns() -> u64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes the struct it is given.
    unsafe { clock_gettime(1, &mut ts) };
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

const PR_SET_PDEATHSIG: i32 = 1;

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
}

/// What a system trace holds, counted.
#[derive(Debug, Default)]
pub struct Counts {
    pub instructions: u64,
    pub kernel: u64,
    pub memrefs: u64,
    pub syscalls: u64,
    pub interrupts: u64,
    pub exceptions: u64,
    pub asids: u64,
}

pub fn count(t: &crate::decode::Trace) -> Result<Counts> {
    use crate::decode::{Event, Item};
    let mut c = Counts::default();
    let sel: Vec<usize> = (0..t.streams.len()).collect();
    let kernel: Vec<Vec<u64>> = t
        .streams
        .iter()
        .map(|st| st.objects.values().filter(|o| o.name == "[kernel]").map(|o| o.id).collect())
        .collect();
    t.visit(&sel, |pos, item| {
        match item {
            Item::Exec { seg, .. } => {
                let k = &kernel[pos.stream];
                c.instructions += seg.insns.len() as u64;
                c.memrefs += seg.accs.len() as u64;
                c.kernel += seg.insns.iter().filter(|i| k.contains(&i.obj)).count() as u64;
            }
            Item::Event(ev) => match ev {
                Event::Syscall { .. } => c.syscalls += 1,
                Event::Trap { kind, .. } if *kind == crate::decode::TRAP_INTERRUPT => c.interrupts += 1,
                Event::Trap { .. } => c.exceptions += 1,
                Event::Asid { .. } => c.asids += 1,
                _ => {}
            },
        }
        std::ops::ControlFlow::Continue(())
    })?;
    Ok(c)
}

pub struct Response {
    pub status_line: String,
    pub body_len: usize,
}

/// One HTTP/1.0 GET to the guest on loopback, read to the end.
fn http_get(port: u16, path: &str, timeout: Duration) -> Result<Response> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut all = Vec::new();
    s.read_to_end(&mut all)?;
    let head_end = all.windows(4).position(|w| w == b"\r\n\r\n").context("no HTTP header in the answer")?;
    let head = String::from_utf8_lossy(&all[..head_end]);
    let status_line = head.lines().next().unwrap_or("").to_string();
    Ok(Response { status_line, body_len: all.len() - head_end - 4 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(extra: &str) -> Vec<Sym> {
        let mut text = String::from(
            "ffffffff81000000 T _stext\n\
             ffffffff81003270 T __switch_to_asm\n\
             ffffffff81003300 T __switch_to\n\
             ffffffff8108a9b0 T switch_mm_irqs_off\n\
             ffffffff8108b000 t next_after_mm\n\
             ffffffff817af180 t sock_close\n\
             ffffffff81c00080 T entry_SYSCALL_64\n\
             ffffffff81c000a9 T entry_SYSCALL_64_safe_stack\n\
             ffffffff81c000b8 T entry_SYSCALL_64_after_hwframe\n\
             ffffffff81c00200 T asm_exc_page_fault\n\
             ffffffff81c00300 T asm_common_interrupt\n\
             ffffffff81c00400 T asm_sysvec_apic_timer_interrupt\n\
             ffffffff82000000 D some_data\n\
             0000000000001000 A cpu_debug_store\n",
        );
        for n in 0..512u64 {
            if let Some(name) = crate::dump::syscall_name(n) {
                text.push_str(&format!("{:x} T __x64_sys_{name}\n", 0xffffffff81500000u64 + n * 0x40));
            }
        }
        text.push_str(extra);
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("System.map");
        std::fs::write(&p, text).unwrap();
        read_system_map(&p).unwrap()
    }

    /// The watch file names each entry point with its letter, the ranges
    /// up to the next symbol, and the syscall handlers with their numbers;
    /// data and absolute symbols are not kernel text.
    #[test]
    fn watch_lines_from_a_system_map() {
        let syms = map("");
        assert!(syms.iter().all(|s| s.name != "some_data" && s.name != "cpu_debug_store"));
        let w = watch_lines(&syms).unwrap();
        let has = |l: &str| w.lines().any(|x| x == l);
        assert!(has("ffffffff81c000a9 ffffffff81c000b8 e 0"), "{w}");
        assert!(has("ffffffff81c000b8 ffffffff81c000b9 a 0"), "{w}");
        assert!(has("ffffffff81003270 ffffffff81003300 w 0"), "{w}");
        assert!(has("ffffffff8108a9b0 ffffffff8108a9b1 m 0"), "{w}");
        assert!(has("ffffffff817af180 ffffffff817af181 k 0"), "{w}");
        assert!(has("ffffffff81c00200 ffffffff81c00201 x 0"), "{w}");
        assert!(has("ffffffff81c00300 ffffffff81c00301 i 0"), "{w}");
        assert!(has("ffffffff81c00400 ffffffff81c00401 i 0"), "{w}");
        // close (3), accept (43) and accept4 (288) with their numbers.
        assert!(has(&format!("{:x} {:x} s 3", 0xffffffff81500000u64 + 3 * 0x40, 0xffffffff81500000u64 + 3 * 0x40 + 1)), "{w}");
        assert!(w.lines().any(|l| l.ends_with(" s 43")) && w.lines().any(|l| l.ends_with(" s 288")), "{w}");
    }

    /// Debian's stub System.map (no symbols) and a map without the entry
    /// points are refused, saying how to get the real one.
    #[test]
    fn a_stub_or_foreign_system_map_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("System.map");
        std::fs::write(&p, "ffffffffffffffff B The real System.map is in the linux-image-<version>-dbg package\n").unwrap();
        assert!(read_system_map(&p).unwrap().is_empty());
        let syms: Vec<Sym> = map("").into_iter().filter(|s| s.name != "__switch_to_asm").collect();
        let e = watch_lines(&syms).unwrap_err().to_string();
        assert!(e.contains("__switch_to_asm") && e.contains("make guest"), "{e}");
    }
}
