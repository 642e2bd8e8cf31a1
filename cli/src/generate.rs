//! `bunkai generate`: man pages and shell completions from the CLI's own
//! clap definitions (for packagers: `make install` and `make deb` call it).
use anyhow::{Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(ClapArgs)]
#[command(after_help = "Examples:\n  bunkai generate man /usr/local/share/man/man1\n  \
bunkai generate complete-bash > /etc/bash_completion.d/bunkai")]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Man pages, one for bunkai and one for each command (bunkai-trace-record.1, ...), into DIR
    Man {
        /// The directory to write the pages into (made if missing)
        dir: PathBuf,
    },
    /// A bash completion script, on stdout
    CompleteBash,
    /// A zsh completion script, on stdout
    CompleteZsh,
    /// A fish completion script, on stdout
    CompleteFish,
}

pub fn run(a: Args, cmd: clap::Command) -> Result<ExitCode> {
    use clap_complete::Shell;
    let shell = match a.what {
        What::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {} (check the path)", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir).with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            return Ok(ExitCode::SUCCESS);
        }
        What::CompleteBash => Shell::Bash,
        What::CompleteZsh => Shell::Zsh,
        What::CompleteFish => Shell::Fish,
    };
    let mut cmd = cmd;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "bunkai", &mut out);
    use std::io::Write;
    std::io::stdout().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}
