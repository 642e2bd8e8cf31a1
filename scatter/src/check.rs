//! The checks a scatter result passes before it is installed: what the
//! dynamic loader will do with it, read from the files (dso.rs), without
//! running any of the program's code.
//!
//! - Every function (or group) library defines, and exports, its body
//!   (`__bunkai_f<hex>`, or `__bunkai_gtab` for a group): the manager looks
//!   it up by name on the first call.
//! - Every symbol a library or the launcher needs is found: the launcher
//!   exports it, a library they load (DT_NEEDED, searched in their
//!   run paths and the link's library directories) defines it, or the
//!   original needed it from outside too (a library's host program).
//! - With --lib, the launcher library is a drop-in for the original: the
//!   same SONAME, the same version definitions, the same exported symbols
//!   with the same versions, apart from the launcher's own `__bunkai_`
//!   symbols (under the version PRIVATE_VERSION when the library has a
//!   version script).
//!
//! A failed check is one line naming the file, the symbol and what is
//! wrong.

use crate::dso::{symbol_name, Dso};
use anyhow::{bail, Result};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The version node the launcher's internal symbols get in a library with a
/// version script (the driver writes it after the user's script).
pub const PRIVATE_VERSION: &str = "BUNKAI_PRIVATE";
/// The prefix of every symbol bunkai adds.
pub const OWN_PREFIX: &str = "__bunkai_";

/// One function or group library and what it must define.
pub struct Library {
    pub path: PathBuf,
    /// The body (or table) the manager looks up.
    pub body: String,
    /// What it holds, for messages: a function's name, "group 3".
    pub what: String,
}

pub struct Scattered {
    pub launcher: PathBuf,
    pub original: PathBuf,
    /// Whether the launcher must be a drop-in for the original library
    /// (a --lib build).
    pub drop_in: bool,
    pub libraries: Vec<Library>,
    /// The link's library directories (`-L` of clang's link line), where
    /// the loader's defaults are too.
    pub search: Vec<PathBuf>,
    /// Output root, to name files relative to it.
    pub root: PathBuf,
}

impl Scattered {
    fn name(&self, p: &Path) -> String {
        p.strip_prefix(&self.root).unwrap_or(p).display().to_string()
    }

    pub fn check(&self) -> Result<()> {
        let launcher = Dso::read(&self.launcher)?;
        let original = Dso::read(&self.original)?;
        let lname = self.name(&self.launcher);
        if self.drop_in {
            drop_in(&lname, &launcher, &original)?;
        }
        let mut deps = Deps::new(&self.search);
        // What the loader finds for a reference without a version.
        let mut allowed: HashSet<String> = launcher.binds.clone();
        allowed.extend(original.undefined.iter().cloned());
        let origin = self.launcher.parent().unwrap_or(Path::new("."));
        deps.add(&launcher, origin, &mut allowed);
        if let Some(s) = launcher.undefined.iter().find(|s| !allowed.contains(*s)) {
            bail!(
                "{lname} needs {s}, which no library it loads defines (check the link flags after --)"
            );
        }
        for l in &self.libraries {
            let d = Dso::read(&l.path)?;
            let rel = self.name(&l.path);
            if !d.binds.contains(&l.body) {
                bail!(
                    "{rel} ({}) does not export {}, its body (a link flag after -- hides it: give the \
                     library's own link options as -Wl,OPTION or -Xlinker OPTION, which scatter keeps \
                     off the function libraries)",
                    l.what,
                    l.body
                );
            }
            let origin = l.path.parent().unwrap_or(Path::new("."));
            let mut extra = HashSet::new();
            deps.add(&d, origin, &mut extra);
            if let Some(s) = d.undefined.iter().find(|s| !allowed.contains(*s) && !extra.contains(*s)) {
                bail!(
                    "{rel} ({}) needs {s}, which {lname} does not export (the launcher's link flags \
                     hide it: export it, e.g. in the version script)",
                    l.what
                );
            }
        }
        Ok(())
    }
}

/// The launcher library against the original: SONAME, versions, exports.
fn drop_in(lname: &str, launcher: &Dso, original: &Dso) -> Result<()> {
    if launcher.soname != original.soname {
        bail!(
            "{lname} has SONAME {}, the original {} (report this, with the flags after --)",
            launcher.soname.as_deref().unwrap_or("(none)"),
            original.soname.as_deref().unwrap_or("(none)")
        );
    }
    let versions: Vec<&String> = launcher.versions.iter().filter(|v| *v != PRIVATE_VERSION).collect();
    let want: Vec<&String> = original.versions.iter().collect();
    if versions != want {
        bail!(
            "{lname} defines the versions {}, the original {} (report this, with the flags after --)",
            list(versions.iter().map(|s| s.as_str())),
            list(want.iter().map(|s| s.as_str()))
        );
    }
    let ours: BTreeSet<&String> = launcher
        .defined
        .iter()
        .filter(|s| !symbol_name(s).starts_with(OWN_PREFIX))
        .collect();
    let theirs: BTreeSet<&String> = original.defined.iter().collect();
    let missing: Vec<&str> = theirs.difference(&ours).map(|s| s.as_str()).collect();
    let extra: Vec<&str> = ours.difference(&theirs).map(|s| s.as_str()).collect();
    if !missing.is_empty() || !extra.is_empty() {
        let mut what = Vec::new();
        if !missing.is_empty() {
            what.push(format!("does not export {}", few(&missing)));
        }
        if !extra.is_empty() {
            what.push(format!("exports {}", few(&extra)));
        }
        bail!(
            "{lname} {} as the original does not (report this, with the flags after --)",
            what.join(" and ")
        );
    }
    Ok(())
}

fn list<'a>(v: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = v.collect();
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

/// A few names, then how many more.
fn few(v: &[&str]) -> String {
    let shown = v.iter().take(3).copied().collect::<Vec<_>>().join(", ");
    if v.len() > 3 {
        format!("{shown} and {} more", v.len() - 3)
    } else {
        shown
    }
}

/// A library some object loads: what it defines for a reference without
/// a version, and what it loads in turn.
struct Loaded {
    binds: HashSet<String>,
    needed: Vec<String>,
    runpath: Vec<String>,
    dir: PathBuf,
}

/// The libraries objects load, found as the loader finds them, each read
/// once.
struct Deps {
    search: Vec<PathBuf>,
    /// By path; None when it is not an ELF object we can read.
    seen: HashMap<PathBuf, Option<Rc<Loaded>>>,
}

impl Deps {
    fn new(search: &[PathBuf]) -> Deps {
        let mut s: Vec<PathBuf> = search.to_vec();
        for d in ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"] {
            s.push(PathBuf::from(d));
        }
        Deps { search: s, seen: HashMap::new() }
    }

    fn find(&self, name: &str, runpath: &[String], origin: &Path) -> Option<PathBuf> {
        if name.contains('/') {
            return Some(PathBuf::from(name));
        }
        let o = origin.display().to_string();
        runpath
            .iter()
            .map(|r| PathBuf::from(r.replace("${ORIGIN}", &o).replace("$ORIGIN", &o)))
            .chain(self.search.iter().cloned())
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    }

    fn load(&mut self, path: PathBuf) -> Option<Rc<Loaded>> {
        self.seen
            .entry(path.clone())
            .or_insert_with(|| {
                Dso::read(&path).ok().map(|d| {
                    Rc::new(Loaded {
                        binds: d.binds,
                        needed: d.needed,
                        runpath: d.runpath,
                        dir: path.parent().unwrap_or(Path::new("/")).to_path_buf(),
                    })
                })
            })
            .clone()
    }

    /// Adds to `into` what `d`'s libraries (and theirs) define. A library
    /// that cannot be found adds nothing: its symbols are then reported
    /// missing, as the loader would fail too.
    fn add(&mut self, d: &Dso, origin: &Path, into: &mut HashSet<String>) {
        let mut todo: Vec<(String, Vec<String>, PathBuf)> =
            d.needed.iter().map(|n| (n.clone(), d.runpath.clone(), origin.to_path_buf())).collect();
        let mut done = HashSet::new();
        while let Some((name, runpath, origin)) = todo.pop() {
            let Some(path) = self.find(&name, &runpath, &origin) else { continue };
            if !done.insert(path.clone()) {
                continue;
            }
            if let Some(l) = self.load(path) {
                into.extend(l.binds.iter().cloned());
                for n in &l.needed {
                    todo.push((n.clone(), l.runpath.clone(), l.dir.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dso(soname: &str, defined: &[&str], versions: &[&str]) -> Dso {
        Dso {
            soname: Some(soname.into()),
            defined: defined.iter().map(|s| s.to_string()).collect(),
            versions: versions.iter().map(|s| s.to_string()).collect(),
            ..Dso::default()
        }
    }

    #[test]
    fn a_drop_in_may_only_add_its_own_symbols() {
        let orig = dso("libz.so.1", &["deflate", "compressBound@@ZLIB_1.2.0"], &["ZLIB_1.2.0"]);
        let good = dso(
            "libz.so.1",
            &["deflate", "compressBound@@ZLIB_1.2.0", "__bunkai_data@@BUNKAI_PRIVATE"],
            &["ZLIB_1.2.0", PRIVATE_VERSION],
        );
        drop_in("lib/libz.so", &good, &orig).unwrap();
        let unversioned = dso("libz.so.1", &["deflate", "compressBound", "__bunkai_data"], &["ZLIB_1.2.0"]);
        let e = drop_in("lib/libz.so", &unversioned, &orig).unwrap_err().to_string();
        assert_eq!(
            e,
            "lib/libz.so does not export compressBound@@ZLIB_1.2.0 and exports compressBound as the \
             original does not (report this, with the flags after --)"
        );
        let soname = dso("libz.so", &["deflate", "compressBound@@ZLIB_1.2.0"], &["ZLIB_1.2.0"]);
        let e = drop_in("lib/libz.so", &soname, &orig).unwrap_err().to_string();
        assert!(e.starts_with("lib/libz.so has SONAME libz.so, the original libz.so.1"), "{e}");
        let versions = dso("libz.so.1", &["deflate", "compressBound@@ZLIB_1.2.0"], &[]);
        let e = drop_in("lib/libz.so", &versions, &orig).unwrap_err().to_string();
        assert!(e.starts_with("lib/libz.so defines the versions (none), the original ZLIB_1.2.0"), "{e}");
    }

    #[test]
    fn finds_what_libc_defines() {
        let mut deps = Deps::new(&[]);
        let d = Dso { needed: vec!["libc.so.6".into()], ..Dso::default() };
        let mut got = HashSet::new();
        deps.add(&d, Path::new("/nonexistent"), &mut got);
        assert!(got.contains("malloc") && got.contains("printf"));
        // libc loads the dynamic loader, which defines __tls_get_addr.
        assert!(got.contains("__tls_get_addr"));
    }
}
