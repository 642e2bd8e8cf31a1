//! bunkai trace: the TURU instruction tracer of seed 001, rebuilt as a
//! Valgrind tool (trace/tool/) that streams compact records to the
//! recorder here, plus the analysis tools of the paper's §2.3.
pub mod format;
pub mod record;
