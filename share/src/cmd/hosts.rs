//! `bunkai share hosts up|down|clean`: the netns harness (netns.rs) for
//! benchmarks written in Python or shell.
//!
//! ```text
//! $ bunkai share hosts up 2 --owner $$ --json
//! {"home":"bk-share-4100-0-0","nodes":[{"addr":"10.210.1.2","home_addr":"10.210.1.1","host":1,"netns":"bk-share-4100-0-1"},...],"owner":4100}
//! $ ip netns exec bk-share-4100-0-1 bunkai share node --listen 10.210.1.2:7000 &
//! $ ip netns exec bk-share-4100-0-0 bunkai share run --nodes 10.210.1.2:7000,... -- prog
//! $ bunkai share hosts down --owner $$
//! ```
//!
//! The namespaces belong to an owner process (default: the caller of
//! bunkai, i.e. its parent); once the owner is gone they are stale and the
//! next `up` (or `clean`, or any test creating hosts) removes them.

use crate::netns::{self, Hosts};
use anyhow::Result;
use std::process::ExitCode;

/// Hosts as network namespaces, for tests and benchmarks (root)
///
/// Hosts as network namespaces joined by veth, for tests and benchmarks
/// (needs root).
#[derive(clap::Args, Debug)]
pub struct HostsArgs {
    #[command(subcommand)]
    cmd: HostsCmd,
}

#[derive(clap::Subcommand, Debug)]
enum HostsCmd {
    /// Create a home namespace and N node namespaces
    ///
    /// Create a home namespace and N node namespaces, a veth from home to
    /// each node (node k: 10.X.k.2, home's end 10.X.k.1).
    Up {
        /// Number of nodes (1-15)
        #[arg(value_name = "N")]
        nodes: usize,
        /// The process the namespaces belong to; they are removed as stale
        /// once it is gone (default: bunkai's parent; from `$(...)` in a
        /// shell script, pass --owner $$)
        #[arg(long, value_name = "PID")]
        owner: Option<u32>,
        /// Print the namespaces and addresses as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Kill what runs in an owner's namespaces and delete them
    Down {
        /// Whose namespaces (default: bunkai's parent)
        #[arg(long, value_name = "PID")]
        owner: Option<u32>,
    },
    /// Delete the namespaces whose owner is gone
    Clean,
}

pub fn run(a: HostsArgs) -> Result<ExitCode> {
    if !crate::sys::is_root() {
        anyhow::bail!("network namespaces need root (run as root)");
    }
    match &a.cmd {
        HostsCmd::Up { nodes, owner, json } => {
            let owner = owner.unwrap_or_else(crate::sys::parent_pid);
            let h = Hosts::with_owner(*nodes, owner)?;
            if *json {
                println!("{}", h.to_json(owner));
            } else {
                println!("home    {}", h.name(0));
                for k in 1..=h.nodes() {
                    println!("node {k:<2} {}  {}  (home's end {})", h.name(k), h.node_ip(k), h.home_ip(k));
                }
            }
            h.keep();
        }
        HostsCmd::Down { owner } => {
            let owner = owner.unwrap_or_else(crate::sys::parent_pid);
            for n in netns::remove_owner(owner) {
                eprintln!("bunkai share: removed {n}");
            }
        }
        HostsCmd::Clean => {
            for n in netns::clean_stale() {
                eprintln!("bunkai share: removed {n}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
