//! Lowering per-function modules to shared libraries with `bunkai-lower`.
//!
//! The linker command line comes from clang itself (`clang -### -shared`), so
//! the libraries link exactly as `clang -shared FLAGS` would link them: same
//! crt files, the user's `-l` flags, libgcc. bunkai-lower then runs code
//! generation and lld in-process for every job; we run one per core.

use crate::toolchain::{output, Toolchain};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

pub struct Job {
    /// One module, or several linked into one library.
    pub inputs: Vec<PathBuf>,
    /// A group library (§5.1): bodies internal, one exported table.
    pub group: bool,
    pub output: PathBuf,
    /// Shown when the job fails.
    pub what: String,
}

/// The ld.lld arguments clang would use for `clang -shared -o @OUT@ @IN@ FLAGS`.
pub fn link_template(tc: &Toolchain, work: &Path, link_args: &[String]) -> Result<Vec<String>> {
    let dummy = work.join("bunkai-dummy.o");
    std::fs::write(&dummy, b"").context("cannot write in the work directory")?;
    let mut cmd = Command::new(&tc.clang);
    cmd.arg("-###")
        .arg("-shared")
        .arg("-fuse-ld=lld")
        .arg("-o")
        .arg("@OUT@")
        .arg(&dummy)
        .args(link_args);
    let (_, err) = output(&mut cmd)?;
    let dummy_s = dummy.to_string_lossy().to_string();
    let line = err
        .lines()
        .rev()
        .find(|l| l.contains("ld.lld") || l.contains("\"-shared\""))
        .with_context(|| format!("clang -### printed no link line: {err}"))?;
    let words = shlex::split(line).with_context(|| format!("cannot parse link line {line}"))?;
    let args: Vec<String> = words
        .into_iter()
        .skip(1)
        .map(|w| if w == dummy_s { "@IN@".to_string() } else { w })
        .collect();
    if !args.iter().any(|a| a == "@IN@") {
        bail!("clang's link line does not name the input: {line}");
    }
    Ok(args)
}

/// The library directories of a link line (its `-L` arguments), in order.
pub fn search_dirs(template: &[String]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut it = template.iter();
    while let Some(a) = it.next() {
        if a == "-L" {
            dirs.extend(it.next().map(PathBuf::from));
        } else if let Some(d) = a.strip_prefix("-L") {
            dirs.push(PathBuf::from(d));
        }
    }
    dirs
}

/// Runs all jobs on `workers` bunkai-lower processes. `opt` is -O0..-O3.
/// `ids`: a file of every function's "<hex id>\t<stub symbol>", with which
/// group libraries bind their calls (bunkai-lower's IDS record).
pub fn run(
    tc: &Toolchain,
    template: &[String],
    opt: &str,
    ids: Option<&Path>,
    jobs: Vec<Job>,
    workers: usize,
    progress: bool,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let total = jobs.len() as u64;
    let bar = if progress {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("  lowering {bar:40} {pos}/{len} libraries ({eta})")
                .unwrap(),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let workers = workers.clamp(1, jobs.len());
    let mut chunks: Vec<Vec<Job>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, j) in jobs.into_iter().enumerate() {
        chunks[i % workers].push(j);
    }
    let failures: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for chunk in chunks {
            let bar = bar.clone();
            let failures = failures.clone();
            let lower = tc.lower();
            handles.push(s.spawn(move || -> Result<()> {
                let mut child = Command::new(&lower)
                    .arg(opt)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .with_context(|| format!("cannot start {}", lower.display()))?;
                let mut stdin = child.stdin.take().unwrap();
                let mut input = String::new();
                if let Some(ids) = ids {
                    input.push_str(&format!("IDS\t{}\n", ids.display()));
                }
                input.push_str("LINK");
                for a in template {
                    input.push('\t');
                    input.push_str(a);
                }
                input.push('\n');
                let mut what = std::collections::HashMap::new();
                for j in &chunk {
                    if !j.group && j.inputs.len() == 1 {
                        input.push_str(&format!(
                            "JOB\t{}\t{}\n",
                            j.inputs[0].display(),
                            j.output.display()
                        ));
                    } else {
                        input.push_str(&format!("GROUP\t{}", j.output.display()));
                        for i in &j.inputs {
                            input.push_str(&format!("\t{}", i.display()));
                        }
                        input.push('\n');
                    }
                    what.insert(j.output.display().to_string(), j.what.clone());
                }
                // Feed stdin from another thread so a chatty child cannot
                // deadlock us.
                let feeder = std::thread::spawn(move || {
                    let _ = stdin.write_all(input.as_bytes());
                });
                let stdout = child.stdout.take().unwrap();
                for line in BufReader::new(stdout).lines() {
                    let line = line?;
                    let f: Vec<&str> = line.splitn(3, '\t').collect();
                    match f.as_slice() {
                        ["ok", _] => bar.inc(1),
                        ["err", out, msg] => {
                            bar.inc(1);
                            let w = what.get(*out).cloned().unwrap_or_default();
                            failures.lock().unwrap().push(format!("{w}: {msg}"));
                        }
                        _ => {}
                    }
                }
                let _ = feeder.join();
                let status = child.wait()?;
                bunkai_common::files::end_if_interrupted(&status);
                if !status.success() && failures.lock().unwrap().is_empty() {
                    bail!("bunkai-lower exited with {status}");
                }
                Ok(())
            }));
        }
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("lowering thread panicked"))??;
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    let f = failures.lock().unwrap();
    if let Some(first) = f.first() {
        bail!(
            "cannot build the library for {first}{}",
            if f.len() > 1 {
                format!(" (and {} more)", f.len() - 1)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}
