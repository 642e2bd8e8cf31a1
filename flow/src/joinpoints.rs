//! The join-point table a program built by `bunkai flow cc` carries: the
//! section `bunkai_flow_jp` that flow/pass/ leaves in it (layout: section 1
//! of flow/include/bunkai_flow.h). One record per sled, 4-byte aligned:
//!
//! ```text
//!   i32 sled - &this field    u32 magic "BKFP"    u16 kind, u16 version
//!   u32 text_len              text (NUL-terminated), padding to 4
//! ```
//!
//! and the text, tab-separated (sample, tabs shown as `|`):
//!
//! ```text
//!   pkt|len|pkt_clone|packets.c|36|load|32|$base=%rbx skb=%rbx n=%rax
//!   -|-|queue_push|packets.c|44|entry|0|$arg0=%rdi $arg1=%rsi q=%rdi p=%rsi
//! ```
//!
//! A record's index in the section is the join point's number (the `jp` of
//! a flow buffer record). Sled addresses are link-time virtual addresses:
//! add the load bias of a PIE or shared object to get run-time ones.

use anyhow::{bail, Context, Result};
use object::{Object, ObjectSection};
use std::fmt;
use std::path::Path;

/// BKF_VERSION, BKF_SECTION, BKF_JP_MAGIC, BKF_SLED_SIZE in bunkai_flow.h.
pub const VERSION: u16 = 2;
pub const SECTION: &str = "bunkai_flow_jp";
pub const MAGIC: u32 = 0x5046_4b42;
pub const SLED_SIZE: usize = 11;
/// The unpatched sled as the compiler leaves it: one 11-byte nop,
/// `data16 data16 cs nopw 0(%rax,%rax,1)`.
pub const UNPATCHED_SLED: [u8; SLED_SIZE] = [
    0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
];
const KIND_ACCESS: u16 = 1;
const KIND_ENTRY: u16 = 2;
const KIND_AFTER: u16 = 3;
const KIND_EXIT: u16 = 4;
const HEADER: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Access,
    Entry,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Load,
    Store,
    /// `&p->member` handed to a call.
    Addr,
    Entry,
    /// A function's return (kind Entry, after: <after> advice on the entry).
    Exit,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Load => "load",
            Access::Store => "store",
            Access::Addr => "addr",
            Access::Entry => "entry",
            Access::Exit => "exit",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    Rsp,
    Rbp,
}

/// Where an operand is at the sled's first byte (a trampoline called from
/// the sled sees %rsp 8 lower).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A register as the compiler printed it: "rdi" (64 bits), "edi" (the
    /// low 32 bits of rdi), "r15d", "sil", "xmm0" (a float or double).
    Reg(String),
    Mem {
        base: Base,
        offset: i64,
    },
    Imm(i64),
}

impl Location {
    /// Parses the compiler's AT&T text: "%rdi", "16(%rsp)", "-24(%rbp)", "$5".
    pub fn parse(s: &str) -> Option<Location> {
        if let Some(r) = s.strip_prefix('%') {
            let ok = !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            return ok.then(|| Location::Reg(r.to_string()));
        }
        if let Some(v) = s.strip_prefix('$') {
            return parse_int(v).map(Location::Imm);
        }
        let (off, rest) = s.split_once('(')?;
        let base = match rest {
            "%rsp)" => Base::Rsp,
            "%rbp)" => Base::Rbp,
            _ => return None,
        };
        let offset = if off.is_empty() { 0 } else { parse_int(off)? };
        Some(Location::Mem { base, offset })
    }
}

fn parse_int(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    // i128 so that i64::MIN, which the compiler prints, parses too.
    let v = match digits.strip_prefix("0x") {
        Some(h) => i128::from_str_radix(h, 16).ok()?,
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            digits.parse::<i128>().ok()?
        }
        None => return None,
    };
    i64::try_from(if neg { v.checked_neg()? } else { v }).ok()
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Location::Reg(r) => write!(f, "%{r}"),
            Location::Imm(v) => write!(f, "${v}"),
            Location::Mem { base, offset } => {
                let b = if *base == Base::Rsp { "rsp" } else { "rbp" };
                if *offset == 0 {
                    write!(f, "(%{b})")
                } else {
                    write!(f, "{offset}(%{b})")
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinPoint {
    /// Position in the table.
    pub index: usize,
    /// Link-time virtual address of the sled.
    pub sled_addr: u64,
    pub kind: Kind,
    /// C struct name without "struct " (None for an entry).
    pub struct_name: Option<String>,
    /// Member name; bitfields sharing a storage unit are "a|b|c".
    pub member: Option<String>,
    /// The source function the join point is in (for an access inlined
    /// from f into g: f).
    pub function: String,
    pub file: String,
    /// 0 when the compiler no longer knew the line.
    pub line: u32,
    pub access: Access,
    /// A sled right after the access (BKF_KIND_AFTER, `-mllvm
    /// -bunkai-flow-after`), or at a return of an entry's function
    /// (BKF_KIND_EXIT), for `<after>` advice; false: before it.
    pub after: bool,
    /// The member's width in bits (a bitfield's storage unit); 0 for an
    /// entry.
    pub bits: u32,
    /// "$base" (the struct instance), "$arg0".., then named C variables;
    /// after a load, "$value" (what it read); at an exit, "$retval".
    pub operands: Vec<(String, Location)>,
}

impl JoinPoint {
    pub fn operand(&self, name: &str) -> Option<&Location> {
        self.operands
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| l)
    }

    /// A special variable this kind of sled never has, which advice sees
    /// as null here: $value exists only after a load, $retval only at a
    /// return.
    pub fn lacks(&self, var: &str) -> bool {
        match var {
            "$value" => !self.after || self.access == Access::Exit,
            "$retval" => self.access != Access::Exit,
            _ => false,
        }
    }
}

/// What is wrong with a table, and where (byte offset in the section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError {
    pub offset: usize,
    pub what: String,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "damaged join-point table at offset {:#x} of {SECTION}: {}",
            self.offset, self.what
        )
    }
}

impl std::error::Error for TableError {}

fn err<T>(offset: usize, what: impl Into<String>) -> std::result::Result<T, TableError> {
    Err(TableError {
        offset,
        what: what.into(),
    })
}

fn u32_at(d: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(d[at..at + 4].try_into().unwrap())
}

/// Parses the section's bytes; `addr` is the section's virtual address.
pub fn parse(data: &[u8], addr: u64) -> std::result::Result<Vec<JoinPoint>, TableError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        if data.len() - at < HEADER {
            return err(
                at,
                format!(
                    "{} bytes left, a record needs at least {HEADER}",
                    data.len() - at
                ),
            );
        }
        let rel = u32_at(data, at) as i32;
        let magic = u32_at(data, at + 4);
        if magic != MAGIC {
            return err(
                at + 4,
                format!("magic {magic:#010x}, expected {MAGIC:#010x}"),
            );
        }
        let kind = u16::from_le_bytes([data[at + 8], data[at + 9]]);
        let version = u16::from_le_bytes([data[at + 10], data[at + 11]]);
        if version != VERSION {
            return err(
                at + 10,
                format!("table version {version}, this bunkai reads version {VERSION} (rebuild the program with this bunkai's `bunkai flow cc`)"),
            );
        }
        let (kind, after) = match kind {
            KIND_ACCESS => (Kind::Access, false),
            KIND_ENTRY => (Kind::Entry, false),
            KIND_AFTER => (Kind::Access, true),
            KIND_EXIT => (Kind::Entry, true),
            k => return err(at + 8, format!("unknown join-point kind {k}")),
        };
        let len = u32_at(data, at + 12) as usize;
        let text_at = at + HEADER;
        if len == 0 || len > data.len() - text_at {
            return err(
                at + 12,
                format!("text length {len} with {} bytes left", data.len() - text_at),
            );
        }
        let raw = &data[text_at..text_at + len];
        if raw[len - 1] != 0 || raw[..len - 1].contains(&0) {
            return err(text_at, "text is not one NUL-terminated string");
        }
        let text = std::str::from_utf8(&raw[..len - 1]).map_err(|_| TableError {
            offset: text_at,
            what: "text is not UTF-8".into(),
        })?;
        let sled_addr = addr.wrapping_add(at as u64).wrapping_add(rel as i64 as u64);
        let mut jp = parse_text(text, out.len(), sled_addr, kind).map_err(|what| TableError {
            offset: text_at,
            what,
        })?;
        if jp.kind == Kind::Entry && (jp.access == Access::Exit) != after {
            return err(at + 8, format!("kind {} with access {:?}", if after { "exit" } else { "entry" }, jp.access.as_str()));
        }
        jp.after = after;
        out.push(jp);
        at = text_at + ((len + 3) & !3);
    }
    Ok(out)
}

fn parse_text(
    text: &str,
    index: usize,
    sled_addr: u64,
    kind: Kind,
) -> std::result::Result<JoinPoint, String> {
    let f: Vec<&str> = text.split('\t').collect();
    if f.len() != 8 {
        return Err(format!(
            "{} tab-separated fields, expected 8: {text:?}",
            f.len()
        ));
    }
    let access = match f[5] {
        "load" => Access::Load,
        "store" => Access::Store,
        "addr" => Access::Addr,
        "entry" => Access::Entry,
        "exit" => Access::Exit,
        a => return Err(format!("unknown access {a:?}")),
    };
    if (kind == Kind::Entry) != matches!(access, Access::Entry | Access::Exit) {
        return Err(format!("a {:?} record with access {:?}", kind, f[5]));
    }
    let line = f[4]
        .parse::<u32>()
        .map_err(|_| format!("line {:?} is not a number", f[4]))?;
    let name = |s: &str| (s != "-").then(|| s.to_string());
    let (struct_name, member) = (name(f[0]), name(f[1]));
    if kind == Kind::Access && (struct_name.is_none() || member.is_none()) {
        return Err("an access without struct or member".into());
    }
    let bits = f[6]
        .parse::<u32>()
        .map_err(|_| format!("member width {:?} is not a number", f[6]))?;
    let mut operands = Vec::new();
    for op in f[7].split(' ').filter(|s| !s.is_empty()) {
        let (n, l) = op
            .split_once('=')
            .ok_or_else(|| format!("operand {op:?} is not name=location"))?;
        let loc = Location::parse(l).ok_or_else(|| {
            format!("operand {n}: location {l:?} is none of %reg, N(%rsp), N(%rbp), $imm")
        })?;
        if n.is_empty() {
            return Err(format!("operand {op:?} has no name"));
        }
        operands.push((n.to_string(), loc));
    }
    Ok(JoinPoint {
        index,
        sled_addr,
        kind,
        struct_name,
        member,
        function: f[2].to_string(),
        file: f[3].to_string(),
        line,
        access,
        after: false,
        bits,
        operands,
    })
}

/// The join points of an ELF executable or shared object.
pub fn read(path: &Path) -> Result<Vec<JoinPoint>> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    from_elf(&data).with_context(|| path.display().to_string())
}

/// The join points of an ELF image in memory. Every sled must lie in an
/// executable section: a table whose offsets point elsewhere is damaged.
pub fn from_elf(data: &[u8]) -> Result<Vec<JoinPoint>> {
    let file = object::File::parse(data).context("not an ELF file")?;
    if file.kind() == object::ObjectKind::Relocatable {
        bail!("a relocatable object: its sled offsets are not linked yet (read the executable or shared object it goes into)");
    }
    let Some(sec) = file.section_by_name(SECTION) else {
        bail!("no join-point table (section {SECTION}): build it with `bunkai flow cc`");
    };
    let bytes = sec.data().context("cannot read the join-point table")?;
    let jps = parse(bytes, sec.address())?;
    let text: Vec<(u64, u64)> = file
        .sections()
        .filter(|s| matches!(s.flags(), object::SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0))
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    for jp in &jps {
        let end = jp.sled_addr.checked_add(SLED_SIZE as u64);
        if !text.iter().any(|&(lo, hi)| jp.sled_addr >= lo && end.is_some_and(|e| e <= hi)) {
            bail!(
                "join point {} ({}:{}): sled address {:#x} is outside every executable section (damaged table)",
                jp.index,
                jp.file,
                jp.line,
                jp.sled_addr
            );
        }
    }
    Ok(jps)
}

/// The file offset of a link-time virtual address (for reading a sled's
/// bytes from the file).
pub fn file_offset(data: &[u8], addr: u64) -> Result<u64> {
    let file = object::File::parse(data).context("not an ELF file")?;
    for s in file.sections() {
        if addr >= s.address() && addr < s.address() + s.size() {
            if let Some((off, _)) = s.file_range() {
                return Ok(off + (addr - s.address()));
            }
        }
    }
    bail!("address {addr:#x} is in no section with file contents")
}
