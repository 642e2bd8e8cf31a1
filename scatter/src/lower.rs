//! Lowering per-function modules to shared libraries with `bunkai-lower`.
//!
//! The linker command line comes from clang itself (`clang -### -shared`), so
//! the libraries link exactly as `clang -shared FLAGS` would link them: same
//! crt files, the user's `-l` flags, libgcc. bunkai-lower then runs code
//! generation and lld in-process for every job; we run one per core.

use crate::toolchain::{output, Toolchain};
use anyhow::{bail, Context, Result};
use bunkai_common::progress::Progress;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

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

/// Where lowering spent its time, summed over the workers' jobs (so up to
/// `workers` times the wall time).
#[derive(Debug, Default, Clone, Copy)]
pub struct Times {
    /// Reading the modules and LLVM's code generation, to an object.
    pub codegen: Duration,
    /// lld, from that object to the library.
    pub link: Duration,
}

/// Runs all jobs on `workers` bunkai-lower processes. `opt` is -O0..-O3.
/// `ids`: a file of every function's "<hex id>\t<stub symbol>", with which
/// group libraries bind their calls (bunkai-lower's IDS record). With
/// `progress`, a bar counts the libraries once lowering has taken a second.
///
/// The jobs wait in one queue, largest input first, and each worker is
/// given the next one as it finishes one (two in hand, so it never waits
/// for us): a few large functions (SQLite's interpreter loop takes seconds)
/// start early instead of ending the phase on one core.
pub fn run(
    tc: &Toolchain,
    template: &[String],
    opt: &str,
    ids: Option<&Path>,
    jobs: Vec<Job>,
    workers: usize,
    progress: bool,
) -> Result<Times> {
    if jobs.is_empty() {
        return Ok(Times::default());
    }
    let total = jobs.len() as u64;
    let shown = Progress::labelled(progress, "lowering", Some(total), "libraries");
    let bar = shown.bar();
    let times: Mutex<Times> = Mutex::new(Times::default());
    let workers = workers.clamp(1, jobs.len());
    let size = |j: &Job| j.inputs.iter().map(|p| bunkai_common::files::file_size(p)).sum::<u64>();
    let mut sized: Vec<(u64, usize)> = jobs.iter().enumerate().map(|(i, j)| (size(j), i)).collect();
    sized.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let what: HashMap<String, String> =
        jobs.iter().map(|j| (j.output.display().to_string(), j.what.clone())).collect();
    let lines: Vec<String> = jobs.iter().map(job_line).collect();
    let queue: Mutex<VecDeque<String>> = Mutex::new(sized.iter().map(|(_, i)| lines[*i].clone()).collect());
    let mut header = String::new();
    if let Some(ids) = ids {
        header.push_str(&format!("IDS\t{}\n", ids.display()));
    }
    header.push_str("LINK");
    for a in template {
        header.push('\t');
        header.push_str(a);
    }
    header.push('\n');
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for _ in 0..workers {
            let (bar, failures, times, queue, what, header) = (bar.clone(), &failures, &times, &queue, &what, &header);
            let lower = tc.lower();
            handles.push(s.spawn(move || -> Result<()> {
                let mut child = Command::new(&lower)
                    .arg(opt)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .with_context(|| format!("cannot start {}", lower.display()))?;
                let mut stdin = Some(child.stdin.take().unwrap());
                // The next job to this worker, or its end of input once the
                // queue is empty. A write fails only when the child has died,
                // which its exit status reports below.
                let give = |stdin: &mut Option<std::process::ChildStdin>| {
                    let next = queue.lock().unwrap().pop_front();
                    match (next, stdin.as_mut()) {
                        (Some(line), Some(w)) => {
                            if w.write_all(line.as_bytes()).and_then(|_| w.flush()).is_err() {
                                *stdin = None;
                            }
                        }
                        _ => *stdin = None,
                    }
                };
                if let Some(w) = stdin.as_mut() {
                    let _ = w.write_all(header.as_bytes());
                }
                give(&mut stdin);
                give(&mut stdin);
                let stdout = child.stdout.take().unwrap();
                for line in BufReader::new(stdout).lines() {
                    let line = line?;
                    let f: Vec<&str> = line.splitn(3, '\t').collect();
                    match f.as_slice() {
                        ["ok", _] => bar.inc(1),
                        ["ok", _, us] => {
                            bar.inc(1);
                            // "<codegen µs>\t<link µs>"
                            let mut us = us.split('\t').map(|n| n.parse::<u64>().unwrap_or(0));
                            let mut t = times.lock().unwrap();
                            t.codegen += Duration::from_micros(us.next().unwrap_or(0));
                            t.link += Duration::from_micros(us.next().unwrap_or(0));
                        }
                        ["err", out, msg] => {
                            bar.inc(1);
                            let w = what.get(*out).cloned().unwrap_or_default();
                            failures.lock().unwrap().push(format!("{w}: {msg}"));
                        }
                        _ => continue,
                    }
                    give(&mut stdin);
                }
                drop(stdin);
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
    shown.finish();
    let f = failures.into_inner().unwrap();
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
    Ok(times.into_inner().unwrap())
}

/// A job as bunkai-lower reads it: JOB for one module, GROUP for several.
fn job_line(j: &Job) -> String {
    if !j.group && j.inputs.len() == 1 {
        format!("JOB\t{}\t{}\n", j.inputs[0].display(), j.output.display())
    } else {
        let mut l = format!("GROUP\t{}", j.output.display());
        for i in &j.inputs {
            l.push_str(&format!("\t{}", i.display()));
        }
        l.push('\n');
        l
    }
}
