//! `bunkai mod info`: what a module file declares and needs, without loading it.

use crate::server;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Print the module's metadata as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
    /// A relocatable object (clang or gcc -c) declaring BUNKAI_MODULE
    #[arg(value_name = "MODULE.o")]
    pub module: PathBuf,
}

pub fn run(a: InfoArgs) -> Result<ExitCode> {
    let InfoArgs { json, module } = a;
    let i = server::file_info(&module)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&i)?);
    } else {
        println!("{} {} ({})", i.meta.name, i.meta.version, i.file);
        println!("  {} B file, {} B code+data; needs {} B RX + {} B RW", i.file_bytes, i.payload, i.rx, i.rw);
        for imp in &i.meta.implements {
            println!("  implements {} (hash {}): {}", imp.iface.name, imp.iface.hash, imp.symbols.join(", "));
        }
        for r in &i.meta.requires {
            println!("  requires {} (hash {})", r.name, r.hash);
        }
        if !i.undefined.is_empty() {
            println!("  symbols from outside: {}", i.undefined.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}
