//! `bunkai scatter stats`: the paper's Tables 3 and 4 for one scatter output.
//! Sizes are read from the files on disk (the manifest says which files).

use crate::manifest::Manifest;
use bunkai_common::files::file_size;
use anyhow::Result;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct Stats {
    pub name: String,
    pub kind: String,
    pub launcher_bytes: u64,
    pub original_bytes: u64,
    pub original_unstripped_bytes: u64,
    /// launcher / original, percent (Table 3).
    pub launcher_ratio: f64,
    pub libraries: usize,
    pub library_bytes: u64,
    /// total libraries / original, percent (Table 4).
    pub library_ratio: f64,
    pub library_overhead_bytes: u64,
    pub kept_in_launcher: usize,
    pub missing_libraries: usize,
    /// After `bunkai scatter group` (Table 7): groups, their bytes, compressed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<GroupStats>,
}

#[derive(Debug, Serialize)]
pub struct GroupStats {
    pub threshold_bytes: u64,
    pub groups: usize,
    pub group_bytes: u64,
    pub group_ratio: f64,
    pub group_zst_bytes: u64,
    pub original_zst_bytes: u64,
}

pub fn compute(dir: &Path) -> Result<Stats> {
    let m = Manifest::read(dir)?;
    let launcher_bytes = file_size(&dir.join(&m.launcher));
    let mut library_bytes = 0;
    let mut missing = 0;
    for f in &m.functions {
        let p = dir.join(&f.library);
        if p.exists() {
            library_bytes += file_size(&p);
        } else {
            missing += 1;
        }
    }
    let original = m.original.stripped_bytes.max(1);
    Ok(Stats {
        name: m.name.clone(),
        kind: m.kind.clone(),
        launcher_bytes,
        original_bytes: m.original.stripped_bytes,
        original_unstripped_bytes: m.original.unstripped_bytes,
        launcher_ratio: 100.0 * launcher_bytes as f64 / original as f64,
        libraries: m.functions.len(),
        library_bytes,
        library_ratio: 100.0 * library_bytes as f64 / original as f64,
        library_overhead_bytes: m.library_overhead_bytes,
        kept_in_launcher: m.kept.len(),
        missing_libraries: missing,
        groups: m.groups.as_ref().map(|g| {
            let bytes: u64 = g.list.iter().map(|e| e.raw_bytes).sum();
            GroupStats {
                threshold_bytes: g.threshold_bytes,
                groups: g.list.len(),
                group_bytes: bytes,
                group_ratio: 100.0 * bytes as f64 / original as f64,
                group_zst_bytes: g.list.iter().map(|e| e.zst_bytes).sum::<u64>() + g.dict_bytes,
                original_zst_bytes: g.original_zst_bytes,
            }
        }),
    })
}

fn kib(b: u64) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

pub fn render(s: &Stats) -> String {
    let mut t = String::new();
    t.push_str(&format!("{} ({})\n", s.name, s.kind));
    t.push_str(&format!(
        "  launcher        {:>14}   {:6.1}% of the original   (Table 3)\n",
        kib(s.launcher_bytes),
        s.launcher_ratio
    ));
    t.push_str(&format!(
        "  libraries       {:>14}   {:6.1}% of the original   (Table 4), {} files, {} B overhead each\n",
        kib(s.library_bytes),
        s.library_ratio,
        s.libraries,
        s.library_overhead_bytes
    ));
    t.push_str(&format!(
        "  original        {:>14}   stripped ({} unstripped)\n",
        kib(s.original_bytes),
        kib(s.original_unstripped_bytes)
    ));
    if let Some(g) = &s.groups {
        t.push_str(&format!(
            "  groups          {:>14}   {:6.1}% of the original   (Table 7), {} groups at {} B; {} compressed\n",
            kib(g.group_bytes),
            g.group_ratio,
            g.groups,
            g.threshold_bytes,
            kib(g.group_zst_bytes)
        ));
    }
    if s.kept_in_launcher > 0 {
        t.push_str(&format!("  kept in launcher: {} functions\n", s.kept_in_launcher));
    }
    if s.missing_libraries > 0 {
        t.push_str(&format!("  MISSING: {} libraries are not on disk\n", s.missing_libraries));
    }
    t
}
