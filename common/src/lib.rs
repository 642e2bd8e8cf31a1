//! bunkai-common: the few helpers every subsystem needs, in a leaf crate
//! that depends on no subsystem (so trace, share and flow do not build
//! scatter's HTTP client and server to write a file).
//!
//! - files.rs: files written whole (temporary file + rename), unfinished
//!   outputs removed on Ctrl-C, file sizes;
//! - install.rs: where bunkai's helpers and runtimes are (`BUNKAI_LIBDIR`,
//!   else beside the binary) and the one error for a missing one;
//! - fmt.rs: hex, thousands separators, sizes such as `64KiB`;
//! - output.rs: writing a command's result to standard output (a closed
//!   pipe or a full disk is handled once, in the CLI's main);
//! - c_header.rs: a subsystem's C header as a compiler reads it (the tests
//!   that pin each header against its Rust mirror);
//! - progress.rs: progress on long work, on a terminal only, after a second;
//! - plot.rs: what the plotters pictures share (the embedded font, tick
//!   labels).

pub mod c_header;
pub mod files;
pub mod fmt;
pub mod install;
pub mod output;
pub mod plot;
pub mod progress;
