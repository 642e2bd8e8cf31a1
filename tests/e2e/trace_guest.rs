//! The guest of `bunkai trace`'s full-system mode (issue 22): the
//! initramfs built from Debian's packages by trace/guest/build.sh boots
//! Debian's kernel under QEMU's TCG (no KVM) and its Apache serves the
//! paper's two requests, byte for byte, to the host through QEMU's user
//! network on loopback. The full-system recording builds on this.

use bunkai_e2e::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One HTTP/1.0 GET on loopback; the body of a 200 answer.
fn get(port: u16, path: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let head_end = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("GET {path}: {all:?}"));
    let head = String::from_utf8_lossy(&all[..head_end]);
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    all[head_end + 4..].to_vec()
}

#[test]
fn the_guest_boots_and_serves_the_papers_requests() {
    let dir = tempfile::tempdir().unwrap();
    let guest = dir.path().join("guest");
    let b = Command::new("bash").arg(root().join("trace/guest/build.sh")).arg(&guest).output().unwrap();
    assert!(
        b.status.success(),
        "trace/guest/build.sh failed (scripts/install-deps.sh installs what it needs): {}",
        String::from_utf8_lossy(&b.stderr)
    );
    let manifest = std::fs::read_to_string(guest.join("manifest")).unwrap();
    for f in ["./usr/sbin/apache2", "./www/cgi-bin/hello.cgi", "./www/htdocs/index.html", "./bin/busybox", "./init"] {
        assert!(manifest.lines().any(|l| l == f), "{f} is not in the initramfs:\n{manifest}");
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut q = Command::new("qemu-system-x86_64");
    q.args(["-accel", "tcg", "-m", "512", "-nographic", "-no-reboot", "-kernel"])
        .arg(guest.join("vmlinuz"))
        .arg("-initrd")
        .arg(guest.join("initrd.gz"))
        .args(["-append", "console=ttyS0 quiet panic=-1", "-netdev"])
        .arg(format!("user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:80"))
        .args(["-device", "e1000,netdev=n0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let what = describe(&q);
    let mut child = q.spawn().unwrap_or_else(|e| panic!("{what}: {e} (scripts/install-deps.sh installs qemu-system-x86)"));
    kill_after(&child, Duration::from_secs(600), &what);
    let lines = stdout_lines(&mut child);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(300);
    let mut console = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) => {
                console.push_str(&l);
                console.push('\n');
                if l.contains("GUEST-READY") {
                    break;
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what}: no GUEST-READY on the console within 300 s:\n{console}");
            }
        }
    }
    let booted = t0.elapsed();
    let html = get(port, "/index.html");
    let cgi = get(port, "/cgi-bin/hello.cgi");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(html, std::fs::read(root().join("trace/guest/index.html")).unwrap(), "the HTML page");
    assert_eq!(String::from_utf8_lossy(&cgi), "Hello World.\n", "the CGI program's answer");
    eprintln!("the guest booted to Apache in {:.1} s", booted.as_secs_f64());
}
