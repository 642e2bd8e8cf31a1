//! `bunkai mod` and its verbs: the command-line arguments of each verb and
//! the function that runs it, one file a verb; what several verbs share
//! (which host, where modules are searched, how a load is reported) is here.
//! The crate's other modules know nothing of clap.

pub mod bench;
pub mod calibrate;
pub mod info;
pub mod list;
pub mod load;
pub mod predict;
pub mod swap;
pub mod unload;

use crate::{proto, server};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  sched-host &                                   # a program linked with libbunkai-host
  bunkai mod load --pid 1234 -L mods mods/edf.o  # loads sched-util first (edf requires it)
  bunkai mod list
  bunkai mod swap edf mods/rr.o                  # atomic: no call sees half of each
  bunkai mod unload --cascade sched-util
  bunkai mod calibrate && bunkai mod predict mods/big.o")]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
pub struct HostSel {
    /// The host's pid (its socket is $XDG_RUNTIME_DIR/bunkai-mod/PID.sock, or /tmp/bunkai-mod-UID/PID.sock)
    #[arg(long, value_name = "PID", global = true)]
    pub pid: Option<u32>,
    /// The host's socket (default: $BUNKAI_HOST_SOCKET, or the only running host)
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Check, link and load a module (and the modules it requires) into a host
    Load(load::LoadArgs),
    /// Replace a loaded module by another implementing the same interfaces, atomically
    Swap(swap::SwapArgs),
    /// Unload a module: registrations removed, memory freed
    Unload(unload::UnloadArgs),
    /// Modules loaded in a host
    List(list::ListArgs),
    /// What a module file declares and needs, without loading it
    Info(info::InfoArgs),
    /// Predict a module's load time from its size (needs bunkai mod calibrate)
    Predict(predict::PredictArgs),
    /// Fit the load-time model on this machine (loads modules of 1 KB to 4 MB)
    Calibrate(calibrate::CalibrateArgs),
    /// The evaluation: Table 1, measurement 2, prediction error, dlopen beside ours
    Bench(bench::BenchArgs),
}

pub(crate) fn pick_socket(h: &HostSel) -> Result<PathBuf> {
    if let Some(s) = &h.socket {
        return Ok(s.clone());
    }
    if let Some(p) = h.pid {
        return Ok(proto::default_socket(p));
    }
    if let Some(s) = std::env::var_os("BUNKAI_HOST_SOCKET") {
        return Ok(PathBuf::from(s));
    }
    let hosts = proto::running_hosts()?;
    match hosts.len() {
        1 => Ok(hosts[0].clone()),
        0 => bail!(
            "no running host found in {} (start a program linked with libbunkai-host, or give --pid/--socket)",
            proto::default_dirs().iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or ")
        ),
        _ => bail!(
            "{} hosts are running: {} (choose one with --pid or --socket)",
            hosts.len(),
            hosts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

pub(crate) fn search_dirs(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("BUNKAI_MOD_PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs
}

pub(crate) fn print_load(r: &server::LoadReport, json: bool, verbose: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    if verbose {
        for l in &r.log {
            eprintln!("mod: {l}");
        }
    }
    for e in &r.evicted {
        eprintln!("bunkai mod: unloaded unneeded module {e} (host short of memory)");
    }
    for m in &r.modules {
        eprintln!(
            "bunkai mod: loaded {} (id {}){} {} B code+data in {:.0} us",
            m.name,
            m.id,
            if m.auto { " as a dependency," } else { "," },
            m.payload,
            m.stages.total
        );
        if verbose {
            let s = &m.stages;
            eprintln!(
                "mod:   check {:.0} deps {:.0} prelink {:.0} alloc {:.0} link {:.0} load {:.0} register {:.0} other {:.0} us",
                s.check, s.deps, s.prelink, s.alloc, s.link, s.load, s.register, s.other
            );
        }
    }
    if let Some(old) = &r.replaced {
        eprintln!("bunkai mod: {old} replaced and unloaded");
    }
    Ok(())
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.cmd {
        Cmd::Load(a) => load::run(a),
        Cmd::Swap(a) => swap::run(a),
        Cmd::Unload(a) => unload::run(a),
        Cmd::List(a) => list::run(a),
        Cmd::Info(a) => info::run(a),
        Cmd::Predict(a) => predict::run(a),
        Cmd::Calibrate(a) => calibrate::run(a),
        Cmd::Bench(a) => bench::run(a),
    }
}
