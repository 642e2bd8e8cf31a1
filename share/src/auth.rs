//! Authentication: the handshake that opens the CLI's connection to a
//! node daemon, the run key, and the MACs on the CLI-node JSON lines.
//!
//! The CLI's first message (the spawn request, with the program's argv,
//! environment and working directory) travels in the same flight as its
//! proof, encrypted, so authentication adds no round trip to a run's start:
//!
//! ```text
//! client -> server  hello: magic, version, role, len, time, nonce_c, the
//!                   connection's two ends as the client sees them (96 B),
//!                   then the first message sealed with ChaCha20-Poly1305
//!                   under E = HMAC(K, "bunkai-share early" || nonce_c),
//!                   the hello as associated data
//! server -> client  status, nonce_s, HMAC(K, "bunkai-share server" || role
//!                   || status || nonce_c || nonce_s)            (72 B)
//! only if status is CHALLENGE:
//! client -> server  HMAC(K, "bunkai-share client" || role || nonce_c || nonce_s)
//! ```
//!
//! The server opens the first message (a peer without K cannot seal one:
//! the server answers REFUSED and closes) and remembers its nonce_c until
//! the window has passed both its time and its arrival. It acts on it at
//! once (ACCEPTED) only when the hello is fresh: the nonce not seen
//! before, its time within WINDOW of the server's clock and not before the
//! server had been up for WINDOW, and the ends it names are this
//! connection's as the server sees them. Otherwise it challenges: it sends
//! its nonce and acts only on the client's MAC over both nonces, one round
//! trip more (clocks further apart, a node started a moment ago, address
//! translation, a full memory of nonces; the node logs why). So a recorded
//! flight replays to nobody: not to the same server (the nonce is
//! remembered, or its time has left the window), not to a server restarted
//! since (while the two clocks agree within WINDOW, the flight is older
//! than the restart plus WINDOW), not on another connection (the ends).
//! What is left: a node restarted after a flight that was dated more than
//! WINDOW ahead of its clock would take that flight once its clock has
//! caught up; and nodes that share one address and the key (a failover
//! address) each take a flight recorded for one of them, within WINDOW.
//! The client reads nothing until the server's MAC checks; an impostor
//! without K learns nothing from the request (it is encrypted) and cannot
//! answer.
//!
//! The CLI and the node daemon speak it under the cluster key, with role
//! DAEMON. (The runtimes' connections open with a hello under the run key:
//! bunkai_share.h section 2, share/runtime/auth.c.) A peer that says
//! nothing is dropped after BKS_AUTH_MS.
//!
//! The run key R = HMAC(K, "bunkai-share run" || run id): the CLI sends
//! only the run id (inside the encrypted request), and each node derives
//! R itself. After the handshake, each JSON line carries a MAC under the
//! session key S = HMAC(K, "bunkai-share session" || nonce_c || nonce_s),
//! with the direction and the line's number: `{json}\t{64 hex digits}`.
//! The runtimes' traffic carries no MAC (docs/share.md says what that
//! leaves open).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::ChaCha20Poly1305;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const MAGIC: u32 = 0x314b_5342;
/// The CLI-node handshake's own version, in its hello. (Up to 4 it was
/// BKS_VERSION, and the handshake a challenge and response: a node or CLI
/// of those builds refuses this one at its first 16 bytes.)
pub const VERSION: u32 = 5;
pub const ROLE_CONTROL: u32 = 1;
pub const ROLE_THREAD: u32 = 2;
/// The CLI talking to a node daemon (not a runtime role).
pub const ROLE_DAEMON: u32 = 3;
/// bunkai_share.h BKS_AUTH_MS.
pub const AUTH_TIME: Duration = Duration::from_millis(5000);
/// How far a hello's time may be from the server's clock and still be
/// taken without a challenge; the server remembers nonces this long.
pub const WINDOW: Duration = Duration::from_secs(30);
/// Nonces remembered at most (a hello beyond that is challenged).
pub const MAX_SEEN: usize = 1 << 16;
/// The largest first message (proto::MAX_LINE).
pub const MAX_FIRST: usize = crate::proto::MAX_LINE;

/// The hello before its sealed first message (all of it is the seal's
/// associated data).
pub const HELLO: usize = 96;
/// The server's answer.
pub const REPLY: usize = 72;
const TAG: usize = 16;

pub const ACCEPTED: u32 = 1;
pub const CHALLENGE: u32 = 2;
pub const REFUSED: u32 = 3;

const SERVER: &[u8] = b"bunkai-share server";
const CLIENT: &[u8] = b"bunkai-share client";
const EARLY: &[u8] = b"bunkai-share early";

pub type Key = [u8; 32];

pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn server_mac(key: &Key, role: u32, status: u32, nc: &[u8; 32], ns: &[u8; 32]) -> [u8; 32] {
    hmac(key, &[SERVER, &role.to_le_bytes(), &status.to_le_bytes(), nc, ns])
}

fn client_mac(key: &Key, role: u32, nc: &[u8; 32], ns: &[u8; 32]) -> [u8; 32] {
    hmac(key, &[CLIENT, &role.to_le_bytes(), nc, ns])
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

pub fn run_key(cluster: &Key, run_id: &[u8; 16]) -> Key {
    hmac(cluster, &[b"bunkai-share run", run_id])
}

/// Why a handshake failed (one phrase for a log line or an error).
#[derive(Debug, PartialEq, Eq)]
pub enum AuthError {
    Closed,
    TimedOut,
    Protocol,
    WrongKey,
    /// The server challenged (why) and the answer was wrong: a replayed
    /// flight, whose sender cannot answer.
    Unanswered(Stale),
    Io(String),
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            AuthError::Closed => write!(f, "the connection ended during the handshake"),
            AuthError::TimedOut => write!(f, "no handshake within {} s", AUTH_TIME.as_secs()),
            AuthError::Protocol => write!(f, "not a bunkai share peer of this version"),
            AuthError::WrongKey => write!(f, "wrong key"),
            AuthError::Unanswered(why) => write!(f, "a challenge not answered ({why}: a replayed flight?)"),
            AuthError::Io(e) => write!(f, "{e}"),
        }
    }
}

fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), AuthError> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AuthError::TimedOut);
        }
        s.set_read_timeout(Some(left)).map_err(|e| AuthError::Io(e.to_string()))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(AuthError::Closed),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                return Err(AuthError::TimedOut)
            }
            Err(e) => return Err(AuthError::Io(e.to_string())),
        }
    }
    s.set_read_timeout(None).map_err(|e| AuthError::Io(e.to_string()))?;
    Ok(())
}

fn nonce() -> Result<[u8; 32], AuthError> {
    let mut n = [0u8; 32];
    crate::sys::random_bytes(&mut n).map_err(|e| AuthError::Io(e.to_string()))?;
    Ok(n)
}

fn session(key: &Key, nc: &[u8; 32], ns: &[u8; 32]) -> Key {
    hmac(key, &[b"bunkai-share session", nc, ns])
}

fn early_cipher(key: &Key, nc: &[u8; 32]) -> ChaCha20Poly1305 {
    ChaCha20Poly1305::new(&hmac(key, &[EARLY, nc]).into())
}

/// The early key is new for every nonce_c, so one fixed AEAD nonce is safe.
const AEAD_NONCE: [u8; 12] = [0; 12];

/// Nanoseconds since the epoch on this host's clock.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// An address as 16 bytes (IPv4 mapped into IPv6) and its port.
fn end_bytes(a: &SocketAddr) -> [u8; 18] {
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut b = [0u8; 18];
    b[..16].copy_from_slice(&ip.octets());
    b[16..].copy_from_slice(&a.port().to_be_bytes());
    b
}

/// The client's first flight: the hello and the sealed first message.
/// `client_end` and `server_end` are the connection's ends as the client
/// sees them; `time` its clock (now_ns()).
pub fn flight(
    key: &Key,
    role: u32,
    first: &[u8],
    nc: &[u8; 32],
    time: u64,
    client_end: &SocketAddr,
    server_end: &SocketAddr,
) -> Result<Vec<u8>, AuthError> {
    if first.len() > MAX_FIRST {
        return Err(AuthError::Io(format!("a first message of {} bytes (at most {MAX_FIRST})", first.len())));
    }
    let mut h = Vec::with_capacity(HELLO + first.len() + TAG);
    h.extend_from_slice(&MAGIC.to_le_bytes());
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&role.to_le_bytes());
    h.extend_from_slice(&(first.len() as u32).to_le_bytes());
    h.extend_from_slice(&time.to_le_bytes());
    h.extend_from_slice(nc);
    h.extend_from_slice(&end_bytes(client_end));
    h.extend_from_slice(&end_bytes(server_end));
    h.resize(HELLO, 0);
    let sealed = early_cipher(key, nc)
        .encrypt(&AEAD_NONCE.into(), Payload { msg: first, aad: &h[..HELLO] })
        .map_err(|_| AuthError::Io("cannot seal the first message".into()))?;
    h.extend_from_slice(&sealed);
    Ok(h)
}

/// Why a server challenged a hello instead of acting on it at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// Its nonce was seen before (a replay, or a client that reused one).
    Seen,
    /// Made before this server had been up for WINDOW (a flight recorded
    /// for an earlier run of it), or before the memory last overflowed.
    BeforeFloor,
    /// Its time is more than WINDOW behind this server's clock.
    Late,
    /// Its time is more than WINDOW ahead of this server's clock.
    Early,
    /// The memory of nonces is full.
    Full,
    /// The ends it names are not this connection's (a replay on another
    /// connection, or address translation between the hosts).
    Ends,
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            Stale::Seen => "its nonce was seen before",
            Stale::BeforeFloor => "it is dated before this node had been up 30 s",
            Stale::Late => "its time is more than 30 s behind this node's clock",
            Stale::Early => "its time is more than 30 s ahead of this node's clock",
            Stale::Full => "the node remembers too many nonces",
            Stale::Ends => "it names another connection's ends (a replay, or address translation)",
        })
    }
}

/// What a server remembers to refuse a flight it has already opened.
pub struct Fresh {
    memory: Mutex<Memory>,
}

struct Memory {
    /// Hellos dated before this are challenged: WINDOW after the start (a
    /// flight recorded for an earlier run of the server is older, while
    /// the two clocks agree within WINDOW), raised past any hello whose
    /// nonce could not be remembered.
    floor: u64,
    /// The nonce of every flight that opened, challenged or not, and when
    /// to forget it: once the window has passed its time and its arrival.
    seen: HashMap<[u8; 32], u64>,
}

impl Default for Fresh {
    fn default() -> Self {
        Fresh::new()
    }
}

impl Fresh {
    pub fn new() -> Fresh {
        Fresh::up_since(now_ns())
    }

    /// A server that started at `started` (ns since the epoch). Only the
    /// handshake benchmark gives one in the past, to measure a node that
    /// has been up for more than WINDOW.
    pub fn up_since(started: u64) -> Fresh {
        let floor = started.saturating_add(WINDOW.as_nanos() as u64);
        Fresh { memory: Mutex::new(Memory { floor, seen: HashMap::new() }) }
    }

    /// Remembers the nonce of a flight that opened, and says whether it may
    /// be acted on without a challenge at `now`.
    pub fn admit(&self, time: u64, nc: &[u8; 32], now: u64) -> Result<(), Stale> {
        let w = WINDOW.as_nanos() as u64;
        let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        let floor = m.floor;
        if m.seen.contains_key(nc) {
            return Err(Stale::Seen);
        }
        if m.seen.len() >= MAX_SEEN {
            // Forget only what the window refuses by itself anyway.
            m.seen.retain(|_, forget| *forget >= now);
        }
        let remembered = m.seen.len() < MAX_SEEN;
        if remembered {
            m.seen.insert(*nc, time.max(now).saturating_add(w));
        } else {
            // This flight is not remembered: nothing dated before it is
            // taken without a challenge from now on.
            m.floor = m.floor.max(time.saturating_add(1));
        }
        if time < floor {
            Err(Stale::BeforeFloor)
        } else if time.saturating_add(w) < now {
            Err(Stale::Late)
        } else if time > now.saturating_add(w) {
            Err(Stale::Early)
        } else if !remembered {
            Err(Stale::Full)
        } else {
            Ok(())
        }
    }
}

/// A client's end of a finished handshake.
pub struct ClientSession {
    pub lines: LineMac,
    /// The server challenged: one round trip more (clocks apart, a node
    /// restarted a moment ago, address translation).
    pub challenged: bool,
}

/// The client's side: sends the hello with `first` sealed inside, checks
/// the server's proof, answers a challenge.
pub fn client(s: &mut TcpStream, key: &Key, role: u32, first: &[u8]) -> Result<ClientSession, AuthError> {
    client_at(s, key, role, first, now_ns())
}

/// `client` with the clock given (tests).
pub fn client_at(s: &mut TcpStream, key: &Key, role: u32, first: &[u8], time: u64) -> Result<ClientSession, AuthError> {
    let deadline = Instant::now() + AUTH_TIME;
    let io = |e: io::Error| AuthError::Io(e.to_string());
    let (me, peer) = (s.local_addr().map_err(io)?, s.peer_addr().map_err(io)?);
    let nc = nonce()?;
    s.write_all(&flight(key, role, first, &nc, time, &me, &peer)?).map_err(|_| AuthError::Closed)?;
    let mut reply = [0u8; REPLY];
    read_exact_by(s, &mut reply, deadline)?;
    let status = u32::from_le_bytes(reply[..4].try_into().unwrap());
    if status == REFUSED {
        return Err(AuthError::WrongKey);
    }
    let ns: [u8; 32] = reply[8..40].try_into().unwrap();
    if (status != ACCEPTED && status != CHALLENGE) || !same(&server_mac(key, role, status, &nc, &ns), &reply[40..]) {
        return Err(AuthError::WrongKey);
    }
    if status == CHALLENGE {
        s.write_all(&client_mac(key, role, &nc, &ns)).map_err(|_| AuthError::Closed)?;
    }
    Ok(ClientSession { lines: LineMac::new(session(key, &nc, &ns), true), challenged: status == CHALLENGE })
}

/// A server's end of a finished handshake.
pub struct ServerSession {
    pub lines: LineMac,
    /// The client's first message, opened.
    pub first: Vec<u8>,
    /// Why the server challenged, if it did (the client answered).
    pub challenged: Option<Stale>,
}

/// The server's side: opens the hello, then answers ACCEPTED if it is
/// fresh, else challenges and waits for the client's proof.
pub fn server(s: &mut TcpStream, key: &Key, role: u32, fresh: &Fresh) -> Result<ServerSession, AuthError> {
    let deadline = Instant::now() + AUTH_TIME;
    let mut hello = [0u8; HELLO];
    // What it is first: a peer of another version or protocol, which
    // sends less than a hello, is told at once.
    read_exact_by(s, &mut hello[..16], deadline)?;
    let word = |h: &[u8; HELLO], i: usize| u32::from_le_bytes(h[4 * i..4 * i + 4].try_into().unwrap());
    let len = word(&hello, 3) as usize;
    if word(&hello, 0) != MAGIC || word(&hello, 1) != VERSION || word(&hello, 2) != role || len > MAX_FIRST {
        return Err(AuthError::Protocol);
    }
    read_exact_by(s, &mut hello[16..], deadline)?;
    // A long request may take longer than the handshake's time (a second
    // more for each 64 KiB), and its buffer grows only as bytes arrive:
    // an unproven length reserves nothing.
    let deadline = deadline + Duration::from_secs((len / (64 << 10)) as u64);
    let mut sealed = Vec::new();
    while sealed.len() < len + TAG {
        let at = sealed.len();
        sealed.resize((at + (64 << 10)).min(len + TAG), 0);
        read_exact_by(s, &mut sealed[at..], deadline)?;
    }
    let time = u64::from_le_bytes(hello[16..24].try_into().unwrap());
    let nc: [u8; 32] = hello[24..56].try_into().unwrap();
    let Ok(first) = early_cipher(key, &nc).decrypt(&AEAD_NONCE.into(), Payload { msg: &sealed, aad: &hello[..] })
    else {
        let mut no = [0u8; REPLY];
        no[..4].copy_from_slice(&REFUSED.to_le_bytes());
        let _ = s.write_all(&no);
        return Err(AuthError::WrongKey);
    };
    let io = |e: io::Error| AuthError::Io(e.to_string());
    let (me, peer) = (s.local_addr().map_err(io)?, s.peer_addr().map_err(io)?);
    let ends_match = hello[56..74] == end_bytes(&peer) && hello[74..92] == end_bytes(&me);
    let stale = match fresh.admit(time, &nc, now_ns()) {
        Ok(()) if !ends_match => Some(Stale::Ends),
        Ok(()) => None,
        Err(why) => Some(why),
    };
    let status = if stale.is_none() { ACCEPTED } else { CHALLENGE };
    let ns = nonce()?;
    let mut reply = Vec::with_capacity(REPLY);
    reply.extend_from_slice(&status.to_le_bytes());
    reply.extend_from_slice(&[0u8; 4]);
    reply.extend_from_slice(&ns);
    reply.extend_from_slice(&server_mac(key, role, status, &nc, &ns));
    s.write_all(&reply).map_err(|_| AuthError::Closed)?;
    if let Some(why) = stale {
        let mut proof = [0u8; 32];
        read_exact_by(s, &mut proof, deadline)?;
        if !same(&client_mac(key, role, &nc, &ns), &proof) {
            return Err(AuthError::Unanswered(why));
        }
    }
    Ok(ServerSession { lines: LineMac::new(session(key, &nc, &ns), false), first, challenged: stale })
}

/// MACs on JSON lines: each direction numbers its lines from 0.
#[derive(Clone)]
pub struct LineMac {
    key: Key,
    sent: u64,
    received: u64,
    /// b'c' for the client (it sends 'c' lines and receives 's' lines).
    me: u8,
}

impl LineMac {
    pub fn new(session: Key, is_client: bool) -> LineMac {
        LineMac { key: session, sent: 0, received: 0, me: if is_client { b'c' } else { b's' } }
    }

    fn tag(&self, dir: u8, n: u64, line: &str) -> String {
        bunkai_common::fmt::hex(&hmac(&self.key, &[&[dir], &n.to_le_bytes(), line.as_bytes()]))
    }

    pub fn seal(&mut self, line: &str) -> String {
        let t = self.tag(self.me, self.sent, line);
        self.sent += 1;
        format!("{line}\t{t}")
    }

    /// The line without its MAC, or an error if the MAC does not match.
    pub fn open(&mut self, sealed: &str) -> Result<String, String> {
        let peer = if self.me == b'c' { b's' } else { b'c' };
        let (line, tag) = sealed.rsplit_once('\t').ok_or("a line without its MAC")?;
        if !same(tag.as_bytes(), self.tag(peer, self.received, line).as_bytes()) {
            return Err("a line whose MAC does not match (tampered with, replayed or out of order)".into());
        }
        self.received += 1;
        Ok(line.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Arc;

    /// RFC 4231, test cases 1 and 2.
    #[test]
    fn hmac_matches_rfc_4231() {
        let k = [0x0bu8; 20];
        assert_eq!(
            bunkai_common::fmt::hex(&hmac(&k, &[b"Hi There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            bunkai_common::fmt::hex(&hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"])),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// The runtime's own HMAC-SHA256 (share/runtime/sha256.c, which cannot
    /// use a library) against the `hmac` crate: RFC 4231's vectors and
    /// random keys and messages of every length around the block size.
    #[test]
    fn the_runtime_hmac_is_the_crates() {
        let lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/lib/bunkai/libbunkai-share.so");
        assert!(lib.exists(), "{} is missing (run make)", lib.display());
        let c = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
        type F = unsafe extern "C" fn(*const u8, usize, *const u8, usize, *mut u8);
        let f: F = unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!h.is_null(), "cannot load {}", lib.display());
            let sym = libc::dlsym(h, b"__bunkai_share_hmac\0".as_ptr() as *const libc::c_char);
            assert!(!sym.is_null(), "no __bunkai_share_hmac in {}", lib.display());
            std::mem::transmute(sym)
        };
        let c_hmac = |k: &[u8], m: &[u8]| {
            let mut out = [0u8; 32];
            unsafe { f(k.as_ptr(), k.len(), m.as_ptr(), m.len(), out.as_mut_ptr()) };
            out
        };
        assert_eq!(
            bunkai_common::fmt::hex(&c_hmac(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // RFC 4231 case 6: a key longer than the block
        let long = [0xaau8; 131];
        let m = b"Test Using Larger Than Block-Size Key - Hash Key First";
        assert_eq!(
            bunkai_common::fmt::hex(&c_hmac(&long, m)),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut byte = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        };
        for klen in [0usize, 1, 31, 32, 33, 63, 64, 65, 100] {
            for mlen in 0..200 {
                let k: Vec<u8> = (0..klen).map(|_| byte()).collect();
                let m: Vec<u8> = (0..mlen).map(|_| byte()).collect();
                assert_eq!(c_hmac(&k, &m), hmac(&k, &[&m]), "key {klen} bytes, message {mlen} bytes");
            }
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        on(&TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// A new connection to `l`: the client's end and the server's.
    fn on(l: &TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    /// A handshake on a fresh pair; returns both sessions' outcomes.
    fn shake(
        ck: Key,
        sk: Key,
        role_c: u32,
        first: &'static [u8],
        time: Option<u64>,
        fresh: Arc<Fresh>,
    ) -> (Result<ClientSession, AuthError>, Result<ServerSession, AuthError>) {
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || server(&mut s, &sk, ROLE_DAEMON, &fresh));
        let r = client_at(&mut c, &ck, role_c, first, time.unwrap_or_else(now_ns));
        drop(c);
        (r, t.join().unwrap())
    }

    /// A server that has been up for longer than the window.
    fn up() -> Arc<Fresh> {
        Arc::new(Fresh::up_since(now_ns() - 10 * WINDOW.as_nanos() as u64))
    }

    #[test]
    fn both_sides_agree_with_the_same_key_and_refuse_another() {
        let k = [7u8; 32];
        let fresh = up();
        let (c, s) = shake(k, k, ROLE_DAEMON, b"spawn it", None, fresh.clone());
        let (c, s) = (c.unwrap(), s.unwrap());
        assert_eq!(s.first, b"spawn it");
        assert!(!c.challenged && s.challenged.is_none(), "a fresh hello was challenged: {:?}", s.challenged);
        let (mut cl, mut sl) = (c.lines, s.lines);
        assert_eq!(sl.open(&cl.seal("x")).unwrap(), "x");
        assert_eq!(cl.open(&sl.seal("y")).unwrap(), "y");

        // A server with another key opens nothing and says so; the client
        // learns it holds another key.
        let (c, s) = shake(k, [8u8; 32], ROLE_DAEMON, b"spawn it", None, fresh.clone());
        assert_eq!(c.err(), Some(AuthError::WrongKey));
        assert_eq!(s.err(), Some(AuthError::WrongKey));

        // A client of another role.
        let (c, s) = shake(k, k, ROLE_THREAD, b"x", None, fresh.clone());
        assert!(c.is_err());
        assert_eq!(s.err(), Some(AuthError::Protocol));
    }

    /// A CLI of an earlier build (a 48-byte hello of version 4, then it
    /// waits for the node's challenge) is told at once, not after the
    /// handshake's time.
    #[test]
    fn an_earlier_builds_hello_is_refused_at_once() {
        let (mut c, mut s) = pair();
        let t0 = Instant::now();
        let t = std::thread::spawn(move || server(&mut s, &[7u8; 32], ROLE_DAEMON, &Fresh::new()));
        let mut old = Vec::new();
        for w in [MAGIC, 4, ROLE_DAEMON, 0] {
            old.extend_from_slice(&w.to_le_bytes());
        }
        old.extend_from_slice(&[1u8; 32]);
        c.write_all(&old).unwrap();
        assert_eq!(t.join().unwrap().err(), Some(AuthError::Protocol));
        assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    }

    /// Clocks apart by more than the window, or a hello made before the
    /// server had been up for the window: the server challenges, and the
    /// handshake still succeeds, one round trip later.
    #[test]
    fn a_hello_out_of_the_window_is_challenged_and_still_succeeds() {
        let k = [7u8; 32];
        let w = WINDOW.as_nanos() as u64;
        for (time, fresh, why) in [
            (now_ns() - 2 * w, up(), Stale::Late),
            (now_ns() + 2 * w, up(), Stale::Early),
            (now_ns(), Arc::new(Fresh::new()), Stale::BeforeFloor),
        ] {
            let (c, s) = shake(k, k, ROLE_DAEMON, b"late", Some(time), fresh);
            let (c, s) = (c.unwrap(), s.unwrap());
            assert!(c.challenged, "time {time}: not challenged");
            assert_eq!(s.challenged, Some(why));
            assert_eq!(s.first, b"late");
        }
    }

    #[test]
    fn fresh_remembers_every_nonce_that_opened() {
        let w = WINDOW.as_nanos() as u64;
        let start = now_ns() - 2 * w;
        let f = Fresh::up_since(start);
        let now = now_ns();
        assert_eq!(f.admit(now, &[1; 32], now), Ok(()));
        assert_eq!(f.admit(now, &[1; 32], now), Err(Stale::Seen));
        assert_eq!(f.admit(now + 1, &[1; 32], now + 2), Err(Stale::Seen), "a nonce taken again with another time");
        assert_eq!(f.admit(now, &[2; 32], now + w - 1), Ok(()));
        assert_eq!(f.admit(now, &[3; 32], now + w + 1), Err(Stale::Late));
        // A flight from the future is challenged, and remembered: once this
        // clock has caught up, the same flight is still refused.
        assert_eq!(f.admit(now + 2 * w, &[4; 32], now), Err(Stale::Early));
        assert_eq!(f.admit(now + 2 * w, &[4; 32], now + 2 * w), Err(Stale::Seen));
        // Before the floor: the start plus the window.
        assert_eq!(f.admit(start + w - 1, &[5; 32], start + w), Err(Stale::BeforeFloor));
        // A server restarted a moment ago does not remember, and takes
        // nothing dated before it had been up for the window.
        let restarted = Fresh::up_since(now);
        assert_eq!(restarted.admit(now + 10, &[1; 32], now + 20), Err(Stale::BeforeFloor));
        assert_eq!(restarted.admit(now + w + 10, &[6; 32], now + w + 20), Ok(()));
    }

    /// A full memory forgets only what the window refuses anyway; a nonce
    /// it cannot hold raises the floor past its flight, so that flight is
    /// never taken without a challenge later.
    #[test]
    fn a_full_memory_challenges_and_raises_its_floor() {
        let w = WINDOW.as_nanos() as u64;
        let start = now_ns() - 2 * w;
        let full = Fresh::up_since(start);
        let t = start + w + 10;
        {
            let mut m = full.memory.lock().unwrap();
            for i in 0..MAX_SEEN as u32 {
                let mut n = [0u8; 32];
                n[..4].copy_from_slice(&i.to_le_bytes());
                m.seen.insert(n, t + w);
            }
        }
        assert_eq!(full.admit(t, &[9; 32], t), Err(Stale::Full));
        // Later, with room again, the same flight is not taken: it is below
        // the floor now.
        assert_eq!(full.admit(t, &[9; 32], t + w + 1), Err(Stale::BeforeFloor));
        assert_eq!(full.memory.lock().unwrap().seen.len(), 1, "expired nonces were not forgotten");
        assert_eq!(full.admit(t + 5, &[10; 32], t + w + 2), Ok(()));
    }

    /// The first message is not readable on the wire (the spawn request
    /// carries the environment), and a flight that was changed opens
    /// nowhere.
    #[test]
    fn the_first_message_is_sealed() {
        let k = [7u8; 32];
        let a: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let secret = b"{\"spawn\":{\"env\":[[\"TOKEN\",\"hunter2-hunter2\"]]}}";
        let f = flight(&k, ROLE_DAEMON, secret, &[4; 32], 1, &a, &b).unwrap();
        assert_eq!(f.len(), HELLO + secret.len() + TAG);
        assert!(!f.windows(7).any(|w| w == b"hunter2"), "the request travels in the clear");
        let open = |f: &[u8]| {
            let nc: [u8; 32] = f[24..56].try_into().unwrap();
            early_cipher(&k, &nc).decrypt(&AEAD_NONCE.into(), Payload { msg: &f[HELLO..], aad: &f[..HELLO] })
        };
        assert_eq!(open(&f).unwrap(), secret);
        for i in 0..f.len() {
            if (12..16).contains(&i) {
                continue; // the length: the server reads by it (the fuzzer changes it)
            }
            let mut g = f.clone();
            g[i] ^= 0x20;
            assert!(open(&g).is_err(), "byte {i} changed and the flight still opened");
        }
        // Another key cannot open it.
        let nc: [u8; 32] = f[24..56].try_into().unwrap();
        assert!(early_cipher(&[8; 32], &nc)
            .decrypt(&AEAD_NONCE.into(), Payload { msg: &f[HELLO..], aad: &f[..HELLO] })
            .is_err());
    }

    /// A recorded flight sent again, on a new connection to the same
    /// server: its nonce is remembered and its ends are another
    /// connection's, so the server challenges, and the replayer cannot
    /// answer.
    #[test]
    fn a_replayed_flight_is_challenged_and_refused() {
        let k = [9u8; 32];
        let fresh = up();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (mut c, mut s) = on(&l);
        let nc = [6u8; 32];
        let f = flight(&k, ROLE_DAEMON, b"once", &nc, now_ns(), &c.local_addr().unwrap(), &addr).unwrap();
        c.write_all(&f).unwrap();
        let got = server(&mut s, &k, ROLE_DAEMON, &fresh).unwrap();
        assert_eq!(got.challenged, None);
        assert_eq!(got.first, b"once");
        for _ in 0..2 {
            let (mut c, mut s) = on(&l);
            let fr = fresh.clone();
            let t = std::thread::spawn(move || server(&mut s, &k, ROLE_DAEMON, &fr));
            c.write_all(&f).unwrap();
            let mut reply = [0u8; REPLY];
            c.read_exact(&mut reply).unwrap();
            assert_eq!(u32::from_le_bytes(reply[..4].try_into().unwrap()), CHALLENGE);
            c.write_all(&[0u8; 32]).unwrap();
            assert_eq!(t.join().unwrap().err(), Some(AuthError::Unanswered(Stale::Seen)));
        }
    }

    /// A flight made for another server end (the same client end): the
    /// server's own view of the connection differs, so it challenges.
    #[test]
    fn a_flight_for_another_server_end_is_challenged() {
        let k = [9u8; 32];
        let fresh = up();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (mut c, mut s) = on(&l);
        let other: SocketAddr = format!("127.0.0.1:{}", addr.port() ^ 1).parse().unwrap();
        let f = flight(&k, ROLE_DAEMON, b"x", &[7; 32], now_ns(), &c.local_addr().unwrap(), &other).unwrap();
        c.write_all(&f).unwrap();
        c.write_all(&[0u8; 32]).unwrap();
        assert_eq!(server(&mut s, &k, ROLE_DAEMON, &fresh).err(), Some(AuthError::Unanswered(Stale::Ends)));
    }

    /// A peer posing as the node answers ACCEPTED or CHALLENGE without the
    /// key's MAC: the client refuses it before reading anything else.
    #[test]
    fn a_node_without_the_key_cannot_pose_as_one() {
        for status in [ACCEPTED, CHALLENGE] {
            let (mut c, mut s) = pair();
            let t = std::thread::spawn(move || {
                let mut hello = [0u8; HELLO];
                s.read_exact(&mut hello).unwrap();
                let mut reply = [0u8; REPLY];
                reply[..4].copy_from_slice(&status.to_le_bytes());
                reply[8..40].copy_from_slice(&[1u8; 32]);
                s.write_all(&reply).unwrap();
                s.write_all(b"{\"spawned\":{\"pid\":1}}\n").unwrap();
                s
            });
            assert_eq!(client(&mut c, &[7u8; 32], ROLE_DAEMON, b"x").err(), Some(AuthError::WrongKey), "status {status}");
            drop(t.join().unwrap());
        }
    }

    #[test]
    fn lines_carry_macs_in_order() {
        let s = [3u8; 32];
        let (mut a, mut b) = (LineMac::new(s, true), LineMac::new(s, false));
        let one = a.seal(r#"{"kill":true}"#);
        let two = a.seal(r#"{"kill":false}"#);
        assert_eq!(b.open(&one).unwrap(), r#"{"kill":true}"#);
        // out of order / replayed
        assert!(b.open(&one).is_err());
        assert_eq!(b.open(&two).unwrap(), r#"{"kill":false}"#);
        let back = b.seal("x");
        assert_eq!(a.open(&back).unwrap(), "x");
        // tampered
        let three = a.seal(r#"{"a":1}"#).replace("1", "2");
        assert!(b.open(&three).is_err());
        assert!(b.open("no tab").is_err());
        // a line of the other direction
        let mut c = LineMac::new(s, true);
        assert!(c.open(&a.seal("y")).is_err());
    }
}
