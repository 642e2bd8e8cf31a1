//! `bunkai trace record`: a command run under the Valgrind tool, its trace
//! written to a file (record.rs).

use crate::record::{self, RecordOptions};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Record a trace of a command: every instruction, memory reference,
/// syscall and signal, and the address-space changes (TURU §2.1)
#[derive(clap::Args, Debug)]
#[command(after_help = "Windows: start conditions hold in sequence, in this order whatever the \
order on the command line: --start-func, then --start-syscall, then --skip. Each is armed once \
the one before it has happened, and the window opens at the last. Stop conditions end it at \
the first of them to happen. A syscall condition alone also sees the dynamic linker's \
syscalls, which run before main (it opens ld.so.cache and each library).\n\n\
Examples:\n  \
  bunkai trace record -o true.bkt -- /bin/true\n  \
  bunkai trace record -o req.bkt --start-syscall accept --stop-at-close -- apache2 -X -f conf\n  \
  bunkai trace record -o main.bkt --start-func main --max 1000000 -- ./prog\n  \
  # the first openat after main, to the close of that file:\n  \
  bunkai trace record -o open.bkt --start-func main --start-syscall openat --stop-at-close -- ./prog\n  \
  # a function of a library loaded with dlopen, or of a program the command execs:\n  \
  bunkai trace record -o m.bkt --start-func php_execute_script@libphp8.2.so -- apache2 -X\n  \
  # the whole machine (kernel and Apache) for one request (make guest first):\n  \
  bunkai trace record --system --guest build/guest --get /index.html -o sys.bkt\n  \
  # QEMU's own speed through the same window, nothing recorded:\n  \
  bunkai trace record --system --guest build/guest --get /index.html --count-only\n\n\
A function name is checked against the program and the libraries it links before anything \
runs (a stripped program names only what it exports; main is not among them).")]
pub struct RecordArgs {
    /// Output trace file (written to a temporary file, renamed at the end)
    #[arg(short = 'o', long = "output", value_name = "FILE", required_unless_present = "count_only")]
    pub output: Option<PathBuf>,
    /// Open the window when this syscall returns successfully (names or
    /// numbers, comma-separated; "accept" also means accept4); after
    /// --start-func's function has been entered, if it is given
    #[arg(long, value_name = "NAME")]
    pub start_syscall: Option<String>,
    /// Close the window after this syscall (names or numbers)
    #[arg(long, value_name = "NAME")]
    pub stop_syscall: Option<String>,
    /// Close the window at the close() of the descriptor the start syscall
    /// returned (TURU's window in §3.1: from accept to the connection's close)
    #[arg(long)]
    pub stop_at_close: bool,
    /// Open the window at entry to this function (first of the start
    /// conditions; SYMBOL@FILE looks for it in FILE, see below)
    #[arg(long, value_name = "SYMBOL")]
    pub start_func: Option<String>,
    /// Close the window at entry to this function
    #[arg(long, value_name = "SYMBOL")]
    pub stop_func: Option<String>,
    /// Open the window N instructions after the other start conditions
    /// have happened (after the start if there are none)
    #[arg(long, value_name = "N")]
    pub skip: Option<u64>,
    /// Close the window after N instructions inside it
    #[arg(long, value_name = "N")]
    pub max: Option<u64>,
    /// Record only code of objects whose path contains NAME (repeatable;
    /// e.g. the program's name, or libc)
    #[arg(long = "object", value_name = "NAME")]
    pub objects: Vec<String>,
    /// Do not record memory references (instructions and events only)
    #[arg(long)]
    pub no_mem: bool,
    /// Hold the trace in a fixed in-memory buffer of this size and write it
    /// at the end, stopping when it is full (TURU's static memory area,
    /// §2.2(3)(a)); default: stream to the file as it runs (§2.2(3)(b))
    #[arg(long, value_name = "SIZE")]
    pub buffer: Option<String>,
    /// Do not follow forked and exec'd children
    #[arg(long)]
    pub no_children: bool,
    /// zstd level of the chunks, 1 to 19 (default: 1, the fastest; with
    /// --system 3: there QEMU is the slow part, and the size counts more)
    #[arg(long, value_name = "N")]
    pub level: Option<i32>,
    /// Print the summary as one line of JSON on stderr (stdout belongs to
    /// the traced command)
    #[arg(long)]
    pub json: bool,
    /// Explain what is being done (the Valgrind command, each stream)
    #[arg(short, long)]
    pub verbose: bool,
    /// Full system: boot the guest of `make guest` (Debian's kernel, Apache)
    /// under QEMU's TCG with bunkai's plugin and record one HTTP request
    /// from Apache's accept to its close of the connection, kernel included
    /// (no COMMAND; see docs/trace.md); with --start-syscall and
    /// --stop-syscall, from the return of the first start syscall to the same
    /// task's return from the stop syscall instead
    #[arg(long, conflicts_with_all = ["stop_at_close", "start_func", "stop_func", "skip", "max", "objects", "buffer", "no_children"])]
    pub system: bool,
    /// With --system: the guest directory (vmlinuz, initrd.gz, System.map)
    #[arg(long, value_name = "DIR", default_value = "build/guest", requires = "system")]
    pub guest: PathBuf,
    /// With --system: the path of the request (an HTTP/1.0 GET through
    /// QEMU's user network on 127.0.0.1)
    #[arg(long, value_name = "PATH", default_value = "/index.html", requires = "system")]
    pub get: String,
    /// With --system: send N requests of the same path first, unrecorded
    /// (a warm server and warm translations; default: the first request)
    #[arg(long, value_name = "N", default_value_t = 0, requires = "system")]
    pub warmup: u32,
    /// With --system: record nothing, count the window's instructions only
    /// (QEMU's own speed through the same window with the plugin loaded
    /// but not recording: the baseline of the record throughput); no -o
    #[arg(long, requires = "system", conflicts_with_all = ["output", "no_mem", "level"])]
    pub count_only: bool,
    /// With --system: seconds the guest may take to boot
    #[arg(long, value_name = "S", default_value_t = 300, requires = "system")]
    pub boot_timeout: u64,
    /// With --system: seconds from the request to the window's close
    #[arg(long, value_name = "S", default_value_t = 300, requires = "system")]
    pub timeout: u64,
    /// The command to trace, after `--` (none with --system)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required_unless_present = "system", conflicts_with = "system", value_name = "COMMAND")]
    pub command: Vec<String>,
}

pub fn run(a: RecordArgs) -> Result<ExitCode> {
    let RecordArgs {
        output, start_syscall, stop_syscall, stop_at_close, start_func, stop_func, skip, max, objects, no_mem,
        buffer, no_children, level, json, verbose, system, guest, get, warmup, count_only, boot_timeout, timeout, command,
    } = a;
    if system {
        let level = level.unwrap_or(3);
        return crate::system::run(&crate::system::SystemOptions {
            output, guest, get, warmup, no_mem, level, json, verbose, boot_timeout, timeout, start_syscall, stop_syscall,
            count_only,
        });
    }
    let output = output.expect("clap requires -o without --count-only");
    // Level 1 against 3, recording gzip -6 of 256 KiB (bench/trace/speed.py's
    // input): 0.73 against 1.01 s of CPU, 0.47 against 0.40 bytes an
    // instruction.
    let level = level.unwrap_or(1);
    record::run(&RecordOptions {
        output, start_syscall, stop_syscall, stop_at_close, start_func, stop_func, skip, max, objects, no_mem,
        buffer, no_children, level, json, verbose, command,
    })
}
