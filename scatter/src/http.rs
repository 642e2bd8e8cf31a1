//! The HTTP client of `bunkai scatter run` (libcurl): bounded GETs with retries.

use anyhow::{bail, Result};
use std::time::Duration;

/// GET with retries and backoff (5 attempts, 100 ms doubling). `limit`
/// bounds the body: a bigger answer is not the file we asked for.
pub fn http_get(url: &str, limit: u64) -> Result<Vec<u8>> {
    let mut delay = Duration::from_millis(100);
    let mut last = String::new();
    for attempt in 0..5 {
        if attempt > 0 {
            std::thread::sleep(delay);
            delay *= 2;
        }
        match get_once(url, limit) {
            Ok(b) => return Ok(b),
            Err(e) => last = format!("{e:#}"),
        }
    }
    bail!("cannot fetch {url}: {last}, after 5 attempts (check that the origin is up and the URL is right)")
}

fn get_once(url: &str, limit: u64) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut h = curl::easy::Easy::new();
    h.url(url)?;
    h.connect_timeout(Duration::from_secs(10))?;
    h.low_speed_limit(1)?;
    h.low_speed_time(Duration::from_secs(20))?;
    let mut too_big = false;
    {
        let mut t = h.transfer();
        t.write_function(|d| {
            if body.len() as u64 + d.len() as u64 > limit {
                too_big = true;
                return Ok(0);
            }
            body.extend_from_slice(d);
            Ok(d.len())
        })?;
        let r = t.perform();
        drop(t);
        if too_big {
            bail!("the answer is larger than expected ({limit} bytes)");
        }
        r?;
    }
    let code = h.response_code()?;
    if code != 200 {
        bail!("HTTP {code}");
    }
    Ok(body)
}
