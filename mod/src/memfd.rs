//! The zero-copy load's image: a memfd laid out like the module's staged
//! memory in the host (RX part, then the RW part's data), mapped shared in
//! the server so the linker writes straight into it, then passed to the host
//! with SCM_RIGHTS (proto::Host::map), which maps it over the staged memory.
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
}

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

/// The module's memory, writable here.
pub struct MemImage {
    fd: OwnedFd,
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

    /// The two parts, RX at [0, rx_len) and RW from rx_len on.
    pub fn split(&mut self, rx_len: usize) -> (&mut [u8], &mut [u8]) {
        let all = unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) };
        all.split_at_mut(rx_len.min(self.len))
    }

    pub fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for MemImage {
    fn drop(&mut self) {
        unsafe { munmap(self.ptr as *mut c_void, self.len.max(1)) };
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
}
