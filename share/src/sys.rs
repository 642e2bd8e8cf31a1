//! The Linux calls std does not offer: pidfds (wait for a process inside a
//! poll loop), signalfd (SIGINT/SIGTERM as events, with their sender),
//! personality and the parent-death signal for the children we start, and
//! the stats memfd.
//!
//! The `child_*` functions run between fork and exec (in `pre_exec`): they
//! only make async-signal-safe system calls.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A descriptor that becomes readable when process `pid` exits (our child,
/// not yet reaped, so the pid cannot have been reused).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // pidfds are close-on-exec from birth.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// poll(2) over `fds` for at most `timeout_ms` (-1: no limit). An
/// interrupted poll reports nothing ready.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

pub fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
}

pub fn kill(pid: u32, sig: i32) {
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Blocks `sigs` in the calling thread (threads started later inherit the
/// mask) and returns a signalfd that reads them.
pub fn signalfd(sigs: &[i32]) -> io::Result<OwnedFd> {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        let fd = cvt(libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// One pending signal from a signalfd: (number, si_code). si_code <= 0
/// means another process sent it (kill, sigqueue, tkill); a terminal's
/// ^C is SI_KERNEL and already reached the whole foreground process group.
pub fn read_signal(fd: &OwnedFd) -> Option<(i32, i32)> {
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            &mut info as *mut _ as *mut libc::c_void,
            std::mem::size_of::<libc::signalfd_siginfo>(),
        )
    };
    if n as usize != std::mem::size_of::<libc::signalfd_siginfo>() {
        return None;
    }
    Some((info.ssi_signo as i32, info.ssi_code))
}

/// A zeroed memfd of `size` bytes; close-on-exec (the child that must
/// inherit it clears the flag between fork and exec).
pub fn memfd(name: &str, size: u64) -> io::Result<File> {
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::other("memfd name"))?;
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
    cvt(fd)?;
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size)?;
    Ok(f)
}

/// Fills `b` from the kernel's random source.
pub fn random_bytes(b: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < b.len() {
        let r = unsafe { libc::getrandom(b[got..].as_mut_ptr() as *mut libc::c_void, b.len() - got, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += r as usize;
    }
    Ok(())
}

/// A pipe holding `data` (at most a pipe's buffer), for a child to read:
/// the read end, close-on-exec (the child clears the flag between fork and
/// exec, reads it all and closes it). The write end is closed: the child
/// sees the end after the data.
pub fn pipe_with(data: &[u8]) -> io::Result<OwnedFd> {
    let mut fds = [0 as libc::c_int; 2];
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    use std::io::Write;
    (&w).write_all(data)?;
    drop(w);
    Ok(r)
}

/// An account to run as (`bunkai share node --user`).
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

pub fn lookup_user(name: &str) -> io::Result<User> {
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::other("bad user name"))?;
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 16384];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    let r = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr() as *mut libc::c_char, buf.len(), &mut out) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    if out.is_null() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no user {name}")));
    }
    Ok(User { name: name.to_string(), uid: pw.pw_uid, gid: pw.pw_gid })
}

/// Drops to `u` for good: its groups, then its gid, then its uid.
pub fn become_user(u: &User) -> io::Result<()> {
    let c = std::ffi::CString::new(u.name.as_str()).map_err(|_| io::Error::other("bad user name"))?;
    unsafe {
        cvt(libc::initgroups(c.as_ptr(), u.gid as libc::gid_t))?;
        cvt(libc::setgid(u.gid))?;
        cvt(libc::setuid(u.uid))?;
        // Root must not be regained.
        if libc::setuid(0) == 0 {
            return Err(io::Error::other("could still become root after dropping to the user"));
        }
    }
    Ok(())
}

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

pub fn parent_pid() -> u32 {
    unsafe { libc::getppid() as u32 }
}

/// Between fork and exec: the shared process's layout must be the same on
/// every host, so no address-space randomisation.
pub fn child_no_aslr() -> io::Result<()> {
    unsafe {
        let cur = libc::personality(0xffff_ffff);
        cvt(cur)?;
        cvt(libc::personality((cur as libc::c_ulong | libc::ADDR_NO_RANDOMIZE as libc::c_ulong) as _))?;
    }
    Ok(())
}

/// Between fork and exec: die with the thread that started us (`parent`
/// is the starting process's pid, read before the fork: if it is already
/// gone, the signal would never come).
pub fn child_die_with_parent(parent: u32) -> io::Result<()> {
    unsafe {
        cvt(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0))?;
        if libc::getppid() as u32 != parent {
            return Err(io::Error::other("the parent exited"));
        }
    }
    Ok(())
}

/// Between fork and exec: let `fd` survive exec.
pub fn child_keep_fd(fd: RawFd) -> io::Result<()> {
    unsafe {
        cvt(libc::fcntl(fd, libc::F_SETFD, 0))?;
    }
    Ok(())
}

/// Between fork and exec: no blocked signals (ours are blocked for the
/// signalfd; the program must get them).
pub fn child_unblock_signals() -> io::Result<()> {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        let r = libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
    }
    Ok(())
}

/// RLIMIT_STACK as (soft, hard); RLIM_INFINITY is u64::MAX. The stack
/// limit decides where the kernel puts the mmap base (and whether the
/// layout is the legacy one), so a replica gets the home host's.
pub fn stack_limit() -> io::Result<(u64, u64)> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    unsafe { cvt(libc::getrlimit(libc::RLIMIT_STACK, &mut r))? };
    Ok((r.rlim_cur, r.rlim_max))
}

/// Between fork and exec: the home host's stack limit (raising the hard
/// limit only if it must, which needs privilege).
pub fn child_set_stack_limit(soft: u64) -> io::Result<()> {
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        cvt(libc::getrlimit(libc::RLIMIT_STACK, &mut r))?;
        r.rlim_cur = soft;
        if r.rlim_max < soft {
            r.rlim_max = soft;
        }
        cvt(libc::setrlimit(libc::RLIMIT_STACK, &r))?;
    }
    Ok(())
}
