//! The stats page (bunkai_share.h section 3): a memfd of BKS_STATS_SIZE
//! bytes the home runtime maps and fills; the CLI reads it after the
//! program ends. The offsets below are struct bks_stats's; a unit test
//! compiles the header and checks them.

use serde::Serialize;

pub const BKS_MAGIC: u32 = 0x314b_5342;
pub const BKS_VERSION: u32 = 4;
pub const BKS_MAX_HOSTS: usize = 16;
pub const BKS_MAX_THREADS: usize = 1024;
/// bunkai_share.h BKS_AUTH_WINDOW: how far below the highest number a runtime hello may come.
pub const BKS_AUTH_WINDOW: u32 = 1024;
pub const BKS_STATS_SIZE: u64 = 65536;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_HOSTS: usize = 8;
const OFF_NTHREADS: usize = 12;
const OFF_STARTED: usize = 16;
const OFF_MAPPINGS: usize = 24;
const OFF_FAILED_HOST: usize = 32;
const OFF_FAILED_ERR: usize = 36;
const OFF_ERROR: usize = 40;
const ERROR_LEN: usize = 256;
const OFF_RETRIES: usize = OFF_ERROR + ERROR_LEN;
const OFF_CONVERTED: usize = OFF_RETRIES + 8;
const OFF_REFUSED: usize = OFF_CONVERTED + 8;
const OFF_ZAPPED: usize = OFF_REFUSED + 8;
const OFF_HOST: usize = OFF_ZAPPED + 8;
const HOST_SIZE: usize = 9 * 8;
const OFF_THREAD: usize = OFF_HOST + BKS_MAX_HOSTS * HOST_SIZE;
const THREAD_SIZE: usize = 4 * 4 + 8;
/// sizeof(struct bks_stats)
pub const STATS_BYTES: usize = OFF_THREAD + BKS_MAX_THREADS * THREAD_SIZE;

/// struct bks_host_stats
#[derive(Serialize, Debug, Default, Clone, PartialEq, Eq)]
pub struct HostStats {
    pub read_faults: u64,
    pub write_faults: u64,
    pub pages_in: u64,
    pub pages_out: u64,
    pub invalidations: u64,
    pub syscalls: u64,
    pub threads: u64,
    pub fault_ns: u64,
    /// Pages of new mappings this host's threads made, owned by the host
    /// from the start (first touch), so never transferred to it.
    pub fresh_pages: u64,
}

/// struct bks_thread_stats: one row of the thread management table (§4.2)
#[derive(Serialize, Debug, Default, Clone, PartialEq, Eq)]
pub struct ThreadStats {
    pub thread: u32,
    pub host: u32,
    /// The executor's TID on the home host (0 for a thread that runs there).
    pub tid: u32,
    pub done: bool,
    pub syscalls: u64,
}

#[derive(Serialize, Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    pub hosts: u32,
    pub started_ns: u64,
    pub mappings: u64,
    /// The node whose loss the runtime saw end the run (0: none), and why
    /// (a negative errno).
    pub failed_host: u32,
    pub failed_err: i32,
    pub error: String,
    /// Home-side userfaultfd calls retried after a mapping change in flight.
    pub retries: u64,
    /// File mappings made shared memory after start-up.
    pub converted: u64,
    /// Connections refused (no handshake, wrong key).
    pub refused: u64,
    /// Pages dropped on every host for madvise(MADV_DONTNEED) by a node's thread.
    pub zapped_pages: u64,
    pub host: Vec<HostStats>,
    pub threads: Vec<ThreadStats>,
}

fn u32_at(p: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(p[o..o + 4].try_into().unwrap())
}

fn u64_at(p: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(p[o..o + 8].try_into().unwrap())
}

/// Ok(None): the runtime never started (the page is still zero).
pub fn parse(page: &[u8]) -> Result<Option<Stats>, String> {
    if page.len() < STATS_BYTES {
        return Err(format!("the stats page is {} bytes, expected at least {STATS_BYTES} (rebuild both: make)", page.len()));
    }
    let magic = u32_at(page, OFF_MAGIC);
    if magic == 0 {
        return Ok(None);
    }
    let version = u32_at(page, OFF_VERSION);
    if magic != BKS_MAGIC || version != BKS_VERSION {
        return Err(format!(
            "the runtime wrote stats version {version} (magic {magic:#x}), this bunkai reads {BKS_VERSION} (rebuild both: make)"
        ));
    }
    let hosts = u32_at(page, OFF_HOSTS);
    let nthreads = (u32_at(page, OFF_NTHREADS) as usize).min(BKS_MAX_THREADS);
    let err = &page[OFF_ERROR..OFF_ERROR + ERROR_LEN];
    let err = &err[..err.iter().position(|&b| b == 0).unwrap_or(ERROR_LEN)];
    let host = (0..(hosts as usize).min(BKS_MAX_HOSTS))
        .map(|h| {
            let o = OFF_HOST + h * HOST_SIZE;
            let f = |i: usize| u64_at(page, o + 8 * i);
            HostStats {
                read_faults: f(0),
                write_faults: f(1),
                pages_in: f(2),
                pages_out: f(3),
                invalidations: f(4),
                syscalls: f(5),
                threads: f(6),
                fault_ns: f(7),
                fresh_pages: f(8),
            }
        })
        .collect();
    let threads = (0..nthreads)
        .map(|i| {
            let o = OFF_THREAD + i * THREAD_SIZE;
            ThreadStats {
                thread: u32_at(page, o),
                host: u32_at(page, o + 4),
                tid: u32_at(page, o + 8),
                done: u32_at(page, o + 12) != 0,
                syscalls: u64_at(page, o + 16),
            }
        })
        .filter(|t| t.thread != 0)
        .collect();
    Ok(Some(Stats {
        hosts,
        started_ns: u64_at(page, OFF_STARTED),
        mappings: u64_at(page, OFF_MAPPINGS),
        failed_host: u32_at(page, OFF_FAILED_HOST),
        failed_err: u32_at(page, OFF_FAILED_ERR) as i32,
        error: String::from_utf8_lossy(err).trim().to_string(),
        retries: u64_at(page, OFF_RETRIES),
        converted: u64_at(page, OFF_CONVERTED),
        refused: u64_at(page, OFF_REFUSED),
        zapped_pages: u64_at(page, OFF_ZAPPED),
        host,
        threads,
    }))
}

/// The -v report: the thread management table, then one line per host.
/// `names[h]` names host h ("home", then the nodes' addresses).
pub fn render(s: &Stats, names: &[String]) -> String {
    let name = |h: u32| names.get(h as usize).cloned().unwrap_or_else(|| format!("host {h}"));
    let mut out = String::new();
    out.push_str(&format!(
        "bunkai share: thread management table ({} thread{}, {} mapping{} shared, {} converted from files, {} retried after mapping changes, {} pages dropped everywhere, {} connection{} refused)\n",
        s.threads.len(),
        if s.threads.len() == 1 { "" } else { "s" },
        s.mappings,
        if s.mappings == 1 { "" } else { "s" },
        s.converted,
        s.retries,
        s.zapped_pages,
        s.refused,
        if s.refused == 1 { "" } else { "s" }
    ));
    let hw = s.threads.iter().map(|t| name(t.host).len()).max().unwrap_or(4).max(4);
    out.push_str(&format!("  {:>6}  {:<hw$}  {:>8}  {:>10}  {}\n", "thread", "host", "executor", "syscalls", "state"));
    for t in &s.threads {
        let tid = if t.tid == 0 { "-".to_string() } else { t.tid.to_string() };
        // The runtime marks the end of remote threads only.
        let state = if t.done { "done" } else if t.host == 0 { "-" } else { "running" };
        out.push_str(&format!(
            "  {:>6}  {:<hw$}  {:>8}  {:>10}  {state}\n",
            t.thread,
            name(t.host),
            tid,
            t.syscalls
        ));
    }
    let nw = (0..s.host.len()).map(|h| name(h as u32).len()).max().unwrap_or(4).max(4);
    out.push_str(&format!(
        "  {:<nw$}  {:>7}  {:>9}  {:>11}  {:>12}  {:>8}  {:>9}  {:>13}  {:>11}  {:>10}\n",
        "host", "threads", "syscalls", "read faults", "write faults", "pages in", "pages out", "invalidations", "fresh pages", "fault ms"
    ));
    for (h, c) in s.host.iter().enumerate() {
        out.push_str(&format!(
            "  {:<nw$}  {:>7}  {:>9}  {:>11}  {:>12}  {:>8}  {:>9}  {:>13}  {:>11}  {:>10.3}\n",
            name(h as u32),
            c.threads,
            c.syscalls,
            c.read_faults,
            c.write_faults,
            c.pages_in,
            c.pages_out,
            c.invalidations,
            c.fresh_pages,
            c.fault_ns as f64 / 1e6
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put32(p: &mut [u8], o: usize, v: u32) {
        p[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put64(p: &mut [u8], o: usize, v: u64) {
        p[o..o + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn sample() -> Vec<u8> {
        let mut p = vec![0u8; BKS_STATS_SIZE as usize];
        put32(&mut p, OFF_MAGIC, BKS_MAGIC);
        put32(&mut p, OFF_VERSION, BKS_VERSION);
        put32(&mut p, OFF_HOSTS, 2);
        put32(&mut p, OFF_NTHREADS, 3);
        put64(&mut p, OFF_STARTED, 123);
        put64(&mut p, OFF_MAPPINGS, 7);
        p[OFF_ERROR..OFF_ERROR + 5].copy_from_slice(b"oops\n");
        put64(&mut p, OFF_RETRIES, 4);
        put64(&mut p, OFF_CONVERTED, 5);
        put64(&mut p, OFF_REFUSED, 1);
        put64(&mut p, OFF_ZAPPED, 6);
        for i in 0..9 {
            put64(&mut p, OFF_HOST + HOST_SIZE + 8 * i, 10 + i as u64);
        }
        // thread 1 on node 1 (executor 4242), thread 2 at home; slot 0 unused
        let t = OFF_THREAD + THREAD_SIZE;
        put32(&mut p, t, 1);
        put32(&mut p, t + 4, 1);
        put32(&mut p, t + 8, 4242);
        put32(&mut p, t + 12, 1);
        put64(&mut p, t + 16, 99);
        put32(&mut p, t + THREAD_SIZE, 2);
        p
    }

    #[test]
    fn parses_what_the_runtime_writes() {
        let s = parse(&sample()).unwrap().unwrap();
        assert_eq!((s.hosts, s.started_ns, s.mappings), (2, 123, 7));
        assert_eq!(s.error, "oops");
        assert_eq!((s.retries, s.converted, s.refused, s.zapped_pages), (4, 5, 1, 6));
        assert_eq!(s.host.len(), 2);
        assert_eq!(s.host[0], HostStats::default());
        assert_eq!(s.host[1].read_faults, 10);
        assert_eq!(s.host[1].fault_ns, 17);
        assert_eq!(s.host[1].fresh_pages, 18);
        assert_eq!(
            s.threads,
            vec![
                ThreadStats { thread: 1, host: 1, tid: 4242, done: true, syscalls: 99 },
                ThreadStats { thread: 2, host: 0, tid: 0, done: false, syscalls: 0 },
            ]
        );
        let text = render(&s, &["home".into(), "10.200.1.2:7000".into()]);
        assert!(text.contains("thread management table (2 threads, 7 mappings shared, 5 converted from files, 4 retried after mapping changes, 6 pages dropped everywhere, 1 connection refused)"), "{text}");
        assert!(text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["1", "10.200.1.2:7000", "4242", "99", "done"]), "{text}");
        assert!(text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["2", "home", "-", "0", "-"]), "{text}");
    }

    #[test]
    fn zero_page_means_no_runtime_and_other_versions_are_refused() {
        assert_eq!(parse(&vec![0u8; BKS_STATS_SIZE as usize]).unwrap(), None);
        let mut p = sample();
        put32(&mut p, OFF_VERSION, BKS_VERSION + 1);
        let e = parse(&p).unwrap_err();
        assert!(e.contains(&format!("stats version {}", BKS_VERSION + 1)) && e.contains("(rebuild both: make)"), "{e}");
        assert!(parse(&p[..100]).is_err());
    }

    /// The offsets above against the C header, compiled by the system's cc.
    #[test]
    fn layout_matches_the_header() {
        let inc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
        let got = bunkai_common::c_header::run(
            &inc,
            "bunkai_share.h",
            r#"  printf("%u %u %d %d %u\n", BKS_MAGIC, BKS_VERSION, BKS_MAX_HOSTS, BKS_MAX_THREADS, BKS_STATS_SIZE);
  printf("%u %d %d %d %d %zu %zu\n", BKS_KEY_BYTES, BKS_AUTH_MS, BKS_AUTH_WINDOW, BKS_ROLE_CONTROL, BKS_ROLE_THREAD,
         sizeof(struct bks_auth_hello), sizeof(struct bks_auth_reply));
  printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", offsetof(struct bks_stats, magic), offsetof(struct bks_stats, version),
         offsetof(struct bks_stats, hosts), offsetof(struct bks_stats, nthreads), offsetof(struct bks_stats, started_ns),
         offsetof(struct bks_stats, mappings), offsetof(struct bks_stats, failed_host), offsetof(struct bks_stats, failed_err),
         offsetof(struct bks_stats, error), offsetof(struct bks_stats, retries), offsetof(struct bks_stats, converted),
         offsetof(struct bks_stats, refused), offsetof(struct bks_stats, zapped_pages), offsetof(struct bks_stats, host),
         offsetof(struct bks_stats, thread));
  printf("%zu %zu %zu %zu\n", sizeof(struct bks_host_stats), sizeof(struct bks_thread_stats),
         offsetof(struct bks_thread_stats, syscalls), sizeof(struct bks_stats));"#,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        use crate::auth;
        let want = format!(
            "{BKS_MAGIC} {BKS_VERSION} {BKS_MAX_HOSTS} {BKS_MAX_THREADS} {BKS_STATS_SIZE}\n\
             {} {} {BKS_AUTH_WINDOW} {} {} 80 32\n\
             {OFF_MAGIC} {OFF_VERSION} {OFF_HOSTS} {OFF_NTHREADS} {OFF_STARTED} {OFF_MAPPINGS} {OFF_FAILED_HOST} {OFF_FAILED_ERR} {OFF_ERROR} {OFF_RETRIES} {OFF_CONVERTED} {OFF_REFUSED} {OFF_ZAPPED} {OFF_HOST} {OFF_THREAD}\n\
             {HOST_SIZE} {THREAD_SIZE} 16 {STATS_BYTES}\n",
            crate::key::KEY_BYTES,
            auth::AUTH_TIME.as_millis(),
            auth::ROLE_CONTROL,
            auth::ROLE_THREAD
        );
        assert_eq!(got, want);
    }
}
