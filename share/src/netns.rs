//! Hosts for tests and benchmarks: network namespaces joined by veth.
//!
//! `Hosts::new(n)` makes a home namespace and n node namespaces, a star of
//! veth pairs from home to each node, and loopback up everywhere:
//!
//! ```text
//!   bk-share-<owner>-<i>-0 (home)                 bk-share-<owner>-<i>-k (node k)
//!   bk<k>  10.<o>.<k>.1/24  <------ veth ------>  bk0  10.<o>.<k>.2/24
//! ```
//!
//! `<owner>` is the pid whose lifetime the namespaces share (ours, unless
//! `bunkai share hosts up --owner` says otherwise), `<i>` tells apart the
//! sets one owner has (tests run in parallel threads of one process), and
//! `<o>` is 200-255, only to tell sets apart when reading addresses: every
//! set has its own home namespace, so their addresses never meet. The
//! veths are created inside the namespaces, never in the caller's.
//!
//! Everything goes on Drop: the processes still running in the namespaces
//! are killed, then the namespaces deleted (their veths with them). A set
//! whose owner died without dropping it (a test killed with ^C) is removed
//! the next time a set is created, or by `bunkai share hosts clean`. Only
//! names starting with `bk-share-` are ever touched. Needs root.

use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const PREFIX: &str = "bk-share-";

pub struct Hosts {
    prefix: String,
    nodes: usize,
    octet: u8,
    keep: bool,
}

/// Runs `ip ARGS`; the error is ip's own message.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ip (install iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn ip_out(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl Hosts {
    /// A home host and `nodes` nodes, owned by this process.
    pub fn new(nodes: usize) -> Result<Hosts> {
        Hosts::with_owner(nodes, std::process::id())
    }

    /// The same, owned by process `owner`: the namespaces count as stale
    /// (removable by anyone) once it is gone.
    pub fn with_owner(nodes: usize, owner: u32) -> Result<Hosts> {
        if !crate::sys::is_root() {
            bail!("network namespaces need root (run as root)");
        }
        if nodes == 0 || nodes >= crate::stats::BKS_MAX_HOSTS {
            bail!("{nodes} nodes: give 1 to {}", crate::stats::BKS_MAX_HOSTS - 1);
        }
        clean_stale();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let mut tries = 0;
        let (prefix, i) = loop {
            let i = NEXT.fetch_add(1, Ordering::SeqCst);
            let prefix = format!("{PREFIX}{owner}-{i}");
            // The home namespace's creation claims the set's name.
            match ip(&["netns", "add", &format!("{prefix}-0")]) {
                Ok(()) => break (prefix, i),
                Err(e) if tries < 1000 && e.to_string().contains("exists") => tries += 1,
                Err(e) => return Err(e),
            }
        };
        let h = Hosts { prefix, nodes, octet: 200 + ((owner.wrapping_mul(7).wrapping_add(i)) % 56) as u8, keep: false };
        h.build().with_context(|| format!("cannot set up the namespaces {}-*", h.prefix))?;
        Ok(h)
    }

    fn build(&self) -> Result<()> {
        for k in 1..=self.nodes {
            ip(&["netns", "add", &self.name(k)])?;
        }
        let home = self.name(0);
        for k in 0..=self.nodes {
            ip(&["-n", &self.name(k), "link", "set", "lo", "up"])?;
        }
        for k in 1..=self.nodes {
            let (node, dev) = (self.name(k), format!("bk{k}"));
            ip(&["-n", &home, "link", "add", &dev, "type", "veth", "peer", "name", "bk0", "netns", &node])?;
            ip(&["-n", &home, "addr", "add", &format!("{}/24", self.home_ip(k)), "dev", &dev])?;
            ip(&["-n", &node, "addr", "add", &format!("{}/24", self.node_ip(k)), "dev", "bk0"])?;
            ip(&["-n", &home, "link", "set", &dev, "up"])?;
            ip(&["-n", &node, "link", "set", "bk0", "up"])?;
        }
        // Usable once both ends have carrier.
        let deadline = Instant::now() + Duration::from_secs(5);
        for k in 1..=self.nodes {
            while !ip_out(&["-n", &home, "-o", "link", "show", &format!("bk{k}")]).contains("LOWER_UP") {
                if Instant::now() > deadline {
                    bail!("the link to node {k} did not come up within 5 s");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(())
    }

    /// Number of nodes (hosts 1..=nodes; host 0 is home).
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The namespace of host `k` (0: home).
    pub fn name(&self, k: usize) -> String {
        format!("{}-{k}", self.prefix)
    }

    /// Node k's address, on its link to home.
    pub fn node_ip(&self, k: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, k as u8, 2)
    }

    /// Home's address on its link to node k.
    pub fn home_ip(&self, k: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, k as u8, 1)
    }

    /// `program` to run in host k's namespace (`ip netns exec` execs it:
    /// the Child's pid is the program's).
    pub fn exec(&self, k: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name(k)]).arg(program);
        c
    }

    pub fn home_exec(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.exec(0, program)
    }

    pub fn node_exec(&self, k: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        assert!(k >= 1 && k <= self.nodes, "node {k} of {}", self.nodes);
        self.exec(k, program)
    }

    /// Cuts node k's link: home's end of the veth goes down (the node's
    /// end loses carrier). Connections across it see no reset, only
    /// silence.
    pub fn cut_link(&self, k: usize) -> Result<()> {
        ip(&["-n", &self.name(0), "link", "set", &format!("bk{k}"), "down"])
    }

    pub fn restore_link(&self, k: usize) -> Result<()> {
        ip(&["-n", &self.name(0), "link", "set", &format!("bk{k}"), "up"])
    }

    /// The processes running in host k's namespace.
    pub fn pids(&self, k: usize) -> Vec<u32> {
        pids_in(&self.name(k))
    }

    /// Leaves the namespaces in place when dropped (`hosts up`).
    pub fn keep(mut self) {
        self.keep = true;
    }

    pub fn to_json(&self, owner: u32) -> serde_json::Value {
        let nodes: Vec<serde_json::Value> = (1..=self.nodes)
            .map(|k| {
                serde_json::json!({"host": k, "netns": self.name(k), "addr": self.node_ip(k).to_string(),
                                   "home_addr": self.home_ip(k).to_string()})
            })
            .collect();
        serde_json::json!({"owner": owner, "home": self.name(0), "nodes": nodes})
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if !self.keep {
            destroy(&(0..=self.nodes).map(|k| self.name(k)).collect::<Vec<_>>());
        }
    }
}

fn pids_in(name: &str) -> Vec<u32> {
    ip_out(&["netns", "pids", name]).split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Kills what runs in the namespaces `names`, then deletes them.
pub fn destroy(names: &[String]) {
    for _ in 0..3 {
        let mut any = false;
        for n in names {
            for p in pids_in(n) {
                any = true;
                crate::sys::kill(p, libc::SIGKILL);
            }
        }
        if !any {
            break;
        }
        // Killed processes leave their namespace when the kernel has torn
        // them down; wait a little for that.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && names.iter().any(|n| !pids_in(n).is_empty()) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for n in names {
        let _ = ip(&["netns", "del", n]);
    }
}

/// The owner pid in a name of ours: bk-share-<owner>-<i>-<k>.
pub fn owner_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let parts: Vec<&str> = rest.split('-').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    parts[0].parse().ok()
}

/// Our namespaces that exist now.
pub fn list() -> Vec<String> {
    let dir = if Path::new("/run/netns").is_dir() { "/run/netns" } else { "/var/run/netns" };
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| owner_of(n).is_some())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes our namespaces whose owner is gone; returns their names.
pub fn clean_stale() -> Vec<String> {
    let stale: Vec<String> = list().into_iter().filter(|n| owner_of(n).is_some_and(|o| !alive(o))).collect();
    destroy(&stale);
    stale
}

/// Removes every namespace of `owner`; returns their names.
pub fn remove_owner(owner: u32) -> Vec<String> {
    let mine: Vec<String> = list().into_iter().filter(|n| owner_of(n) == Some(owner)).collect();
    destroy(&mine);
    mine
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_owner() {
        assert_eq!(owner_of("bk-share-1234-0-0"), Some(1234));
        assert_eq!(owner_of("bk-share-7-12-3"), Some(7));
        for other in [
            "bk-net-1234-0-0",
            "bunkai-net-5141-cli",
            "bk-share-1234-0",
            "bk-share-1234-0-0-0",
            "bk-share-x-0-0",
            "bk-share--0-0",
            "bk-share-1234-0-a",
            "bk-share-99999999999-0-0",
        ] {
            assert_eq!(owner_of(other), None, "{other}");
        }
    }

    /// A set of hosts comes up, its nodes reach home and not each other
    /// through a cut link, and it leaves nothing behind.
    #[test]
    fn hosts_come_and_go() {
        assert!(crate::sys::is_root(), "network namespaces need root (run the tests as root)");
        let h = Hosts::new(2).unwrap();
        let names: Vec<String> = (0..=2).map(|k| h.name(k)).collect();
        assert!(names.iter().all(|n| list().contains(n)), "{names:?} {:?}", list());
        let ping = |k: usize, to: Ipv4Addr| {
            h.exec(k, "ping")
                .args(["-c", "1", "-W", "1", &to.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        assert!(
            Command::new("ping").arg("-V").output().is_ok(),
            "ping is missing (install iputils-ping: scripts/install-deps.sh)"
        );
        assert!(ping(0, h.node_ip(1)) && ping(0, h.node_ip(2)) && ping(2, h.home_ip(2)));
        h.cut_link(1).unwrap();
        assert!(!ping(0, h.node_ip(1)));
        h.restore_link(1).unwrap();
        let mut sleeper = h.node_exec(1, "sleep").arg("60").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.pids(1).is_empty() {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(h.pids(1), vec![sleeper.id()]);
        drop(h);
        assert!(!sleeper.wait().unwrap().success(), "the sleeper outlived its namespace");
        let left = list();
        assert!(names.iter().all(|n| !left.contains(n)), "{left:?}");
    }

    #[test]
    fn stale_sets_are_removed() {
        assert!(crate::sys::is_root(), "network namespaces need root (run the tests as root)");
        // An owner that is certainly gone: a child we started and reaped.
        let mut c = Command::new("true").spawn().unwrap();
        let dead = c.id();
        c.wait().unwrap();
        // Made by hand, as a killed test would leave it (another test's
        // Hosts::new may clean it first: either way it must go).
        let name = format!("{PREFIX}{dead}-0-0");
        ip(&["netns", "add", &name]).unwrap();
        clean_stale();
        assert!(!list().contains(&name), "{name} left behind");
    }
}
