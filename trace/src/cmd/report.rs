//! `bunkai trace report`: the paper's Tables 1-6 and its §4 estimate for a
//! trace (report/).

use crate::decode::{self, Trace};
use crate::report::{cpu_model, report, ReportOptions};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

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

pub fn run(a: ReportArgs) -> Result<ExitCode> {
    let cpu = cpu_model(&a.cpu)?;
    if a.cycles == Some(0) {
        anyhow::bail!("--cycles 0: give the cycles the traced work took (e.g. --cycles 817599)");
    }
    if let Some(s) = a.seconds {
        if !(s.is_finite() && s > 0.0) {
            anyhow::bail!("--seconds {s} is not a positive number of seconds (give e.g. --seconds 0.00818)");
        }
    }
    let mut trace = Trace::load(&a.file)?;
    trace.progress = !a.json && bunkai_common::progress::on_terminal();
    let r = report(&trace, &ReportOptions { cpu, cycles: a.cycles, seconds: a.seconds })?;
    decode::to_stdout(|w| {
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
