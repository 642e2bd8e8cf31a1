//! `bunkai scatter build` (also `bunkai scatter` with no verb): a C program
//! into a launcher plus one shared library per function (driver.rs).

use crate::driver;
use anyhow::Result;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter build -o out hello.c -- -O2 -lm     # or: bunkai scatter -o out hello.c -- -O2 -lm
  bunkai scatter build -o out --lib --name sqlite3 sqlite3.c -- -O2 -lpthread
  bunkai scatter build -o out whole-program.bc -- -O2
  out/bin/hello            # runs like the original; libraries load on first call")]
pub struct BuildArgs {
    /// Output directory (created; a previous scatter output there is replaced)
    #[arg(short = 'o', long = "output", alias = "out", value_name = "DIR")]
    pub out: PathBuf,
    /// Build the launcher as a shared library (DIR/lib/libNAME.so) instead of an executable
    #[arg(long)]
    pub lib: bool,
    /// Program name (default: the first input's file name without extension)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print the decision log: where each global went and why, which functions stayed;
    /// then how long each phase took
    #[arg(short, long)]
    pub verbose: bool,
    /// Print a JSON summary on stdout
    #[arg(long)]
    pub json: bool,
    /// Parallel code generation and link jobs (default: number of CPUs)
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Keep intermediate files in DIR/work
    #[arg(long)]
    pub keep_temps: bool,
    /// C sources (.c), LLVM bitcode (.bc) or textual IR (.ll)
    #[arg(required = true, value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// clang-14 flags, used to compile and to link (e.g. -O2 -DX -lm -lpthread)
    #[arg(last = true, value_name = "CLANG_FLAGS")]
    pub flags: Vec<String>,
}

pub fn run(a: BuildArgs) -> Result<ExitCode> {
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let opts = driver::Options {
        out: a.out.clone(),
        lib: a.lib,
        name: a.name,
        verbose: a.verbose,
        inputs: a.inputs,
        flags: a.flags,
        jobs,
        keep_temps: a.keep_temps,
        progress: std::io::stderr().is_terminal() && !a.json,
    };
    let summary = driver::scatter(&opts)?;
    if a.verbose {
        for line in &summary.log {
            eprintln!("scatter: {line}");
        }
        // Apart from the log above, which is the same in every run.
        for p in &summary.phases {
            eprintln!("time: {:.2} s {}", p.seconds, p.name);
        }
    }
    let m = &summary.manifest;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "out": a.out,
                "launcher": m.launcher,
                "functions": m.functions.len(),
                "kept": m.kept.len(),
                "launcher_bytes": m.launcher_bytes,
                "original_bytes": m.original.stripped_bytes,
                "phases": summary.phases,
            })
        );
    } else {
        eprintln!(
            "bunkai scatter: {} -> {}/{} + {} libraries",
            m.name,
            a.out.display(),
            m.launcher,
            m.functions.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
