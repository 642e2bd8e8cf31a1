//! End-to-end tests of libbunkai-host against hostile clients and modules
//! (issue 20: "the host must survive any module and any client"). A small
//! host program built here calls the interface `answer` (`int value(void)`)
//! on every line it reads and prints what it got; a module answering 42 is
//! loaded through the real CLI, and then clients speak the wire protocol
//! directly (mod/include/bunkai_mod.h): COMMITs with code pointers outside
//! the module, tables of the wrong length, records that are not JSON,
//! silent connections, a memfd kept writable, and thousands of mutated
//! messages. After each the host must have refused in one line, still
//! answer, and the module must still return 42.
//!
//! One file (about 1,000 lines) on purpose: every attack runs against the
//! same host fixture and protocol client, built once per binary.

use bunkai_e2e::*;
use bunkai_mod::proto::{In, Msg, Out};
use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const HOST_C: &str = r#"#include "bunkai_mod.h"
#include <stdio.h>
#define ANSWER(X) X(int, value, (void))
BUNKAI_INTERFACE(answer, ANSWER)
int main(int argc, char **argv) {
  BUNKAI_EXPECT(answer);
  if (bunkai_host_start(argc > 1 ? argv[1] : NULL))
    return 2;
  printf("socket %s\n", bunkai_host_socket());
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    struct bunkai_guard g;
    const struct answer_ops *a = BUNKAI_ACQUIRE(answer, &g);
    if (a)
      printf("value %d\n", a->value());
    else
      printf("value none\n");
    bunkai_release(&g);
    fflush(stdout);
  }
  return 0;
}
"#;

const ANSWER42: &str = r#"#include "bunkai_mod.h"
#define ANSWER(X) X(int, value, (void))
BUNKAI_INTERFACE(answer, ANSWER)
static int v(void) { return 42; }
BUNKAI_MODULE("answer42", "1");
BUNKAI_IMPLEMENTS(answer, ANSWER, v);
"#;

fn lib_dir() -> PathBuf {
    let d = root().join("build/lib/bunkai");
    assert!(d.join("libbunkai-host.a").exists(), "{} missing: run make", d.display());
    d
}

fn clang(args: &[&str], what: &str) {
    let st = Command::new("clang-14").args(args).output_within(DEADLINE);
    assert!(st.status.success(), "clang-14 failed on {what}: {}", String::from_utf8_lossy(&st.stderr));
}

/// The test host, built once per test in `dir`.
fn build_host(dir: &Path) -> PathBuf {
    let c = dir.join("answer-host.c");
    std::fs::write(&c, HOST_C).unwrap();
    let exe = dir.join("answer-host");
    let inc = format!("-I{}", root().join("mod/include").display());
    let lib = lib_dir().join("libbunkai-host.a");
    clang(
        &["-O1", &inc, c.to_str().unwrap(), lib.to_str().unwrap(), "-lpthread", "-ldl", "-o", exe.to_str().unwrap()],
        "the test host",
    );
    exe
}

fn compile_module(src: &str, name: &str, dir: &Path) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let o = dir.join(format!("{name}.o"));
    let inc = format!("-I{}", root().join("mod/include").display());
    clang(&["-c", "-O2", &inc, "-o", o.to_str().unwrap(), c.to_str().unwrap()], name);
    o
}

struct Host {
    child: Child,
    socket: PathBuf,
    lines: Receiver<String>,
    stdin: std::process::ChildStdin,
    dir: tempfile::TempDir,
}

impl Host {
    /// A test host listening on a socket in a fresh private directory,
    /// with answer42 loaded through the CLI.
    fn start() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let exe = build_host(dir.path());
        let socket = dir.path().join("host.sock");
        let mut child = Command::new(&exe)
            .arg(&socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the test host");
        kill_after(&child, DEADLINE, "answer-host");
        let stdin = child.stdin.take().unwrap();
        let rx = stdout_lines(&mut child);
        let mut h = Host { child, socket, lines: rx, stdin, dir };
        let l = h.line();
        assert!(l.starts_with("socket "), "{l}");
        let m = compile_module(ANSWER42, "answer42", h.dir.path());
        bunkai_ok(&["mod", "load", "--socket", h.sock(), m.to_str().unwrap()]);
        assert_eq!(h.call(), "42");
        h
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the test host printed nothing within 30 s (dead or stuck)"))
    }

    /// What the host's call of answer.value() returns now ("none": no
    /// provider).
    fn call(&mut self) -> String {
        self.alive();
        writeln!(self.stdin, "call").expect("the test host is gone");
        self.stdin.flush().unwrap();
        let l = self.line();
        l.strip_prefix("value ").unwrap_or_else(|| panic!("unexpected line {l}")).to_string()
    }

    fn alive(&mut self) {
        if let Some(st) = self.child.try_wait().unwrap() {
            panic!("the host died: {st}");
        }
    }

    fn sock(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    fn list(&self) -> serde_json::Value {
        let o = bunkai_ok(&["mod", "list", "--socket", self.sock(), "--json"]);
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.list()["modules"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["record"]["name"].as_str().map(String::from))
            .collect();
        v.sort();
        v
    }

    /// The host is as it was with only answer42 loaded, and answers.
    fn unharmed(&mut self, after: &str) {
        self.alive();
        assert_eq!(self.names(), ["answer42"], "modules changed after {after}");
        assert_eq!(self.call(), "42", "answer42 changed after {after}");
    }

    fn raw(&self) -> Raw {
        Raw::connect(&self.socket)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
enum Reply {
    Ok(Vec<u8>),
    Err(String),
    Closed,
}

impl Reply {
    fn ok(self, what: &str) -> Vec<u8> {
        match self {
            Reply::Ok(b) => b,
            r => panic!("{what}: {r:?}"),
        }
    }
    /// A refusal: one line.
    fn refusal(self, what: &str) -> String {
        match self {
            Reply::Err(e) => {
                assert!(!e.is_empty() && !e.contains('\n') && e.len() < 600, "{what}: not one line: {e:?}");
                e
            }
            r => panic!("{what}: accepted, or no answer: {r:?}"),
        }
    }
}

/// A client speaking the host's wire protocol directly.
struct Raw {
    s: UnixStream,
}

fn frame(t: u32, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + body.len());
    v.extend_from_slice(&((4 + body.len()) as u32).to_le_bytes());
    v.extend_from_slice(&t.to_le_bytes());
    v.extend_from_slice(body);
    v
}

impl Raw {
    fn connect(p: &Path) -> Raw {
        let s = UnixStream::connect(p).expect("connect to the host");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        Raw { s }
    }

    fn reply(&mut self) -> Reply {
        let mut h = [0u8; 8];
        if let Err(e) = self.s.read_exact(&mut h) {
            assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "the host did not answer within 30 s");
            return Reply::Closed;
        }
        let len = u32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
        let ty = u32::from_le_bytes(h[4..].try_into().unwrap());
        assert!((4..1 << 24).contains(&len), "the host sent a frame of {len} bytes");
        let mut b = vec![0u8; len - 4];
        self.s.read_exact(&mut b).expect("the host sent half a reply");
        match ty {
            100 => Reply::Ok(b),
            101 => Reply::Err(In::new(&b).string().expect("an ERR carries a string")),
            t => panic!("the host sent reply type {t}"),
        }
    }

    fn call(&mut self, t: Msg, body: &Out) -> Reply {
        if self.s.write_all(&frame(t as u32, &body.0)).is_err() {
            return Reply::Closed;
        }
        self.reply()
    }

    /// (bytes in use) from HELLO.
    fn used(&mut self) -> u64 {
        let b = self.call(Msg::Hello, &Out::default()).ok("HELLO");
        let mut r = In::new(&b);
        r.u32().unwrap();
        r.u32().unwrap();
        r.u64().unwrap();
        r.u64().unwrap()
    }

    fn resolve(&mut self, name: &str) -> u64 {
        let b = self.call(Msg::Resolve, Out::default().u32(1).str(name)).ok("RESOLVE");
        In::new(&b).u64().unwrap()
    }

    /// Stages a module whose code is `code` followed by `ret`s up to the
    /// page (every entry point in it returns), RX made r-x with PROTECT.
    /// Returns (rx, rw).
    fn stage(&mut self, code: &[u8]) -> (u64, u64) {
        let b = self.call(Msg::Alloc, Out::default().u64(code.len() as u64).u64(64)).ok("ALLOC");
        let mut r = In::new(&b);
        let (rx, rw) = (r.u64().unwrap(), r.u64().unwrap());
        let mut page = vec![0xc3u8; (rw - rx) as usize];
        page[..code.len()].copy_from_slice(code);
        self.call(Msg::Write, Out::default().u64(rx).bytes(&page)).ok("WRITE");
        self.call(Msg::Protect, Out::default().u64(rx)).ok("PROTECT");
        (rx, rw)
    }
}

/// `mov eax, v; ret`
fn ret_value(v: i32) -> Vec<u8> {
    let mut c = vec![0xb8];
    c.extend_from_slice(&v.to_le_bytes());
    c.push(0xc3);
    c
}

/// What a COMMIT says.
#[derive(Clone)]
struct Commit {
    replace: u32,
    blob: Vec<u8>,
    rx: u64,
    rw: u64,
    init: u64,
    exit: u64,
    regs: Vec<(Vec<u8>, Vec<(Vec<u8>, u64)>)>,
    name: Vec<u8>,
    deps: Vec<Vec<u8>>,
    trailing: Vec<u8>,
}

impl Commit {
    /// A correct COMMIT of module `name` implementing `iface` with one
    /// function at the start of the staged code.
    fn new(name: &str, iface: &str, rx: u64, rw: u64) -> Commit {
        Commit {
            replace: 0,
            blob: format!(r#"{{"name":"{name}","made":"by a test"}}"#).into_bytes(),
            rx,
            rw,
            init: 0,
            exit: 0,
            regs: vec![(iface.as_bytes().to_vec(), vec![(b"value".to_vec(), rx)])],
            name: name.as_bytes().to_vec(),
            deps: vec![],
            trailing: vec![],
        }
    }

    fn body(&self) -> Out {
        let mut o = Out::default();
        o.u32(self.replace).bytes(&self.blob).u64(self.rx).u64(self.rw).u64(self.init).u64(self.exit);
        o.u32(self.regs.len() as u32);
        for (iface, fns) in &self.regs {
            o.bytes(iface).u32(fns.len() as u32);
            for (n, a) in fns {
                o.bytes(n).u64(*a);
            }
        }
        o.bytes(&self.name).u32(self.deps.len() as u32);
        for d in &self.deps {
            o.bytes(d);
        }
        o.0.extend_from_slice(&self.trailing);
        o
    }
}

/// Checks a refused COMMIT: one line naming `want`; the staged memory was
/// unmapped at once (HELLO's bytes in use, in the same connection); the
/// host keeps running with answer42 unchanged.
fn refused_commit(h: &mut Host, what: &str, code: &[u8], edit: impl Fn(&mut Commit, &mut Raw), want: &[&str]) {
    let mut r = h.raw();
    let before = r.used();
    let (rx, rw) = r.stage(code);
    assert!(r.used() > before);
    let mut c = Commit::new("evil", "answer", rx, rw);
    edit(&mut c, &mut r);
    let e = r.call(Msg::Commit, &c.body()).refusal(what);
    for w in want {
        assert!(e.contains(w), "{what}: the refusal does not say {w:?}: {e}");
    }
    assert_eq!(r.used(), before, "{what}: the refused module's memory is still mapped");
    drop(r);
    h.unharmed(what);
}

#[test]
fn commits_pointing_outside_their_module_are_refused_and_the_host_keeps_running() {
    let mut h = Host::start();
    let code = ret_value(7);
    refused_commit(&mut h, "init at 0x100000", &code, |c, _| c.init = 0x100000, &["init", "0x100000", "outside"]);
    refused_commit(&mut h, "init at libc's abort", &code, |c, r| c.init = r.resolve("abort"), &["init", "outside"]);
    refused_commit(&mut h, "exit in the data part", &code, |c, _| c.exit = c.rw + 8, &["exit", "outside"]);
    refused_commit(&mut h, "a function past the code", &code, |c, _| c.regs[0].1[0].1 = c.rw, &["answer.value", "outside"]);
    refused_commit(&mut h, "a function at abort", &code, |c, r| c.regs[0].1[0].1 = r.resolve("abort"), &["outside"]);
    refused_commit(&mut h, "a NUL in the interface name", &code, |c, _| c.regs[0].0 = b"answer\0xx".to_vec(), &["NUL"]);
    refused_commit(&mut h, "a 300-byte interface name", &code, |c, _| c.regs[0].0 = vec![b'a'; 300], &["longer than 255"]);
    refused_commit(&mut h, "an empty module name", &code, |c, _| c.name.clear(), &["empty"]);
    refused_commit(&mut h, "a NUL in a function name", &code, |c, _| c.regs[0].1[0].0 = b"va\0lue".to_vec(), &["NUL"]);
    refused_commit(
        &mut h,
        "a table longer than the interface",
        &code,
        |c, _| {
            let f = c.regs[0].1[0].clone();
            c.regs[0].1.push(f);
        },
        &["answer", "1 functions", "has 2"],
    );
    refused_commit(&mut h, "an empty table", &code, |c, _| c.regs[0].1.clear(), &["answer"]);
    refused_commit(
        &mut h,
        "the same interface twice",
        &code,
        |c, _| {
            c.regs[0].0 = b"other".to_vec();
            let r = c.regs[0].clone();
            c.regs.push(r);
        },
        &["twice"],
    );
    refused_commit(&mut h, "a needed module that is not loaded", &code, |c, _| c.deps = vec![b"nosuch".to_vec()], &["nosuch", "not loaded"]);
    refused_commit(&mut h, "a second answer42", &code, |c, _| c.name = b"answer42".to_vec(), &["already loaded"]);
    refused_commit(&mut h, "bytes after the message", &code, |c, _| c.trailing = vec![0; 5], &["5 bytes after the end"]);

    // A correct COMMIT of the same kind is accepted (the refusals above are
    // about what they name), takes the interface over, and goes again.
    let mut r = h.raw();
    let (rx, rw) = r.stage(&code);
    let b = r.call(Msg::Commit, &Commit::new("seven", "answer", rx, rw).body()).ok("a correct COMMIT");
    let id = In::new(&b).u32().unwrap();
    drop(r);
    assert_eq!(h.call(), "7");
    h.raw().call(Msg::Unload, Out::default().u32(id)).ok("UNLOAD seven");
    h.unharmed("seven came and went");
}

#[test]
fn modules_that_others_need_are_not_unloaded_by_id_nor_evicted() {
    let mut h = Host::start();
    let sched = root().join("build/lib/bunkai/examples/sched");
    let sd = sched.to_str().unwrap();
    bunkai_ok(&["mod", "load", "--socket", h.sock(), "-L", sd, &format!("{sd}/edf.o")]);
    let ids: std::collections::HashMap<String, u32> = h.list()["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["record"]["name"].as_str().unwrap().to_string(), m["id"].as_u64().unwrap() as u32))
        .collect();
    let util = ids["sched-util"];
    let e = h.raw().call(Msg::Unload, Out::default().u32(util)).refusal("UNLOAD by id of a needed module");
    assert!(e.contains("sched-util") && e.contains("edf") && e.contains("unload them first"), "{e}");
    let e = h.raw().call(Msg::Evict, Out::default().u32(util)).refusal("EVICT of a needed module");
    assert!(e.contains("edf"), "{e}");
    let e = h.raw().call(Msg::UnloadName, Out::default().str("sched-util")).ok("UNLOAD_NAME");
    assert_eq!(In::new(&e).u32().unwrap(), 2, "UNLOAD_NAME of a needed module must be refused");
    let (_, err) = bunkai_fails(&["mod", "unload", "--socket", h.sock(), "sched-util"]);
    assert!(err.contains("edf") && err.lines().count() == 1, "{err}");
    let mut names = h.names();
    names.sort();
    assert_eq!(names, ["answer42", "edf", "sched-util"]);
    assert_eq!(h.call(), "42");
    // The dependent first, then the module it needed: both go.
    h.raw().call(Msg::Unload, Out::default().u32(ids["edf"])).ok("UNLOAD edf");
    h.raw().call(Msg::Unload, Out::default().u32(util)).ok("UNLOAD sched-util");
    h.unharmed("unloading edf then sched-util");
}

#[test]
fn a_record_that_is_not_json_is_refused_and_an_unreadable_one_breaks_nothing() {
    let mut h = Host::start();
    let code = ret_value(5);
    for (what, blob) in [
        ("a record that is not JSON", &b"{\"name\": \"x\", oops"[..]),
        ("a record that is not an object", b"[1, 2]"),
        ("a record with bytes after it", b"{} trailing"),
        ("a record with a NUL", b"{\"a\":\"\0\"}"),
        ("a record that is not UTF-8", b"{\"a\":\"\xff\"}"),
    ] {
        refused_commit(&mut h, what, &code, |c, _| c.blob = blob.to_vec(), &["record"]);
    }

    // JSON, but not a record this bunkai can read: the host takes it (it
    // checks what it relies on itself); list, load and unload still work.
    let mut r = h.raw();
    let (rx, rw) = r.stage(&code);
    let mut c = Commit::new("odd", "odd_iface", rx, rw);
    c.blob = br#"{"name": 12, "what": ["not", "a", "record"]}"#.to_vec();
    r.call(Msg::Commit, &c.body()).ok("a JSON record of another shape");
    drop(r);
    let v = h.list();
    let mods = v["modules"].as_array().unwrap();
    assert_eq!(mods.len(), 2, "{v}");
    assert!(mods.iter().any(|m| m["record"]["name"] == "answer42"), "{v}");
    assert!(mods.iter().any(|m| m["record"].is_null() && m["unreadable"].is_string()), "{v}");
    let o = bunkai_ok(&["mod", "list", "--socket", h.sock()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("answer42") && text.contains("record unreadable"), "{text}");
    let sched = root().join("build/lib/bunkai/examples/sched");
    bunkai_ok(&["mod", "load", "--socket", h.sock(), sched.join("fifo.o").to_str().unwrap()]);
    assert_eq!(h.names(), ["answer42", "fifo"]);
    bunkai_ok(&["mod", "unload", "--socket", h.sock(), "fifo"]);
    bunkai_ok(&["mod", "unload", "--socket", h.sock(), "odd"]);
    h.unharmed("an unreadable record came and went");
}

#[test]
fn a_client_that_sends_nothing_does_not_stop_the_host() {
    let mut h = Host::start();
    // Connected and silent; another connected and gone half-way through a
    // message header.
    let silent = UnixStream::connect(&h.socket).unwrap();
    let mut half = UnixStream::connect(&h.socket).unwrap();
    half.write_all(&[9, 0]).unwrap();
    let t = Instant::now();
    let o = Command::new(bunkai()).args(["mod", "list", "--socket", h.sock()]).output_within(Duration::from_secs(60));
    let took = t.elapsed();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("answer42"));
    // The half message holds the host up to its read timeout (10 s), no more.
    assert!(took < Duration::from_secs(15), "bunkai mod list took {took:?} behind silent clients");
    // Both are closed by the host, not kept for ever.
    for (mut s, what) in [(silent, "the silent client"), (half, "the half message")] {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut b = Vec::new();
        match s.read_to_end(&mut b) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("{what} was not closed by the host within 30 s: {e}"),
        }
    }
    // Twenty silent ones at once: a list still answers at once.
    let many: Vec<UnixStream> = (0..20).map(|_| UnixStream::connect(&h.socket).unwrap()).collect();
    let t = Instant::now();
    bunkai_ok(&["mod", "list", "--socket", h.sock()]);
    assert!(t.elapsed() < Duration::from_secs(5), "list took {:?} behind 20 silent clients", t.elapsed());
    drop(many);
    h.unharmed("silent clients");
}

#[test]
fn a_memfd_kept_writable_by_its_sender_cannot_change_loaded_code() {
    use bunkai_mod::memfd::{send_with_fd, MemImage};
    let mut h = Host::start();
    let mut r = h.raw();
    let b = r.call(Msg::Alloc, Out::default().u64(6).u64(0)).ok("ALLOC");
    let mut rd = In::new(&b);
    let (rx, rw) = (rd.u64().unwrap(), rd.u64().unwrap());
    let len = (rw - rx) as usize;
    // The image, written through a shared mapping the client keeps.
    let mut img = MemImage::new("evil", len, len).unwrap();
    img.split(len).0[..6].copy_from_slice(&ret_value(43));
    send_with_fd(r.s.as_raw_fd(), &frame(Msg::Map as u32, &Out::default().u64(rx).u64(len as u64).0), img.fd()).unwrap();
    match r.reply() {
        Reply::Err(e) => {
            assert!(!e.contains('\n'), "{e}");
            assert!(e.contains("mapped writable"), "{e}");
        }
        other => {
            // (the old host) it mapped it: then the code must not change.
            assert!(matches!(other, Reply::Ok(_)), "{other:?}");
            r.call(Msg::Commit, &Commit::new("evil", "answer", rx, rw).body()).ok("COMMIT");
            drop(r);
            assert_eq!(h.call(), "43");
            img.split(len).0[..6].copy_from_slice(&ret_value(1337));
            let v = h.call();
            assert_ne!(v, "1337", "loaded code was changed through the sender's mapping");
            panic!("the host mapped a memfd its sender can still write");
        }
    }
    // Sealed properly (our mapping gone first), the same image loads, and
    // nobody can write it any more.
    let mut img = MemImage::new("good", len, len).unwrap();
    img.split(len).0[..6].copy_from_slice(&ret_value(43));
    img.seal().unwrap();
    send_with_fd(r.s.as_raw_fd(), &frame(Msg::Map as u32, &Out::default().u64(rx).u64(len as u64).0), img.fd()).unwrap();
    r.reply().ok("MAP of a sealed memfd");
    let b = r.call(Msg::Commit, &Commit::new("good", "answer", rx, rw).body()).ok("COMMIT");
    let id = In::new(&b).u32().unwrap();
    drop(r);
    assert_eq!(h.call(), "43");
    {
        use std::os::fd::{FromRawFd, OwnedFd};
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(libc_dup(img.fd())) });
        assert!(f.write_at(&ret_value(1337), 0).is_err(), "a sealed memfd was written");
    }
    assert_eq!(h.call(), "43");
    h.raw().call(Msg::Unload, Out::default().u32(id)).ok("UNLOAD good");

    // The CLI's own loads are still zero-copy (it seals after unmapping).
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", h.child.id())).unwrap();
    assert!(maps.contains("/memfd:bunkai-mod:answer42"), "answer42 was not mapped from a memfd:\n{maps}");
    h.unharmed("a memfd kept writable");
}

extern "C" {
    fn dup(fd: i32) -> i32;
}

fn libc_dup(fd: i32) -> i32 {
    let d = unsafe { dup(fd) };
    assert!(d >= 0);
    d
}


/// A listener that is not a bunkai host: it reports how many bytes each
/// connection brought ("got N"), in the order they came.
const FAKE_C: &str = r#"#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
int main(int argc, char **argv) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
  unlink(argv[1]);
  if (argc < 2 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16)) {
    perror("fake host");
    return 1;
  }
  chmod(argv[1], 0777);
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    int c = accept(fd, NULL, NULL);
    if (c < 0)
      return 1;
    struct timeval tv = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    long total = 0;
    char buf[4096];
    ssize_t n;
    while ((n = read(c, buf, sizeof buf)) > 0)
      total += n;
    printf("got %ld\n", total);
    fflush(stdout);
    close(c);
  }
}
"#;

extern "C" {
    fn chown(path: *const std::ffi::c_char, uid: u32, gid: u32) -> i32;
}

fn chown_to(p: &Path, uid: u32) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { chown(c.as_ptr(), uid, uid) }, 0, "chown {}", p.display());
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Another local user pre-creates the socket directory, or puts a fake
/// host's socket where ours would be: the CLI refuses in one line before
/// it sends anything (the fake receives nothing), and a host refuses to
/// start in such a directory.
#[test]
fn a_socket_directory_or_a_host_of_another_user_is_refused() {
    if !need_root("a_socket_directory_or_a_host_of_another_user_is_refused", "acting as another user (nobody)") {
        return;
    }
    const NOBODY: u32 = 65534;
    // The fake host runs as nobody, from a directory nobody owns.
    let theirs = tempfile::Builder::new().prefix("bunkai-fake-").tempdir_in("/tmp").unwrap();
    chmod(theirs.path(), 0o755);
    let fake_c = theirs.path().join("fake.c");
    std::fs::write(&fake_c, FAKE_C).unwrap();
    let fake_exe = theirs.path().join("fake");
    clang(&["-O1", fake_c.to_str().unwrap(), "-o", fake_exe.to_str().unwrap()], "the fake host");
    chown_to(theirs.path(), NOBODY);
    let fake_sock = theirs.path().join("fake.sock");
    let fake = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&fake_exe)
        .arg(&fake_sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("setpriv (util-linux)");
    kill_after(&fake, DEADLINE, "the fake host");
    let mut fake = KillOnDrop(fake);
    let lines = stdout_lines(&mut fake.0);
    let next = || lines.recv_timeout(Duration::from_secs(30)).expect("the fake host said nothing within 30 s");
    assert_eq!(next(), "ready");
    let pid = fake.0.id();

    // Our runtime directory (as systemd makes it: ours, 0700).
    let ours = tempfile::tempdir().unwrap();
    let xdg = ours.path();
    chmod(xdg, 0o700);
    let dir = xdg.join("bunkai-mod");
    let in_dir = dir.join(format!("{pid}.sock"));
    let host_exe = build_host(xdg);
    let m = compile_module(ANSWER42, "answer42", xdg);
    let cli = |args: &[&str]| {
        Command::new(bunkai())
            .env("XDG_RUNTIME_DIR", xdg)
            .env_remove("BUNKAI_HOST_SOCKET")
            .args(args)
            .output_within(Duration::from_secs(60))
    };
    let refused = |args: &[&str], want: &[&str]| {
        let o = cli(args);
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "bunkai {args:?} was not refused: {e}");
        assert!(e.starts_with("bunkai mod: ") && e.lines().count() == 1, "{e}");
        for w in want {
            assert!(e.contains(w), "bunkai {args:?}: {e} does not say {w:?}");
        }
    };
    let host_refuses = |want: &str| {
        let o = Command::new(&host_exe)
            .env("XDG_RUNTIME_DIR", xdg)
            .env_remove("BUNKAI_HOST_SOCKET")
            .output_within(Duration::from_secs(60));
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "a host started in a directory that is not ours alone: {e}");
        assert!(e.starts_with("bunkai mod: ") && e.lines().count() == 1 && e.contains(want), "{e}");
    };
    let pid_s = pid.to_string();
    let every = |want: &[&str]| {
        refused(&["mod", "list"], want);
        refused(&["mod", "list", "--pid", &pid_s], want);
        refused(&["mod", "load", "--pid", &pid_s, m.to_str().unwrap()], want);
    };

    // 1. The directory belongs to nobody, with the fake socket in it.
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o700);
    std::fs::rename(&fake_sock, &in_dir).unwrap();
    chown_to(&dir, NOBODY);
    every(&["belongs to uid 65534"]);
    host_refuses("belongs to uid 65534");
    // 2. Ours, but open to everyone.
    chown_to(&dir, 0);
    chmod(&dir, 0o777);
    every(&["mode 0777", "chmod 700"]);
    host_refuses("mode 0777");
    // 3. A symbolic link to a directory of ours.
    chmod(&dir, 0o700);
    let real = xdg.join("real");
    std::fs::rename(&dir, &real).unwrap();
    std::os::unix::fs::symlink(&real, &dir).unwrap();
    every(&["symbolic link"]);
    host_refuses("symbolic link");
    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&real, &dir).unwrap();
    // 4. The directory is right, but the process listening is nobody's.
    every(&["runs as uid 65534", "nothing was sent"]);
    refused(&["mod", "list", "--socket", in_dir.to_str().unwrap()], &["runs as uid 65534"]);

    // The fake host received nothing: every connection it had brought 0
    // bytes (ours, last, brings 8: all before it are done by then).
    let mut probe = UnixStream::connect(&in_dir).unwrap();
    probe.write_all(b"sentinel").unwrap();
    drop(probe);
    let mut got = Vec::new();
    loop {
        let l = next();
        if l == "got 8" {
            break;
        }
        got.push(l);
    }
    drop(fake);
    assert!(!got.is_empty(), "the CLI never reached the fake host in case 4 (the test did not test SO_PEERCRED)");
    assert!(got.iter().all(|l| l == "got 0"), "the fake host received bytes: {got:?}");

    // And our own host, started in the same environment, uses
    // $XDG_RUNTIME_DIR/bunkai-mod and is reached there.
    std::fs::remove_file(&in_dir).unwrap();
    let host = Command::new(&host_exe)
        .env("XDG_RUNTIME_DIR", xdg)
        .env_remove("BUNKAI_HOST_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    kill_after(&host, DEADLINE, "answer-host");
    let mut host = KillOnDrop(host);
    let mut first = String::new();
    std::io::BufReader::new(host.0.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let want = dir.join(format!("{}.sock", host.0.id()));
    assert_eq!(first.trim(), format!("socket {}", want.display()));
    let o = cli(&["mod", "load", "--pid", &host.0.id().to_string(), m.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = cli(&["mod", "list"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("answer42"), "{}", String::from_utf8_lossy(&o.stderr));
    drop(host);
}

/// A child killed when the test ends, passed or failed (kill_after's
/// thread dies with the test process).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The fuzzers' generator (xorshift64*, bunkai_mod::fuzz::Rng), with
/// 64-bit bounds.
struct Rng(bunkai_mod::fuzz::Rng);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One mutation of a byte stream: a bit flipped, a byte or a 32-bit word
/// set to an interesting value, bytes cut off, inserted or removed.
fn mutate(rng: &mut Rng, b: &mut Vec<u8>) {
    let n = b.len() as u64;
    match rng.below(7) {
        0 if n > 0 => {
            let i = rng.below(n) as usize;
            b[i] ^= 1 << rng.below(8);
        }
        1 if n > 0 => {
            let i = rng.below(n) as usize;
            b[i] = [0, 1, 0x7f, 0x80, 0xff, b'\n', rng.next() as u8][rng.below(7) as usize];
        }
        2 if n >= 4 => {
            let i = rng.below(n - 3) as usize;
            let v: u32 = [0, 1, 3, 4, 0x7fff_ffff, 0xffff_ffff, 0x1000_0000, 0x100, rng.next() as u32][rng.below(9) as usize];
            b[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
        3 => b.truncate(rng.below(n + 1) as usize),
        4 => {
            let i = rng.below(n + 1) as usize;
            let k = 1 + rng.below(16) as usize;
            let ins: Vec<u8> = (0..k).map(|_| rng.next() as u8).collect();
            b.splice(i..i, ins);
        }
        5 if n > 0 => {
            let i = rng.below(n) as usize;
            let k = (1 + rng.below(16) as usize).min(b.len() - i);
            b.drain(i..i + k);
        }
        _ if n >= 8 => {
            // a 64-bit field: an address nearby, zero, or all ones
            let i = rng.below(n - 7) as usize;
            let old = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
            let v = [0, u64::MAX, old.wrapping_add(4096), old.wrapping_sub(1), 0x100000][rng.below(5) as usize];
            b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
        _ => b.push(rng.next() as u8),
    }
}

/// The messages the host will read from `b`, as it frames them: (type,
/// payload), up to the first frame it refuses or that is cut short.
fn frames(b: &[u8]) -> Vec<(u32, &[u8])> {
    let mut v = Vec::new();
    let mut off = 0;
    while off + 8 <= b.len() {
        let len = u32::from_le_bytes(b[off..off + 4].try_into().unwrap()) as usize;
        if !(4..=256 << 20).contains(&len) || off + 4 + len > b.len() {
            break;
        }
        let t = u32::from_le_bytes(b[off + 4..off + 8].try_into().unwrap());
        v.push((t, &b[off + 8..off + 4 + len]));
        off += 4 + len;
    }
    v
}

/// Whether a frame is a well-formed request to unload, evict or replace
/// answer42: the host would rightly obey it, so the fuzzer does not send it.
fn touches(t: u32, p: &[u8], id: u32) -> bool {
    let u32_at = |i: usize| p.get(i..i + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap()));
    match t {
        7 | 8 => u32_at(0) == Some(id),
        6 => u32_at(0) == Some(id),
        10 => p.get(4..).map_or(false, |s| s.split(|&c| c == 0).next() == Some(&b"answer42"[..])),
        _ => false,
    }
}

/// Thousands of mutated, truncated and garbage protocol messages against a
/// running host: each is answered by one-line refusals (or OKs where the
/// mutant is still a valid request) until the connection ends, the host
/// never dies or hangs, and afterwards it still serves the CLI and
/// answer42 still returns 42. BUNKAI_MOD_FUZZ_CASES sets the number of
/// cases (default 20,000), BUNKAI_MOD_FUZZ_SEED the seed.
#[test]
fn mutated_protocol_messages_are_refused_and_the_host_keeps_serving() {
    let cases: u64 = std::env::var("BUNKAI_MOD_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let seed: u64 = std::env::var("BUNKAI_MOD_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_b0a7_d00d);
    let mut rng = Rng(bunkai_mod::fuzz::Rng(seed | 1));
    let mut h = Host::start();
    let id = h.list()["modules"][0]["id"].as_u64().unwrap() as u32;
    let (mut refusals, mut oks, mut accepted_commits, mut skipped) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    for case in 0..cases {
        let mut r = h.raw();
        let m = |t: Msg, o: &Out| frame(t as u32, &o.0);
        let kind = rng.below(8);
        // A valid beginning, sent as is; then the part that is mutated.
        let tail: Vec<u8> = match kind {
            0 => m(Msg::Hello, &Out::default()),
            1 => m(Msg::Resolve, Out::default().u32(3).str("abort").str("bunkai_acquire").str("no_such_symbol")),
            2 => [
                m(Msg::Alloc, Out::default().u64(100).u64(50)),
                m(Msg::Unload, Out::default().u32(9999)),
                m(Msg::UnloadName, Out::default().str("nosuch")),
                m(Msg::Evict, Out::default().u32(9999)),
                m(Msg::Hello, &Out::default()),
            ]
            .concat(),
            3 | 4 => {
                // staged code: a page of `ret`, then a COMMIT of it
                let b = r.call(Msg::Alloc, Out::default().u64(1).u64(64)).ok("ALLOC");
                let mut rd = In::new(&b);
                let (rx, rw) = (rd.u64().unwrap(), rd.u64().unwrap());
                r.call(Msg::Write, Out::default().u64(rx).bytes(&vec![0xc3; (rw - rx) as usize])).ok("WRITE");
                let mut c = Commit::new("fz", "fz_iface", rx, rw);
                c.deps = if kind == 4 { vec![b"answer42".to_vec()] } else { vec![] };
                c.init = if rng.below(2) == 0 { rx } else { 0 };
                c.exit = rx + 1;
                [if kind == 3 { m(Msg::Protect, Out::default().u64(rx)) } else { vec![] }, m(Msg::Commit, &c.body())]
                    .concat()
                    .into_iter()
                    .chain(if kind == 4 { m(Msg::Protect, Out::default().u64(rx)) } else { vec![] })
                    .collect()
            }
            5 => {
                let b = r.call(Msg::Alloc, Out::default().u64(4096).u64(0)).ok("ALLOC");
                let rx = In::new(&b).u64().unwrap();
                [
                    m(Msg::Map, Out::default().u64(rx).u64(4096)),
                    m(Msg::Write, Out::default().u64(rx + 8).bytes(&[0xc3; 8])),
                    m(Msg::Evict, Out::default().u32(id.wrapping_add(1000))),
                ]
                .concat()
            }
            6 => {
                // a header of any type, then garbage
                let k = rng.below(64) as usize;
                let mut v = ((4 + k) as u32).to_le_bytes().to_vec();
                v.extend_from_slice(&(rng.below(12) as u32).to_le_bytes());
                v.extend((0..k).map(|_| rng.next() as u8));
                v
            }
            _ => (0..rng.below(48)).map(|_| rng.next() as u8).collect(),
        };
        let mut bytes = tail;
        for _ in 0..rng.below(4) {
            mutate(&mut rng, &mut bytes);
        }
        let fr = frames(&bytes);
        if fr.iter().any(|(t, p)| touches(*t, p, id)) {
            skipped += 1;
            continue;
        }
        // The host may stop reading at the first bad frame: a failed write
        // is not a failure, the answers are.
        let _ = r.s.write_all(&bytes);
        let _ = r.s.shutdown(std::net::Shutdown::Write);
        let mut k = 0;
        loop {
            let what = format!("case {case} (kind {kind}, seed {seed:#x}), answer {k}");
            match r.reply() {
                Reply::Closed => break,
                Reply::Err(e) => {
                    assert!(!e.is_empty() && !e.contains('\n') && e.len() < 600, "{what}: not one line: {e:?}");
                    refusals += 1;
                }
                Reply::Ok(b) => {
                    oks += 1;
                    if fr.get(k).map(|f| f.0) == Some(Msg::Commit as u32) {
                        // a mutant that is still a valid module: it goes again
                        accepted_commits += 1;
                        let mid = In::new(&b).u32().unwrap();
                        drop(std::mem::replace(&mut r, h.raw()));
                        h.raw().call(Msg::Unload, Out::default().u32(mid)).ok(&format!("{what}: unloading the module it loaded"));
                        break;
                    }
                }
            }
            k += 1;
            assert!(k <= fr.len() + 1, "case {case}: more answers than messages");
        }
        h.alive();
        if case % 500 == 499 {
            assert_eq!(h.call(), "42", "after case {case} (seed {seed:#x})");
        }
    }
    eprintln!(
        "{cases} cases in {:.1} s: {refusals} refusals, {oks} OKs ({accepted_commits} mutated modules accepted and unloaded), {skipped} skipped (they would unload answer42)",
        t0.elapsed().as_secs_f64()
    );
    assert!(refusals > cases / 2, "too few refusals ({refusals}): the mutants did not reach the checks");
    assert!(skipped < cases / 50, "{skipped} of {cases} skipped");
    h.unharmed("the fuzzer");
    let o = bunkai_ok(&["mod", "list", "--socket", h.sock()]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("answer42"));
}

/// A host that forks: on "fork" its child prints its pid, its socket and
/// what answer.value() gives it, then waits; on "forkx" the child exits
/// normally (its atexit runs); on "forkq" the child calls _exit at once
/// and the parent prints its pid.
const FORK_HOST_C: &str = r#"#include "bunkai_mod.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define ANSWER(X) X(int, value, (void))
BUNKAI_INTERFACE(answer, ANSWER)
static int value(void) {
  struct bunkai_guard g;
  const struct answer_ops *a = BUNKAI_ACQUIRE(answer, &g);
  int v = a ? a->value() : -1;
  bunkai_release(&g);
  return v;
}
/* a thread inside a call through the registry that never returns */
static void *holder(void *arg) {
  struct bunkai_guard g;
  (void)BUNKAI_ACQUIRE(answer, &g);
  *(volatile int *)arg = 1;
  for (;;)
    pause();
  return 0;
}
int main(int argc, char **argv) {
  BUNKAI_EXPECT(answer);
  if (bunkai_host_start(argc > 1 ? argv[1] : NULL))
    return 2;
  printf("socket %s\n", bunkai_host_socket());
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (!strncmp(line, "forkq", 5)) {
      pid_t p = fork();
      if (p == 0)
        _exit(0); /* at once: no atexit */
      waitpid(p, 0, 0); /* reaped: its pid names no process */
      printf("quick %d\n", (int)p);
      fflush(stdout);
      continue;
    }
    if (!strncmp(line, "fork", 4)) {
      static volatile int inside;
      pthread_t t;
      if (line[4] == 'r' && !pthread_create(&t, 0, holder, (void *)&inside))
        while (!inside)
          usleep(1000);
      if (fork() == 0) {
        /* a fork child's host listens 100 ms after the fork */
        for (int i = 0; i < 300 && !bunkai_host_socket(); i++)
          usleep(10000);
        const char *s = bunkai_host_socket();
        printf("child %d %s %d\n", (int)getpid(), s ? s : "none", value());
        fflush(stdout);
        if (line[4] == 'x')
          exit(0);
        for (;;)
          pause();
      }
      continue;
    }
    printf("value %d\n", value());
    fflush(stdout);
  }
  return 0;
}
"#;

extern "C" {
    fn geteuid() -> u32;
}

/// FORK_HOST_C built in `dir`, linked with libbunkai-host.a.
fn build_fork_host(dir: &Path) -> PathBuf {
    let c = dir.join("fork-host.c");
    std::fs::write(&c, FORK_HOST_C).unwrap();
    let exe = dir.join("fork-host");
    let inc = format!("-I{}", root().join("mod/include").display());
    let lib = lib_dir().join("libbunkai-host.a");
    clang(&["-O1", &inc, c.to_str().unwrap(), lib.to_str().unwrap(), "-lpthread", "-ldl", "-o", exe.to_str().unwrap()], "the forking host");
    exe
}

/// A new directory only its owner may use (mode 0700), as the host wants
/// its socket directory and XDG_RUNTIME_DIR.
fn private_dir(p: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
    p.to_path_buf()
}

/// Processes killed when the test ends, also by a failed assertion: a
/// forking host's children are not ours, and hold our output open.
struct KillPids(Vec<u32>);

impl Drop for KillPids {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("kill").args(["-KILL", &p.to_string()]).output_within(DEADLINE);
        }
    }
}

/// The forking test host (FORK_HOST_C, linked with libbunkai-host.a) on
/// the default directory of a private XDG_RUNTIME_DIR, with answer42
/// loaded; it and the children it reported are killed when dropped.
struct ForkHost {
    host: Child,
    stdin: std::process::ChildStdin,
    lines: Receiver<String>,
    sock: String,
    xdg: PathBuf,
    ours: KillPids,
    _dir: Option<tempfile::TempDir>,
}

impl ForkHost {
    fn start() -> ForkHost {
        let dir = tempfile::tempdir().unwrap();
        let exe = build_fork_host(dir.path());
        let module = compile_module(ANSWER42, "answer42", dir.path());
        let xdg = private_dir(&dir.path().join("run"));
        let mut h = ForkHost::spawn(Command::new(&exe), &xdg, "fork-host");
        h._dir = Some(dir);
        bunkai_ok(&["mod", "load", "--socket", &h.sock, module.to_str().unwrap()]);
        h
    }

    /// The forking host as cmd starts it (the program, or a wrapper that
    /// runs it) on the default directory of xdg, with a deadline; its
    /// socket is its first line. Nothing loaded.
    fn spawn(mut cmd: Command, xdg: &Path, what: &str) -> ForkHost {
        let mut host = cmd
            .env("XDG_RUNTIME_DIR", xdg)
            .env_remove("BUNKAI_HOST_SOCKET")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        kill_after(&host, DEADLINE, what);
        let ours = KillPids(vec![host.id()]);
        let stdin = host.stdin.take().unwrap();
        let lines = stdout_lines(&mut host);
        let mut h = ForkHost { host, stdin, lines, sock: String::new(), xdg: xdg.to_path_buf(), ours, _dir: None };
        let first = h.line();
        h.sock = first.strip_prefix("socket ").unwrap_or_else(|| panic!("{what} said {first:?}")).to_string();
        h
    }

    fn line(&self) -> String {
        self.lines.recv_timeout(Duration::from_secs(30)).expect("the forking host printed nothing within 30 s")
    }

    /// Sends a fork command; the child's pid and socket (it called answer42).
    fn fork(&mut self, cmd: &str) -> (u32, String) {
        writeln!(self.stdin, "{cmd}").unwrap();
        let child = self.line();
        let f: Vec<&str> = child.split(' ').collect();
        let cpid: u32 = f.get(1).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{child}"));
        self.ours.0.push(cpid);
        assert_eq!((f.len(), f[0], f[3]), (4, "child", "42"), "{child}");
        (cpid, f[2].to_string())
    }
}

impl Drop for ForkHost {
    fn drop(&mut self) {
        for p in self.ours.0.drain(..) {
            let _ = Command::new("kill").args(["-KILL", &p.to_string()]).output_within(DEADLINE);
        }
        let _ = self.host.wait();
    }
}

/// A thread of the parent is inside a call through the registry when
/// another forks: in the child, where that thread does not exist, an
/// unload does not wait for it (before, the child inherited the parent's
/// count of calls in flight and its unload waited for ever).
#[test]
fn a_fork_child_unloads_while_a_parent_thread_is_in_a_call() {
    let mut h = ForkHost::start();
    let (_, child_sock) = h.fork("forkr");
    // under DEADLINE: a hang fails naming the command
    bunkai_ok(&["mod", "unload", "--socket", &child_sock, "answer42"]);
    let l: serde_json::Value = serde_json::from_slice(&bunkai_ok(&["mod", "list", "--socket", &child_sock, "--json"]).stdout).unwrap();
    assert!(l["modules"].as_array().unwrap().is_empty(), "{l}");
    // the parent still has it (its thread is still inside the call)
    let l: serde_json::Value = serde_json::from_slice(&bunkai_ok(&["mod", "list", "--socket", &h.sock, "--json"]).stdout).unwrap();
    assert_eq!(l["modules"][0]["record"]["name"], "answer42", "{l}");
}

/// A client that staged a module and went silent, its connection still
/// open, holds up no fork of the program: the host gives up its lock while
/// it waits for the next message of a client that has published nothing
/// (before, the fork waited 5 s for it and the child got no host). The
/// child undoes its copy of that session (its memory in use is the
/// parent's before the staging), closes its copy of the connection, and
/// answers; the parent's session goes on, and its staging goes when the
/// client leaves.
#[test]
fn a_stalled_client_holds_up_no_fork() {
    let mut h = ForkHost::start();
    let before = Raw::connect(Path::new(&h.sock)).used();
    let mut stalled = Raw::connect(Path::new(&h.sock));
    stalled.stage(&ret_value(7));
    let staged = stalled.used();
    assert!(staged > before, "{staged} <= {before}");
    let (_, child_sock) = h.fork("fork");
    assert_ne!(child_sock, "none", "the fork child has no host: the fork waited for the stalled client");
    assert_eq!(stalled.used(), staged, "the parent's session did not go on");
    assert_eq!(Raw::connect(Path::new(&child_sock)).used(), before, "the child kept its copy of the parent's staging");
    let l: serde_json::Value = serde_json::from_slice(&bunkai_ok(&["mod", "list", "--socket", &child_sock, "--json"]).stdout).unwrap();
    assert_eq!(l["modules"][0]["record"]["name"], "answer42", "{l}");
    // the parent ends the connection (a message too large): the client sees
    // its end, which it would not while the child held a copy of it
    stalled.s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    stalled.reply().refusal("a message of 4 GiB");
    assert!(matches!(stalled.reply(), Reply::Closed), "the connection stayed open after the parent closed it");
    drop(stalled);
    let t0 = Instant::now();
    while Raw::connect(Path::new(&h.sock)).used() != before {
        assert!(t0.elapsed() < Duration::from_secs(30), "the parent kept the staging of a client that left");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `flow weave`/`unweave --pid P` talk to process P's own host only: a
/// socket named P.sock in the default directory on which another process
/// listens (one that had the pid before left it, and another took the
/// name) is refused before anything is sent, naming the listener.
#[test]
fn a_socket_named_for_a_pid_but_held_by_another_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let xdg = private_dir(&dir.path().join("run"));
    private_dir(&xdg.join("bunkai-mod"));
    let sleeper = Command::new("sleep").arg("120").spawn().unwrap();
    kill_after(&sleeper, DEADLINE, "sleep 120");
    let _k = KillPids(vec![sleeper.id()]);
    let p = sleeper.id();
    let exe = build_host(dir.path());
    let sock = xdg.join(format!("bunkai-mod/{p}.sock"));
    let mut host = Command::new(&exe).arg(&sock).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    kill_after(&host, DEADLINE, "answer-host");
    let _h = KillPids(vec![host.id()]);
    let lines = stdout_lines(&mut host);
    let l = lines.recv_timeout(Duration::from_secs(30)).expect("the test host printed nothing within 30 s");
    assert!(l.starts_with("socket "), "{l}");
    let o = Command::new(bunkai())
        .args(["flow", "unweave", "--pid", &p.to_string(), "answer42"])
        .env("XDG_RUNTIME_DIR", &xdg)
        .output_within(DEADLINE);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains(&format!("is not process {p}'s: process {} listens on it", host.id())), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// `bunkai flow unweave` on a forking host: the module goes from the
/// parent, and a child of the same program whose host does not answer
/// (its socket removed here) is named as not checked (`unchecked` in JSON),
/// not passed over in silence.
#[test]
fn unweave_names_a_child_it_could_not_check() {
    let mut h = ForkHost::start();
    let (cpid, child_sock) = h.fork("fork");
    std::fs::remove_file(&child_sock).unwrap();
    let o = Command::new(bunkai())
        .args(["flow", "unweave", "--pid", &h.host.id().to_string(), "answer42", "--json"])
        .env("XDG_RUNTIME_DIR", &h.xdg)
        .output_within(DEADLINE);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["unwoven"], "answer42", "{v}");
    assert_eq!(v["processes"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["unchecked"], serde_json::json!([cpid]), "{v}");
    let l: serde_json::Value = serde_json::from_slice(&bunkai_ok(&["mod", "list", "--socket", &h.sock, "--json"]).stdout).unwrap();
    assert!(l["modules"].as_array().unwrap().is_empty(), "{l}");
}

/// Every fork child of a host on the default directory gets a host of its
/// own, `<dir>/<its pid>.sock` (100 ms after the fork), with the modules
/// its parent had at the fork; unloading in the child leaves the parent's;
/// a child that exits normally does not remove its parent's socket, nor
/// leaves its own. A host on an explicit path gives its children none. A
/// child that exits at once (_exit) leaves no socket behind.
#[test]
fn a_fork_child_gets_a_host_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_fork_host(dir.path());
    let module = compile_module(ANSWER42, "answer42", dir.path());
    // the default directory: $XDG_RUNTIME_DIR/bunkai-mod, a private one here
    let xdg = private_dir(&dir.path().join("run"));
    for explicit in [false, true] {
        let mut cmd = Command::new(&exe);
        if explicit {
            cmd.arg(dir.path().join("explicit.sock"));
        }
        let mut host = ForkHost::spawn(cmd, &xdg, "fork-host");
        let sock = host.sock.clone();
        if !explicit {
            assert_eq!(sock, xdg.join(format!("bunkai-mod/{}.sock", host.host.id())).to_str().unwrap());
        }
        bunkai_ok(&["mod", "load", "--socket", &sock, module.to_str().unwrap()]);
        // fork() checks that the child called the module it inherited (42)
        let (cpid, csock) = host.fork("fork");
        kill_pid_after(cpid, DEADLINE, "fork-host's child");
        if explicit {
            assert_eq!(csock, "none", "a child of a host on an explicit path has no host");
        } else {
            assert_eq!(csock, xdg.join(format!("bunkai-mod/{cpid}.sock")).to_str().unwrap());
            let l: serde_json::Value = serde_json::from_slice(&bunkai_ok(&["mod", "list", "--socket", &csock, "--json"]).stdout).unwrap();
            assert_eq!(l["modules"][0]["record"]["name"], "answer42", "{l}");
            bunkai_ok(&["mod", "unload", "--socket", &csock, "answer42"]);
            let l: serde_json::Value = serde_json::from_slice(&bunkai_ok(&["mod", "list", "--socket", &csock, "--json"]).stdout).unwrap();
            assert!(l["modules"].as_array().unwrap().is_empty(), "{l}");
            // a child exiting normally leaves its parent's socket and
            // removes its own; one that calls _exit at once never made one
            for cmd in ["forkx", "forkq"] {
                writeln!(host.stdin, "{cmd}").unwrap();
                let gone: u32 = host.line().split(' ').nth(1).unwrap().parse().unwrap();
                let t0 = Instant::now();
                while std::fs::read_to_string(format!("/proc/{gone}/stat")).is_ok_and(|s| !s.rsplit(')').next().unwrap().trim_start().starts_with('Z')) {
                    assert!(t0.elapsed() < Duration::from_secs(30), "the exiting child {gone} did not end");
                    std::thread::sleep(Duration::from_millis(20));
                }
                assert!(Path::new(&sock).exists(), "{cmd}: the child's exit removed its parent's socket");
                let own = xdg.join(format!("bunkai-mod/{gone}.sock"));
                // root's children make their socket at once (they may drop
                // privileges next): one that calls _exit leaves it, and the
                // next host to start in the directory removes it
                if cmd == "forkq" && unsafe { geteuid() } == 0 {
                    assert!(own.exists(), "root's child made no socket at its fork");
                    drop(ForkHost::spawn(Command::new(&exe), &xdg, "the second fork-host"));
                }
                assert!(!own.exists(), "{cmd}: the child left {}", own.display());
            }
        }
        // the parent keeps its module and answers
        writeln!(host.stdin, "call").unwrap();
        assert_eq!(host.line(), "value 42");
        let l: serde_json::Value = serde_json::from_slice(&bunkai_ok(&["mod", "list", "--socket", &sock, "--json"]).stdout).unwrap();
        assert_eq!(l["modules"][0]["record"]["name"], "answer42", "{l}");
        drop(host);
    }
}

/// The same forking host run by a user other than root: a child's host
/// starts 100 ms after the fork, so a child that calls `_exit` at once never
/// makes a socket, while one that lives gets `<dir>/<its pid>.sock`.
#[test]
fn a_users_fork_child_gets_its_host_late_and_a_quick_one_none() {
    use std::os::unix::fs::PermissionsExt;
    if !need_root("a_users_fork_child_gets_its_host_late_and_a_quick_one_none", "running the host as nobody (setpriv)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = build_fork_host(dir.path());
    let xdg = private_dir(&dir.path().join("run"));
    std::os::unix::fs::chown(&xdg, Some(65534), Some(65534)).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&exe);
    let mut host = ForkHost::spawn(cmd, &xdg, "fork-host as nobody");
    assert_eq!(host.sock, xdg.join(format!("bunkai-mod/{}.sock", host.host.id())).to_str().unwrap());
    writeln!(host.stdin, "fork").unwrap();
    let child = host.line();
    let f: Vec<&str> = child.split(' ').collect();
    let cpid: u32 = f.get(1).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{child}"));
    host.ours.0.push(cpid);
    assert_eq!(f.get(2).copied(), Some(xdg.join(format!("bunkai-mod/{cpid}.sock")).to_str().unwrap()), "{child}");
    assert!(xdg.join(format!("bunkai-mod/{cpid}.sock")).exists());
    writeln!(host.stdin, "forkq").unwrap();
    let gone: u32 = host.line().strip_prefix("quick ").unwrap().parse().unwrap();
    // reaped by the host before it printed: its threads are gone too
    assert!(!Path::new(&format!("/proc/{gone}")).exists());
    let left: Vec<String> = std::fs::read_dir(xdg.join("bunkai-mod")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(!left.contains(&format!("{gone}.sock")), "a child that called _exit at once left its socket: {left:?}");
    drop(host);
}
