//! Passing file descriptors over a Unix stream socket (`SCM_RIGHTS`), the
//! one implementation for every crate: the confined file-system helper hands
//! the server the file it opened inside the sandbox's view (`fs/open` under a
//! sandbox: the kernel checked the policy), and the in-sandbox launcher hands
//! the bridge its seccomp listener (transparent TCP).
//! (Raw libc: nix's socket feature needs a crate this build could not fetch.)

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors accepted in one message.
const MAX_FDS: usize = 4;

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    unsafe { libc::CMSG_SPACE((fds * size_of::<RawFd>()) as u32) as usize }
}

/// Sends `data` on the socket `sock` with `fds` (at most 4) attached to its
/// first byte. Returns the bytes sent (the caller writes the rest plainly).
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    if fds.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::other("between 1 and 4 descriptors"));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = vec![0u8; cmsg_space(fds.len())];
    // SAFETY: a zeroed msghdr is valid; every pointer set below points into
    // locals that outlive the sendmsg call, with their true lengths.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cbuf.len() as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        let data = libc::CMSG_DATA(cmsg) as *mut RawFd;
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), *fd);
        }
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// One `recvmsg` into `buf`, appending the descriptors that came with it to
/// `fds` (close-on-exec; at most [`MAX_FDS`]). Returns the bytes read (0 at
/// end of file); `Interrupted` is the caller's to retry.
fn recv_once(sock: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = vec![0u8; cmsg_space(MAX_FDS)];
    // SAFETY: as in send_with_fds; the kernel writes at most the lengths
    // given, and each descriptor received is owned from here on.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cbuf.len() as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..bytes / size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Ok(n as usize)
    }
}

/// Reads `sock` to end of file (at most `limit` bytes), collecting every
/// descriptor that came with the data (close-on-exec).
pub fn recv_all(sock: &OwnedFd, limit: u64) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = Vec::new();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match recv_once(sock.as_raw_fd(), &mut buf, &mut fds) {
            Ok(0) => return Ok((data, fds)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        data.extend_from_slice(&buf[..n]);
        if data.len() as u64 > limit {
            return Err(io::Error::other("response too large"));
        }
    }
}

/// Sends the one descriptor `fd` over `sock` with a single byte.
pub fn send_fd(sock: RawFd, fd: RawFd) -> io::Result<()> {
    match send_with_fds(sock, &[1], &[fd])? {
        1 => Ok(()),
        _ => Err(io::Error::other("the descriptor was not sent")),
    }
}

/// Receives one descriptor sent by [`send_fd`] (close-on-exec). Errors: the
/// socket ended, or its byte came without a descriptor.
pub fn recv_fd(sock: RawFd) -> io::Result<OwnedFd> {
    let mut fds = Vec::new();
    match recv_once(sock, &mut [0u8], &mut fds)? {
        1 => fds
            .pop()
            .ok_or_else(|| io::Error::other("no descriptor received")),
        _ => Err(io::Error::other("no descriptor received")),
    }
}

/// A connected pair of close-on-exec Unix stream sockets.
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two descriptors we then own.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
