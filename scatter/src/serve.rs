//! `bunkai scatter serve`: a small static HTTP server over a scatter output
//! directory (any static server will do; this one needs nothing else).

use crate::index::safe_relative;
use crate::layout::{INDEX, MANIFEST};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct Server {
    server: std::sync::Arc<tiny_http::Server>,
    root: PathBuf,
    pub url: String,
}

impl Server {
    /// Binds `listen` (port 0 picks one) over the directory `root`.
    pub fn bind(root: &Path, listen: &str) -> Result<Server> {
        if !root.join(MANIFEST).exists() {
            bail!("{} is not a scatter output (give the -o directory of bunkai scatter)", root.display());
        }
        if !root.join(INDEX).exists() {
            eprintln!(
                "bunkai serve: warning: {} is not grouped yet; bunkai scatter run needs bunkai scatter profile + group first",
                root.display()
            );
        }
        let server = tiny_http::Server::from_listener(listener(listen)?, None)
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e} (choose another --listen)"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .context("the server has no IP address")?;
        Ok(Server {
            server: std::sync::Arc::new(server),
            root: root.canonicalize()?,
            url: format!("http://{addr}/"),
        })
    }

    /// Serves until the process ends, on `threads` threads (the preload
    /// thread and a demand fetch come in parallel).
    pub fn serve(self, threads: usize, verbose: bool) -> Result<()> {
        let mut handles = Vec::new();
        for _ in 0..threads.max(1) {
            let server = self.server.clone();
            let root = self.root.clone();
            handles.push(std::thread::spawn(move || loop {
                match server.recv() {
                    Ok(req) => respond(&root, req, verbose),
                    Err(_) => break,
                }
            }));
        }
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }
}

/// A listening socket with TCP_NODELAY, which accepted sockets inherit:
/// tiny_http writes headers and body separately, and with Nagle's algorithm
/// the body then waits for the client's delayed ACK (40 ms per request).
fn listener(listen: &str) -> Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::ToSocketAddrs;
    let addr = listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("{listen} is not an address (give HOST:PORT, e.g. 127.0.0.1:8000)"))?;
    let bad = |e: std::io::Error| anyhow::anyhow!("cannot listen on {listen}: {e} (choose another --listen)");
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(bad)?;
    s.set_reuse_address(true).map_err(bad)?;
    s.set_tcp_nodelay(true).map_err(bad)?;
    s.bind(&addr.into()).map_err(bad)?;
    s.listen(128).map_err(bad)?;
    Ok(s.into())
}

fn respond(root: &Path, req: tiny_http::Request, verbose: bool) {
    use tiny_http::{Header, Method, Response, StatusCode};
    let url = req.url().split('?').next().unwrap_or("").to_string();
    let rel = url.trim_start_matches('/');
    let decoded = rel.to_string(); // our file names never need escapes
    let path = if safe_relative(&decoded) { Some(root.join(&decoded)) } else { None };
    let is_get = matches!(req.method(), Method::Get | Method::Head);
    let file = path
        .as_ref()
        .filter(|_| is_get)
        .filter(|p| p.is_file())
        .and_then(|p| std::fs::File::open(p).ok());
    let status;
    let result = match file {
        Some(f) => {
            status = 200;
            let ctype = Header::from_bytes(&b"Content-Type"[..], &b"application/octet-stream"[..]).unwrap();
            req.respond(Response::from_file(f).with_header(ctype))
        }
        None => {
            status = if is_get { 404 } else { 405 };
            req.respond(Response::from_string("not found\n").with_status_code(StatusCode(status)))
        }
    };
    if verbose {
        eprintln!("bunkai serve: {status} /{rel}{}", if result.is_err() { " (client went away)" } else { "" });
    }
}

/// Stdout helper for `bunkai scatter serve`: print the URL and flush, so scripts
/// can read it as soon as the server is ready.
pub fn announce(url: &str) -> Result<()> {
    let mut o = std::io::stdout();
    writeln!(o, "{url}")?;
    o.flush()?;
    Ok(())
}
