//! `bunkai mod unload`: unload a module: registrations removed, memory freed.

use super::{pick_socket, HostSel};
use crate::{proto, server};
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct UnloadArgs {
    #[command(flatten)]
    pub host: HostSel,
    /// Also unload the modules that depend on it (dependents first)
    #[arg(long)]
    pub cascade: bool,
    /// Print what was unloaded as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
    /// The loaded module's name (as `bunkai mod list` shows it)
    #[arg(value_name = "NAME")]
    pub name: String,
}

pub fn run(a: UnloadArgs) -> Result<ExitCode> {
    let UnloadArgs { host, cascade, json, name } = a;
    let mut h = proto::Host::connect(&pick_socket(&host)?)?;
    let r = server::unload(&mut h, &name, cascade)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        for (n, t) in &r.unloaded {
            eprintln!("bunkai mod: unloaded {n} in {t:.0} us");
        }
    }
    Ok(ExitCode::SUCCESS)
}
