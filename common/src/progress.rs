//! Progress on stderr for work that takes a while: a bar (with a count) or
//! a spinner (without), drawn only when the caller allows it (stderr a
//! terminal, no --json) and only once the work has taken a second
//! (`BUNKAI_PROGRESS_AFTER_MS`, 0 to draw at once), so that short steps
//! stay silent.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long work runs before its progress shows: BUNKAI_PROGRESS_AFTER_MS,
/// else one second.
pub fn delay() -> Duration {
    let ms = std::env::var("BUNKAI_PROGRESS_AFTER_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    Duration::from_millis(ms)
}

/// One piece of work's progress. `bar()` is hidden until the delay has
/// passed (or for good when progress is off); dropping it, or `finish`,
/// clears the line.
pub struct Progress {
    bar: ProgressBar,
    done: Option<mpsc::Sender<()>>,
    watcher: Option<std::thread::JoinHandle<()>>,
    start: Instant,
}

impl Progress {
    /// A bar over `len` items (`{pos}/{len} WHAT`), or a spinner with
    /// the elapsed time when `len` is None. `msg` says what is being done.
    pub fn new(show: bool, msg: &str, len: Option<u64>, what: &str) -> Progress {
        let start = Instant::now();
        let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::hidden());
        let template = match len {
            Some(_) => format!("  {{msg}} {{bar:40}} {{pos}}/{{len}} {what} ({{eta}})"),
            None => "  {spinner} {msg} ({elapsed})".to_string(),
        };
        bar.set_style(ProgressStyle::with_template(&template).expect("a valid template"));
        bar.set_message(msg.to_string());
        if !show {
            return Progress { bar, done: None, watcher: None, start };
        }
        let after = delay();
        let reveal = |b: &ProgressBar| {
            b.set_draw_target(ProgressDrawTarget::stderr());
            b.enable_steady_tick(Duration::from_millis(200));
        };
        if after.is_zero() {
            reveal(&bar);
            return Progress { bar, done: None, watcher: None, start };
        }
        let (done, wait) = mpsc::channel::<()>();
        let shown = bar.clone();
        let watcher = std::thread::spawn(move || {
            if wait.recv_timeout(after) == Err(mpsc::RecvTimeoutError::Timeout) {
                reveal(&shown);
            }
        });
        Progress { bar, done: Some(done), watcher: Some(watcher), start }
    }

    /// The bar, to count items done or change the message from any thread.
    pub fn bar(&self) -> &ProgressBar {
        &self.bar
    }

    /// Clears the line; returns how long the work took.
    pub fn finish(mut self) -> Duration {
        self.stop();
        self.start.elapsed()
    }

    fn stop(&mut self) {
        if let Some(d) = self.done.take() {
            let _ = d.send(());
        }
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_progress_counts_and_times() {
        let p = Progress::new(false, "lowering", Some(3), "libraries");
        p.bar().inc(2);
        assert_eq!(p.bar().position(), 2);
        assert!(p.bar().is_hidden());
        std::thread::sleep(Duration::from_millis(5));
        assert!(p.finish() >= Duration::from_millis(5));
    }

    #[test]
    fn short_work_never_shows() {
        let p = Progress::new(true, "compiling", None, "");
        assert!(p.bar().is_hidden(), "drawn before the delay");
        p.finish();
    }
}
