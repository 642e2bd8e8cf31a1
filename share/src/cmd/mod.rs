//! `bunkai share` and its verbs: the command-line arguments of each verb
//! and the function that runs it, one file a verb. The crate's other
//! modules know nothing of clap.

pub mod hosts;
pub mod key;
pub mod node;
pub mod run;

use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Make a key once and copy it to every host, start a node on each other host, \
then run the program from the home host:\n  \
  bunkai share key\n  \
  scp -p ~/.config/bunkai/share.key node1:.config/bunkai/share.key\n  \
  bunkai share node --listen 10.0.0.2:7000          (on each node)\n  \
  bunkai share run --nodes 10.0.0.2:7000,10.0.0.3:7000 -- pigz -p 3 big.tar")]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    Key(key::KeyArgs),
    Run(run::RunArgs),
    Node(node::NodeArgs),
    Hosts(hosts::HostsArgs),
}

impl Args {
    /// Whether the verb runs a program that keeps stdout and gets Ctrl-C:
    /// `run` passes SIGINT and SIGTERM to the program (it reads them from a
    /// signalfd, so no other handler may be installed) and prints its
    /// --json summary on stderr.
    pub fn runs_a_program(&self) -> bool {
        matches!(self.cmd, Cmd::Run(_))
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.cmd {
        Cmd::Key(a) => key::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Node(a) => node::run(a),
        Cmd::Hosts(a) => hosts::run(a),
    }
}
