//! A module's metadata: the `.bunkai_mod` section written by the macros of
//! mod/include/bunkai_mod.h, and interface hashes.
//!
//! An interface's text is its prototypes as the C preprocessor stringified
//! them, e.g. `int pick(const struct job *ready, int n, long now);const char
//! * name(void);`. We normalise whitespace (runs become one space, none
//! around punctuation) and hash with CRC-32, like modversions: two sides
//! agree when their normalised texts are byte-identical. Parameter names are
//! part of the text, which is stricter than the C type system and never
//! wrong.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

pub const SECTION: &str = ".bunkai_mod";
const FS: char = '\u{1f}';
const RS: char = '\u{1e}';

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    /// Normalised prototypes.
    pub text: String,
    /// CRC-32 of `text`, 8 hex digits.
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Implements {
    pub iface: Interface,
    /// The module's functions, in prototype order.
    pub symbols: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Meta {
    pub name: String,
    pub version: String,
    pub implements: Vec<Implements>,
    pub requires: Vec<Interface>,
    pub init: Option<String>,
    pub exit: Option<String>,
}

pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pending_space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if pending_space {
            let prev = out.chars().last();
            let word = |ch: Option<char>| ch.map_or(false, |x| x.is_alphanumeric() || x == '_');
            if word(prev) && word(Some(c)) {
                out.push(' ');
            }
            pending_space = false;
        }
        out.push(c);
    }
    out
}

pub fn interface(name: &str, text: &str) -> Interface {
    let text = normalize(text);
    let hash = format!("{:08x}", crc32fast::hash(text.as_bytes()));
    Interface { name: name.to_string(), text, hash }
}

/// Splits normalised text into (function name, prototype) pairs.
pub fn prototypes(text: &str) -> Vec<(String, String)> {
    text.split(';')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let head = p.split('(').next().unwrap_or("");
            let name = head
                .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
                .find(|s| !s.is_empty())
                .unwrap_or("")
                .to_string();
            (name, format!("{p};"))
        })
        .collect()
}

/// Why two versions of an interface differ, naming the first function that
/// does (or the one only one side has).
pub fn explain_mismatch(iface: &str, ours: &str, theirs: &str, who: &str) -> String {
    let a = prototypes(ours);
    let b = prototypes(theirs);
    for (i, (name, proto)) in a.iter().enumerate() {
        match b.iter().position(|(n, _)| n == name) {
            None => return format!("interface {iface}: the module has {name}, which {who} does not ({proto})"),
            Some(j) if b[j].1 != *proto => {
                return format!("interface {iface}: {name} is `{proto}` in the module but `{}` in {who}", b[j].1)
            }
            Some(j) if j != i => {
                return format!("interface {iface}: {name} is function {} in the module but {} in {who}", i + 1, j + 1)
            }
            _ => {}
        }
    }
    if let Some((name, proto)) = b.iter().find(|(n, _)| !a.iter().any(|(m, _)| m == n)) {
        return format!("interface {iface}: {who} has {name} ({proto}), which the module does not");
    }
    format!("interface {iface}: the prototypes differ")
}

/// A C identifier of at most 255 bytes: what an interface, a function,
/// init and exit may be called (the host reads them as C strings: a NUL
/// inside a name would cut it short and skip its check).
fn identifier(what: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 255
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        bail!("{SECTION}: {what} {s:?} is not a C identifier (rebuild the module with the macros of bunkai_mod.h)");
    }
    Ok(())
}

/// Text that the host may print or compare: no control characters but
/// whitespace, bounded.
fn text_field(what: &str, s: &str, max: usize) -> Result<()> {
    if s.len() > max || s.chars().any(|c| c.is_control() && !c.is_whitespace()) {
        bail!("{SECTION}: {what} has control characters or is longer than {max} bytes (rebuild the module with the macros of bunkai_mod.h)");
    }
    Ok(())
}

/// Parses the section's bytes.
pub fn parse(data: &[u8]) -> Result<Meta> {
    let text = std::str::from_utf8(data).map_err(|_| anyhow::anyhow!("{SECTION} is not text"))?;
    let mut m = Meta::default();
    let mut have_module = false;
    for rec in text.split(RS) {
        let rec = rec.trim_matches('\0');
        if rec.is_empty() {
            continue;
        }
        let f: Vec<&str> = rec.split(FS).collect();
        match f.as_slice() {
            ["module", name, version] => {
                if have_module {
                    bail!("{SECTION} declares two modules (one BUNKAI_MODULE per module)");
                }
                if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c)) {
                    bail!("bad module name {name:?} (letters, digits, _ - .)");
                }
                if name.len() > 255 {
                    bail!("module name longer than 255 bytes");
                }
                text_field("the version", version, 64)?;
                m.name = name.to_string();
                m.version = version.to_string();
                have_module = true;
            }
            ["implements", iface, text, syms @ ..] => {
                identifier("interface", iface)?;
                text_field(&format!("interface {iface}"), text, 1 << 16)?;
                for s in syms {
                    identifier(&format!("interface {iface}'s function"), s)?;
                }
                let i = interface(iface, text);
                let n = prototypes(&i.text).len();
                if syms.len() != n {
                    bail!("implements {iface}: {} functions given for {n} prototypes", syms.len());
                }
                m.implements.push(Implements { iface: i, symbols: syms.iter().map(|s| s.to_string()).collect() });
            }
            ["requires", iface, text] => {
                identifier("required interface", iface)?;
                text_field(&format!("interface {iface}"), text, 1 << 16)?;
                m.requires.push(interface(iface, text))
            }
            ["init", sym] => {
                identifier("init function", sym)?;
                m.init = Some(sym.to_string())
            }
            ["exit", sym] => {
                identifier("exit function", sym)?;
                m.exit = Some(sym.to_string())
            }
            _ => bail!("{SECTION} has a record this bunkai does not know: {:?}", rec.replace(FS, "|")),
        }
    }
    if !have_module {
        bail!("no BUNKAI_MODULE(name, version) in {SECTION}");
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(fields: &[&str]) -> String {
        format!("{}{RS}\0", fields.join(&FS.to_string()))
    }

    #[test]
    fn normalises_whitespace_only() {
        assert_eq!(normalize("int  pick ( const struct job * r,int n ) ;"), "int pick(const struct job*r,int n);");
        assert_eq!(normalize("unsigned long x(void);"), "unsigned long x(void);");
        assert_ne!(interface("a", "int f(int);").hash, interface("a", "long f(int);").hash);
        assert_eq!(interface("a", "int f( int );").hash, interface("a", "int f(int);").hash);
    }

    #[test]
    fn parses_records() {
        let s = [
            rec(&["module", "fifo", "1.0"]),
            rec(&["implements", "sched", "int pick(int n);const char *name(void);", "fifo_pick", "fifo_name"]),
            rec(&["requires", "queue", "void push(int);"]),
            rec(&["init", "fifo_init"]),
        ]
        .concat();
        let m = parse(s.as_bytes()).unwrap();
        assert_eq!(m.name, "fifo");
        assert_eq!(m.implements[0].symbols, vec!["fifo_pick", "fifo_name"]);
        assert_eq!(m.requires[0].name, "queue");
        assert_eq!(m.init.as_deref(), Some("fifo_init"));
    }

    #[test]
    fn refuses_bad_metadata() {
        assert!(parse(b"").is_err());
        assert!(parse(rec(&["module", "a b", "1"]).as_bytes()).is_err());
        let two = [rec(&["module", "a", "1"]), rec(&["module", "b", "1"])].concat();
        assert!(parse(two.as_bytes()).is_err());
        let short = [rec(&["module", "a", "1"]), rec(&["implements", "i", "int f(void);int g(void);", "f"])].concat();
        assert!(parse(short.as_bytes()).unwrap_err().to_string().contains("2 prototypes"));
        assert!(parse(&[0xff, 0xfe]).is_err());
        // A NUL inside a name would cut it short in the host.
        let nul = [rec(&["module", "a", "1"]), rec(&["implements", "sch\0ed", "int f(void);", "f"])].concat();
        assert!(parse(nul.as_bytes()).unwrap_err().to_string().contains("not a C identifier"));
        let nul = [rec(&["module", "a", "1"]), rec(&["implements", "sched", "int f(void);", "f\0x"])].concat();
        assert!(parse(nul.as_bytes()).unwrap_err().to_string().contains("not a C identifier"));
        let init = [rec(&["module", "a", "1"]), rec(&["init", "1x"])].concat();
        assert!(parse(init.as_bytes()).is_err());
        // Arbitrary bytes never panic.
        let mut x = 12345u64;
        for _ in 0..2000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = (x >> 59) as usize;
            let b: Vec<u8> = (0..len).map(|i| ((x >> (i % 8 * 8)) as u8) % 40 + 0x1c).collect();
            let _ = parse(&b);
        }
    }

    #[test]
    fn names_the_differing_function() {
        let a = normalize("int pick(int n);const char*name(void);");
        let b = normalize("long pick(int n);const char*name(void);");
        let e = explain_mismatch("sched", &a, &b, "the host");
        assert!(e.contains("pick") && e.contains("the host"), "{e}");
        let c = normalize("int pick(int n);");
        assert!(explain_mismatch("sched", &c, &a, "the host").contains("name"));
    }
}
