//! bunkai share: one unmodified multithreaded process across several hosts
//! (seed 002). This crate is the tool side; the runtime that lives inside
//! the shared process is share/runtime/share.c, and the two agree on
//! share/include/bunkai_share.h (how the program is started, the stats page).
//!
//! - `key`: the cluster key file (`bunkai share key`).
//! - `auth`: the CLI's handshake with a node daemon, the run key, the
//!   MACs on the CLI-node lines.
//! - `proto`: the JSON-lines protocol between `bunkai share run` and
//!   `bunkai share node` (spawn a replica, its exit, kill it).
//! - `launch`: the program's environment, BUNKAI_SHARE, placement, token.
//! - `node`: `bunkai share node`, the daemon that starts replicas.
//! - `run`: `bunkai share run`, the home host's driver.
//! - `stats`: the stats page the home runtime fills (header section 3).
//! - `netns`: hosts as network namespaces joined by veth, for tests and
//!   benchmarks; `cmd/hosts.rs` is its CLI (`bunkai share hosts
//!   up|down|clean`).
//! - `sys`: the few Linux calls std does not have (pidfd, signalfd,
//!   personality, memfd).
//! - `cmd`: the command line, `bunkai share <verb>`: one file a verb.

pub mod auth;
pub mod cmd;
mod fuzz;
pub mod key;
pub mod launch;
pub mod netns;
pub mod node;
pub mod proto;
pub mod run;
pub mod stats;
pub mod sys;

/// The runtime's file name in bunkai's libdir (build/lib/bunkai).
pub const RUNTIME_LIB: &str = "libbunkai-share.so";
/// Its rtld-audit module (LD_AUDIT), beside it.
pub const AUDIT_LIB: &str = "libbunkai-share-audit.so";
