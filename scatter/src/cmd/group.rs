//! `bunkai scatter group`: functions linked into groups in profile order (group.rs).

use anyhow::Result;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter group out --threshold 64KiB
  bunkai scatter group out --threshold 32K --json")]
pub struct GroupArgs {
    /// A scatter output directory with a profile (bunkai scatter profile)
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Largest group size, summed over its functions (e.g. 65536, 64KiB, 1MiB)
    #[arg(long, value_name = "SIZE", default_value = "64KiB")]
    pub threshold: String,
    /// Parallel link jobs (default: number of CPUs)
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Print the grouping decisions
    #[arg(short, long)]
    pub verbose: bool,
    /// Print JSON (the groups section of the manifest plus totals)
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: GroupArgs) -> Result<ExitCode> {
    use crate::group as g;
    let threshold = bunkai_common::fmt::parse_size(&a.threshold)?;
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let s = g::group(&g::Options {
        out: a.out.clone(),
        threshold,
        jobs,
        progress: std::io::stderr().is_terminal() && !a.json,
    })?;
    if a.verbose {
        for l in &s.log {
            eprintln!("group: {l}");
        }
    }
    let total: u64 = s.groups.list.iter().map(|g| g.raw_bytes).sum();
    // What travels: every compressed group plus the dictionary.
    let total_zst: u64 = s.groups.list.iter().map(|g| g.zst_bytes).sum::<u64>() + s.groups.dict_bytes;
    let orig = s.original_bytes.max(1) as f64;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "threshold_bytes": threshold,
                "groups": s.groups.list.len(),
                "group_bytes": total,
                "group_zst_bytes": total_zst,
                "dict_bytes": s.groups.dict_bytes,
                "per_function_bytes": s.per_function_bytes,
                "original_bytes": s.original_bytes,
                "original_zst_bytes": s.groups.original_zst_bytes,
                "launcher_bytes": s.launcher_bytes,
                "launcher_zst_bytes": s.groups.launcher_zst_bytes,
                "called": s.groups.called,
                "list": s.groups.list,
            }))?
        );
    } else {
        eprintln!(
            "bunkai group: {} groups at {} B: {:.1} KiB ({:.1}% of the original, Table 7), {:.1} KiB compressed ({:.1}% of the compressed original)",
            s.groups.list.len(),
            threshold,
            total as f64 / 1024.0,
            100.0 * total as f64 / orig,
            total_zst as f64 / 1024.0,
            100.0 * total_zst as f64 / s.groups.original_zst_bytes.max(1) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}
