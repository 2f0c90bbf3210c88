//! How the core's values become FUSE's and back: attributes and their
//! cache lifetimes, file types, times, the caller, errnos, and the
//! listing buffers the core fills. Pure conversions; no state.
//!
//! Locks: none.

use super::*;

pub(super) const TTL: Duration = Duration::from_secs(24 * 3600);
pub(super) const TTL_IMMUTABLE: Duration = Duration::from_secs(365 * 24 * 3600);
/// A `.history` listing's attributes are fetched at every listing, so its
/// mtime (the time of its newest id) tells the kernel's cache it grew.
pub(super) const TTL_VOLATILE: Duration = Duration::ZERO;

/// (attribute TTL, entry TTL) for an entry.
pub(super) fn ttls(t: Ttl) -> (Duration, Duration) {
    match t {
        Ttl::Live => (TTL, TTL),
        Ttl::Immutable => (TTL_IMMUTABLE, TTL_IMMUTABLE),
        Ttl::Volatile => (TTL_VOLATILE, TTL_VOLATILE),
        Ttl::Alias => (TTL_IMMUTABLE, Duration::ZERO),
    }
}

pub(super) fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        comm: None,
    }
}

/// The errno answered for `e`, after logging it once (at the level its
/// errno calls for) as the answer to `op`.
pub(super) fn errno(op: &str, e: FsError) -> Errno {
    e.log(op);
    Errno::from_i32(e.errno())
}

/// A time from a stat (or a record), never panicking on one out of range.
pub(super) fn system_time(sec: i64, nsec: i64) -> SystemTime {
    let nsec = Duration::from_nanos(nsec.clamp(0, 999_999_999) as u64);
    let t = if sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(sec as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(sec.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

pub(super) fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(super) fn attr(e: &Entry) -> FileAttr {
    let st = &e.stat;
    FileAttr {
        ino: INodeNo(e.ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: system_time(st.st_atime, st.st_atime_nsec),
        mtime: system_time(st.st_mtime, st.st_mtime_nsec),
        ctime: system_time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

pub(super) fn time(t: TimeOrNow) -> Time {
    match t {
        TimeOrNow::Now => Time::Now,
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => Time::At(d.as_secs() as i64, d.subsec_nanos() as i64),
            Err(e) => {
                // fuser 0.18 (vendored, unchanged here) builds a time before the epoch from the
                // kernel's (-S, n) as EPOCH - (S s + n ns), where it means
                // EPOCH - S s + n ns (its own TODO in `time.rs`): reading the
                // two parts back undoes that exactly.
                let d = e.duration();
                let secs = i64::try_from(d.as_secs()).map_or(i64::MIN, |s| -s);
                Time::At(secs, d.subsec_nanos() as i64)
            }
        },
    }
}

pub(super) fn reply_entry(op: &str, reply: ReplyEntry, r: Result<Entry, FsError>) {
    match r {
        Ok(e) => {
            let (attr_ttl, entry_ttl) = ttls(e.ttl);
            reply.entry_with_ttls(&attr_ttl, &entry_ttl, &attr(&e), Generation(0))
        }
        Err(e) => reply.error(errno(op, e)),
    }
}

pub(super) fn reply_empty(op: &str, reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(op, e)),
    }
}

/// `readdir`'s buffer, for the core's listing.
pub(super) struct Listing<'a>(pub(super) &'a mut ReplyDirectory);

impl DirectoryReplier for Listing<'_> {
    fn add(&mut self, e: DirectoryEntry<'_>) -> bool {
        let name = OsStr::from_bytes(e.name);
        self.0
            .add(INodeNo(e.ino), e.offset, file_type(e.mode_type), name)
    }
}

/// `readdirplus`'s buffer, for the core's listing.
pub(super) struct ListingPlus<'a>(pub(super) &'a mut ReplyDirectoryPlus);

impl DirectoryReplier for ListingPlus<'_> {
    fn add(&mut self, e: DirectoryEntry<'_>) -> bool {
        let Some(entry) = e.entry else {
            return false;
        };
        let name = OsStr::from_bytes(e.name);
        let ttl = ttls(entry.ttl).0;
        self.0.add(
            INodeNo(entry.ino),
            e.offset,
            name,
            &ttl,
            &attr(entry),
            Generation(0),
        )
    }
}
