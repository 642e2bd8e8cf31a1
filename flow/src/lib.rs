//! bunkai flow: XenLASY (seed 003), aspects that follow data through
//! threads, processes and hosts. This crate is the tool's side:
//!
//! - `joinpoints`: the join-point table the compiler pass (flow/pass/)
//!   leaves in a program: sled addresses, struct/member, source position,
//!   and where the base pointer, the arguments and the named variables are
//!   at each sled.
//! - `cc`: `bunkai flow cc`, clang-14 with the pass.
//! - `points`: `bunkai flow points`, the table as text or JSON.
//! - `aspect`: the aspect language (the paper's XML), parsed with positions.
//! - `select`: which join points each pointcut selects (check and weave).
//! - `check`: `bunkai flow check`, what can be known before weaving.
//! - `buffer`: the per-process record buffers STORE_DATA fills.
//! - `report`: `bunkai flow dump` and `report` (timelines per flow, Chrome
//!   trace and OpenTelemetry export).
//! - `advice`: the C of the advice module (`bunkai flow emit`).
//! - `weave`: `bunkai flow emit`, `weave` and `unweave`.
//! - `clean`: `bunkai flow clean`, the buffers of ended processes removed.
//! - `cmd`: the command line, `bunkai flow <verb>`: one file a verb.
//!
//! The layouts shared with the pass and the runtime are in
//! flow/include/bunkai_flow.h.
mod advice;
pub mod aspect;
pub mod buffer;
pub mod cc;
pub mod check;
pub mod clean;
pub mod cmd;
pub mod report;
pub mod select;
pub mod weave;
pub mod joinpoints;
pub mod points;
#[cfg(test)]
mod tests;

/// The fuzzing tests' generator (xorshift64): steps `seed` in place.
#[cfg(test)]
pub(crate) fn xorshift(seed: &mut u64) {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
}

/// Writes a command's output to standard output (a closed pipe is the
/// CLI's main's to handle, as for every command).
pub use bunkai_common::output::stdout;
