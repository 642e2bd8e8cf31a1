//! `bunkai share run`: one program across the home host and the nodes
//! (run.rs). The names `--place` takes are here (`Place` is the runtime's
//! `<place>`, launch.rs).

use crate::launch::Place;
use crate::run::{self, RunOptions};
use anyhow::Result;
use clap::builder::PossibleValue;
use std::process::ExitCode;

/// Run a program across the home host and the nodes
///
/// Run one unmodified multithreaded program across several hosts: its
/// threads are placed on the home host and the nodes, its memory is shared
/// page by page, and the nodes' threads make their system calls at home.
#[derive(clap::Args, Debug)]
#[command(override_usage = "bunkai share run --nodes ADDR,... [OPTIONS] -- PROGRAM [ARGS]...", after_help = "Start `bunkai share node --listen ADDR` on each node first. The program, its \
libraries and bunkai must be at the same paths on every host, and every host must hold the same \
key (`bunkai share key`, then copy ~/.config/bunkai/share.key). The program's output is the home \
host's; `-v` and `--json` write to stderr.\n\n\
Examples:\n  \
  bunkai share run --nodes 10.0.0.2:7000,10.0.0.3:7000 -- pigz -p 3 -k big.tar\n  \
  bunkai share run --nodes 10.0.0.2:7000 --place remote -v -- ./threads 4")]
pub struct RunArgs {
    /// The nodes, HOST:PORT, comma-separated; node i is host i (1-based)
    #[arg(long, value_name = "ADDR,...")]
    pub nodes: Option<String>,
    /// Where the program's threads go: rr (round robin over home and the
    /// nodes, also "round-robin"), remote (the nodes only), home (all at
    /// home: sharing set up, nothing moves)
    #[arg(long, value_enum, default_value = "rr", value_name = "PLACE", hide_possible_values = true)]
    pub place: Place,
    /// Address for the replicas to reach this host, IP or IP:PORT (default:
    /// all addresses, a free port; each node is told the address it was
    /// reached from)
    #[arg(long, value_name = "IP")]
    pub listen: Option<String>,
    /// Print a summary as one JSON object on stderr (exit status, wall time,
    /// per-host counters, threads)
    #[arg(long)]
    pub json: bool,
    /// Print the replicas as they start, then the thread management table
    /// and per-host counters, on stderr
    #[arg(short, long)]
    pub verbose: bool,
    /// The cluster key (default: $BUNKAI_SHARE_KEY, else ~/.config/bunkai/share.key)
    #[arg(long, value_name = "FILE")]
    pub key: Option<std::path::PathBuf>,
    /// The program and its arguments, after `--`
    #[arg(trailing_var_arg = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

pub fn run(a: RunArgs) -> Result<ExitCode> {
    let RunArgs { nodes, place, listen, json, verbose, key, command } = a;
    run::run(&RunOptions { nodes, place, listen, json, verbose, key, command })
}

impl clap::ValueEnum for Place {
    fn value_variants<'a>() -> &'a [Self] {
        &[Place::RoundRobin, Place::Remote, Place::Home]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            Place::RoundRobin => PossibleValue::new("rr")
                .alias("round-robin")
                .help("Round robin over the home host and the nodes; the first thread the program creates goes to node 1"),
            Place::Remote => PossibleValue::new("remote").help("Round robin over the nodes only"),
            Place::Home => {
                PossibleValue::new("home").help("Every thread on the home host (sharing is set up, nothing moves)")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn place_names() {
        let p = |s| Place::from_str(s, false);
        assert_eq!(p("rr"), Ok(Place::RoundRobin));
        assert_eq!(p("round-robin"), Ok(Place::RoundRobin));
        assert_eq!(p("remote"), Ok(Place::Remote));
        assert_eq!(p("home"), Ok(Place::Home));
        assert!(p("everywhere").is_err());
        for pl in [Place::RoundRobin, Place::Remote, Place::Home] {
            assert_eq!(p(pl.as_str()), Ok(pl));
        }
    }
}
