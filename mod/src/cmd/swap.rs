//! `bunkai mod swap`: replace a loaded module by another implementing the same interfaces, atomically.

use super::{pick_socket, print_load, search_dirs, HostSel};
use crate::{proto, server};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct SwapArgs {
    #[command(flatten)]
    pub host: HostSel,
    /// Directories searched for required modules (also $BUNKAI_MOD_PATH)
    #[arg(short = 'L', value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Copy the code through the socket instead of handing the host a memfd to map
    #[arg(long)]
    pub copy: bool,
    /// Print what was swapped as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
    /// The loaded module to replace
    #[arg(value_name = "OLD")]
    pub old: String,
    /// The module that takes its place: a relocatable object declaring the same interfaces
    #[arg(value_name = "NEW.o")]
    pub module: PathBuf,
}

pub fn run(a: SwapArgs) -> Result<ExitCode> {
    let SwapArgs { host, dirs, copy, json, old, module } = a;
    let mut h = proto::Host::connect(&pick_socket(&host)?)?;
    let r = server::load(
        &mut h,
        &server::LoadOptions { file: &module, dirs: search_dirs(dirs), replace: Some(&old), copy },
    )?;
    print_load(&r, json, false)?;
    Ok(ExitCode::SUCCESS)
}
