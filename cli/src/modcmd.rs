//! `bunkai mod`: the DKM module server (thin driver over bunkai-mod).

use anyhow::{bail, Context, Result};
use bunkai_mod::{model, proto, server};
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
struct HostSel {
    /// The host's pid (its socket is $XDG_RUNTIME_DIR/bunkai-mod/PID.sock, or /tmp/bunkai-mod-UID/PID.sock)
    #[arg(long, value_name = "PID", global = true)]
    pid: Option<u32>,
    /// The host's socket (default: $BUNKAI_HOST_SOCKET, or the only running host)
    #[arg(long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Check, link and load a module (and the modules it requires) into a host
    Load {
        #[command(flatten)]
        host: HostSel,
        /// Directories searched for required modules (also $BUNKAI_MOD_PATH)
        #[arg(short = 'L', value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Print per-stage times and decisions
        #[arg(short, long)]
        verbose: bool,
        /// Copy the code through the socket instead of handing the host a memfd to map
        #[arg(long)]
        copy: bool,
        #[arg(long)]
        json: bool,
        /// A relocatable object (clang or gcc -c) declaring BUNKAI_MODULE
        #[arg(value_name = "MODULE.o")]
        module: PathBuf,
    },
    /// Replace a loaded module by another implementing the same interfaces, atomically
    Swap {
        #[command(flatten)]
        host: HostSel,
        #[arg(short = 'L', value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Copy the code through the socket instead of handing the host a memfd to map
        #[arg(long)]
        copy: bool,
        #[arg(long)]
        json: bool,
        /// The loaded module to replace
        #[arg(value_name = "OLD")]
        old: String,
        #[arg(value_name = "NEW.o")]
        module: PathBuf,
    },
    /// Unload a module: registrations removed, memory freed
    Unload {
        #[command(flatten)]
        host: HostSel,
        /// Also unload the modules that depend on it (dependents first)
        #[arg(long)]
        cascade: bool,
        #[arg(long)]
        json: bool,
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Modules loaded in a host
    List {
        #[command(flatten)]
        host: HostSel,
        #[arg(long)]
        json: bool,
    },
    /// What a module file declares and needs, without loading it
    Info {
        #[arg(long)]
        json: bool,
        #[arg(value_name = "MODULE.o")]
        module: PathBuf,
    },
    /// Predict a module's load time from its size (needs bunkai mod calibrate)
    Predict {
        /// Model file (default: ~/.cache/bunkai/mod-model.json)
        #[arg(long, value_name = "FILE")]
        model: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        #[arg(value_name = "MODULE.o")]
        module: PathBuf,
    },
    /// Fit the load-time model on this machine (loads modules of 1 KB to 4 MB)
    Calibrate {
        #[arg(long, value_name = "FILE")]
        model: Option<PathBuf>,
        /// Fewer sizes and repetitions
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        json: bool,
    },
    /// The evaluation: Table 1, measurement 2, prediction error, dlopen beside ours
    Bench {
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        json: bool,
        /// Also write the markdown tables here
        #[arg(long, value_name = "FILE")]
        markdown: Option<PathBuf>,
    },
}

fn pick_socket(h: &HostSel) -> Result<PathBuf> {
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

fn search_dirs(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("BUNKAI_MOD_PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs
}

fn print_load(r: &server::LoadReport, json: bool, verbose: bool) -> Result<()> {
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
        Cmd::Load { host, dirs, verbose, copy, json, module } => {
            let mut h = proto::Host::connect(&pick_socket(&host)?)?;
            let r = server::load(&mut h, &server::LoadOptions { file: &module, dirs: search_dirs(dirs), replace: None, copy })?;
            print_load(&r, json, verbose)?;
        }
        Cmd::Swap { host, dirs, copy, json, old, module } => {
            let mut h = proto::Host::connect(&pick_socket(&host)?)?;
            let r = server::load(
                &mut h,
                &server::LoadOptions { file: &module, dirs: search_dirs(dirs), replace: Some(&old), copy },
            )?;
            print_load(&r, json, false)?;
        }
        Cmd::Unload { host, cascade, json, name } => {
            let mut h = proto::Host::connect(&pick_socket(&host)?)?;
            let r = server::unload(&mut h, &name, cascade)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                for (n, t) in &r.unloaded {
                    eprintln!("bunkai mod: unloaded {n} in {t:.0} us");
                }
            }
        }
        Cmd::List { host, json } => {
            let mut h = proto::Host::connect(&pick_socket(&host)?)?;
            let st = h.hello()?;
            let mods = server::loaded_modules(&st)?;
            let odd = server::unreadable_records(&st);
            if json {
                let mut v: Vec<serde_json::Value> = mods
                    .iter()
                    .map(|m| serde_json::json!({"id": m.id, "address": m.addr, "bytes": m.bytes, "record": m.rec}))
                    .collect();
                for (id, why) in &odd {
                    let (_, addr, bytes, _) = st.modules.iter().find(|m| m.0 == *id).unwrap();
                    v.push(serde_json::json!({"id": id, "address": addr, "bytes": bytes, "record": null, "unreadable": why}));
                }
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "pid": st.pid, "budget": st.budget, "used": st.used,
                        "expects": st.expects.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                        "modules": v,
                    }))?
                );
            } else {
                println!(
                    "host {} ({}): {} modules, {} bytes{}",
                    st.pid,
                    h.path.display(),
                    mods.len() + odd.len(),
                    st.used,
                    if st.budget > 0 { format!(" of {}", st.budget) } else { String::new() }
                );
                for m in &mods {
                    let ifs: Vec<&str> = m.rec.implements.iter().map(|i| i.iface.name.as_str()).collect();
                    println!(
                        "  {:>3} {:<16} {:<6} {:>9} B at {:#x}  implements [{}]{}{}",
                        m.id,
                        m.rec.name,
                        m.rec.version,
                        m.bytes,
                        m.addr,
                        ifs.join(", "),
                        if m.rec.deps.is_empty() { String::new() } else { format!("  needs [{}]", m.rec.deps.join(", ")) },
                        if m.rec.auto { "  (dependency)" } else { "" }
                    );
                }
                for (id, why) in &odd {
                    let (_, addr, bytes, _) = st.modules.iter().find(|m| m.0 == *id).unwrap();
                    println!("  {id:>3} {:<16} {:<6} {bytes:>9} B at {addr:#x}  record unreadable: {why}", "?", "?");
                }
            }
        }
        Cmd::Info { json, module } => {
            let i = server::file_info(&module)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&i)?);
            } else {
                println!("{} {} ({})", i.meta.name, i.meta.version, i.file);
                println!("  {} B file, {} B code+data; needs {} B RX + {} B RW", i.file_bytes, i.payload, i.rx, i.rw);
                for imp in &i.meta.implements {
                    println!("  implements {} (hash {}): {}", imp.iface.name, imp.iface.hash, imp.symbols.join(", "));
                }
                for r in &i.meta.requires {
                    println!("  requires {} (hash {})", r.name, r.hash);
                }
                if !i.undefined.is_empty() {
                    println!("  symbols from outside: {}", i.undefined.join(", "));
                }
            }
        }
        Cmd::Predict { model: path, json, module } => {
            let m = model::Model::read(&path.unwrap_or_else(model::default_path))?;
            let i = server::file_info(&module)?;
            let us = m.predict(i.payload);
            if json {
                println!("{}", serde_json::json!({"module": i.meta.name, "payload": i.payload, "predicted_us": us}));
            } else {
                println!("{}: {} B code+data -> predicted load time {:.0} us", i.meta.name, i.payload, us);
            }
        }
        Cmd::Calibrate { model: path, quick, json } => {
            let path = path.unwrap_or_else(model::default_path);
            // where the model goes is checked before the minutes of work:
            // a directory, or a place we cannot write, is refused now
            if path.is_dir() {
                bail!("{} is a directory (give a file name, e.g. {})", path.display(), path.join("model.json").display());
            }
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let tmp = tempfile::Builder::new()
                .prefix(".bunkai-mod-model-")
                .tempfile_in(&dir)
                .with_context(|| format!("cannot write in {} (give --model a writable place)", dir.display()))?;
            let m = bunkai_mod::bench::calibrate(quick)?;
            std::fs::write(tmp.path(), serde_json::to_string_pretty(&m)?)?;
            tmp.persist(&path).map_err(|e| anyhow::anyhow!("cannot write {}: {}", path.display(), e.error))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&m)?);
            } else {
                eprintln!(
                    "bunkai mod: model written to {}: load = {:.3} us per 4 KB + {:.0} us (R² {:.3})",
                    path.display(),
                    m.total.slope,
                    m.total.intercept,
                    m.total.r2
                );
            }
        }
        Cmd::Bench { quick, json, markdown } => {
            bunkai_mod::bench::bench(quick, json, markdown.as_deref())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
