//! What an ELF shared object or executable offers and asks for at run time,
//! as the dynamic loader sees it: its SONAME, the libraries it needs, where
//! it looks for them, its defined and undefined dynamic symbols and their
//! versions. Read with the `object` crate; used to check a scatter result
//! (check.rs) and to learn what the original library exports.

use anyhow::{bail, Context, Result};
use object::elf;
use object::read::elf::{Dyn, ElfFile64, Sym};
use object::read::SymbolIndex;
use object::Endianness;
use std::collections::{BTreeSet, HashSet};
use std::path::Path;

#[derive(Debug, Default)]
pub struct Dso {
    pub soname: Option<String>,
    pub needed: Vec<String>,
    /// DT_RUNPATH or DT_RPATH directories, as written ($ORIGIN unexpanded).
    pub runpath: Vec<String>,
    /// Defined dynamic symbols as `name` (no version), `name@@VERSION` (the
    /// default version) or `name@VERSION` (a hidden, non-default one).
    pub defined: BTreeSet<String>,
    /// Names a reference without a version binds to: defined, and
    /// unversioned or of a default version.
    pub binds: HashSet<String>,
    /// Undefined dynamic symbols that must be found (not weak).
    pub undefined: BTreeSet<String>,
    /// Version definitions other than the base one, as `NAME` or
    /// `NAME (PARENT...)`.
    pub versions: Vec<String>,
}

impl Dso {
    pub fn read(path: &Path) -> Result<Dso> {
        let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Dso::parse(&data).with_context(|| format!("{} is not an ELF object bunkai can read", path.display()))
    }

    pub fn parse(data: &[u8]) -> Result<Dso> {
        let file = ElfFile64::<Endianness>::parse(data)?;
        let endian = file.endian();
        let sections = file.elf_section_table();
        let mut d = Dso::default();

        if let Some((dyns, link)) = sections.dynamic(endian, data)? {
            let strings = sections.strings(endian, data, link)?;
            for e in dyns {
                let Some(tag) = e.tag32(endian) else { continue };
                let s = || -> Result<String> { Ok(String::from_utf8_lossy(e.string(endian, strings)?).into_owned()) };
                match tag {
                    elf::DT_SONAME => d.soname = Some(s()?),
                    elf::DT_NEEDED => d.needed.push(s()?),
                    elf::DT_RUNPATH | elf::DT_RPATH => {
                        d.runpath.extend(s()?.split(':').filter(|p| !p.is_empty()).map(String::from))
                    }
                    _ => {}
                }
            }
        }

        let versions = sections.versions(endian, data)?;
        let syms = file.elf_dynamic_symbol_table();
        let strings = syms.strings();
        for (i, sym) in syms.enumerate() {
            if i.0 == 0 || sym.st_bind() == elf::STB_LOCAL {
                continue;
            }
            let name = String::from_utf8_lossy(sym.name(endian, strings)?).into_owned();
            if sym.st_shndx(endian) == elf::SHN_UNDEF {
                if sym.st_bind() != elf::STB_WEAK {
                    d.undefined.insert(name);
                }
                continue;
            }
            let (label, default) = match &versions {
                Some(v) => version_label(v, endian, i, &name)?,
                None => (name.clone(), true),
            };
            if default {
                d.binds.insert(name);
            }
            d.defined.insert(label);
        }

        if let Some((mut defs, link)) = sections.gnu_verdef(endian, data)? {
            let strings = sections.strings(endian, data, link)?;
            while let Some((def, mut aux)) = defs.next()? {
                if def.vd_flags.get(endian) & elf::VER_FLG_BASE != 0 {
                    continue;
                }
                let mut names = Vec::new();
                while let Some(a) = aux.next()? {
                    names.push(String::from_utf8_lossy(a.name(endian, strings)?).into_owned());
                }
                match names.split_first() {
                    Some((n, [])) => d.versions.push(n.clone()),
                    Some((n, parents)) => d.versions.push(format!("{n} ({})", parents.join(" "))),
                    None => bail!("a version definition without a name"),
                }
            }
        }
        Ok(d)
    }
}

/// `name`, `name@@V` or `name@V` for defined dynamic symbol `i`, and whether
/// an unversioned reference binds to it.
fn version_label(
    v: &object::read::elf::VersionTable<'_, elf::FileHeader64<Endianness>>,
    endian: Endianness,
    i: SymbolIndex,
    name: &str,
) -> Result<(String, bool)> {
    let vi = v.version_index(endian, i);
    Ok(match v.version(vi)? {
        None => (name.to_string(), true),
        Some(ver) => {
            let ver = String::from_utf8_lossy(ver.name());
            if vi.is_hidden() {
                (format!("{name}@{ver}"), false)
            } else {
                (format!("{name}@@{ver}"), true)
            }
        }
    })
}

/// The name in a `defined` label.
pub fn symbol_name(label: &str) -> &str {
    label.split('@').next().unwrap_or(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_system_zlib_as_the_loader_sees_it() {
        // Debian's libz.so.1: SONAME, versions, the API under ZLIB_*.
        let d = Dso::read(Path::new("/lib/x86_64-linux-gnu/libz.so.1")).unwrap();
        assert_eq!(d.soname.as_deref(), Some("libz.so.1"));
        assert!(d.needed.iter().any(|n| n == "libc.so.6"), "{:?}", d.needed);
        // zlib.map lists the API added after 1.2.0 under versions, and
        // leaves the older API unversioned.
        assert!(d.defined.contains("compressBound@@ZLIB_1.2.0"), "{:?}", d.defined);
        assert!(d.defined.contains("deflate"));
        assert!(d.binds.contains("deflate") && d.binds.contains("compressBound"));
        assert!(d.versions.iter().any(|v| v == "ZLIB_1.2.0.2 (ZLIB_1.2.0)"), "{:?}", d.versions);
        assert!(d.undefined.contains("malloc"));
        assert!(!d.defined.iter().any(|s| symbol_name(s) == "_tr_init"));
        assert_eq!(symbol_name("deflate@@ZLIB_1.2.0"), "deflate");
    }

    #[test]
    fn refuses_what_is_not_elf() {
        assert!(Dso::parse(b"not an ELF file at all").is_err());
    }
}
