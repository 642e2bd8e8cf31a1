//! `bunkai flow` on servers as they really run (issue 24): a daemon, and
//! workers forked before and after the weave. Each process gets a module
//! host of its own at fork (libbunkai-host's pthread_atfork handlers),
//! `weave --pid` takes the process tree, children forked after the weave
//! inherit the woven code, every process writes its own record buffer, and
//! `unweave` takes the aspect out of all of them. Also the messages around
//! it: a host never started, a process killed, buffers of ended processes.

use bunkai_e2e::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Debian's memcached, from its source package (scripts/fetch-memcached.sh,
/// which `make test` runs): the plain build and the `bunkai flow cc` build.
fn memcached(variant: &str) -> PathBuf {
    let p = root().join("build/third_party/memcached").join(format!("memcached-{variant}"));
    assert!(p.exists(), "{} is missing (run make fetch-memcached)", p.display());
    p
}

fn runtime_dir() -> PathBuf {
    bunkai().parent().unwrap().join("../lib/bunkai")
}

fn aspect(name: &str) -> PathBuf {
    program(&format!("flow/aspects/{name}.xml"))
}

/// A free loopback port (bound, then let go, for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Polls `done` every 20 ms until it holds; fails naming `what` after `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon the test started (not its child: it forked and its parent
/// exited), killed when the test ends, also by a failed assertion, with
/// the workers it forked: it leads its own process group (setsid), and
/// they are in it.
struct Daemon(u32);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.0)]).output_within(DEADLINE);
        let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).output_within(DEADLINE);
    }
}

/// The runtimes' environment for a weavable process writing its buffers to
/// `bufs` (host started unless `host` is false).
fn weavable(cmd: &mut Command, bufs: &Path, host: bool) {
    let lib = runtime_dir();
    if host {
        cmd.env("BUNKAI_HOST", "1");
    }
    cmd.env("LD_PRELOAD", format!("{} {}", lib.join("libbunkai-host.so").display(), lib.join("libbunkai-flow.so").display()))
        .env("BUNKAI_FLOW_DIR", bufs)
        .env("BUNKAI_FLOW_IDS", bufs.join("ids"));
}

/// memcached in its daemon mode (`-d`, as its init script runs it): the
/// process started forks, the child carries on as the daemon, the parent
/// exits. Returns the launcher's pid and the daemon, once it listens.
fn start_daemon(exe: &Path, port: u16, dir: &Path, bufs: Option<&Path>) -> (u32, Daemon) {
    let pidfile = dir.join(format!("memcached.{port}.pid"));
    let mut cmd = Command::new(exe);
    cmd.args(["-d", "-P", pidfile.to_str().unwrap(), "-U", "0", "-l", "127.0.0.1", "-p", &port.to_string(), "-t", "1", "-m", "64", "-u", "root"]);
    if let Some(b) = bufs {
        weavable(&mut cmd, b, true);
    }
    let what = describe(&cmd);
    let child = cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let launcher = child.id();
    let out = finish_named(child, DEADLINE, &what);
    assert!(out.status.success(), "{what}: {out:?}");
    let mut pid = 0u32;
    wait_for(&format!("{what} writing {}", pidfile.display()), Duration::from_secs(20), || {
        pid = std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        pid != 0
    });
    kill_group_after(pid, DEADLINE, &what);
    let d = Daemon(pid);
    wait_for(&format!("{what} listening on {port}"), Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    (launcher, d)
}


/// bunkai with the buffers' directory set.
fn bunkai_in(bufs: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bunkai()).args(args).env("BUNKAI_FLOW_DIR", bufs).output_within(DEADLINE)
}

fn json_of(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// The buffer files in a directory, by pid.
fn buffer_pids(bufs: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(bufs)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("bunkai-flow.")?.strip_suffix(".buf")?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// Debian's memcached as its init script runs it, a daemon (`-d`): the
/// process the shell started forks and exits, and the daemon is the fork
/// child. It gets a host of its own, is woven by its pid (from -P), each
/// request is one flow in the daemon's own buffer (none in the launcher's),
/// and unwoven it answers byte for byte as the plain build's daemon. Killed,
/// `unweave` says it is gone; `report` then leaves its buffer out unless
/// --all, and `clean` removes it.
#[test]
fn a_daemonized_memcached_is_woven_in_its_daemon_process() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let (_, plain) = start_daemon(&memcached("plain"), port, d.path(), None);
    let want = mc_session(port);
    drop(plain);
    assert_eq!(want[6], "VALUE greeting 0 11\r\nhello world\r\nVALUE n 0 2\r\n42\r\nEND\r\n");

    let bufs = d.path().join("bufs");
    std::fs::create_dir(&bufs).unwrap();
    let port = free_port();
    let (launcher, daemon) = start_daemon(&memcached("flow"), port, d.path(), Some(&bufs));
    let pid = daemon.0;
    assert_ne!(pid, launcher, "memcached -d serves from a fork child");
    assert_eq!(mc_session(port), want, "flow cc build, daemon, nothing woven");
    let p = pid.to_string();
    let w = json_of(&bunkai_run(&["flow", "weave", "--json", "--pid", &p, aspect("memcached").to_str().unwrap()]));
    assert_eq!(w["pid"].as_u64(), Some(pid as u64), "{w}");
    let procs = w["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{w}");
    assert_eq!((procs[0]["pid"].as_u64(), procs[0]["how"].as_str()), (Some(pid as u64), Some("woven")), "{w}");
    assert!(w["sleds"].as_u64().unwrap() > 100, "{w}");
    assert_eq!(mc_session(port), want, "woven daemon");

    let rep = json_of(&bunkai_in(&bufs, &["flow", "report", "--json", "--pid", &p]));
    let flows = rep["flows"].as_array().unwrap();
    assert_eq!(flows.len(), MC_SESSION.len(), "one flow per request: {rep}");
    for (f, (req, _)) in flows.iter().zip(MC_SESSION) {
        let steps = f["steps"].as_array().unwrap();
        assert!(steps.iter().all(|s| s["pid"].as_u64() == Some(pid as u64)), "{req:?}: a step outside the daemon: {f}");
        let fns: Vec<&str> = steps.iter().map(|s| s["function"].as_str().unwrap()).collect();
        assert_eq!((fns[0], *fns.last().unwrap()), ("try_read_command_ascii", "resp_finish"), "{req:?}: {fns:?}");
        assert_eq!(f["maybe_cut_short"], false, "{f}");
    }
    assert_eq!(buffer_pids(&bufs), vec![pid], "only the daemon wrote records");
    let procs = rep["processes"].as_array().unwrap();
    assert_eq!((procs.len(), procs[0]["dropped"].as_u64()), (1, Some(0)), "{rep}");

    let u = json_of(&bunkai_run(&["flow", "unweave", "--json", "--pid", &p]));
    assert_eq!(u["processes"].as_array().unwrap().len(), 1, "{u}");
    assert_eq!(mc_session(port), want, "unwoven daemon answers byte for byte as the plain one");
    for round in 0..3 {
        bunkai_ok(&["flow", "weave", "--pid", &p, aspect("memcached").to_str().unwrap()]);
        assert_eq!(mc_session(port), want, "woven, round {round}");
        bunkai_ok(&["flow", "unweave", "--pid", &p]);
        assert_eq!(mc_session(port), want, "unwoven, round {round}");
    }

    // killed: what was woven went with it, and the messages say so
    Command::new("kill").args(["-KILL", &p]).output_within(DEADLINE);
    wait_for("the killed daemon to stop answering", Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    let (_, err) = bunkai_fails(&["flow", "unweave", "--pid", &p]);
    assert!(err.contains("went with it") && !err.contains("Connection refused") && err.lines().count() == 1, "{err}");
    // its buffer is an ended process's now: left out unless asked for
    wait_for("the killed daemon to end", Duration::from_secs(20), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.rsplit(')').next().unwrap().trim_start().starts_with('Z'))
    });
    let o = bunkai_in(&bufs, &["flow", "report"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("1 of ended processes") && err.contains("--all"), "{o:?}");
    let all = json_of(&bunkai_in(&bufs, &["flow", "report", "--json", "--all"]));
    assert_eq!(all["flows"].as_array().unwrap().len(), 4 * MC_SESSION.len(), "four weaves' flows: {all}");
    let c = json_of(&bunkai_in(&bufs, &["flow", "clean", "--json"]));
    assert_eq!(c["removed"].as_array().unwrap().len(), 1, "{c}");
    assert_eq!(c["removed"][0]["pid"].as_u64(), Some(pid as u64), "{c}");
    assert!(buffer_pids(&bufs).is_empty());
}

/// The messages of a process that cannot be woven: the host library
/// preloaded but BUNKAI_HOST=1 missing says exactly that (not "start it
/// with LD_PRELOAD", which it was); `weave --help` names BUNKAI_HOST; a
/// process killed (a zombie until its parent reaps it, its socket left
/// behind) is said to be gone, not "Connection refused".
#[test]
fn weave_names_what_is_missing_and_what_is_gone() {
    let d = tempfile::tempdir().unwrap();
    let help = String::from_utf8(bunkai_ok(&["flow", "weave", "--help"]).stdout).unwrap();
    assert!(help.contains("BUNKAI_HOST=1") && help.contains("descendants"), "{help}");

    for host in [false, true] {
        let port = free_port();
        let mut cmd = Command::new(memcached("flow"));
        cmd.args(["-U", "0", "-l", "127.0.0.1", "-p", &port.to_string(), "-t", "1", "-m", "64", "-u", "root"]);
        weavable(&mut cmd, d.path(), host);
        let mut srv = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        kill_after(&srv, DEADLINE, &describe(&cmd));
        wait_for("memcached listening", Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        let p = srv.id().to_string();
        if !host {
            let (_, err) = bunkai_fails(&["flow", "weave", "--pid", &p, aspect("memcached").to_str().unwrap()]);
            assert!(err.contains("BUNKAI_HOST=1 is not in its environment") && !err.contains("start the program with"), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            srv.kill().unwrap();
            srv.wait().unwrap();
            continue;
        }
        bunkai_ok(&["flow", "weave", "--pid", &p, aspect("memcached").to_str().unwrap()]);
        // killed and not reaped: a zombie whose socket nobody listens on
        srv.kill().unwrap();
        wait_for("the killed server to be a zombie", Duration::from_secs(20), || {
            std::fs::read_to_string(format!("/proc/{p}/stat")).map_or(true, |s| s.rsplit(')').next().unwrap().trim_start().starts_with('Z'))
        });
        let (_, err) = bunkai_fails(&["flow", "unweave", "--pid", &p]);
        assert!(err.contains(&format!("process {p} is gone")) && !err.contains("Connection refused"), "{err}");
        srv.wait().unwrap();
        let (_, err) = bunkai_fails(&["flow", "unweave", "--pid", &p]);
        assert!(err.contains(&format!("no process {p}")), "{err}");
    }
}

/// Debian's Apache (scripts/fetch-apache.sh, which `make test` runs),
/// httpd with the event MPM: the plain build and the `bunkai flow cc` build.
fn httpd(variant: &str) -> PathBuf {
    let p = root().join("build/third_party/apache2").join(format!("httpd-{variant}"));
    assert!(p.exists(), "{} is missing (run make fetch-apache)", p.display());
    p
}

/// One HTTP/1.0 GET, the whole response; its Date line taken out (the one
/// part that changes from one response to the next). A failure names the
/// request and shows the end of httpd's error log (`log`).
fn http_get(port: u16, path: &str, log: &Path) -> String {
    use std::io::{Read, Write};
    let fail = |e: std::io::Error| -> ! {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        panic!("GET {path} on port {port}: {e}; the end of {}:\n{}", log.display(), tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
    };
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| fail(e));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).unwrap_or_else(|e| fail(e));
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap_or_else(|e| fail(e));
    let text = String::from_utf8_lossy(&got).into_owned();
    text.split_inclusive("\r\n").filter(|l| !l.starts_with("Date: ")).collect()
}

/// The children of a process, from /proc (no zombies).
fn children(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/stat")).is_ok_and(|s| {
                let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
                f.len() > 1 && f[0] != "Z" && f[1] == pid.to_string()
            })
        })
        .collect();
    v.sort_unstable();
    v
}

/// Apache as it normally runs: `httpd` daemonizes, and its parent (root)
/// forks workers that drop to nobody; here each worker serves one
/// connection (MaxConnectionsPerChild 1), so every request after the first
/// two is served by a worker forked after the weave. `weave --pid PARENT`
/// weaves the parent and its workers; every request becomes one flow,
/// recorded in the buffer of the worker that served it, workers forked
/// later included (they inherit the woven code through fork, and write
/// buffers of their own); `unweave --pid PARENT` takes it out of the parent
/// and the workers it has, workers forked after it record nothing, and the
/// responses are byte for byte those of before the weave (less the Date).
/// ServerLimit is above MaxRequestWorkers: the event MPM keeps a worker's
/// scoreboard slot while the worker winds down, and with no slot to spare
/// it starts no new one ("scoreboard is full, not at MaxRequestWorkers"),
/// so a request waited until the read timed out (1 run in 8 here).
#[test]
fn apache_workers_forked_before_and_after_the_weave_are_followed() {
    use std::os::unix::fs::PermissionsExt;
    if !need_root("apache_workers_forked_before_and_after_the_weave_are_followed", "httpd dropping to nobody") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let t = d.path();
    // httpd's workers run as nobody: they write their buffers and logs here
    for sub in ["", "htdocs", "logs", "bufs"] {
        std::fs::create_dir_all(t.join(sub)).unwrap();
        std::fs::set_permissions(t.join(sub), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let page = t.join("htdocs/index.html");
    std::fs::write(&page, "<html><body>\n".to_string() + &"bunkai flow on Apache. ".repeat(170) + "\n</body></html>\n").unwrap();
    // an hour old: Apache gives a file changed within the last second a
    // weak ETag, and a strong one after
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&page).unwrap().set_modified(old).unwrap();
    let bufs = t.join("bufs");
    let errlog = t.join("logs/error_log");
    // httpd-VARIANT as a daemon on a fresh port; its parent's pid and port
    let start = |variant: &str, bufs: Option<&Path>| -> (Daemon, u32, u16) {
        let port = free_port();
        let conf = t.join(format!("httpd-{variant}.conf"));
        let root_dir = t.display();
        std::fs::write(
            &conf,
            format!(
                "ServerRoot {root_dir}\nListen 127.0.0.1:{port}\nServerName localhost\nUser nobody\nGroup nogroup\n\
                 PidFile {root_dir}/logs/httpd-{variant}.pid\nErrorLog {root_dir}/logs/error_log\nLogLevel warn\n\
                 DocumentRoot {root_dir}/htdocs\n<Directory {root_dir}/htdocs>\n  Require all granted\n</Directory>\n\
                 TypesConfig /dev/null\nAddType text/html .html\nDirectoryIndex index.html\nKeepAlive Off\n\
                 StartServers 2\nServerLimit 8\nThreadLimit 1\nThreadsPerChild 1\nMinSpareThreads 1\nMaxSpareThreads 2\n\
                 MaxRequestWorkers 2\nMaxConnectionsPerChild 1\n"
            ),
        )
        .unwrap();
        let mut cmd = Command::new(httpd(variant));
        cmd.args(["-f", conf.to_str().unwrap()]);
        if let Some(b) = bufs {
            weavable(&mut cmd, b, true);
        }
        let what = describe(&cmd);
        let out = cmd.output_within(DEADLINE);
        assert!(out.status.success(), "{what}: {out:?}");
        let pidfile = t.join(format!("logs/httpd-{variant}.pid"));
        let mut parent = 0u32;
        wait_for("httpd writing its pid file", Duration::from_secs(20), || {
            parent = std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
            parent != 0
        });
        kill_group_after(parent, DEADLINE, &what);
        let guard = Daemon(parent); // from here on, a failure kills the group
        // its two workers (the parent listens before it forks them; a
        // probing connection would use one up), each with a host of its
        // own when weavable (made at fork, before they dropped to nobody)
        wait_for("httpd's two workers", Duration::from_secs(30), || {
            let c = children(parent);
            c.len() == 2 && (bufs.is_none() || c.iter().all(|p| bunkai_mod::proto::default_socket(*p).exists()))
        });
        (guard, parent, port)
    };
    // what the plain build answers
    let (plain, _, port) = start("plain", None);
    let want = http_get(port, "/index.html", &errlog);
    assert!(want.starts_with("HTTP/1.1 200 OK\r\n") && want.contains("bunkai flow on Apache."), "{want}");
    let want404 = http_get(port, "/missing.html", &errlog);
    assert!(want404.starts_with("HTTP/1.1 404 "), "{want404}");
    let plain_pid = plain.0;
    drop(plain);
    wait_for("the plain httpd and its workers to end", Duration::from_secs(30), || group(plain_pid).is_empty());
    let (_httpd, parent, port) = start("flow", Some(&bufs));

    let p = parent.to_string();
    let w = json_of(&bunkai_run(&["flow", "weave", "--json", "--pid", &p, aspect("apache-every").to_str().unwrap()]));
    let procs = w["processes"].as_array().unwrap();
    assert_eq!(procs[0]["pid"].as_u64(), Some(parent as u64), "{w}");
    assert!(procs.len() >= 2, "the workers were not woven: {w}");
    assert!(procs[1..].iter().all(|x| x["parent"].as_u64() == Some(parent as u64)), "{w}");
    assert!(w["skipped"].as_array().unwrap().is_empty(), "{w}");
    let woven: Vec<u64> = procs.iter().map(|x| x["pid"].as_u64().unwrap()).collect();

    const N: usize = 6;
    for k in 0..N {
        assert_eq!(http_get(port, "/index.html", &errlog), want, "woven, request {k}");
    }
    let rep = json_of(&bunkai_in(&bufs, &["flow", "report", "--json", "--all"]));
    let flows = rep["flows"].as_array().unwrap();
    assert_eq!(flows.len(), N, "one flow per request: {rep}");
    let mut served: Vec<u64> = Vec::new();
    for f in flows {
        let steps = f["steps"].as_array().unwrap();
        let pid = steps[0]["pid"].as_u64().unwrap();
        assert!(steps.iter().all(|s| s["pid"].as_u64() == Some(pid)), "a request's flow in two processes: {f}");
        let fns: Vec<&str> = steps.iter().map(|s| s["function"].as_str().unwrap()).collect();
        assert!(fns[0] == "ap_read_request" && fns.contains(&"default_handler") && fns.contains(&"ap_http_header_filter") && steps.len() > 100, "{fns:?}");
        assert_ne!(pid, parent as u64, "the parent serves no request");
        served.push(pid);
    }
    served.sort_unstable();
    served.dedup();
    assert_eq!(served.len(), N, "one connection a worker: {served:?}");
    // every worker wrote its own buffer, and those forked after the weave
    // had the aspect
    let later: Vec<u64> = served.iter().copied().filter(|p| !woven.contains(p)).collect();
    assert!(later.len() >= N - 2, "workers forked after the weave followed no request: served by {served:?}, woven {woven:?}");
    let files: Vec<u64> = buffer_pids(&bufs).into_iter().map(u64::from).collect();
    assert_eq!(files, served, "a buffer per worker that served, none of the parent's");

    let u = json_of(&bunkai_run(&["flow", "unweave", "--json", "--pid", &p]));
    let up: Vec<u64> = u["processes"].as_array().unwrap().iter().map(|x| x["pid"].as_u64().unwrap()).collect();
    assert_eq!(up[0], parent as u64, "{u}");
    // the workers it had lost it too (listed), and those it forks now have
    // nothing woven
    let module = w["woven"].as_str().unwrap();
    wait_for("httpd's workers after the unweave", Duration::from_secs(30), || {
        let c = children(parent);
        !c.is_empty() && c.iter().all(|p| bunkai_mod::proto::default_socket(*p).exists())
    });
    for c in children(parent) {
        let l = bunkai_run(&["mod", "list", "--pid", &c.to_string()]);
        if l.status.success() {
            // (a worker that exited meanwhile cannot be asked)
            assert!(!String::from_utf8_lossy(&l.stdout).contains(module), "worker {c} still has {module}: {u}");
        }
    }
    for k in 0..N {
        assert_eq!(http_get(port, "/index.html", &errlog), want, "unwoven, request {k}");
    }
    assert_eq!(http_get(port, "/missing.html", &errlog), want404, "unwoven, 404");
    let after = json_of(&bunkai_in(&bufs, &["flow", "report", "--json", "--all"]));
    assert_eq!(after["flows"].as_array().unwrap().len(), N, "workers forked after the unweave recorded: {after}");
    // stopped as its init script would: the parent and every worker end
    Command::new("kill").args(["-TERM", &p]).output_within(DEADLINE);
    wait_for("httpd and its workers to end", Duration::from_secs(30), || group(parent).is_empty());
}

/// The live processes of process group pgid (zombies left out).
fn group(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/stat")).is_ok_and(|s| {
                let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
                f.len() > 3 && f[0] != "Z" && f[3] == pgid.to_string()
            })
        })
        .collect()
}
