//! The protocol between `bunkai share run` (the CLI, on the home host) and
//! `bunkai share node` (the daemon on each other host): first the
//! handshake under the cluster key (auth.rs, role DAEMON), then JSON, one
//! message a line, each line followed by a tab and its MAC under the
//! session key. The runtimes talk to each other with another, binary
//! protocol (bunkai_share.h section 3); this one only starts and stops
//! replicas.
//!
//! ```text
//! CLI  -> node  {"spawn": {"argv": ["/usr/bin/pigz", "-p", "3"],
//!                "env": [["PATH", "/usr/bin"], ["LD_PRELOAD", "/opt/bunkai/lib/bunkai/libbunkai-share.so"], ...],
//!                "cwd": "/tmp", "home": "10.200.1.1:40123", "host": 1,
//!                "run_id": "4f0c...32 hex digits", "version": 2, "stack_limit": 8388608}}
//! node -> CLI   {"spawned": {"pid": 4242}}        or  {"error": "one line"}
//! node -> CLI   {"exited": {"code": 0}}           or  {"exited": {"signal": 9}}
//! CLI  -> node  {"kill": true}                    (or the connection closes)
//! ```
//!
//! One run per connection. The node answers a spawn with `spawned` or
//! `error`; when the replica ends (by itself, or killed because the CLI
//! asked or went away) it sends `exited` and closes. `run_id` is public:
//! both sides derive the run key from it and the cluster key (auth.rs), so
//! the key the runtimes prove never travels. `stack_limit` (the
//! home host's soft RLIMIT_STACK, 2^64-1 for unlimited) is optional: the
//! kernel places the mmap base below the stack by that limit (or uses the
//! legacy layout when it is unlimited), so replicas need the home host's
//! value to get the same layout. Bump
//! PROTOCOL_VERSION on any change a peer of the previous version would
//! misread; a node refuses another version with an error reply.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

pub const PROTOCOL_VERSION: u32 = 2;

/// Longest line either side accepts (an environment is rarely over 100 KiB).
pub const MAX_LINE: usize = 1 << 20;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Spawn {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// The home runtime's listener as the node should reach it, a.b.c.d:port.
    pub home: String,
    /// 1..=nodes, in the order given to --nodes.
    pub host: u32,
    /// 16 random bytes as 32 hex digits: the run key is derived from it.
    pub run_id: String,
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_limit: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    Spawn(Spawn),
    Kill(bool),
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    pub fn from_status(st: std::process::ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (st.code(), st.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            (None, None) => Exit::Code(-1),
        }
    }

    /// The status a shell would report: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exited with status {c}"),
            Exit::Signal(s) => format!("was killed by signal {s} ({})", signal_name(s)),
        }
    }
}

pub fn signal_name(s: i32) -> &'static str {
    match s {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        31 => "SIGSYS",
        _ => "signal",
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Spawned { pid: u32 },
    Error(String),
    Exited(Exit),
}

/// Reads a request, refusing another protocol version before looking at
/// the rest (whose shape that version may have changed).
pub fn parse_request(line: &str) -> Result<Request, String> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not a JSON message ({e}): is this a bunkai share run?"))?;
    if let Some(ver) = v.get("spawn").and_then(|s| s.get("version")) {
        if ver.as_u64() != Some(PROTOCOL_VERSION as u64) {
            return Err(format!(
                "protocol version {ver}, this node speaks {PROTOCOL_VERSION} (run the same bunkai on every host)"
            ));
        }
    }
    serde_json::from_value(v).map_err(|e| format!("bad request ({e}) (run the same bunkai on every host)"))
}

pub fn parse_reply(line: &str) -> Result<Reply, String> {
    serde_json::from_str(line).map_err(|e| format!("bad reply ({e}) (run the same bunkai on every host)"))
}

/// Sets what both ends of a CLI-node connection need: no Nagle delay, and
/// a dead peer or a cut link noticed within seconds (keepalive probes when
/// idle, TCP_USER_TIMEOUT when data stays unacknowledged) instead of the
/// kernel's defaults of hours and minutes.
pub fn tune(s: &TcpStream) {
    let fd = s.as_raw_fd();
    let set = |level: libc::c_int, opt: libc::c_int, v: libc::c_int| unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    };
    set(libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 2);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 5000);
}

/// A TCP connection carrying JSON lines, each with its MAC once `secure`
/// has been called. Reads are driven by poll: `fill` makes one read(2),
/// which does not block when poll said readable.
pub struct Lines {
    pub stream: TcpStream,
    buf: Vec<u8>,
    mac: Option<crate::auth::LineMac>,
}

impl Lines {
    pub fn new(stream: TcpStream) -> Lines {
        Lines { stream, buf: Vec::new(), mac: None }
    }

    /// From now on every line sent carries a MAC and every line received
    /// must.
    pub fn secure(&mut self, mac: crate::auth::LineMac) {
        self.mac = Some(mac);
    }

    pub fn send<T: Serialize>(&mut self, msg: &T) -> io::Result<()> {
        let mut line = serde_json::to_string(msg).map_err(io::Error::other)?;
        if let Some(m) = &mut self.mac {
            line = m.seal(&line);
        }
        line.push('\n');
        self.stream.write_all(line.as_bytes())
    }

    /// One read into the buffer; Ok(false) at end of stream.
    pub fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 65536];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() > MAX_LINE {
                        return Err(io::Error::other("a message longer than 1 MiB"));
                    }
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The next complete line in the buffer, without its newline (and its
    /// MAC, which must match).
    pub fn next_line(&mut self) -> io::Result<Option<String>> {
        let Some(i) = self.buf.iter().position(|&b| b == b'\n') else { return Ok(None) };
        let line: Vec<u8> = self.buf.drain(..=i).collect();
        let line = String::from_utf8_lossy(&line[..i]).trim().to_string();
        match &mut self.mac {
            Some(m) if !line.is_empty() => m.open(&line).map(Some).map_err(io::Error::other),
            _ => Ok(Some(line)),
        }
    }

    /// The next line, waiting until `deadline` (None: no limit). Ok(None)
    /// at end of stream; an error of kind TimedOut past the deadline.
    pub fn recv(&mut self, deadline: Option<Instant>) -> io::Result<Option<String>> {
        loop {
            if let Some(l) = self.next_line()? {
                if l.is_empty() {
                    continue;
                }
                return Ok(Some(l));
            }
            let timeout = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"));
                    }
                    left.as_millis().min(i32::MAX as u128) as i32 + 1
                }
            };
            let mut p = [crate::sys::pollfd(self.stream.as_raw_fd())];
            if crate::sys::poll(&mut p, timeout)? == 0 {
                continue;
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }
}

/// Default time for a node to answer (connect, then spawn).
pub const NODE_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn() -> Spawn {
        Spawn {
            argv: vec!["/bin/true".into(), "-x".into()],
            env: vec![("PATH".into(), "/usr/bin".into()), ("LD_BIND_NOW".into(), "1".into())],
            cwd: "/tmp".into(),
            home: "10.200.1.1:4000".into(),
            host: 1,
            run_id: "0123456789abcdef0123456789abcdef".into(),
            version: PROTOCOL_VERSION,
            stack_limit: Some(8 << 20),
        }
    }

    #[test]
    fn requests_round_trip() {
        for r in [Request::Spawn(spawn()), Request::Kill(true)] {
            let line = serde_json::to_string(&r).unwrap();
            assert!(!line.contains('\n'));
            assert_eq!(parse_request(&line).unwrap(), r);
        }
        // The shape in the module's documentation.
        let line = serde_json::to_string(&Request::Spawn(spawn())).unwrap();
        assert!(line.starts_with(r#"{"spawn":{"argv":["/bin/true","-x"],"env":[["PATH","/usr/bin"],"#), "{line}");
        assert_eq!(serde_json::to_string(&Request::Kill(true)).unwrap(), r#"{"kill":true}"#);
    }

    #[test]
    fn replies_round_trip() {
        let cases = [
            (Reply::Spawned { pid: 42 }, r#"{"spawned":{"pid":42}}"#),
            (Reply::Error("no such program".into()), r#"{"error":"no such program"}"#),
            (Reply::Exited(Exit::Code(3)), r#"{"exited":{"code":3}}"#),
            (Reply::Exited(Exit::Signal(9)), r#"{"exited":{"signal":9}}"#),
        ];
        for (r, text) in cases {
            assert_eq!(serde_json::to_string(&r).unwrap(), text);
            assert_eq!(parse_reply(text).unwrap(), r);
        }
    }

    #[test]
    fn stack_limit_is_optional() {
        let mut s = spawn();
        s.stack_limit = None;
        let line = serde_json::to_string(&Request::Spawn(s.clone())).unwrap();
        assert!(!line.contains("stack_limit"));
        assert_eq!(parse_request(&line).unwrap(), Request::Spawn(s));
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let line = r#"{"spawn":{"version":1,"whatever":[]}}"#;
        let e = parse_request(line).unwrap_err();
        assert!(e.contains("protocol version 1, this node speaks 2"), "{e}");
        let e = parse_request("GET / HTTP/1.1").unwrap_err();
        assert!(e.contains("not a JSON message"), "{e}");
        let e = parse_request(r#"{"spawn":{"version":2}}"#).unwrap_err();
        assert!(e.starts_with("bad request"), "{e}");
    }

    #[test]
    fn exit_codes_like_a_shell() {
        assert_eq!(Exit::Code(3).shell_code(), 3);
        assert_eq!(Exit::Signal(15).shell_code(), 143);
        assert_eq!(Exit::Signal(9).describe(), "was killed by signal 9 (SIGKILL)");
    }

    #[test]
    fn lines_split_and_wait() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = Lines::new(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let mut b = Lines::new(l.accept().unwrap().0);
        a.send(&Reply::Spawned { pid: 1 }).unwrap();
        a.send(&Request::Kill(true)).unwrap();
        let soon = Some(Instant::now() + Duration::from_secs(5));
        assert_eq!(b.recv(soon).unwrap().unwrap(), r#"{"spawned":{"pid":1}}"#);
        assert_eq!(b.recv(soon).unwrap().unwrap(), r#"{"kill":true}"#);
        let e = b.recv(Some(Instant::now() + Duration::from_millis(20))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(a);
        assert_eq!(b.recv(soon).unwrap(), None);
    }
}
