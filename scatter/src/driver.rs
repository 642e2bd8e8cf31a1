//! `bunkai scatter`: the whole pipeline, from inputs to a finished output
//! directory. Everything is built in a temporary directory beside the output
//! and renamed into place at the end, so a failure leaves nothing behind.

use crate::check::{self, Scattered, PRIVATE_VERSION};
use crate::dso::{symbol_name, Dso};
use crate::linkflags::{self, LinkFlags};
use crate::lower::{self, Job};
use crate::layout::{self, MANIFEST};
use crate::manifest::{FunctionEntry, Globals, Kept, Manifest, Original, FORMAT};
use crate::stubs::{self, Stub};
use crate::timing::{Phase, Phases};
use crate::toolchain::{run, Toolchain};
use bunkai_common::files::file_size;
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, Clone)]
pub struct Options {
    pub out: PathBuf,
    pub lib: bool,
    pub name: Option<String>,
    pub verbose: bool,
    pub inputs: Vec<PathBuf>,
    pub flags: Vec<String>,
    pub jobs: usize,
    pub keep_temps: bool,
    pub progress: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum InputKind {
    C,
    Bitcode,
    IrText,
}

/// What scatter did, for the CLI to print.
pub struct Summary {
    pub manifest: Manifest,
    pub log: Vec<String>,
    /// How long each phase took, in the order they ended.
    pub phases: Vec<Phase>,
}

fn classify(p: &Path) -> Result<InputKind> {
    let bytes = std::fs::read(p)
        .with_context(|| format!("cannot read input {} (check the path)", p.display()))?;
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
    if bytes.starts_with(b"BC\xc0\xde") || bytes.starts_with(&[0xde, 0xc0, 0x17, 0x0b]) {
        return Ok(InputKind::Bitcode);
    }
    match ext {
        "c" | "i" => {
            if bytes.contains(&0) {
                bail!(
                    "{} is not C source: it contains NUL bytes (give .c, .bc or .ll files)",
                    p.display()
                );
            }
            Ok(InputKind::C)
        }
        "ll" => Ok(InputKind::IrText),
        "bc" => bail!(
            "{} is not LLVM bitcode: wrong magic number (give .c, .bc or .ll files)",
            p.display()
        ),
        _ => bail!(
            "{} is not C source or LLVM bitcode/IR (give .c, .bc or .ll files)",
            p.display()
        ),
    }
}

fn check_flags(flags: &[String]) -> Result<()> {
    for f in flags {
        let bad = match f.as_str() {
            "-o" => Some("bunkai scatter chooses the outputs; use -o before --"),
            "-c" | "-S" | "-E" | "-emit-llvm" => Some("scatter compiles and links itself"),
            "-shared" => Some("use --lib to scatter a shared library"),
            _ if f.starts_with("-flto") => Some("scatter reads whole-program bitcode; give the .bc instead"),
            _ => None,
        };
        if let Some(fix) = bad {
            bail!("flag {f} cannot be passed after -- ({fix})");
        }
    }
    Ok(())
}

/// The optimisation level in the flags, for code generation.
pub(crate) fn opt_level(flags: &[String]) -> &'static str {
    let mut level = "-O0";
    for f in flags {
        level = match f.as_str() {
            "-O0" => "-O0",
            // clang: -O is -O1, -Og is like -O1, -O4 and above are -O3.
            "-O1" | "-O" | "-Og" => "-O1",
            "-O2" | "-Os" | "-Oz" => "-O2",
            "-O3" | "-Ofast" => "-O3",
            _ if f.len() == 3 && f.starts_with("-O") && f.as_bytes()[2].is_ascii_digit() => "-O3",
            _ => level,
        };
    }
    level
}

pub fn scatter(opts: &Options) -> Result<Summary> {
    if opts.inputs.is_empty() {
        bail!("no inputs (give C sources, .bc or .ll files)");
    }
    check_flags(&opts.flags)?;
    let kinds: Vec<InputKind> = opts.inputs.iter().map(|p| classify(p)).collect::<Result<_>>()?;
    let name = program_name(opts)?;
    prepare_out(&opts.out)?;
    let tc = Toolchain::discover()?;
    let tmp = temp_root(&opts.out)?;
    let _cleanup = bunkai_common::files::remove_on_interrupt(tmp.path());
    let b = Build::new(opts, tc, name, tmp.path().to_path_buf())?;
    let ph = Phases::new(opts.progress);

    // 1. Bitcode per input, tagged with its source file.
    let tus = ph.run("compile to bitcode", "compiling to bitcode", || b.tagged_bitcode(&kinds))?;
    // 2-4. One module and the passes; the original (3), from the same
    // inputs and flags, beside the link: the passes need it (what the
    // original exports decides what they may hide: with --lib its
    // functions and data, in an executable its data, issue 23).
    // One bitcode or IR input (a whole program, as Vim's): clang optimises
    // it once, and the original is code-generated from that module, as a C
    // input's is from its step-1 bitcode. Building the original from the
    // input beside it ran the same -O2 pipeline twice, one on each core
    // (Vim: 120 s of CPU twice, issue 23).
    let (original, split) = if b.optimise_once(&tus) {
        let whole = ph.run("optimise", "optimising the whole program", || b.optimise_one(&tus[0]))?;
        let from = [Tu { tagged: whole.clone(), optimised: true }];
        let original = ph.run("original", "building the original from the optimised program", || b.original(&from))?;
        let split = ph.run("split", "splitting the program", || b.split(&whole, &original))?;
        (original, split)
    } else {
        std::thread::scope(|s| {
            let other = s.spawn(|| ph.quiet("original (beside link bitcode)", || b.original(&tus)));
            let joined = || other.join().map_err(|_| anyhow::anyhow!("building the original panicked"))?;
            let whole = ph.run("link bitcode", "linking the bitcode (and building the original)", || b.one_module(&tus, &kinds));
            let original = joined()?;
            let split = ph.run("split", "splitting the program", || b.split(&whole?, &original))?;
            Ok::<_, anyhow::Error>((original, split))
        })?
    };
    // 5-6. The launcher, beside the libraries; then the checks.
    let (launcher_rel, (empty_so, search)) = std::thread::scope(|s| {
        let other = s.spawn(|| ph.quiet("launcher (beside the libraries)", || b.launcher(&split)));
        let libs = b.libraries(&split.stubs, &ph);
        let launcher = other.join().map_err(|_| anyhow::anyhow!("linking the launcher panicked"))?;
        Ok::<_, anyhow::Error>((launcher?, libs?))
    })?;
    ph.run("check", "checking the libraries", || b.check(&split.stubs, &launcher_rel, &original, search))?;
    // 7. Names for the runtime's messages, the manifest, and into place.
    let manifest = ph.run("finish", "writing the manifest", || {
        b.keep_function_modules(&split.stubs)?;
        b.write_names(&split.stubs)?;
        b.soname_link(&launcher_rel)?;
        let manifest = b.manifest(&split, launcher_rel.clone(), &empty_so, original);
        manifest.write(&b.root)?;
        finish(tmp, &b.work, opts)?;
        Ok(manifest)
    })?;
    let log = decision_log(&manifest, &split.log_text);
    Ok(Summary { manifest, log, phases: ph.into_list() })
}

/// The program's name: --name, else the first input's stem (without a
/// leading "lib").
fn program_name(opts: &Options) -> Result<String> {
    let name = match &opts.name {
        Some(n) => n.clone(),
        None => opts.inputs[0]
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("a")
            .trim_start_matches("lib")
            .to_string(),
    };
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        bail!("bad program name {name:?} (give --name NAME)");
    }
    Ok(name)
}

/// The directory the output is built in, beside `out`, so that it can be
/// renamed into place.
fn temp_root(out: &Path) -> Result<tempfile::TempDir> {
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let outname = out.file_name().and_then(|s| s.to_str()).unwrap_or("out");
    tempfile::Builder::new()
        .prefix(&format!(".{outname}.bunkai-tmp-"))
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))
}

/// Step 7's end: the intermediate files removed (or kept, with
/// --keep-temps), and the finished directory moved to the output.
fn finish(tmp: tempfile::TempDir, work: &Path, opts: &Options) -> Result<()> {
    if opts.keep_temps {
        eprintln!("bunkai scatter: intermediate files kept in {}/work", opts.out.display());
    } else {
        std::fs::remove_dir_all(work)?;
    }
    let root = tmp.keep();
    install(&root, &opts.out)
}

/// What every step of one scatter works with.
struct Build<'a> {
    opts: &'a Options,
    tc: Toolchain,
    name: String,
    /// The output directory being built.
    root: PathBuf,
    /// root/work: intermediate files.
    work: PathBuf,
    /// work/split: the split pass's outputs.
    split: PathBuf,
    /// lib/NAME, where the libraries go, relative to root.
    libdir_rel: String,
    /// The user's flags, and -fPIC for a library.
    cflags: Vec<String>,
    /// The user's link flags, split between the launcher and the libraries.
    link: LinkFlags,
    quiet: String,
    /// The optimisation level in the user's flags.
    level: &'static str,
}

/// Whether the C library a link with `tc` uses reads packed relative
/// relocations (DT_RELR): glibc 2.36 and later define the version
/// GLIBC_ABI_DT_RELR for it.
fn libc_reads_relr(tc: &Toolchain) -> bool {
    let Ok((path, _)) = crate::toolchain::output(Command::new(&tc.clang).arg("-print-file-name=libc.so.6")) else {
        return false;
    };
    let path = Path::new(path.trim());
    path.is_absolute()
        && Dso::read(path).map_or(false, |d| d.versions.iter().any(|v| v.split(' ').next() == Some("GLIBC_ABI_DT_RELR")))
}

/// What the split pass left (step 3).
struct Split {
    launcher_bc: PathBuf,
    stubs: Vec<Stub>,
    exports: Vec<String>,
    imports: Vec<(String, char)>,
    log_text: String,
}

/// One input's bitcode (step 1), tagged with its source; whether it has
/// been through clang's optimisation pipeline here (compiled from C, or the
/// one bitcode input's optimise_one), so that the original is
/// code-generated from it.
struct Tu {
    tagged: PathBuf,
    optimised: bool,
}

/// `f` over `items`, `workers` at a time, results in the items' order; the
/// first error in that order is the result. After an error no new item is
/// started.
fn par_map<T: Sync, R: Send>(items: &[T], workers: usize, f: impl Fn(usize, &T) -> Result<R> + Sync) -> Result<Vec<R>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let slots: Vec<std::sync::Mutex<Option<Result<R>>>> = items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() || failed.load(Ordering::Relaxed) {
                    break;
                }
                let r = f(i, &items[i]);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                *slots[i].lock().unwrap() = Some(r);
            });
        }
    });
    let mut out = Vec::with_capacity(items.len());
    for slot in slots {
        match slot.into_inner().unwrap() {
            Some(r) => out.push(r?),
            // Not started because an earlier item failed: that error is
            // in an earlier slot, or a later one that failed first.
            None => continue,
        }
    }
    if out.len() < items.len() {
        bail!("internal error: an item failed without an error");
    }
    Ok(out)
}

/// The original program (step 6): where it is in the output, and its
/// unstripped build.
struct OriginalBuild {
    rel: String,
    unstripped: PathBuf,
}

impl<'a> Build<'a> {
    /// The output directory's skeleton in `root`, and the flags.
    fn new(opts: &'a Options, tc: Toolchain, name: String, root: PathBuf) -> Result<Build<'a>> {
        let work = root.join("work");
        let split = work.join("split");
        std::fs::create_dir_all(&split)?;
        let libdir_rel = format!("lib/{name}");
        std::fs::create_dir_all(root.join(&libdir_rel))?;
        std::fs::create_dir_all(root.join("original"))?;

        let mut cflags: Vec<String> = opts.flags.clone();
        if opts.lib && !cflags.iter().any(|f| f == "-fPIC" || f == "-fpic") {
            cflags.push("-fPIC".into());
        }
        let quiet = "-Wno-unused-command-line-argument".to_string();
        let level = opt_level(&opts.flags);
        let link = linkflags::split(&opts.flags);
        Ok(Build { opts, tc, name, root, work, split, libdir_rel, cflags, quiet, level, link })
    }

    /// Step 1: bitcode per input (C compiled with the user's flags),
    /// tagged with its source file; the inputs side by side, `-j` at a
    /// time. clang tags C itself, with the pass plugin loaded
    /// (`-fpass-plugin`: the tag is the optimisation pipeline's last
    /// pass); bitcode and IR inputs go through opt.
    fn tagged_bitcode(&self, kinds: &[InputKind]) -> Result<Vec<Tu>> {
        let tc = &self.tc;
        let inputs: Vec<(&PathBuf, &InputKind)> = self.opts.inputs.iter().zip(kinds).collect();
        par_map(&inputs, self.opts.jobs, |i, (input, kind)| {
            let tagged = self.work.join(format!("tu{i}.bc"));
            if **kind == InputKind::C {
                run(
                    Command::new(&tc.clang)
                        .args(["-c", "-emit-llvm"])
                        .arg(format!("-fpass-plugin={}", tc.plugin().display()))
                        .args(&self.cflags)
                        .arg(&self.quiet)
                        .arg("-o")
                        .arg(&tagged)
                        .arg(input),
                    &format!("compiling {}", input.display()),
                )
                .map_err(|e| {
                    anyhow::anyhow!("{e:#}; {} does not compile (fix the errors above)", input.display())
                })?;
                return Ok(Tu { tagged, optimised: true });
            }
            run(
                Command::new(&tc.opt)
                    .arg(format!("-load-pass-plugin={}", tc.plugin().display()))
                    .arg("-passes=bunkai-tag-source")
                    .arg(input)
                    .arg("-o")
                    .arg(&tagged),
                &format!("reading {}", input.display()),
            )
            .map_err(|e| anyhow::anyhow!("{e:#}; {} is not valid LLVM IR (regenerate it with clang-14)", input.display()))?;
            Ok(Tu { tagged, optimised: false })
        })
    }

    /// Step 2 for several inputs, or one at -O0 (one bitcode or IR input
    /// otherwise goes through optimise_one): one module, work/whole.bc.
    /// Bitcode inputs are usually LTO
    /// pre-link IR: the original built from them gets a whole-program
    /// optimisation at link time, so the scattered program gets the same
    /// pipeline before it is split. C inputs were optimised per
    /// translation unit in step 1, exactly like the original.
    fn one_module(&self, tus: &[Tu], kinds: &[InputKind]) -> Result<PathBuf> {
        let whole = self.work.join("whole.bc");
        if tus.len() == 1 {
            std::fs::copy(&tus[0].tagged, &whole)?;
        } else {
            run(
                Command::new(&self.tc.llvm_link).args(tus.iter().map(|t| &t.tagged)).arg("-o").arg(&whole),
                "linking the bitcode",
            )?;
        }
        if kinds.iter().any(|k| *k != InputKind::C) && self.level != "-O0" {
            let optimized = self.work.join("whole.opt.bc");
            run(
                Command::new(&self.tc.opt)
                    .arg(format!("-passes=default<O{}>", &self.level[2..]))
                    .arg(&whole)
                    .arg("-o")
                    .arg(&optimized),
                "optimising the whole program",
            )?;
            std::fs::rename(&optimized, &whole)?;
        }
        Ok(whole)
    }

    /// Whether step 2 is clang's optimisation of the one input, the original
    /// then code-generated from its result: one bitcode or IR input and an
    /// optimisation level (check_flags has refused the flags that would
    /// change what `clang -c` emits: -flto, -emit-llvm, -S, -c).
    fn optimise_once(&self, tus: &[Tu]) -> bool {
        tus.len() == 1 && !tus[0].optimised && self.level != "-O0"
    }

    /// Step 2 for one bitcode or IR input: `clang -c -emit-llvm` with the
    /// user's flags runs the pipeline `clang -c` would run before code
    /// generation, so the module split is the one the original is built from.
    fn optimise_one(&self, tu: &Tu) -> Result<PathBuf> {
        let whole = self.work.join("whole.bc");
        run(
            Command::new(&self.tc.clang)
                .arg("-c")
                .args(&self.cflags)
                .arg(&self.quiet)
                .arg("-emit-llvm")
                .arg(&tu.tagged)
                .arg("-o")
                .arg(&whole),
            "optimising the whole program",
        )?;
        Ok(whole)
    }

    /// Step 4: the passes (hide what the original does not export: with
    /// --lib functions and data, in an executable its data; ids,
    /// externalize, merge statics, split): the launcher's bitcode, one
    /// module per function in work/split, and what the pass says about them.
    fn split(&self, whole: &Path, original: &OriginalBuild) -> Result<Split> {
        let launcher_bc = self.work.join("launcher.bc");
        let log_path = self.work.join("decisions.log");
        let plugin = self.tc.plugin();
        let mut passes = String::from("bunkai-assign-ids,bunkai-externalize,bunkai-merge-statics,bunkai-split");
        let mut opt = Command::new(&self.tc.opt);
        // -load first: the plugin's options exist only once it is loaded.
        opt.arg(format!("-load={}", plugin.display()))
            .arg(format!("-load-pass-plugin={}", plugin.display()));
        {
            let exported = self.work.join("exported.txt");
            let d = Dso::read(&original.unstripped)?;
            let names: BTreeSet<&str> = d.defined.iter().map(|s| symbol_name(s)).collect();
            std::fs::write(&exported, names.into_iter().map(|n| format!("{n}\n")).collect::<String>())?;
            opt.arg(format!("-bunkai-exported={}", exported.display()));
            if !self.opts.lib {
                opt.arg("-bunkai-hide-data-only");
            }
            passes.insert_str(0, "bunkai-hide-unexported,");
        }
        run(
            opt.arg(format!("-passes={passes}"))
                .arg(format!("-bunkai-split-dir={}", self.split.display()))
                .arg(format!("-bunkai-log={}", log_path.display()))
                .arg(whole)
                .arg("-o")
                .arg(&launcher_bc),
            "splitting the program",
        )?;
        let split = &self.split;
        let stubs = stubs::parse_stubs_tsv(&std::fs::read_to_string(split.join("stubs.tsv"))?)?;
        let exports: Vec<String> = std::fs::read_to_string(split.join("exports.txt"))?
            .lines()
            .map(String::from)
            .collect();
        let imports: Vec<(String, char)> = std::fs::read_to_string(split.join("imports.txt"))?
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(n, k)| (n.to_string(), k.chars().next().unwrap_or('d')))
            .collect();
        let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
        Ok(Split { launcher_bc, stubs, exports, imports, log_text })
    }

    /// Step 5: the launcher (bin/NAME, or lib/libNAME.so with --lib): the
    /// launcher's bitcode, the stubs and the runtime, linked with all the
    /// user's flags. With a version script, the launcher's own symbols get
    /// a version node of their own after it (PRIVATE_VERSION), so that the
    /// script's local patterns do not hide them from the function
    /// libraries. Returns its path in the output.
    fn launcher(&self, s: &Split) -> Result<String> {
        let (opts, tc, name) = (self.opts, &self.tc, &self.name);
        let launcher_rel = if opts.lib {
            format!("lib/lib{name}.so")
        } else {
            format!("bin/{name}")
        };
        let launcher = self.root.join(&launcher_rel);
        std::fs::create_dir_all(launcher.parent().unwrap())?;
        let stubs_s = self.work.join("stubs.S");
        let libdir_from_launcher = if opts.lib { name.clone() } else { format!("../lib/{name}") };
        std::fs::write(&stubs_s, stubs::generate(&s.stubs, &libdir_from_launcher, opts.lib, &s.imports, &s.exports))?;
        let launcher_o = self.work.join("launcher.o");
        run(
            Command::new(&tc.clang)
                .arg("-c")
                .args(&self.cflags)
                .args([&self.quiet, "-Xclang", "-disable-llvm-passes"])
                .arg("-o")
                .arg(&launcher_o)
                .arg(&s.launcher_bc),
            "compiling the launcher",
        )?;
        let mut link = Command::new(&tc.clang);
        link.arg("-fuse-ld=lld").args(&self.cflags).arg(&self.quiet).arg("-o").arg(&launcher);
        link.arg(&launcher_o).arg(&stubs_s);
        link.arg("-Wl,--whole-archive").arg(tc.runtime()).arg("-Wl,--no-whole-archive");
        if opts.lib {
            link.arg("-shared").args(self.default_soname());
            if self.link.version_script {
                let map = self.work.join("private.map");
                std::fs::write(&map, format!("{PRIVATE_VERSION} {{\n  global:\n    {}*;\n}};\n", check::OWN_PREFIX))?;
                link.arg(format!("-Wl,--version-script,{}", map.display()));
            }
        } else {
            let dynlist = self.work.join("exports.dynlist");
            let mut t = String::from("{\n");
            for e in &s.exports {
                t.push_str(&format!("  \"{e}\";\n"));
            }
            t.push_str("};\n");
            std::fs::write(&dynlist, t)?;
            link.arg(format!("-Wl,--dynamic-list={}", dynlist.display()));
        }
        // Issue 23, launcher size: one symbol hash table, GNU's (glibc has
        // looked symbols up by DT_GNU_HASH since 2.5; the SysV .hash beside
        // it only doubled the table); and the relative relocations packed
        // (DT_RELR: a few words for a run of pointers, instead of 24 bytes
        // each), when the launcher is an executable and the C library the
        // link uses reads them.
        link.arg("-Wl,--hash-style=gnu");
        if !opts.lib && libc_reads_relr(tc) {
            // glibc refuses DT_RELR in an object that does not also depend
            // on the version GLIBC_ABI_DT_RELR (so an older glibc, which
            // would ignore DT_RELR, refuses to load it in one line): naming
            // the version's symbol adds the dependency (lld 14 has no
            // -z pack-relative-relocs, which would add it without a
            // symbol). Not in a shared-library launcher: GNU ld, linking a
            // program against it, cannot resolve that undefined symbol
            // (`undefined reference to GLIBC_ABI_DT_RELR`), so it would be
            // no drop-in for the original.
            let relr = self.work.join("relr.S");
            std::fs::write(&relr, "\t.globl GLIBC_ABI_DT_RELR\n\t.section .note.GNU-stack,\"\",@progbits\n")?;
            link.arg(&relr).arg("-Wl,--pack-dyn-relocs=relr");
        }
        link.arg("-Wl,-s");
        run(&mut link, "linking the launcher")?;
        Ok(launcher_rel)
    }

    /// `-soname libNAME.so` for a library the user gave no SONAME.
    fn default_soname(&self) -> Vec<String> {
        match self.link.soname {
            None if self.opts.lib => vec![format!("-Wl,-soname,lib{}.so", self.name)],
            _ => vec![],
        }
    }

    /// Step 6: one library per function, and an empty one, which measures
    /// the per-library overhead (§5.1). Returns the empty library's path
    /// and the link's library directories.
    fn libraries(&self, stubs: &[Stub], ph: &Phases) -> Result<(PathBuf, Vec<PathBuf>)> {
        let (tc, work) = (&self.tc, &self.work);
        let template = lower::link_template(tc, work, &library_link_flags(&self.opts.flags))?;
        let search = lower::search_dirs(&template);
        let mut jobs = Vec::with_capacity(stubs.len() + 1);
        for st in stubs {
            jobs.push(Job {
                inputs: vec![self.split.join(format!("{}{:x}.bc", layout::LIB_PREFIX, st.id))],
                group: false,
                output: self.root.join(&self.libdir_rel).join(layout::lib_file(st.id)),
                what: format!("{} ({})", st.name, st.source),
            });
        }
        let empty_ll = work.join("empty.ll");
        std::fs::write(&empty_ll, "target triple = \"x86_64-pc-linux-gnu\"\n")?;
        let empty_bc = work.join("empty.bc");
        run(
            Command::new(&tc.opt).arg(&empty_ll).arg("-o").arg(&empty_bc),
            "building the empty library",
        )?;
        let empty_so = work.join("empty.so");
        jobs.push(Job {
            inputs: vec![empty_bc],
            group: false,
            output: empty_so.clone(),
            what: "(empty library)".into(),
        });
        // Every function's id and stub: a library calls the others through
        // slots the manager points at their bodies (bunkai-lower's IDS).
        let ids = work.join("ids.tsv");
        std::fs::write(&ids, stubs.iter().map(|st| format!("{:x}\t{}\n", st.id, st.symbol)).collect::<String>())?;
        let workers = self.opts.jobs;
        let t = ph.quiet("libraries", || lower::run(tc, &template, self.level, Some(&ids), jobs, workers, ph.progress()))?;
        // CPU time summed over the workers: what one library costs.
        ph.add(&format!("libraries: code generation, {workers} workers' sum"), t.codegen);
        ph.add(&format!("libraries: lld, {workers} workers' sum"), t.link);
        Ok((empty_so, search))
    }

    /// Step 6: what the loader will make of the result (check.rs).
    fn check(&self, stubs: &[Stub], launcher_rel: &str, original: &OriginalBuild, search: Vec<PathBuf>) -> Result<()> {
        let libdir = self.root.join(&self.libdir_rel);
        Scattered {
            launcher: self.root.join(launcher_rel),
            original: original.unstripped.clone(),
            drop_in: self.opts.lib,
            libraries: stubs
                .iter()
                .map(|st| check::Library {
                    path: libdir.join(layout::lib_file(st.id)),
                    body: format!("{}{:x}", stubs::BODY_PREFIX, st.id),
                    what: st.name.clone(),
                })
                .collect(),
            search,
            root: self.root.clone(),
        }
        .check()
    }

    /// Step 7: a library with a SONAME other than its file name gets a link
    /// by that name beside it (lib/libz.so.1 -> libz.so), as `make install`
    /// of a library makes: a program that needs it finds it there.
    fn soname_link(&self, launcher_rel: &str) -> Result<()> {
        let Some(soname) = self.link.soname.as_deref().filter(|_| self.opts.lib) else { return Ok(()) };
        let file = Path::new(launcher_rel).file_name().unwrap_or_default();
        if soname.contains('/') || soname.is_empty() || soname.starts_with('.') || Path::new(soname) == file {
            return Ok(());
        }
        let at = self.root.join(launcher_rel).with_file_name(soname);
        std::os::unix::fs::symlink(file, &at).with_context(|| format!("cannot create {}", at.display()))
    }

    /// Keeps each function's module: `bunkai scatter group` links groups from them.
    fn keep_function_modules(&self, stubs: &[Stub]) -> Result<()> {
        let bcdir = self.root.join(format!("{}/{}", layout::BC_DIR, self.name));
        std::fs::create_dir_all(&bcdir)?;
        for st in stubs {
            let f = format!("{}{:x}.bc", layout::LIB_PREFIX, st.id);
            std::fs::rename(self.split.join(&f), bcdir.join(&f))?;
        }
        Ok(())
    }

    /// Step 3: the original, from the same inputs and flags (and the same
    /// default SONAME as the launcher), stripped into original/. A C input
    /// is code-generated from its bitcode of step 1: `clang -c -emit-llvm`
    /// runs what `clang -c` runs up to code generation (the tag adds
    /// attributes code generation does not read), so the object is the one
    /// `clang -c` makes, without compiling and optimising the source a
    /// second time (SQLite's original came out byte for byte the same).
    /// So is one bitcode or IR input's module from optimise_one; other
    /// inputs are compiled as they are. Then the objects are linked
    /// as `clang FLAGS -o P INPUTS` links them.
    fn original(&self, tus: &[Tu]) -> Result<OriginalBuild> {
        let (opts, tc, name) = (self.opts, &self.tc, &self.name);
        let orig_name = if opts.lib { format!("lib{name}.so") } else { name.clone() };
        let orig_unstripped = self.work.join(format!("{orig_name}.unstripped"));
        let inputs: Vec<(usize, &Tu)> = tus.iter().enumerate().collect();
        let objs = par_map(&inputs, opts.jobs, |_, (i, tu)| {
            let obj = self.work.join(format!("original{i}.o"));
            let mut c = Command::new(&tc.clang);
            c.arg("-c").args(&self.cflags).arg(&self.quiet).arg("-o").arg(&obj);
            if tu.optimised {
                c.args(["-Xclang", "-disable-llvm-passes"]).arg(&tu.tagged);
            } else {
                c.arg(&opts.inputs[*i]);
            }
            run(&mut c, "building the original program")?;
            Ok(obj)
        })?;
        let mut oc = Command::new(&tc.clang);
        oc.arg("-fuse-ld=lld").args(&self.cflags).arg(&self.quiet).arg("-o").arg(&orig_unstripped);
        oc.args(&objs);
        if opts.lib {
            oc.arg("-shared").args(self.default_soname());
        }
        run(&mut oc, "building the original program")?;
        let orig_rel = format!("original/{orig_name}");
        run(
            Command::new(&tc.strip)
                .arg("-o")
                .arg(self.root.join(&orig_rel))
                .arg(&orig_unstripped),
            "stripping the original program",
        )?;
        Ok(OriginalBuild { rel: orig_rel, unstripped: orig_unstripped })
    }

    /// Step 7: the functions' names for the runtime's messages.
    fn write_names(&self, stubs: &[Stub]) -> Result<()> {
        let mut names = String::new();
        for st in stubs {
            names.push_str(&format!("{:x}\t{}\t{}\n", st.id, st.name, st.source));
        }
        std::fs::write(self.root.join(&self.libdir_rel).join(layout::NAMES_FILE), names)?;
        Ok(())
    }

    /// Step 7: the manifest of what was built.
    fn manifest(&self, s: &Split, launcher_rel: String, empty_so: &Path, original: OriginalBuild) -> Manifest {
        let (opts, root, libdir_rel) = (self.opts, &self.root, &self.libdir_rel);
        let overhead = file_size(empty_so);
        let functions: Vec<FunctionEntry> = s
            .stubs
            .iter()
            .map(|st: &Stub| {
                let library = format!("{libdir_rel}/{}", layout::lib_file(st.id));
                FunctionEntry {
                    id: st.id,
                    name: st.name.clone(),
                    stub: st.symbol.clone(),
                    source: st.source.clone(),
                    size: file_size(&root.join(&library)),
                    library,
                }
            })
            .collect();
        let (kept, globals) = parse_log(&s.log_text);
        Manifest {
            format: FORMAT.into(),
            abi: crate::ABI,
            name: self.name.clone(),
            kind: if opts.lib { "lib" } else { "exe" }.into(),
            launcher_bytes: file_size(&root.join(&launcher_rel)),
            launcher: launcher_rel,
            libdir: libdir_rel.clone(),
            inputs: opts.inputs.iter().map(|p| p.display().to_string()).collect(),
            clang_flags: opts.flags.clone(),
            library_overhead_bytes: overhead,
            original: Original {
                stripped_bytes: file_size(&root.join(&original.rel)),
                unstripped_bytes: file_size(&original.unstripped),
                path: original.rel,
            },
            functions,
            kept,
            globals,
            exports: s.exports.len(),
            groups: None,
        }
    }
}

/// How every function or group library is linked: the user's flags without
/// the library's own link options (linkflags.rs), stripped. One thread per
/// link: the links are tiny and run one per core already; lld's thread
/// pool only woke and put to sleep its threads (on 394 of SQLite's
/// functions, 4.4 ms a link instead of 7.3), and the output is the same.
pub(crate) fn library_link_flags(flags: &[String]) -> Vec<String> {
    let mut v = linkflags::split(flags).common;
    v.extend(
        ["-Wl,-s", "-Wl,--build-id=none", "-Wl,--hash-style=gnu", "-Wl,--threads=1"].iter().map(|s| s.to_string()),
    );
    v
}

/// Refuses to overwrite a directory that is not ours.
fn prepare_out(out: &Path) -> Result<()> {
    if out.exists() {
        if !out.is_dir() {
            bail!("{} exists and is not a directory (choose another -o)", out.display());
        }
        let empty = std::fs::read_dir(out)?.next().is_none();
        if !empty && !out.join(MANIFEST).exists() {
            bail!(
                "{} exists and is not a scatter output (choose another -o or remove it)",
                out.display()
            );
        }
    }
    Ok(())
}

/// Moves the finished directory to `out`, replacing an older scatter output.
fn install(root: &Path, out: &Path) -> Result<()> {
    if out.exists() {
        let old = out.with_file_name(format!(
            ".{}.bunkai-old-{}",
            out.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        std::fs::rename(out, &old)
            .with_context(|| format!("cannot replace {}", out.display()))?;
        if let Err(e) = std::fs::rename(root, out) {
            let _ = std::fs::rename(&old, out);
            let _ = std::fs::remove_dir_all(root);
            return Err(e).with_context(|| format!("cannot create {}", out.display()));
        }
        std::fs::remove_dir_all(&old)?;
    } else if let Err(e) = std::fs::rename(root, out) {
        let _ = std::fs::remove_dir_all(root);
        return Err(e).with_context(|| format!("cannot create {}", out.display()));
    }
    Ok(())
}

fn parse_log(text: &str) -> (Vec<Kept>, Globals) {
    let mut kept = Vec::new();
    let mut g = Globals::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["ids", "keep", name, why] => kept.push(Kept {
                name: name.to_string(),
                reason: why.to_string(),
            }),
            ["merge", "expose", old, new, why] => {
                g.exposed.push((old.to_string(), new.to_string(), why.to_string()))
            }
            ["merge", name, st, off] => {
                g.merged
                    .push((name.to_string(), st.to_string(), off.parse().unwrap_or(0)))
            }
            ["split", "move", name, func] => g.moved.push((name.to_string(), func.to_string())),
            _ => {}
        }
    }
    (kept, g)
}

/// The deterministic `-v` log: which globals went where and why, how many
/// functions were extracted, which stayed in the launcher and why.
fn decision_log(m: &Manifest, raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    out.push(format!(
        "extracted {} functions into {} libraries; {} stayed in the launcher",
        m.functions.len(),
        m.functions.len(),
        m.kept.len()
    ));
    for k in &m.kept {
        out.push(format!("keep {} in the launcher: {}", k.name, k.reason));
    }
    for line in raw.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["hide", "unexported", name] => {
                out.push(format!("hide {name}: the original does not export it"))
            }
            ["externalize", "rename", old, new] => {
                out.push(format!("rename {old} -> {new}: not public, a library may call it"))
            }
            _ => {}
        }
    }
    for (name, st, off) in &m.globals.merged {
        out.push(format!(
            "global {name} -> launcher {st}+{off}: used by several functions or by the launcher"
        ));
    }
    for (old, new, why) in &m.globals.exposed {
        out.push(format!("global {old} -> launcher, exported as {new}: {why}"));
    }
    for (name, func) in &m.globals.moved {
        out.push(format!("global {name} -> library of {func}: its only user"));
    }
    out.push(format!("launcher exports {} symbols to the libraries", m.exports));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_last_opt_level() {
        let f = |v: &[&str]| opt_level(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(f(&["-O2", "-DX"]), "-O2");
        assert_eq!(f(&["-O3", "-O1"]), "-O1");
        assert_eq!(f(&[]), "-O0");
        assert_eq!(f(&["-Os"]), "-O2");
        assert_eq!(f(&["-O"]), "-O1");
        assert_eq!(f(&["-Og"]), "-O1");
        assert_eq!(f(&["-O4"]), "-O3");
        assert_eq!(f(&["-O9", "-Oz"]), "-O2");
    }

    #[test]
    fn rejects_flags_scatter_owns() {
        for f in ["-o", "-c", "-shared", "-flto=thin"] {
            assert!(check_flags(&[f.to_string()]).is_err(), "{f}");
        }
        assert!(check_flags(&["-O2".into(), "-lm".into()]).is_ok());
    }

    #[test]
    fn parses_the_pass_log() {
        let (k, g) = parse_log(
            "ids\tkeep\tf\tmarked used\nmerge\tx\t__bunkai_bss\t8\nsplit\tmove\t.str\tmain\n\
             merge\texpose\tt\t__bunkai_g0\tthread-local\n",
        );
        assert_eq!(k[0].reason, "marked used");
        assert_eq!(g.merged[0], ("x".into(), "__bunkai_bss".into(), 8));
        assert_eq!(g.moved[0].1, "main");
        assert_eq!(g.exposed[0].1, "__bunkai_g0");
    }

    #[test]
    fn classifies_inputs_by_content() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("a.c");
        std::fs::write(&c, "int main(void){return 0;}").unwrap();
        assert_eq!(classify(&c).unwrap(), InputKind::C);
        let bc = d.path().join("a.bc");
        std::fs::write(&bc, "not bitcode").unwrap();
        assert!(classify(&bc).unwrap_err().to_string().contains("not LLVM bitcode"));
        let txt = d.path().join("a.txt");
        std::fs::write(&txt, "hello").unwrap();
        assert!(classify(&txt).is_err());
    }
}
