//! skillfs-fuse, the FUSE adapter: converts `fuser` requests into calls on
//! [`SkillFs`] and its answers into replies. Nothing else; the only crate
//! that uses `fuser` (the fork, `skillfs-fuser`). `mount` makes the
//! session (`fusermount` asks the setuid helper for an unprivileged one).
//!
//! Cache policy: skillfs is the only writer of the tree while mounted and
//! every change goes through the kernel, which updates or invalidates what it
//! cached itself (attributes after writes, directory attributes and listings
//! after entry changes). So entries and attributes are cached for a long
//! time, pages are kept across opens (`FOPEN_KEEP_CACHE`), directory
//! listings are cached (`FOPEN_CACHE_DIR`), read-only opens skip the
//! flush on close (`FOPEN_NOFLUSH`), and the pages of a file just written
//! are handed to the kernel (`FUSE_NOTIFY_STORE`, see `fs::pages`).
//!
//! Locks: none of its own; each handler calls the core, which locks (see
//! `fs`). Replies are sent with no core lock held.

// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use skillfs_base::sys::Time;
use skillfs_core::error::FsError;
use skillfs_core::fs::{
    Caller, DirectoryEntry, DirectoryReplier, Entry, Invalidation, PageOp, SetAttr, SkillFs, Ttl,
};

mod convert;
pub mod fusermount;
mod mount;
use convert::*;
pub use mount::{Mounted, Transport, mount, uring_unavailable};

/// Test hook (debug builds only): `SKILLFS_TEST_FSYNC_DELAY_MS` holds every
/// fsync that long before it is served, so that a test sees a blocked
/// handler leave the other requests of its CPU's queue served
/// (`tests/it/transport.rs`).
fn fsync_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| skillfs_base::time::test_pause("SKILLFS_TEST_FSYNC_DELAY_MS"))
}

pub struct FuseAdapter {
    pub fs: Arc<SkillFs>,
    /// The backing file registered with the kernel for each inode with
    /// direct (passthrough) handles, and how many: the kernel takes one
    /// backing file per inode, so every direct open of it reuses the id.
    backing: Mutex<HashMap<u64, (BackingId, u32)>>,
    /// The inode of each direct handle, for its release. Lock order:
    /// `backing`, then `direct` (a release takes `direct` alone first).
    direct: Mutex<HashMap<u64, u64>>,
    /// Ask the kernel for FUSE over io_uring at INIT (see `mount::Transport`).
    pub uring: bool,
}

impl FuseAdapter {
    pub fn new(fs: Arc<SkillFs>) -> FuseAdapter {
        FuseAdapter {
            fs,
            backing: Mutex::default(),
            direct: Mutex::default(),
            uring: false,
        }
    }

    /// The backing id for a new direct handle `fh` of `ino`: the inode's,
    /// else one `register`ed now. Held locked until the reply is sent, so
    /// a release cannot close it in between. `None` if the kernel refused
    /// it: the handle, and every later open, is served by the daemon.
    fn backing_id(
        &self,
        ino: u64,
        fh: u64,
        register: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> Option<MappedMutexGuard<'_, BackingId>> {
        let mut map = self.backing.lock();
        match map.entry(ino) {
            Slot::Occupied(mut e) => e.get_mut().1 += 1,
            Slot::Vacant(e) => match register() {
                Ok(id) => {
                    e.insert((id, 1));
                }
                Err(err) => {
                    tracing::warn!("passthrough refused ({err}): the daemon serves every read");
                    self.fs.undirect(fh);
                    return None;
                }
            },
        }
        self.direct.lock().insert(fh, ino);
        MutexGuard::try_map(map, |m| m.get_mut(&ino).map(|slot| &mut slot.0)).ok()
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for cap in [
            // O_TRUNC arrives with the open, not as a separate truncate that
            // would publish an empty version first.
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            if config.add_capabilities(cap).is_err() {
                tracing::debug!("kernel lacks {cap:?}");
            }
        }
        let _ = config.set_max_write(1 << 20);
        if self.uring
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_err()
        {
            tracing::info!("the kernel does not offer FUSE over io_uring");
        }
        // Read-only opens of large skills/ files, and the plain files of a home,
        // are read (and the latter written) by the kernel on their backing
        // files: no round trip per read. Registering one needs
        // CAP_SYS_ADMIN: a daemon run by a user serves them itself.
        // (SKILLFS_NO_PASSTHROUGH: the tests run the daemon's own path too.)
        if skillfs_base::process::geteuid() == 0
            && std::env::var_os("SKILLFS_NO_PASSTHROUGH").is_none()
        {
            let on = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            tracing::info!(
                "passthrough (the kernel reads files with no writer itself): {}",
                if on {
                    "on"
                } else {
                    "not offered by the kernel"
                }
            );
            self.fs.set_passthrough(on);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.fs.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup_or_negative(parent.0, name.as_bytes()) {
            // A negative entry: no entry TTL of its own.
            Ok(e) if e.ino == 0 => reply.entry(&TTL, &attr(&e), Generation(0)),
            r => reply_entry("lookup", reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(e) => reply.attr(&ttls(e.ttl).0, &attr(&e)),
            Err(e) => reply.error(errno("getattr", e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
            via_handle: fh.is_some(),
        };
        match self.fs.setattr(ino.0, set, &caller(req)) {
            Ok(e) => reply.attr(&ttls(e.ttl).0, &attr(&e)),
            Err(e) => reply.error(errno("setattr", e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno("readlink", e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(
            "mknod",
            reply,
            self.fs.mknod(parent.0, name.as_bytes(), mode, &caller(req)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(
            "mkdir",
            reply,
            self.fs.mkdir(parent.0, name.as_bytes(), mode, &caller(req)),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            "unlink",
            reply,
            self.fs.unlink(parent.0, name.as_bytes(), &caller(req)),
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(
            "rmdir",
            reply,
            self.fs.rmdir(parent.0, name.as_bytes(), &caller(req)),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        reply_entry(
            "symlink",
            reply,
            self.fs.symlink(
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                &caller(req),
            ),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            "rename",
            reply,
            self.fs.rename(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                flags.bits(),
                &caller(req),
            ),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.fs.link(ino.0, newparent.0, newname.as_bytes());
        reply_entry("link", reply, r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(ino.0, flags.0, &caller(req)) {
            Ok(o) => {
                // Pages stay valid across opens: every write comes through
                // the kernel, and versions never change.
                let mut f = FopenFlags::FOPEN_KEEP_CACHE;
                if o.no_flush {
                    f |= FopenFlags::FOPEN_NOFLUSH;
                }
                if let Some(file) = &o.backing {
                    // The kernel refuses a direct open with any flag but
                    // these (FOPEN_PASSTHROUGH_MASK); it caches nothing.
                    // Without KEEP_CACHE it drops the pages cached of the
                    // inode: a direct writer's bytes go around them.
                    let f = f & FopenFlags::FOPEN_NOFLUSH;
                    if let Some(id) = self.backing_id(ino.0, o.fh, || reply.open_backing(&**file)) {
                        return reply.opened_passthrough(FileHandle(o.fh), f, &id);
                    }
                }
                reply.opened(FileHandle(o.fh), f)
            }
            Err(e) => reply.error(errno("open", e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno("read", e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(fh.0, offset, data, &caller(req)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno("write", e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty("flush", reply, self.fs.flush(fh.0, &caller(req)));
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The handle's share of the backing id goes before the core counts
        // it out: while the core has direct handles of an inode, their
        // backing file stays, but once it has none the next one may be
        // another file (the live file swapped since), which must get an id
        // of its own, not the last one's. So this count never exceeds the
        // core's. (Taken out first: `backing` is locked before `direct`,
        // never after.)
        let direct = self.direct.lock().remove(&fh.0);
        if let Some(ino) = direct {
            let mut backing = self.backing.lock();
            if let Some((_, n)) = backing.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    backing.remove(&ino); // closes the backing id
                }
            }
        }
        let r = self.fs.release(fh.0, &caller(req));
        reply_empty("release", reply, r);
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(d) = fsync_delay() {
            std::thread::sleep(d);
        }
        reply_empty("fsync", reply, self.fs.fsync(fh.0, &caller(req)));
    }

    /// Directories are listed without open handles: ENOSYS makes the kernel
    /// stop sending OPENDIR and RELEASEDIR (two round trips per directory a
    /// walk visits) and cache listings, checked against the directory's
    /// mtime and change counter. What changes a directory behind the kernel's
    /// back invalidates it (`SkillFs::set_invalidator`).
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno("opendir", e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.fs.readdir(ino.0, offset, &mut Listing(&mut reply)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("readdir", e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        match self
            .fs
            .readdirplus(ino.0, offset, &mut ListingPlus(&mut reply))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("readdirplus", e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty("fsyncdir", reply, self.fs.fsyncdir(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno("statfs", e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply_empty("setxattr", reply, self.fs.xattr(ino.0));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        match self.fs.xattr(ino.0) {
            Ok(()) => reply.size(0),
            Err(e) => reply.error(errno("getxattr", e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, _size: u32, reply: ReplyXattr) {
        match self.fs.xattr(ino.0) {
            Ok(()) => reply.size(0),
            Err(e) => reply.error(errno("listxattr", e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply_empty("removexattr", reply, self.fs.xattr(ino.0));
    }

    /// No ioctl is served: ENOTTY, what a file that is no terminal says.
    /// Python's `open()` (up to 3.13) asks `isatty` of every file, and the
    /// kernel sends each one (it caches no answer to an ioctl): this
    /// handler is the cost of a round trip, not the library's default,
    /// which logs a warning per call (a line in `daemon.log` for every
    /// file the agent opened, and three times the daemon's work per call).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty("access", reply, self.fs.access(ino.0, mask.bits()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .fs
            .create(parent.0, name.as_bytes(), mode, flags, &caller(req))
        {
            Ok((e, o)) => {
                let ttl = ttls(e.ttl).0;
                if let Some(file) = &o.backing
                    && let Some(id) = self.backing_id(e.ino, o.fh, || reply.open_backing(&**file))
                {
                    let f = FopenFlags::empty();
                    let fh = FileHandle(o.fh);
                    return reply.created_passthrough(&ttl, &attr(&e), Generation(0), fh, f, &id);
                }
                let f = FopenFlags::FOPEN_KEEP_CACHE;
                reply.created(&ttl, &attr(&e), Generation(0), FileHandle(o.fh), f)
            }
            Err(e) => reply.error(errno("create", e)),
        }
    }
}
