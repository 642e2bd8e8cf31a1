//! bunkai mod: DKM's module server (Hattori, Oikawa & Tokuda, seed 004) for
//! a running host process instead of the RT-Mach kernel.
//!
//! - meta.rs: a module's metadata (name, version, interfaces implemented and
//!   required) from its `.bunkai_mod` section; interface hashes.
//! - link.rs: our linker for x86-64 relocatable objects: pre-link (sizes from
//!   the section headers), link (symbols, relocations, PLT and GOT).
//! - memfd.rs: the zero-copy image (a memfd the linker writes into and the
//!   host maps) and descriptor passing.
//! - proto.rs: the wire protocol to libbunkai-host (mod/include/bunkai_mod.h).
//! - server.rs: load (DKM's seven stages, each timed), unload, swap, list.
//! - model.rs: the load-time model of §4 (a linear fit per stage).
//! - bench.rs: the evaluation (`bunkai mod bench`, `calibrate`): Table 1,
//!   measurement 2, the model's prediction error, dlopen beside ours.
//! - fuzz.rs: a mutator of module objects and a dry link at fixed
//!   addresses, for the fuzz tests here and the host campaign in tests/e2e.
//! - cmd/: the command line, `bunkai mod <verb>`: one file a verb.

pub mod bench;
pub mod cmd;
pub mod fuzz;
pub mod link;
pub mod memfd;
pub mod meta;
pub mod model;
pub mod proto;
pub mod server;

/// BUNKAI_MOD_VERSION in mod/include/bunkai_mod.h (BUNKAI_MOD_ABI, its old
/// name, is a deprecated alias there).
pub const ABI: u32 = 2;

#[cfg(test)]
mod tests {
    #[test]
    fn abi_and_messages_match_the_shared_header() {
        let h = include_str!("../include/bunkai_mod.h");
        let def = |name: &str| -> u32 {
            let l = h
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} in header"));
            l.split_whitespace().nth(2).unwrap().parse().unwrap()
        };
        let inc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
        let v = bunkai_common::c_header::run(
            &inc,
            "bunkai_mod.h",
            r#"printf("%d %d\n", BUNKAI_MOD_VERSION, BUNKAI_MOD_ABI);"#,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(v, format!("{0} {0}\n", super::ABI), "BUNKAI_MOD_VERSION, and its old name BUNKAI_MOD_ABI");
        use crate::proto::Msg;
        for (name, m) in [
            ("BUNKAI_MSG_HELLO", Msg::Hello),
            ("BUNKAI_MSG_RESOLVE", Msg::Resolve),
            ("BUNKAI_MSG_ALLOC", Msg::Alloc),
            ("BUNKAI_MSG_WRITE", Msg::Write),
            ("BUNKAI_MSG_PROTECT", Msg::Protect),
            ("BUNKAI_MSG_COMMIT", Msg::Commit),
            ("BUNKAI_MSG_UNLOAD", Msg::Unload),
            ("BUNKAI_MSG_EVICT", Msg::Evict),
            ("BUNKAI_MSG_MAP", Msg::Map),
            ("BUNKAI_MSG_UNLOAD_NAME", Msg::UnloadName),
            ("BUNKAI_MSG_OK", Msg::Ok),
            ("BUNKAI_MSG_ERR", Msg::Err),
        ] {
            assert_eq!(def(name), m as u32, "{name}");
        }
        assert!(h.contains(&format!("#define BUNKAI_MOD_SECTION \"{}\"", crate::meta::SECTION)));
    }
}
