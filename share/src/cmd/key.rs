//! `bunkai share key`: a new cluster key written where every host of the
//! cluster keeps it (key.rs).

use crate::key;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Create the cluster key
///
/// Write a new random key for `bunkai share`: every host of a cluster holds
/// the same key, and a node runs programs only for peers that prove they
/// hold it.
#[derive(clap::Args, Debug)]
#[command(after_help = "Copy the file to the same place on every host, keeping its mode (600):\n  \
  scp -p ~/.config/bunkai/share.key node1:.config/bunkai/share.key\n\n\
Examples:\n  \
  bunkai share key\n  \
  bunkai share key --key /etc/bunkai/share.key --force\n  \
  bunkai share key --json        # {\"key\": PATH, \"replaced\": false}")]
pub struct KeyArgs {
    /// Where to write it (default: $BUNKAI_SHARE_KEY, else ~/.config/bunkai/share.key)
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Replace an existing key (every host must then get the new one)
    #[arg(long)]
    pub force: bool,
    /// Say where the key went as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: KeyArgs) -> Result<ExitCode> {
    let p = key::path(a.key.as_deref())?;
    let replaced = a.force && p.exists();
    key::create(&p, a.force)?;
    if a.json {
        println!("{}", serde_json::json!({ "key": p, "replaced": replaced }));
    } else {
        println!(
            "bunkai share: wrote a new key to {} (copy it to the same path on every host, mode 600)",
            p.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
