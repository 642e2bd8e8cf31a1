//! bunkai: take programs apart while they run.
//!
//! One module per subcommand; each is a thin driver over its subsystem's
//! library crate. Errors print as one line, `bunkai <subcommand>: <what>
//! (<fix>)`, and exit non-zero.

mod flow;
mod modbench;
mod modcmd;
mod scatter;
mod share;
mod trace;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "bunkai",
    version,
    about = "Take programs apart while they run",
    long_about = "bunkai takes Linux x86-64 programs apart while they run: it scatters a C \
program into per-function shared libraries, traces every instruction, shares one process \
across hosts, follows data flows with aspects, and loads code modules into running hosts.",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Split a C program into a launcher plus one shared library per function
    Scatter(scatter::ScatterArgs),
    /// Sizes of a scatter output beside the original (the paper's Tables 3 and 4)
    Stats(scatter::StatsArgs),
    /// Record the order in which a scattered program first calls its functions
    Profile(scatter::ProfileArgs),
    /// Link the functions of a scatter output into groups, in profile order (§5)
    Group(scatter::GroupArgs),
    /// Serve a grouped scatter output over HTTP
    Serve(scatter::ServeArgs),
    /// Run a scattered program from a URL, fetching its groups as it runs (§6)
    Run(scatter::RunArgs),
    /// Trace every instruction, memory reference and syscall (TURU)
    Trace(trace::Args),
    /// Run one multithreaded process across several hosts
    Share(share::Args),
    /// XenLASY: follow data through threads, processes and hosts: build with sleds, weave aspects in, report flows
    Flow(flow::Args),
    /// DKM: check, link and load code modules into a running host; unload, swap, predict
    Mod(modcmd::Args),
}

impl Cmd {
    fn name(&self) -> &'static str {
        match self {
            Cmd::Scatter(_) => "scatter",
            Cmd::Stats(_) => "stats",
            Cmd::Profile(_) => "profile",
            Cmd::Group(_) => "group",
            Cmd::Serve(_) => "serve",
            Cmd::Run(_) => "run",
            Cmd::Trace(_) => "trace",
            Cmd::Share(_) => "share",
            Cmd::Flow(_) => "flow",
            Cmd::Mod(_) => "mod",
        }
    }
}

/// Turns clap's multi-line usage errors into our one-line form.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let args: Vec<String> = std::env::args().collect();
    let sub = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .cloned()
        .unwrap_or_default();
    let text = e.to_string();
    let first = text
        .lines()
        .next()
        .unwrap_or("bad arguments")
        .trim_start_matches("error: ")
        .to_string();
    let known = [
        "scatter", "stats", "profile", "group", "serve", "run", "trace", "share", "flow", "mod",
    ];
    if known.contains(&sub.as_str()) {
        eprintln!("bunkai {sub}: {first} (see 'bunkai help {sub}')");
    } else {
        eprintln!("bunkai: {first} (see 'bunkai help')");
    }
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let name = cli.cmd.name();
    if matches!(cli.cmd, Cmd::Scatter(_) | Cmd::Group(_)) {
        bunkai_scatter::util::install_interrupt_cleanup(name);
    }
    let result = match cli.cmd {
        Cmd::Scatter(a) => scatter::run(a),
        Cmd::Stats(a) => scatter::stats(a),
        Cmd::Profile(a) => scatter::profile(a),
        Cmd::Group(a) => scatter::group(a),
        Cmd::Serve(a) => scatter::serve(a),
        Cmd::Run(a) => scatter::run_remote(a),
        Cmd::Mod(a) => modcmd::run(a),
        Cmd::Trace(a) => trace::run(a),
        Cmd::Share(a) => share::run(a),
        Cmd::Flow(a) => flow::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("bunkai {name}: {msg}");
            ExitCode::from(1)
        }
    }
}
