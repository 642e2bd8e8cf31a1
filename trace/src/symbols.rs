//! Window functions checked before anything runs: `--start-func NAME`
//! and `--stop-func NAME` must name a function that the program or a
//! library it links defines, as Valgrind will name it (a symbol of the
//! file's symbol table, its exported symbols, or its separate debug file
//! under /usr/lib/debug/.build-id). A misspelt name used to give an empty
//! trace and exit 0; now it is one line naming the fix.
//!
//! `NAME@FILE` names the file to look in instead: a program the command
//! execs, or a library it loads with dlopen, which the program's own
//! dynamic section does not list.

use anyhow::{bail, Result};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Checks `spec` (NAME or NAME@FILE) against `program` and returns the
/// name to give the tool.
pub fn check_function(opt: &str, spec: &str, program: &Path) -> Result<String> {
    let (name, file) = match spec.split_once('@') {
        // puts@@GLIBC_2.2.5 is a versioned name, not NAME@FILE
        Some((n, f)) if !f.starts_with('@') && !f.is_empty() => (n, Some(f)),
        _ => (spec, None),
    };
    if name.is_empty() || name.contains(char::is_whitespace) || name.contains(',') {
        bail!("{opt} '{spec}' is not a function name (give a symbol such as main)");
    }
    // Demangled C++ names ("ns::f(int)") are what Valgrind matches, and
    // ELF symbols hold them mangled: they are not checked here.
    if name.contains("::") || name.contains('(') {
        return Ok(name.to_string());
    }
    let files: Vec<PathBuf> = match file {
        Some(f) => vec![find_file(opt, spec, f)?],
        None => linked_files(program),
    };
    // The symbol tables hold puts for Valgrind's puts@@GLIBC_2.2.5.
    let base = name.split('@').next().unwrap_or(name);
    let mut stripped = Vec::new();
    for f in &files {
        let Ok(data) = std::fs::read(f) else { continue };
        let Ok(obj) = object::File::parse(&*data) else {
            if file.is_none() && f == &files[0] {
                // a script: its interpreter runs, which we do not follow here
                return Ok(name.to_string());
            }
            bail!("{opt} {spec}: {} is not an ELF file (name a program or a shared library)", f.display());
        };
        if defines(&obj, base) || debug_file(&obj).is_some_and(|d| defines_in(&d, base)) {
            return Ok(name.to_string());
        }
        if obj.section_by_name(".symtab").is_none() && debug_file(&obj).is_none() {
            stripped.push(f.display().to_string());
        }
    }
    let what = match file {
        Some(_) => files[0].display().to_string(),
        None => format!("{} or the libraries it links", program.display()),
    };
    let note = if stripped.iter().any(|s| Path::new(s) == files[0]) {
        format!("; {} is stripped, so only the functions it exports have names", files[0].display())
    } else {
        String::new()
    };
    bail!(
        "{opt}: no function '{name}' in {what}{note} (check the spelling with `nm -D --defined-only FILE`; \
         for a program the command execs or a library it loads with dlopen, name that file: {opt} {name}@FILE)"
    )
}

/// Whether `obj` defines a function called `name`.
fn defines(obj: &object::File, name: &str) -> bool {
    obj.symbols().chain(obj.dynamic_symbols()).any(|s| {
        s.is_definition() && matches!(s.kind(), SymbolKind::Text | SymbolKind::Unknown) && s.name() == Ok(name)
    })
}

fn defines_in(data: &[u8], name: &str) -> bool {
    object::File::parse(data).map(|o| defines(&o, name)).unwrap_or(false)
}

/// The separate debug file of `obj` (Debian's -dbgsym packages), by build id.
fn debug_file(obj: &object::File) -> Option<Vec<u8>> {
    let id = obj.build_id().ok()??;
    if id.len() < 2 {
        return None;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::read(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..])).ok()
}

/// FILE of NAME@FILE: a path, a program on PATH or a library by name.
fn find_file(opt: &str, spec: &str, f: &str) -> Result<PathBuf> {
    if f.contains('/') {
        if Path::new(f).is_file() {
            return Ok(f.into());
        }
        bail!("{opt} {spec}: no such file {f} (check the path)");
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).chain(lib_dirs(&[])).collect();
    match dirs.iter().map(|d| d.join(f)).find(|p| p.is_file()) {
        Some(p) => Ok(p),
        None => bail!("{opt} {spec}: no program or library {f} on PATH or in the library directories (give its path)"),
    }
}

/// Where the dynamic linker looks, after the object's own run paths.
fn lib_dirs(runpath: &[PathBuf]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = runpath.to_vec();
    if let Some(p) = std::env::var_os("LD_LIBRARY_PATH") {
        v.extend(std::env::split_paths(&p).filter(|p| !p.as_os_str().is_empty()));
    }
    for d in [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/local/lib/x86_64-linux-gnu",
        "/usr/local/lib",
        "/lib64",
        "/lib",
        "/usr/lib",
    ] {
        v.push(d.into());
    }
    v
}

/// The program and every library it links, directly or through another
/// library (DT_NEEDED, resolved as the dynamic linker would, roughly).
fn linked_files(program: &Path) -> Vec<PathBuf> {
    let mut out = vec![program.to_path_buf()];
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut i = 0;
    while i < out.len() && i < 512 {
        let f = out[i].clone();
        i += 1;
        let Ok(data) = std::fs::read(&f) else { continue };
        let Some((needed, runpath)) = dynamic_needs(&data, &f) else { continue };
        let dirs = lib_dirs(&runpath);
        for n in needed {
            if !seen.insert(n.clone()) {
                continue;
            }
            let found = if n.contains('/') {
                Some(PathBuf::from(&n)).filter(|p| p.is_file())
            } else {
                dirs.iter().map(|d| d.join(&n)).find(|p| p.is_file())
            };
            if let Some(p) = found {
                out.push(p);
            }
        }
    }
    out
}

/// DT_NEEDED names and DT_RUNPATH/DT_RPATH directories ($ORIGIN expanded)
/// of an ELF file.
fn dynamic_needs(data: &[u8], file: &Path) -> Option<(Vec<String>, Vec<PathBuf>)> {
    let obj = object::File::parse(data).ok()?;
    let dynamic = obj.section_by_name(".dynamic")?.data().ok()?;
    let strtab = obj.section_by_name(".dynstr")?.data().ok()?;
    let string = |off: u64| -> Option<String> {
        let s = strtab.get(off as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&s[..end]).into_owned())
    };
    let origin = file.parent().map(|p| p.display().to_string()).unwrap_or_default();
    let (mut needed, mut runpath) = (Vec::new(), Vec::new());
    for e in dynamic.chunks_exact(16) {
        let tag = u64::from_le_bytes(e[..8].try_into().ok()?);
        let val = u64::from_le_bytes(e[8..].try_into().ok()?);
        match tag {
            0 => break,
            1 => needed.extend(string(val)),
            15 | 29 => {
                for d in string(val).unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
                    runpath.push(PathBuf::from(d.replace("$ORIGIN", &origin).replace("${ORIGIN}", &origin)));
                }
            }
            _ => {}
        }
    }
    Some((needed, runpath))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_functions_are_found_and_misspellings_refused() {
        let sh = Path::new("/bin/sh");
        assert_eq!(check_function("--start-func", "malloc", sh).unwrap(), "malloc");
        assert_eq!(check_function("--start-func", "puts@@GLIBC_2.2.5", sh).unwrap(), "puts@@GLIBC_2.2.5");
        let e = check_function("--start-func", "mallok", sh).unwrap_err().to_string();
        assert!(e.starts_with("--start-func: no function 'mallok' in /bin/sh or the libraries it links"), "{e}");
        assert!(e.contains("mallok@FILE") && !e.contains('\n'), "{e}");
        // NAME@FILE looks in that file only
        assert_eq!(check_function("--stop-func", "malloc@libc.so.6", sh).unwrap(), "malloc");
        let e = check_function("--stop-func", "malloc@/no/such.so", sh).unwrap_err().to_string();
        assert!(e.contains("no such file /no/such.so"), "{e}");
        let e = check_function("--start-func", "a b", sh).unwrap_err().to_string();
        assert!(e.contains("not a function name"), "{e}");
    }
}
