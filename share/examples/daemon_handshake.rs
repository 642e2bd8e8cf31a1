//! daemon_handshake: what the CLI's handshake with a node daemon
//! (share/src/auth.rs under the cluster key: the hello with the first
//! message sealed inside, the node's proof) adds to a connection, beside
//! the same connection without it, in the same run. The runtime's own
//! handshake is measured by bench/share/handshake.c.
//!
//!   daemon_handshake server PORT KEYFILE   PORT: plain, PORT+1: the
//!                                          handshake first; each connection
//!                                          gets 32 bytes (with the handshake:
//!                                          sealed in its hello) and answers 32
//!   daemon_handshake client IP PORT KEYFILE N
//!                                          N connections of each kind,
//!                                          interleaved: connect, [handshake,]
//!                                          message, answer, close; medians
//!                                          in ns as one JSON line
//!
//! Built by bench/share/run.py (`cargo build --release --example
//! daemon_handshake -p bunkai-share`).
use bunkai_share::{auth, key, proto};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

fn serve(l: TcpListener, key: auth::Key, with: bool) {
    // A node that has been up for longer than the window: before that,
    // every hello is challenged (auth.rs), which is not what this measures.
    let fresh = auth::Fresh::up_since(auth::now_ns() - 2 * auth::WINDOW.as_nanos() as u64);
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        proto::tune(&s);
        let mut b = [0u8; 32];
        if with {
            match auth::server(&mut s, &key, auth::ROLE_DAEMON, &fresh) {
                Ok(h) if h.first.len() == 32 && h.challenged.is_none() => b.copy_from_slice(&h.first),
                _ => continue,
            }
        } else if s.read_exact(&mut b).is_err() {
            continue;
        }
        let _ = s.write_all(&b);
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!("usage: daemon_handshake server PORT KEYFILE | client IP PORT KEYFILE N");
        std::process::exit(2)
    };
    match a.get(1).map(String::as_str) {
        Some("server") if a.len() == 4 => {
            let port: u16 = a[2].parse().unwrap_or_else(|_| usage());
            let k = key::load(Path::new(&a[3])).unwrap_or_else(|e| panic!("{e:#}"));
            let plain = TcpListener::bind(("0.0.0.0", port)).expect("listen");
            let hs = TcpListener::bind(("0.0.0.0", port + 1)).expect("listen");
            let t = std::thread::spawn(move || serve(hs, k, true));
            serve(plain, k, false);
            let _ = t.join();
        }
        Some("client") if a.len() == 6 => {
            let port: u16 = a[3].parse().unwrap_or_else(|_| usage());
            let k = key::load(Path::new(&a[4])).unwrap_or_else(|e| panic!("{e:#}"));
            let n: usize = a[5].parse().unwrap_or_else(|_| usage());
            let mut t = [Vec::with_capacity(n), Vec::with_capacity(n)];
            for _ in 0..n {
                for (kind, with) in [(0, false), (1, true)] {
                    let t0 = Instant::now();
                    let mut s = TcpStream::connect((a[2].as_str(), port + kind as u16)).expect("connect");
                    proto::tune(&s);
                    let mut b = [1u8; 32];
                    if with {
                        let h = auth::client(&mut s, &k, auth::ROLE_DAEMON, &b).expect("handshake");
                        assert!(!h.challenged, "the node challenged (clocks apart?)");
                    } else {
                        s.write_all(&b).expect("send");
                    }
                    s.read_exact(&mut b).expect("answer");
                    t[kind].push(t0.elapsed().as_nanos() as u64);
                }
            }
            for v in t.iter_mut() {
                v.sort_unstable();
            }
            println!(r#"{{"plain_ns":{},"handshake_ns":{},"n":{n}}}"#, t[0][n / 2], t[1][n / 2]);
        }
        _ => usage(),
    }
}
