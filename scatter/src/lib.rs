//! bunkai scatter: split a C program into a small launcher plus one lazily
//! dlopen()ed shared library per function (Kawai & Sasada, seed 000, §2–4).
//!
//! The pipeline (driver.rs):
//!   1. compile each C input to bitcode (clang-14) and tag it with its source,
//!   2. link all bitcode into one module (llvm-link-14),
//!   3. build the original from the same inputs and flags (what it exports
//!      decides what the passes may hide: dso.rs reads it),
//!   4. run the scatter passes (opt-14 + BunkaiScatter.so): hide what the
//!      original does not export (with --lib functions and data, in an
//!      executable its data), assign ids, externalize, merge shared
//!      statics, split,
//!   5. generate the stubs (stubs.rs) and link the launcher with the runtime
//!      and all the user's flags,
//!   6. lower every per-function module to a shared library (lower.rs) with
//!      the user's flags minus the library's own link options (linkflags.rs),
//!      and check what the loader will make of the result (check.rs),
//!   7. write manifest.json and move the finished directory into place.
//! Step 3 runs beside step 2, and the
//! launcher (5) beside the libraries (6); timing.rs records how long each
//! took (`-v`, `--json`).
//!
//! Then, for §5–6: profile.rs records first-call order, group.rs links one
//! library per group and writes the group map; serve.rs serves an output
//! over HTTP and run.rs runs one from a URL (http.rs is its client, index.rs
//! the remote.json it reads first; the launcher's fetch library brings the
//! groups while it runs). layout.rs names every file of an output. cmd/ is
//! the command line, `bunkai scatter <verb>`: one file a verb.

pub mod cmd;
pub mod check;
pub mod driver;
pub mod dso;
pub mod group;
pub mod http;
pub mod index;
pub mod layout;
pub mod linkflags;
pub mod lower;
pub mod manifest;
pub mod profile;
pub mod run;
pub mod serve;
pub mod stats;
pub mod stubs;
pub mod timing;
pub mod toolchain;

/// BUNKAI_SCATTER_VERSION in scatter/include/bunkai_scatter.h (manifests,
/// indexes and launchers call it `abi`).
pub const ABI: u32 = 5;

#[cfg(test)]
mod tests {
    #[test]
    fn abi_matches_the_shared_header() {
        let inc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
        let v = bunkai_common::c_header::run(&inc, "bunkai_scatter.h", r#"printf("%d\n", BUNKAI_SCATTER_VERSION);"#)
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(v, format!("{}\n", super::ABI), "bump scatter/src/lib.rs ABI with the header");
        let h = include_str!("../include/bunkai_scatter.h");
        for (name, want) in [
            ("BUNKAI_BODY_PREFIX", crate::stubs::BODY_PREFIX),
            ("BUNKAI_GROUP_TABLE", crate::stubs::GROUP_TABLE),
            ("BUNKAI_LIB_PREFIX", crate::layout::LIB_PREFIX),
            ("BUNKAI_NAMES_FILE", crate::layout::NAMES_FILE),
        ] {
            let l = h
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} in header"));
            assert!(l.ends_with(&format!("\"{want}\"")), "{name}: {l}");
        }
    }
}
