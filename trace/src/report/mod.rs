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
//! In a system trace (`record --system`) the kernel is measured like the
//! rest: object "[kernel]" is the component "kernel", with instructions,
//! pages and references; interrupts and exceptions are counted by entry
//! stub and address-space switches are the CR3 loads the plugin saw.
//!
//! Speed: a segment execution only bumps a counter (its instructions'
//! pages are expanded from the static definition at the end); a memory
//! reference costs one hash-map update, skipped when it falls on the same
//! (component, page) as the previous one.
//!
//! Files: analysis.rs (the one pass), estimate.rs (CPU models and §4),
//! tables.rs (Tables 1-6 as rows), render.rs (the text); the command is
//! cmd/report.rs.

use crate::decode::{basename, Event, Item, Trace, NOT_PERFORMED};
use anyhow::{Context, Result};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::path::Path;
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

/// Reads the file and builds the report with a CPU model ("pentium",
/// "modern" or a JSON file), cycles estimated from the instructions.
pub fn report_file(path: &Path, cpu: &str) -> Result<Report> {
    let trace = Trace::load(path)?;
    report(&trace, &ReportOptions { cpu: cpu_model(cpu)?, cycles: None, seconds: None })
}
