//! Unprivileged mounting through the setuid `fusermount3` helper.
//!
//! `fuser` first tries to open `/dev/fuse` itself, which fails outright where
//! the device is root-only (as on some hosts and containers) even though
//! `fusermount3` could mount. So for an unprivileged daemon we always ask
//! `fusermount3`, which opens the device, mounts, and passes the fd back over
//! a socket (`_FUSE_COMMFD`, SCM_RIGHTS), as libfuse does.
//!
//! Locks: none; it runs once, before the session serves.

// The daemon answers errors, never unwraps them (tests may; see clippy.toml).
#![deny(clippy::unwrap_used)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

pub fn binary() -> Option<&'static str> {
    ["fusermount3", "fusermount"].into_iter().find(|b| {
        Command::new(b)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    })
}

/// Mounts a FUSE filesystem at `root` with `options` (comma-separated mount
/// options) and returns the `/dev/fuse` fd serving it.
pub fn mount(root: &Path, options: &str) -> io::Result<OwnedFd> {
    let bin = binary().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "fusermount3 not found (install the fuse3 package)",
        )
    })?;
    let (ours, theirs) = UnixStream::pair()?;
    let their_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(bin);
    cmd.arg("-o")
        .arg(options)
        .arg("--")
        .arg(root)
        .env("_FUSE_COMMFD", their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and calls only fcntl, which is
    // async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(their_fd, libc::F_GETFD);
            libc::fcntl(their_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    match receive_fd(&ours) {
        Ok(fd) => {
            let _ = child.wait_with_output();
            Ok(fd)
        }
        Err(_) => {
            let out = child.wait_with_output()?;
            let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
            Err(io::Error::other(if msg.is_empty() {
                format!("{bin} failed ({})", out.status)
            } else {
                msg
            }))
        }
    }
}

fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one control message carrying one fd.
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: `msghdr` is plain data (integers and null pointers), for which all zeros is a
    // valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (one byte of `byte`) and `cbuf` (`space` bytes), all of
        // which outlive the call; the kernel writes within those lengths.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break n;
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "fusermount sent nothing",
        ));
    }
    // SAFETY: `msg` is the header recvmsg filled in; its control buffer `cbuf` is still alive.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no fd from fusermount",
        ));
    }
    // SAFETY: `cmsg` is not null and points into `cbuf`, at a header recvmsg wrote.
    let (level, kind) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type) };
    if level != libc::SOL_SOCKET || kind != libc::SCM_RIGHTS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "unexpected message from fusermount",
        ));
    }
    // SAFETY: an `SCM_RIGHTS` message from recvmsg carries at least one int after its header,
    // inside `cbuf`; it may be unaligned, so it is read unaligned.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::c_int) };
    if fd < 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad fd from fusermount",
        ));
    }
    // SAFETY: `fd` was just received with `MSG_CMSG_CLOEXEC`; it is ours and nothing else owns
    // it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
