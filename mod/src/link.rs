//! Our linker for x86-64 ELF relocatable objects (`clang -c`, `gcc -c`),
//! DKM's pre-link and link stages.
//!
//! DKM linked every module twice: once to learn how much memory it needs,
//! once at the address the kernel gave it — 90% of its load time. Here the
//! pre-link reads the sizes from the section headers and counts the PLT and
//! GOT entries from the relocation tables (no symbol is resolved, nothing is
//! relocated), so there is exactly one link pass, at the final address.
//!
//! Memory layout of a loaded module (one mapping, two parts):
//!   RX: .text* and read-only data, then 8-byte PLT stubs (`jmp *GOT(%rip)`)
//!       for functions outside the module (the host and its libraries are
//!       usually more than 2 GB away, out of reach of a `call rel32`);
//!   RW: .data*, .bss*, common symbols, then the GOT.
//! Supported relocations: R_X86_64_64, PC32, PLT32, 32, 32S, PC64,
//! GOTPCREL, GOTPCRELX, REX_GOTPCRELX, NONE. Anything else, and any value
//! that does not fit its field, is an error naming the place and symbol.
//!
//! A module is untrusted input. Before anything is laid out, `check_raw`
//! reads the section headers themselves (the `object` crate skips a
//! relocation table it cannot read, which would load code unrelocated):
//! every section inside the file, RELA tables well formed and linked to the
//! symbol table, REL refused, alignment a power of two and at most a page,
//! sizes bounded. `check_symbols` keeps every defined symbol inside its
//! section and every relocation inside its own section (not just inside
//! the image: a neighbour must not be overwritten). C++ exceptions are
//! refused: `.eh_frame` is not registered, and a throw through a module
//! aborts the host.

use anyhow::{bail, Context, Result};
use object::{
    Architecture, BinaryFormat, Object, ObjectKind, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget,
    SectionIndex, SectionKind, SymbolIndex, SymbolSection,
};
use std::collections::{BTreeMap, HashMap};

const R_NONE: u32 = 0;
const R_64: u32 = 1;
const R_PC32: u32 = 2;
const R_PLT32: u32 = 4;
const R_GOTPCREL: u32 = 9;
const R_32: u32 = 10;
const R_32S: u32 = 11;
const R_PC64: u32 = 24;
const R_GOTPCRELX: u32 = 41;
const R_REX_GOTPCRELX: u32 = 42;

const PLT_ENTRY: u64 = 8;
const SHF_WRITE: u64 = 1;
const SHF_ALLOC: u64 = 2;
const SHF_EXECINSTR: u64 = 4;
const SHF_TLS: u64 = 0x400;

/// The most memory a module may ask for (code, data, bss, PLT and GOT).
pub const MAX_MODULE: u64 = 1 << 30;
/// The largest section alignment: the host maps each region page-aligned.
pub const MAX_ALIGN: u64 = 4096;

/// Names that mean the module throws or catches C++ exceptions.
const EH_SYMBOLS: [&str; 6] =
    ["__gxx_personality_v0", "_Unwind_Resume", "__cxa_throw", "__cxa_begin_catch", "__cxa_rethrow", "__cxa_end_catch"];

/// Bytes a relocation of type `t` writes.
fn width(t: u32) -> u64 {
    match t {
        R_NONE => 0,
        R_64 | R_PC64 => 8,
        _ => 4,
    }
}

fn rel_name(t: u32) -> String {
    match t {
        R_64 => "R_X86_64_64".into(),
        R_PC32 => "R_X86_64_PC32".into(),
        R_PLT32 => "R_X86_64_PLT32".into(),
        R_GOTPCREL => "R_X86_64_GOTPCREL".into(),
        R_32 => "R_X86_64_32".into(),
        R_32S => "R_X86_64_32S".into(),
        R_PC64 => "R_X86_64_PC64".into(),
        R_GOTPCRELX => "R_X86_64_GOTPCRELX".into(),
        R_REX_GOTPCRELX => "R_X86_64_REX_GOTPCRELX".into(),
        _ => format!("relocation type {t}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Region {
    Rx,
    Rw,
}

/// The pre-link's result: where everything goes, relative to each region.
#[derive(Debug, Clone)]
pub struct Layout {
    pub rx_size: u64,
    pub rw_size: u64,
    /// Bytes of RW that carry data (the rest is zero: bss, GOT before link).
    pub rw_data_size: u64,
    placed: HashMap<SectionIndex, (Region, u64)>,
    commons: HashMap<SymbolIndex, u64>,
    plt: BTreeMap<usize, u64>,
    got: BTreeMap<usize, u64>,
    /// Bytes of code and data (the paper's "data amount" of a module).
    pub payload: u64,
}

impl Layout {
    /// RW bytes the link writes (data, then the GOT, which follows bss and
    /// commons); the rest of RW is zero.
    pub fn rw_image_size(&self) -> u64 {
        self.rw_data_size.max(self.got.values().max().map_or(0, |o| o + 8))
    }
}

/// A parsed relocatable object.
pub struct Module<'d> {
    pub file: object::File<'d>,
}

fn align_up(v: u64, a: u64) -> u64 {
    let a = a.max(1);
    v.div_ceil(a) * a
}

fn flags_of(s: &object::Section) -> u64 {
    match s.flags() {
        object::SectionFlags::Elf { sh_flags } => sh_flags,
        _ => 0,
    }
}

fn rtype(f: RelocationFlags) -> u32 {
    match f {
        RelocationFlags::Elf { r_type } => r_type,
        _ => u32::MAX,
    }
}

/// Sections that are allocated in the host, or None with the reason they
/// are skipped; an error for those we refuse.
fn wanted(s: &object::Section) -> Result<Option<Region>> {
    let name = s.name().unwrap_or("");
    let f = flags_of(s);
    if f & SHF_ALLOC == 0 || name == crate::meta::SECTION {
        return Ok(None);
    }
    if name.starts_with(".note") || name == ".eh_frame" {
        return Ok(None); // no unwinding through modules
    }
    if f & SHF_WRITE != 0 && f & SHF_EXECINSTR != 0 {
        bail!("section {name} is both writable and executable, which modules cannot have (keep code and data apart)");
    }
    if f & SHF_TLS != 0 {
        bail!("section {name} holds thread-local variables, which modules cannot have (use a registry or malloc)");
    }
    if [".init_array", ".fini_array", ".preinit_array", ".ctors", ".dtors"].iter().any(|p| name.starts_with(p)) {
        bail!("section {name}: modules cannot have static constructors or destructors (use BUNKAI_MODULE_INIT / BUNKAI_MODULE_EXIT)");
    }
    Ok(Some(if f & SHF_WRITE != 0 { Region::Rw } else { Region::Rx }))
}

/// The section headers as the file has them, checked before the `object`
/// crate's view of the file is trusted (see the top of this file).
fn check_raw(data: &[u8]) -> Result<()> {
    use object::elf;
    use object::read::elf::{FileHeader, SectionHeader};
    let damaged = |e: object::read::Error| anyhow::anyhow!("damaged ELF object: {e} (rebuild it with clang or gcc -c)");
    let h = elf::FileHeader64::<object::Endianness>::parse(data).map_err(damaged)?;
    let e = h.endian().map_err(damaged)?;
    let secs = h.sections(e, data).map_err(damaged)?;
    let n = secs.len();
    let name_of = |s: &elf::SectionHeader64<object::Endianness>| -> String {
        secs.section_name(e, s).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_else(|_| "?".into())
    };
    let symtabs: Vec<usize> =
        secs.iter().enumerate().filter(|(_, s)| s.sh_type(e) == elf::SHT_SYMTAB).map(|(i, _)| i).collect();
    if symtabs.len() > 1 {
        bail!("the object has {} symbol tables, ELF allows one (rebuild the module)", symtabs.len());
    }
    for (i, s) in secs.iter().enumerate() {
        let name = name_of(s);
        let (t, f, off, size) = (s.sh_type(e), s.sh_flags(e), s.sh_offset(e), s.sh_size(e));
        if t != elf::SHT_NULL && t != elf::SHT_NOBITS && off.checked_add(size).map_or(true, |end| end > data.len() as u64) {
            bail!(
                "section {name} (#{i}) lies outside the file (bytes {off:#x}+{size:#x} of {:#x}): the object is truncated or damaged (rebuild the module)",
                data.len()
            );
        }
        if f & SHF_ALLOC != 0 {
            let a = s.sh_addralign(e);
            if a > 1 && !a.is_power_of_two() {
                bail!("section {name}: alignment {a} is not a power of two (the object is damaged; rebuild the module)");
            }
            if a > MAX_ALIGN {
                bail!("section {name} asks for {a}-byte alignment, more than a page (modules are mapped page-aligned; use at most aligned({MAX_ALIGN}))");
            }
            if size > MAX_MODULE {
                bail!("section {name} is {size} bytes, more than a module may have ({MAX_MODULE}; allocate large buffers at run time)");
            }
        }
        match t {
            elf::SHT_REL => bail!(
                "section {name}: relocations without addends (REL) cannot be linked (build the module for x86-64 with clang or gcc -c, which write RELA)"
            ),
            elf::SHT_RELA => {
                let what = |why: String| -> anyhow::Error {
                    anyhow::anyhow!("relocation table {name} is unreadable: {why} (the object is damaged; rebuild the module)")
                };
                if s.sh_entsize(e) != 24 {
                    return Err(what(format!("entry size {} instead of 24", s.sh_entsize(e))));
                }
                if size % 24 != 0 {
                    return Err(what(format!("size {size} is not a multiple of 24")));
                }
                if off % 8 != 0 {
                    return Err(what(format!("offset {off:#x} is not 8-byte aligned")));
                }
                let link = s.sh_link(e) as usize;
                if Some(&link) != symtabs.first() {
                    return Err(what(format!("its symbol table link is section #{link}, not the symbol table")));
                }
                let info = s.sh_info(e) as usize;
                if info == 0 || info >= n {
                    return Err(what(format!("it applies to section #{info}, which does not exist")));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

impl<'d> Module<'d> {
    pub fn parse(data: &'d [u8]) -> Result<Module<'d>> {
        if data.len() < 4 || &data[..4] != b"\x7fELF" {
            bail!("not an ELF file (give a relocatable object built with clang or gcc -c)");
        }
        let file = object::File::parse(data)
            .map_err(|e| anyhow::anyhow!("damaged ELF object: {e} (rebuild it with clang or gcc -c)"))?;
        if file.format() != BinaryFormat::Elf || file.kind() != ObjectKind::Relocatable {
            let what = match file.kind() {
                ObjectKind::Executable => "an executable",
                ObjectKind::Dynamic => "a shared library or position-independent executable",
                ObjectKind::Core => "a core dump",
                _ => "an object of another kind",
            };
            bail!("not a relocatable object but {what} (build the module with -c, not linked)");
        }
        if file.architecture() != Architecture::X86_64 {
            let arch = format!("{:?}", file.architecture()).to_lowercase().replace('_', "-");
            bail!("an object for {arch}, not x86-64 (build the module for this machine)");
        }
        check_raw(data)?;
        // Touch every section and relocation table now: a truncated object
        // fails here, before anything happens in the host.
        for s in file.sections() {
            if s.kind() != SectionKind::UninitializedData && s.kind() != SectionKind::UninitializedTls {
                s.data().map_err(|e| {
                    anyhow::anyhow!("section {} is truncated or damaged: {e} (rebuild the module)", s.name().unwrap_or("?"))
                })?;
            }
            for (_, r) in s.relocations() {
                if let RelocationTarget::Symbol(i) = r.target() {
                    file.symbol_by_index(i).map_err(|e| anyhow::anyhow!("damaged relocation in {}: {e}", s.name().unwrap_or("?")))?;
                }
            }
        }
        let m = Module { file };
        m.check_symbols()?;
        m.check_relocations()?;
        m.check_exceptions()?;
        m.check_entries()?;
        Ok(m)
    }

    /// The functions the host will call (init, exit, each interface's
    /// table) are functions of this module, in its code: never data, an
    /// absolute address or a name it imports.
    fn check_entries(&self) -> Result<()> {
        let Some(bytes) = self.meta_bytes() else { return Ok(()) };
        let Ok(meta) = crate::meta::parse(bytes) else { return Ok(()) }; // the server reports it
        let funcs = self.defined_functions();
        let mut entries: Vec<(String, &str)> = Vec::new();
        if let Some(i) = &meta.init {
            entries.push(("init function".into(), i));
        }
        if let Some(x) = &meta.exit {
            entries.push(("exit function".into(), x));
        }
        for imp in &meta.implements {
            for s in &imp.symbols {
                entries.push((format!("interface {}'s function", imp.iface.name), s));
            }
        }
        for (what, name) in entries {
            if !funcs.iter().any(|f| f == name) {
                bail!("{what} {name} is not a function defined in the module's code (define it in the module, as a function)");
            }
        }
        Ok(())
    }

    /// Every defined symbol inside its section; commons of a sane size and
    /// alignment.
    fn check_symbols(&self) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for sym in self.file.symbols() {
            let name = sym.name().unwrap_or("?");
            if sym.is_definition() && !name.is_empty() && !seen.insert(name) {
                bail!("symbol {name} is defined twice in the object (the object is damaged; rebuild the module)");
            }
            match sym.section() {
                SymbolSection::Section(si) => {
                    let sec = self.file.section_by_index(si).map_err(|_| {
                        anyhow::anyhow!("symbol {name} is defined in section #{}, which does not exist (the object is damaged; rebuild the module)", si.0)
                    })?;
                    if wanted(&sec)?.is_none() {
                        continue;
                    }
                    let end = sym.address().checked_add(sym.size());
                    if end.map_or(true, |end| end > sec.size()) {
                        bail!(
                            "symbol {name} ({:#x}+{:#x}) lies outside its section {} ({:#x} bytes) (the object is damaged; rebuild the module)",
                            sym.address(),
                            sym.size(),
                            sec.name().unwrap_or("?"),
                            sec.size()
                        );
                    }
                }
                SymbolSection::Common => {
                    let a = sym.address();
                    if a > MAX_ALIGN || (a > 1 && !a.is_power_of_two()) {
                        bail!("common symbol {name}: alignment {a} is not a power of two up to {MAX_ALIGN} (rebuild the module)");
                    }
                    if sym.size() > MAX_MODULE {
                        bail!("common symbol {name} is {} bytes, more than a module may have ({MAX_MODULE})", sym.size());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every relocation of a loaded section writes inside that section, and
    /// is of a type we link.
    fn check_relocations(&self) -> Result<()> {
        for s in self.file.sections() {
            if wanted(&s)?.is_none() {
                continue;
            }
            let sname = s.name().unwrap_or("?");
            let nobits = matches!(s.kind(), SectionKind::UninitializedData | SectionKind::UninitializedTls);
            for (off, r) in s.relocations() {
                let t = rtype(r.flags());
                if nobits && t != R_NONE {
                    bail!("{sname}+{off:#x}: a relocation in a section without contents (the object is damaged; rebuild the module)");
                }
                if !matches!(t, R_NONE | R_64 | R_PC32 | R_PLT32 | R_GOTPCREL | R_32 | R_32S | R_PC64 | R_GOTPCRELX | R_REX_GOTPCRELX) {
                    bail!("{sname}+{off:#x}: unsupported {} (compile the module for x86-64, small code model)", rel_name(t));
                }
                if off.checked_add(width(t)).map_or(true, |end| end > s.size()) {
                    bail!(
                        "{sname}+{off:#x}: a {} relocation outside its section ({:#x} bytes) (the object is damaged; rebuild the module)",
                        rel_name(t),
                        s.size()
                    );
                }
                let RelocationTarget::Symbol(si) = r.target() else {
                    if t == R_NONE {
                        continue;
                    }
                    bail!("{sname}+{off:#x}: relocation without a symbol (the object is damaged; rebuild the module)");
                };
                // A compiler never relocates against an absolute symbol in
                // a module: one is an address the object made up (a call
                // to it jumps wherever it says).
                let sym = self.file.symbol_by_index(si)?;
                if t != R_NONE && sym.section() == SymbolSection::Absolute {
                    bail!(
                        "{sname}+{off:#x}: relocation against the absolute symbol {} (the object is damaged; rebuild the module)",
                        sym.name().unwrap_or("?")
                    );
                }
            }
        }
        Ok(())
    }

    /// C++ exceptions cannot pass through a loaded module (its unwind
    /// tables are not registered): refused, with the fix.
    fn check_exceptions(&self) -> Result<()> {
        if self.file.sections().any(|s| s.name().map_or(false, |n| n.starts_with(".gcc_except_table"))) {
            bail!("the module catches C++ exceptions (.gcc_except_table), which cannot unwind through a loaded module (build it with -fno-exceptions)");
        }
        if let Some(n) = self
            .file
            .symbols()
            .filter(|s| s.is_undefined())
            .filter_map(|s| s.name().ok())
            .find(|n| EH_SYMBOLS.contains(n))
        {
            bail!("the module uses C++ exceptions ({n}), which cannot unwind through a loaded module (build it with -fno-exceptions)");
        }
        Ok(())
    }

    /// The metadata section's bytes, if any.
    pub fn meta_bytes(&self) -> Option<&'d [u8]> {
        self.file.section_by_name(crate::meta::SECTION).and_then(|s| s.data().ok())
    }

    /// Functions this module defines: code symbols in a loaded executable
    /// section (the only names an interface, init or exit may point at).
    pub fn defined_functions(&self) -> Vec<String> {
        self.file
            .symbols()
            .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
            .filter(|s| match s.section() {
                SymbolSection::Section(si) => self
                    .file
                    .section_by_index(si)
                    .map_or(false, |sec| flags_of(&sec) & (SHF_ALLOC | SHF_EXECINSTR) == SHF_ALLOC | SHF_EXECINSTR),
                _ => false,
            })
            .filter_map(|s| s.name().ok().map(String::from))
            .collect()
    }

    /// Names the module needs from outside (undefined, referenced), and
    /// whether each is weak.
    pub fn undefined(&self) -> Vec<(String, bool)> {
        let mut v: Vec<(String, bool)> = self
            .file
            .symbols()
            .filter(|s| s.is_undefined() && s.is_global())
            .filter_map(|s| s.name().ok().filter(|n| !n.is_empty()).map(|n| (n.to_string(), s.is_weak())))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// DKM's pre-link: the memory the module needs, from the headers.
    pub fn prelink(&self) -> Result<Layout> {
        let mut rx = 0u64;
        let mut rw = 0u64;
        let mut rw_data_end = 0u64;
        let mut payload = 0u64;
        let mut placed = HashMap::new();
        // Data first, then bss, so the RW bytes to copy are one prefix.
        let secs: Vec<_> = self.file.sections().collect();
        for pass in 0..2 {
            for s in &secs {
                let Some(region) = wanted(s)? else { continue };
                let bss = s.kind() == SectionKind::UninitializedData;
                if (pass == 0) == bss && region == Region::Rw {
                    continue;
                }
                if pass == 1 && region == Region::Rx {
                    continue;
                }
                let (cur, a) = match region {
                    Region::Rx => (&mut rx, s.align()),
                    Region::Rw => (&mut rw, s.align()),
                };
                *cur = align_up(*cur, a);
                placed.insert(s.index(), (region, *cur));
                *cur += s.size();
                payload += s.size();
                if region == Region::Rw && !bss {
                    rw_data_end = rw;
                }
            }
        }
        let mut commons = HashMap::new();
        for sym in self.file.symbols() {
            if sym.section() == SymbolSection::Common {
                let a = sym.address().max(1);
                rw = align_up(rw, a);
                commons.insert(sym.index(), rw);
                rw += sym.size();
                payload += sym.size();
            }
        }
        // PLT and GOT entries, from the relocation tables.
        let mut plt_syms = Vec::new();
        let mut got_syms = Vec::new();
        for s in &secs {
            if wanted(s)?.is_none() {
                continue;
            }
            for (_, r) in s.relocations() {
                let RelocationTarget::Symbol(i) = r.target() else { continue };
                let t = rtype(r.flags());
                let sym = self.file.symbol_by_index(i)?;
                match t {
                    R_PLT32 if sym.is_undefined() => plt_syms.push(i.0),
                    R_GOTPCREL | R_GOTPCRELX | R_REX_GOTPCRELX => got_syms.push(i.0),
                    _ => {}
                }
            }
        }
        plt_syms.sort();
        plt_syms.dedup();
        got_syms.extend(plt_syms.iter().copied());
        got_syms.sort();
        got_syms.dedup();
        rx = align_up(rx, 16);
        let mut plt = BTreeMap::new();
        for i in plt_syms {
            plt.insert(i, rx);
            rx += PLT_ENTRY;
        }
        rw = align_up(rw, 8);
        let mut got = BTreeMap::new();
        for i in got_syms {
            got.insert(i, rw);
            rw += 8;
        }
        // Each part is at most MAX_MODULE (checked above) times the number
        // of sections (at most 2^32): no sum here overflows a u64.
        if rx.saturating_add(rw) > MAX_MODULE {
            bail!("the module needs {} bytes of memory, more than a module may have ({MAX_MODULE}; allocate large buffers at run time)", rx.saturating_add(rw));
        }
        Ok(Layout { rx_size: rx, rw_size: rw, rw_data_size: rw_data_end, placed, commons, plt, got, payload })
    }

    /// The one link pass: `rx`/`rw` are the addresses the host gave us,
    /// `resolve` the addresses of the undefined names. Returns the images to
    /// copy and the module's defined global symbols.
    pub fn link(&self, lay: &Layout, rx: u64, rw: u64, resolve: &HashMap<String, u64>) -> Result<Image> {
        let mut rx_img = vec![0u8; lay.rx_size as usize];
        let mut rw_img = vec![0u8; lay.rw_image_size() as usize];
        let symbols = self.link_into(lay, rx, rw, resolve, &mut rx_img, &mut rw_img)?;
        Ok(Image { rx: rx_img, rw: rw_img, symbols })
    }

    /// The link pass writing straight into caller-provided images (the
    /// memfd the host will map, for the zero-copy load): `rx_img` at least
    /// `lay.rx_size` bytes and `rw_img` at least `lay.rw_image_size()`, both
    /// zero-filled. Returns the module's defined symbols.
    pub fn link_into(
        &self,
        lay: &Layout,
        rx: u64,
        rw: u64,
        resolve: &HashMap<String, u64>,
        rx_img: &mut [u8],
        rw_img: &mut [u8],
    ) -> Result<Symbols> {
        if (rx_img.len() as u64) < lay.rx_size || (rw_img.len() as u64) < lay.rw_image_size() {
            bail!("internal error: link images smaller than the layout");
        }
        let base = |r: Region| if r == Region::Rx { rx } else { rw };

        // Section contents.
        for s in self.file.sections() {
            let Some(&(region, off)) = lay.placed.get(&s.index()) else { continue };
            if s.kind() == SectionKind::UninitializedData {
                continue;
            }
            let data = s.data()?;
            let img: &mut [u8] = if region == Region::Rx { &mut *rx_img } else { &mut *rw_img };
            img[off as usize..off as usize + data.len()].copy_from_slice(data);
        }

        // Symbol addresses.
        let mut missing = Vec::new();
        let addr_of = |sym: &object::Symbol, missing: &mut Vec<String>| -> Result<u64> {
            Ok(match sym.section() {
                SymbolSection::Section(si) => {
                    let Some(&(region, off)) = lay.placed.get(&si) else {
                        let sn = self.file.section_by_index(si).ok().and_then(|s| s.name().ok().map(String::from));
                        bail!(
                            "symbol {} lives in section {}, which is not loaded (modules cannot use it)",
                            sym.name().unwrap_or("?"),
                            sn.unwrap_or_default()
                        );
                    };
                    base(region) + off + sym.address()
                }
                SymbolSection::Common => rw + lay.commons[&sym.index()],
                SymbolSection::Absolute => sym.address(),
                SymbolSection::Undefined => {
                    let name = sym.name().unwrap_or("");
                    match resolve.get(name) {
                        Some(a) if *a != 0 => *a,
                        _ if sym.is_weak() => 0,
                        _ => {
                            missing.push(name.to_string());
                            0
                        }
                    }
                }
                _ => bail!("symbol {} has an unsupported section", sym.name().unwrap_or("?")),
            })
        };

        // GOT and PLT.
        for (&i, &off) in &lay.got {
            let sym = self.file.symbol_by_index(SymbolIndex(i))?;
            let a = addr_of(&sym, &mut missing)?;
            rw_img[off as usize..off as usize + 8].copy_from_slice(&a.to_le_bytes());
        }
        for (&i, &off) in &lay.plt {
            let got = rw + lay.got[&i];
            let p = rx + off;
            let disp = got as i64 - (p as i64 + 6);
            let d32 = i32::try_from(disp).map_err(|_| anyhow::anyhow!("the module's PLT and GOT are more than 2 GB apart"))?;
            let e = &mut rx_img[off as usize..off as usize + 8];
            e[..2].copy_from_slice(&[0xff, 0x25]);
            e[2..6].copy_from_slice(&d32.to_le_bytes());
            e[6..8].copy_from_slice(&[0xcc, 0xcc]);
        }

        // Relocations.
        for s in self.file.sections() {
            let Some(&(region, soff)) = lay.placed.get(&s.index()) else { continue };
            let sname = s.name().unwrap_or("?").to_string();
            for (off, r) in s.relocations() {
                let t = rtype(r.flags());
                if t == R_NONE {
                    continue;
                }
                let RelocationTarget::Symbol(i) = r.target() else {
                    bail!("{sname}+{off:#x}: relocation without a symbol");
                };
                let sym = self.file.symbol_by_index(i)?;
                let sname_sym = match sym.name() {
                    Ok("") | Err(_) => sym
                        .section_index()
                        .and_then(|si| self.file.section_by_index(si).ok())
                        .and_then(|s| s.name().ok().map(String::from))
                        .unwrap_or_else(|| "?".into()),
                    Ok(n) => n.to_string(),
                };
                let s_addr = addr_of(&sym, &mut missing)?;
                let a = r.addend();
                let p = base(region) + soff + off;
                let img: &mut [u8] = if region == Region::Rx { &mut *rx_img } else { &mut *rw_img };
                let at = (soff + off) as usize;
                let overflow = |v: i128| -> anyhow::Error {
                    anyhow::anyhow!(
                        "relocation overflow: {} at {sname}+{off:#x} against {sname_sym}: {v:#x} does not fit (compile the module with -fPIC, or keep the symbol inside the module)",
                        rel_name(t)
                    )
                };
                let put32 = |img: &mut [u8], v: i128, signed: bool| -> Result<()> {
                    let ok = if signed { i32::try_from(v).is_ok() } else { u32::try_from(v).is_ok() };
                    if !ok {
                        return Err(overflow(v));
                    }
                    img[at..at + 4].copy_from_slice(&(v as u32).to_le_bytes());
                    Ok(())
                };
                if off.checked_add(width(t)).map_or(true, |end| end > s.size()) {
                    bail!("{sname}+{off:#x}: relocation outside its section");
                }
                let (s128, a128, p128) = (s_addr as i128, a as i128, p as i128);
                match t {
                    R_64 => img[at..at + 8].copy_from_slice(&((s128 + a128) as u64).to_le_bytes()),
                    R_PC64 => img[at..at + 8].copy_from_slice(&((s128 + a128 - p128) as u64).to_le_bytes()),
                    R_PC32 => put32(img, s128 + a128 - p128, true)?,
                    R_PLT32 => {
                        let target = match lay.plt.get(&i.0) {
                            Some(o) => (rx + o) as i128,
                            None => s128,
                        };
                        put32(img, target + a128 - p128, true)?
                    }
                    R_GOTPCREL | R_GOTPCRELX | R_REX_GOTPCRELX => {
                        let g = (rw + lay.got[&i.0]) as i128;
                        put32(img, g + a128 - p128, true)?
                    }
                    R_32 => put32(img, s128 + a128, false)?,
                    R_32S => put32(img, s128 + a128, true)?,
                    _ => bail!(
                        "{sname}+{off:#x}: unsupported {} against {sname_sym} (compile the module for the small code model)",
                        rel_name(t)
                    ),
                }
            }
        }
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            bail!(
                "unresolved symbols: {} (neither the host nor a loaded module defines them; load the module that does first)",
                missing.join(", ")
            );
        }

        // The module's own globals, for later modules and for registration.
        let mut symbols = HashMap::new();
        for sym in self.file.symbols() {
            if !sym.is_definition() || sym.name().map_or(true, |n| n.is_empty()) {
                continue;
            }
            if let Ok(a) = addr_of(&sym, &mut Vec::new()) {
                symbols.insert(sym.name().unwrap().to_string(), (a, sym.is_global()));
            }
        }
        Ok(symbols)
    }
}

/// A module's defined symbols: name -> (address, global).
pub type Symbols = HashMap<String, (u64, bool)>;

/// What the link produced.
pub struct Image {
    pub rx: Vec<u8>,
    /// RW bytes to copy (data and GOT; the rest of RW is zero).
    pub rw: Vec<u8>,
    /// Defined symbols: name -> (address, global).
    pub symbols: Symbols,
}

/// Reads a module file and parses it, with the path in errors.
pub fn read(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {} (check the path)", path.display()))
}
