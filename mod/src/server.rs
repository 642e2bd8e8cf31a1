//! The module server's operations: load (DKM's stages, each timed), swap,
//! unload, list. The host keeps the authoritative table of loaded modules
//! (each with the JSON record below), so any `bunkai mod` invocation sees
//! what earlier ones did; the host serves one connection at a time, so two
//! invocations never interleave.
//!
//! One piece on purpose (over 800 lines): `load` and `swap` share the
//! stages below (plan, prelink, make room, stage, register), and each stage
//! is one function a few screens long; the linker, the wire and the model
//! are modules of their own.

use crate::link::{self, Module};
use crate::meta::{self, Interface, Meta};
use crate::proto::{Host, Msg, Out};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What the host keeps about each loaded module (the COMMIT blob).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub name: String,
    pub version: String,
    pub file: String,
    pub file_bytes: u64,
    /// Code and data bytes (DKM's "data amount").
    pub payload: u64,
    pub rx: u64,
    pub rw: u64,
    pub implements: Vec<meta::Implements>,
    pub requires: Vec<Interface>,
    /// Modules this one needs (interfaces it requires, symbols it links to).
    pub deps: Vec<String>,
    /// Modules it links against by symbol (a swap must not pull these).
    pub symbol_deps: Vec<String>,
    /// Loaded as another module's dependency, not asked for by name.
    pub auto: bool,
    pub exports: BTreeMap<String, u64>,
    pub loaded_at: u64,
}

#[derive(Debug, Clone)]
pub struct Loaded {
    pub id: u32,
    pub addr: u64,
    pub bytes: u64,
    pub rec: Record,
}

/// Per-stage times of one module's load, in microseconds (Table 1).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stages {
    pub check: f64,
    pub deps: f64,
    pub prelink: f64,
    pub alloc: f64,
    pub link: f64,
    pub load: f64,
    pub register: f64,
    pub other: f64,
    pub total: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadedReport {
    pub name: String,
    pub id: u32,
    pub auto: bool,
    pub payload: u64,
    pub rx: u64,
    pub rw: u64,
    pub stages: Stages,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub modules: Vec<LoadedReport>,
    pub evicted: Vec<String>,
    pub replaced: Option<String>,
    pub total_us: f64,
    pub log: Vec<String>,
}

pub fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// The loaded modules whose records this server can read. A record it
/// cannot read (another bunkai version's, or a client's that is JSON but not
/// a record) is left out here, and named by `unreadable_records`: one odd
/// module never stops `list`, `load` or `unload` of the others (the host
/// itself checks names, dependencies and code of every module).
pub fn loaded_modules(st: &crate::proto::HostState) -> Result<Vec<Loaded>> {
    Ok(read_records(st).0)
}

/// The modules whose records cannot be read: (id, why).
pub fn unreadable_records(st: &crate::proto::HostState) -> Vec<(u32, String)> {
    read_records(st).1
}

fn read_records(st: &crate::proto::HostState) -> (Vec<Loaded>, Vec<(u32, String)>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (id, addr, bytes, blob) in &st.modules {
        match serde_json::from_slice::<Record>(blob) {
            Ok(rec) => good.push(Loaded { id: *id, addr: *addr, bytes: *bytes, rec }),
            Err(e) => bad.push((*id, format!("{e}"))),
        }
    }
    (good, bad)
}

/// The loaded module providing `iface`, leaving out the one a swap removes.
fn loaded_provider<'a>(loaded: &'a [Loaded], replacing: Option<&Loaded>, iface: &str) -> Option<&'a Loaded> {
    loaded
        .iter()
        .find(|l| replacing.map_or(true, |r| r.id != l.id) && l.rec.implements.iter().any(|i| i.iface.name == iface))
}

/// A module file read and its metadata parsed.
struct Candidate {
    path: PathBuf,
    bytes: Vec<u8>,
    meta: Meta,
    auto: bool,
}

fn read_candidate(path: &Path, auto: bool) -> Result<Candidate> {
    let bytes = link::read(path)?;
    let meta = {
        let m = Module::parse(&bytes).with_context(|| format!("{}", path.display()))?;
        let data = m.meta_bytes().with_context(|| {
            format!(
                "{} has no {} section (declare BUNKAI_MODULE(name, version) from bunkai_mod.h in it)",
                path.display(),
                meta::SECTION
            )
        })?;
        meta::parse(data).with_context(|| format!("{}", path.display()))?
    };
    Ok(Candidate { path: path.to_path_buf(), bytes, meta, auto })
}

/// Module files in the search directories, by interface they implement.
fn search(dirs: &[PathBuf]) -> Vec<(PathBuf, Meta)> {
    let mut out = Vec::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else { continue };
        let mut files: Vec<PathBuf> =
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().map_or(false, |e| e == "o")).collect();
        files.sort();
        for f in files {
            if let Ok(c) = read_candidate(&f, true) {
                out.push((f, c.meta));
            }
        }
    }
    out
}

/// Stage 1: interfaces. `replacing` is the module a swap takes out.
fn check_interfaces(
    c: &Candidate,
    expects: &[(String, String)],
    loaded: &[Loaded],
    replacing: Option<&Loaded>,
    module_functions: &[String],
) -> Result<()> {
    for imp in &c.meta.implements {
        for s in &imp.symbols {
            if !module_functions.contains(s) {
                bail!("{}: implements {} with {s}, which the module does not define", c.meta.name, imp.iface.name);
            }
        }
        if let Some((_, text)) = expects.iter().find(|(n, _)| *n == imp.iface.name) {
            let host = meta::interface(&imp.iface.name, text);
            if host.hash != imp.iface.hash {
                bail!(
                    "{}: {} (module hash {}, host {})",
                    c.meta.name,
                    meta::explain_mismatch(&imp.iface.name, &imp.iface.text, &host.text, "the host"),
                    imp.iface.hash,
                    host.hash
                );
            }
        }
        for l in loaded {
            if replacing.map_or(false, |r| r.id == l.id) {
                continue;
            }
            if let Some(req) = l.rec.requires.iter().find(|r| r.name == imp.iface.name) {
                if req.hash != imp.iface.hash {
                    bail!(
                        "{}: {}",
                        c.meta.name,
                        meta::explain_mismatch(&imp.iface.name, &imp.iface.text, &req.text, &format!("module {}", l.rec.name))
                    );
                }
            }
        }
    }
    Ok(())
}

/// Stage 2: the load order, dependencies first; cycles and missing
/// providers are errors before anything is loaded.
fn plan(
    root: Candidate,
    loaded: &[Loaded],
    dirs: &[PathBuf],
    replacing: Option<&Loaded>,
    log: &mut Vec<String>,
) -> Result<Vec<Candidate>> {
    let mut found: Option<Vec<(PathBuf, Meta)>> = None;
    let mut order: Vec<Candidate> = Vec::new();
    let mut stack: Vec<String> = Vec::new();

    fn visit(
        c: Candidate,
        loaded: &[Loaded],
        dirs: &[PathBuf],
        replacing: Option<&Loaded>,
        found: &mut Option<Vec<(PathBuf, Meta)>>,
        order: &mut Vec<Candidate>,
        stack: &mut Vec<String>,
        log: &mut Vec<String>,
    ) -> Result<()> {
        if stack.contains(&c.meta.name) {
            stack.push(c.meta.name.clone());
            bail!("dependency cycle: {}", stack.join(" -> "));
        }
        stack.push(c.meta.name.clone());
        for req in c.meta.requires.clone() {
            if let Some(l) = loaded_provider(loaded, replacing, &req.name) {
                let i = l.rec.implements.iter().find(|i| i.iface.name == req.name).unwrap();
                if i.iface.hash != req.hash {
                    bail!(
                        "{}: {}",
                        c.meta.name,
                        meta::explain_mismatch(&req.name, &req.text, &i.iface.text, &format!("loaded module {}", l.rec.name))
                    );
                }
                log.push(format!("{} requires {}: provided by loaded module {}", c.meta.name, req.name, l.rec.name));
                continue;
            }
            if order.iter().any(|o| o.meta.implements.iter().any(|i| i.iface.name == req.name && i.iface.hash == req.hash)) {
                continue;
            }
            let cands = found.get_or_insert_with(|| search(dirs));
            let hit = cands
                .iter()
                .find(|(_, m)| m.implements.iter().any(|i| i.iface.name == req.name && i.iface.hash == req.hash))
                .map(|(p, _)| p.clone());
            let Some(path) = hit else {
                let near = cands.iter().find(|(_, m)| m.implements.iter().any(|i| i.iface.name == req.name));
                let dirs_s: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                match near {
                    Some((p, _)) => bail!(
                        "{} requires interface {} (hash {}), but {} implements a different version of it",
                        c.meta.name,
                        req.name,
                        req.hash,
                        p.display()
                    ),
                    None if dirs_s.is_empty() => bail!(
                        "{} requires interface {}, which no loaded module implements (load one that does first, or give -L DIR where one is)",
                        c.meta.name,
                        req.name
                    ),
                    None => bail!(
                        "{} requires interface {}, which no loaded module implements and no module in {} provides (give -L DIR where one is)",
                        c.meta.name,
                        req.name,
                        dirs_s.join(", ")
                    ),
                }
            };
            log.push(format!("{} requires {}: loading {} first", c.meta.name, req.name, path.display()));
            let dep = read_candidate(&path, true)?;
            if loaded.iter().any(|l| l.rec.name == dep.meta.name) {
                bail!("{} provides {} but a module named {} is already loaded", path.display(), req.name, dep.meta.name);
            }
            visit(dep, loaded, dirs, replacing, found, order, stack, log)?;
        }
        stack.pop();
        order.push(c);
        Ok(())
    }
    visit(root, loaded, dirs, replacing, &mut found, &mut order, &mut stack, log)?;
    Ok(order)
}

fn page(n: u64) -> u64 {
    n.max(1).div_ceil(4096) * 4096
}

pub struct LoadOptions<'a> {
    pub file: &'a Path,
    pub dirs: Vec<PathBuf>,
    /// Swap: the loaded module the new one replaces.
    pub replace: Option<&'a str>,
    /// Copy the images through the socket (WRITE) instead of passing the
    /// host a memfd to map (MAP): the fallback path, for comparison.
    pub copy: bool,
}

pub fn load(host: &mut Host, o: &LoadOptions) -> Result<LoadReport> {
    let t_all = Instant::now();
    let mut log = Vec::new();
    let t_other = Instant::now();
    let st = host.hello()?;
    let loaded = loaded_modules(&st)?;
    let other_hello = us(t_other);

    // 1-2. Interface checks and the dependency plan.
    let t = Instant::now();
    let root = read_candidate(o.file, false)?;
    let replacing = swapped_out(&root, &loaded, o.replace)?;
    check_name_free(&root, &loaded, replacing, o.file)?;
    let check_root_t = us(t);
    let t = Instant::now();
    let order = plan(root, &loaded, &o.dirs, replacing, &mut log)?;
    let deps_t = us(t);
    let t = Instant::now();
    let parsed = check_plan(&order, &st.expects, &loaded, replacing, &mut log)?;
    let check_t = check_root_t + us(t);

    // 3. Pre-link: sizes from the headers.
    let prelinked = prelink(parsed)?;

    // Memory pressure: unneeded modules go first, as DKM's server does.
    let evicted = make_room(host, &st, &prelinked, &loaded, replacing, &order, &mut log)?;

    // 4-6. Allocation, link, load, module by module (dependencies first).
    let staged = stage(host, o.copy, &order, &prelinked, &loaded, replacing, &mut log)?;

    // 7. Registration, in dependency order.
    let mut reports = register(host, &order, staged, replacing, &mut log)?;
    let total = us(t_all);
    charge_totals(&mut reports, check_t, deps_t, total);
    log.push(format!("HELLO took {other_hello:.0} us"));
    Ok(LoadReport {
        modules: reports,
        evicted,
        replaced: replacing.map(|r| r.rec.name.clone()),
        total_us: total,
        log,
    })
}

/// The loaded module a swap replaces (None when `replace` is): it must be
/// loaded, the new module must implement every interface it provides, and
/// no module may link against its symbols.
fn swapped_out<'a>(root: &Candidate, loaded: &'a [Loaded], replace: Option<&str>) -> Result<Option<&'a Loaded>> {
    let Some(name) = replace else { return Ok(None) };
    let l = loaded
        .iter()
        .find(|l| l.rec.name == name)
        .with_context(|| format!("no module named {name} is loaded (see bunkai mod list)"))?;
    for imp in &l.rec.implements {
        if !root.meta.implements.iter().any(|i| i.iface.name == imp.iface.name) {
            bail!("{} does not implement {}, which {name} provides: it cannot replace it", root.meta.name, imp.iface.name);
        }
    }
    let users: Vec<&str> =
        loaded.iter().filter(|x| x.rec.symbol_deps.iter().any(|d| d == name)).map(|x| x.rec.name.as_str()).collect();
    if !users.is_empty() {
        bail!("{} link against {name}'s symbols directly; unload them before swapping {name}", users.join(", "));
    }
    Ok(Some(l))
}

/// A loaded module may have the new module's name only if the swap
/// replaces it.
fn check_name_free(root: &Candidate, loaded: &[Loaded], replacing: Option<&Loaded>, file: &Path) -> Result<()> {
    if let Some(l) = loaded.iter().find(|l| l.rec.name == root.meta.name) {
        if replacing.map_or(true, |r| r.id != l.id) {
            bail!("a module named {} is already loaded (unload it, or bunkai mod swap {} {})", l.rec.name, l.rec.name, file.display());
        }
    }
    Ok(())
}

/// Every module of the plan is checked before anything happens: parsed,
/// and its interfaces checked (stage 1).
fn check_plan<'d>(
    order: &'d [Candidate],
    expects: &[(String, String)],
    loaded: &[Loaded],
    replacing: Option<&Loaded>,
    log: &mut Vec<String>,
) -> Result<Vec<Module<'d>>> {
    let mut parsed = Vec::new();
    for c in order {
        let m = Module::parse(&c.bytes).with_context(|| format!("{}", c.path.display()))?;
        check_interfaces(c, expects, loaded, replacing, &m.defined_functions())?;
        if c.meta.implements.is_empty() && c.meta.requires.is_empty() {
            log.push(format!("{}: implements no interface (only its symbols can be used)", c.meta.name));
        }
        parsed.push(m);
    }
    Ok(parsed)
}

/// A module of the plan parsed and pre-linked, with the pre-link's time.
struct Prelinked<'d> {
    module: Module<'d>,
    layout: link::Layout,
    prelink_us: f64,
}

/// Stage 3: pre-link, sizes from the headers.
fn prelink(parsed: Vec<Module<'_>>) -> Result<Vec<Prelinked<'_>>> {
    let mut out = Vec::new();
    for module in parsed {
        let t = Instant::now();
        let layout = module.prelink()?;
        out.push(Prelinked { module, layout, prelink_us: us(t) });
    }
    Ok(out)
}

/// Memory pressure: when the plan does not fit in the host's budget,
/// unneeded modules (loaded as dependencies, needed by no module loaded or
/// planned; the oldest first) are unloaded, as DKM's server does. Returns
/// their names; an error if even that does not make room.
fn make_room(
    host: &mut Host,
    st: &crate::proto::HostState,
    prelinked: &[Prelinked],
    loaded: &[Loaded],
    replacing: Option<&Loaded>,
    order: &[Candidate],
    log: &mut Vec<String>,
) -> Result<Vec<String>> {
    let need: u64 = prelinked.iter().map(|p| page(p.layout.rx_size) + page(p.layout.rw_size)).sum();
    let mut evicted = Vec::new();
    if st.budget > 0 && st.used + need > st.budget {
        let mut free = st.budget.saturating_sub(st.used);
        let mut cands: Vec<&Loaded> = loaded
            .iter()
            .filter(|l| l.rec.auto && replacing.map_or(true, |r| r.id != l.id))
            .filter(|l| !loaded.iter().any(|x| x.rec.deps.contains(&l.rec.name)))
            .filter(|l| !order.iter().any(|c| c.meta.requires.iter().any(|r| l.rec.implements.iter().any(|i| i.iface.name == r.name))))
            .collect();
        cands.sort_by_key(|l| l.rec.loaded_at);
        for l in cands {
            if free >= need {
                break;
            }
            host.evict(l.id)?;
            free += l.bytes;
            evicted.push(l.rec.name.clone());
            log.push(format!("host short of memory: unloading unneeded module {} ({} bytes)", l.rec.name, l.bytes));
        }
        if free < need {
            bail!(
                "the host is out of module memory: {} of {} bytes in use, {need} needed{} (unload modules or raise the host's budget)",
                st.used,
                st.budget,
                if evicted.is_empty() { String::new() } else { format!(" even after unloading {}", evicted.join(", ")) }
            );
        }
    }
    Ok(evicted)
}

/// A module linked and its image in the host's memory, waiting to be
/// registered.
struct Staged {
    rec: Record,
    symbols: link::Symbols,
    stages: Stages,
    rx: u64,
    rw: u64,
}

/// Stages 4-6: allocation, link, load, module by module (dependencies
/// first); each module links against the loaded modules' exports and those
/// of the modules staged before it.
fn stage(
    host: &mut Host,
    copy: bool,
    order: &[Candidate],
    prelinked: &[Prelinked],
    loaded: &[Loaded],
    replacing: Option<&Loaded>,
    log: &mut Vec<String>,
) -> Result<Vec<Staged>> {
    let mut staged = Vec::new();
    let mut exports = loaded_exports(loaded, replacing);
    for (k, (c, p)) in order.iter().zip(prelinked).enumerate() {
        let (m, lay) = (&p.module, &p.layout);
        let mut s = Stages { prelink: p.prelink_us, ..Default::default() };
        let t = Instant::now();
        let (at, mut mem) = allocate(host, &c.meta.name, lay, copy, log)?;
        s.alloc = us(t);
        let t = Instant::now();
        let (resolve, symbol_deps) = resolve_undefined(host, m, &exports)?;
        let (symbols, copy_img) = link_image(m, lay, &at, &resolve, &mut mem).with_context(|| format!("{}", c.path.display()))?;
        s.link = us(t);
        let t = Instant::now();
        load_image(host, &c.meta.name, lay, &at, mem, copy_img, log)?;
        s.load = us(t);
        let deps = module_deps(c, &order[..k], loaded, replacing, &symbol_deps);
        let exp = publish_exports(&symbols, &c.meta.name, &mut exports);
        let rec = record(c, lay, deps, symbol_deps, exp);
        staged.push(Staged { rec, symbols, stages: s, rx: at.rx, rw: at.rw });
    }
    Ok(staged)
}

/// The loaded modules' exports (but the one a swap removes): name ->
/// (address, module).
fn loaded_exports(loaded: &[Loaded], replacing: Option<&Loaded>) -> HashMap<String, (u64, String)> {
    let mut exports = HashMap::new();
    for l in loaded {
        if replacing.map_or(false, |r| r.id == l.id) {
            continue;
        }
        for (n, a) in &l.rec.exports {
            exports.insert(n.clone(), (*a, l.rec.name.clone()));
        }
    }
    exports
}

/// Where the host put a module: its RX and RW parts, the host's RX part's
/// size (rw - rx bytes), and the bytes of the memfd image (the RX part, then
/// the RW part's data; the bss after it stays anonymous in the host).
struct Placement {
    rx: u64,
    rw: u64,
    rx_part: usize,
    file_len: usize,
}

/// Stage 4: the host's memory for the module, and the memfd its image is
/// linked into (none with `copy`, or if it cannot be made: the images then
/// go through the socket).
fn allocate(
    host: &mut Host,
    name: &str,
    lay: &link::Layout,
    copy: bool,
    log: &mut Vec<String>,
) -> Result<(Placement, Option<crate::memfd::MemImage>)> {
    let (rx, rw, _) = host.alloc(lay.rx_size, lay.rw_size)?;
    let rx_part = (rw - rx) as usize;
    let file_len = rx_part + if lay.rw_image_size() > 0 { page(lay.rw_image_size()) as usize } else { 0 };
    let mut mem = None;
    if !copy && file_len > 0 {
        match crate::memfd::MemImage::new(name, file_len, file_len) {
            Ok(m) => mem = Some(m),
            Err(e) => log.push(format!("{name}: no zero-copy load ({e:#}): copying through the socket")),
        }
    }
    Ok((Placement { rx, rw, rx_part, file_len }, mem))
}

/// The addresses of the module's undefined names: from the exports of the
/// modules before it, else from the host. Also the modules those exports
/// come from (the module's symbol dependencies).
fn resolve_undefined(
    host: &mut Host,
    m: &Module,
    exports: &HashMap<String, (u64, String)>,
) -> Result<(HashMap<String, u64>, Vec<String>)> {
    let mut resolve = HashMap::new();
    let mut symbol_deps = Vec::new();
    let mut ask = Vec::new();
    for (name, _) in m.undefined() {
        match exports.get(&name) {
            Some((a, owner)) => {
                resolve.insert(name, *a);
                if !symbol_deps.contains(owner) {
                    symbol_deps.push(owner.clone());
                }
            }
            None => ask.push(name),
        }
    }
    if !ask.is_empty() {
        for (n, a) in ask.iter().zip(host.resolve(&ask)?) {
            resolve.insert(n.clone(), a);
        }
    }
    Ok((resolve, symbol_deps))
}

/// The RX and RW images to copy through the socket, when the module is
/// not linked into a memfd.
type CopyImages = Option<(Vec<u8>, Vec<u8>)>;

/// Stage 5: the link, into the memfd if there is one, else into images to
/// copy. Returns the module's defined symbols.
fn link_image(
    m: &Module,
    lay: &link::Layout,
    at: &Placement,
    resolve: &HashMap<String, u64>,
    mem: &mut Option<crate::memfd::MemImage>,
) -> Result<(link::Symbols, CopyImages)> {
    match mem {
        Some(mi) => {
            let (rx_img, rw_img) = mi.split(at.rx_part);
            m.link_into(lay, at.rx, at.rw, resolve, rx_img, rw_img).map(|sy| (sy, None))
        }
        None => m.link(lay, at.rx, at.rw, resolve).map(|img| (img.symbols, Some((img.rx, img.rw)))),
    }
}

/// Stage 6, load: the host maps the memfd over the staged memory, or (no
/// memfd, or the host could not map it) the images go through the socket
/// and the RX part is then made r-x.
fn load_image(
    host: &mut Host,
    name: &str,
    lay: &link::Layout,
    at: &Placement,
    mut mem: Option<crate::memfd::MemImage>,
    copy_img: CopyImages,
    log: &mut Vec<String>,
) -> Result<()> {
    // The memfd is sealed before it goes: our writable mapping is
    // unmapped first, so nobody can change the code once the host has it.
    let mapped = match &mut mem {
        Some(mi) => match mi.seal() {
            Err(e) => {
                log.push(format!("{name}: {e:#}: copying through the socket"));
                false
            }
            Ok(()) => match host.map(at.rx, at.file_len as u64, mi.fd()) {
                Ok(_) => true,
                Err(e) => {
                    log.push(format!("{name}: the host could not map the image ({e:#}): copying through the socket"));
                    false
                }
            },
        },
        None => false,
    };
    let read_back = match (&mem, mapped) {
        (Some(mi), false) => Some(mi.contents()?),
        _ => None,
    };
    if !mapped {
        let (rx_b, rw_b): (&[u8], &[u8]) = match (&read_back, &copy_img) {
            (Some(a), _) => (&a[..lay.rx_size as usize], &a[at.rx_part..at.rx_part + lay.rw_image_size() as usize]),
            (None, Some((x, w))) => (x, w),
            (None, None) => (&[], &[]),
        };
        if !rx_b.is_empty() {
            host.write(at.rx, rx_b)?;
        }
        if !rw_b.is_empty() {
            host.write(at.rw, rw_b)?;
        }
        host.protect(at.rx)?;
    }
    drop(mem);
    Ok(())
}

/// The modules one needs: those it links against by symbol, then the
/// providers of the interfaces it requires (loaded, or `earlier` in the
/// plan).
fn module_deps(
    c: &Candidate,
    earlier: &[Candidate],
    loaded: &[Loaded],
    replacing: Option<&Loaded>,
    symbol_deps: &[String],
) -> Vec<String> {
    let mut deps: Vec<String> = symbol_deps.to_vec();
    for req in &c.meta.requires {
        let from_loaded = loaded_provider(loaded, replacing, &req.name);
        let from_plan = earlier.iter().find(|o| o.meta.implements.iter().any(|i| i.iface.name == req.name));
        if let Some(n) = from_loaded.map(|l| l.rec.name.clone()).or(from_plan.map(|o| o.meta.name.clone())) {
            if !deps.contains(&n) {
                deps.push(n);
            }
        }
    }
    deps
}

/// The module's global symbols, added to `exports` for the modules after
/// it.
fn publish_exports(symbols: &link::Symbols, owner: &str, exports: &mut HashMap<String, (u64, String)>) -> BTreeMap<String, u64> {
    let mut exp = BTreeMap::new();
    for (n, (a, global)) in symbols {
        if *global {
            exp.insert(n.clone(), *a);
            exports.insert(n.clone(), (*a, owner.to_string()));
        }
    }
    exp
}

/// The record the host keeps for the module.
fn record(c: &Candidate, lay: &link::Layout, deps: Vec<String>, symbol_deps: Vec<String>, exports: BTreeMap<String, u64>) -> Record {
    Record {
        name: c.meta.name.clone(),
        version: c.meta.version.clone(),
        file: c.path.canonicalize().unwrap_or(c.path.clone()).display().to_string(),
        file_bytes: c.bytes.len() as u64,
        payload: lay.payload,
        rx: lay.rx_size,
        rw: lay.rw_size,
        implements: c.meta.implements.clone(),
        requires: c.meta.requires.clone(),
        deps,
        symbol_deps,
        auto: c.auto,
        exports,
        loaded_at: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    }
}

/// Stage 7: registration, in dependency order (the last module replaces
/// the swapped one); a failure unloads what this load registered, and
/// dropping the connection frees the rest.
fn register(
    host: &mut Host,
    order: &[Candidate],
    staged: Vec<Staged>,
    replacing: Option<&Loaded>,
    log: &mut Vec<String>,
) -> Result<Vec<LoadedReport>> {
    let mut done: Vec<(u32, String)> = Vec::new();
    let mut reports = Vec::new();
    let n_mod = staged.len();
    for (k, Staged { rec, symbols, stages: mut s, rx, rw }) in staged.into_iter().enumerate() {
        let t = Instant::now();
        let replace_id = if k + 1 == n_mod { replacing.map_or(0, |r| r.id) } else { 0 };
        let body = commit_body(&order[k], &rec, &symbols, replace_id, rx, rw)?;
        let reply = host.call(Msg::Commit, &body);
        let b = match reply {
            Ok(b) => b,
            Err(e) => {
                for (id, name) in done.iter().rev() {
                    let _ = host.unload(*id);
                    log.push(format!("rolled back {name}"));
                }
                return Err(e.context(format!("registering {}", rec.name)));
            }
        };
        let mut r = crate::proto::In::new(&b);
        let id = r.u32()?;
        s.register = us(t);
        done.push((id, rec.name.clone()));
        reports.push(LoadedReport { name: rec.name.clone(), id, auto: rec.auto, payload: rec.payload, rx: rec.rx, rw: rec.rw, stages: s });
    }
    Ok(reports)
}

/// The COMMIT message for one module: the module it replaces (0: none),
/// its record, memory, init and exit, the functions of each interface it
/// implements, and its dependencies.
fn commit_body(c: &Candidate, rec: &Record, symbols: &link::Symbols, replace_id: u32, rx: u64, rw: u64) -> Result<Out> {
    let sym = |n: &str| -> Result<u64> {
        symbols.get(n).map(|(a, _)| *a).with_context(|| format!("{}: symbol {n} is not defined", rec.name))
    };
    let init = c.meta.init.as_deref().map(sym).transpose()?.unwrap_or(0);
    let exit = c.meta.exit.as_deref().map(sym).transpose()?.unwrap_or(0);
    let mut body = Out::default();
    body.u32(replace_id).bytes(&serde_json::to_vec(rec)?).u64(rx).u64(rw).u64(init).u64(exit);
    body.u32(rec.implements.len() as u32);
    for imp in &rec.implements {
        body.str(&imp.iface.name).u32(imp.symbols.len() as u32);
        let names = meta::prototypes(&imp.iface.text);
        for (j, s) in imp.symbols.iter().enumerate() {
            body.str(names.get(j).map(|(n, _)| n.as_str()).unwrap_or(s)).u64(sym(s)?);
        }
    }
    body.str(&rec.name).u32(rec.deps.len() as u32);
    for d in &rec.deps {
        body.str(d);
    }
    Ok(body)
}

/// The checks and the dependency walk are charged to the module asked for
/// (the last one); "other" is the rest of the wall time: connecting, HELLO,
/// reading the files. Dependencies' totals are their own stages.
fn charge_totals(reports: &mut [LoadedReport], check_t: f64, deps_t: f64, total: f64) {
    let n = reports.len();
    let mut deps_sum = 0.0;
    for (k, r) in reports.iter_mut().enumerate() {
        let st = &mut r.stages;
        if k + 1 == n {
            st.check = check_t;
            st.deps = deps_t;
        }
        let sum = st.check + st.deps + st.prelink + st.alloc + st.link + st.load + st.register;
        if k + 1 == n {
            st.other = (total - deps_sum - sum).max(0.0);
            st.total = total - deps_sum;
        } else {
            st.total = sum;
            deps_sum += sum;
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct UnloadReport {
    pub unloaded: Vec<(String, f64)>,
    pub total_us: f64,
}

pub fn unload(host: &mut Host, name: &str, cascade: bool) -> Result<UnloadReport> {
    let t_all = Instant::now();
    // One module: the host checks that nothing needs it and unloads it, in
    // one round trip. A cascade needs the whole picture (HELLO) first.
    if !cascade {
        return match host.unload_name(name)? {
            crate::proto::UnloadByName::Unloaded { .. } => {
                let t = us(t_all);
                Ok(UnloadReport { unloaded: vec![(name.to_string(), t)], total_us: t })
            }
            crate::proto::UnloadByName::NotLoaded => bail!("no module named {name} is loaded (see bunkai mod list)"),
            crate::proto::UnloadByName::NeededBy(users) => {
                bail!("{name} is needed by {} (unload them first, or use --cascade)", users.join(", "))
            }
        };
    }
    let st = host.hello()?;
    let loaded = loaded_modules(&st)?;
    if !loaded.iter().any(|l| l.rec.name == name) {
        bail!("no module named {name} is loaded (see bunkai mod list)");
    }
    // Dependents first, deepest first.
    let mut order: Vec<String> = Vec::new();
    fn collect(name: &str, loaded: &[Loaded], order: &mut Vec<String>, seen: &mut HashSet<String>) {
        if !seen.insert(name.to_string()) {
            return;
        }
        for l in loaded.iter().filter(|l| l.rec.deps.iter().any(|d| d == name)) {
            collect(&l.rec.name, loaded, order, seen);
        }
        order.push(name.to_string());
    }
    collect(name, &loaded, &mut order, &mut HashSet::new());
    let mut out = Vec::new();
    for n in order {
        let l = loaded.iter().find(|l| l.rec.name == n).unwrap();
        let t = Instant::now();
        host.unload(l.id)?;
        out.push((n, us(t)));
    }
    Ok(UnloadReport { unloaded: out, total_us: us(t_all) })
}

/// Info about a module file without loading it.
#[derive(Debug, Clone, Serialize)]
pub struct FileInfo {
    pub file: String,
    pub meta: Meta,
    pub file_bytes: u64,
    pub payload: u64,
    pub rx: u64,
    pub rw: u64,
    pub undefined: Vec<String>,
}

pub fn file_info(path: &Path) -> Result<FileInfo> {
    let c = read_candidate(path, false)?;
    let m = Module::parse(&c.bytes)?;
    let lay = m.prelink()?;
    Ok(FileInfo {
        file: path.display().to_string(),
        meta: c.meta.clone(),
        file_bytes: c.bytes.len() as u64,
        payload: lay.payload,
        rx: lay.rx_size,
        rw: lay.rw_size,
        undefined: m.undefined().into_iter().map(|(n, _)| n).collect(),
    })
}
