//! `bunkai share node`: the daemon on each host other than the home host
//! (node.rs).

use crate::node::{self, NodeOptions};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Run the daemon that starts replicas on a node
///
/// Run the node daemon: it starts replicas of the programs that `bunkai
/// share run` shares from other hosts, for peers that prove they hold the
/// cluster key, and kills them when the run ends.
#[derive(clap::Args, Debug)]
#[command(after_help = "On startup the node prints `listening on IP:PORT` on stdout; it logs each run \
and each refused connection on stderr. Programs, their libraries and bunkai itself must be at the \
same paths on every host, and every host holds the same key (`bunkai share key`).\n\n\
Examples:\n  \
  bunkai share node --listen 10.0.0.2:7000\n  \
  bunkai share node --listen 10.0.0.2:7000 --user build\n  \
  bunkai share node --listen 127.0.0.1:0 --once")]
pub struct NodeArgs {
    /// Address to listen on, IP:PORT (port 0 picks a free one)
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// Serve one run (the first peer that authenticates), then exit
    #[arg(long)]
    pub once: bool,
    /// The cluster key (default: $BUNKAI_SHARE_KEY, else ~/.config/bunkai/share.key)
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Drop to this account after reading the key and binding the port:
    /// replicas run as it (for a node started as root)
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
}

pub fn run(a: NodeArgs) -> Result<ExitCode> {
    let NodeArgs { listen, once, key, user } = a;
    node::run(&NodeOptions { listen, once, key, user })
}
