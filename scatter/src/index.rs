//! OUT/remote.json, the index `bunkai scatter run` fetches first: its format, and
//! the checks an index from the network passes before anything in it is
//! used (paths joined to the cache, names printed in the decision log).

use crate::layout::INDEX;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::path::{Component, Path};

pub const INDEX_FORMAT: &str = "bunkai-remote/1";

/// OUT/remote.json: what `bunkai scatter run` needs before the program starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Index {
    pub format: String,
    pub abi: u32,
    pub name: String,
    pub kind: String,
    pub build: String,
    /// Launcher path relative to the output directory; `.zst` beside it.
    pub launcher: String,
    pub launcher_bytes: u64,
    pub launcher_sha256: String,
    pub launcher_zst_bytes: u64,
    /// Library directory relative to the output directory; holds
    /// groups.map and g<hex>.so(.zst).
    pub libdir: String,
    pub map_bytes: u64,
    pub map_sha256: String,
    /// groups.map.zst beside it.
    pub map_zst_bytes: u64,
    /// groups.dict, the zstd dictionary of the .zst groups (0: none).
    pub dict_bytes: u64,
    pub dict_sha256: String,
}

impl Index {
    pub fn parse(text: &[u8]) -> Result<Index> {
        let i: Index = serde_json::from_slice(text)
            .map_err(|e| anyhow::anyhow!("the origin's {INDEX} is not a bunkai index: {e}"))?;
        if i.format != INDEX_FORMAT {
            bail!("the origin's {INDEX} has format {:?}, not {INDEX_FORMAT}", i.format);
        }
        if i.abi != crate::ABI {
            bail!("the origin serves scatter ABI {}, this bunkai speaks {} (group it with this bunkai)", i.abi, crate::ABI);
        }
        for p in [&i.launcher, &i.libdir] {
            if !safe_relative(p) {
                bail!("the origin's {INDEX} names an unsafe path {p:?}");
            }
        }
        // Printed in the decision log: nothing that moves a terminal.
        let plain = |v: &str| !v.is_empty() && v.len() <= 255 && v.chars().all(|c| c.is_ascii_graphic() && c != '/' && c != '\\');
        if !plain(&i.name) {
            bail!("the origin's {INDEX} has a bad name {:?} (printable ASCII without / or \\)", i.name);
        }
        if i.kind != "exe" && i.kind != "lib" {
            bail!("the origin's {INDEX} has an unknown kind {:?} (exe or lib)", i.kind);
        }
        if !plain(&i.build) || i.build.len() > 64 {
            bail!("the origin's {INDEX} has a bad build id {:?}", i.build);
        }
        let hex = |v: &str| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit());
        for (what, v) in [("launcher_sha256", &i.launcher_sha256), ("map_sha256", &i.map_sha256)] {
            if !hex(v) {
                bail!("the origin's {INDEX} has a bad {what} {v:?} (64 hex digits)");
            }
        }
        if i.dict_bytes > 0 && !hex(&i.dict_sha256) {
            bail!("the origin's {INDEX} has a bad dict_sha256 {:?} (64 hex digits)", i.dict_sha256);
        }
        Ok(i)
    }
}

/// A relative path with no `..`, no root, nothing odd: safe to join.
pub fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 4096
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.chars().any(|ch| ch.is_control() || ch == '\\'))
        && Path::new(p).components().all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert!(safe_relative("lib/x/g0.so"));
        assert!(!safe_relative("../etc/passwd"));
        assert!(!safe_relative("/etc/passwd"));
        assert!(!safe_relative("a/../../b"));
        assert!(!safe_relative(""));
    }

    #[test]
    fn index_checks() {
        let good = Index {
            format: INDEX_FORMAT.into(),
            abi: crate::ABI,
            name: "x".into(),
            kind: "exe".into(),
            build: "0".repeat(16),
            launcher: "bin/x".into(),
            launcher_bytes: 1,
            launcher_sha256: "0".repeat(64),
            launcher_zst_bytes: 1,
            libdir: "lib/x".into(),
            map_bytes: 1,
            map_sha256: "0".repeat(64),
            map_zst_bytes: 1,
            dict_bytes: 0,
            dict_sha256: String::new(),
        };
        let text = serde_json::to_vec(&good).unwrap();
        assert_eq!(Index::parse(&text).unwrap(), good);
        let mut bad = good.clone();
        bad.launcher = "../../bin/sh".into();
        assert!(Index::parse(&serde_json::to_vec(&bad).unwrap()).is_err());
        assert!(Index::parse(b"<html>").is_err());
        let mut old = good;
        old.abi = 1;
        assert!(Index::parse(&serde_json::to_vec(&old).unwrap()).is_err());
    }

    /// The index comes from the network: mutated indexes (bytes flipped,
    /// cut, JSON punctuation inserted; fields set to hostile values) are
    /// refused in one line naming remote.json, and an accepted one holds
    /// only safe paths and plain names (nothing that escapes the cache or
    /// writes escape sequences to the terminal in the decision log).
    #[test]
    fn mutated_indexes_are_refused_or_safe() {
        let good = Index {
            format: INDEX_FORMAT.into(),
            abi: crate::ABI,
            name: "sqlite3".into(),
            kind: "exe".into(),
            build: "0123456789abcdef".into(),
            launcher: "bin/sqlite3".into(),
            launcher_bytes: 1000,
            launcher_sha256: "a".repeat(64),
            launcher_zst_bytes: 500,
            libdir: "lib/sqlite3".into(),
            map_bytes: 100,
            map_sha256: "b".repeat(64),
            map_zst_bytes: 50,
            dict_bytes: 0,
            dict_sha256: String::new(),
        };
        let text = serde_json::to_vec(&good).unwrap();
        let hostile = [
            "", ".", "..", "../x", "/etc/passwd", "a/../../b", "a\0b", "bin/\u{1b}[2J", "C:\\x", "a//b", "~/x",
            "bin/sqlite3", "lib/x", "\u{202e}x", "x\ny",
        ];
        let mut x = 0x243f6a8885a308d3u64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545F4914F6CDD1D)
        };
        let (mut ok, mut refused) = (0, 0);
        for round in 0..20000 {
            let mut v = text.clone();
            if round % 2 == 0 {
                for _ in 0..1 + next() % 3 {
                    let i = (next() % (v.len() as u64 + 1)) as usize;
                    match next() % 4 {
                        0 if i < v.len() => v[i] ^= 1 << (next() % 8),
                        1 => v.truncate(i),
                        2 => v.insert(i, b"\"{}[],:0-e."[(next() % 11) as usize]),
                        _ if i < v.len() => v[i] = next() as u8,
                        _ => {}
                    }
                }
            } else {
                let mut j: serde_json::Value = serde_json::from_slice(&text).unwrap();
                let fields = ["name", "kind", "build", "launcher", "libdir", "launcher_sha256", "map_sha256", "dict_sha256", "format"];
                let field = fields[(next() % fields.len() as u64) as usize];
                j[field] = serde_json::Value::String(hostile[(next() % hostile.len() as u64) as usize].to_string());
                if next() % 4 == 0 {
                    j["dict_bytes"] = serde_json::json!(7);
                }
                v = serde_json::to_vec(&j).unwrap();
            }
            match Index::parse(&v) {
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.starts_with("the origin") && !e.contains('\n'), "{e}");
                    refused += 1;
                }
                Ok(i) => {
                    assert!(safe_relative(&i.launcher) && safe_relative(&i.libdir), "{i:?}");
                    assert!(!i.launcher.split('/').any(|c| c == ".." || c.is_empty()), "{i:?}");
                    for f in [&i.name, &i.kind, &i.build, &i.launcher_sha256, &i.map_sha256] {
                        assert!(f.chars().all(|c| c.is_ascii_graphic()), "{i:?}");
                    }
                    assert_eq!((i.format.as_str(), i.abi), (INDEX_FORMAT, crate::ABI));
                    ok += 1;
                }
            }
        }
        assert!(ok > 1000 && refused > 1000, "{ok} accepted, {refused} refused");
    }
}
