//! `bunkai trace report`: the paper's Tables 1-6 and its §4 estimate.
//!
//! The paper (§2.3) ran three analysis programs over TURU's log: one
//! counting dynamic instructions per component (Tables 1 and 4), one
//! counting the pages each component touched for code and for data
//! (Tables 2 and 5) and one giving the reference counts per page (Tables 3
//! and 6); §4 then turns page and syscall counts into an estimate of what
//! TLB misses and segment-register reloads cost. This module does all of
//! it in one pass over the trace.
//!
//! Components: a stream's program (the object whose path is its HELLO
//! executable), each shared library, merged by name over all streams, and
//! "kernel", which Valgrind cannot see into: it reports syscalls and the
//! time spent in them instead of instructions and pages. Pages are 4 KiB
//! and counted per address space (each stream is one; a forked child or an
//! exec'd image counts its pages again, as the paper's CR3 would).
//!
//! Speed: a segment execution only bumps a counter (its instructions'
//! pages are expanded from the static definition at the end); a memory
//! reference costs one hash-map update, skipped when it falls on the same
//! (component, page) as the previous one.
//!
//! Files: analysis.rs (the one pass), estimate.rs (CPU models and §4),
//! tables.rs (Tables 1-6 as rows), render.rs (the text); this file holds
//! the command.

use crate::decode::{basename, Event, Item, Trace, NOT_PERFORMED};
use anyhow::{Context, Result};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

mod analysis;
mod estimate;
mod render;
mod tables;
pub use analysis::*;
pub use estimate::*;
pub use render::*;
pub use tables::*;

pub const PAGE_SHIFT: u32 = 12;

/// Print the paper's Tables 1-6 and its §4 overhead estimate for a trace
#[derive(clap::Args, Debug)]
#[command(long_about = "Print the paper's tables for a trace: dynamic instructions per component \
(Tables 1/4), pages used for code and data (Tables 2/5), references per page (Tables 3/6), and the \
§4 estimate of what TLB misses and syscall/address-space switches cost on a CPU model. The kernel \
row reports syscalls and time in syscalls, since Valgrind cannot see kernel instructions.")]
pub struct ReportArgs {
    /// Trace file written by `bunkai trace record`
    pub file: PathBuf,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
    /// CPU model for the §4 estimate: pentium (the paper's), modern, or a JSON file with the same keys
    #[arg(long, default_value = "pentium", value_name = "pentium|modern|PATH.json")]
    pub cpu: String,
    /// Cycles the traced work took (the paper measured 817,599 for one HTML request)
    #[arg(long, value_name = "N", conflicts_with = "seconds")]
    pub cycles: Option<u64>,
    /// Seconds the traced work took; cycles = seconds x the model's frequency
    #[arg(long, value_name = "S")]
    pub seconds: Option<f64>,
}

pub fn run(a: &ReportArgs) -> Result<ExitCode> {
    let cpu = cpu_model(&a.cpu)?;
    if a.cycles == Some(0) {
        anyhow::bail!("--cycles 0: give the cycles the traced work took (e.g. --cycles 817599)");
    }
    if let Some(s) = a.seconds {
        if !(s.is_finite() && s > 0.0) {
            anyhow::bail!("--seconds {s} is not a positive number of seconds (give e.g. --seconds 0.00818)");
        }
    }
    let trace = Trace::load(&a.file)?;
    let r = report(&trace, &ReportOptions { cpu, cycles: a.cycles, seconds: a.seconds })?;
    crate::decode::to_stdout(|w| {
        if a.json {
            serde_json::to_writer_pretty(&mut *w, &r)?;
            writeln!(w)?;
        } else {
            w.write_all(r.text().as_bytes())?;
        }
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Reads the file and builds the report with a CPU model ("pentium",
/// "modern" or a JSON file), cycles estimated from the instructions.
pub fn report_file(path: &Path, cpu: &str) -> Result<Report> {
    let trace = Trace::load(path)?;
    report(&trace, &ReportOptions { cpu: cpu_model(cpu)?, cycles: None, seconds: None })
}
