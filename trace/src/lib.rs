//! bunkai trace: the TURU instruction tracer of seed 001, rebuilt as a
//! Valgrind tool (trace/tool/) that streams compact records to the
//! recorder here, plus the analysis tools of the paper's §2.3.
//!
//! - `format`: the trace file (chunks, checksums, varints).
//! - `record`: runs a command under the tool and writes the trace.
//! - `system`: `record --system`: the guest under QEMU with the plugin of
//!   trace/qemu/, one request recorded, kernel included.
//! - `symbols`: checks a window's function names against the program's
//!   symbols before it runs.
//! - `decode`: loads a trace and walks its records; every tool below uses
//!   its one visitor, `Trace::visit`.
//! - `dump`: the records as text, JSON lines or lackey's output.
//! - `calls`: function entries and exits per thread (uftrace-like).
//! - `report`: the paper's Tables 1-6 and its §4 overhead estimate.
//! - `pages`: the memory-access distribution as an SVG or PNG picture.
//! - `testutil`: synthetic traces for tests.
//! - `cmd`: the command line, `bunkai trace <verb>`: one file a verb.
pub mod calls;
pub mod cmd;
pub mod decode;
pub mod dump;
pub mod format;
pub mod pages;
pub mod record;
pub mod report;
pub mod symbols;
pub mod system;
pub mod testutil;
#[cfg(test)]
mod tests;
