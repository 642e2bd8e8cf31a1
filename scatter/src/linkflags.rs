//! The user's link flags, split between the library the user asked for and
//! the function libraries.
//!
//! Flags after `--` reach the compile and every link, as they would reach
//! clang. But some linker options give a library its identity: its SONAME
//! (`-soname`, `-h`), what it exports and under which versions
//! (`--version-script`, `--default-symver`, `--dynamic-list`,
//! `--export-dynamic-symbol`, `--retain-symbols-file`, `-Bsymbolic`...), and
//! link checks and properties (`-z ...`, `--no-undefined`, `-init`, `-fini`).
//! On a function library they are wrong: a version script's `local: *` hides
//! the body the manager looks up, a SONAME would be shared by every library,
//! and `-z defs` refuses the symbols a library takes from the launcher. Those
//! go to the launcher (and the original) only; everything else (`-l`, `-L`,
//! `-rpath`, `--as-needed`, compiler flags) goes everywhere.
//!
//! Linker options come as `-Wl,a,b`, `-Xlinker a` or clang's own `-z a`; an
//! option and its value may be in different flags (`-Wl,-soname
//! -Wl,libz.so.1`).

/// Linker options that belong to the library the user asked for and take a
/// value (as the next argument, or joined with `=`).
const OWN_WITH_VALUE: &[&str] = &[
    "-soname",
    "--soname",
    "-h",
    "--version-script",
    "-version-script",
    "-z",
    "--dynamic-list",
    "-dynamic-list",
    "--export-dynamic-symbol",
    "--export-dynamic-symbol-list",
    "--retain-symbols-file",
    "--exclude-libs",
    "-init",
    "--init",
    "-fini",
    "--fini",
];

/// Linker options that belong to it and take no value.
const OWN_FLAGS: &[&str] = &[
    "--default-symver",
    "--export-dynamic",
    "-E",
    "-Bsymbolic",
    "-Bsymbolic-functions",
    "-Bsymbolic-non-weak-functions",
    "--no-undefined",
    "--undefined-version",
    "--no-undefined-version",
];

/// The user's flags, split.
#[derive(Debug, Default, PartialEq)]
pub struct LinkFlags {
    /// For every link (and every compile): the flags without `own`.
    pub common: Vec<String>,
    /// Linker options for the launcher and the original only, as `-Wl,...`.
    pub own: Vec<String>,
    /// The SONAME the user gave, if any.
    pub soname: Option<String>,
    /// Whether the user gave a version script.
    pub version_script: bool,
}

/// What one linker argument is: the start of an own option (and whether its
/// value follows as the next argument), or an argument for every link.
fn classify(arg: &str) -> Option<bool> {
    if OWN_FLAGS.contains(&arg) {
        return Some(false);
    }
    if OWN_WITH_VALUE.contains(&arg) {
        return Some(true);
    }
    if let Some((opt, _)) = arg.split_once('=') {
        if OWN_WITH_VALUE.contains(&opt) {
            return Some(false);
        }
    }
    if joined_soname(arg).is_some() || (arg.starts_with("-z") && arg.len() > 2) {
        return Some(false);
    }
    None
}

/// `-hlibz.so.1`, the joined short form of `-soname` (not `-hash-style=`).
fn joined_soname(arg: &str) -> Option<&str> {
    let v = arg.strip_prefix("-h")?;
    (!v.is_empty() && !v.starts_with('-') && !v.contains('=') && !arg.starts_with("-hash")).then_some(v)
}

/// Records what an own option says about the library.
fn note(lf: &mut LinkFlags, opt: &str, value: Option<&str>) {
    let (name, joined) = match opt.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (opt, None),
    };
    let value = value.or(joined);
    match name {
        "-soname" | "--soname" | "-h" => lf.soname = value.map(String::from),
        "--version-script" | "-version-script" => lf.version_script = true,
        _ => {
            if let Some(v) = joined_soname(opt) {
                lf.soname = Some(v.to_string());
            }
        }
    }
}

/// Splits `flags` (everything after `--`).
pub fn split(flags: &[String]) -> LinkFlags {
    let mut lf = LinkFlags::default();
    // The option whose value is the next linker argument, if any.
    let mut pending: Option<String> = None;
    let mut own_group: Vec<String> = Vec::new();
    // Walks linker arguments; returns those for every link.
    let mut linker_args = |lf: &mut LinkFlags, args: Vec<&str>, own_group: &mut Vec<String>| -> Vec<String> {
        let mut common = Vec::new();
        for a in args {
            if let Some(opt) = pending.take() {
                note(lf, &opt, Some(a));
                own_group.push(a.to_string());
                continue;
            }
            match classify(a) {
                Some(true) => {
                    pending = Some(a.to_string());
                    own_group.push(a.to_string());
                }
                Some(false) => {
                    note(lf, a, None);
                    own_group.push(a.to_string());
                }
                None => common.push(a.to_string()),
            }
        }
        common
    };
    let mut i = 0;
    while i < flags.len() {
        let f = &flags[i];
        if let Some(list) = f.strip_prefix("-Wl,") {
            let common = linker_args(&mut lf, list.split(',').collect(), &mut own_group);
            if !common.is_empty() {
                lf.common.push(format!("-Wl,{}", common.join(",")));
            }
        } else if (f == "-Xlinker" || f == "-z") && i + 1 < flags.len() {
            let args: Vec<&str> = if f == "-z" {
                vec!["-z", flags[i + 1].as_str()]
            } else {
                vec![flags[i + 1].as_str()]
            };
            let common = linker_args(&mut lf, args, &mut own_group);
            for c in common {
                lf.common.push("-Xlinker".into());
                lf.common.push(c);
            }
            i += 1;
        } else {
            lf.common.push(f.clone());
        }
        i += 1;
    }
    if !own_group.is_empty() {
        lf.own.push(format!("-Wl,{}", own_group.join(",")));
    }
    lf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn zlibs_own_flags_go_to_the_library_only() {
        let lf = split(&v(&[
            "-O3",
            "-fPIC",
            "-Wl,-soname,libz.so.1,--version-script,zlib.map",
            "-lc",
            "-Wl,-z,relro",
        ]));
        assert_eq!(lf.common, v(&["-O3", "-fPIC", "-lc"]));
        assert_eq!(lf.own, v(&["-Wl,-soname,libz.so.1,--version-script,zlib.map,-z,relro"]));
        assert_eq!(lf.soname.as_deref(), Some("libz.so.1"));
        assert!(lf.version_script);
    }

    #[test]
    fn mixed_lists_keep_the_common_part_in_place() {
        let lf = split(&v(&["-Wl,--as-needed,-soname=libx.so.2,-rpath,/opt/x", "-lm", "-Wl,--no-as-needed"]));
        assert_eq!(lf.common, v(&["-Wl,--as-needed,-rpath,/opt/x", "-lm", "-Wl,--no-as-needed"]));
        assert_eq!(lf.own, v(&["-Wl,-soname=libx.so.2"]));
        assert_eq!(lf.soname.as_deref(), Some("libx.so.2"));
        assert!(!lf.version_script);
    }

    #[test]
    fn values_may_follow_in_another_flag() {
        let lf = split(&v(&[
            "-Xlinker",
            "--version-script",
            "-Xlinker",
            "v.map",
            "-Wl,-h",
            "-Wl,liby.so.3",
            "-z",
            "now",
            "-Wl,-zdefs,--default-symver",
            "-Xlinker",
            "--gc-sections",
        ]));
        assert_eq!(lf.common, v(&["-Xlinker", "--gc-sections"]));
        assert_eq!(lf.own, v(&["-Wl,--version-script,v.map,-h,liby.so.3,-z,now,-zdefs,--default-symver"]));
        assert_eq!(lf.soname.as_deref(), Some("liby.so.3"));
        assert!(lf.version_script);
        let joined = split(&v(&["-Wl,-hlibq.so.1,--version-script=q.map"]));
        assert_eq!(joined.soname.as_deref(), Some("libq.so.1"));
        assert!(joined.version_script);
        assert!(joined.common.is_empty());
    }

    #[test]
    fn flags_without_linker_options_are_untouched() {
        let f = v(&["-O2", "-DX=1", "-lm", "-ldl", "-Wl,--as-needed,-hash-style=gnu", "-L/opt/lib"]);
        let lf = split(&f);
        assert_eq!(lf.common, f);
        assert!(lf.own.is_empty() && lf.soname.is_none());
    }
}
