//! `bunkai flow report`: per-flow timelines from every process's buffer,
//! and their Chrome, OpenTelemetry and SVG exports (report.rs).

use crate::report::{self, ReportOptions};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Buffer files (default: the buffers in $BUNKAI_FLOW_DIR or /dev/shm
    /// of processes that still run; --pid or --all for others)
    #[arg(conflicts_with_all = ["pid", "all"])]
    pub buffers: Vec<PathBuf>,
    /// Only the buffers of process PID and of its running descendants (a
    /// server's workers); repeat it for more
    #[arg(long, value_name = "PID", conflicts_with = "all")]
    pub pid: Vec<u32>,
    /// Every buffer in the directory, those of ended processes too (left
    /// out by default: `bunkai flow clean` removes them)
    #[arg(long)]
    pub all: bool,
    /// Which stored value is the flow ID, counted from 0; negative counts
    /// from the end (default -1: the last, as in STORE_DATA3($pc$, tsc, id))
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub id_value: i64,
    /// Only this flow (decimal or 0x hex)
    #[arg(long)]
    pub flow: Option<String>,
    /// Compare flow IDs on their low N bits only: an ID packed into a header
    /// field of N bits (xin/xout) loses the ones above, so the far side's
    /// steps carry the cut ID (1-64, default 64)
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub id_bits: u32,
    /// Also write Chrome trace / Perfetto JSON here
    #[arg(long, value_name = "FILE")]
    pub chrome: Option<PathBuf>,
    /// Also write OpenTelemetry spans (OTLP JSON) here
    #[arg(long, value_name = "FILE")]
    pub otel: Option<PathBuf>,
    /// Also draw the flows here as SVG: a band per flow, a lane per
    /// process, a dot per step along the flow's own time axis, the path
    /// between them, and where each function is first reached (the first
    /// 12 flows, or the one --flow names)
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// One JSON document instead of text
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ReportArgs) -> Result<ExitCode> {
    let ReportArgs { buffers, pid, all, id_value, flow, id_bits, chrome, otel, svg, json } = a;
    report::report(&ReportOptions { buffers, id_value, flow, id_bits, chrome, otel, svg, json, pids: pid, all })
}
