//! `bunkai mod list`: modules loaded in a host.

use super::{pick_socket, HostSel};
use crate::{proto, server};
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub host: HostSel,
    /// Print the loaded modules as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ListArgs) -> Result<ExitCode> {
    let ListArgs { host, json } = a;
    let mut h = proto::Host::connect(&pick_socket(&host)?)?;
    let st = h.hello()?;
    let mods = server::loaded_modules(&st)?;
    let odd = server::unreadable_records(&st);
    if json {
        let mut v: Vec<serde_json::Value> = mods
            .iter()
            .map(|m| serde_json::json!({"id": m.id, "address": m.addr, "bytes": m.bytes, "record": m.rec}))
            .collect();
        for (id, why) in &odd {
            let (_, addr, bytes, _) = st.modules.iter().find(|m| m.0 == *id).unwrap();
            v.push(serde_json::json!({"id": id, "address": addr, "bytes": bytes, "record": null, "unreadable": why}));
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "pid": st.pid, "budget": st.budget, "used": st.used,
                "expects": st.expects.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                "modules": v,
            }))?
        );
    } else {
        println!(
            "host {} ({}): {} modules, {} bytes{}",
            st.pid,
            h.path.display(),
            mods.len() + odd.len(),
            st.used,
            if st.budget > 0 { format!(" of {}", st.budget) } else { String::new() }
        );
        for m in &mods {
            let ifs: Vec<&str> = m.rec.implements.iter().map(|i| i.iface.name.as_str()).collect();
            println!(
                "  {:>3} {:<16} {:<6} {:>9} B at {:#x}  implements [{}]{}{}",
                m.id,
                m.rec.name,
                m.rec.version,
                m.bytes,
                m.addr,
                ifs.join(", "),
                if m.rec.deps.is_empty() { String::new() } else { format!("  needs [{}]", m.rec.deps.join(", ")) },
                if m.rec.auto { "  (dependency)" } else { "" }
            );
        }
        for (id, why) in &odd {
            let (_, addr, bytes, _) = st.modules.iter().find(|m| m.0 == *id).unwrap();
            println!("  {id:>3} {:<16} {:<6} {bytes:>9} B at {addr:#x}  record unreadable: {why}", "?", "?");
        }
    }
    Ok(ExitCode::SUCCESS)
}
