//! `bunkai flow weave`: an aspect woven into a running program (weave.rs).

use crate::weave::{self, WeaveOptions};
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "The program must run with the host and flow runtimes preloaded and the host started:\n  BUNKAI_HOST=1 LD_PRELOAD=\"build/lib/bunkai/libbunkai-host.so build/lib/bunkai/libbunkai-flow.so\" ./server &\nBUNKAI_HOST=1 starts the host (its command socket); without it the library only loads. Every process\nforked from it (a daemon, pre-forked workers) gets a host of its own, and weave --pid takes the\nwhole tree: PID and its descendants running the same program. Workers forked later inherit the aspect.\n\nExamples:\n  bunkai flow weave --pid $(cat memcached.pid) aspects/memcached.xml\n  bunkai flow weave --pid 1234 request.xml --buffer-size 1G   # 1 GiB buffers\n  bunkai flow unweave --pid 1234                 # out of 1234 and its descendants")]
pub struct WeaveArgs {
    /// The running program (built with `bunkai flow cc`, started with
    /// BUNKAI_HOST=1 and libbunkai-host.so and libbunkai-flow.so in
    /// LD_PRELOAD: `BUNKAI_HOST=1 LD_PRELOAD="libbunkai-host.so
    /// libbunkai-flow.so" ./server`)
    #[arg(long)]
    pub pid: u32,
    /// The aspect (XML)
    pub aspect: std::path::PathBuf,
    /// The module's name (default: flow_ASPECT); `unweave` takes it
    #[arg(long)]
    pub name: Option<String>,
    /// Extra flags for compiling the advice (e.g. -I and -include for the
    /// header structs xin/xout write)
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    pub cflags: Option<String>,
    /// Keep the generated C and object here
    #[arg(long, value_name = "DIR")]
    pub keep: Option<std::path::PathBuf>,
    /// Always save the vector registers around the advice. By default,
    /// advice that compiles with -mgeneral-regs-only and calls nothing but
    /// the flow runtime is woven with a trampoline that skips XSAVE/XRSTOR
    #[arg(long)]
    pub full_state: bool,
    /// Call the handler at every pass. By default a sled whose code is all
    /// filtered on a flow (xflow() advice on target(), transits, quits) is
    /// guarded: its guard returns at once when the key cannot be in the flow
    #[arg(long)]
    pub no_guard: bool,
    /// Say which trampoline the advice gets, and why; which sleds are guarded
    #[arg(short, long)]
    pub verbose: bool,
    /// Print what was woven as one JSON object on stdout (woven, pid, program, sleds, guarded, trampoline, load_us, total_ms; processes: pid, parent, how, load_us; skipped: pid, why)
    #[arg(long)]
    pub json: bool,
    /// Weave only PID, not its descendants (by default every descendant
    /// running the same program with a host of its own is woven too)
    #[arg(long)]
    pub no_descendants: bool,
    /// Size of each process's record buffer, when the weave creates it
    /// (e.g. 256M, 4G; default BUNKAI_FLOW_BUF in the program's
    /// environment, else 64M). A process that has a buffer already keeps it
    #[arg(long, value_name = "SIZE")]
    pub buffer_size: Option<String>,
}

pub fn run(a: WeaveArgs) -> Result<ExitCode> {
    let WeaveArgs { pid, aspect, name, cflags, keep, full_state, no_guard, verbose, json, no_descendants, buffer_size } = a;
    let buffer_size = buffer_size.map(|s| weave::parse_size(&s)).transpose()?;
    weave::weave(&WeaveOptions { pid, aspect, name, cflags, keep, full_state, no_guard, verbose, json, no_descendants, buffer_size })
}
