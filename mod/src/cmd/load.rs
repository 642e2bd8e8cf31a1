//! `bunkai mod load`: check, link and load a module (and the modules it requires) into a host.

use super::{pick_socket, print_load, search_dirs, HostSel};
use crate::{proto, server};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub host: HostSel,
    /// Directories searched for required modules (also $BUNKAI_MOD_PATH)
    #[arg(short = 'L', value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Print per-stage times and decisions
    #[arg(short, long)]
    pub verbose: bool,
    /// Copy the code through the socket instead of handing the host a memfd to map
    #[arg(long)]
    pub copy: bool,
    /// Print what was loaded (modules, addresses, stage times) as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
    /// A relocatable object (clang or gcc -c) declaring BUNKAI_MODULE
    #[arg(value_name = "MODULE.o")]
    pub module: PathBuf,
}

pub fn run(a: LoadArgs) -> Result<ExitCode> {
    let LoadArgs { host, dirs, verbose, copy, json, module } = a;
    let mut h = proto::Host::connect(&pick_socket(&host)?)?;
    let r = server::load(&mut h, &server::LoadOptions { file: &module, dirs: search_dirs(dirs), replace: None, copy })?;
    print_load(&r, json, verbose)?;
    Ok(ExitCode::SUCCESS)
}
