//! Fuzzing of every parser of untrusted input on the tool side: what a
//! node reads before and after the handshake (the handshake itself, JSON
//! request lines with their MACs), the key file, and the stats page the
//! program's process wrote. Each test mutates valid inputs (bytes flipped,
//! cut, spliced, repeated) with a fixed-seed generator, so a failure
//! reproduces, and asserts more than "no panic": nothing authenticates
//! without the key, a changed line never passes its MAC, a refused input
//! gets a one-line error, an accepted one means what it says.

#[cfg(test)]
mod tests {
    use crate::auth::{self, AuthError, LineMac};
    use crate::proto::{self, Request, Spawn};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// xorshift64*: fixed seeds, reproducible runs.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545F4914F6CDD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// One random change to `v`.
    fn mutate(r: &mut Rng, v: &mut Vec<u8>) {
        match r.below(6) {
            0 if !v.is_empty() => {
                let i = r.below(v.len());
                v[i] ^= 1 << r.below(8);
            }
            1 if !v.is_empty() => {
                let i = r.below(v.len());
                v[i] = r.next() as u8;
            }
            2 => v.truncate(r.below(v.len() + 1)),
            3 => {
                let i = r.below(v.len() + 1);
                let b = r.next() as u8;
                v.insert(i, b);
            }
            4 if !v.is_empty() => {
                let (a, b) = (r.below(v.len()), r.below(v.len()));
                let (lo, hi) = (a.min(b), a.max(b));
                let piece = v[lo..hi].to_vec();
                let at = r.below(v.len() + 1);
                v.splice(at..at, piece);
            }
            _ => {
                let i = r.below(v.len() + 1);
                let b = b"\"{}[],:\\\t\n0123456789-e.abcdefnulltrue"[r.below(37)];
                v.insert(i, b);
            }
        }
    }

    fn spawn() -> Spawn {
        Spawn {
            argv: vec!["/usr/bin/pigz".into(), "-p".into(), "3".into()],
            env: vec![("PATH".into(), "/usr/bin".into()), ("LD_PRELOAD".into(), "/opt/b/libbunkai-share.so".into())],
            cwd: "/tmp".into(),
            home: "10.0.0.1:4000".into(),
            host: 1,
            run_id: "0123456789abcdef0123456789abcdef".into(),
            version: proto::PROTOCOL_VERSION,
            stack_limit: Some(8 << 20),
        }
    }

    /// Mutated request lines: an accepted one re-serializes to a request
    /// that parses to itself (it means exactly what it says); a refused
    /// one gets one line that says what to do.
    #[test]
    fn request_lines() {
        let mut r = Rng(0x5eed_0001);
        let base = serde_json::to_vec(&Request::Spawn(spawn())).unwrap();
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20000 {
            let mut v = base.clone();
            for _ in 0..1 + r.below(4) {
                mutate(&mut r, &mut v);
            }
            let line = String::from_utf8_lossy(&v);
            match proto::parse_request(&line) {
                Ok(req) => {
                    accepted += 1;
                    let again = serde_json::to_string(&req).unwrap();
                    assert_eq!(proto::parse_request(&again).unwrap(), req, "{line}");
                    if let Request::Spawn(s) = &req {
                        assert_eq!(s.version, proto::PROTOCOL_VERSION, "{line}");
                    }
                }
                Err(e) => {
                    refused += 1;
                    assert!(!e.contains('\n'), "not one line: {e}");
                    assert!(
                        e.starts_with("not a JSON message") || e.starts_with("bad request") || e.starts_with("protocol version"),
                        "{e}"
                    );
                    assert!(e.ends_with(')') || e.ends_with('?'), "no fix given: {e}");
                }
            }
        }
        assert!(accepted > 100 && refused > 10000, "accepted {accepted}, refused {refused}");
    }

    /// Sealed lines changed in any way never open; unchanged ones do, once
    /// and in order.
    #[test]
    fn line_macs() {
        let mut r = Rng(0x5eed_0002);
        let key = [0x42u8; 32];
        let mut sender = LineMac::new(key, true);
        let mut receiver = LineMac::new(key, false);
        for n in 0..5000 {
            let line = format!(r#"{{"kill":{}, "n":{n}}}"#, n % 2 == 0);
            let sealed = sender.seal(&line);
            let mut v = sealed.clone().into_bytes();
            mutate(&mut r, &mut v);
            let changed = String::from_utf8_lossy(&v).to_string();
            if changed != sealed {
                let mut probe = receiver.clone();
                assert!(probe.open(&changed).is_err(), "a changed line opened: {changed}");
            }
            assert_eq!(receiver.open(&sealed).unwrap(), line);
            assert!(receiver.open(&sealed).is_err(), "a line opened twice");
        }
    }

    /// Random and mutated handshakes against the server: a flight under
    /// another key, noise, a valid flight changed on the way, and valid
    /// flights. Only a flight under the key that arrives whole (what
    /// follows it is not the handshake's) authenticates, with its request
    /// unchanged; a flight under another key gets REFUSED; every refusal
    /// says why in a known phrase.
    #[test]
    fn handshakes_without_the_key() {
        let mut r = Rng(0x5eed_0003);
        let key = [0x17u8; 32];
        // up for longer than the window: a valid flight is taken at once
        let fresh = std::sync::Arc::new(auth::Fresh::up_since(auth::now_ns() - 10 * auth::WINDOW.as_nanos() as u64));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (mut accepted, mut whole) = (0, 0);
        for round in 0..400 {
            let mut c = TcpStream::connect(addr).unwrap();
            let (mut s, _) = l.accept().unwrap();
            let fr = fresh.clone();
            let t = std::thread::spawn(move || auth::server(&mut s, &key, auth::ROLE_DAEMON, &fr));
            let first: Vec<u8> = (0..r.below(300)).map(|_| r.next() as u8).collect();
            let mut nc = [0u8; 32];
            nc.iter_mut().for_each(|b| *b = r.next() as u8);
            let kind = round % 4;
            let k = if kind == 0 { [0x18u8; 32] } else { key };
            let good = auth::flight(&k, auth::ROLE_DAEMON, &first, &nc, auth::now_ns(), &c.local_addr().unwrap(), &addr).unwrap();
            let sent: Vec<u8> = match kind {
                1 => (0..r.below(200)).map(|_| r.next() as u8).collect(),
                2 => {
                    let mut v = good.clone();
                    mutate(&mut r, &mut v);
                    v
                }
                _ => good.clone(),
            };
            // Then what a peer without the key can offer as the answer to a
            // challenge, and the end of what it says: a cut flight ends the
            // server's wait at once.
            let proof: Vec<u8> = (0..r.below(40)).map(|_| r.next() as u8).collect();
            let _ = c.write_all(&sent);
            let _ = c.write_all(&proof);
            let _ = c.shutdown(std::net::Shutdown::Write);
            c.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
            let mut reply = [0u8; auth::REPLY];
            let status = c.read_exact(&mut reply).ok().map(|_| u32::from_le_bytes(reply[..4].try_into().unwrap()));
            drop(c);
            let arrived_whole = k == key && sent.len() >= good.len() && sent[..good.len()] == good[..];
            whole += arrived_whole as usize;
            match t.join().unwrap() {
                Ok(got) => {
                    assert!(arrived_whole, "round {round}: a flight without the key authenticated");
                    assert_eq!(got.first, first, "round {round}: the request changed on the way");
                    assert_eq!(got.challenged, None, "round {round}");
                    assert_eq!(status, Some(auth::ACCEPTED));
                    accepted += 1;
                }
                Err(e) => {
                    assert!(!arrived_whole, "round {round}: a whole flight under the key was refused: {e}");
                    assert!(
                        matches!(e, AuthError::WrongKey | AuthError::Closed | AuthError::Protocol | AuthError::TimedOut),
                        "round {round}: {e:?}"
                    );
                    if kind == 0 {
                        assert_eq!(status, Some(auth::REFUSED), "round {round}: another key's flight was not refused");
                        assert_eq!(e, AuthError::WrongKey);
                    }
                }
            }
        }
        assert_eq!(accepted, whole);
        assert!(accepted >= 100, "only {accepted} valid flights were taken");
    }

    /// Key files: only 64 hex digits are a key.
    #[test]
    fn key_texts() {
        let mut r = Rng(0x5eed_0004);
        let good = "0123456789abcdef".repeat(4);
        for _ in 0..20000 {
            let mut v = good.clone().into_bytes();
            mutate(&mut r, &mut v);
            let t = String::from_utf8_lossy(&v);
            let ok = t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit());
            assert_eq!(crate::key::parse(&t).is_ok(), ok, "{t:?}");
        }
    }

    /// Damaged stats pages: no panic, another version refused in one line,
    /// counts never read past the tables.
    #[test]
    fn stats_pages() {
        let mut r = Rng(0x5eed_0005);
        let mut page = vec![0u8; crate::stats::BKS_STATS_SIZE as usize];
        page[..4].copy_from_slice(&crate::stats::BKS_MAGIC.to_le_bytes());
        page[4..8].copy_from_slice(&crate::stats::BKS_VERSION.to_le_bytes());
        page[8..12].copy_from_slice(&3u32.to_le_bytes());
        for _ in 0..3000 {
            let mut v = page.clone();
            for _ in 0..1 + r.below(8) {
                let i = r.below(64);
                v[i] = r.next() as u8;
            }
            if r.below(4) == 0 {
                v.truncate(r.below(v.len() + 1));
            }
            match crate::stats::parse(&v) {
                Ok(Some(s)) => {
                    assert!(s.host.len() <= crate::stats::BKS_MAX_HOSTS);
                    assert!(s.threads.len() <= crate::stats::BKS_MAX_THREADS);
                }
                Ok(None) => {}
                Err(e) => assert!(!e.contains('\n') && e.contains('('), "{e}"),
            }
        }
    }
}
