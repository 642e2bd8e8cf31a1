//! The files of a scatter output directory, named in one place (the C
//! runtime's names are in include/bunkai_scatter.h, pinned by tests):
//!
//! ```text
//! OUT/
//!   manifest.json      MANIFEST: what was scattered (manifest.rs)
//!   profile            PROFILE: functions in first-call order (profile.rs)
//!   remote.json        INDEX: what `bunkai scatter run` fetches first (index.rs)
//!   bin/NAME           the launcher
//!   lib/NAME/          f<hex>.so, one library per function (LIB_PREFIX),
//!                      functions.tsv (NAMES_FILE), g<hex>.so(.zst) groups,
//!                      groups.map(.zst) (GROUP_MAP), groups.dict (DICT_FILE)
//!   bc/NAME/           f<hex>.bc, each function's bitcode, for group (BC_DIR)
//!   original/NAME      the program built whole, for comparison
//! ```

/// OUT/manifest.json.
pub const MANIFEST: &str = "manifest.json";
/// OUT/profile.
pub const PROFILE: &str = "profile";
/// OUT/remote.json.
pub const INDEX: &str = "remote.json";
/// OUT/bc/NAME/f<hex>.bc.
pub const BC_DIR: &str = "bc";
/// lib/NAME/f<hex>.so.
pub const LIB_PREFIX: &str = "f";
/// lib/NAME/functions.tsv: function id and name, for error messages.
pub const NAMES_FILE: &str = "functions.tsv";
/// lib/NAME/groups.map.
pub const GROUP_MAP: &str = "groups.map";
/// lib/NAME/groups.dict: the zstd dictionary of the compressed groups.
pub const DICT_FILE: &str = "groups.dict";

/// A function's library file name.
pub fn lib_file(id: u32) -> String {
    format!("{LIB_PREFIX}{id:x}.so")
}
