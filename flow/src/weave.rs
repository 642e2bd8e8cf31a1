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
        Some(p) => bunkai_common::files::write_atomic(p, g.source.as_bytes())?,
        None => crate::stdout(&g.source)?,
    }
    Ok(std::process::ExitCode::SUCCESS)
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
}

/// `bunkai flow unweave`'s options (cmd/unweave.rs).
pub struct UnweaveOptions {
    /// The process the aspect is woven into
    pub pid: u32,
    /// The woven module's name (default: the only flow_ module loaded)
    pub name: Option<String>,
    /// Print what was unwoven as one JSON object on stdout
    pub json: bool,
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
/// not loaded, loaded but not started (BUNKAI_HOST=1 missing), or started
/// in another process (a forked child has no socket of its own).
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
        return format!("process {pid} loaded libbunkai-host.so but did not start its host: BUNKAI_HOST=1 is not in its environment (start the program with {start})");
    }
    let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok()));
    match ppid {
        Some(pp) if bunkai_mod::proto::default_socket(pp).exists() => format!(
            "process {pid} has no module socket {}: it is a forked child of process {pp}, whose host it shares no socket with (weave {pp}; forked workers get no host of their own yet, docs/flow.md)",
            sock.display()
        ),
        _ => format!(
            "process {pid} has the host library and BUNKAI_HOST=1 but no module socket {} (a forked child, or its host failed to start: see its stderr)",
            sock.display()
        ),
    }
}

/// `bunkai flow weave --pid PID ASPECT.xml`: check the aspect against the
/// running program, generate the advice module, compile it with clang-14,
/// and load it through bunkai mod's loader; its init patches the sleds.
pub fn weave(a: &WeaveOptions) -> Result<std::process::ExitCode> {
    let t0 = std::time::Instant::now();
    let exe = std::fs::read_link(format!("/proc/{}/exe", a.pid))
        .map_err(|e| anyhow::anyhow!("no process {} to weave into ({e}) (check the pid)", a.pid))?;
    let exe_s = exe.to_string_lossy().to_string();
    let (aspect, prog, module) = checked_aspect(&a.aspect, &exe_s, a.name.as_deref())?;
    let sock = bunkai_mod::proto::default_socket(a.pid);
    if !sock.exists() {
        bail!("{}", no_host(a.pid, &sock));
    }
    {
        // woven already under this name: say how to take it out, before any work
        let mut host = bunkai_mod::proto::Host::connect(&sock)?;
        let st = host.hello()?;
        if bunkai_mod::server::loaded_modules(&st)?.iter().any(|m| m.rec.name == module) {
            bail!(
                "{module} is woven into process {} already (take it out first: bunkai flow unweave --pid {} --name {module}; or weave this one under another --name)",
                a.pid,
                a.pid
            );
        }
    }
    let bias = load_bias(a.pid, &exe)?;
    let g = generate(&aspect, &prog, bias, &module)?;
    let tmp = tempfile::Builder::new().prefix("bunkai-weave").tempdir()?;
    let dir = a.keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let c = dir.join(format!("{module}.c"));
    let o = dir.join(format!("{module}.o"));
    std::fs::write(&c, &g.source)?;
    let inc = bunkai_common::install::helper_libdir()?.join("include");
    // an xout's guard needs offsetof its header member, which a bitfield
    // has not: then those sleds are woven unguarded
    let no_field = std::cell::Cell::new(false);
    let compile_once = |extra: &[&str]| -> Result<std::process::Output> {
        let mut cc = std::process::Command::new("clang-14");
        cc.args(["-O2", "-c", "-fno-stack-protector", "-fcf-protection=none"]).arg(format!("-I{}", inc.display()));
        cc.args(extra);
        if a.no_guard {
            cc.arg("-DBKF_NO_GUARD__");
        }
        if no_field.get() {
            cc.arg("-DBKF_NO_FIELD_GUARD__");
        }
        if let Some(f) = &a.cflags {
            cc.args(f.split_whitespace());
        }
        cc.arg(&c).arg("-o").arg(&o).output().map_err(|e| anyhow::anyhow!("cannot run clang-14: {e}"))
    };
    let compile = |extra: &[&str]| -> Result<std::process::Output> {
        let out = compile_once(extra)?;
        if out.status.success() || a.no_guard || g.field_guarded == 0 || no_field.get() {
            return Ok(out);
        }
        no_field.set(true);
        let again = compile_once(extra)?;
        if again.status.success() {
            return Ok(again);
        }
        no_field.set(false);
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
    if a.verbose {
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
    if a.verbose {
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
    let mut host = bunkai_mod::proto::Host::connect(&sock)?;
    let r = bunkai_mod::server::load(&mut host, &bunkai_mod::server::LoadOptions { file: &o, dirs: vec![], replace: None, copy: false })
        .map_err(|e| {
            let text = format!("{e:#}");
            if text.contains("init function returned") {
                // the advice's init is bkf_weave_guarded: it refuses sleds
                // another weave holds
                anyhow::anyhow!(
                    "the runtime refused to patch the sleds {module} selects: another aspect is woven over some of them (bunkai flow unweave it first; `bunkai mod list --pid {}` shows what is loaded)",
                    a.pid
                )
            } else {
                e
            }
        })?;
    if a.json {
        let o = serde_json::json!({
            "woven": module, "pid": a.pid, "program": exe_s, "sleds": g.sleds.len(), "guarded": guarded,
            "trampoline": trampoline, "load_us": r.total_us, "total_ms": t0.elapsed().as_secs_f64() * 1e3,
        });
        crate::stdout(&format!("{o}\n"))?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    println!(
        "bunkai flow: woven {module} into {} ({}): {} sled{} ({guarded} guarded), {trampoline} trampoline, loaded in {:.0} us, {:.1} ms in all",
        a.pid,
        exe_s,
        g.sleds.len(),
        if g.sleds.len() == 1 { "" } else { "s" },
        r.total_us,
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// `bunkai flow unweave --pid PID [NAME]`: unload the module; its exit
/// unpatches the sleds and returns when no advice runs.
pub fn unweave(a: &UnweaveOptions) -> Result<std::process::ExitCode> {
    let sock = bunkai_mod::proto::default_socket(a.pid);
    if !Path::new(&format!("/proc/{}", a.pid)).exists() {
        bail!("no process {} (it has ended: what was woven into it went with it)", a.pid);
    }
    if !sock.exists() {
        bail!("{}", no_host(a.pid, &sock));
    }
    let mut host = bunkai_mod::proto::Host::connect(&sock)?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => {
            let st = host.hello()?;
            let woven: Vec<String> =
                bunkai_mod::server::loaded_modules(&st)?.into_iter().map(|m| m.rec.name).filter(|n| n.starts_with("flow_")).collect();
            match woven.as_slice() {
                [one] => one.clone(),
                [] => bail!("nothing is woven into process {}", a.pid),
                _ => bail!("several aspects are woven into process {}: {} (name one)", a.pid, woven.join(", ")),
            }
        }
    };
    let r = bunkai_mod::server::unload(&mut host, &name, false)?;
    if a.json {
        let o = serde_json::json!({ "unwoven": name, "pid": a.pid, "unload_us": r.total_us });
        crate::stdout(&format!("{o}\n"))?;
    } else {
        println!("bunkai flow: unwoven {name} from {} in {:.0} us", a.pid, r.total_us);
    }
    Ok(std::process::ExitCode::SUCCESS)
}
