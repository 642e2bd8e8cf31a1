//! `bunkai share`: run one multithreaded process across several hosts
//! (the home host's driver, the node daemon, the netns harness).

use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Start a node on each other host, then run the program from the home host:\n  \
  bunkai share node --listen 0.0.0.0:7000\n  \
  bunkai share run --nodes 10.0.0.2:7000,10.0.0.3:7000 -- pigz -p 3 big.tar")]
pub struct Args {
    #[command(subcommand)]
    cmd: ShareCmd,
}

#[derive(clap::Subcommand)]
enum ShareCmd {
    Run(bunkai_share::run::RunArgs),
    Node(bunkai_share::node::NodeArgs),
    Hosts(bunkai_share::hosts::HostsArgs),
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        ShareCmd::Run(r) => bunkai_share::run::run(&r),
        ShareCmd::Node(n) => bunkai_share::node::run(&n),
        ShareCmd::Hosts(h) => bunkai_share::hosts::run(&h),
    }
}
