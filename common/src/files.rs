//! Files written whole: readers see the old file or the new one, never a
//! part; an interrupted command removes what it had not finished.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Writes `data` to `path` through a temporary file in the same directory
/// and a rename, so readers see the old file or the new one, never a part.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| Ok(w.write_all(data)?))
}

/// Like `write_atomic`, for output produced piece by piece: `write` fills a
/// buffered temporary file that is renamed over `path` only if it succeeds.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".bunkai-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {} (check the directory exists and is writable)", dir.display()))?;
    let mut w = std::io::BufWriter::new(tmp);
    write(&mut w)?;
    let tmp = w.into_inner().map_err(|e| anyhow::anyhow!("cannot write {} ({})", path.display(), e.error()))?;
    tmp.as_file().sync_all().ok();
    // tempfile creates 0600; outputs are served by any static web server,
    // so they get the usual 0644.
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).ok();
    }
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Directories to remove if the user interrupts us (Ctrl-C, SIGTERM): the
/// temporary build directories of scatter and group.
static IN_PROGRESS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers `dir` for removal on interrupt until the guard is dropped.
pub struct InterruptCleanup(PathBuf);

pub fn remove_on_interrupt(dir: &Path) -> InterruptCleanup {
    IN_PROGRESS.lock().unwrap().push(dir.to_path_buf());
    if let Some(who) = WHO.get() {
        cleaning_handler(who);
    }
    InterruptCleanup(dir.to_path_buf())
}

/// The command's name for the interrupt line, once install_interrupt_cleanup
/// has run.
static WHO: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
static CLEANING: std::sync::Once = std::sync::Once::new();
/// The interrupt line of a command with nothing to clean up, written by
/// the plain handler (a signal handler may only write and exit).
static LINE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

impl Drop for InterruptCleanup {
    fn drop(&mut self) {
        IN_PROGRESS.lock().unwrap().retain(|p| p != &self.0);
    }
}

/// Installs the SIGINT/SIGTERM handler every command without handling of
/// its own gets: it says so in one line and exits 130, as a shell reports a
/// command that Ctrl-C ended. At first a plain signal handler (write, exit:
/// no thread at start-up, which every command would pay for); once a
/// directory is registered for removal, ctrlc's handler thread, which
/// removes the registered directories first (an interrupted run leaves
/// nothing half-written behind).
pub fn install_interrupt_cleanup(who: &'static str) {
    let _ = WHO.set(who);
    if !IN_PROGRESS.lock().unwrap().is_empty() {
        cleaning_handler(who);
        return;
    }
    let _ = LINE.set(format!("bunkai {who}: interrupted\n").into_bytes());
    extern "C" fn plain(_sig: i32) {
        if let Some(l) = LINE.get() {
            unsafe { write(2, l.as_ptr().cast(), l.len()) };
        }
        unsafe { _exit(130) };
    }
    for sig in [SIGINT, SIGTERM] {
        unsafe { signal(sig, plain as extern "C" fn(i32) as usize) };
    }
}

extern "C" {
    fn signal(sig: i32, handler: usize) -> usize;
    fn write(fd: i32, buf: *const std::ffi::c_void, n: usize) -> isize;
    fn _exit(code: i32) -> !;
}
const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;

/// ctrlc's handler (a thread waiting for the signal), once.
fn cleaning_handler(who: &'static str) {
    CLEANING.call_once(|| install_ctrlc(who));
}

fn install_ctrlc(who: &'static str) {
    let _ = ctrlc::set_handler(move || interrupted(who));
}

/// The end of an interrupted command: the registered directories removed,
/// one line, exit 130. Once: the handler's thread and a thread that saw a
/// child die of the same Ctrl-C may both get here; the second waits for
/// the first to end the process.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn interrupted(who: &str) -> ! {
    if INTERRUPTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        wait_for_the_end();
    }
    let dirs: Vec<PathBuf> = IN_PROGRESS.lock().map(|v| v.clone()).unwrap_or_default();
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    if dirs.is_empty() {
        eprintln!("bunkai {who}: interrupted");
    } else {
        eprintln!("bunkai {who}: interrupted; removed the unfinished output");
    }
    std::process::exit(130);
}

/// Never returns: the thread handling an interrupt ends the process.
fn wait_for_the_end() -> ! {
    loop {
        std::thread::park();
    }
}

/// Called before a command reports its error: when an interrupt is being
/// handled, the error is most likely its consequence (the temporary
/// directory removed under the work), and the interrupt's line and exit
/// status 130 are the right end; this waits for it.
pub fn yield_to_interrupt() {
    if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        wait_for_the_end();
    }
}

/// A child that died of SIGINT or SIGTERM died of the Ctrl-C (or the kill)
/// that reached our process group: the command ends as interrupted, not
/// with the child's failure ("clang-14 exited with signal 2" is no
/// compile error). Returns when the child died of anything else.
pub fn end_if_interrupted(status: &std::process::ExitStatus) {
    use std::os::unix::process::ExitStatusExt;
    if matches!(status.signal(), Some(SIGINT) | Some(SIGTERM)) {
        interrupted(WHO.get().copied().unwrap_or(""));
    }
}

/// Size of a file in bytes (0 when it is missing).
pub fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}
