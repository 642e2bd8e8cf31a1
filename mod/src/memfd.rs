//! The zero-copy load's image: a memfd laid out like the module's staged
//! memory in the host (RX part, then the RW part's data), mapped shared in
//! the server so the linker writes straight into it, then passed to the host
//! with SCM_RIGHTS (proto::Host::map), which maps it over the staged memory.
//! Before it goes, the server unmaps its own writable mapping and seals the
//! memfd fully (no write, no resize, no more seals): after that nobody, not
//! even this process, can change the code the host will run. (F_SEAL_WRITE
//! cannot be set while a shared writable mapping exists, which is why the
//! mapping goes first; the host refuses a memfd that is not fully sealed.)
//! Nothing is copied through the socket, and the pages the linker wrote are
//! the pages the host runs.
//!
//! std has no memfd, mmap or SCM_RIGHTS (the ancillary-data API is
//! unstable), so the few calls are declared here against glibc, x86-64
//! layouts (the only target of bunkai), rather than pulling in a crate.

use anyhow::{bail, Result};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::raw::{c_char, c_int, c_uint, c_void};

extern "C" {
    fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    fn sendmsg(fd: c_int, msg: *const MsgHdr, flags: c_int) -> isize;
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
}

const F_ADD_SEALS: c_int = 1033;
const F_GET_SEALS: c_int = 1034;
const F_SEAL_SEAL: c_int = 1;
const F_SEAL_SHRINK: c_int = 2;
const F_SEAL_GROW: c_int = 4;
const F_SEAL_WRITE: c_int = 8;
/// Every seal: what the host requires before it maps a module's memfd.
pub const SEALS: c_int = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

const MFD_CLOEXEC: c_uint = 1;
const MFD_ALLOW_SEALING: c_uint = 2;
/// Linux 6.3+: executable memfd even where vm.memfd_noexec makes the
/// default no-exec; older kernels refuse the flag, so it is tried first.
const MFD_EXEC: c_uint = 0x10;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_SHARED: c_int = 1;
const MADV_POPULATE_WRITE: c_int = 23;
const SOL_SOCKET: c_int = 1;
const SCM_RIGHTS: c_int = 1;
const MSG_NOSIGNAL: c_int = 0x4000;

#[repr(C)]
struct IoVec {
    base: *const c_void,
    len: usize,
}

#[repr(C)]
struct MsgHdr {
    name: *mut c_void,
    namelen: u32,
    iov: *const IoVec,
    iovlen: usize,
    control: *mut c_void,
    controllen: usize,
    flags: c_int,
}

/// A cmsghdr carrying one descriptor: CMSG_SPACE(sizeof(int)) = 24 bytes.
#[repr(C, align(8))]
struct OneFd {
    len: usize,
    level: c_int,
    ty: c_int,
    fd: c_int,
    _pad: c_int,
}

/// The module's memory, writable here until `seal`.
pub struct MemImage {
    fd: OwnedFd,
    /// Null once sealed (the writable mapping is gone).
    ptr: *mut u8,
    len: usize,
}

impl MemImage {
    /// A zero-filled memfd of `len` bytes (a multiple of the page size),
    /// mapped shared. The first `populate` bytes (what the link writes) get
    /// their pages now, in one call: faulting them in one at a time while
    /// copying costs more, and its cost would not be linear in the size.
    /// The memfd is named after the module: the host's /proc/PID/maps then
    /// shows `/memfd:bunkai-mod:NAME (deleted)` where the module lives.
    pub fn new(module: &str, len: usize, populate: usize) -> Result<MemImage> {
        let cname: Vec<u8> = format!("bunkai-mod:{module}").bytes().filter(|&b| b != 0).take(240).chain([0]).collect();
        let name = cname.as_ptr() as *const c_char;
        let mut fd = unsafe { memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC) };
        if fd < 0 {
            fd = unsafe { memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING) };
        }
        if fd < 0 {
            bail!("memfd_create: {}", std::io::Error::last_os_error());
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let f = File::from(fd);
        f.set_len(len as u64).map_err(|e| anyhow::anyhow!("ftruncate of the module's memfd: {e}"))?;
        let fd = OwnedFd::from(f);
        let p = unsafe { mmap(std::ptr::null_mut(), len.max(1), PROT_READ | PROT_WRITE, MAP_SHARED, fd.as_raw_fd(), 0) };
        if p as isize == -1 {
            bail!("mmap of the module's memfd: {}", std::io::Error::last_os_error());
        }
        let img = MemImage { fd, ptr: p as *mut u8, len };
        let populate = populate.min(len).div_ceil(4096) * 4096;
        if populate > 0 {
            // Best effort (Linux 5.14+); without it the copy faults them in.
            unsafe { madvise(p, populate.min(len), MADV_POPULATE_WRITE) };
        }
        Ok(img)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The two parts, RX at [0, rx_len) and RW from rx_len on. Empty once
    /// sealed.
    pub fn split(&mut self, rx_len: usize) -> (&mut [u8], &mut [u8]) {
        if self.ptr.is_null() {
            return (&mut [], &mut []);
        }
        let all = unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) };
        all.split_at_mut(rx_len.min(self.len))
    }

    /// The image, while it is mapped (empty once sealed: see `contents`).
    pub fn as_slice(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The image, read from the memfd (mapped or not).
    pub fn contents(&self) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let f = File::from(self.fd.try_clone()?);
        let mut v = vec![0u8; self.len];
        f.read_exact_at(&mut v, 0).map_err(|e| anyhow::anyhow!("reading back the module's memfd: {e}"))?;
        Ok(v)
    }

    /// Ends writing: unmaps our writable mapping, then seals the memfd
    /// against writes, resizing and further seals. From here on the image
    /// is what the host will run, whoever holds the descriptor.
    pub fn seal(&mut self) -> Result<()> {
        if !self.ptr.is_null() {
            unsafe { munmap(self.ptr as *mut c_void, self.len.max(1)) };
            self.ptr = std::ptr::null_mut();
        }
        let fd = self.fd.as_raw_fd();
        let have = unsafe { fcntl(fd, F_GET_SEALS) };
        if have >= 0 && have & SEALS == SEALS {
            return Ok(());
        }
        if unsafe { fcntl(fd, F_ADD_SEALS, SEALS) } != 0 {
            bail!("cannot seal the module's memfd: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The seals the memfd has now.
    pub fn seals(&self) -> i32 {
        unsafe { fcntl(self.fd.as_raw_fd(), F_GET_SEALS) }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for MemImage {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            unsafe { munmap(self.ptr as *mut c_void, self.len.max(1)) };
        }
    }
}

/// Sends `data` on the stream socket `sock` with `fd` attached
/// (SCM_RIGHTS), all of it.
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> std::io::Result<()> {
    let mut ctl = OneFd { len: 20, level: SOL_SOCKET, ty: SCM_RIGHTS, fd, _pad: 0 };
    let mut off = 0;
    while off < data.len() {
        let iov = IoVec { base: data[off..].as_ptr() as *const c_void, len: data.len() - off };
        let first = off == 0;
        let h = MsgHdr {
            name: std::ptr::null_mut(),
            namelen: 0,
            iov: &iov,
            iovlen: 1,
            control: if first { &mut ctl as *mut OneFd as *mut c_void } else { std::ptr::null_mut() },
            controllen: if first { std::mem::size_of::<OneFd>() } else { 0 },
            flags: 0,
        };
        let n = unsafe { sendmsg(sock, &h, MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        off += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memfd_image_is_zeroed_writable_and_passes_over_a_socket() {
        let mut m = MemImage::new("t", 3 * 4096, 4096).unwrap();
        assert!(m.as_slice().iter().all(|&b| b == 0));
        let (rx, rw) = m.split(4096);
        rx[0] = 0xc3;
        rw[5] = 7;
        assert_eq!(m.as_slice()[4096 + 5], 7);
        // The bytes arrive whole (the host's side, recvmsg, is tested end to end).
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        send_with_fd(a.as_raw_fd(), b"hello", m.fd()).unwrap();
        let mut buf = [0u8; 5];
        use std::io::Read;
        (&b).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }

    #[test]
    fn a_sealed_image_cannot_be_written_by_anyone() {
        let mut m = MemImage::new("t", 2 * 4096, 0).unwrap();
        m.split(4096).0[0] = 42;
        // A second shared writable mapping: sealing must not leave it usable.
        let other = unsafe { mmap(std::ptr::null_mut(), 4096, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd(), 0) };
        assert_ne!(other as isize, -1);
        assert!(m.seal().is_err(), "sealed against writes while a writable mapping exists");
        unsafe { munmap(other, 4096) };
        m.seal().unwrap();
        assert_eq!(m.seals() & SEALS, SEALS);
        assert!(m.as_slice().is_empty(), "our own writable mapping is gone");
        assert_eq!(m.contents().unwrap()[0], 42);
        // No new writable mapping, no write(), no resize.
        let p = unsafe { mmap(std::ptr::null_mut(), 4096, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd(), 0) };
        assert_eq!(p as isize, -1, "a writable mapping of a sealed memfd");
        let f = File::from(m.fd.try_clone().unwrap());
        use std::os::unix::fs::FileExt;
        assert!(f.write_at(&[1], 0).is_err());
        assert!(f.set_len(4096).is_err());
        assert_eq!(m.contents().unwrap()[0], 42);
    }
}
