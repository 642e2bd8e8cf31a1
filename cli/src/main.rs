//! bunkai: take programs apart while they run.
//!
//! Each subcommand is a thin driver over its subsystem's library crate:
//! every subsystem's verbs (arguments and what runs them) live in its
//! crate's `src/cmd/<verb>.rs`, and this file only parses and dispatches
//! (and `generate.rs` writes man pages and completions from the same
//! definitions). Errors print as one line, `bunkai <subcommand>: <what>
//! (<fix>)`, and exit non-zero.

mod generate;

use bunkai_scatter::cmd as scatter;
use clap::{Parser, Subcommand};
use std::io::Write;
use std::process::ExitCode;

const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("BUNKAI_BUILD_INFO"), ")");
const ABOUT: &str = "Take programs apart while they run";
const LONG_ABOUT: &str = "bunkai takes Linux x86-64 programs apart while they run: it scatters a C \
program into per-function shared libraries, traces every instruction, shares one process \
across hosts, follows data flows with aspects, and loads code modules into running hosts.";

#[derive(Parser)]
#[command(name = "bunkai", version = VERSION, about = ABOUT, long_about = LONG_ABOUT, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Split a C program into a launcher plus one shared library per function; stats, profile, group, serve, run
    Scatter(scatter::ScatterArgs),
    // The old top-level spellings of scatter's verbs, hidden, for one release
    #[command(hide = true)]
    Stats(scatter::stats::StatsArgs),
    #[command(hide = true)]
    Profile(scatter::profile::ProfileArgs),
    #[command(hide = true)]
    Group(scatter::group::GroupArgs),
    #[command(hide = true)]
    Serve(scatter::serve::ServeArgs),
    #[command(hide = true)]
    Run(scatter::run::RunArgs),
    /// Trace every instruction, memory reference and syscall (TURU)
    Trace(bunkai_trace::cmd::Args),
    /// Run one multithreaded process across several hosts
    Share(bunkai_share::cmd::Args),
    /// XenLASY: follow data through threads, processes and hosts: build with sleds, weave aspects in, report flows
    Flow(bunkai_flow::cmd::Args),
    /// DKM: check, link and load code modules into a running host; unload, swap, predict
    Mod(bunkai_mod::cmd::Args),
    /// Write man pages or shell completions (for packagers)
    Generate(generate::Args),
}

impl Cmd {
    fn name(&self) -> &'static str {
        match self {
            Cmd::Scatter(_) => "scatter",
            Cmd::Stats(_) => "stats",
            Cmd::Profile(_) => "profile",
            Cmd::Group(_) => "group",
            Cmd::Serve(_) => "serve",
            Cmd::Run(_) => "run",
            Cmd::Trace(_) => "trace",
            Cmd::Share(_) => "share",
            Cmd::Flow(_) => "flow",
            Cmd::Mod(_) => "mod",
            Cmd::Generate(_) => "generate",
        }
    }
}

/// Turns clap's multi-line usage errors into our one-line form.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `bunkai` or `bunkai trace` with no verb: the help, as the
            // error it is (on stderr), and the usage error's status
            let _ = e.print();
            return ExitCode::from(2);
        }
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // help on stdout: a write that fails ends as any command's does
            let name = std::env::args().nth(1).filter(|a| !a.starts_with('-')).unwrap_or_default();
            return match e.print().and_then(|()| std::io::stdout().flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(io) => output_failed(&name, &io),
            };
        }
        _ => {}
    }
    let args: Vec<String> = std::env::args().collect();
    let sub = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .cloned()
        .unwrap_or_default();
    let text = e.to_string();
    let json = json_requested();
    // clap's first line, with what it lists on the indented lines below it
    // ("the following required arguments were not provided:" and the names)
    let mut lines = text.lines();
    let mut first = lines.next().unwrap_or("bad arguments").trim_start_matches("error: ").to_string();
    let listed: Vec<&str> = lines.take_while(|l| l.starts_with("  ")).map(str::trim).collect();
    if !listed.is_empty() {
        first = format!("{} {}", first, listed.join(", "));
    }
    let known = [
        "scatter", "stats", "profile", "group", "serve", "run", "trace", "share", "flow", "mod", "generate",
    ];
    let mut line = format!("bunkai: {first} (see 'bunkai help')");
    if known.contains(&sub.as_str()) {
        // a nested command points to its own help: `bunkai trace record --help`
        use clap::CommandFactory;
        let verb = Cli::command().find_subcommand(&sub).and_then(|c| {
            let next = args.iter().skip(1).filter(|a| !a.starts_with('-')).nth(1)?;
            c.find_subcommand(next).map(|v| v.get_name().to_string())
        });
        line = match verb {
            Some(v) => format!("bunkai {sub}: {first} (see 'bunkai {sub} {v} --help')"),
            None => format!("bunkai {sub}: {first} (see 'bunkai help {sub}')"),
        };
    }
    eprintln!("{line}");
    if json {
        println!("{}", serde_json::json!({ "error": line }));
    }
    ExitCode::from(2)
}

/// The subcommand running, for the panic hook's one line.
static RUNNING: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// How a failed write of our output ends the run, whichever command made it:
/// a reader that went away (`| head -c1`) is no error, exit 0 in silence; a
/// full disk or any other failure is one line.
fn output_failed(name: &str, e: &std::io::Error) -> ExitCode {
    if e.kind() == std::io::ErrorKind::BrokenPipe && stdout_reader_gone() {
        return ExitCode::SUCCESS;
    }
    let fix = if e.raw_os_error() == Some(libc::ENOSPC) {
        "free some space, or write the output elsewhere"
    } else {
        "check where the output goes"
    };
    let who = if name.is_empty() { "bunkai".to_string() } else { format!("bunkai {name}") };
    let _ = writeln!(std::io::stderr(), "{who}: cannot write the output: {e} ({fix})");
    ExitCode::from(1)
}

/// Whether stdout is a pipe nobody reads any more (its write end polls
/// POLLERR). A broken pipe elsewhere (a socket to a node or a server) is a
/// failure like any other.
fn stdout_reader_gone() -> bool {
    let mut p = libc::pollfd { fd: 1, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one pollfd, no timeout
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLERR != 0 }
}

/// `println!` panics when stdout fails: every command's printing ends here
/// instead, as `output_failed` says. Any other panic keeps Rust's report.
fn install_output_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(rest) = msg.strip_prefix("failed printing to stdout: ") {
            let name = RUNNING.get().copied().unwrap_or("");
            let e = if rest.contains("os error 32") {
                std::io::Error::from_raw_os_error(libc::EPIPE)
            } else if rest.contains("os error 28") {
                std::io::Error::from_raw_os_error(libc::ENOSPC)
            } else {
                std::io::Error::other(rest.to_string())
            };
            let code = output_failed(name, &e);
            std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
        }
        default(info)
    }));
}

/// The io::Error behind a command's failure, if writing our output was it
/// (an io::Error in the chain, or one inside a serde_json error).
fn output_error(e: &anyhow::Error) -> Option<std::io::Error> {
    let is_output = |io: &std::io::Error| {
        io.kind() == std::io::ErrorKind::BrokenPipe && stdout_reader_gone() || io.raw_os_error() == Some(libc::ENOSPC)
    };
    for c in e.chain() {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if is_output(io) {
                return Some(match io.raw_os_error() {
                    Some(n) => std::io::Error::from_raw_os_error(n),
                    None => std::io::Error::from(io.kind()),
                });
            }
        }
        if let Some(j) = c.downcast_ref::<serde_json::Error>() {
            if let Some(kind) = j.io_error_kind() {
                let io = match kind {
                    std::io::ErrorKind::BrokenPipe => std::io::Error::from_raw_os_error(libc::EPIPE),
                    std::io::ErrorKind::StorageFull => std::io::Error::from_raw_os_error(libc::ENOSPC),
                    k => std::io::Error::from(k),
                };
                if is_output(&io) {
                    return Some(io);
                }
            }
        }
    }
    None
}

/// Runs one of scatter's verbs; `name` is `scatter`, or an old top-level
/// spelling (`run`), which says first that it is going.
fn run_scatter(name: &'static str, verb: scatter::ScatterCmd) -> anyhow::Result<ExitCode> {
    if name != "scatter" {
        eprintln!("bunkai: `bunkai {name}` is now `bunkai scatter {name}` (the old spelling goes in the next release)");
    }
    if matches!(verb, scatter::ScatterCmd::Build(_) | scatter::ScatterCmd::Group(_)) {
        bunkai_common::files::install_interrupt_cleanup(name);
    }
    verb.run()
}

/// Whether --json was given (before a `--` that starts a program's own
/// arguments).
fn json_requested() -> bool {
    std::env::args().skip(1).take_while(|a| a != "--").any(|a| a == "--json")
}

/// Whether a command handles Ctrl-C itself. Every other command gets the
/// common handler: one line, exit 130, unfinished output removed.
/// `scatter run` and `profile` run the user's program, which gets the
/// signal from the terminal and decides; scatter's build and group install
/// the handler with their cleanup themselves (run_scatter).
fn handles_interrupts(cmd: &Cmd) -> bool {
    match cmd {
        Cmd::Scatter(a) => matches!(
            a.verb_ref(),
            Some(scatter::ScatterCmd::Run(_) | scatter::ScatterCmd::Profile(_) | scatter::ScatterCmd::Build(_) | scatter::ScatterCmd::Group(_)) | None
        ),
        Cmd::Run(_) | Cmd::Profile(_) | Cmd::Group(_) => true,
        _ => runs_a_program(cmd),
    }
}

/// trace record and share run: the traced or shared program gets the
/// terminal's signals (passed on by the command) and stdout.
fn runs_a_program(cmd: &Cmd) -> bool {
    match cmd {
        Cmd::Trace(a) => a.runs_a_program(),
        Cmd::Share(a) => a.runs_a_program(),
        Cmd::Scatter(a) => a.runs_a_program(),
        Cmd::Profile(_) => true,
        _ => false,
    }
}

/// The command line parsed with the least of the command tree: clap's
/// derive builds every subcommand's arguments (hundreds of them) before it
/// parses, and that heap is most of what bunkai's start-up adds to a Rust
/// program's (bench/results/cli-startup.md). A command line whose first
/// word names a subcommand is parsed against that subcommand's tree alone
/// (built by the same derive), and `--version` against the top level
/// alone. Whatever does not parse, and every request for help, is parsed
/// again against the whole tree, so that errors and help are clap's own.
fn parse() -> Result<Cli, clap::Error> {
    use clap::{Args, Command, CommandFactory, FromArgMatches};
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let helps = args.iter().skip(1).take_while(|a| *a != "--").any(|a| a == "-h" || a == "--help" || a == "help");
    let top = || Command::new("bunkai").version(VERSION).about(ABOUT).long_about(LONG_ABOUT).propagate_version(true);
    fn sub<T: Args>(name: &'static str) -> Command {
        T::augment_args(Command::new(name))
    }
    let narrow = if helps {
        None
    } else {
        match first {
            "--version" | "-V" if args.len() == 2 => Some(top()),
            "scatter" => Some(top().subcommand(sub::<scatter::ScatterArgs>("scatter"))),
            "stats" => Some(top().subcommand(sub::<scatter::stats::StatsArgs>("stats"))),
            "profile" => Some(top().subcommand(sub::<scatter::profile::ProfileArgs>("profile"))),
            "group" => Some(top().subcommand(sub::<scatter::group::GroupArgs>("group"))),
            "serve" => Some(top().subcommand(sub::<scatter::serve::ServeArgs>("serve"))),
            "run" => Some(top().subcommand(sub::<scatter::run::RunArgs>("run"))),
            "trace" => Some(top().subcommand(sub::<bunkai_trace::cmd::Args>("trace"))),
            "share" => Some(top().subcommand(sub::<bunkai_share::cmd::Args>("share"))),
            "flow" => Some(top().subcommand(sub::<bunkai_flow::cmd::Args>("flow"))),
            "mod" => Some(top().subcommand(sub::<bunkai_mod::cmd::Args>("mod"))),
            _ => None,
        }
    };
    if let Some(cmd) = narrow {
        match cmd.try_get_matches_from(&args) {
            Ok(m) => {
                if let Ok(cli) = Cli::from_arg_matches(&m) {
                    return Ok(cli);
                }
            }
            // `bunkai --version`: what the whole tree would print
            Err(e) if e.kind() == clap::error::ErrorKind::DisplayVersion && matches!(first, "--version" | "-V") => {
                return Err(e)
            }
            Err(_) => {}
        }
    }
    let m = Cli::command().try_get_matches_from(&args)?;
    Cli::from_arg_matches(&m)
}

fn main() -> ExitCode {
    install_output_hook();
    let cli = match parse() {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let name = cli.cmd.name();
    let _ = RUNNING.set(name);
    // trace record, share run and scatter profile hand the program stdout
    // (their --json summary goes to stderr): an error object goes there too
    let json_to_stderr = runs_a_program(&cli.cmd);
    if !handles_interrupts(&cli.cmd) {
        bunkai_common::files::install_interrupt_cleanup(name);
    }
    let result = match cli.cmd {
        Cmd::Scatter(a) => run_scatter(name, a.verb()),
        Cmd::Stats(a) => run_scatter(name, scatter::ScatterCmd::Stats(a)),
        Cmd::Profile(a) => run_scatter(name, scatter::ScatterCmd::Profile(a)),
        Cmd::Group(a) => run_scatter(name, scatter::ScatterCmd::Group(a)),
        Cmd::Serve(a) => run_scatter(name, scatter::ScatterCmd::Serve(a)),
        Cmd::Run(a) => run_scatter(name, scatter::ScatterCmd::Run(a)),
        Cmd::Mod(a) => bunkai_mod::cmd::run(a),
        Cmd::Trace(a) => bunkai_trace::cmd::run(a),
        Cmd::Share(a) => bunkai_share::cmd::run(a),
        Cmd::Flow(a) => bunkai_flow::cmd::run(a),
        Cmd::Generate(a) => {
            use clap::CommandFactory;
            generate::run(a, Cli::command())
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // an error that an interrupt caused (its cleanup removed the
            // work meanwhile) ends as the interrupt: 130, its one line
            bunkai_common::files::yield_to_interrupt();
            if let Some(io) = output_error(&e) {
                return output_failed(name, &io);
            }
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("bunkai {name}: {msg}");
            if json_requested() {
                // for tools reading --json: the same error as one object,
                // where the command's JSON would have gone
                let obj = serde_json::json!({ "error": format!("bunkai {name}: {msg}") }).to_string();
                if json_to_stderr {
                    eprintln!("{obj}");
                } else {
                    println!("{obj}");
                }
            }
            ExitCode::from(1)
        }
    }
}
