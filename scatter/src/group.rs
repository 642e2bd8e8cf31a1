//! `bunkai scatter group`: trace-guided grouping (§5).
//!
//! The grouping is the paper's §5.1 algorithm exactly: walk the profile in
//! first-call order, add each function to the current group unless that
//! would take the group past the threshold, in which case the group is
//! closed and a new one started; a function larger than the threshold ends
//! up alone. Group ids are given in creation order, so the order in which a
//! program running like its profile needs groups is the group id order; the
//! preload thread (§6.2) walks them in that order.
//!
//! Functions the profile never saw come after the called ones, in a fresh
//! group (they never share a library with called code, so a run like the
//! profile downloads none of them), in function-id order, which is the order
//! of the functions in the program's source: neighbours in a file are more
//! likely to be used together than a random pair.
//!
//! Each group is linked from the functions' kept bitcode (OUT/bc/NAME) into
//! one library, g<hex>.so, compressed to g<hex>.so.zst; the group map file
//! tells the manager which group holds which function (§5.2).

use crate::check::{Library, Scattered};
use crate::driver::{library_link_flags, opt_level};
use crate::stubs::GROUP_TABLE;
use crate::lower::{self, Job};
use crate::manifest::{GroupEntry, Groups, Manifest};
use crate::profile::{self, function_size};
use crate::index::{Index, INDEX_FORMAT};
use crate::layout::{BC_DIR, DICT_FILE, GROUP_MAP, INDEX};
use crate::toolchain::Toolchain;
use bunkai_common::files::{file_size, write_atomic};
use bunkai_common::fmt::hex;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

pub const ZSTD_LEVEL: i32 = 19;
/// BUNKAI_GROUP_VERSION: the group map's version, the last character of
/// its magic (BUNKAI_GROUP_MAGIC).
pub const MAP_VERSION: u32 = 4;
pub const MAP_MAGIC: &[u8; 8] = b"BKGROUP4";

/// FNV-1a, 64-bit: the group map's last word, over every byte before it
/// (the manager recomputes it; it detects damage, it is not a signature:
/// a map fetched over HTTP is checked against remote.json's SHA-256).
pub fn map_check(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3))
}

pub struct Options {
    pub out: PathBuf,
    pub threshold: u64,
    pub jobs: usize,
    pub progress: bool,
}

pub struct Summary {
    pub groups: Groups,
    /// Total bytes of the per-function libraries, for comparison.
    pub per_function_bytes: u64,
    pub original_bytes: u64,
    pub launcher_bytes: u64,
    pub log: Vec<String>,
}

/// §5.1 on one sequence of (id, size): greedy, in order.
pub fn greedy(seq: &[(u32, u64)], threshold: u64) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let mut cur: Vec<u32> = Vec::new();
    let mut cur_size = 0u64;
    for &(id, size) in seq {
        if !cur.is_empty() && cur_size + size > threshold {
            out.push(std::mem::take(&mut cur));
            cur_size = 0;
        }
        cur.push(id);
        cur_size += size;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The whole plan: called functions first, then the others.
pub fn plan(called: &[(u32, u64)], uncalled: &[(u32, u64)], threshold: u64) -> Vec<Vec<u32>> {
    let mut g = greedy(called, threshold);
    g.extend(greedy(uncalled, threshold));
    g
}

/// The group map file (layout in scatter/include/bunkai_scatter.h).
pub fn encode_map(nfuncs: usize, groups: &[GroupEntry]) -> Result<Vec<u8>> {
    let mut group_of = vec![u32::MAX; nfuncs];
    let mut slot_of = vec![0u32; nfuncs];
    for g in groups {
        for (slot, &f) in g.functions.iter().enumerate() {
            group_of[f as usize] = g.id;
            slot_of[f as usize] = slot as u32;
        }
    }
    if let Some(missing) = group_of.iter().position(|g| *g == u32::MAX) {
        bail!("internal error: function {missing:x} is in no group");
    }
    let mut b = Vec::with_capacity(16 + 8 * nfuncs + 48 * groups.len() + 8);
    b.extend_from_slice(MAP_MAGIC);
    b.extend_from_slice(&(nfuncs as u32).to_le_bytes());
    b.extend_from_slice(&(groups.len() as u32).to_le_bytes());
    for g in &group_of {
        b.extend_from_slice(&g.to_le_bytes());
    }
    for s in &slot_of {
        b.extend_from_slice(&s.to_le_bytes());
    }
    for g in groups {
        b.extend_from_slice(&g.raw_bytes.to_le_bytes());
        b.extend_from_slice(&g.zst_bytes.to_le_bytes());
        let sha: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&g.sha256[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()?;
        b.extend_from_slice(&sha);
    }
    let check = map_check(&b);
    b.extend_from_slice(&check.to_le_bytes());
    Ok(b)
}

fn group_file(id: u32) -> String {
    format!("g{id:x}.so")
}

fn is_group_file(name: &str) -> bool {
    let rest = match name.strip_prefix('g') {
        Some(r) => r,
        None => return false,
    };
    let hexpart = rest.strip_suffix(".so").or_else(|| rest.strip_suffix(".so.zst"));
    matches!(hexpart, Some(h) if !h.is_empty() && h.bytes().all(|c| c.is_ascii_hexdigit()))
}

pub fn compress(data: &[u8]) -> Result<Vec<u8>> {
    zstd::bulk::compress(data, ZSTD_LEVEL).context("zstd compression failed")
}

const DICT_MAX: usize = 32 << 10;

/// Groups of one program share a lot (ELF headers, PLT stubs, prologues,
/// the program's idioms) that compressing each group alone cannot exploit;
/// the original, compressed as one stream, can. A zstd dictionary trained
/// on the groups carries that shared part once. Returns the dictionary and
/// the compressed groups, or None when it does not pay for itself.
fn compress_with_dictionary(datas: &[Vec<u8>], plain_total: u64) -> Option<(Vec<u8>, Vec<Vec<u8>>)> {
    if datas.len() < 8 {
        return None;
    }
    let total: usize = datas.iter().map(|d| d.len()).sum();
    let size = (total / 100).clamp(4 << 10, DICT_MAX);
    let dict = zstd::dict::from_samples(datas, size).ok()?;
    let mut c = zstd::bulk::Compressor::with_dictionary(ZSTD_LEVEL, &dict).ok()?;
    let zs: Vec<Vec<u8>> = datas.iter().map(|d| c.compress(d)).collect::<Result<_, _>>().ok()?;
    let with: u64 = dict.len() as u64 + zs.iter().map(|z| z.len() as u64).sum::<u64>();
    (with < plain_total).then_some((dict, zs))
}

pub fn group(opts: &Options) -> Result<Summary> {
    let out = &opts.out;
    let mut m = Manifest::read(out)?;
    let prof = profile::read(out, &m)?;
    let bcdir = out.join(format!("{}/{}", BC_DIR, m.name));
    if !bcdir.is_dir() {
        bail!(
            "{} has no function bitcode in {} (scatter it again with this bunkai)",
            out.display(),
            bcdir.display()
        );
    }
    let mut log = Vec::new();

    // The plan (§5.1).
    let called: Vec<(u32, u64)> = prof.order.iter().map(|(id, _)| (*id, function_size(&m, *id))).collect();
    let seen: std::collections::HashSet<u32> = called.iter().map(|(id, _)| *id).collect();
    let uncalled: Vec<(u32, u64)> = (0..m.functions.len() as u32)
        .filter(|id| !seen.contains(id))
        .map(|id| (id, function_size(&m, id)))
        .collect();
    let plan = plan(&called, &uncalled, opts.threshold);
    log.push(format!(
        "{} functions called in {} profiled run(s), {} never called; threshold {} B -> {} groups",
        called.len(),
        prof.runs,
        uncalled.len(),
        opts.threshold,
        plan.len()
    ));
    for (gid, fs) in plan.iter().enumerate() {
        let size: u64 = fs.iter().map(|f| function_size(&m, *f)).sum();
        let names: Vec<&str> = fs.iter().take(4).map(|f| m.functions[*f as usize].name.as_str()).collect();
        let why = if fs.len() == 1 && size > opts.threshold {
            " (larger than the threshold: alone)"
        } else if gid > 0 && fs.first().map_or(false, |f| !seen.contains(f)) && plan[gid - 1].first().map_or(false, |f| seen.contains(f)) {
            " (first group of never-called functions)"
        } else {
            ""
        };
        log.push(format!(
            "group {gid:x}: {} functions, {size} B: {}{}{why}",
            fs.len(),
            names.join(", "),
            if fs.len() > 4 { ", ..." } else { "" }
        ));
    }

    // Link one library per group.
    let tc = Toolchain::discover()?;
    let tmp = tempfile::Builder::new()
        .prefix(".bunkai-group-")
        .tempdir_in(out)
        .with_context(|| format!("cannot write in {}", out.display()))?;
    let _cleanup = bunkai_common::files::remove_on_interrupt(tmp.path());
    let template = lower::link_template(&tc, tmp.path(), &library_link_flags(&m.clang_flags))?;
    // Every function's id and stub: a group calls its own functions'
    // bodies directly and the others' through slots the manager rebinds.
    let ids = tmp.path().join("ids.tsv");
    std::fs::write(
        &ids,
        m.functions.iter().map(|f| format!("{:x}\t{}\n", f.id, f.stub)).collect::<String>(),
    )?;
    let mut jobs = Vec::new();
    for (gid, fs) in plan.iter().enumerate() {
        let inputs: Vec<PathBuf> = fs.iter().map(|f| bcdir.join(format!("f{f:x}.bc"))).collect();
        if let Some(missing) = inputs.iter().find(|p| !p.exists()) {
            bail!("{} is missing (scatter the program again)", missing.display());
        }
        jobs.push(Job {
            inputs,
            group: true,
            output: tmp.path().join(group_file(gid as u32)),
            what: format!("group {gid:x}"),
        });
    }
    lower::run(&tc, &template, opt_level(&m.clang_flags), Some(&ids), jobs, opts.jobs, opts.progress)?;
    // What the loader will make of them (check.rs); the launcher does not
    // change, so it is not compared with the original again.
    Scattered {
        launcher: out.join(&m.launcher),
        original: out.join(&m.original.path),
        drop_in: false,
        libraries: (0..plan.len() as u32)
            .map(|gid| Library {
                path: tmp.path().join(group_file(gid)),
                body: GROUP_TABLE.into(),
                what: format!("group {gid:x}"),
            })
            .collect(),
        search: lower::search_dirs(&template),
        root: tmp.path().to_path_buf(),
    }
    .check()?;

    // Checksums and compression (with a dictionary when it pays): zstd -19
    // over every group twice, seconds for a large program.
    let shown = bunkai_common::progress::Progress::labelled(opts.progress, "compressing the groups", None, "");
    let datas: Vec<Vec<u8>> = (0..plan.len() as u32)
        .map(|gid| std::fs::read(tmp.path().join(group_file(gid))))
        .collect::<Result<_, _>>()?;
    let plain: Vec<Vec<u8>> = datas.iter().map(|d| compress(d)).collect::<Result<_>>()?;
    let plain_total: u64 = plain.iter().map(|z| z.len() as u64).sum();
    let (dict, zsts) = match compress_with_dictionary(&datas, plain_total) {
        Some((d, z)) => (Some(d), z),
        None => (None, plain),
    };
    log.push(match &dict {
        Some(d) => format!(
            "compressed with a {} B zstd dictionary: {} B in all, {} B without",
            d.len(),
            d.len() as u64 + zsts.iter().map(|z| z.len() as u64).sum::<u64>(),
            plain_total
        ),
        None => format!("compressed without a dictionary: {plain_total} B"),
    });
    let mut list = Vec::new();
    for (gid, fs) in plan.iter().enumerate() {
        let data = &datas[gid];
        let zst = &zsts[gid];
        let gid = gid as u32;
        std::fs::write(tmp.path().join(format!("{}.zst", group_file(gid))), zst)?;
        list.push(GroupEntry {
            id: gid,
            file: format!("{}/{}", m.libdir, group_file(gid)),
            raw_bytes: data.len() as u64,
            zst_bytes: zst.len() as u64,
            sha256: hex(&Sha256::digest(data)),
            functions: fs.clone(),
        });
    }
    let map = encode_map(m.functions.len(), &list)?;
    let launcher = std::fs::read(out.join(&m.launcher))?;
    let launcher_zst = compress(&launcher)?;
    let original = std::fs::read(out.join(&m.original.path)).unwrap_or_default();
    let original_zst_bytes = compress(&original)?.len() as u64;
    shown.finish();

    // Into place. The manager uses groups only when groups.map exists, so
    // removing it first keeps the output usable (per function) throughout.
    let libdir = out.join(&m.libdir);
    let map_path = libdir.join(GROUP_MAP);
    if map_path.exists() {
        std::fs::remove_file(&map_path)?;
    }
    for e in std::fs::read_dir(&libdir)? {
        let e = e?;
        if is_group_file(&e.file_name().to_string_lossy()) {
            std::fs::remove_file(e.path())?;
        }
    }
    for e in std::fs::read_dir(tmp.path())? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if is_group_file(&name) {
            std::fs::rename(e.path(), libdir.join(&name))?;
        }
    }
    let launcher_zst_path = out.join(format!("{}.zst", m.launcher));
    write_atomic(&launcher_zst_path, &launcher_zst)?;
    let dict_path = libdir.join(DICT_FILE);
    match &dict {
        Some(d) => write_atomic(&dict_path, d)?,
        None => {
            if dict_path.exists() {
                std::fs::remove_file(&dict_path)?;
            }
        }
    }
    let map_zst = compress(&map)?;
    write_atomic(&libdir.join(format!("{}.zst", GROUP_MAP)), &map_zst)?;
    write_atomic(&map_path, &map)?;
    let groups = Groups {
        threshold_bytes: opts.threshold,
        build: prof.build.clone(),
        profile_runs: prof.runs,
        called: called.len(),
        launcher_zst_bytes: launcher_zst.len() as u64,
        original_zst_bytes,
        dict_bytes: dict.as_ref().map_or(0, |d| d.len() as u64),
        list,
    };
    let index = Index {
        format: INDEX_FORMAT.into(),
        abi: crate::ABI,
        name: m.name.clone(),
        kind: m.kind.clone(),
        build: prof.build.clone(),
        launcher: m.launcher.clone(),
        launcher_bytes: launcher.len() as u64,
        launcher_sha256: hex(&Sha256::digest(&launcher)),
        launcher_zst_bytes: launcher_zst.len() as u64,
        libdir: m.libdir.clone(),
        map_bytes: map.len() as u64,
        map_sha256: hex(&Sha256::digest(&map)),
        map_zst_bytes: map_zst.len() as u64,
        dict_bytes: dict.as_ref().map_or(0, |d| d.len() as u64),
        dict_sha256: dict.as_ref().map_or(String::new(), |d| hex(&Sha256::digest(d))),
    };
    write_atomic(&out.join(INDEX), serde_json::to_string_pretty(&index)?.as_bytes())?;
    m.groups = Some(groups.clone());
    m.write(out)?;

    let per_function_bytes = m.functions.iter().map(|f| file_size(&out.join(&f.library))).sum();
    Ok(Summary {
        groups,
        per_function_bytes,
        original_bytes: m.original.stripped_bytes,
        launcher_bytes: launcher.len() as u64,
        log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_example() {
        // §5.1: a..h of 4, 8, 6, 48, 4, 4, 4, 4 KiB with a 16 KiB threshold
        // give {a,b} {c} {d} {e,f,g,h}.
        let k = 1024;
        let seq: Vec<(u32, u64)> =
            [4, 8, 6, 48, 4, 4, 4, 4].iter().enumerate().map(|(i, s)| (i as u32, s * k)).collect();
        assert_eq!(greedy(&seq, 16 * k), vec![vec![0, 1], vec![2], vec![3], vec![4, 5, 6, 7]]);
    }

    #[test]
    fn exact_fit_stays_and_uncalled_start_fresh() {
        assert_eq!(greedy(&[(0, 8), (1, 8), (2, 1)], 16), vec![vec![0, 1], vec![2]]);
        assert_eq!(plan(&[(5, 1)], &[(0, 1), (1, 1)], 16), vec![vec![5], vec![0, 1]]);
        assert!(plan(&[], &[], 16).is_empty());
    }

    #[test]
    fn map_layout() {
        let g = |id: u32, fs: Vec<u32>| GroupEntry {
            id,
            file: String::new(),
            raw_bytes: 10 + id as u64,
            zst_bytes: 5,
            sha256: "ab".repeat(32),
            functions: fs,
        };
        let b = encode_map(3, &[g(0, vec![2, 0]), g(1, vec![1])]).unwrap();
        assert_eq!(&b[..8], MAP_MAGIC);
        assert_eq!(b.len(), 16 + 3 * 8 + 2 * 48 + 8);
        let n = b.len();
        assert_eq!(u64::from_le_bytes(b[n - 8..].try_into().unwrap()), map_check(&b[..n - 8]));
        // The manager's FNV-1a: the published test vectors.
        assert_eq!(map_check(b""), 0xcbf29ce484222325);
        assert_eq!(map_check(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(map_check(b"foobar"), 0x85944171f73967e8);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!((u32_at(16), u32_at(20), u32_at(24)), (0, 1, 0), "group_of");
        assert_eq!((u32_at(28), u32_at(32), u32_at(36)), (1, 0, 0), "slot_of");
        assert_eq!(u64::from_le_bytes(b[40..48].try_into().unwrap()), 10);
        assert!(encode_map(4, &[g(0, vec![0])]).is_err());
    }

    #[test]
    fn group_file_names() {
        assert!(is_group_file("g0.so") && is_group_file("g1f.so.zst"));
        assert!(!is_group_file("groups.map") && !is_group_file("f1.so") && !is_group_file("g.so"));
    }

    #[test]
    fn magic_matches_the_header() {
        let inc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
        let got = bunkai_common::c_header::run(
            &inc,
            "bunkai_scatter.h",
            r#"printf("%d %s %zu %s\n", BUNKAI_GROUP_VERSION, BUNKAI_GROUP_MAGIC, sizeof BUNKAI_GROUP_MAGIC - 1, BUNKAI_GROUP_MAP);"#,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let magic = std::str::from_utf8(MAP_MAGIC).unwrap();
        assert_eq!(got, format!("{MAP_VERSION} {magic} 8 {GROUP_MAP}\n"));
        assert_eq!(magic, format!("BKGROUP{MAP_VERSION}"), "the magic ends with the map's version");
    }
}
