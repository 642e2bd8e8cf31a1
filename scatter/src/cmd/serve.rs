//! `bunkai scatter serve`: a grouped output over HTTP (serve.rs).

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

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

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    let server = crate::serve::Server::bind(&a.out, &a.listen)?;
    crate::serve::announce(&server.url)?;
    eprintln!("bunkai serve: serving {} at {} (Ctrl-C stops)", a.out.display(), server.url);
    server.serve(8, a.verbose)?;
    Ok(ExitCode::SUCCESS)
}
