//! manifest.json: what a scatter output directory holds.
//!
//! Written last, through a temporary file and a rename, by `bunkai scatter`;
//! read by `bunkai scatter stats` (and later by profile/group/serve). `abi` is
//! BUNKAI_SCATTER_VERSION from scatter/include/bunkai_scatter.h.

use crate::layout::MANIFEST;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const FORMAT: &str = "bunkai-scatter";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: String,
    pub abi: u32,
    pub name: String,
    /// "exe" or "lib".
    pub kind: String,
    /// Launcher path, relative to the output directory.
    pub launcher: String,
    /// Library directory, relative to the output directory.
    pub libdir: String,
    pub inputs: Vec<String>,
    pub clang_flags: Vec<String>,
    pub launcher_bytes: u64,
    /// Size of a library holding no function: the per-library overhead (§5.1).
    pub library_overhead_bytes: u64,
    pub original: Original,
    pub functions: Vec<FunctionEntry>,
    pub kept: Vec<Kept>,
    pub globals: Globals,
    pub exports: usize,
    /// Written by `bunkai scatter group` (§5); absent until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Groups>,
}

/// The grouping of a scatter output (§5.1), and what it needs on a network.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Groups {
    pub threshold_bytes: u64,
    /// Build id of the profile the groups came from.
    pub build: String,
    pub profile_runs: u32,
    /// Functions called in the profile (they fill the first groups).
    pub called: usize,
    pub launcher_zst_bytes: u64,
    /// zstd -19 of the stripped original, for comparison.
    pub original_zst_bytes: u64,
    /// The zstd dictionary the groups are compressed with (0: none); it is
    /// fetched once, before the first group.
    #[serde(default)]
    pub dict_bytes: u64,
    pub list: Vec<GroupEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GroupEntry {
    pub id: u32,
    /// g<hex>.so, relative to the output directory.
    pub file: String,
    pub raw_bytes: u64,
    pub zst_bytes: u64,
    /// SHA-256 of g<hex>.so, hex.
    pub sha256: String,
    /// Function ids, in first-call order.
    pub functions: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Original {
    /// The original built from the same inputs and flags, stripped like the
    /// launcher and the libraries (the paper stripped everything it measured).
    pub path: String,
    pub stripped_bytes: u64,
    pub unstripped_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionEntry {
    pub id: u32,
    pub name: String,
    /// Symbol of the stub in the launcher.
    pub stub: String,
    pub source: String,
    pub library: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Kept {
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Globals {
    /// Merged into __bunkai_data/rodata/bss: [name, struct, offset].
    pub merged: Vec<(String, String, u64)>,
    /// Moved into one function's library: [name, function].
    pub moved: Vec<(String, String)>,
    /// Exported under a new name: [old, new, reason].
    pub exposed: Vec<(String, String, String)>,
}

impl Manifest {
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{} has no {MANIFEST} (give the -o directory of a bunkai scatter run)",
                dir.display()
            )
        })?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{} is not a valid scatter manifest: {e} (scatter the program again)",
                path.display()
            )
        })?;
        if m.format != FORMAT {
            bail!(
                "{} is not a scatter manifest (format {:?}; scatter the program again)",
                path.display(),
                m.format
            );
        }
        if m.abi != crate::ABI {
            bail!(
                "{} was written for scatter ABI {}, this bunkai speaks {} (scatter the program again)",
                path.display(),
                m.abi,
                crate::ABI
            );
        }
        Ok(m)
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        bunkai_common::files::write_atomic(&dir.join(MANIFEST), text.as_bytes())
    }
}
