//! `bunkai share`: run one multithreaded process across several hosts
//! (the cluster key, the home host's driver, the node daemon, the netns
//! harness).

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
    cmd: ShareCmd,
}

#[derive(clap::Subcommand)]
enum ShareCmd {
    Key(bunkai_share::key::KeyArgs),
    Run(bunkai_share::run::RunArgs),
    Node(bunkai_share::node::NodeArgs),
    Hosts(bunkai_share::hosts::HostsArgs),
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        ShareCmd::Key(k) => bunkai_share::key::run(&k),
        ShareCmd::Run(r) => bunkai_share::run::run(&r),
        ShareCmd::Node(n) => bunkai_share::node::run(&n),
        ShareCmd::Hosts(h) => bunkai_share::hosts::run(&h),
    }
}
