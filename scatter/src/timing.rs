//! How long each phase of a scatter took: `-v` prints it (`time:` lines,
//! apart from the deterministic decision log), `--json` gives it as
//! `phases`, bench/scatter/speed.py reads it. A phase that takes a second
//! shows a spinner on a terminal (bunkai_common::progress); a phase run
//! beside another one says so in its name and shows nothing of its own.

use anyhow::Result;
use bunkai_common::progress::Progress;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    pub name: String,
    pub seconds: f64,
}

pub struct Phases {
    list: Mutex<Vec<Phase>>,
    progress: bool,
}

impl Phases {
    pub fn new(progress: bool) -> Phases {
        Phases { list: Mutex::new(Vec::new()), progress }
    }

    /// Whether phases may draw progress (stderr a terminal, no --json).
    pub fn progress(&self) -> bool {
        self.progress
    }

    /// Runs `f` as the phase `name`, with a spinner saying `doing` once it
    /// has taken a second.
    pub fn run<T>(&self, name: &str, doing: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let p = Progress::labelled(self.progress, doing, None, "");
        let r = f();
        self.add(name, p.finish());
        r
    }

    /// Runs `f` as the phase `name` without progress of its own (it runs
    /// beside a phase that shows one, or draws its own bar).
    pub fn quiet<T>(&self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f();
        self.add(name, t.elapsed());
        r
    }

    pub fn add(&self, name: &str, d: Duration) {
        self.list.lock().unwrap().push(Phase { name: name.to_string(), seconds: d.as_secs_f64() });
    }

    pub fn into_list(self) -> Vec<Phase> {
        self.list.into_inner().unwrap()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn phases_keep_their_order_and_results() {
        let p = super::Phases::new(false);
        assert_eq!(p.run("a", "doing a", || Ok(1)).unwrap(), 1);
        assert!(p.quiet("b", || -> anyhow::Result<()> { anyhow::bail!("no") }).is_err());
        let l = p.into_list();
        assert_eq!(l.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }
}
