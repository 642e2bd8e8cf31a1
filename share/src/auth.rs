//! Authentication: the challenge-response that opens the CLI's connection
//! to a node daemon, the run key, and the MACs on the CLI-node JSON lines.
//!
//! ```text
//! client -> server  magic, version, role, nonce_c (48 bytes)
//! server -> client  nonce_s, HMAC(key, "bunkai-share server" || role || nonce_c || nonce_s)
//! client -> server  HMAC(key, "bunkai-share client" || role || nonce_c || nonce_s)
//! ```
//!
//! The CLI and the node daemon speak it under the cluster key, with role
//! DAEMON. (The runtimes' connections open with a hello that carries the
//! client's proof and its first message in one flight, under the run key:
//! bunkai_share.h section 2, share/runtime/auth.c.) Each side
//! checks the other's MAC over both fresh nonces before it reads anything
//! else, so a recorded exchange replays to nobody; a peer that says
//! nothing is dropped after BKS_AUTH_MS.
//!
//! The run key R = HMAC(K, "bunkai-share run" || run id): the CLI sends
//! only the run id, and each node derives R itself. After the daemon
//! handshake, each JSON line carries a MAC under the session key
//! S = HMAC(K, "bunkai-share session" || nonce_c || nonce_s), with the
//! direction and the line's number: `{json}\t{64 hex digits}`. The runtimes'
//! traffic carries no MAC (docs/share.md says what that leaves open).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub const MAGIC: u32 = 0x314b_5342;
/// bunkai_share.h BKS_VERSION: the handshake carries it.
pub const VERSION: u32 = crate::stats::BKS_VERSION;
pub const ROLE_CONTROL: u32 = 1;
pub const ROLE_THREAD: u32 = 2;
/// The CLI talking to a node daemon (not a runtime role).
pub const ROLE_DAEMON: u32 = 3;
/// bunkai_share.h BKS_AUTH_MS.
pub const AUTH_TIME: Duration = Duration::from_millis(5000);

const SERVER: &[u8] = b"bunkai-share server";
const CLIENT: &[u8] = b"bunkai-share client";

pub type Key = [u8; 32];

pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn mac_for(key: &Key, label: &[u8], role: u32, nc: &[u8; 32], ns: &[u8; 32]) -> [u8; 32] {
    hmac(key, &[label, &role.to_le_bytes(), nc, ns])
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
    Io(String),
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            AuthError::Closed => write!(f, "the connection ended during the handshake"),
            AuthError::TimedOut => write!(f, "no handshake within {} s", AUTH_TIME.as_secs()),
            AuthError::Protocol => write!(f, "not a bunkai share peer of this version"),
            AuthError::WrongKey => write!(f, "wrong key"),
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

/// The client's side. Returns the session key.
pub fn client(s: &mut TcpStream, key: &Key, role: u32) -> Result<Key, AuthError> {
    let deadline = Instant::now() + AUTH_TIME;
    let nc = nonce()?;
    let mut hello = Vec::with_capacity(48);
    hello.extend_from_slice(&MAGIC.to_le_bytes());
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&role.to_le_bytes());
    hello.extend_from_slice(&0u32.to_le_bytes());
    hello.extend_from_slice(&nc);
    s.write_all(&hello).map_err(|_| AuthError::Closed)?;
    let mut reply = [0u8; 64];
    read_exact_by(s, &mut reply, deadline)?;
    let ns: [u8; 32] = reply[..32].try_into().unwrap();
    if !same(&mac_for(key, SERVER, role, &nc, &ns), &reply[32..]) {
        return Err(AuthError::WrongKey);
    }
    s.write_all(&mac_for(key, CLIENT, role, &nc, &ns)).map_err(|_| AuthError::Closed)?;
    Ok(session(key, &nc, &ns))
}

/// The server's side. Returns the session key.
pub fn server(s: &mut TcpStream, key: &Key, role: u32) -> Result<Key, AuthError> {
    let deadline = Instant::now() + AUTH_TIME;
    let mut hello = [0u8; 48];
    read_exact_by(s, &mut hello, deadline)?;
    let word = |i: usize| u32::from_le_bytes(hello[4 * i..4 * i + 4].try_into().unwrap());
    if word(0) != MAGIC || word(1) != VERSION || word(2) != role {
        return Err(AuthError::Protocol);
    }
    let nc: [u8; 32] = hello[16..].try_into().unwrap();
    let ns = nonce()?;
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(&ns);
    reply.extend_from_slice(&mac_for(key, SERVER, role, &nc, &ns));
    s.write_all(&reply).map_err(|_| AuthError::Closed)?;
    let mut proof = [0u8; 32];
    read_exact_by(s, &mut proof, deadline)?;
    if !same(&mac_for(key, CLIENT, role, &nc, &ns), &proof) {
        return Err(AuthError::WrongKey);
    }
    Ok(session(key, &nc, &ns))
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
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    #[test]
    fn both_sides_agree_with_the_same_key_and_refuse_another() {
        let k = [7u8; 32];
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || server(&mut s, &k, ROLE_DAEMON));
        let cs = client(&mut c, &k, ROLE_DAEMON).unwrap();
        assert_eq!(t.join().unwrap().unwrap(), cs);

        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || server(&mut s, &[8u8; 32], ROLE_DAEMON));
        assert_eq!(client(&mut c, &k, ROLE_DAEMON), Err(AuthError::WrongKey));
        drop(c);
        assert_eq!(t.join().unwrap(), Err(AuthError::Closed));

        // A client of another role, and one that never speaks.
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || server(&mut s, &k, ROLE_DAEMON));
        assert_eq!(client(&mut c, &k, ROLE_THREAD).unwrap_err(), AuthError::Closed);
        assert_eq!(t.join().unwrap(), Err(AuthError::Protocol));
    }

    /// A recorded client exchange replayed against a fresh server fails:
    /// the server's nonce is new.
    #[test]
    fn a_replayed_handshake_is_refused() {
        let k = [9u8; 32];
        let (mut c, mut s) = pair();
        let rec = std::thread::spawn(move || {
            let mut hello = [0u8; 48];
            s.read_exact(&mut hello).unwrap();
            let nc: [u8; 32] = hello[16..].try_into().unwrap();
            let ns = [1u8; 32];
            let mut reply = ns.to_vec();
            reply.extend_from_slice(&mac_for(&k, SERVER, ROLE_DAEMON, &nc, &ns));
            s.write_all(&reply).unwrap();
            let mut proof = [0u8; 32];
            s.read_exact(&mut proof).unwrap();
            (hello, proof)
        });
        client(&mut c, &k, ROLE_DAEMON).unwrap();
        let (hello, proof) = rec.join().unwrap();
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || server(&mut s, &k, ROLE_DAEMON));
        c.write_all(&hello).unwrap();
        let mut reply = [0u8; 64];
        c.read_exact(&mut reply).unwrap();
        c.write_all(&proof).unwrap();
        assert_eq!(t.join().unwrap(), Err(AuthError::WrongKey));
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
