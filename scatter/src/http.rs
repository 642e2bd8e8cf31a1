//! The HTTP client of `bunkai scatter run` (ureq): bounded GETs with
//! retries. ureq is linked into the binary: the CLI no longer loads
//! libcurl's 30 libraries at every start (`bunkai --version` included);
//! the launcher's own fetch library (scatter/runtime) keeps libcurl.

use anyhow::{bail, Result};
use std::io::Read;
use std::time::Duration;

/// GET with retries and backoff (5 attempts, 100 ms doubling). `limit`
/// bounds the body: a bigger answer is not the file we asked for.
pub fn http_get(url: &str, limit: u64) -> Result<Vec<u8>> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        // a stalled origin: no byte for 20 s
        .timeout_read(Duration::from_secs(20))
        // the index names exact paths on the origin
        .redirects(0)
        .build();
    let mut delay = Duration::from_millis(100);
    let mut last = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            std::thread::sleep(delay);
            delay *= 2;
        }
        match get_once(&agent, url, limit) {
            Ok(b) => return Ok(b),
            Err(e) => last = format!("{e:#}"),
        }
    }
    bail!("cannot fetch {url}: {last}, after 5 attempts (check that the origin is up and the URL is right)")
}

fn get_once(agent: &ureq::Agent, url: &str, limit: u64) -> Result<Vec<u8>> {
    let resp = match agent.get(url).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(code, _)) => bail!("HTTP {code}"),
        Err(ureq::Error::Transport(t)) => bail!("{t}"),
    };
    if resp.status() != 200 {
        bail!("HTTP {}", resp.status());
    }
    let mut body = Vec::new();
    resp.into_reader().take(limit + 1).read_to_end(&mut body)?;
    if body.len() as u64 > limit {
        bail!("the answer is larger than expected ({limit} bytes)");
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A one-shot origin on loopback answering `answer` to the first
    /// request; returns its URL.
    fn origin(answer: &'static [u8]) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/f", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for s in l.incoming().take(5) {
                let mut s = s.unwrap();
                let mut req = [0u8; 4096];
                let _ = s.read(&mut req);
                let _ = s.write_all(answer);
            }
        });
        url
    }

    #[test]
    fn bodies_status_codes_and_limits() {
        let ok = origin(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
        assert_eq!(http_get(&ok, 5).unwrap(), b"hello");
        let ok = origin(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
        let e = format!("{:#}", http_get(&ok, 4).unwrap_err());
        assert!(e.contains("larger than expected (4 bytes)"), "{e}");
        let gone = origin(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let e = format!("{:#}", http_get(&gone, 4).unwrap_err());
        assert!(e.contains("HTTP 404") && e.contains("after 5 attempts"), "{e}");
        let moved = origin(b"HTTP/1.1 301 Moved\r\nLocation: http://127.0.0.1:9/x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let e = format!("{:#}", http_get(&moved, 4).unwrap_err());
        assert!(e.contains("HTTP 301"), "{e}");
    }
}
