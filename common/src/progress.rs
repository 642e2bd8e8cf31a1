//! Progress on long work, on stderr: labelled by phase, shown only when
//! stderr is a terminal and only once the work has taken a second
//! (`BUNKAI_PROGRESS_AFTER_MS`, 0 = at once), so that short runs, pipes
//! and scripts see nothing. `flow report`/`dump`, the trace readers,
//! `trace record` and scatter's phases use it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A bar or spinner that draws nothing until it has been running for the
/// delay; finished (and cleared) when dropped.
pub struct Progress {
    bar: ProgressBar,
    /// With no delay: shown at the first phase, so that it never draws
    /// without its label.
    pending: AtomicBool,
    done: Option<mpsc::Sender<()>>,
    watcher: Option<std::thread::JoinHandle<()>>,
    start: Instant,
}

/// Whether progress may show at all: stderr is a terminal.
pub fn on_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

impl Progress {
    /// A progress line in indicatif's `template` (e.g. `"  {spinner}
    /// {msg}: {bytes} read"`), with `len` for a bar; `enabled` false (not a
    /// terminal, or JSON on stdout) makes it never draw.
    pub fn new(template: &str, len: Option<u64>, enabled: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::hidden());
        bar.set_style(ProgressStyle::with_template(template).expect("a valid progress template"));
        if !enabled {
            return Progress { bar, pending: AtomicBool::new(false), done: None, watcher: None, start: Instant::now() };
        }
        let after: u64 = std::env::var("BUNKAI_PROGRESS_AFTER_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
        if after == 0 {
            return Progress { bar, pending: AtomicBool::new(true), done: None, watcher: None, start: Instant::now() };
        }
        let (done, wait) = mpsc::channel::<()>();
        let shown = bar.clone();
        let watcher = std::thread::spawn(move || {
            if wait.recv_timeout(Duration::from_millis(after)) == Err(mpsc::RecvTimeoutError::Timeout) {
                show(&shown);
            }
        });
        Progress { bar, pending: AtomicBool::new(false), done: Some(done), watcher: Some(watcher), start: Instant::now() }
    }

    /// A spinner with a label and the time so far, for work whose size is
    /// not known (`{msg}` is the phase).
    pub fn spinner(enabled: bool) -> Progress {
        Progress::new("  {spinner} {msg} ({elapsed})", None, enabled)
    }

    /// One phase of scatter's: a bar over `len` items (`MSG [bar] POS/LEN
    /// WHAT (eta)`), or a spinner with the time so far when `len` is None.
    pub fn labelled(enabled: bool, msg: &str, len: Option<u64>, what: &str) -> Progress {
        let template = match len {
            Some(_) => format!("  {{msg}} {{bar:40}} {{pos}}/{{len}} {what} ({{eta}})"),
            None => "  {spinner} {msg} ({elapsed})".to_string(),
        };
        let p = Progress::new(&template, len, enabled);
        p.phase(msg.to_string());
        p
    }

    /// Clears the line; returns how long since the progress was made.
    pub fn finish(self) -> Duration {
        self.start.elapsed()
    }

    /// The bar, to count on (`inc`, `wrap_read`) or relabel (`set_message`).
    pub fn bar(&self) -> &ProgressBar {
        &self.bar
    }

    /// Names the phase now running.
    pub fn phase(&self, label: impl Into<std::borrow::Cow<'static, str>>) {
        self.bar.set_message(label);
        if self.pending.swap(false, Ordering::Relaxed) {
            show(&self.bar);
        }
    }
}

fn show(b: &ProgressBar) {
    b.set_draw_target(ProgressDrawTarget::stderr());
    b.enable_steady_tick(Duration::from_millis(200));
}

impl Drop for Progress {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn short_work_never_shows_and_finish_times_it() {
        let p = super::Progress::labelled(true, "compiling", None, "");
        assert!(p.bar().is_hidden(), "drawn before the delay");
        std::thread::sleep(Duration::from_millis(5));
        assert!(p.finish() >= Duration::from_millis(5));
    }

    #[test]
    fn a_disabled_progress_counts_and_draws_nothing() {
        let p = super::Progress::new("{msg} {pos}/{len}", Some(10), false);
        p.phase("reading");
        p.bar().inc(3);
        assert_eq!(p.bar().position(), 3);
        assert!(p.bar().is_hidden());
    }
}
