//! `bunkai scatter` and its verbs (build, stats, profile, group, serve,
//! run): a thin driver over bunkai-scatter.

use anyhow::Result;
use bunkai_scatter::{driver, stats as st};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// `bunkai scatter [VERB]`: with no verb, the arguments are build's.
#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "With no verb, `bunkai scatter` is `bunkai scatter build`.

Examples:
  bunkai scatter -o out hello.c -- -O2 -lm
  bunkai scatter -o out --lib --name sqlite3 sqlite3.c -- -O2 -lpthread
  bunkai scatter -o out whole-program.bc -- -O2
  out/bin/hello            # runs like the original; libraries load on first call
  bunkai scatter stats out
  bunkai scatter profile out -- args...
  bunkai scatter group out --threshold 64KiB
  bunkai scatter serve out --listen 127.0.0.1:8000 &
  bunkai scatter run http://127.0.0.1:8000/ -- args..."
)]
pub struct ScatterArgs {
    #[command(subcommand)]
    pub cmd: Option<ScatterCmd>,
    #[command(flatten)]
    pub build: Option<BuildArgs>,
}

#[derive(clap::Subcommand)]
pub enum ScatterCmd {
    /// Split a C program into a launcher plus one shared library per function (the default verb)
    Build(BuildArgs),
    /// Sizes of a scatter output beside the original (the paper's Tables 3 and 4)
    Stats(StatsArgs),
    /// Record the order in which a scattered program first calls its functions
    Profile(ProfileArgs),
    /// Link the functions of a scatter output into groups, in profile order (§5)
    Group(GroupArgs),
    /// Serve a grouped scatter output over HTTP
    Serve(ServeArgs),
    /// Run a scattered program from a URL, fetching its groups as it runs (§6)
    Run(RunArgs),
}

impl ScatterCmd {
    pub fn run(self) -> Result<ExitCode> {
        match self {
            ScatterCmd::Build(a) => build(a),
            ScatterCmd::Stats(a) => stats(a),
            ScatterCmd::Profile(a) => profile(a),
            ScatterCmd::Group(a) => group(a),
            ScatterCmd::Serve(a) => serve(a),
            ScatterCmd::Run(a) => run_remote(a),
        }
    }
}

impl ScatterArgs {
    /// The verb given, or build when there was none.
    pub fn verb(self) -> ScatterCmd {
        match (self.cmd, self.build) {
            (Some(c), _) => c,
            (None, Some(b)) => ScatterCmd::Build(b),
            // clap requires build's arguments when no verb is given
            (None, None) => unreachable!("bunkai scatter: neither a verb nor build arguments"),
        }
    }
}

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter build -o out hello.c -- -O2 -lm     # or: bunkai scatter -o out hello.c -- -O2 -lm
  bunkai scatter build -o out --lib --name sqlite3 sqlite3.c -- -O2 -lpthread
  bunkai scatter build -o out whole-program.bc -- -O2
  out/bin/hello            # runs like the original; libraries load on first call")]
pub struct BuildArgs {
    /// Output directory (created; a previous scatter output there is replaced)
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: PathBuf,
    /// Build the launcher as a shared library (OUT/lib/libNAME.so) instead of an executable
    #[arg(long)]
    pub lib: bool,
    /// Program name (default: the first input's file name without extension)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print the decision log: where each global went and why, which functions stayed
    #[arg(short, long)]
    pub verbose: bool,
    /// Print a JSON summary on stdout
    #[arg(long)]
    pub json: bool,
    /// Parallel code generation and link jobs (default: number of CPUs)
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Keep intermediate files in OUT/work
    #[arg(long)]
    pub keep_temps: bool,
    /// C sources (.c), LLVM bitcode (.bc) or textual IR (.ll)
    #[arg(required = true, value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// clang-14 flags, used to compile and to link (e.g. -O2 -DX -lm -lpthread)
    #[arg(last = true, value_name = "CLANG_FLAGS")]
    pub flags: Vec<String>,
}

#[derive(clap::Args)]
pub struct StatsArgs {
    /// A scatter output directory
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Print JSON (keys: launcher_bytes, original_bytes, libraries, library_bytes, ...)
    #[arg(long)]
    pub json: bool,
}

pub fn build(a: BuildArgs) -> Result<ExitCode> {
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

pub fn stats(a: StatsArgs) -> Result<ExitCode> {
    let s = st::compute(&a.out)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", st::render(&s));
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter profile out -- -init /dev/null db.sqlite < workload.sql
  bunkai scatter profile out --append -- other args     # merge a second run
  bunkai scatter profile out --via -- ./workload.sh out/bin/sqlite3 db")]
pub struct ProfileArgs {
    /// A scatter output directory
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Merge this run into an existing profile instead of replacing it
    #[arg(long)]
    pub append: bool,
    /// ARGS is a whole command that runs the launcher (e.g. a workload script); implied for --lib outputs
    #[arg(long)]
    pub via: bool,
    /// Arguments for the program (for a --lib output: the command that loads it)
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

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

#[derive(clap::Args)]
#[command(after_help = "Prints the URL on stdout once it is listening. Any static HTTP server \
serving OUT works as well (nginx, python3 -m http.server).

Examples:
  bunkai scatter serve out --listen 127.0.0.1:8000")]
pub struct ServeArgs {
    /// A grouped scatter output directory
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Address to listen on (port 0: any free port)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub listen: String,
    /// Log every request on stderr
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(clap::Args)]
#[command(after_help = "Examples:
  bunkai scatter run http://127.0.0.1:8000/ -- :memory: 'select 1;'
  bunkai scatter run http://origin/sqlite3/ --cache /tmp/c --no-preload -- db.sqlite")]
pub struct RunArgs {
    /// Base URL of a grouped scatter output (as printed by bunkai scatter serve)
    #[arg(value_name = "URL")]
    pub url: String,
    /// Cache directory (default: ~/.cache/bunkai/<hash of URL>)
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Do not preload groups in the background; fetch each when first needed
    #[arg(long)]
    pub no_preload: bool,
    /// Fetch the uncompressed libraries
    #[arg(long)]
    pub no_compress: bool,
    /// Print what was fetched, from where, and when
    #[arg(short, long)]
    pub verbose: bool,
    /// Arguments for the program
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

pub fn profile(a: ProfileArgs) -> Result<ExitCode> {
    let r = bunkai_scatter::profile::record(&a.out, a.append, a.via, &a.args)?;
    eprintln!(
        "bunkai profile: {} functions called ({} new), {} run(s) in {}/profile; the program {}",
        r.functions,
        r.new,
        r.runs,
        a.out.display(),
        match (r.status.code(), std::os::unix::process::ExitStatusExt::signal(&r.status)) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(s)) => format!("was killed by signal {s}"),
            _ => "ended".to_string(),
        }
    );
    Ok(ExitCode::SUCCESS)
}

pub fn group(a: GroupArgs) -> Result<ExitCode> {
    use bunkai_scatter::group as g;
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

pub fn serve(a: ServeArgs) -> Result<ExitCode> {
    let server = bunkai_scatter::serve::Server::bind(&a.out, &a.listen)?;
    bunkai_scatter::serve::announce(&server.url)?;
    eprintln!("bunkai serve: serving {} at {} (Ctrl-C stops)", a.out.display(), server.url);
    server.serve(8, a.verbose)?;
    Ok(ExitCode::SUCCESS)
}

pub fn run_remote(a: RunArgs) -> Result<ExitCode> {
    use bunkai_scatter::run;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let (mut cmd, log) = run::prepare(&run::RunOptions {
        url: a.url,
        cache: a.cache,
        preload: !a.no_preload,
        compress: !a.no_compress,
        verbose: a.verbose,
        args: a.args,
    })?;
    if !a.verbose {
        let e = cmd.exec();
        anyhow::bail!("cannot start the launcher: {e}");
    }
    for l in &log {
        eprintln!("run: {l}");
    }
    let fetch_log = tempfile::NamedTempFile::new()?;
    cmd.env("BUNKAI_FETCH_LOG", fetch_log.path());
    let status = cmd.status()?;
    for l in run::summarize_fetch_log(&std::fs::read_to_string(fetch_log.path()).unwrap_or_default()) {
        eprintln!("run: {l}");
    }
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(s)) => ExitCode::from(128 + s as u8),
        _ => ExitCode::FAILURE,
    })
}
