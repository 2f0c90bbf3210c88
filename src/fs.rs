//! `SkillFs`: the filesystem core, free of any FUSE type.
//!
//! Every handler takes plain values (inode numbers, names, a [`Caller`]) and
//! returns `FsResult`; `fuse.rs` only converts and replies.
//!
//! Invariants:
//! - Live files are ordinary files under the root, reached only through the
//!   root fd opened before the mount, with relative paths; no fd is held per
//!   inode, only per open file.
//! - A live file is never modified in place. A writer gets a staging file in
//!   the store (empty for `O_TRUNC`, else a copy made at its first write);
//!   reads through any handle of the inode see the staged bytes. Publishing
//!   (on flush, release or fsync) stores the blob, appends the journal record
//!   and only then renames the staging file over the live one.
//! - Inode numbers are ours, never reused (generation 0), and stay stable
//!   across the renames that publish new content.
//! - Namespace changes (create, mkdir, unlink, rmdir, rename, symlink) hold
//!   the namespace lock exclusively for the system call and the inode table
//!   update, so a path resolved under the shared lock is valid until it is
//!   released.
//!
//! Lock order: `namespace` → `tree` → `open_files` → an `OpenFile` → `ledger`.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::error::{FsError, FsResult};
use crate::ledger::Ledger;
use crate::relpath::{ByteString, RelPath};
use crate::scan::{kind_of, state_from_stat};
use crate::store::blobs::{BlobStore, copy_range};
use crate::store::journal::{Actor, Change, EntryState, Kind, Op};
use crate::sys::{self, Time};

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;
const NAME_MAX: usize = 255;

/// Who is asking, from the FUSE request header.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    fn actor(&self) -> Actor {
        Actor {
            uid: self.uid,
            pid: self.pid,
            comm: sys::process_name(self.pid),
        }
    }
}

/// An inode and its attributes (`st_ino` is ours).
#[derive(Clone, Copy)]
pub struct Entry {
    pub ino: Ino,
    pub stat: libc::stat,
}

/// What `setattr` asks to change.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
}

/// One directory entry of a listing.
#[derive(Clone)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub kind: Kind,
    /// Our inode when the kernel knows the entry; otherwise the underlying
    /// inode number with the top bit set (never one of ours, never 0, which
    /// some C libraries treat as a deleted entry).
    pub ino: Ino,
}

/// Flags the kernel should apply to an open file.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenReply {
    pub fh: u64,
    /// Read-only open: closing it has nothing to publish.
    pub no_flush: bool,
}

struct Node {
    parent: Ino,
    name: Vec<u8>,
    kind: Kind,
    nlookup: u64,
    /// Removed from the namespace; kept while the kernel still knows it.
    unlinked: bool,
}

#[derive(Default)]
struct Tree {
    nodes: HashMap<Ino, Node>,
    by_name: HashMap<(Ino, Vec<u8>), Ino>,
    next_ino: Ino,
}

impl Tree {
    fn new() -> Tree {
        let mut t = Tree {
            next_ino: ROOT_INO + 1,
            ..Tree::default()
        };
        t.nodes.insert(
            ROOT_INO,
            Node {
                parent: ROOT_INO,
                name: Vec::new(),
                kind: Kind::Dir,
                nlookup: 1,
                unlinked: false,
            },
        );
        t
    }

    fn path(&self, ino: Ino) -> FsResult<RelPath> {
        let mut names: Vec<&[u8]> = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            let n = self.nodes.get(&cur).ok_or(FsError::ENOENT)?;
            if n.unlinked {
                return Err(FsError::ENOENT);
            }
            names.push(&n.name);
            cur = n.parent;
        }
        let mut p = RelPath::root();
        for n in names.iter().rev() {
            p = p.join(n);
        }
        Ok(p)
    }

    /// The inode of `parent/name`, created if new; counts one lookup.
    fn link(&mut self, parent: Ino, name: &[u8], kind: Kind) -> Ino {
        let key = (parent, name.to_vec());
        if let Some(&ino) = self.by_name.get(&key) {
            let n = self.nodes.get_mut(&ino).expect("by_name points at a node");
            if n.kind == kind {
                n.nlookup += 1;
                return ino;
            }
            // Replaced by an entry of another kind behind our back (only
            // possible before the mount): give it a fresh inode.
            n.unlinked = true;
            self.by_name.remove(&key);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(
            ino,
            Node {
                parent,
                name: name.to_vec(),
                kind,
                nlookup: 1,
                unlinked: false,
            },
        );
        self.by_name.insert(key, ino);
        ino
    }

    fn child(&self, parent: Ino, name: &[u8]) -> Option<Ino> {
        self.by_name.get(&(parent, name.to_vec())).copied()
    }

    fn detach(&mut self, parent: Ino, name: &[u8]) {
        if let Some(ino) = self.by_name.remove(&(parent, name.to_vec()))
            && let Some(n) = self.nodes.get_mut(&ino)
        {
            n.unlinked = true;
            if n.nlookup == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn forget(&mut self, ino: Ino, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.nlookup = node.nlookup.saturating_sub(n);
        if node.nlookup == 0 {
            let key = (node.parent, node.name.clone());
            let unlinked = node.unlinked;
            self.nodes.remove(&ino);
            if !unlinked && self.by_name.get(&key) == Some(&ino) {
                self.by_name.remove(&key);
            }
        }
    }

    fn move_entry(&mut self, parent: Ino, name: &[u8], newparent: Ino, newname: &[u8]) {
        self.detach(newparent, newname);
        if let Some(ino) = self.by_name.remove(&(parent, name.to_vec())) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.parent = newparent;
                n.name = newname.to_vec();
            }
            self.by_name.insert((newparent, newname.to_vec()), ino);
        }
    }

    fn exchange(&mut self, parent: Ino, name: &[u8], newparent: Ino, newname: &[u8]) {
        let a = self.by_name.remove(&(parent, name.to_vec()));
        let b = self.by_name.remove(&(newparent, newname.to_vec()));
        if let Some(a) = a {
            if let Some(n) = self.nodes.get_mut(&a) {
                n.parent = newparent;
                n.name = newname.to_vec();
            }
            self.by_name.insert((newparent, newname.to_vec()), a);
        }
        if let Some(b) = b {
            if let Some(n) = self.nodes.get_mut(&b) {
                n.parent = parent;
                n.name = name.to_vec();
            }
            self.by_name.insert((parent, name.to_vec()), b);
        }
    }
}

/// A copy-on-write scratch file of an inode that has writers.
struct Staging {
    file: Arc<File>,
    path: PathBuf,
    /// Holds bytes not yet published.
    dirty: bool,
}

/// Per-inode state while at least one handle is open.
struct OpenState {
    /// The live file as it was last published (kept open so readers and
    /// files unlinked while open keep working).
    live: Arc<File>,
    staging: Option<Staging>,
    handles: u32,
    writers: u32,
}

struct OpenFile {
    state: Mutex<OpenState>,
}

enum Handle {
    File { ino: Ino, write: bool, append: bool },
    Dir { entries: Arc<Vec<DirEntry>> },
}

pub struct SkillFs {
    root_fd: OwnedFd,
    staging_dir: PathBuf,
    blobs: BlobStore,
    ledger: Mutex<Ledger>,
    namespace: RwLock<()>,
    tree: Mutex<Tree>,
    open_files: Mutex<HashMap<Ino, Arc<OpenFile>>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    next_staging: AtomicU64,
    /// The daemon runs as root: new entries are given to their caller.
    chown_new: bool,
}

fn empty_blob_state(st: &libc::stat, blob: String) -> EntryState {
    let mut s = state_from_stat(st, Kind::File);
    s.blob = Some(blob);
    s
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(FsError::EINVAL);
    }
    Ok(())
}

impl SkillFs {
    pub fn new(
        root_fd: OwnedFd,
        staging_dir: PathBuf,
        blobs: BlobStore,
        ledger: Ledger,
    ) -> SkillFs {
        SkillFs {
            root_fd,
            staging_dir,
            blobs,
            ledger: Mutex::new(ledger),
            namespace: RwLock::new(()),
            tree: Mutex::new(Tree::new()),
            open_files: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            next_staging: AtomicU64::new(1),
            chown_new: sys::geteuid() == 0,
        }
    }

    /// Where a path physically lives: the directory fd its relative path is
    /// resolved against. (The hide rules will send hidden paths elsewhere.)
    fn locate<'a>(&self, path: &'a RelPath) -> (RawFd, &'a [u8]) {
        (self.root_fd.as_raw_fd(), path.as_bytes())
    }

    fn path_of(&self, ino: Ino) -> FsResult<RelPath> {
        self.tree.lock().path(ino)
    }

    fn lstat_path(&self, path: &RelPath) -> FsResult<libc::stat> {
        let (fd, rel) = self.locate(path);
        Ok(sys::lstatat(fd, rel)?)
    }

    fn open_file(&self, ino: Ino) -> Option<Arc<OpenFile>> {
        self.open_files.lock().get(&ino).cloned()
    }

    /// Attributes as the kernel must see them: our inode number, and the
    /// staged size and times while a writer has unpublished bytes.
    fn finish_stat(&self, ino: Ino, mut st: libc::stat) -> libc::stat {
        if let Some(of) = self.open_file(ino) {
            let s = of.state.lock();
            let fresh = match &s.staging {
                Some(stg) => sys::fstat(&*stg.file).ok(),
                None => None,
            };
            if let Some(f) = fresh {
                st.st_size = f.st_size;
                st.st_blocks = f.st_blocks;
                st.st_mtime = f.st_mtime;
                st.st_mtime_nsec = f.st_mtime_nsec;
                st.st_ctime = f.st_ctime;
                st.st_ctime_nsec = f.st_ctime_nsec;
            }
        }
        st.st_ino = ino;
        st
    }

    fn record(&self, change: Change, caller: &Caller) {
        let mut ledger = self.ledger.lock();
        if let Err(e) = ledger.record(change.clone(), caller.actor()) {
            // The change happened but is not in the journal; the next
            // mount's scan finds the difference and records it.
            tracing::error!(
                "could not journal {} of {}: {e}",
                change.op.name(),
                change.path
            );
        }
    }

    fn state_of(&self, path: &RelPath) -> FsResult<EntryState> {
        let st = self.lstat_path(path)?;
        let kind = kind_of(&st).ok_or(FsError::EPERM)?;
        let mut s = state_from_stat(&st, kind);
        match kind {
            Kind::File => {
                s.blob = self
                    .ledger
                    .lock()
                    .catalog()
                    .get(path)
                    .and_then(|c| c.blob.clone());
            }
            Kind::Symlink => {
                let (fd, rel) = self.locate(path);
                s.target = Some(ByteString(sys::readlinkat(fd, rel)?));
            }
            Kind::Dir => {}
        }
        Ok(s)
    }

    fn give_to_caller(&self, path: &RelPath, caller: &Caller) {
        if self.chown_new && (caller.uid != 0 || caller.gid != 0) {
            let (fd, rel) = self.locate(path);
            if let Err(e) = sys::lchownat(fd, rel, caller.uid, caller.gid) {
                tracing::warn!("could not give {path} to uid {}: {e}", caller.uid);
            }
        }
    }

    // ------------------------------------------------------------ lookups

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<Entry> {
        if name.len() > NAME_MAX {
            return Err(FsError::ENAMETOOLONG);
        }
        let _ns = self.namespace.read();
        let path = self.path_of(parent)?.join(name);
        let st = self.lstat_path(&path)?;
        let kind = kind_of(&st).ok_or(FsError::ENOENT)?;
        let ino = self.tree.lock().link(parent, name, kind);
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, st),
        })
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        self.tree.lock().forget(ino, n);
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Entry> {
        let _ns = self.namespace.read();
        let st = match self.path_of(ino) {
            Ok(path) => self.lstat_path(&path)?,
            Err(e) => {
                // Unlinked but open: the open file still has attributes.
                let of = self.open_file(ino).ok_or(e)?;
                let s = of.state.lock();
                let mut st = sys::fstat(&*s.live)?;
                st.st_nlink = 0;
                st
            }
        };
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, st),
        })
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let _ns = self.namespace.read();
        let path = self.path_of(ino)?;
        let (fd, rel) = self.locate(&path);
        Ok(sys::readlinkat(fd, rel)?)
    }

    pub fn statfs(&self) -> FsResult<libc::statvfs> {
        Ok(sys::fstatvfs(&self.root_fd)?)
    }

    // ------------------------------------------------------------ setattr

    pub fn setattr(&self, ino: Ino, attr: SetAttr, caller: &Caller) -> FsResult<Entry> {
        let _ns = self.namespace.read();
        let path = self.path_of(ino);
        let of = self.open_file(ino);
        if let Some(size) = attr.size {
            self.truncate(ino, path.as_ref().ok(), size, caller)?;
        }
        let staged = of.as_ref().and_then(|of| {
            of.state
                .lock()
                .staging
                .as_ref()
                .map(|s| Arc::clone(&s.file))
        });
        let meta_change = attr.mode.is_some()
            || attr.uid.is_some()
            || attr.gid.is_some()
            || attr.atime.is_some()
            || attr.mtime.is_some();
        if meta_change {
            match &path {
                Ok(p) => {
                    let (fd, rel) = self.locate(p);
                    if let Some(mode) = attr.mode {
                        let st = sys::lstatat(fd, rel)?;
                        if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                            sys::fchmodat(fd, rel, mode & 0o7777)?;
                        }
                    }
                    if attr.uid.is_some() || attr.gid.is_some() {
                        sys::lchownat(
                            fd,
                            rel,
                            attr.uid.unwrap_or(u32::MAX),
                            attr.gid.unwrap_or(u32::MAX),
                        )?;
                    }
                    if attr.atime.is_some() || attr.mtime.is_some() {
                        sys::lutimensat(
                            fd,
                            rel,
                            attr.atime.unwrap_or(Time::Keep),
                            attr.mtime.unwrap_or(Time::Keep),
                        )?;
                    }
                }
                Err(_) => {
                    // Unlinked but open: change the open file itself.
                    let of = of.as_ref().ok_or(FsError::ENOENT)?;
                    let live = Arc::clone(&of.state.lock().live);
                    apply_meta_fd(&live, &attr)?;
                }
            }
            // The staged copy carries the same metadata, so publishing it
            // does not undo this change.
            if let Some(stg) = &staged {
                apply_meta_fd(stg, &attr)?;
            }
            if let Ok(p) = &path {
                let op = match (
                    attr.mode.is_some(),
                    attr.uid.is_some() || attr.gid.is_some(),
                    attr.atime.is_some() || attr.mtime.is_some(),
                ) {
                    (true, false, false) => Op::Chmod,
                    (false, true, false) => Op::Chown,
                    (false, false, true) => Op::Utimes,
                    _ => Op::Setattr,
                };
                let state = self.state_of(p)?;
                self.record(Change::new(op, p.clone(), Some(state)), caller);
            }
        }
        drop(_ns);
        self.getattr(ino)
    }

    fn truncate(
        &self,
        ino: Ino,
        path: Option<&RelPath>,
        size: u64,
        caller: &Caller,
    ) -> FsResult<()> {
        let (of, temporary) = match self.open_file(ino) {
            Some(of) => (of, false),
            None => {
                let path = path.ok_or(FsError::ENOENT)?;
                (self.open_live(ino, path)?, true)
            }
        };
        let result = (|| {
            let mut s = of.state.lock();
            self.ensure_staging(&mut s, size == 0)?;
            let stg = s.staging.as_mut().expect("just ensured");
            sys::ftruncate(&*stg.file, size)?;
            stg.dirty = true;
            if s.writers == 0
                && let Some(p) = path
            {
                self.publish_locked(&mut s, p, Op::Truncate, false, caller)?;
            }
            Ok(())
        })();
        if temporary {
            self.release_open(ino, false);
        }
        result
    }

    // ------------------------------------------------------------ namespace

    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> FsResult<Entry> {
        check_name(name)?;
        let _ns = self.namespace.write();
        let path = self.path_of(parent)?.join(name);
        let (fd, rel) = self.locate(&path);
        sys::mkdirat(fd, rel, mode & 0o7777)?;
        self.give_to_caller(&path, caller);
        let st = sys::lstatat(fd, rel)?;
        let ino = self.tree.lock().link(parent, name, Kind::Dir);
        self.record(
            Change::new(Op::Mkdir, path, Some(state_from_stat(&st, Kind::Dir))),
            caller,
        );
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, st),
        })
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: &Caller,
    ) -> FsResult<Entry> {
        check_name(name)?;
        let _ns = self.namespace.write();
        let path = self.path_of(parent)?.join(name);
        let (fd, rel) = self.locate(&path);
        sys::symlinkat(target, fd, rel)?;
        self.give_to_caller(&path, caller);
        let st = sys::lstatat(fd, rel)?;
        let ino = self.tree.lock().link(parent, name, Kind::Symlink);
        let mut state = state_from_stat(&st, Kind::Symlink);
        state.target = Some(ByteString(target.to_vec()));
        self.record(Change::new(Op::Symlink, path, Some(state)), caller);
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, st),
        })
    }

    pub fn unlink(&self, parent: Ino, name: &[u8], caller: &Caller) -> FsResult<()> {
        self.remove(parent, name, false, caller)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8], caller: &Caller) -> FsResult<()> {
        self.remove(parent, name, true, caller)
    }

    fn remove(&self, parent: Ino, name: &[u8], dir: bool, caller: &Caller) -> FsResult<()> {
        let _ns = self.namespace.write();
        let path = self.path_of(parent)?.join(name);
        let (fd, rel) = self.locate(&path);
        sys::unlinkat(fd, rel, dir)?;
        self.tree.lock().detach(parent, name);
        let op = if dir { Op::Rmdir } else { Op::Unlink };
        self.record(Change::new(op, path, None), caller);
        Ok(())
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
        caller: &Caller,
    ) -> FsResult<()> {
        check_name(newname)?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(FsError::EINVAL);
        }
        let _ns = self.namespace.write();
        let from = self.path_of(parent)?.join(name);
        let to = self.path_of(newparent)?.join(newname);
        let (ffd, frel) = self.locate(&from);
        let (tfd, trel) = self.locate(&to);
        sys::renameat2(ffd, frel, tfd, trel, flags)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        {
            let mut tree = self.tree.lock();
            if exchange {
                tree.exchange(parent, name, newparent, newname);
            } else {
                tree.move_entry(parent, name, newparent, newname);
            }
        }
        let mut change = Change::new(if exchange { Op::Exchange } else { Op::Rename }, from, None);
        change.to = Some(to);
        change.noreplace = flags & libc::RENAME_NOREPLACE != 0;
        self.record(change, caller);
        Ok(())
    }

    // ------------------------------------------------------------ files

    /// Opens the live file of `ino` and registers (or joins) its open state.
    fn open_live(&self, ino: Ino, path: &RelPath) -> FsResult<Arc<OpenFile>> {
        let mut files = self.open_files.lock();
        if let Some(of) = files.get(&ino) {
            of.state.lock().handles += 1;
            return Ok(Arc::clone(of));
        }
        let (fd, rel) = self.locate(path);
        let live = sys::openat(fd, rel, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
        let of = Arc::new(OpenFile {
            state: Mutex::new(OpenState {
                live: Arc::new(live),
                staging: None,
                handles: 1,
                writers: 0,
            }),
        });
        files.insert(ino, Arc::clone(&of));
        Ok(of)
    }

    /// Drops one handle's share of the open state.
    fn release_open(&self, ino: Ino, writer: bool) {
        let mut files = self.open_files.lock();
        let Some(of) = files.get(&ino).cloned() else {
            return;
        };
        let mut s = of.state.lock();
        s.handles = s.handles.saturating_sub(1);
        if writer {
            s.writers = s.writers.saturating_sub(1);
        }
        if s.handles == 0 {
            if let Some(stg) = s.staging.take() {
                let _ = std::fs::remove_file(&stg.path);
            }
            drop(s);
            files.remove(&ino);
        }
    }

    /// Gives the open file a staging copy if it has none (`empty`: start
    /// from nothing, as `O_TRUNC` does, instead of copying the live bytes).
    fn ensure_staging(&self, s: &mut OpenState, empty: bool) -> FsResult<()> {
        if let Some(stg) = &s.staging {
            if empty {
                sys::ftruncate(&*stg.file, 0)?;
            }
            return Ok(());
        }
        let n = self.next_staging.fetch_add(1, Ordering::Relaxed);
        let path = self.staging_dir.join(format!("{n}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let result = (|| {
            let st = sys::fstat(&*s.live)?;
            if !empty {
                copy_range(&s.live, &file, st.st_size as u64)?;
            }
            sys::fchmod(&file, st.st_mode & 0o7777)?;
            if self.chown_new {
                sys::fchown(&file, st.st_uid, st.st_gid)?;
            }
            Ok::<(), FsError>(())
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        s.staging = Some(Staging {
            file: Arc::new(file),
            path,
            dirty: empty,
        });
        Ok(())
    }

    fn new_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, h);
        fh
    }

    pub fn open(&self, ino: Ino, flags: i32) -> FsResult<OpenReply> {
        let _ns = self.namespace.read();
        let path = self.path_of(ino)?;
        let of = self.open_live(ino, &path)?;
        self.finish_open(ino, of, flags)
    }

    fn finish_open(&self, ino: Ino, of: Arc<OpenFile>, flags: i32) -> FsResult<OpenReply> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if write {
            let mut s = of.state.lock();
            s.writers += 1;
            if flags & libc::O_TRUNC != 0 {
                if let Err(e) = self.ensure_staging(&mut s, true) {
                    drop(s);
                    self.release_open(ino, true);
                    return Err(e);
                }
                s.staging.as_mut().expect("just ensured").dirty = true;
            }
        }
        let fh = self.new_handle(Handle::File {
            ino,
            write,
            append: flags & libc::O_APPEND != 0,
        });
        Ok(OpenReply {
            fh,
            no_flush: !write,
        })
    }

    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Entry, OpenReply)> {
        check_name(name)?;
        let _ns = self.namespace.write();
        let path = self.path_of(parent)?.join(name);
        let (fd, rel) = self.locate(&path);
        let created = match sys::openat(
            fd,
            rel,
            libc::O_RDONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode & 0o7777,
        ) {
            Ok(f) => {
                drop(f);
                true
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => false,
            Err(e) => return Err(e.into()),
        };
        if created {
            self.give_to_caller(&path, caller);
        }
        let st = sys::lstatat(fd, rel)?;
        let kind = kind_of(&st).ok_or(FsError::EPERM)?;
        if kind == Kind::Dir {
            return Err(FsError::EISDIR);
        }
        let ino = self.tree.lock().link(parent, name, kind);
        if created {
            let blob = self.blobs.put_bytes(b"", false)?;
            self.record(
                Change::new(Op::Create, path.clone(), Some(empty_blob_state(&st, blob))),
                caller,
            );
        }
        let of = match self.open_live(ino, &path) {
            Ok(of) => of,
            Err(e) => {
                self.tree.lock().forget(ino, 1);
                return Err(e);
            }
        };
        let reply = self.finish_open(ino, of, flags)?;
        Ok((
            Entry {
                ino,
                stat: self.finish_stat(ino, st),
            },
            reply,
        ))
    }

    /// `mknod` of a regular file is a create without an open handle; other
    /// node types are not kept in a skills tree.
    pub fn mknod(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> FsResult<Entry> {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(FsError::EPERM);
        }
        let (entry, reply) =
            self.create(parent, name, mode, libc::O_RDONLY | libc::O_EXCL, caller)?;
        self.release(reply.fh, caller)?;
        Ok(entry)
    }

    fn file_handle(&self, fh: u64) -> FsResult<(Ino, bool, bool)> {
        match self.handles.lock().get(&fh) {
            Some(Handle::File { ino, write, append }) => Ok((*ino, *write, *append)),
            _ => Err(FsError::EBADF),
        }
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let (ino, _, _) = self.file_handle(fh)?;
        let of = self.open_file(ino).ok_or(FsError::EBADF)?;
        let file = {
            let s = of.state.lock();
            match &s.staging {
                Some(stg) => Arc::clone(&stg.file),
                None => Arc::clone(&s.live),
            }
        };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            let n = file.read_at(&mut buf[got..], offset + got as u64)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        buf.truncate(got);
        Ok(buf)
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let (ino, write, append) = self.file_handle(fh)?;
        if !write {
            return Err(FsError::EBADF);
        }
        let of = self.open_file(ino).ok_or(FsError::EBADF)?;
        let mut s = of.state.lock();
        self.ensure_staging(&mut s, false)?;
        let stg = s.staging.as_mut().expect("just ensured");
        let offset = if append {
            sys::fstat(&*stg.file)?.st_size as u64
        } else {
            offset
        };
        stg.file.write_all_at(data, offset)?;
        stg.dirty = true;
        Ok(data.len() as u32)
    }

    /// Publishes a writer's staged bytes as a version (not yet durable).
    pub fn flush(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        let (ino, write, _) = self.file_handle(fh)?;
        if write {
            self.publish(ino, false, caller)?;
        }
        Ok(())
    }

    pub fn fsync(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        let (ino, _, _) = self.file_handle(fh)?;
        self.publish(ino, true, caller)
    }

    pub fn release(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        let h = self.handles.lock().remove(&fh);
        let Some(Handle::File { ino, write, .. }) = h else {
            return Err(FsError::EBADF);
        };
        let result = if write {
            let last_writer = self
                .open_file(ino)
                .is_some_and(|of| of.state.lock().writers <= 1);
            if last_writer {
                self.publish(ino, false, caller)
            } else {
                Ok(())
            }
        } else {
            Ok(())
        };
        self.release_open(ino, write);
        result
    }

    fn publish(&self, ino: Ino, durable: bool, caller: &Caller) -> FsResult<()> {
        let _ns = self.namespace.read();
        let Some(of) = self.open_file(ino) else {
            return Ok(());
        };
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(_) => return Ok(()), // unlinked while open: nothing left to publish to
        };
        let mut s = of.state.lock();
        let dirty = s.staging.as_ref().is_some_and(|stg| stg.dirty);
        if dirty {
            self.publish_locked(&mut s, &path, Op::Write, durable, caller)?;
        } else if durable {
            // Already published: make it durable in the same order.
            self.ledger.lock().sync(&self.blobs)?;
            sys::fsync(&*s.live)?;
            self.sync_parent(&path)?;
        }
        Ok(())
    }

    /// Durability order: blob, journal record, then the live file replaced.
    fn publish_locked(
        &self,
        s: &mut OpenState,
        path: &RelPath,
        op: Op,
        durable: bool,
        caller: &Caller,
    ) -> FsResult<()> {
        let stg = s.staging.as_ref().expect("caller checked");
        let (blob, size) = self.blobs.put_file(&stg.file, durable)?;
        let st = sys::fstat(&*stg.file)?;
        let mut state = state_from_stat(&st, Kind::File);
        state.size = size;
        state.blob = Some(blob);
        {
            let mut ledger = self.ledger.lock();
            let same = ledger.catalog().get(path).is_some_and(|old| {
                old.kind == Kind::File
                    && old.blob == state.blob
                    && old.mode == state.mode
                    && old.uid == state.uid
                    && old.gid == state.gid
            });
            if !same
                && let Err(e) =
                    ledger.record(Change::new(op, path.clone(), Some(state)), caller.actor())
            {
                // Without its record the version must not become live.
                tracing::error!("could not journal {} of {path}: {e}", op.name());
                return Err(e.into());
            }
            if durable {
                ledger.sync(&self.blobs)?;
            }
        }
        if durable {
            sys::fsync(&*stg.file)?;
        }
        let (fd, rel) = self.locate(path);
        sys::renameat2(
            libc::AT_FDCWD,
            stg.path.as_os_str().as_encoded_bytes(),
            fd,
            rel,
            0,
        )?;
        if durable {
            self.sync_parent(path)?;
        }
        let stg = s.staging.take().expect("checked above");
        s.live = stg.file;
        Ok(())
    }

    fn sync_parent(&self, path: &RelPath) -> FsResult<()> {
        let parent = path.parent().unwrap_or_default();
        let (fd, rel) = self.locate(&parent);
        let dir = sys::open_dir(fd, rel)?;
        sys::fsync(&dir)?;
        Ok(())
    }

    // ------------------------------------------------------------ directories

    pub fn opendir(&self, ino: Ino) -> FsResult<u64> {
        let _ns = self.namespace.read();
        let path = self.path_of(ino)?;
        let (fd, rel) = self.locate(&path);
        let raw = sys::read_dir_at(fd, rel)?;
        let parent = {
            let tree = self.tree.lock();
            tree.nodes.get(&ino).map_or(ROOT_INO, |n| n.parent)
        };
        let mut entries = Vec::with_capacity(raw.len() + 2);
        entries.push(DirEntry {
            name: b".".to_vec(),
            kind: Kind::Dir,
            ino,
        });
        entries.push(DirEntry {
            name: b"..".to_vec(),
            kind: Kind::Dir,
            ino: parent,
        });
        let tree = self.tree.lock();
        for e in raw {
            let kind = match e.d_type {
                libc::DT_DIR => Kind::Dir,
                libc::DT_REG => Kind::File,
                libc::DT_LNK => Kind::Symlink,
                libc::DT_UNKNOWN => match sys::lstatat(fd, path.join(&e.name).as_bytes())
                    .ok()
                    .and_then(|st| kind_of(&st))
                {
                    Some(k) => k,
                    None => continue,
                },
                _ => continue,
            };
            let ino = tree.child(ino, &e.name).unwrap_or(e.d_ino | 1 << 63);
            entries.push(DirEntry {
                name: e.name,
                kind,
                ino,
            });
        }
        drop(tree);
        Ok(self.new_handle(Handle::Dir {
            entries: Arc::new(entries),
        }))
    }

    /// The listing taken at `opendir`; offsets are indexes + 1.
    pub fn readdir(&self, fh: u64) -> FsResult<Arc<Vec<DirEntry>>> {
        match self.handles.lock().get(&fh) {
            Some(Handle::Dir { entries }) => Ok(Arc::clone(entries)),
            _ => Err(FsError::EBADF),
        }
    }

    pub fn releasedir(&self, fh: u64) {
        self.handles.lock().remove(&fh);
    }

    pub fn fsyncdir(&self, ino: Ino) -> FsResult<()> {
        let _ns = self.namespace.read();
        let path = self.path_of(ino)?;
        self.ledger.lock().sync(&self.blobs)?;
        let (fd, rel) = self.locate(&path);
        sys::fsync(&sys::open_dir(fd, rel)?)?;
        Ok(())
    }

    /// Called at unmount: publish what writers left and make it durable.
    pub fn shutdown(&self) {
        let inos: Vec<Ino> = self.open_files.lock().keys().copied().collect();
        let daemon = Caller {
            uid: sys::geteuid(),
            gid: 0,
            pid: std::process::id(),
        };
        for ino in inos {
            if let Err(e) = self.publish(ino, false, &daemon) {
                tracing::error!("could not publish inode {ino} at unmount: {e:?}");
            }
        }
        if let Err(e) = self.ledger.lock().sync(&self.blobs) {
            tracing::error!("could not sync the journal at unmount: {e}");
        }
    }
}

fn apply_meta_fd(f: &File, attr: &SetAttr) -> FsResult<()> {
    if let Some(mode) = attr.mode {
        sys::fchmod(f, mode & 0o7777)?;
    }
    if attr.uid.is_some() || attr.gid.is_some() {
        sys::fchown(
            f,
            attr.uid.unwrap_or(u32::MAX),
            attr.gid.unwrap_or(u32::MAX),
        )?;
    }
    if attr.atime.is_some() || attr.mtime.is_some() {
        sys::futimens(
            f,
            attr.atime.unwrap_or(Time::Keep),
            attr.mtime.unwrap_or(Time::Keep),
        )?;
    }
    Ok(())
}
