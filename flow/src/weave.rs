//! `bunkai flow emit`, `weave` and `unweave`. The advice module's C comes
//! from advice.rs (`generate`).
//!
//! `weave` compiles the module with clang-14 (vector-free when it can, so
//! the trampoline skips XSAVE) and loads it through bunkai mod's loader.

use crate::advice::c_ident;
pub use crate::advice::{generate, vector_free_object, Generated};
use crate::aspect::Aspect;
use crate::select::Program;
use anyhow::{bail, Result};
use std::path::Path;

/// `bunkai flow emit`'s options (cmd/emit.rs).
pub struct EmitOptions {
    /// The aspect (XML, the paper's notation)
    pub aspect: std::path::PathBuf,
    /// The program built with `bunkai flow cc` (EXE[@HOST])
    pub program: String,
    /// Write the C here instead of standard output
    pub out: Option<std::path::PathBuf>,
    /// The module's name (default: flow_ASPECT)
    pub name: Option<String>,
}

/// The aspect file parsed and checked against the program (`EXE[@HOST]`),
/// as `bunkai flow check --program` would, and the module's name (default
/// flow_ASPECT). The first problem is the error.
fn checked_aspect(path: &std::path::Path, program: &str, name: Option<&str>) -> Result<(Aspect, Program, String)> {
    let shown = path.display().to_string();
    let aspect = crate::check::read_aspect(path)?;
    let prog = crate::check::parse_program(program)?;
    let mut d = crate::check::check_aspect(&aspect);
    d.extend(crate::check::check_programs(&aspect, std::slice::from_ref(&prog)).0);
    if let Some(first) = d.first() {
        bail!("{shown}:{first} (`bunkai flow check {shown} --program {program}` lists every problem)");
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("aspect");
    let module = name.map(String::from).unwrap_or_else(|| format!("flow_{}", c_ident(stem)));
    Ok((aspect, prog, module))
}

/// `bunkai flow emit`: the advice module's C for a program, sleds at their
/// link-time addresses (weaving adds the load bias). The aspect is checked
/// first, as `bunkai flow check` does.
pub fn emit(a: &EmitOptions) -> Result<std::process::ExitCode> {
    let (aspect, prog, module) = checked_aspect(&a.aspect, &a.program, a.name.as_deref())?;
    let g = generate(&aspect, &prog, 0, &module)?;
    match &a.out {
        Some(p) => bunkai_common::files::write_atomic(p, g.named(&a.aspect.display().to_string(), &p.display().to_string()).as_bytes())?,
        None => crate::stdout(&g.named(&a.aspect.display().to_string(), &format!("{module}.c")))?,
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Warnings that are errors in every compile of advice: a misspelt call
/// would otherwise compile, and fail only when the module is loaded (an
/// unresolved symbol).
const STRICT: &[&str] = &["-Werror=implicit-function-declaration", "-Werror=int-conversion", "-Werror=incompatible-pointer-types"];

/// clang-14 on generated advice: `args` say what to make (-fsyntax-only,
/// or -c), then the STRICT errors, bunkai's headers, no field guards if
/// asked, and the user's --cflags; the caller adds the rest.
fn advice_clang(inc: &Path, args: &[&str], no_field: bool, cflags: Option<&str>) -> std::process::Command {
    let mut cc = std::process::Command::new("clang-14");
    cc.args(args).args(STRICT).arg(format!("-I{}", inc.display()));
    if no_field {
        cc.arg("-DBKF_NO_FIELD_GUARD__");
    }
    if let Some(f) = cflags {
        cc.args(f.split_whitespace());
    }
    cc
}

/// Compiles with field guards and, when that fails and the module has
/// some, once more without them: an xout's guard needs offsetof its header
/// member, which a bitfield has not (those sleds are then woven
/// unguarded). The output kept, and whether it was built without them.
fn with_field_fallback(
    field_guarded: usize,
    mut compile: impl FnMut(bool) -> Result<std::process::Output>,
) -> Result<(std::process::Output, bool)> {
    let out = compile(false)?;
    if out.status.success() || field_guarded == 0 {
        return Ok((out, false));
    }
    let again = compile(true)?;
    Ok(if again.status.success() { (again, true) } else { (out, false) })
}

/// The advice's C errors for one program: the module `weave` would build
/// (its sleds at link-time addresses), compiled with -fsyntax-only. The
/// module's `#line` directives name the aspect file as `aspect_name`:
/// errors in the aspect's own C come first, as `FILE:LINE:COL: message`;
/// then the errors in the generated code around it (what xin and xout
/// write needs the header's struct, which only --cflags can give).
pub struct CErrors {
    pub in_aspect: Vec<String>,
    pub generated: Vec<String>,
}

pub fn c_errors(aspect: &Aspect, aspect_name: &str, prog: &Program, cflags: Option<&str>) -> Result<CErrors> {
    let g = generate(aspect, prog, 0, "flow_check")?;
    let dir = tempfile::Builder::new().prefix("bunkai-flow-check-").tempdir()?;
    let c = dir.path().join("flow_check.c");
    std::fs::write(&c, g.named(aspect_name, "(generated)"))?;
    let inc = bunkai_common::install::helper_libdir()?.join("include");
    // as weave: without field guards if only they fail
    let (out, _) = with_field_fallback(g.field_guarded, |no_field| {
        advice_clang(&inc, &["-fsyntax-only", "-fno-caret-diagnostics", "-fno-diagnostics-fixit-info"], no_field, cflags)
            .arg(&c)
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run clang-14: {e} (scripts/install-deps.sh installs it)"))
    })?;
    let mut e = CErrors { in_aspect: Vec::new(), generated: Vec::new() };
    if out.status.success() {
        return Ok(e);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    for l in err.lines() {
        let Some((at, msg)) = l.split_once(": error: ").or_else(|| l.split_once(": fatal error: ")) else { continue };
        let (list, line) = match at.strip_prefix(aspect_name) {
            Some(rest) if rest.starts_with(':') => (&mut e.in_aspect, format!("{at}: {msg}")),
            _ => (&mut e.generated, msg.to_string()),
        };
        if !list.contains(&line) {
            list.push(line);
        }
    }
    if e.in_aspect.is_empty() && e.generated.is_empty() {
        e.generated.push(err.lines().next().unwrap_or("clang-14 failed").to_string());
    }
    Ok(e)
}

/// What to weave into which process, and how: `bunkai flow weave`'s
/// options (cmd/weave.rs).
pub struct WeaveOptions {
    /// The running program (built with `bunkai flow cc`, started with
    /// BUNKAI_HOST=1 and libbunkai-host.so and libbunkai-flow.so in
    /// LD_PRELOAD: `BUNKAI_HOST=1 LD_PRELOAD="libbunkai-host.so
    /// libbunkai-flow.so" ./server`)
    pub pid: u32,
    /// The aspect (XML)
    pub aspect: std::path::PathBuf,
    /// The module's name (default: flow_ASPECT); `unweave` takes it
    pub name: Option<String>,
    /// Extra flags for compiling the advice (e.g. -I and -include for the
    /// header structs xin/xout write)
    pub cflags: Option<String>,
    /// Keep the generated C and object here
    pub keep: Option<std::path::PathBuf>,
    /// Always save the vector registers around the advice. By default,
    /// advice that compiles with -mgeneral-regs-only and calls nothing but
    /// the flow runtime is woven with a trampoline that skips XSAVE/XRSTOR
    pub full_state: bool,
    /// Call the handler at every pass. By default a sled whose code is all
    /// filtered on a flow (xflow() advice on target(), transits, quits) is
    /// guarded: its guard returns at once when the key cannot be in the flow
    pub no_guard: bool,
    /// Say which trampoline the advice gets, and why; which sleds are guarded
    pub verbose: bool,
    /// Print what was woven as one JSON object on stdout
    pub json: bool,
    /// Weave only PID, not its descendants
    pub no_descendants: bool,
    /// Capacity of the record buffers the woven processes create, in bytes
    pub buffer_size: Option<u64>,
}

/// A size as BUNKAI_FLOW_BUF takes it: digits, then K, M, G or T (also KiB,
/// MiB...), powers of 1024.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let shift = match unit.trim_end_matches("iB").trim_end_matches('B') {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => bail!("size {s:?} is not a size (digits, then K, M, G or T: 256M, 4G)"),
    };
    let v: u64 = n.parse().map_err(|_| anyhow::anyhow!("size {s:?} is not a size (digits, then K, M, G or T: 256M, 4G)"))?;
    match v.checked_mul(1u64 << shift) {
        Some(b) if b >= 8192 && b <= 1u64 << 40 => Ok(b),
        _ => bail!("size {s:?} is out of range (8K to 1T)"),
    }
}

/// The record buffer process pid has already, and its size on disk
/// (sparse length), if any: $BUNKAI_FLOW_DIR from its environment, else
/// the default directory.
fn existing_buffer(pid: u32) -> Option<(std::path::PathBuf, u64)> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let dir = env
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"BUNKAI_FLOW_DIR=").filter(|d| !d.is_empty()))
        .map(|d| std::path::PathBuf::from(String::from_utf8_lossy(d).into_owned()))
        .unwrap_or_else(|| std::path::PathBuf::from("/dev/shm"));
    let p = dir.join(format!("bunkai-flow.{pid}.buf"));
    let len = std::fs::metadata(&p).ok()?.len();
    Some((p, len))
}

/// `bunkai flow unweave`'s options (cmd/unweave.rs).
pub struct UnweaveOptions {
    /// The process the aspect is woven into
    pub pid: u32,
    /// The woven module's name (default: the only flow_ module loaded)
    pub name: Option<String>,
    /// Print what was unwoven as one JSON object on stdout
    pub json: bool,
    /// Unweave only PID, not its descendants
    pub no_descendants: bool,
}

/// The load bias of the program's image in process pid: where its file
/// offset 0 is mapped, less the lowest PT_LOAD address.
fn load_bias(pid: u32, exe: &std::path::Path) -> Result<u64> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let data = std::fs::read(exe).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", exe.display()))?;
    let elf = ElfFile64::<object::Endianness>::parse(&*data).map_err(|e| anyhow::anyhow!("{}: {e}", exe.display()))?;
    let e = elf.endian();
    let lowest = elf
        .elf_program_headers()
        .iter()
        .filter(|p| p.p_type(e) == object::elf::PT_LOAD)
        .map(|p| p.p_vaddr(e) & !0xfff)
        .min()
        .unwrap_or(0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| anyhow::anyhow!("cannot read /proc/{pid}/maps: {e}"))?;
    let want = exe.to_string_lossy();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 6 && f[5] == want && u64::from_str_radix(f[2], 16) == Ok(0) {
            let start = u64::from_str_radix(f[0].split('-').next().unwrap_or(""), 16)?;
            return Ok(start - lowest);
        }
    }
    bail!("{} is not mapped in process {pid} (is it the program?)", exe.display())
}

/// Why process pid has no module socket, and what to do: the host library
/// not loaded, loaded but not started (BUNKAI_HOST=1 missing), or a fork
/// child whose own host did not start.
fn no_host(pid: u32, sock: &Path) -> String {
    let libdir = bunkai_common::install::helper_libdir().map(|d| d.display().to_string()).unwrap_or_else(|_| "build/lib/bunkai".into());
    let start = format!("BUNKAI_HOST=1 LD_PRELOAD=\"libbunkai-host.so libbunkai-flow.so\" (from {libdir})");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    if !maps.contains("libbunkai-host") {
        return format!("process {pid} has no module host: libbunkai-host.so is not loaded in it (start the program with {start})");
    }
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let host_on = env.split(|&b| b == 0).any(|v| v == b"BUNKAI_HOST=1");
    if !host_on {
        return format!("process {pid} loaded libbunkai-host.so but did not start its host: BUNKAI_HOST=1 is not in its environment (restart it with BUNKAI_HOST=1 beside its LD_PRELOAD, which is right)");
    }
    match ppid_of(pid) {
        Some(pp) if bunkai_mod::proto::default_socket(pp).exists() => format!(
            "process {pid} has no module socket {}: it is a fork child of process {pp}, which has one, but its own host did not start (its stderr says why) (a host on an explicit BUNKAI_HOST_SOCKET gives its fork children none: unset it, restart, and weave {pp} with its descendants)",
            sock.display()
        ),
        _ => format!(
            "process {pid} has the host library and BUNKAI_HOST=1 but no module socket {} (its host failed to start: see its stderr)",
            sock.display()
        ),
    }
}

/// The pid's parent, from /proc/PID/stat (the field after the state).
fn ppid_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// The state letter of process pid (R, S, Z...), None when it is gone.
fn state_of(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// Every running descendant of root (children, their children...), parents
/// before their children, from the ppid of each process in /proc.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut kids: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if let Some(pp) = ppid_of(pid) {
                if state_of(pid) != Some('Z') {
                    kids.entry(pp).or_default().push(pid);
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut queue = std::collections::VecDeque::from([root]);
    while let Some(p) = queue.pop_front() {
        let mut k = kids.remove(&p).unwrap_or_default();
        k.sort_unstable();
        for c in k {
            out.push(c);
            queue.push_back(c);
        }
    }
    out
}

/// Whether process pid has a host socket, waiting up to a second for one
/// when it has the host library and BUNKAI_HOST=1: a fork child's host
/// listens 100 ms after the fork (mod/host/fork.c).
fn await_socket(pid: u32) -> bool {
    let sock = bunkai_mod::proto::default_socket(pid);
    if sock.exists() {
        return true;
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    if !maps.contains("libbunkai-host") || !env.split(|&b| b == 0).any(|v| v == b"BUNKAI_HOST=1") {
        return false;
    }
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(1) && state_of(pid).is_some_and(|s| s != 'Z') {
        std::thread::sleep(std::time::Duration::from_millis(10));
        if bunkai_mod::proto::default_socket(pid).exists() {
            return true;
        }
    }
    false
}

/// Connects to process pid's host, saying in one line why not: the process
/// gone or a zombie (killed: its socket is left with no listener), or the
/// host refusing.
fn connect_host(pid: u32) -> Result<bunkai_mod::proto::Host> {
    let sock = bunkai_mod::proto::default_socket(pid);
    match state_of(pid) {
        None => bail!("no process {pid} (it has ended: what was woven into it went with it)"),
        Some('Z') => bail!("process {pid} is gone: it was killed or exited, and only its parent's wait is left (what was woven into it went with it)"),
        _ => {}
    }
    if !await_socket(pid) {
        bail!("{}", no_host(pid, &sock));
    }
    let host = bunkai_mod::proto::Host::connect(&sock).map_err(|e| {
        if state_of(pid).map_or(true, |s| s == 'Z') {
            anyhow::anyhow!("process {pid} is gone: it ended while we connected (what was woven into it went with it)")
        } else if format!("{e:#}").contains("Connection refused") {
            anyhow::anyhow!(
                "process {pid} runs but nothing listens on {}: a process of that pid died without removing its socket, and this one has no host (start it with BUNKAI_HOST=1 and the preload; remove the stale socket)",
                sock.display()
            )
        } else {
            e
        }
    })?;
    // the socket named after pid is that process's own: not a socket left
    // by a process that had the pid before, taken over by another listener
    let listener = host.peer_pid()?;
    if listener != pid {
        bail!(
            "{} is not process {pid}'s: process {listener} listens on it (a process that had pid {pid} before left it; nothing was sent)",
            sock.display()
        );
    }
    Ok(host)
}

/// The names of the modules loaded in a host.
fn loaded_names(host: &mut bunkai_mod::proto::Host) -> Result<Vec<String>> {
    let st = host.hello()?;
    Ok(bunkai_mod::server::loaded_modules(&st)?.into_iter().map(|m| m.rec.name).collect())
}

/// An advice module compiled for one image of the program (its load bias).
struct Built {
    object: std::path::PathBuf,
    sleds: usize,
    guarded: usize,
    trampoline: &'static str,
}

/// Generates the advice module for the program at `bias` and compiles it
/// into `dir` (vector-free when it can); `tag` tells one build's files from
/// another's.
fn build_module(a: &WeaveOptions, aspect: &Aspect, prog: &Program, bias: u64, module: &str, dir: &Path, tag: usize) -> Result<Built> {
    let g = generate(aspect, prog, bias, module)?;
    let c = dir.join(if tag == 0 { format!("{module}.c") } else { format!("{module}.{tag}.c") });
    let o = c.with_extension("o");
    std::fs::write(&c, g.named(&a.aspect.display().to_string(), &c.display().to_string()))?;
    let inc = bunkai_common::install::helper_libdir()?.join("include");
    // once built without field guards (see with_field_fallback), every
    // later compile of this module is too
    let no_field = std::cell::Cell::new(false);
    let compile_once = |extra: &[&str], nf: bool| -> Result<std::process::Output> {
        let mut cc = advice_clang(&inc, &["-O2", "-c", "-fno-stack-protector", "-fcf-protection=none"], nf, a.cflags.as_deref());
        cc.args(extra);
        if a.no_guard {
            cc.arg("-DBKF_NO_GUARD__");
        }
        if let Some(b) = a.buffer_size {
            cc.arg(format!("-DBKF_BUF_SIZE__={b}ull"));
        }
        cc.arg(&c).arg("-o").arg(&o).output().map_err(|e| anyhow::anyhow!("cannot run clang-14: {e}"))
    };
    let compile = |extra: &[&str]| -> Result<std::process::Output> {
        let guards = if a.no_guard || no_field.get() { 0 } else { g.field_guarded };
        let (out, nf) = with_field_fallback(guards, |nf| compile_once(extra, nf || no_field.get()))?;
        if nf {
            no_field.set(true);
        }
        Ok(out)
    };
    // First try a vector-free module: the trampoline then skips XSAVE/XRSTOR.
    let why_full = if a.full_state {
        Some("--full-state".to_string())
    } else if g.needs_xsave {
        Some("the advice reads a variable kept in an %xmm register".to_string())
    } else {
        let out = compile(&["-mgeneral-regs-only", "-DBKF_WEAVE_FLAGS__=BKF_WEAVE_NO_VECTOR"])?;
        if !out.status.success() {
            Some("the advice does not compile with -mgeneral-regs-only (floating point?)".to_string())
        } else {
            vector_free_object(&std::fs::read(&o)?)?.map(|sym| format!("the advice calls {sym}, which may use vector registers"))
        }
    };
    if why_full.is_some() {
        let out = compile(&[])?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let first = err.lines().find(|l| l.contains("error")).unwrap_or("").trim();
            bail!("the advice does not compile: {first} (the C is kept with --keep DIR; xin/xout need the header struct: --cflags \"-include header.h\")");
        }
    }
    let verbose = a.verbose && tag == 0;
    if verbose {
        match &why_full {
            None => eprintln!("bunkai flow: the advice is vector-free: the trampoline skips XSAVE/XRSTOR"),
            Some(why) => eprintln!("bunkai flow: full-state trampoline (XSAVE/XRSTOR): {why}"),
        }
    }
    let trampoline = if why_full.is_some() { "full-state" } else { "vector-free" };
    let guarded = if a.no_guard {
        0
    } else if no_field.get() {
        g.guarded - g.field_guarded
    } else {
        g.guarded
    };
    if verbose {
        if a.no_guard {
            eprintln!("bunkai flow: no guards (--no-guard): every pass through a woven sled calls the handler");
        } else {
            eprintln!(
                "bunkai flow: {guarded} of {} sleds guarded (their code is filtered on a flow: the sled calls a guard that tests the key in its register against the flow's table, or an xout's header member for a flow ID, first); the others start flows, run actions or keep a key where a guard cannot test it, so every pass calls the handler",
                g.sleds.len()
            );
            if no_field.get() {
                eprintln!(
                    "bunkai flow: {} xout sleds unguarded: the module does not build with offsetof their header member (a bitfield?)",
                    g.field_guarded
                );
            }
        }
    }
    Ok(Built { object: o, sleds: g.sleds.len(), guarded, trampoline })
}

/// Loads a built module into process pid through its host; the runtime's
/// refusal (sleds another aspect holds) said in one line.
fn load_into(pid: u32, module: &str, object: &Path) -> Result<f64> {
    let mut host = connect_host(pid)?;
    let r = bunkai_mod::server::load(&mut host, &bunkai_mod::server::LoadOptions { file: object, dirs: vec![], replace: None, copy: false })
        .map_err(|e| {
            let text = format!("{e:#}");
            if text.contains("init function returned") {
                // the advice's init is bkf_weave_guarded: it refuses sleds
                // another weave holds
                anyhow::anyhow!(
                    "the runtime refused to patch the sleds {module} selects in process {pid}: another aspect is woven over some of them (bunkai flow unweave it first; `bunkai mod list --pid {pid}` shows what is loaded)"
                )
            } else {
                e
            }
        })?;
    Ok(r.total_us)
}

/// What weave did in one process of the tree.
struct Done {
    pid: u32,
    parent: Option<u32>,
    /// "woven", or "inherited" (forked from a woven process after the weave)
    how: &'static str,
    load_us: f64,
}

/// `bunkai flow weave --pid PID ASPECT.xml`: check the aspect against the
/// running program, generate the advice module, compile it with clang-14,
/// and load it through bunkai mod's loader; its init patches the sleds.
/// Then the same in every descendant of PID that runs the same program
/// with a host of its own (forked workers, a daemon's children), unless
/// --no-descendants; children forked after a process is woven have the
/// aspect already (fork copies the woven code and the host's table). All
/// or nothing: when one process refuses, the others are unwoven again.
pub fn weave(a: &WeaveOptions) -> Result<std::process::ExitCode> {
    let t0 = std::time::Instant::now();
    if state_of(a.pid).is_none() {
        bail!("no process {} to weave into (check the pid)", a.pid);
    }
    let exe = std::fs::read_link(format!("/proc/{}/exe", a.pid))
        .map_err(|e| anyhow::anyhow!("cannot read /proc/{}/exe: {e} (weave as the process's owner or root)", a.pid))?;
    let exe_s = exe.to_string_lossy().to_string();
    let (aspect, prog, module) = checked_aspect(&a.aspect, &exe_s, a.name.as_deref())?;
    {
        // woven already under this name: say how to take it out, before any work
        let mut host = connect_host(a.pid)?;
        if loaded_names(&mut host)?.contains(&module) {
            bail!(
                "{module} is woven into process {} already (take it out first: bunkai flow unweave --pid {} --name {module}; or weave this one under another --name)",
                a.pid,
                a.pid
            );
        }
    }
    let bias = load_bias(a.pid, &exe)?;
    let tmp = tempfile::Builder::new().prefix("bunkai-weave").tempdir()?;
    let dir = a.keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let root = build_module(a, &aspect, &prog, bias, &module, &dir, 0)?;
    let kept = a.buffer_size.and_then(|_| existing_buffer(a.pid));
    let mut builds: Vec<(u64, std::path::PathBuf)> = vec![(bias, root.object.clone())];
    let mut done = vec![Done { pid: a.pid, parent: None, how: "woven", load_us: load_into(a.pid, &module, &root.object)? }];
    let mut skipped: Vec<(u32, String)> = Vec::new();
    if !a.no_descendants {
        if let Err(e) = weave_descendants(a, &aspect, &prog, &module, &exe_s, &dir, &mut builds, &mut done, &mut skipped) {
            // the whole tree again, not only what was woven: a woven worker
            // may have forked meanwhile
            let t = unload_tree(a.pid, &module, None);
            let undone: Vec<String> = t.done.iter().map(|d| d.0.to_string()).collect();
            let undone = if undone.is_empty() { "none".into() } else { undone.join(", ") };
            if t.failed.is_empty() && t.unchecked.is_empty() {
                bail!("{e:#} (nothing is left woven: unwoven again from {undone})");
            }
            let left: Vec<String> = t.failed.iter().cloned().chain(t.unchecked.iter().map(|p| format!("{p}: its host did not answer"))).collect();
            bail!("{e:#} (unwoven again from {undone}, but maybe not from {}: bunkai flow unweave --pid P for each)", left.join("; "));
        }
    }
    if a.json {
        let procs: Vec<serde_json::Value> = done
            .iter()
            .map(|d| serde_json::json!({"pid": d.pid, "parent": d.parent, "how": d.how, "load_us": d.load_us}))
            .collect();
        let skip: Vec<serde_json::Value> = skipped.iter().map(|(p, why)| serde_json::json!({"pid": p, "why": why})).collect();
        let o = serde_json::json!({
            "woven": module, "pid": a.pid, "program": exe_s, "sleds": root.sleds, "guarded": root.guarded,
            "trampoline": root.trampoline, "load_us": done[0].load_us, "total_ms": t0.elapsed().as_secs_f64() * 1e3,
            "processes": procs, "skipped": skip, "buffer_size": a.buffer_size,
            "buffer_kept": kept.as_ref().map(|k| k.0.display().to_string()),
        });
        crate::stdout(&format!("{o}\n"))?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let mut out = format!(
        "bunkai flow: woven {module} into {} ({}): {} sled{} ({} guarded), {} trampoline, loaded in {:.0} us, {:.1} ms in all\n",
        a.pid,
        exe_s,
        root.sleds,
        if root.sleds == 1 { "" } else { "s" },
        root.guarded,
        root.trampoline,
        done[0].load_us,
        t0.elapsed().as_secs_f64() * 1e3
    );
    for d in &done[1..] {
        let parent = d.parent.map(|p| format!("child of {p}")).unwrap_or_default();
        if d.how == "inherited" {
            out += &format!("bunkai flow:   {} ({parent}): has it already, forked after its parent was woven\n", d.pid);
        } else {
            out += &format!("bunkai flow:   {} ({parent}): woven, loaded in {:.0} us\n", d.pid, d.load_us);
        }
    }
    for (p, why) in &skipped {
        out += &format!("bunkai flow:   {p}: not woven: {why}\n");
    }
    if let Some((path, len)) = &kept {
        out += &format!(
            "bunkai flow: {} has its buffer already ({}, {} MiB) and keeps it: --buffer-size applies to buffers made from now on (its new workers'; `bunkai flow clean` and a restart give it a new one)\n",
            a.pid,
            path.display(),
            len >> 20
        );
    }
    if done.len() > 1 || !skipped.is_empty() {
        out += &format!("bunkai flow: {} process{} woven ({} skipped)\n", done.len(), if done.len() == 1 { "" } else { "es" }, skipped.len());
    }
    crate::stdout(&out)?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// Weaves every descendant of a.pid that runs the same program and has a
/// host, until a scan finds none left (a process may fork while we weave).
#[allow(clippy::too_many_arguments)]
fn weave_descendants(
    a: &WeaveOptions,
    aspect: &Aspect,
    prog: &Program,
    module: &str,
    exe_s: &str,
    dir: &Path,
    builds: &mut Vec<(u64, std::path::PathBuf)>,
    done: &mut Vec<Done>,
    skipped: &mut Vec<(u32, String)>,
) -> Result<()> {
    for _round in 0..8 {
        let mut new = 0;
        for pid in descendants(a.pid) {
            if done.iter().any(|d| d.pid == pid) || skipped.iter().any(|s| s.0 == pid) {
                continue;
            }
            let parent = ppid_of(pid);
            let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else { continue }; // ended meanwhile
            if exe.to_string_lossy() != exe_s {
                skipped.push((pid, format!("it runs {}, not {exe_s} (weave it on its own)", exe.display())));
                continue;
            }
            let sock = bunkai_mod::proto::default_socket(pid);
            if !await_socket(pid) {
                if state_of(pid).is_some() {
                    skipped.push((pid, no_host(pid, &sock)));
                }
                continue;
            }
            new += 1;
            let mut host = match connect_host(pid) {
                Ok(h) => h,
                Err(_) if state_of(pid).map_or(true, |s| s == 'Z') => continue, // ended meanwhile
                Err(e) => return Err(e.context(format!("process {pid}, a descendant of {}", a.pid))),
            };
            // A worker may end at any moment (MaxConnectionsPerChild): one
            // that is gone is passed over, not a reason to undo the weave.
            let gone = |pid: u32| state_of(pid).map_or(true, |s| s == 'Z');
            let names = match loaded_names(&mut host) {
                Ok(n) => n,
                Err(_) if gone(pid) => continue,
                Err(e) => return Err(e.context(format!("process {pid}, a descendant of {}", a.pid))),
            };
            if names.iter().any(|n| n == module) {
                done.push(Done { pid, parent, how: "inherited", load_us: 0.0 });
                continue;
            }
            drop(host);
            let bias = match load_bias(pid, &exe) {
                Ok(b) => b,
                Err(_) if gone(pid) => continue,
                Err(e) => return Err(e),
            };
            let object = match builds.iter().find(|b| b.0 == bias) {
                Some(b) => b.1.clone(),
                None => {
                    let b = build_module(a, aspect, prog, bias, module, dir, builds.len())?;
                    builds.push((bias, b.object.clone()));
                    b.object
                }
            };
            match load_into(pid, module, &object) {
                Ok(us) => done.push(Done { pid, parent, how: "woven", load_us: us }),
                Err(_) if state_of(pid).map_or(true, |s| s == 'Z') => continue,
                Err(e) => bail!("weaving into process {pid}, a descendant of {}: {e:#}", a.pid),
            }
        }
        if new == 0 {
            return Ok(());
        }
    }
    Ok(())
}

/// What taking a module out of a process tree did.
#[derive(Default)]
struct TreeUnload {
    /// (pid, parent, unload µs), the root first.
    done: Vec<(u32, Option<u32>, f64)>,
    /// Processes that have it and refused to unload it.
    failed: Vec<String>,
    /// Descendants running the root's program whose host did not answer:
    /// they may still have it.
    unchecked: Vec<u32>,
}

/// Unloads `module` from `root` (already done when `root_done` is given)
/// and from its descendants, scanning the tree again until a scan finds no
/// process that has it: a woven worker may fork a new one (which inherits
/// the module) while the tree is being walked.
fn unload_tree(root: u32, module: &str, root_done: Option<f64>) -> TreeUnload {
    let mut t = TreeUnload::default();
    match root_done {
        Some(us) => t.done.push((root, None, us)),
        None => match connect_host(root).and_then(|mut h| bunkai_mod::server::unload(&mut h, module, false)) {
            Ok(r) => t.done.push((root, None, r.total_us)),
            Err(_) if state_of(root).map_or(true, |s| s == 'Z') => {}
            Err(e) => t.failed.push(format!("{root}: {e:#}")),
        },
    }
    let exe = std::fs::read_link(format!("/proc/{root}/exe")).ok();
    for _round in 0..8 {
        let mut found = 0;
        t.unchecked.clear();
        for pid in descendants(root) {
            if t.done.iter().any(|d| d.0 == pid) {
                continue;
            }
            let same_program = exe.is_some() && std::fs::read_link(format!("/proc/{pid}/exe")).ok() == exe;
            let gone = || state_of(pid).map_or(true, |s| s == 'Z');
            let Some(mut h) = (if await_socket(pid) { connect_host(pid).ok() } else { None }) else {
                if same_program && !gone() {
                    t.unchecked.push(pid);
                }
                continue;
            };
            match loaded_names(&mut h) {
                Ok(n) if n.iter().any(|n| n == module) => {}
                Ok(_) => continue,
                Err(_) => {
                    if !gone() {
                        t.unchecked.push(pid);
                    }
                    continue;
                }
            }
            found += 1;
            match bunkai_mod::server::unload(&mut h, module, false) {
                Ok(r) => t.done.push((pid, ppid_of(pid), r.total_us)),
                Err(_) if gone() => {}
                Err(e) => {
                    if !t.failed.iter().any(|f| f.starts_with(&format!("{pid}:"))) {
                        t.failed.push(format!("{pid}: {e:#}"));
                    }
                }
            }
        }
        if found == 0 {
            break;
        }
    }
    t
}

/// `bunkai flow unweave --pid PID [NAME]`: unload the module from PID and
/// from every descendant that has it (a woven worker's own children
/// inherited it); each module's exit unpatches the sleds and returns when
/// no advice runs.
pub fn unweave(a: &UnweaveOptions) -> Result<std::process::ExitCode> {
    let mut host = connect_host(a.pid)?;
    let names = loaded_names(&mut host)?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => {
            let woven: Vec<&String> = names.iter().filter(|n| n.starts_with("flow_")).collect();
            match woven.as_slice() {
                [one] => (*one).clone(),
                [] => bail!("nothing is woven into process {}", a.pid),
                _ => bail!(
                    "several aspects are woven into process {}: {} (name one)",
                    a.pid,
                    woven.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
    };
    let r = bunkai_mod::server::unload(&mut host, &name, false)?;
    drop(host);
    let t = if a.no_descendants {
        TreeUnload { done: vec![(a.pid, None, r.total_us)], ..Default::default() }
    } else {
        unload_tree(a.pid, &name, Some(r.total_us))
    };
    let done = &t.done;
    if !t.failed.is_empty() {
        bail!(
            "unwoven {name} from {}, but not from {} (bunkai flow unweave --pid P --no-descendants for each)",
            done.iter().map(|d| d.0.to_string()).collect::<Vec<_>>().join(", "),
            t.failed.join("; ")
        );
    }
    // Descendants of the same program whose host did not answer may still
    // have it: said, not passed over in silence.
    let unchecked = t.unchecked.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    if a.json {
        let procs: Vec<serde_json::Value> =
            done.iter().map(|d| serde_json::json!({"pid": d.0, "parent": d.1, "unload_us": d.2})).collect();
        let o = serde_json::json!({ "unwoven": name, "pid": a.pid, "unload_us": done[0].2, "processes": procs, "unchecked": t.unchecked });
        crate::stdout(&format!("{o}\n"))?;
    } else {
        let mut out = format!("bunkai flow: unwoven {name} from {} in {:.0} us\n", a.pid, done[0].2);
        for d in &done[1..] {
            out += &format!("bunkai flow:   {} (child of {}): unwoven in {:.0} us\n", d.0, d.1.unwrap_or(0), d.2);
        }
        if done.len() > 1 {
            out += &format!("bunkai flow: {} processes unwoven\n", done.len());
        }
        if !unchecked.is_empty() {
            out += &format!(
                "bunkai flow: not checked: {} (descendants of the same program whose host did not answer: they may still have {name})\n",
                unchecked.join(", ")
            );
        }
        crate::stdout(&out)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    /// Sizes as BUNKAI_FLOW_BUF takes them; anything else one line.
    #[test]
    fn buffer_sizes() {
        for (s, want) in [("64M", 64u64 << 20), ("1G", 1 << 30), ("256MiB", 256 << 20), ("16K", 16 << 10), ("8192", 8192), ("2T", 0)] {
            match super::parse_size(s) {
                Ok(v) => assert_eq!(v, want, "{s}"),
                Err(e) => assert!(want == 0 && e.to_string().contains("out of range"), "{s}: {e}"),
            }
        }
        for bad in ["", "M", "12X", "-1", "1.5G", "4096"] {
            let e = super::parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("not a size") || e.contains("out of range"), "{bad}: {e}");
        }
    }
}
