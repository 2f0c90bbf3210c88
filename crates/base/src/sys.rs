//! Thin, safe wrappers over the `*at()` system calls the daemon uses.
//!
//! Invariant: every live-tree access goes through a directory fd opened
//! *before* the mount, plus a relative path with no leading `/`. Nothing here
//! ever takes an absolute path of the mounted root, because a path through the
//! mount point would send a request to our own daemon and deadlock it.
//! (The command line, which is not the daemon, passes [`CWD`] and an
//! absolute path where it must.) A directory is always a `BorrowedFd`,
//! never a number: what the kernel resolves a path from is open for the
//! whole call, by the type.
//!
//! Every other module calls the system through here (or through `std`):
//! each `unsafe` below carries a `// SAFETY:` line saying why it is sound
//! (enforced crate-wide by `clippy::undocumented_unsafe_blocks`). Locks:
//! none (processes and ids are `process`'s).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// The working directory as the `dir` of the `*at` calls: a relative
/// path from where the process runs, or an absolute one (the command
/// line's, never the daemon's: see above).
// SAFETY: AT_FDCWD is no fd and never closed: every `*at` call takes it
// for the working directory, and it is not -1 (what `BorrowedFd` keeps
// for its niche). Only the `*at` calls here are given it.
pub const CWD: BorrowedFd<'static> = unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) };

/// A relative path as the C string the kernel wants; the empty path is `.`.
pub fn cpath(rel: &[u8]) -> io::Result<CString> {
    if rel.is_empty() {
        return Ok(CString::new(".").expect("no NUL"));
    }
    CString::new(rel).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn openat(dir: BorrowedFd<'_>, rel: &[u8], flags: libc::c_int, mode: u32) -> io::Result<File> {
    let c = cpath(rel)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: `fd` was just returned by openat, and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub fn open_dir(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    let f = openat(
        dir,
        rel,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    Ok(OwnedFd::from(f))
}

pub fn empty_stat() -> libc::stat {
    // SAFETY: `stat` is plain integers, for which all zeros is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `lstat` relative to `dir` (never follows a final symlink).
pub fn lstatat(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<libc::stat> {
    let c = cpath(rel)?;
    let mut st = empty_stat();
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call. `st` is a valid `stat` to write.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// `stat` relative to `dir`, following a final symlink.
pub fn statat(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<libc::stat> {
    let c = cpath(rel)?;
    let mut st = empty_stat();
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call. `st` is a valid `stat` to write.
    check(unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, 0) })?;
    Ok(st)
}

/// Marks an open file so that reads through it leave its access time
/// alone (`O_NOATIME`; refused unless the caller owns the file or has
/// CAP_FOWNER, which is not an error worth reporting).
pub fn set_noatime(fd: &impl AsFd) {
    let fd = fd.as_fd().as_raw_fd();
    // SAFETY: fcntl takes and returns plain integers; a closed fd is EBADF.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 && flags & libc::O_NOATIME == 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NOATIME);
        }
    }
}

pub fn fstat(fd: &impl AsFd) -> io::Result<libc::stat> {
    let mut st = empty_stat();
    // SAFETY: `st` is a valid `stat` to write; the fd is borrowed for the call.
    check(unsafe { libc::fstat(fd.as_fd().as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub fn mkdirat(dir: BorrowedFd<'_>, rel: &[u8], mode: u32) -> io::Result<()> {
    let c = cpath(rel)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) }).map(drop)
}

/// A FIFO or socket node (`mode` holds its type).
pub fn mknodat(dir: BorrowedFd<'_>, rel: &[u8], mode: u32) -> io::Result<()> {
    let c = cpath(rel)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t, 0) }).map(drop)
}

/// Reserves blocks for `len` bytes from `offset` without changing the
/// file's size (`FALLOC_FL_KEEP_SIZE`): writes there need no allocation.
pub fn reserve(f: &impl AsFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe {
        libc::fallocate(
            f.as_fd().as_raw_fd(),
            libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
    .map(drop)
}

/// Whether the file has any extended attribute (ACLs and security labels
/// included); an error counts as yes.
pub fn has_xattrs(f: &impl AsFd) -> bool {
    // SAFETY: a null buffer of size 0 asks only for the size of the list.
    let n = unsafe { libc::flistxattr(f.as_fd().as_raw_fd(), std::ptr::null_mut(), 0) };
    n != 0
}

pub fn unlinkat(dir: BorrowedFd<'_>, rel: &[u8], remove_dir: bool) -> io::Result<()> {
    let c = cpath(rel)?;
    let flags = if remove_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(
    olddir: BorrowedFd<'_>,
    old: &[u8],
    newdir: BorrowedFd<'_>,
    new: &[u8],
    flags: u32,
) -> io::Result<()> {
    let o = cpath(old)?;
    let n = cpath(new)?;
    // SAFETY: both paths are NUL-terminated strings that outlive the call; both fds are
    // borrowed, so open for the call.
    check(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            o.as_ptr(),
            newdir.as_raw_fd(),
            n.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

pub fn symlinkat(target: &[u8], dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<()> {
    let t = CString::new(target).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let c = cpath(rel)?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) }).map(drop)
}

pub fn readlinkat(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<Vec<u8>> {
    let c = cpath(rel)?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes and the kernel writes at most that
        // many; `c` outlives the call.
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                c.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len() as libc::size_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

pub fn fchmodat(dir: BorrowedFd<'_>, rel: &[u8], mode: u32) -> io::Result<()> {
    let c = cpath(rel)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t, 0) }).map(drop)
}

/// Connects a unix stream socket to `path`, waiting at most `timeout`
/// for a listener whose queue is full (the kernel bounds a blocking
/// connect by the send timeout; std sets it only after connecting).
pub fn connect_unix(path: &[u8], timeout: std::time::Duration) -> io::Result<UnixStream> {
    // SAFETY: `sockaddr_un` is plain integers, for which all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.len() >= addr.sun_path.len() || path.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long for sun_path",
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(path) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket takes and returns plain integers.
    let fd =
        check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket, and nothing else owns it.
    let sock = unsafe { UnixStream::from_raw_fd(fd) };
    sock.set_write_timeout(Some(timeout))?;
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a valid `sockaddr_un` of `len` bytes that outlives the call; the fd is
    // borrowed for it.
    let got = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    match check(got) {
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("nobody accepted within {} s", timeout.as_secs()),
        )),
        Err(e) => Err(e),
        Ok(_) => Ok(sock),
    }
}

/// The uid of the process at the other end of a unix socket.
pub fn peer_uid(sock: &impl AsFd) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the fd is borrowed for
    // the call.
    check(unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(cred.uid)
}

pub fn fchmod(fd: &impl AsFd, mode: u32) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe { libc::fchmod(fd.as_fd().as_raw_fd(), mode as libc::mode_t) }).map(drop)
}

/// `lchown` relative to `dir` (or an absolute path with [`CWD`]);
/// `u32::MAX` leaves an id unchanged.
pub fn lchownat(dir: BorrowedFd<'_>, rel: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let c = cpath(rel)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call.
    check(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            c.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn fchown(fd: &impl AsFd, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe { libc::fchown(fd.as_fd().as_raw_fd(), uid, gid) }).map(drop)
}

/// A timestamp argument for [`utimensat`].
#[derive(Clone, Copy, Debug)]
pub enum Time {
    Keep,
    Now,
    At(i64, i64),
}

fn timespec(t: Time) -> libc::timespec {
    match t {
        Time::Keep => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Time::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Time::At(s, ns) => libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        },
    }
}

pub fn lutimensat(dir: BorrowedFd<'_>, rel: &[u8], atime: Time, mtime: Time) -> io::Result<()> {
    let c = cpath(rel)?;
    let ts = [timespec(atime), timespec(mtime)];
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call. `ts` is the array of two timespecs utimensat reads.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn futimens(fd: &impl AsFd, atime: Time, mtime: Time) -> io::Result<()> {
    let ts = [timespec(atime), timespec(mtime)];
    // SAFETY: `ts` is the array of two timespecs futimens reads; the fd is borrowed for the
    // call.
    check(unsafe { libc::futimens(fd.as_fd().as_raw_fd(), ts.as_ptr()) }).map(drop)
}

pub fn fstatvfs(fd: &impl AsFd) -> io::Result<libc::statvfs> {
    // SAFETY: `statvfs` is plain integers, for which all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid `statvfs` to write; the fd is borrowed for the call.
    check(unsafe { libc::fstatvfs(fd.as_fd().as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub fn fsync(fd: &impl AsFd) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe { libc::fsync(fd.as_fd().as_raw_fd()) }).map(drop)
}

pub fn fdatasync(fd: &impl AsFd) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe { libc::fdatasync(fd.as_fd().as_raw_fd()) }).map(drop)
}

pub fn ftruncate(fd: &impl AsFd, size: u64) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe { libc::ftruncate(fd.as_fd().as_raw_fd(), size as libc::off_t) }).map(drop)
}

/// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when another holder has it.
pub fn try_lock_exclusive(fd: &impl AsFd) -> io::Result<bool> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    let r = unsafe { libc::flock(fd.as_fd().as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// One entry of a directory listing: name and `d_type`.
pub struct RawDirEntry {
    pub name: Vec<u8>,
    pub d_type: u8,
    pub d_ino: u64,
}

/// Lists the directory at `rel` under `dir` (without `.` and `..`).
pub fn read_dir_at(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<Vec<RawDirEntry>> {
    let fd = open_dir(dir, rel)?;
    read_dir_fd(fd)
}

/// Lists an open directory, consuming the fd.
pub fn read_dir_fd(fd: OwnedFd) -> io::Result<Vec<RawDirEntry>> {
    use std::os::fd::IntoRawFd;
    let raw = fd.into_raw_fd();
    // SAFETY: `raw` is an open directory fd that this function owns (taken out of the
    // `OwnedFd`); on success the `DIR` owns it.
    let dirp = unsafe { libc::fdopendir(raw) };
    if dirp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `raw` is still ours, and it is closed once.
        unsafe { libc::close(raw) };
        return Err(e);
    }
    let mut out = Vec::new();
    let result = loop {
        // readdir signals errors only through errno, so clear it first.
        // SAFETY: errno is this thread's own variable.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `dirp` is the open `DIR` from fdopendir; it is closed only after the loop.
        let ent = unsafe { libc::readdir64(dirp) };
        if ent.is_null() {
            // SAFETY: errno is this thread's own variable.
            let errno = unsafe { *libc::__errno_location() };
            break if errno == 0 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(errno))
            };
        }
        // SAFETY: `ent` is not null: readdir64's entry, valid until the next call on `dirp`;
        // what is kept of it is copied out before then.
        let ent = unsafe { &*ent };
        // SAFETY: the kernel NUL-terminates `d_name` inside the entry.
        let name = unsafe { std::ffi::CStr::from_ptr(ent.d_name.as_ptr()) }.to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push(RawDirEntry {
            name: name.to_vec(),
            d_type: ent.d_type,
            d_ino: ent.d_ino,
        });
    };
    // SAFETY: `dirp` is open and closed once; this also closes `raw`.
    unsafe { libc::closedir(dirp) };
    result.map(|()| out)
}

/// Writes the dirty pages of `fd` and waits for them, without flushing the
/// device cache or committing metadata (`sync_file_range`).
pub fn write_out(fd: &impl AsFd) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe { libc::sync_file_range(fd.as_fd().as_raw_fd(), 0, 0, flags) }).map(drop)
}

/// Starts writing the dirty pages of `fd` out, without waiting.
pub fn start_write_out(fd: &impl AsFd) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe {
        libc::sync_file_range(fd.as_fd().as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
    })
    .map(drop)
}

/// `syncfs`: everything dirty on the filesystem of `fd`, one commit.
pub fn syncfs(fd: &impl AsFd) -> io::Result<()> {
    // SAFETY: plain integers; the fd is borrowed for the call.
    check(unsafe { libc::syncfs(fd.as_fd().as_raw_fd()) }).map(drop)
}

/// Whether one `fsync` on the filesystem of `fd` commits every metadata
/// change made before it, so data written out beforehand plus one `fsync` is
/// a full durability point. True of XFS (one log) and of ext4 *with* its
/// journal (one jbd2 transaction at a time); an ext4 made without a journal
/// writes only the inodes it is asked to, so it is not.
pub fn has_ordered_commit(fd: &impl AsFd) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    // SAFETY: `statfs` is plain integers, for which all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid `statfs` to write; the fd is borrowed for the call.
    if unsafe { libc::fstatfs(fd.as_fd().as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    match st.f_type as i64 {
        XFS => true,
        EXT4 => ext4_has_journal(fd).unwrap_or(false),
        _ => false,
    }
}

/// `/sys/fs/ext4/<device>/journal_task` names the journal thread, or
/// `<none>` on an ext4 without a journal.
fn ext4_has_journal(fd: &impl AsFd) -> Option<bool> {
    let st = fstat(fd).ok()?;
    let (maj, min) = (libc::major(st.st_dev), libc::minor(st.st_dev));
    let dev = std::fs::read_link(format!("/sys/dev/block/{maj}:{min}")).ok()?;
    let name = dev.file_name()?.to_str()?.to_string();
    let task = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task")).ok()?;
    Some(!task.trim().is_empty() && task.trim() != "<none>")
}

/// Nanoseconds since the epoch: as `i128`, since `i64` nanoseconds end in
/// 2262 and begin in 1677, and ext4 stores any time from 1901 to 2446.
pub fn mtime_ns(st: &libc::stat) -> i128 {
    st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128
}

/// `ns` since the epoch as `(seconds, nanoseconds)`, clamped to what a
/// `timespec` holds.
pub fn split_ns(ns: i128) -> (i64, i64) {
    let secs = ns.div_euclid(1_000_000_000);
    let nsec = ns.rem_euclid(1_000_000_000) as i64;
    match i64::try_from(secs) {
        Ok(s) => (s, nsec),
        Err(_) if secs < 0 => (i64::MIN, 0),
        Err(_) => (i64::MAX, 999_999_999),
    }
}

/// Whether this process (by its effective ids) may create entries in the
/// directory `path`: `faccessat(W_OK, AT_EACCESS)`, `EROFS` on a read-only
/// mount.
pub fn access_write(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) })
        .map(|_| ())
}

/// An identity for the directory at `rel` that survives renames and is not
/// reused when the inode number is: `<ino>-<birth time>` (just `<ino>-0`
/// where the filesystem records no birth time).
pub fn dir_key(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<String> {
    let c = cpath(rel)?;
    // SAFETY: `statx` is plain integers, for which all zeros is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `dir` is borrowed, so open for
    // the call. `stx` is a valid `statx` to write.
    check(unsafe {
        libc::statx(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_INO | libc::STATX_BTIME,
            &mut stx,
        )
    })?;
    if stx.stx_mask & libc::STATX_BTIME != 0 {
        Ok(format!(
            "{:x}-{}.{:09}",
            stx.stx_ino, stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec
        ))
    } else {
        Ok(format!("{:x}-0", stx.stx_ino))
    }
}

/// Removes `rel` under `dir` and everything below it, read-only
/// directories included.
pub fn remove_tree_at(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<()> {
    let st = lstatat(dir, rel)?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        // A read-only directory (a module cache, `chmod -R a-w`) is made
        // writable first, as `rm -rf` does: its owner may.
        if st.st_mode & 0o700 != 0o700 {
            let _ = fchmodat(dir, rel, (st.st_mode & 0o7777) | 0o700);
        }
        for e in read_dir_at(dir, rel)? {
            let mut child = rel.to_vec();
            child.push(b'/');
            child.extend_from_slice(&e.name);
            remove_tree_at(dir, &child)?;
        }
        unlinkat(dir, rel, true)
    } else {
        unlinkat(dir, rel, false)
    }
}

/// When `rel` or anything below it was last touched: the newest mtime or
/// ctime (a rename, which is how parks are made, changes only the ctime).
pub fn newest_mtime_at(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<i128> {
    let st = lstatat(dir, rel)?;
    let ctime_ns = st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128;
    let mut newest = mtime_ns(&st).max(ctime_ns);
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        for e in read_dir_at(dir, rel)? {
            let mut child = rel.to_vec();
            child.push(b'/');
            child.extend_from_slice(&e.name);
            newest = newest.max(newest_mtime_at(dir, &child)?);
        }
    }
    Ok(newest)
}

/// `mkdirat` that accepts an existing directory.
pub fn ensure_dir_at(dir: BorrowedFd<'_>, rel: &[u8], mode: u32) -> io::Result<()> {
    match mkdirat(dir, rel, mode) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        r => r,
    }
}

/// Whether a new entry made in directory `rel` (relative to `dir`) gets
/// more from it than its mode and owner: a set-group-ID directory passes
/// on its group, one with a default ACL its ACL. Such entries must be
/// created in place, not made elsewhere and renamed in.
pub fn dir_passes_on_more(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<bool> {
    let st = lstatat(dir, rel)?;
    if st.st_mode & libc::S_ISGID != 0 {
        return Ok(true);
    }
    let name = c"system.posix_acl_default";
    let n = if rel.is_empty() {
        // The directory itself (through /proc its fd is a link, and
        // lgetxattr would ask the link).
        // SAFETY: a null buffer of size 0 asks only for the size; `name` is a C string literal
        // and `dir` is borrowed.
        unsafe { libc::fgetxattr(dir.as_raw_fd(), name.as_ptr(), std::ptr::null_mut(), 0) }
    } else {
        let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        path.extend_from_slice(rel);
        let c = cpath(&path)?;
        // SAFETY: a null buffer of size 0 asks only for the size; `c` and `name` are
        // NUL-terminated and outlive the call.
        unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) }
    };
    if n >= 0 {
        return Ok(n > 0);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(false),
        _ => Err(e),
    }
}

/// The size of a page of memory (of the page cache).
/// The machine's physical memory in bytes (`u64::MAX` if unknown).
pub fn phys_memory() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    match unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) } {
        n if n > 0 => (n as u64).saturating_mul(page_size()),
        _ => u64::MAX,
    }
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    }
}
