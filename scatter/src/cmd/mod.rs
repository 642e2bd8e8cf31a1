//! `bunkai scatter` and its verbs: the command-line arguments of each verb
//! and the function that runs it, one file a verb. The crate's other modules
//! know nothing of clap.

pub mod build;
pub mod group;
pub mod profile;
pub mod run;
pub mod serve;
pub mod stats;

use anyhow::Result;
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
    pub build: Option<build::BuildArgs>,
}

#[derive(clap::Subcommand)]
pub enum ScatterCmd {
    /// Split a C program into a launcher plus one shared library per function (the default verb)
    Build(build::BuildArgs),
    /// Sizes of a scatter output beside the original (the paper's Tables 3 and 4)
    Stats(stats::StatsArgs),
    /// Record the order in which a scattered program first calls its functions
    Profile(profile::ProfileArgs),
    /// Link the functions of a scatter output into groups, in profile order (§5)
    Group(group::GroupArgs),
    /// Serve a grouped scatter output over HTTP
    Serve(serve::ServeArgs),
    /// Run a scattered program from a URL, fetching its groups as it runs (§6)
    Run(run::RunArgs),
}

impl ScatterCmd {
    pub fn run(self) -> Result<ExitCode> {
        match self {
            ScatterCmd::Build(a) => build::run(a),
            ScatterCmd::Stats(a) => stats::run(a),
            ScatterCmd::Profile(a) => profile::run(a),
            ScatterCmd::Group(a) => group::run(a),
            ScatterCmd::Serve(a) => serve::run(a),
            ScatterCmd::Run(a) => run::run(a),
        }
    }
}

impl ScatterArgs {
    /// The verb given, if one was (None: build, the default verb).
    pub fn verb_ref(&self) -> Option<&ScatterCmd> {
        self.cmd.as_ref()
    }

    /// Whether the verb runs the user's program (profile: the program has
    /// stdout, so --json and a JSON error go to stderr).
    pub fn runs_a_program(&self) -> bool {
        matches!(self.cmd, Some(ScatterCmd::Profile(_)))
    }

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
