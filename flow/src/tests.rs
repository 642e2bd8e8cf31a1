//! Unit tests: handcrafted join-point tables, the compiler command line.

use crate::joinpoints::*;

fn rec(rel: i32, kind: u16, version: u16, text: &str) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&rel.to_le_bytes());
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&(text.len() as u32 + 1).to_le_bytes());
    v.extend_from_slice(text.as_bytes());
    v.push(0);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

const ACCESS: &str =
    "pkt\tlen\tpkt_clone\tpackets.c\t36\tload\t32\t$base=%rbx skb=%rbx n=16(%rsp) k=$-7 f=%xmm1";
const ENTRY: &str = "-\t-\tmain\tpackets.c\t66\tentry\t0\t";

#[test]
fn two_records() {
    let mut t = rec(-0x1000, 1, VERSION, ACCESS);
    let second = t.len();
    t.extend(rec(-0x20, 2, VERSION, ENTRY));
    let jps = parse(&t, 0x2000).unwrap();
    assert_eq!(jps.len(), 2);
    let a = &jps[0];
    assert_eq!(a.sled_addr, 0x1000);
    assert_eq!(a.kind, Kind::Access);
    assert_eq!(a.struct_name.as_deref(), Some("pkt"));
    assert_eq!(a.member.as_deref(), Some("len"));
    assert_eq!(
        (a.function.as_str(), a.file.as_str(), a.line),
        ("pkt_clone", "packets.c", 36)
    );
    assert_eq!(a.access, Access::Load);
    assert_eq!(a.bits, 32);
    assert_eq!(
        a.operands,
        vec![
            ("$base".to_string(), Location::Reg("rbx".into())),
            ("skb".to_string(), Location::Reg("rbx".into())),
            (
                "n".to_string(),
                Location::Mem {
                    base: Base::Rsp,
                    offset: 16
                }
            ),
            ("k".to_string(), Location::Imm(-7)),
            ("f".to_string(), Location::Reg("xmm1".into())),
        ]
    );
    let e = &jps[1];
    assert_eq!(e.index, 1);
    assert_eq!(e.sled_addr, 0x2000 + second as u64 - 0x20);
    assert_eq!((e.kind, e.access), (Kind::Entry, Access::Entry));
    assert!(e.struct_name.is_none() && e.member.is_none() && e.operands.is_empty());
}

/// Mutated tables never panic the parser (the table comes from a binary
/// the user names: untrusted), and a location's number at i128's edge
/// is refused rather than overflowed.
#[test]
fn fuzzed_tables_fail_cleanly() {
    let mut base = rec(-0x1000, 1, VERSION, ACCESS);
    base.extend(rec(-0x20, 2, VERSION, ENTRY));
    base.extend(rec(0x7fff_ffff, 3, VERSION, "s\tm\tf\tx.c\t1\tload\t8\tv=-0x8000(%rbp) w=$0x7fffffffffffffff"));
    assert_eq!(parse(&base, u64::MAX - 4).unwrap().len(), 3);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut fails = 0;
    for _ in 0..20000 {
        let mut b = base.clone();
        for _ in 0..(seed % 4 + 1) {
            crate::xorshift(&mut seed);
            let at = (seed % b.len() as u64) as usize;
            match seed % 4 {
                0 => b[at] = (seed >> 16) as u8,
                1 => b[at] = b"\t=-$%()0x9\0 "[(seed >> 8) as usize % 12],
                2 => {
                    b.remove(at);
                }
                _ => b.truncate(at),
            }
            if b.is_empty() {
                break;
            }
        }
        if let Err(e) = parse(&b, seed) {
            assert!(e.offset <= b.len(), "{e} past the end of {} bytes", b.len());
            fails += 1;
        }
    }
    assert!(fails > 1000, "only {fails} of the mutated tables were refused");
    assert_eq!(Location::parse("$-0x80000000000000000000000000000000"), None);
    assert_eq!(Location::parse("$-0x-80000000000000000000000000000000"), None);
    assert_eq!(Location::parse("$-0x8000000000000000"), Some(Location::Imm(i64::MIN)));
}

#[test]
fn locations_parse_and_print() {
    for s in [
        "%rdi",
        "%r15d",
        "%sil",
        "16(%rsp)",
        "-24(%rbp)",
        "(%rsp)",
        "$5",
        "$-7",
    ] {
        let l = Location::parse(s).unwrap_or_else(|| panic!("{s}"));
        assert_eq!(l.to_string(), s);
    }
    assert_eq!(Location::parse("$0x10"), Some(Location::Imm(16)));
    assert_eq!(
        Location::parse("$-9223372036854775808"),
        Some(Location::Imm(i64::MIN))
    );
    assert_eq!(Location::parse("$9223372036854775808"), None);
    assert_eq!(Location::parse("$+5"), None);
    for bad in ["", "%", "%RAX", "8(%rax)", "x(%rsp)", "$", "rdi", "$abc"] {
        assert_eq!(Location::parse(bad), None, "{bad}");
    }
}

fn error_of(t: &[u8]) -> TableError {
    parse(t, 0x1000).unwrap_err()
}

#[test]
fn damaged_tables_name_the_offset() {
    let good = rec(0, 1, VERSION, ACCESS);
    let n = good.len();

    // Bad magic in the second record.
    let mut t = good.clone();
    let mut r = rec(0, 1, VERSION, ACCESS);
    r[4] ^= 0xff;
    t.extend(r);
    let e = error_of(&t);
    assert_eq!(e.offset, n + 4);
    assert!(
        e.to_string().contains("offset 0x") && e.to_string().contains("magic"),
        "{e}"
    );

    // Another version is refused, saying what to do.
    let e = error_of(&rec(0, 1, VERSION + 1, ACCESS));
    assert_eq!(e.offset, 10);
    assert!(
        e.what.contains("version 2") && e.what.contains("bunkai flow cc"),
        "{e}"
    );

    // Truncated: a header cut short, a text longer than the section.
    let e = error_of(&good[..12]);
    assert_eq!(e.offset, 0);
    let mut t = good.clone();
    t[12..16].copy_from_slice(&1000u32.to_le_bytes());
    assert_eq!(error_of(&t).offset, 12);
    let mut t = good.clone();
    t[12..16].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(error_of(&t).offset, 12);

    // Unknown kind; text without its NUL; NUL inside the text.
    let e = error_of(&rec(0, 9, VERSION, ACCESS));
    assert_eq!(e.offset, 8);
    let mut t = good.clone();
    let len = ACCESS.len() + 1;
    t[16 + len - 1] = b'x';
    assert_eq!(error_of(&t).offset, 16);
    let mut t = good.clone();
    t[20] = 0;
    assert!(error_of(&t).what.contains("NUL"));

    // Text that is not a join point.
    for (text, why) in [
        ("pkt\tlen\tf\tx.c\t1\tload\t32", "fields"),
        ("pkt\tlen\tf\tx.c\tL\tload\t32\t", "not a number"),
        ("pkt\tlen\tf\tx.c\t1\tload\twide\t", "member width"),
        ("pkt\tlen\tf\tx.c\t1\tpeek\t32\t", "unknown access"),
        ("pkt\tlen\tf\tx.c\t1\tload\t32\t$base", "name=location"),
        ("pkt\tlen\tf\tx.c\t1\tload\t32\t$base=8(%rax)", "location"),
        ("-\t-\tf\tx.c\t1\tload\t0\t", "without struct"),
    ] {
        let e = error_of(&rec(0, 1, VERSION, text));
        assert_eq!(e.offset, 16, "{text}");
        assert!(e.what.contains(why), "{text}: {e}");
    }
    // Kind and access must agree.
    assert!(error_of(&rec(0, 2, VERSION, ACCESS))
        .what
        .contains("access"));
}

#[test]
fn empty_table_is_no_join_points() {
    assert!(parse(&[], 0).unwrap().is_empty());
}

#[test]
fn not_elf_and_no_table() {
    let e = from_elf(b"not an elf file at all").unwrap_err();
    assert!(format!("{e:#}").contains("not an ELF file"));
    // The test binary itself is an ELF file without a table.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let e = from_elf(&me).unwrap_err();
    assert!(format!("{e:#}").contains("bunkai flow cc"), "{e:#}");
}

/// The versions and magics of flow/include/bunkai_flow.h as a C compiler
/// reads them, against their Rust mirrors.
#[test]
fn versions_match_the_compiled_header() {
    let inc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let got = bunkai_common::c_header::run(
        &inc,
        "bunkai_flow.h",
        r#"printf("%u %u %u %u %zu\n", BKF_VERSION, BKF_JP_MAGIC, BKF_BUF_VERSION, BKF_BUF_MAGIC, sizeof(struct bkf_buf_header));"#,
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    use crate::buffer;
    assert_eq!(got, format!("{VERSION} {MAGIC} {} {} {}\n", buffer::VERSION, buffer::BUF_MAGIC, buffer::HEADER));
}

/// The constants mirror flow/include/bunkai_flow.h.
#[test]
fn constants_match_the_shared_header() {
    let h = include_str!("../include/bunkai_flow.h");
    let define = |name: &str| -> String {
        let line = h
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("{name} not in bunkai_flow.h"));
        line.split_whitespace()
            .nth(2)
            .unwrap()
            .trim_end_matches('u')
            .to_string()
    };
    assert_eq!(define("BKF_VERSION"), VERSION.to_string());
    assert_eq!(define("BKF_BUF_VERSION"), crate::buffer::VERSION.to_string());
    assert_eq!(define("BKF_BUF_HEADER_SIZE"), crate::buffer::HEADER.to_string());
    assert_eq!(define("BKF_REC_DONE"), crate::buffer::REC_DONE.to_string());
    assert_eq!(define("BKF_REC_CHUNK"), crate::buffer::REC_CHUNK.to_string());
    assert_eq!(define("BKF_JP_LIVE_AT_EXIT"), format!("{:#x}", crate::buffer::JP_LIVE_AT_EXIT));
    assert_eq!(define("BKF_LIVE_SAMPLE"), crate::buffer::LIVE_SAMPLE.to_string());
    assert_eq!(define("BKF_SECTION"), format!("\"{SECTION}\""));
    assert_eq!(define("BKF_JP_MAGIC"), format!("{MAGIC:#010x}"));
    assert_eq!(define("BKF_SLED_SIZE"), SLED_SIZE.to_string());
    assert!(h.contains("BKF_KIND_ACCESS = 1, BKF_KIND_ENTRY = 2"));
    let sled: Vec<String> = UNPATCHED_SLED.iter().map(|b| format!("{b:02x}")).collect();
    let listed: Vec<&str> = h
        .lines()
        .find(|l| l.contains("data16 data16 cs nopw"))
        .unwrap()
        .trim_start_matches(" *")
        .trim_start()
        .split("  ")
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(listed, sled);
    assert_eq!(&MAGIC.to_le_bytes(), b"BKFP");
}

#[test]
fn compiler_command_line() {
    use crate::cc::command_line;
    use std::ffi::OsString;
    use std::path::Path;
    let p = Path::new("/lib/BunkaiFlow.so");
    let s = |v: Vec<OsString>| {
        v.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
    assert_eq!(
        s(command_line(p, &args(&["-O2", "-g0", "a.c", "-o", "a"]))),
        "-fpass-plugin=/lib/BunkaiFlow.so -O2 -g0 a.c -o a -g"
    );
    assert_eq!(
        s(command_line(p, &args(&["-O2", "--", "a.c"]))),
        "-fpass-plugin=/lib/BunkaiFlow.so -O2 -g -- a.c"
    );
    assert_eq!(
        s(command_line(p, &args(&["-mllvm", "-bunkai-flow-structs=pkt", "a.c"]))),
        "-fpass-plugin=/lib/BunkaiFlow.so -Xclang -load -Xclang /lib/BunkaiFlow.so -mllvm -bunkai-flow-structs=pkt a.c -g"
    );
}
