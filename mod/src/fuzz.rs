//! Fuzzing of the module linker: a module object is untrusted input (a
//! file anyone may hand to `bunkai mod load`), and what the linker accepts
//! runs inside someone's process.
//!
//! Real modules (the scheduling example's policies, built here with
//! clang-14 -c as a user would) are mutated with a fixed-seed generator:
//! structural mutations (a field of the ELF header, a section header, a
//! symbol or a relocation set to a value chosen to hurt: 0, all ones, one
//! past the end, a huge alignment, another section's index) and byte
//! mutations (flips, truncation). Every mutant goes through parse, pre-link
//! and a dry link at fixed addresses, and each outcome is checked, not only
//! "no panic":
//! - refused: one line, naming what is wrong;
//! - accepted: the layout is bounded, the images are the layout's sizes,
//!   and every symbol the host will call (init, exit, interface tables)
//!   lies in the module's code; the mutant is counted as linking the same
//!   as the original (the mutation touched nothing the link uses) or
//!   differently (a different but well-formed program).
//!
//! Targeted mutations then check that each defect the linker must refuse
//! is refused with the right words. `BUNKAI_MOD_FUZZ_MUTANTS` sets the
//! number of mutants per module (default 3,000). The mutator and the dry
//! link are public: tests/e2e/mod_mutants.rs sends mutants on to a running
//! host (bench/mod/mutants.sh: 100,000 of them).

use crate::link::{Module, MAX_MODULE};
use std::collections::HashMap;

/// xorshift64*: fixed seeds, reproducible runs.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Where the host maps modules (MAP_32BIT: the low 2 GB, so that code built
/// without -fPIC links), and where it falls back to when that space is full.
pub const RX_LOW: u64 = 0x4000_0000;
pub const RX_HIGH: u64 = 0x7f12_0000_0000;

/// Where a linked module landed, to check the result against.
pub struct Linked {
    /// The address its RX part was linked for.
    pub base: u64,
    pub rx: Vec<u8>,
    pub rw: Vec<u8>,
    pub entries: Vec<u64>,
    pub rx_size: u64,
    pub rw_size: u64,
}

/// Parse, pre-link and link where the host would map the module; Err is
/// the refusal.
pub fn dry_link(bytes: &[u8]) -> Result<Linked, String> {
    dry_link_at(bytes, RX_LOW)
}

/// Parse, pre-link and link with the RX part at `base`, the undefined
/// names resolved to fixed addresses where libraries live.
pub fn dry_link_at(bytes: &[u8], base: u64) -> Result<Linked, String> {
    let m = Module::parse(bytes).map_err(|e| format!("{e:#}"))?;
    let lay = m.prelink().map_err(|e| format!("{e:#}"))?;
    let rw = base + lay.rx_size.div_ceil(4096) * 4096;
    let resolve: HashMap<String, u64> = m
        .undefined()
        .into_iter()
        .enumerate()
        .map(|(i, (n, _))| (n, 0x7f11_0000_0000 + 16 * i as u64))
        .collect();
    let img = m.link(&lay, base, rw, &resolve).map_err(|e| format!("{e:#}"))?;
    let meta = m.meta_bytes().and_then(|b| crate::meta::parse(b).ok()).unwrap_or_default();
    let mut names: Vec<&String> = meta.init.iter().chain(meta.exit.iter()).collect();
    for i in &meta.implements {
        names.extend(i.symbols.iter());
    }
    let entries = names.iter().map(|n| img.symbols.get(*n).map_or(0, |s| s.0)).collect();
    Ok(Linked { base, rx: img.rx, rw: img.rw, entries, rx_size: lay.rx_size, rw_size: lay.rw_size })
}

/// What an accepted mutant must satisfy.
pub fn check_accepted(l: &Linked, what: &str) {
    assert!(l.rx_size + l.rw_size <= MAX_MODULE, "{what}: layout of {} bytes accepted", l.rx_size + l.rw_size);
    assert_eq!(l.rx.len() as u64, l.rx_size, "{what}");
    assert!(l.rw.len() as u64 <= l.rw_size, "{what}");
    for &e in &l.entries {
        assert!(e >= l.base && e < l.base + l.rx_size, "{what}: an entry point at {e:#x} outside the module's code");
    }
}

// ELF64 little-endian field access.
pub fn rd(v: &[u8], at: usize, n: usize) -> u64 {
    let mut x = 0u64;
    for i in 0..n {
        x |= (v[at + i] as u64) << (8 * i);
    }
    x
}
pub fn wr(v: &mut [u8], at: usize, n: usize, x: u64) {
    for i in 0..n {
        v[at + i] = (x >> (8 * i)) as u8;
    }
}

/// Section headers: (offset of the header, sh_type, sh_offset, sh_size, name).
pub fn sections(v: &[u8]) -> Vec<(usize, u32, usize, usize, String)> {
    let shoff = rd(v, 0x28, 8) as usize;
    let shnum = rd(v, 0x3c, 2) as usize;
    let strndx = rd(v, 0x3e, 2) as usize;
    let str_off = rd(v, shoff + strndx * 64 + 24, 8) as usize;
    (0..shnum)
        .map(|i| {
            let h = shoff + i * 64;
            let n = str_off + rd(v, h, 4) as usize;
            let end = v[n..].iter().position(|&b| b == 0).unwrap();
            let name = String::from_utf8_lossy(&v[n..n + end]).into_owned();
            (h, rd(v, h + 4, 4) as u32, rd(v, h + 24, 8) as usize, rd(v, h + 32, 8) as usize, name)
        })
        .collect()
}

/// Values chosen to hurt a field of `n` bytes.
fn nasty(r: &mut Rng, n: usize, old: u64, nsec: u64) -> u64 {
    let ones = if n == 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
    let v = match r.below(12) {
        0 => 0,
        1 => ones,
        2 => old.wrapping_add(1),
        3 => old.wrapping_sub(1),
        4 => old.wrapping_add(1 + r.below(64) as u64),
        5 => ones - r.below(16) as u64,
        6 => 1u64 << r.below(8 * n),
        7 => nsec + r.below(3) as u64,
        8 => r.below(nsec as usize + 1) as u64,
        9 => old ^ (1 << r.below(8 * n)),
        10 => 0x100000,
        _ => r.next(),
    };
    v & ones
}

/// One structural or byte mutation of a valid object.
pub fn mutate(r: &mut Rng, orig: &[u8]) -> (Vec<u8>, String) {
    let mut v = orig.to_vec();
    let secs = sections(&v);
    let nsec = secs.len() as u64;
    let field = |r: &mut Rng, v: &mut Vec<u8>, at: usize, n: usize, what: String| -> String {
        let old = rd(v, at, n);
        let new = nasty(r, n, old, nsec);
        wr(v, at, n, new);
        format!("{what}: {old:#x} -> {new:#x}")
    };
    let how = match r.below(10) {
        // A section header field.
        0 | 1 => {
            let (h, _, _, _, name) = &secs[r.below(secs.len())];
            let f = [(4, 4, "type"), (8, 8, "flags"), (24, 8, "offset"), (32, 8, "size"), (40, 4, "link"), (44, 4, "info"), (48, 8, "align"), (56, 8, "entsize")];
            let (o, n, fname) = f[r.below(f.len())];
            field(r, &mut v, h + o, n, format!("section {name} {fname}"))
        }
        // A symbol field.
        2 | 3 => {
            let Some(&(_, _, off, size, _)) = secs.iter().find(|s| s.1 == 2) else { return (v, "none".into()) };
            let k = r.below(size / 24);
            let f = [(4, 1, "info"), (6, 2, "shndx"), (8, 8, "value"), (16, 8, "size"), (0, 4, "name")];
            let (o, n, fname) = f[r.below(f.len())];
            field(r, &mut v, off + k * 24 + o, n, format!("symbol #{k} {fname}"))
        }
        // A relocation field.
        4 | 5 => {
            let relas: Vec<_> = secs.iter().filter(|s| s.1 == 4 && s.3 >= 24).collect();
            if relas.is_empty() {
                return (v, "none".into());
            }
            let &(_, _, off, size, ref name) = relas[r.below(relas.len())];
            let k = r.below(size / 24);
            let f = [(0, 8, "offset"), (8, 4, "type"), (12, 4, "symbol"), (16, 8, "addend")];
            let (o, n, fname) = f[r.below(f.len())];
            field(r, &mut v, off + k * 24 + o, n, format!("{name}[{k}] {fname}"))
        }
        // The ELF header.
        6 => {
            let f = [(0x10, 2, "e_type"), (0x12, 2, "e_machine"), (0x28, 8, "e_shoff"), (0x3a, 2, "e_shentsize"), (0x3c, 2, "e_shnum"), (0x3e, 2, "e_shstrndx"), (0x04, 1, "class"), (0x05, 1, "data")];
            let (o, n, fname) = f[r.below(f.len())];
            field(r, &mut v, o, n, format!("ELF header {fname}"))
        }
        // The metadata section's bytes.
        7 => {
            let Some(&(_, _, off, size, _)) = secs.iter().find(|s| s.4 == crate::meta::SECTION) else { return (v, "none".into()) };
            let i = off + r.below(size);
            let b = [0u8, 0x1f, 0x1e, b'x', b'0', 0xff, b' '][r.below(7)];
            v[i] = b;
            format!(".bunkai_mod byte {} -> {b:#x}", i - off)
        }
        // Truncation.
        8 => {
            let n = r.below(v.len());
            v.truncate(n);
            format!("truncated to {n} bytes")
        }
        // A bit anywhere.
        _ => {
            let i = r.below(v.len());
            let b = 1 << r.below(8);
            v[i] ^= b;
            format!("byte {i:#x} ^= {b:#x}")
        }
    };
    (v, how)
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::Module;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// Runs a command with a deadline; panics naming it if it fails or hangs.
    fn run(cmd: &mut Command) {
        let what = format!("{cmd:?}");
        let mut c = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {what}: {e} (run scripts/install-deps.sh)"));
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "{what} failed");
                return;
            }
            if t0.elapsed() > Duration::from_secs(120) {
                let _ = c.kill();
                let _ = c.wait();
                panic!("{what}: no end within 120 s (killed)");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
    }

    /// Compiles C (or C++) source text into a module object.
    fn build(dir: &Path, name: &str, src: &str, cxx: bool) -> Vec<u8> {
        let ext = if cxx { "cc" } else { "c" };
        let s = dir.join(format!("{name}.{ext}"));
        let o = dir.join(format!("{name}.o"));
        std::fs::write(&s, src).unwrap();
        let cc = if cxx { "clang++-14" } else { "clang-14" };
        run(Command::new(cc)
            .args(["-c", "-O2", "-fPIC"])
            .arg(format!("-I{}", root().join("mod/include").display()))
            .arg(format!("-I{}", root().join("mod/examples/sched").display()))
            .arg("-o")
            .arg(&o)
            .arg(&s));
        std::fs::read(&o).unwrap()
    }

    fn example(dir: &Path, name: &str) -> Vec<u8> {
        let src = std::fs::read_to_string(root().join(format!("mod/examples/sched/{name}.c"))).unwrap();
        build(dir, name, &src, false)
    }

    /// A refusal is one line that says something.
    fn check_refused(e: &str, what: &str) {
        assert!(!e.is_empty() && !e.contains('\n'), "{what}: refusal is not one line: {e:?}");
        assert!(!e.contains("internal error"), "{what}: {e}");
        assert!(e.len() < 400, "{what}: refusal too long: {e}");
    }

    #[test]
    fn mutants_are_refused_in_one_line_or_linked_inside_their_bounds() {
        let d = tempfile::tempdir().unwrap();
        let per: usize = std::env::var("BUNKAI_MOD_FUZZ_MUTANTS").ok().and_then(|s| s.parse().ok()).unwrap_or(3000);
        let (mut refused, mut same, mut changed) = (0usize, 0usize, 0usize);
        for (k, name) in ["fifo", "rr", "prio", "edf", "util"].iter().enumerate() {
            let orig = example(d.path(), name);
            let want = dry_link(&orig).unwrap_or_else(|e| panic!("{name}.o: {e}"));
            check_accepted(&want, name);
            let mut r = Rng(0x9e3779b97f4a7c15 ^ (k as u64 + 1));
            for i in 0..per {
                let (m, how) = mutate(&mut r, &orig);
                let what = format!("{name}.o mutant {i} ({how})");
                let got = std::panic::catch_unwind(|| dry_link(&m)).unwrap_or_else(|_| panic!("{what}: the linker panicked"));
                match got {
                    Err(e) => {
                        check_refused(&e, &what);
                        refused += 1;
                    }
                    Ok(l) => {
                        check_accepted(&l, &what);
                        if l.rx == want.rx && l.rw == want.rw && l.entries == want.entries {
                            same += 1;
                        } else {
                            changed += 1;
                        }
                    }
                }
            }
        }
        eprintln!("mod fuzz: {} mutants: {refused} refused, {same} linked the same, {changed} linked differently", refused + same + changed);
        // The campaign reached both sides of every check.
        assert!(refused > 0 && same > 0 && changed > 0, "{refused} {same} {changed}");
    }

    /// One section header field of `v`, by section name.
    fn set_section(v: &mut [u8], name: &str, field: usize, n: usize, x: u64) {
        let h = sections(v).into_iter().find(|s| s.4 == name).unwrap_or_else(|| panic!("no section {name}")).0;
        wr(v, h + field, n, x);
    }

    fn refusal(v: &[u8]) -> String {
        match dry_link(v) {
            Err(e) => {
                check_refused(&e, "targeted");
                e
            }
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn each_defect_is_refused_with_its_name() {
        let d = tempfile::tempdir().unwrap();
        let orig = example(d.path(), "prio");
        let rela = sections(&orig).into_iter().find(|s| s.1 == 4 && s.4.starts_with(".rela.text")).unwrap();
        let rname = rela.4.clone();

        let mut v = orig.clone();
        set_section(&mut v, &rname, 4, 4, 9); // SHT_REL
        assert!(refusal(&v).contains("(REL)"), "{}", refusal(&v));
        let mut v = orig.clone();
        set_section(&mut v, &rname, 56, 8, 16);
        assert!(refusal(&v).contains("entry size 16"));
        let mut v = orig.clone();
        set_section(&mut v, &rname, 32, 8, rela.3 as u64 - 8);
        assert!(refusal(&v).contains("multiple of 24"));
        let mut v = orig.clone();
        set_section(&mut v, &rname, 24, 8, rela.2 as u64 + 4);
        assert!(refusal(&v).contains("aligned"));
        let mut v = orig.clone();
        set_section(&mut v, &rname, 40, 4, 0);
        assert!(refusal(&v).contains("symbol table link"));
        let mut v = orig.clone();
        set_section(&mut v, ".text", 48, 8, 1 << 20);
        assert!(refusal(&v).contains("more than a page"));
        let mut v = orig.clone();
        set_section(&mut v, ".text", 48, 8, 24);
        assert!(refusal(&v).contains("not a power of two"));
        let mut v = orig.clone();
        let len = v.len() as u64;
        set_section(&mut v, ".text", 24, 8, len);
        assert!(refusal(&v).contains("outside the file"));

        // A relocation offset near 2^64 (made the old linker panic) and one
        // just past its section (overwrote a neighbour).
        for off in [u64::MAX - 3, (sections(&orig).iter().find(|s| format!(".rela{}", s.4) == rname).unwrap().3 - 2) as u64] {
            let mut v = orig.clone();
            wr(&mut v, rela.2, 8, off);
            let e = refusal(&v);
            assert!(e.contains("outside its section") && e.contains(&format!("+{off:#x}")), "{e}");
        }

        // A symbol moved past the end of its section.
        let symtab = sections(&orig).into_iter().find(|s| s.1 == 2).unwrap();
        let m = Module::parse(&orig).unwrap();
        use object::{Object, ObjectSymbol};
        let f = m.file.symbols().find(|s| s.name() == Ok("prio_pick")).expect("prio_pick");
        let mut v = orig.clone();
        wr(&mut v, symtab.2 + f.index().0 * 24 + 8, 8, 0x100000);
        let e = refusal(&v);
        assert!(e.contains("symbol prio_pick") && e.contains("outside its section"), "{e}");

        // Metadata the host would misread, entry points outside the code,
        // C++ exceptions.
        let hdr = "#include \"bunkai_mod.h\"\n";
        let meta = |recs: &str| {
            format!("{hdr}__attribute__((section(\".bunkai_mod\"), used)) static const char m[] = \"module\\x1f\" \"t\\x1f\" \"1\\x1e\" {recs};\n")
        };
        let data_init = build(d.path(), "data_init", &format!("{}int counter = 5;\n", meta("\"init\\x1f\" \"counter\\x1e\"")), false);
        let e = refusal(&data_init);
        assert!(e.contains("init function counter is not a function"), "{e}");
        let ext_init = build(d.path(), "ext_init", &format!("{}void abort(void); void *keep = abort;\n", meta("\"init\\x1f\" \"abort\\x1e\"")), false);
        assert!(refusal(&ext_init).contains("init function abort"));
        let nul = build(
            d.path(),
            "nul",
            &format!("{}int f(void) {{ return 1; }}\n", meta("\"implements\\x1f\" \"sch\\0ed\\x1f\" \"int f(void);\\x1f\" \"f\\x1e\"")),
            false,
        );
        let bytes = Module::parse(&nul).ok().and_then(|m| m.meta_bytes().map(|b| b.to_vec())).unwrap();
        assert!(crate::meta::parse(&bytes).unwrap_err().to_string().contains("not a C identifier"));
        let cxx = build(
            d.path(),
            "cxx",
            &format!("{hdr}extern \"C\" int g(int);\nint f(int x) {{ try {{ if (x) throw 1; return g(x); }} catch (int) {{ return -1; }} }}\n"),
            true,
        );
        let e = refusal(&cxx);
        assert!(e.contains("C++ exceptions"), "{e}");
        // The same C++ without exceptions is a module like any other.
        let plain = build(d.path(), "plain", &format!("{hdr}extern \"C\" int f(int x) {{ return x + 1; }}\n"), true);
        assert!(dry_link(&plain).is_ok());
    }
}
