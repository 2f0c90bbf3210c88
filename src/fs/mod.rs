//! `SkillFs`: the filesystem core, free of any FUSE type.
//!
//! Every handler takes plain values (inode numbers, names, a [`Caller`]) and
//! returns `FsResult`; `fuse.rs` only converts and replies.
//!
//! Invariants:
//! - Live files are ordinary files under the root, reached only through the
//!   root fd opened before the mount, with relative paths; hidden entries
//!   live in the store's `parked/` area (see `tree`), never under the root.
//!   No fd is held per inode, only per open file.
//! - A live file is never modified in place. A writer gets a staging file in
//!   the store (empty for `O_TRUNC`, else a copy made at its first write);
//!   reads through any handle of the inode see the staged bytes. Publishing
//!   (on flush, release or fsync) stores the blob, appends the journal record
//!   and only then renames the staging file over the live one. Untracked
//!   files are published the same way (never torn) but not versioned.
//!   Hidden files are scratch (temp files, locks, parks): they are written
//!   in place, as any filesystem would, and not versioned; one made visible
//!   while a writer still has it open is versioned when that writer
//!   publishes.
//! - The hide rules are consulted only where a name is placed (create,
//!   mkdir, symlink, rename target); a visible directory's listing is its
//!   physical content, so it never shows a hidden entry. A name exists in at
//!   most one of a directory's two places (inside it, or attached to it).
//! - Namespace changes hold the namespace lock exclusively for the system
//!   call and the inode table update, so a location resolved under the shared
//!   lock is valid until it is released.
//!
//! Lock order: `namespace` → `tree` → `open_files` → an `OpenFile` → `ledger`;
//! an `OpenFile` → the page store's slots (see `pages`). The group commit
//! (`commit`) is entered holding at most `namespace` and an `OpenFile`,
//! never `ledger`; inside, it takes `ledger` only briefly and on its own.
//! `stale`, `shared`, `parks`, `handles` and `listings` are leaves.
//! - A file an unlink or a rename takes away stays reachable (`stale`)
//!   while the kernel still names its inode; an inode seen with another
//!   name while mounted (`shared`) is never emptied for reuse.

mod history_view;
mod pages;
mod sweep;
mod tree;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::error::{FsError, FsResult};
use crate::hide::HideRules;
use crate::history;
use crate::ledger::{GroupCommit, Ledger};
use crate::relpath::{ByteString, RelPath};
use crate::scan::{Areas, Prehashed, Settler, kind_of, state_from_stat};
use crate::store::blobs::{BlobStore, Opened, copy_range};
use crate::store::durable::StoreIo;
use crate::store::journal::{Actor, Change, EntryState, Kind, Op};
use crate::store::spares::Spares;
use crate::sys::{self, Time};

use history_view::{HISTORY, VNode, decode, is_virtual};
use pages::{Claim, PageStore};
pub use pages::{Kernel as PageKernel, PageOp};
use tree::Tree;
pub use tree::{Ino, Location, ROOT_INO};

const NAME_MAX: usize = 255;

/// Internal only, never answered to the kernel: a change met a store into
/// the page cache being written (see `lock_to_change`).
const STORE_BUSY: FsError = FsError(i32::MIN);

/// Who is asking, from the FUSE request header.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    /// The daemon itself (work at unmount, with no request behind it).
    fn kernel() -> Caller {
        Caller {
            uid: sys::geteuid(),
            gid: 0,
            pid: std::process::id(),
        }
    }

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
    pub ttl: Ttl,
}

/// What the kernel must forget.
pub enum Invalidation {
    /// An inode's attributes and cached content (a directory's listing).
    Inode(Ino),
    /// A name in a directory.
    Entry(Ino, Vec<u8>),
    /// Answered once every invalidation sent before it has been delivered.
    Barrier(std::sync::mpsc::Sender<()>),
}

/// How long the kernel may cache an entry and its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// Live tree: long; the kernel sees every change go through it.
    Live,
    /// History: never changes.
    Immutable,
    /// A `.history` listing: grows with every change.
    Volatile,
    /// An alias (`latest`, `@-10m`): the name must be resolved again each
    /// time, the version it names never changes.
    Alias,
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
    /// Made through an open file handle (`ftruncate`, `fchmod`…), not by path.
    pub via_handle: bool,
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
    /// `S_IFIFO` or `S_IFSOCK` for such a node (`kind` then says `File`),
    /// else 0.
    pub special: u32,
}

/// Flags the kernel should apply to an open file.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenReply {
    pub fh: u64,
    /// Read-only open: closing it has nothing to publish.
    pub no_flush: bool,
    /// The content never changes (a version under `.history`).
    pub immutable: bool,
}

/// The store directories the core works in.
pub struct StoreDirs {
    pub staging: PathBuf,
    /// Where spare inodes are made before they join `staging`.
    pub tmp: PathBuf,
    pub parked_fd: OwnedFd,
    pub orphans_fd: OwnedFd,
}

/// A copy-on-write scratch file of an inode that has writers, or, for a
/// hidden file, the live file itself opened for writing (`in_place`).
struct Staging {
    file: Arc<File>,
    /// Where the scratch file is in `staging/` (empty when in place).
    path: PathBuf,
    /// Holds bytes not yet published.
    dirty: bool,
    /// Emptied by an `O_TRUNC` open and not written since: a flush does
    /// not publish it (see `flush`).
    trunc_only: bool,
    in_place: bool,
    /// Counts the changes of its bytes: a durable publish that let go of
    /// its locks to flush swaps it in only if none came meanwhile (see
    /// `publish_durable`).
    edits: u64,
}

impl Staging {
    /// Its bytes changed: owed a version.
    fn mark_written(&mut self) {
        self.dirty = true;
        self.trunc_only = false;
        self.edits += 1;
    }
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
    File {
        ino: Ino,
        write: bool,
        append: bool,
    },
    /// A file under `.history`: its blob, read-only.
    Blob {
        file: Arc<Opened>,
    },
}

pub struct SkillFs {
    root_fd: OwnedFd,
    dirs: StoreDirs,
    rules: HideRules,
    blobs: BlobStore,
    ledger: Mutex<Ledger>,
    /// Syncs the journal outside `ledger`'s lock (see `ledger::GroupCommit`).
    commit: GroupCommit,
    namespace: RwLock<()>,
    /// Bumped by every holder of `namespace` for writing (see `ns_write`).
    ns_changes: AtomicU64,
    tree: Mutex<Tree>,
    open_files: Mutex<HashMap<Ino, Arc<OpenFile>>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// The daemon runs as root: new entries are given to their caller.
    chown_new: bool,
    /// Listings being read without a handle, by snapshot number.
    listings: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    /// Tells the kernel to drop what it cached of an inode or a name.
    invalidator: std::sync::OnceLock<Box<dyn Fn(Invalidation) + Send + Sync>>,
    /// One `fsync` commits all earlier metadata here (ext4, XFS).
    ordered_commit: bool,
    /// A store file touched and fsynced to commit everything before it
    /// where `ordered_commit` holds and no file of the change is sure to be
    /// in the running transaction (see `commit_all`).
    marker: File,
    /// Empty files in `staging/` for new staging and blob files: the
    /// inodes that publishing swaps out of the live tree, emptied, and new
    /// ones made ahead of need (see `store::spares`).
    spares: Arc<Spares>,
    /// Whether the park of a directory (by key) exists, where known: a
    /// name missing inside a directory without a park is not looked for in
    /// `parked/`. Parks are made while mounted only by `ensure_park`, which
    /// records it, and by the settler, and removed only by the settler: a
    /// settler run forgets everything known.
    parks: Mutex<HashMap<String, bool>>,
    /// References taken by `hold` that the janitor has yet to drop.
    held: Arc<AtomicUsize>,
    /// Physical inodes (device, inode) seen with more than one name while
    /// mounted (opened through a hard link made offline, or kept by
    /// `keep_stale` while another name remained): one of them may be read
    /// through another name long after a publish swaps it out, so the
    /// janitor never empties one for reuse.
    shared: Arc<Mutex<HashSet<(u64, u64)>>>,
    /// Fills `spares` off the request path (freeing the blocks of a
    /// swapped-out inode, or allocating one, can take hundreds of
    /// microseconds).
    janitor: Mutex<Option<Janitor>>,
    /// Pushes the pages of files just written into the kernel's cache.
    pages: Arc<PageStore>,
    /// Bumped by every swap of a new version into the live tree (see
    /// `lookup`).
    swaps: AtomicU64,
    /// The files that an unlink or a rename over them took from the tree
    /// while the kernel still names their inode (an `O_PATH` reference
    /// each, until the kernel forgets it): a path resolved just before the
    /// change opens and stats the file it resolved to, as on ext4, instead
    /// of failing (see `open`). Bounded by `MAX_STALE`.
    stale: Mutex<HashMap<Ino, File>>,
}

/// At most this many replaced or removed files are kept for the kernel's
/// late opens; past it such an open answers `ESTALE` (the kernel then looks
/// the path up again).
const MAX_STALE: usize = 1024;

/// At most this many references from `hold` wait for the janitor.
const MAX_HELD: usize = 256;

/// Work for the janitor thread.
enum Chore {
    /// A swapped-out inode, now at this path in `staging/`; whether it may
    /// be reused (see `recycle_inode`).
    Recycle(Arc<File>, PathBuf, bool),
    /// The spares ran low.
    TopUp,
    /// The last reference to a replaced or removed file: closing it frees
    /// its blocks (see `SkillFs::free_later`).
    Close(File),
    Stop,
}

/// The janitor thread's inbox and handle.
type Janitor = (std::sync::mpsc::Sender<Chore>, std::thread::JoinHandle<()>);

fn empty_blob_state(st: &libc::stat, blob: String) -> EntryState {
    let mut s = state_from_stat(st, Kind::File);
    s.blob = Some(blob);
    s
}

/// The kind the inode table gives an entry: FIFOs and sockets (scratch,
/// never versioned) are non-directories like files; devices have none.
fn node_kind(st: &libc::stat) -> Option<Kind> {
    kind_of(st).or(match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO | libc::S_IFSOCK => Some(Kind::File),
        _ => None,
    })
}

/// `S_IFIFO` or `S_IFSOCK` for such a node, else 0.
fn special_of(st: &libc::stat) -> u32 {
    match st.st_mode & libc::S_IFMT {
        t @ (libc::S_IFIFO | libc::S_IFSOCK) => t,
        _ => 0,
    }
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

fn enoent(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

/// An entry found by name: where it is and what it is.
struct Found {
    loc: Location,
    st: libc::stat,
    attached: bool,
}

impl SkillFs {
    pub fn new(
        root_fd: OwnedFd,
        dirs: StoreDirs,
        rules: HideRules,
        blobs: BlobStore,
        ledger: Ledger,
    ) -> FsResult<SkillFs> {
        let root_key = sys::dir_key(root_fd.as_raw_fd(), b"")?;
        let spares = Arc::new(Spares::new(dirs.staging.clone(), dirs.tmp.clone()));
        let blobs = blobs.with_spares(Arc::clone(&spares));
        let held = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Mutex::new(HashSet::new()));
        let janitor = start_janitor(Arc::clone(&spares), Arc::clone(&held), Arc::clone(&shared));
        let low = Mutex::new(janitor.0.clone());
        spares.set_on_low(Box::new(move || {
            let _ = low.lock().send(Chore::TopUp);
        }));
        let _ = janitor.0.send(Chore::TopUp);
        let ordered_commit = std::env::var_os("SKILLFS_PORTABLE_FSYNC").is_none()
            && sys::has_ordered_commit(&dirs.parked_fd);
        let marker = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dirs.tmp.join("commit"))?;
        tracing::info!(
            "fsync: {}",
            if ordered_commit {
                "one commit per durability point (journaled filesystem)"
            } else {
                "each step fsynced in order"
            }
        );
        Ok(SkillFs {
            root_fd,
            dirs,
            rules,
            blobs,
            commit: GroupCommit::new(ledger.durable_through()),
            ledger: Mutex::new(ledger),
            namespace: RwLock::new(()),
            ns_changes: AtomicU64::new(0),
            tree: Mutex::new(Tree::new(root_key)),
            open_files: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            chown_new: sys::geteuid() == 0,
            listings: Mutex::new(HashMap::new()),
            invalidator: std::sync::OnceLock::new(),
            ordered_commit,
            marker,
            janitor: Mutex::new(Some(janitor)),
            pages: PageStore::new(),
            swaps: AtomicU64::new(0),
            stale: Mutex::new(HashMap::new()),
            parks: Mutex::new(HashMap::new()),
            held,
            shared,
            spares,
        })
    }

    pub fn rules(&self) -> &HideRules {
        &self.rules
    }

    /// How the core tells the kernel that an inode it may have cached
    /// changed behind its back (set once, by the FUSE adapter).
    pub fn set_invalidator(&self, f: Box<dyn Fn(Invalidation) + Send + Sync>) {
        let _ = self.invalidator.set(f);
    }

    /// Starts pushing the pages of files just written into the kernel's
    /// page cache, through `kernel` (see `pages`).
    pub fn start_page_store(&self, kernel: PageKernel) -> std::io::Result<()> {
        self.pages.start(kernel)
    }

    /// Locks `of`'s state for a change of its content, once no store of an
    /// earlier content into the kernel's page cache can land after it.
    /// [`STORE_BUSY`] if a store is being written: the caller lets go of
    /// every lock, waits (`retry_after_store`) and starts over, because the
    /// store may wait on a read that needs a request thread, and a thread
    /// waiting with the namespace lock would hold up the others.
    fn lock_to_change<'a>(
        &self,
        ino: Ino,
        of: &'a OpenFile,
    ) -> FsResult<parking_lot::MutexGuard<'a, OpenState>> {
        let s = of.state.lock();
        match self.pages.claim(ino) {
            Claim::Clear => Ok(s),
            Claim::Busy => Err(STORE_BUSY),
        }
    }

    /// Runs `op` (which takes its own locks) again for as long as it meets
    /// a store being written, waiting for the store between tries.
    fn retry_after_store<T>(&self, ino: Option<Ino>, op: impl Fn() -> FsResult<T>) -> FsResult<T> {
        loop {
            match op() {
                Err(e) if e == STORE_BUSY => self.pages.wait(ino),
                r => return r,
            }
        }
    }

    fn invalidate(&self, ino: Ino) {
        if let Some(f) = self.invalidator.get() {
            f(Invalidation::Inode(ino));
        }
    }

    fn invalidate_entry(&self, parent: Ino, name: Vec<u8>) {
        if let Some(f) = self.invalidator.get() {
            f(Invalidation::Entry(parent, name));
        }
    }

    /// Waits until the invalidations sent so far have reached the kernel,
    /// so that the caller's reply is not followed by a read of what they
    /// drop. Bounded: a notification can wait on kernel locks the current
    /// request holds, and then it lands just after the reply instead.
    fn invalidations_delivered(&self) {
        if let Some(f) = self.invalidator.get() {
            let (tx, rx) = std::sync::mpsc::channel();
            f(Invalidation::Barrier(tx));
            let _ = rx.recv_timeout(std::time::Duration::from_millis(200));
        }
    }

    /// The namespace lock for a change of the tree, counted (the sweep
    /// checks whether one came while it held no lock).
    fn ns_write(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        let guard = self.namespace.write();
        self.ns_changes.fetch_add(1, Ordering::SeqCst);
        guard
    }

    fn root_raw(&self) -> RawFd {
        self.root_fd.as_raw_fd()
    }

    fn parked_raw(&self) -> RawFd {
        self.dirs.parked_fd.as_raw_fd()
    }

    fn areas(&self) -> Areas {
        Areas {
            root_fd: self.root_raw(),
            parked_fd: self.parked_raw(),
            orphans_fd: self.dirs.orphans_fd.as_raw_fd(),
        }
    }

    fn loc(&self, ino: Ino) -> FsResult<Location> {
        self.tree
            .lock()
            .location(ino, self.root_raw(), self.parked_raw())
    }

    fn key_of(&self, ino: Ino, loc: &Location) -> FsResult<String> {
        self.tree.lock().key_of(ino, loc)
    }

    /// `name` in directory `parent` (at `ploc`): inside it, else attached.
    fn find(&self, parent: Ino, ploc: &Location, name: &[u8]) -> FsResult<Found> {
        let inside = ploc.child(name);
        match inside.lstat() {
            Ok(st) => {
                return Ok(Found {
                    loc: inside,
                    st,
                    attached: false,
                });
            }
            Err(e) if enoent(&e) => {}
            Err(e) => return Err(e.into()),
        }
        let key = self.key_of(parent, ploc)?;
        if self.parks.lock().get(&key) == Some(&false) {
            return Err(FsError::ENOENT);
        }
        let att = ploc.attached_child(self.parked_raw(), &key, name);
        match att.lstat() {
            Ok(st) => Ok(Found {
                loc: att,
                st,
                attached: true,
            }),
            Err(e) if enoent(&e) || e.raw_os_error() == Some(libc::ENOTDIR) => {
                // Most directories have no park: remember, and save the
                // next lookups of names that are not there the second stat.
                if !self.parks.lock().contains_key(&key) {
                    let exists = match sys::lstatat(self.parked_raw(), key.as_bytes()) {
                        Ok(_) => true,
                        Err(e) if enoent(&e) => false,
                        Err(e) => return Err(e.into()),
                    };
                    self.parks.lock().insert(key, exists);
                }
                Err(FsError::ENOENT)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Where a new `name` of `kind` goes in directory `parent` (at `ploc`):
    /// inside a hidden directory, always inside (no rule applies there);
    /// in a visible one, attached when a hide rule says so.
    fn place(
        &self,
        parent: Ino,
        ploc: &Location,
        name: &[u8],
        kind: Kind,
    ) -> FsResult<(Location, bool)> {
        let Some(pvis) = &ploc.visible else {
            return Ok((ploc.child(name), false));
        };
        let mut inside_skill = || self.inside_skill(Some(pvis.clone()));
        if self
            .rules
            .is_hidden(name, kind, parent == ROOT_INO, &mut inside_skill)
        {
            let key = self.key_of(parent, ploc)?;
            self.ensure_park(&key)?;
            Ok((ploc.attached_child(self.parked_raw(), &key, name), true))
        } else {
            Ok((ploc.child(name), false))
        }
    }

    /// Whether visible directory `dir` or one of its ancestors is a skill
    /// package (holds a `SKILL.md`).
    fn inside_skill(&self, mut dir: Option<RelPath>) -> bool {
        while let Some(d) = dir {
            if sys::lstatat(self.root_raw(), d.join(b"SKILL.md").as_bytes()).is_ok() {
                return true;
            }
            dir = d.parent();
        }
        false
    }

    /// The entry `name` has in the place other than `attached`, if any.
    fn in_other_place(
        &self,
        parent: Ino,
        ploc: &Location,
        name: &[u8],
        attached: bool,
    ) -> FsResult<Option<Found>> {
        match self.find(parent, ploc, name) {
            Ok(f) if f.attached != attached => Ok(Some(f)),
            Ok(_) => Ok(None),
            Err(FsError::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn open_file(&self, ino: Ino) -> Option<Arc<OpenFile>> {
        self.open_files.lock().get(&ino).cloned()
    }

    /// Attributes as the kernel must see them: our inode number, and the
    /// staged size and times while a writer has unpublished bytes.
    ///
    /// Of an open file (`of`, looked up before `st` was taken), they come
    /// from the open state, not from `st`: that stat of the path may predate
    /// a publish that swapped a new file in, and a reply with the old size,
    /// sent after the kernel's last write, would be taken as newer than it
    /// (seen as short reads). A stat taken after finding no open state is
    /// current: an open state outlives its publishes.
    fn finish_stat(&self, ino: Ino, of: Option<&OpenFile>, mut st: libc::stat) -> libc::stat {
        if let Some(of) = of {
            let s = of.state.lock();
            let fresh = match &s.staging {
                Some(stg) => sys::fstat(&*stg.file).ok(),
                None => {
                    if let Ok(live) = sys::fstat(&*s.live)
                        && live.st_nlink > 0
                    {
                        st = live;
                    }
                    None
                }
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

    /// Refuses a change that adds or moves a name (`ENOSPC`) when its record
    /// could not be written (a full disk with no room left in the journal's
    /// reserve): made with no record, it would be missing from `.history`
    /// until the next mount's scan. (Removals are not refused: see
    /// `remove`.)
    fn journal_room(&self) -> FsResult<()> {
        Ok(self.ledger.lock().ensure_room()?)
    }

    /// Makes every record appended so far durable (group commit: the
    /// ledger's lock is not held across the flush).
    fn sync_records(&self) -> FsResult<()> {
        let want = self.ledger.lock().last_seq();
        Ok(self.commit.sync_through(&self.ledger, &self.blobs, want)?)
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

    /// The state of a visible entry for a record (content from the catalog).
    fn state_of(&self, loc: &Location, path: &RelPath) -> FsResult<EntryState> {
        let st = loc.lstat()?;
        let kind = kind_of(&st).ok_or(FsError::EPERM)?;
        let mut s = state_from_stat(&st, kind);
        let known = self.ledger.lock().catalog().get(path).cloned();
        match kind {
            Kind::File => s.blob = known.and_then(|c| c.blob),
            Kind::Symlink => {
                // From the catalog where it has it: reading the link would
                // set its access time, undoing a `touch -h` just made.
                s.target = match known.and_then(|c| c.target) {
                    Some(t) => Some(t),
                    None => Some(ByteString(sys::readlinkat(loc.dirfd, &loc.phys)?)),
                };
            }
            Kind::Dir => {}
        }
        Ok(s)
    }

    /// Whether an entry made at `loc` can come from the spares (see
    /// `store::spares`): renamed into place, it must end up as a create
    /// there would have made it.
    fn spare_fits(&self, loc: &Location) -> bool {
        let parent = match loc.phys.iter().rposition(|&b| b == b'/') {
            Some(i) => &loc.phys[..i],
            None => &b""[..],
        };
        if loc.dirfd == self.parked_raw() && !parent.contains(&b'/') {
            return true; // a park itself: the daemon's own plain directory
        }
        sys::dir_passes_on_more(loc.dirfd, parent).is_ok_and(|more| !more)
    }

    /// Creates the empty file `loc` (exclusively) for `caller`. A spare
    /// file renamed into place spares the request an inode allocation.
    fn new_file_at(&self, loc: &Location, mode: u32, caller: &Caller) -> std::io::Result<()> {
        if self.spare_fits(loc) {
            let (path, file) = self.spares.take()?;
            let ready = (|| {
                // A recycled spare still has its last owner; chown before
                // chmod, which chown would strip of set-ID bits.
                if self.chown_new {
                    sys::fchown(&file, caller.uid, caller.gid)?;
                }
                sys::fchmod(&file, mode)?;
                sys::futimens(&file, Time::Now, Time::Now)
            })();
            return put_spare(ready, &path, loc.dirfd, &loc.phys);
        }
        let f = sys::openat(
            loc.dirfd,
            &loc.phys,
            libc::O_RDONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode,
        )?;
        drop(f);
        self.give_to_caller(loc, caller);
        Ok(())
    }

    /// Creates the directory `loc` (its owner is set by the caller), from a
    /// spare where one fits, like `new_file_at`.
    fn new_dir_at(&self, loc: &Location, mode: u32) -> std::io::Result<()> {
        if !self.spare_fits(loc) {
            return sys::mkdirat(loc.dirfd, &loc.phys, mode);
        }
        let dir = self.spares.take_dir()?;
        let from = dir.as_os_str().as_encoded_bytes();
        let ready = sys::fchmodat(libc::AT_FDCWD, from, mode)
            .and_then(|()| sys::lutimensat(libc::AT_FDCWD, from, Time::Now, Time::Now));
        put_spare(ready, &dir, loc.dirfd, &loc.phys)
    }

    /// Makes sure the park of the directory with `key` exists (from a spare
    /// directory the first time).
    fn ensure_park(&self, key: &str) -> std::io::Result<()> {
        // Known to exist: it was seen, or made, and only a sweep removes
        // parks (which forgets what is known).
        if self.parks.lock().get(key) == Some(&true) {
            return Ok(());
        }
        match sys::lstatat(self.parked_raw(), key.as_bytes()) {
            Ok(_) => {}
            Err(e) if enoent(&e) => {
                let dir = self.spares.take_dir()?;
                match put_spare(Ok(()), &dir, self.parked_raw(), key.as_bytes()) {
                    // Made by a racing request.
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    r => r?,
                }
            }
            Err(e) => return Err(e),
        }
        self.parks.lock().insert(key.to_string(), true);
        Ok(())
    }

    fn give_to_caller(&self, loc: &Location, caller: &Caller) {
        if self.chown_new
            && (caller.uid != 0 || caller.gid != 0)
            && let Err(e) = sys::lchownat(loc.dirfd, &loc.phys, caller.uid, caller.gid)
        {
            tracing::warn!("could not give {} to uid {}: {e}", loc.logical, caller.uid);
        }
    }

    /// The path to journal a change of the entry at `loc` under: its visible
    /// path, unless it is hidden or untracked (not versioned).
    fn versioned(&self, loc: &Location) -> Option<RelPath> {
        loc.visible
            .as_ref()
            .filter(|p| !self.rules.is_untracked(p))
            .cloned()
    }

    /// Publishes the staged bytes of open files at or below `under` before
    /// that entry is removed, replaced, parked or truncated: what a reader
    /// sees is content, and G1 keeps it. Called under the namespace lock.
    /// A failure (a full disk) is the caller's: the change that would lose
    /// those bytes must be refused with it.
    fn publish_dirty_under(&self, under: &Location, caller: &Caller) -> FsResult<()> {
        let inos: Vec<Ino> = self.open_files.lock().keys().copied().collect();
        for ino in inos {
            let Ok(loc) = self.loc(ino) else { continue };
            if !loc.logical.starts_with(&under.logical) {
                continue;
            }
            let Some(of) = self.open_file(ino) else {
                continue;
            };
            let mut s = of.state.lock();
            if s.staging.as_ref().is_some_and(|stg| stg.dirty) {
                self.publish_locked(&mut s, &loc, Op::Write, false, caller)
                    .inspect_err(|e| {
                        tracing::warn!("could not publish {} before it changed: {e:?}", loc.logical)
                    })?;
            }
        }
        Ok(())
    }

    /// Moves the attached area of a removed directory to the orphans.
    fn orphan_attached(&self, key: &str, logical: &RelPath, caller: &Caller) {
        self.parks.lock().remove(key);
        let mut ledger = self.ledger.lock();
        if let Err(e) = self
            .areas()
            .orphan_key(key, logical, &mut ledger, &caller.actor())
        {
            tracing::error!("could not move the hidden entries of {logical} to the orphans: {e}");
        }
    }

    // ------------------------------------------------------------ lookups

    /// Whether the kernel may remember that `name` is missing from
    /// `parent` (a negative entry) as long as an entry. In the live tree a
    /// name appears only through the kernel (create, mkdir, symlink,
    /// rename), which replaces its negative entry itself; what the daemon
    /// removes behind it it invalidates. Not so under `.history`, which
    /// grows with every change, nor for `.history` itself, which exists in
    /// a directory only while that directory is visible.
    pub fn absence_is_cacheable(&self, parent: Ino, name: &[u8]) -> bool {
        !is_virtual(parent) && name != HISTORY
    }

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<Entry> {
        if name.len() > NAME_MAX {
            return Err(FsError::ENAMETOOLONG);
        }
        if let Some(v) = decode(parent) {
            return self.vlookup(v, name);
        }
        let _ns = self.namespace.read();
        if name == HISTORY {
            return self.history_dir(parent);
        }
        let ploc = self.loc(parent)?;
        let swaps = self.swaps.load(Ordering::SeqCst);
        let f = self.find(parent, &ploc, name)?;
        let kind = node_kind(&f.st).ok_or(FsError::ENOENT)?;
        let ino = self.tree.lock().link(parent, name, kind, f.attached);
        let of = self.open_file(ino);
        // `find` stat'ed before the open state was looked up (see
        // `finish_stat`): if a version was swapped in since, and the file
        // is not open, stat again.
        let st = match &of {
            None if self.swaps.load(Ordering::SeqCst) != swaps => f.loc.lstat().unwrap_or(f.st),
            _ => f.st,
        };
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, of.as_deref(), st),
            ttl: Ttl::Live,
        })
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        let gone = {
            let mut tree = self.tree.lock();
            tree.forget(ino, n);
            !tree.knows(ino)
        };
        if gone {
            let file = self.stale.lock().remove(&ino);
            self.free_later(file);
        }
    }

    /// A reference to the file `parent/name` at `loc`, taken before a call
    /// that unlinks or replaces it (see `hold`). Where the kernel knows its
    /// inode, taken whatever the janitor's backlog, to be kept for the
    /// kernel's late opens (`keep_stale`).
    fn hold_name(&self, parent: Ino, name: &[u8], loc: &Location) -> Option<File> {
        let known = self.tree.lock().child(parent, name).is_some();
        if known && self.stale.lock().len() < MAX_STALE {
            return sys::openat(
                loc.dirfd,
                &loc.phys,
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0,
            )
            .ok();
        }
        self.hold(loc)
    }

    /// Remembers `f`'s inode as shared (see `shared`) when it has more than
    /// `names` links.
    fn note_if_shared(&self, f: &File, names: u64) {
        if let Ok(st) = sys::fstat(f)
            && st.st_nlink > names
        {
            self.shared.lock().insert((st.st_dev, st.st_ino));
        }
    }

    /// Keeps `held` (from `hold_name`: the file `parent/name`, just
    /// unlinked or replaced) for the kernel's late opens of its inode, if
    /// the kernel knows one, until it forgets it; otherwise it is freed off
    /// the request path. Called under the namespace lock, before the tree
    /// forgets the name.
    fn keep_stale(&self, parent: Ino, name: &[u8], held: Option<File>) {
        let known = self.tree.lock().child(parent, name);
        if let Some(f) = held.as_ref() {
            // Another name still has it: it may be written through that one.
            self.note_if_shared(f, 0);
        }
        if let (Some(ino), Some(f)) = (known, held.as_ref()) {
            let mut stale = self.stale.lock();
            if stale.len() < MAX_STALE
                && let Ok(f) = f.try_clone()
            {
                stale.insert(ino, f);
                // The kept one holds the inode: closing this frees nothing.
                return;
            }
        }
        self.free_later(held);
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Entry> {
        if let Some(v) = decode(ino) {
            let ttl = match v {
                // The root's own mode and owner are not versioned: a
                // snapshot of the root shows the current ones.
                VNode::Listing(_) | VNode::Snap(history::ROOT_IDX, _) => Ttl::Volatile,
                VNode::Snap(..) => Ttl::Immutable,
            };
            return self.vattr(v, ttl);
        }
        let _ns = self.namespace.read();
        // Looked up before the stat (see `finish_stat`).
        let of = self.open_file(ino);
        let st = match self.loc(ino) {
            Ok(loc) => loc.lstat()?,
            Err(e) => {
                // A removed directory still open somewhere: as it was.
                if let Some(st) = self.tree.lock().gone(ino) {
                    return Ok(Entry {
                        ino,
                        stat: self.finish_stat(ino, None, st),
                        ttl: Ttl::Live,
                    });
                }
                // Unlinked but open: the open file still has attributes.
                let Some(of) = of.as_ref() else {
                    // Replaced or removed just after the kernel resolved a
                    // path to it: as it is now, as on ext4.
                    if let Some(f) = self.stale.lock().get(&ino) {
                        let mut st = sys::fstat(f)?;
                        st.st_ino = ino;
                        return Ok(Entry {
                            ino,
                            stat: st,
                            ttl: Ttl::Live,
                        });
                    }
                    return Err(e);
                };
                let s = of.state.lock();
                let mut st = sys::fstat(&*s.live)?;
                st.st_nlink = 0;
                st
            }
        };
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, of.as_deref(), st),
            ttl: Ttl::Live,
        })
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        if let Some(v) = decode(ino) {
            return self.vreadlink(v);
        }
        let _ns = self.namespace.read();
        let loc = self.loc(ino)?;
        Ok(sys::readlinkat(loc.dirfd, &loc.phys)?)
    }

    pub fn statfs(&self) -> FsResult<libc::statvfs> {
        Ok(sys::fstatvfs(&self.root_fd)?)
    }

    // ------------------------------------------------------------ setattr

    pub fn setattr(&self, ino: Ino, attr: SetAttr, caller: &Caller) -> FsResult<Entry> {
        self.retry_after_store(Some(ino), || self.setattr_once(ino, attr, caller))
    }

    fn setattr_once(&self, ino: Ino, attr: SetAttr, caller: &Caller) -> FsResult<Entry> {
        if is_virtual(ino) {
            return Err(FsError::EROFS);
        }
        let _ns = self.namespace.read();
        let loc = self.loc(ino);
        let of = self.open_file(ino);
        if let Some(size) = attr.size {
            self.truncate(ino, loc.as_ref().ok(), size, attr.via_handle, caller)?;
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
        if meta_change && let Ok(l) = &loc {
            self.split_if_linked(ino, l)?;
        }
        if meta_change {
            // As it was, to put back if the change cannot be journaled.
            let before = match &loc {
                Ok(l) if self.versioned(l).is_some() => Some(l.lstat()?),
                _ => None,
            };
            match &loc {
                Ok(l) => apply_meta_at(l, &attr)?,
                Err(e) => {
                    // Unlinked but open: change the open file itself, or,
                    // if another name (a hard link made while unmounted)
                    // still points at it, a private copy of it.
                    let of = of.as_ref().ok_or(*e)?;
                    let mut s = of.state.lock();
                    if sys::fstat(&*s.live).is_ok_and(|st| st.st_nlink > 0) {
                        let copy = self.private_copy(&s.live)?;
                        s.live = Arc::new(copy);
                    }
                    apply_meta_fd(&s.live, &attr)?;
                }
            }
            // The staged copy carries the same metadata, so publishing it
            // does not undo this change.
            if let Some(stg) = &staged {
                apply_meta_fd(stg, &attr)?;
            }
            // FIFOs and sockets are never versioned.
            let special = before.as_ref().is_some_and(|st| special_of(st) != 0);
            if let Ok(l) = &loc
                && let Some(p) = &self.versioned(l)
                && !special
            {
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
                // A change that cannot be journaled is not made: put back
                // what it changed and answer the error.
                let recorded = self.state_of(l, p).and_then(|state| {
                    let change = Change::new(op, p.clone(), Some(state));
                    Ok(self.ledger.lock().record(change, caller.actor())?)
                });
                if let Err(e) = recorded {
                    tracing::warn!("could not journal {} of {p}: {e:?}; undone", op.name());
                    if let Some(old) = &before {
                        let undo = undo_of(&attr, old);
                        let undone = apply_meta_at(l, &undo);
                        if let Some(stg) = &staged {
                            let _ = apply_meta_fd(stg, &undo);
                        }
                        if let Err(u) = undone {
                            tracing::error!("could not undo the {} of {p}: {u:?}", op.name());
                        }
                    }
                    return Err(e);
                }
            }
        }
        drop(_ns);
        self.getattr(ino)
    }

    /// A regular file with another hard link (made while unmounted) gets an
    /// inode of its own before its mode, owner or times change: a change
    /// through the mount never reaches the other name (as a write does, see
    /// `recycle_inode`). The live content is copied, with its mode, owner
    /// and times, and swapped in; a writer's staged bytes are left alone
    /// (they publish at its own close). The content is unchanged, so
    /// nothing is recorded. Called under the namespace lock.
    fn split_if_linked(&self, ino: Ino, loc: &Location) -> FsResult<()> {
        let st = loc.lstat()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink <= 1 {
            return Ok(());
        }
        let of = self.open_live(ino, Ok(loc))?;
        let result = (|| {
            let mut s = self.lock_to_change(ino, &of)?;
            let (path, copy) = self.copy_of(&s.live)?;
            let from = path.as_os_str().as_encoded_bytes();
            let swapped = sys::renameat2(
                libc::AT_FDCWD,
                from,
                loc.dirfd,
                &loc.phys,
                libc::RENAME_EXCHANGE,
            );
            if let Err(e) = swapped {
                let _ = std::fs::remove_file(&path);
                return Err(e.into());
            }
            let old = std::mem::replace(&mut s.live, Arc::new(copy));
            self.swaps.fetch_add(1, Ordering::SeqCst);
            // Another name has it: removed, never reused (`recycle_inode`).
            self.recycle(old, path);
            Ok(())
        })();
        self.release_open(ino, false);
        result
    }

    /// A copy of `live` in a spare (bytes, mode, owner and times: not a
    /// write, so G7 keeps its times), at the path returned.
    fn copy_of(&self, live: &File) -> FsResult<(PathBuf, File)> {
        let st = sys::fstat(live)?;
        let (path, copy) = self.spares.take()?;
        let made = (|| {
            copy_range(live, &copy, st.st_size as u64)?;
            if self.chown_new {
                sys::fchown(&copy, st.st_uid, st.st_gid)?;
            }
            sys::fchmod(&copy, st.st_mode & 0o7777)?;
            sys::futimens(
                &copy,
                Time::At(st.st_atime, st.st_atime_nsec),
                Time::At(st.st_mtime, st.st_mtime_nsec),
            )
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_file(&path);
            return Err(e.into());
        }
        Ok((path, copy))
    }

    /// An unnamed copy of `live`, for an open file whose inode another name
    /// still points at.
    fn private_copy(&self, live: &File) -> FsResult<File> {
        let (path, copy) = self.copy_of(live)?;
        let _ = std::fs::remove_file(&path);
        Ok(copy)
    }

    /// A size change. By path (`truncate(2)`) it is a change of its own and
    /// is published at once, whoever else has the file open (a handle closed
    /// a moment ago may not be released yet); through a write handle it is
    /// part of that writer's staged content.
    fn truncate(
        &self,
        ino: Ino,
        loc: Option<&Location>,
        size: u64,
        via_handle: bool,
        caller: &Caller,
    ) -> FsResult<()> {
        // A handle's share of the open state, held for the whole change:
        // without it the last reader's release could drop the state midway
        // and a new open start another one on the file about to be replaced.
        let of = match loc {
            Some(l) => self.open_live(ino, Ok(l))?,
            None => {
                // Unlinked: reachable only through an open handle. Joined
                // under the map's lock, so a release cannot drop it between.
                let files = self.open_files.lock();
                let of = files.get(&ino).cloned().ok_or(FsError::ESTALE)?;
                of.state.lock().handles += 1;
                of
            }
        };
        let result = (|| {
            let mut s = self.lock_to_change(ino, &of)?;
            // The content just before the truncation is kept.
            if s.staging.as_ref().is_some_and(|stg| stg.dirty)
                && let Some(l) = loc
            {
                self.publish_locked(&mut s, l, Op::Write, false, caller)?;
            }
            self.ensure_staging(&mut s, size == 0, loc.is_some_and(|l| l.is_hidden()))?;
            let stg = s.staging.as_mut().expect("just ensured");
            sys::ftruncate(&*stg.file, size)?;
            stg.mark_written();
            if (s.writers == 0 || !via_handle)
                && let Some(l) = loc
            {
                self.publish_locked(&mut s, l, Op::Truncate, false, caller)?;
            }
            Ok(())
        })();
        self.release_open(ino, false);
        result
    }

    // ------------------------------------------------------------ namespace

    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> FsResult<Entry> {
        self.make(parent, name, Kind::Dir, None, caller, |loc| {
            self.new_dir_at(loc, mode & 0o7777)
        })
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: &Caller,
    ) -> FsResult<Entry> {
        self.make(parent, name, Kind::Symlink, Some(target), caller, |loc| {
            sys::symlinkat(target, loc.dirfd, &loc.phys)
        })
    }

    /// Creates a new directory, symlink, or (`kind` `File`) FIFO or socket
    /// `name` in `parent` where the hide rules place it, and journals it
    /// when it is versioned (never a FIFO or socket).
    fn make(
        &self,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        target: Option<&[u8]>,
        caller: &Caller,
        create: impl FnOnce(&Location) -> std::io::Result<()>,
    ) -> FsResult<Entry> {
        self.check_writable(parent, name, true)?;
        self.journal_room()?;
        check_name(name)?;
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        let (loc, attached) = self.place(parent, &ploc, name, kind)?;
        if self
            .in_other_place(parent, &ploc, name, attached)?
            .is_some()
        {
            return Err(FsError::EEXIST);
        }
        create(&loc)?;
        self.give_to_caller(&loc, caller);
        let st = loc.lstat().inspect_err(|_| {
            // Made, but answered as failed: the kernel's negative entry for
            // the name (see `absence_is_cacheable`) must go.
            self.invalidate_entry(parent, name.to_vec());
        })?;
        let ino = self.tree.lock().link(parent, name, kind, attached);
        // `File` here is a FIFO or socket from `mknod`: not versioned.
        if kind != Kind::File
            && let Some(p) = &self.versioned(&loc)
        {
            let mut state = state_from_stat(&st, kind);
            state.target = target.map(|t| ByteString(t.to_vec()));
            let op = if kind == Kind::Dir {
                Op::Mkdir
            } else {
                Op::Symlink
            };
            self.record(Change::new(op, p.clone(), Some(state)), caller);
        }
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, None, st), // a directory or symlink
            ttl: Ttl::Live,
        })
    }

    pub fn unlink(&self, parent: Ino, name: &[u8], caller: &Caller) -> FsResult<()> {
        self.remove(parent, name, false, caller)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8], caller: &Caller) -> FsResult<()> {
        self.remove(parent, name, true, caller)
    }

    fn remove(&self, parent: Ino, name: &[u8], dir: bool, caller: &Caller) -> FsResult<()> {
        self.check_writable(parent, name, false)?;
        // Not refused for want of journal room: removing files is how a
        // full disk is freed. Its record takes what room is left (the
        // reserve of `ensure_room`), and past that the next mount's scan
        // records the removal.
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        let f = self.find(parent, &ploc, name)?;
        let is_dir = f.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if dir && is_dir && f.loc.is_hidden() {
            // Inside a hidden tree the listing shows attached children too:
            // a directory that lists entries is not empty.
            let key = sys::dir_key(f.loc.dirfd, &f.loc.phys)?;
            if sys::read_dir_at(self.parked_raw(), key.as_bytes()).is_ok_and(|v| !v.is_empty()) {
                return Err(FsError::ENOTEMPTY);
            }
        }
        if !is_dir {
            self.publish_dirty_under(&f.loc, caller)?;
        }
        // A directory whose only children are hidden is empty underneath
        // (they are attached, elsewhere): it is removed and they become
        // orphans. Its key is taken before it is gone.
        let key = if dir && is_dir {
            Some(sys::dir_key(f.loc.dirfd, &f.loc.phys)?)
        } else {
            None
        };
        let last_ref = (!is_dir)
            .then(|| self.hold_name(parent, name, &f.loc))
            .flatten();
        sys::unlinkat(f.loc.dirfd, &f.loc.phys, dir)?;
        self.keep_stale(parent, name, last_ref);
        {
            let mut tree = self.tree.lock();
            if is_dir {
                tree.keep_gone(parent, name, f.st);
            }
            tree.detach(parent, name);
        }
        if let Some(p) = &self.versioned(&f.loc)
            && special_of(&f.st) == 0
        {
            let op = if dir { Op::Rmdir } else { Op::Unlink };
            self.record(Change::new(op, p.clone(), None), caller);
        }
        if let Some(key) = key {
            self.orphan_attached(&key, &f.loc.logical, caller);
        }
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
        self.check_writable(parent, name, false)?;
        self.check_writable(newparent, newname, false)?;
        self.journal_room()?;
        check_name(newname)?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(FsError::EINVAL);
        }
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let mut prehashed = if exchange {
            Prehashed::new()
        } else {
            self.prehash(parent, name, newparent, newname)
        };
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        let nploc = self.loc(newparent)?;
        let src = self.find(parent, &ploc, name)?;
        let kind = node_kind(&src.st).ok_or(FsError::EPERM)?;
        let src_special = special_of(&src.st) != 0;
        if parent == newparent && name == newname {
            return Ok(());
        }
        // A non-directory in the other place that this rename replaces.
        let mut replaced_other = None;
        let (dst, dst_att) = if exchange {
            // Each entry takes the other's place; see `settle_exchanged`.
            let d = self.find(newparent, &nploc, newname)?;
            (d.loc, d.attached)
        } else {
            let (d, att) = self.place(newparent, &nploc, newname, kind)?;
            if let Some(other) = self.in_other_place(newparent, &nploc, newname, att)? {
                // The target name exists in the other place: only possible
                // for entries of different kinds (a rule that names one
                // kind, or a rule that changed).
                if flags & libc::RENAME_NOREPLACE != 0 {
                    return Err(FsError::EEXIST);
                }
                let other_dir = other.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
                match (kind == Kind::Dir, other_dir) {
                    (true, false) => return Err(FsError::ENOTDIR),
                    (false, true) => return Err(FsError::EISDIR),
                    (true, true) => return Err(FsError::EEXIST),
                    // A non-directory replaces a non-directory, as ext4
                    // would: removed once the rename is made (two steps,
                    // not one; a failed rename leaves it as it was).
                    (false, false) => {
                        self.publish_dirty_under(&other.loc, caller)?;
                        replaced_other = Some(other);
                    }
                }
            }
            (d, att)
        };
        // Staged bytes of what is replaced, or leaves the versioned tree,
        // are published first.
        let dst_st = dst.lstat().ok();
        if dst_st.is_some() {
            self.publish_dirty_under(&dst, caller)?;
        }
        if exchange || dst.is_hidden() {
            self.publish_dirty_under(&src.loc, caller)?;
        }
        // A directory replaced by this rename takes its hidden children's
        // attachment with it: they become orphans.
        let dst_is_dir = dst_st.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
        let replaced_key = if !exchange && dst_is_dir {
            sys::dir_key(dst.dirfd, &dst.phys).ok()
        } else {
            None
        };
        let last_ref = (!exchange && dst_st.is_some() && !dst_is_dir)
            .then(|| self.hold_name(newparent, newname, &dst))
            .flatten();
        sys::renameat2(src.loc.dirfd, &src.loc.phys, dst.dirfd, &dst.phys, flags)?;
        self.keep_stale(newparent, newname, last_ref);
        if let Some(other) = &replaced_other {
            self.remove_other(other, caller);
        }
        // Where each entry ends up: the source's at the new name, the
        // target's (exchanged) at the old one; moved only after an exchange.
        let b_kind = dst_st.as_ref().and_then(kind_of);
        let (a_moved, b_moved) = match b_kind {
            Some(b_kind) if exchange => (
                self.settle_exchanged(&dst, dst_att, newparent, &nploc, newname, kind),
                self.settle_exchanged(&src.loc, src.attached, parent, &ploc, name, b_kind),
            ),
            _ => (None, None),
        };
        let (a_at, a_att) = a_moved.as_ref().map_or((&dst, dst_att), |(l, a)| (l, *a));
        let (b_at, b_att) = b_moved
            .as_ref()
            .map_or((&src.loc, src.attached), |(l, a)| (l, *a));
        {
            let mut tree = self.tree.lock();
            if exchange {
                tree.exchange(parent, name, newparent, newname, b_att, a_att);
            } else {
                if let Some(st) = dst_st.filter(|_| dst_is_dir) {
                    tree.keep_gone(newparent, newname, st);
                }
                tree.move_entry(parent, name, newparent, newname, dst_att);
            }
        }
        if let Some(key) = replaced_key {
            self.orphan_attached(&key, &dst.logical, caller);
        }
        // A directory that moved between the hidden and the visible tree
        // lists differently (whole while hidden, filtered while visible);
        // nothing in it changed, so the kernel would keep the old listing.
        let crossed = src.loc.is_hidden() != a_at.is_hidden()
            || (exchange && dst.is_hidden() != b_at.is_hidden());
        if crossed {
            let moved: Vec<Ino> = {
                let tree = self.tree.lock();
                let mut v = Vec::new();
                for (p, n) in [(newparent, newname), (parent, name)] {
                    if let Some(i) = tree.child(p, n) {
                        v.extend(tree.subtree(i));
                    }
                }
                v
            };
            for i in moved {
                self.invalidate(i);
            }
            // A directory lists differently now: the reply must not let a
            // listing read overtake the notice.
            if kind == Kind::Dir || (exchange && b_kind == Some(Kind::Dir)) {
                self.invalidations_delivered();
            }
        }
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        // FIFOs and sockets are never versioned: a move of one journals
        // only what it replaced (a versioned file, now gone).
        let dst_special = dst_st.as_ref().is_some_and(|st| special_of(st) != 0);
        if src_special || (exchange && dst_special) {
            if exchange {
                if !src_special {
                    self.journal_move(&src.loc, a_at, false, &mut prehashed, caller);
                }
                if !dst_special {
                    self.journal_move(&dst, b_at, false, &mut prehashed, caller);
                }
            } else if dst_st.is_some()
                && !dst_special
                && let Some(p) = self.versioned(&dst)
            {
                self.record(Change::new(Op::Unlink, p, None), caller);
            }
        } else if exchange {
            let moves = [(&src.loc, a_at), (&dst, b_at)];
            let versioned = |(from, to): &(&Location, &Location)| {
                (self.versioned(from).is_some(), self.versioned(to).is_some())
            };
            if let (Some(a), Some(b), [(true, true), (true, true)]) = (
                self.versioned(&src.loc),
                self.versioned(&dst),
                moves.map(|m| versioned(&m)),
            ) {
                let mut c = Change::new(Op::Exchange, a, None);
                c.to = Some(b);
                self.record(c, caller);
            } else {
                // What left the visible tree is journaled first, what
                // entered it last, so no path is claimed twice.
                let mut moves = moves;
                moves.sort_by_key(|m| match versioned(m) {
                    (_, false) => 0,
                    (true, true) => 1,
                    (false, true) => 2,
                });
                for (from, to) in moves {
                    self.journal_move(from, to, false, &mut prehashed, caller);
                }
            }
        } else {
            self.journal_move(&src.loc, &dst, noreplace, &mut prehashed, caller);
        }
        Ok(())
    }

    /// Removes `other`, a non-directory in the other place that a rename
    /// just made replaced (see `rename`), as an unlink would, journaled
    /// before the rename's own record. A failure is logged: the rename is
    /// made, and the next mount settles the name.
    fn remove_other(&self, other: &Found, caller: &Caller) {
        let last_ref = self.hold(&other.loc);
        if let Err(e) = sys::unlinkat(other.loc.dirfd, &other.loc.phys, false) {
            tracing::error!(
                "could not remove {} replaced by a rename: {e}",
                other.loc.logical
            );
            return;
        }
        self.free_later(last_ref);
        if let Some(p) = self.versioned(&other.loc) {
            self.record(Change::new(Op::Unlink, p, None), caller);
        }
    }

    /// After an exchange an entry of `kind` now called `name` in `parent`
    /// sits at `at`, the other entry's place. A rule that names one kind
    /// (`.*.tmp:file`) can make that the wrong place for this one (hidden
    /// where it should be listed, or the reverse): then it is moved to its
    /// own, which is free (the name was only in the other), and where it
    /// went is returned. A move that fails is logged and left to the next
    /// mount, which places every entry by the rules again.
    fn settle_exchanged(
        &self,
        at: &Location,
        attached: bool,
        parent: Ino,
        ploc: &Location,
        name: &[u8],
        kind: Kind,
    ) -> Option<(Location, bool)> {
        let (want, want_att) = match self.place(parent, ploc, name, kind) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("could not place {} after an exchange: {e:?}", at.logical);
                return None;
            }
        };
        if want_att == attached {
            return None;
        }
        let moved = sys::renameat2(
            at.dirfd,
            &at.phys,
            want.dirfd,
            &want.phys,
            libc::RENAME_NOREPLACE,
        );
        match moved {
            Ok(()) => Some((want, want_att)),
            Err(e) => {
                tracing::error!(
                    "could not move {} to its place after an exchange: {e}",
                    at.logical
                );
                None
            }
        }
    }

    /// Journals one entry moving from `from` to `to` (its new location),
    /// by versioning: a rename, a park, an unpark, or nothing. The move is
    /// made; a failure to journal it is logged and left to the next scan.
    fn journal_move(
        &self,
        from: &Location,
        to: &Location,
        noreplace: bool,
        prehashed: &mut Prehashed,
        caller: &Caller,
    ) {
        match (self.versioned(from), self.versioned(to)) {
            (Some(a), Some(b)) => {
                let mut c = Change::new(Op::Rename, a, None);
                c.to = Some(b);
                c.noreplace = noreplace;
                self.record(c, caller);
            }
            (Some(a), None) => {
                let mut c = Change::new(Op::Park, a, None);
                c.hidden = Some(to.logical.clone());
                self.record(c, caller);
            }
            (None, Some(b)) => {
                if let Err(e) = self.unpark(&b, &from.logical, std::mem::take(prehashed), caller) {
                    tracing::error!("could not settle {b} after it became visible: {e:?}");
                }
            }
            (None, None) => {}
        }
    }

    /// Before a rename takes the namespace lock: if it is about to make a
    /// hidden directory visible (an unpark), the content of the files in
    /// it is stored now, with no lock held, so that the settle under the
    /// lock (`unpark`) reads only their metadata. A file changed since is
    /// read again there (see `scan::Prehashed`); a name the rules hide in
    /// it is left out (it stays hidden).
    fn prehash(&self, parent: Ino, name: &[u8], newparent: Ino, newname: &[u8]) -> Prehashed {
        let mut prehashed = Prehashed::new();
        let dir = {
            let _ns = self.namespace.read();
            let (Ok(ploc), Ok(nploc)) = (self.loc(parent), self.loc(newparent)) else {
                return prehashed;
            };
            let Ok(src) = self.find(parent, &ploc, name) else {
                return prehashed;
            };
            let Some(to_dir) = nploc.visible.clone() else {
                return prehashed;
            };
            if kind_of(&src.st) != Some(Kind::Dir)
                || self.versioned(&src.loc).is_some()
                || self.rules.is_untracked(&to_dir.join(newname))
            {
                return prehashed;
            }
            let mut in_pkg = || self.inside_skill(Some(to_dir.clone()));
            if self
                .rules
                .is_hidden(newname, Kind::Dir, to_dir.is_root(), &mut in_pkg)
            {
                return prehashed;
            }
            // Walked through its descriptor: no name of it needs the lock.
            match sys::open_dir(src.loc.dirfd, &src.loc.phys) {
                Ok(fd) => fd,
                Err(_) => return prehashed,
            }
        };
        let dir_fd = dir.as_raw_fd();
        // A write within the clock's tick of the read keeps the times.
        const TICK_NS: i128 = 20_000_000;
        let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
        while let Some(rel) = stack.pop() {
            let Ok(names) = sys::read_dir_at(dir_fd, if rel.is_empty() { b"." } else { &rel })
            else {
                continue;
            };
            for n in names {
                let mut child = rel.clone();
                if !child.is_empty() {
                    child.push(b'/');
                }
                child.extend_from_slice(&n.name);
                let Ok(st) = sys::lstatat(dir_fd, &child) else {
                    continue;
                };
                let Some(kind) = kind_of(&st) else { continue };
                // Left hidden by the settle: not stored (it is no version).
                if self.rules.is_hidden(&n.name, kind, false, &mut || false)
                    || self.rules.is_hidden(&n.name, kind, false, &mut || true)
                {
                    continue;
                }
                match kind {
                    Kind::Dir => stack.push(child),
                    Kind::File => {
                        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                        if let Ok(f) = sys::openat(dir_fd, &child, flags, 0)
                            && let Err(e) = prehashed.add(&f, &self.blobs, TICK_NS)
                        {
                            tracing::debug!("prehash: {e}");
                        }
                    }
                    Kind::Symlink => {}
                }
            }
        }
        prehashed
    }

    /// A hidden (or untracked) entry became versioned at `path`: settle its
    /// subtree (hide what the rules hide inside it, record the rest).
    fn unpark(
        &self,
        path: &RelPath,
        hidden: &RelPath,
        prehashed: Prehashed,
        caller: &Caller,
    ) -> FsResult<()> {
        let in_pkg = self.inside_skill(path.parent());
        let mut ledger = self.ledger.lock();
        let mut settler = Settler::new(
            self.areas(),
            &self.rules,
            &mut ledger,
            &self.blobs,
            caller.actor(),
        );
        settler.prehashed = prehashed;
        let result = settler.settle(path, Op::Unpark, true, in_pkg, Some(hidden.clone()));
        self.parks.lock().clear(); // the settler may have made or removed parks
        let moved = std::mem::take(&mut settler.moved_to_hidden);
        drop(ledger);
        if !moved.is_empty() {
            let mut dirs = Vec::new();
            {
                let mut tree = self.tree.lock();
                for p in &moved {
                    if let Some(ino) = tree.find(p) {
                        tree.set_attached(ino, true);
                    }
                    if let Some(d) = p.parent().and_then(|d| tree.find(&d)) {
                        dirs.push(d);
                    }
                }
            }
            // Their directories' listings changed behind the kernel's back.
            dirs.dedup();
            for d in dirs {
                self.invalidate(d);
            }
            self.invalidations_delivered();
        }
        Ok(result?)
    }

    // ------------------------------------------------------------ files

    /// Opens the live file of `ino` and registers (or joins) its open state.
    /// `at`: where the file is, or, for one the tree no longer has, why not
    /// (from `loc`): then the file is the one `keep_stale` kept, which the
    /// kernel resolved a path to just before it was replaced or removed.
    fn open_live(&self, ino: Ino, at: Result<&Location, FsError>) -> FsResult<Arc<OpenFile>> {
        let mut files = self.open_files.lock();
        if let Some(of) = files.get(&ino) {
            of.state.lock().handles += 1;
            return Ok(Arc::clone(of));
        }
        let live = match at {
            Ok(loc) => {
                let f = sys::openat(loc.dirfd, &loc.phys, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
                self.note_if_shared(&f, 1);
                f
            }
            Err(err) => {
                let stale = self.stale.lock();
                let kept = stale.get(&ino).ok_or(err)?;
                let again = format!("/proc/self/fd/{}", kept.as_raw_fd());
                File::open(again).map_err(|_| err)?
            }
        };
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
            if let Some(stg) = s.staging.take()
                && !stg.in_place
            {
                let _ = std::fs::remove_file(&stg.path);
            }
            drop(s);
            files.remove(&ino);
        }
    }

    /// Gives the open file a staging copy if it has none (`empty`: start
    /// from nothing, as `O_TRUNC` does, instead of copying the live bytes).
    /// A `hidden` file is written in place instead.
    fn ensure_staging(&self, s: &mut OpenState, empty: bool, hidden: bool) -> FsResult<()> {
        if let Some(stg) = &mut s.staging {
            if empty {
                sys::ftruncate(&*stg.file, 0)?;
                stg.mark_written();
            }
            return Ok(());
        }
        // A hidden file with another hard link (made while unmounted) is
        // copied like a visible one: writing in place would change the
        // other name's bytes too.
        if hidden && sys::fstat(&*s.live).is_ok_and(|st| st.st_nlink <= 1) {
            // The live file again, for writing (through /proc: the daemon
            // holds it by descriptor, not by a name it may have lost). Where
            // that is refused, the copy below serves as for any file.
            let again = format!("/proc/self/fd/{}", s.live.as_raw_fd());
            if let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(again)
            {
                if empty {
                    sys::ftruncate(&file, 0)?;
                }
                s.staging = Some(Staging {
                    file: Arc::new(file),
                    path: PathBuf::new(),
                    dirty: empty,
                    trunc_only: false,
                    in_place: true,
                    edits: 0,
                });
                return Ok(());
            }
        }
        let (path, file) = self.spares.take()?;
        let result = (|| {
            // Made or emptied a while ago: an O_TRUNC open is a change now.
            sys::futimens(&file, Time::Now, Time::Now)?;
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
            trunc_only: false,
            in_place: false,
            edits: 0,
        });
        Ok(())
    }

    fn new_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, h);
        fh
    }

    pub fn open(&self, ino: Ino, flags: i32, caller: &Caller) -> FsResult<OpenReply> {
        if let Some(v) = decode(ino) {
            return self.vopen(v, flags);
        }
        self.retry_after_store(Some(ino), || {
            let _ns = self.namespace.read();
            match self.loc(ino) {
                Ok(loc) => {
                    let of = self.open_live(ino, Ok(&loc))?;
                    self.finish_open(ino, Some(&loc), of, flags, caller)
                }
                Err(e) => {
                    // What a writer puts in it is lost, as on ext4: it
                    // is no longer any file's content.
                    let of = self.open_live(ino, Err(e))?;
                    self.finish_open(ino, None, of, flags, caller)
                }
            }
        })
    }

    /// `loc`: where the file is, `None` for one already replaced or removed.
    fn finish_open(
        &self,
        ino: Ino,
        loc: Option<&Location>,
        of: Arc<OpenFile>,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<OpenReply> {
        // `O_RDONLY | O_TRUNC` truncates too (with FUSE_ATOMIC_O_TRUNC the
        // kernel counts on the open to have done it).
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if write {
            let mut s = match self.lock_to_change(ino, &of) {
                Ok(s) => s,
                Err(e) => {
                    self.release_open(ino, false);
                    return Err(e);
                }
            };
            s.writers += 1;
            if flags & libc::O_TRUNC != 0 {
                // Another writer's staged bytes were visible: keep them, or
                // refuse the truncating open.
                if s.staging.as_ref().is_some_and(|stg| stg.dirty)
                    && let Some(loc) = loc
                    && let Err(e) = self.publish_locked(&mut s, loc, Op::Write, false, caller)
                {
                    tracing::warn!("could not publish {} before O_TRUNC: {e:?}", loc.logical);
                    drop(s);
                    self.release_open(ino, true);
                    return Err(e);
                }
                let hidden = loc.is_some_and(|l| l.is_hidden());
                if let Err(e) = self.ensure_staging(&mut s, true, hidden) {
                    drop(s);
                    self.release_open(ino, true);
                    return Err(e);
                }
                let stg = s.staging.as_mut().expect("just ensured");
                stg.mark_written();
                stg.trunc_only = true;
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
            immutable: false,
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
        // The inode is not known before the lookup: wait for any store.
        self.retry_after_store(None, || self.create_once(parent, name, mode, flags, caller))
            .inspect_err(|_| {
                // It may have failed after the file was made (no spare
                // left, say): the kernel's negative entry for the name (see
                // `absence_is_cacheable`) must go.
                self.invalidate_entry(parent, name.to_vec());
            })
    }

    fn create_once(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Entry, OpenReply)> {
        self.check_writable(parent, name, true)?;
        check_name(name)?;
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        let (loc, attached, created) = match self.find(parent, &ploc, name) {
            Ok(_) if flags & libc::O_EXCL != 0 => return Err(FsError::EEXIST),
            Ok(f) => (f.loc, f.attached, false),
            Err(FsError::ENOENT) => {
                self.journal_room()?;
                let (loc, attached) = self.place(parent, &ploc, name, Kind::File)?;
                self.new_file_at(&loc, mode & 0o7777, caller)?;
                (loc, attached, true)
            }
            Err(e) => return Err(e),
        };
        let st = loc.lstat()?;
        let kind = kind_of(&st).ok_or(FsError::EPERM)?;
        if kind == Kind::Dir {
            return Err(FsError::EISDIR);
        }
        let ino = self.tree.lock().link(parent, name, kind, attached);
        if created && let Some(p) = &self.versioned(&loc) {
            match self.blobs.put_bytes(b"", false) {
                Ok(blob) => self.record(
                    Change::new(Op::Create, p.clone(), Some(empty_blob_state(&st, blob))),
                    caller,
                ),
                Err(e) => tracing::error!("could not journal the creation of {p}: {e}"),
            }
        }
        let of = match self.open_live(ino, Ok(&loc)) {
            Ok(of) => of,
            Err(e) => {
                self.tree.lock().forget(ino, 1);
                return Err(e);
            }
        };
        let reply = match self.finish_open(ino, Some(&loc), of, flags, caller) {
            Ok(r) => r,
            Err(e) => {
                self.tree.lock().forget(ino, 1);
                return Err(e);
            }
        };
        Ok((
            Entry {
                ino,
                stat: self.finish_stat(ino, self.open_file(ino).as_deref(), st),
                ttl: Ttl::Live,
            },
            reply,
        ))
    }

    /// `mknod` of a regular file is a create without an open handle. A
    /// FIFO or a socket (a skill's helper binding a unix socket in its
    /// folder) is made in place, like any scratch file, and never
    /// versioned; device nodes are not kept in a skills tree.
    pub fn mknod(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> FsResult<Entry> {
        self.check_writable(parent, name, true)?;
        match mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFIFO | libc::S_IFSOCK => {
                return self.make(parent, name, Kind::File, None, caller, |loc| {
                    sys::mknodat(loc.dirfd, &loc.phys, mode & (libc::S_IFMT | 0o7777))
                });
            }
            _ => return Err(FsError::EPERM),
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
        let blob = match self.handles.lock().get(&fh) {
            Some(Handle::Blob { file }) => Some(Arc::clone(file)),
            _ => None,
        };
        let mut buf = vec![0u8; size as usize];
        let got = match blob {
            Some(b) => read_full(|buf, off| b.read_at(buf, off), &mut buf, offset)?,
            None => {
                let (ino, _, _) = self.file_handle(fh)?;
                let of = self.open_file(ino).ok_or(FsError::EBADF)?;
                let file = {
                    let s = of.state.lock();
                    match &s.staging {
                        Some(stg) => Arc::clone(&stg.file),
                        None => Arc::clone(&s.live),
                    }
                };
                read_full(|buf, off| file.read_at(buf, off), &mut buf, offset)?
            }
        };
        buf.truncate(got);
        Ok(buf)
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let (ino, write, append) = self.file_handle(fh)?;
        if !write {
            return Err(FsError::EBADF);
        }
        let of = self.open_file(ino).ok_or(FsError::EBADF)?;
        // Only a writer without staging yet needs to know where the file is:
        // resolved before the open state is locked (lock order), under the
        // namespace lock held until the staging exists, so that a rename
        // cannot make it visible in between.
        let needs_place = of.state.lock().staging.is_none();
        let _ns = needs_place.then(|| self.namespace.read());
        let hidden = needs_place && self.loc(ino).is_ok_and(|l| l.is_hidden());
        let mut s = of.state.lock();
        self.ensure_staging(&mut s, false, hidden)?;
        let stg = s.staging.as_mut().expect("just ensured");
        let offset = if append {
            sys::fstat(&*stg.file)?.st_size as u64
        } else {
            offset
        };
        stg.file.write_all_at(data, offset)?;
        stg.mark_written();
        Ok(data.len() as u32)
    }

    /// Publishes a writer's staged bytes as a version (not yet durable).
    ///
    /// Not a file only emptied by its `O_TRUNC` open: a shell's `echo x >
    /// f` opens with `O_TRUNC`, `dup2`s and closes the first descriptor (a
    /// flush) before it writes, and that empty moment is no version. It is
    /// published by the next flush after a write, or at the last release.
    pub fn flush(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        if matches!(self.handles.lock().get(&fh), Some(Handle::Blob { .. })) {
            return Ok(());
        }
        let (ino, write, _) = self.file_handle(fh)?;
        if write {
            let trunc_only = self.open_file(ino).is_some_and(|of| {
                of.state
                    .lock()
                    .staging
                    .as_ref()
                    .is_some_and(|stg| stg.trunc_only)
            });
            if !trunc_only {
                self.publish(ino, false, caller)?;
            }
        }
        Ok(())
    }

    pub fn fsync(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        if matches!(self.handles.lock().get(&fh), Some(Handle::Blob { .. })) {
            return Ok(());
        }
        let (ino, _, _) = self.file_handle(fh)?;
        self.publish(ino, true, caller)
    }

    pub fn release(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        let h = self.handles.lock().remove(&fh);
        let (ino, write) = match h {
            Some(Handle::File { ino, write, .. }) => (ino, write),
            Some(Handle::Blob { .. }) => return Ok(()),
            _ => return Err(FsError::EBADF),
        };
        let mut result = Ok(());
        if write && let Some(of) = self.open_file(ino) {
            // Usually the close's flush published everything already: only
            // a last writer with staged bytes needs the location.
            let pending = {
                let mut s = of.state.lock();
                s.writers = s.writers.saturating_sub(1);
                let pending = s.writers == 0 && s.staging.as_ref().is_some_and(|stg| stg.dirty);
                if !pending {
                    self.offer_pages(ino, &s);
                }
                pending
            };
            if pending {
                let _ns = self.namespace.read();
                let loc = self.loc(ino).ok();
                let mut s = of.state.lock();
                // Decided again under the lock: a writer may have opened
                // since (it publishes at its own close).
                if s.writers == 0
                    && s.staging.as_ref().is_some_and(|stg| stg.dirty)
                    && let Some(loc) = &loc
                {
                    result = self.publish_locked(&mut s, loc, Op::Write, false, caller);
                    if let Err(e) = &result {
                        tracing::error!("could not publish {} at close: {e:?}", loc.logical);
                        // The close fails, and no writer is left to try
                        // again: the staged bytes are in no version, so
                        // nobody may read them. Back to the live file, and
                        // the kernel forgets the size and pages it cached.
                        if let Some(stg) = s.staging.take()
                            && !stg.in_place
                        {
                            let _ = std::fs::remove_file(&stg.path);
                        }
                        self.invalidate(ino);
                    }
                }
                self.offer_pages(ino, &s);
            }
        }
        self.release_open(ino, false);
        result
    }

    /// Once the last writer is gone and everything is published, the
    /// kernel may keep the file's pages (see `pages`). Called under `s`'s
    /// lock, so no writer can open in between.
    fn offer_pages(&self, ino: Ino, s: &OpenState) {
        if s.writers == 0 && !s.staging.as_ref().is_some_and(|stg| stg.dirty) {
            let file = s.staging.as_ref().map_or(&s.live, |stg| &stg.file);
            self.pages.queue(ino, Arc::clone(file));
        }
    }

    fn publish(&self, ino: Ino, durable: bool, caller: &Caller) -> FsResult<()> {
        if durable {
            return self.publish_durable(ino, caller);
        }
        let _ns = self.namespace.read();
        let Some(of) = self.open_file(ino) else {
            return Ok(());
        };
        let Ok(loc) = self.loc(ino) else {
            return Ok(()); // unlinked while open: nothing left to publish to
        };
        let mut s = of.state.lock();
        if s.staging.as_ref().is_some_and(|stg| stg.dirty) {
            self.publish_locked(&mut s, &loc, Op::Write, false, caller)?;
        }
        Ok(())
    }

    /// `fsync`: publishes the staged bytes and makes them durable, holding
    /// no lock but the group commit's across a device flush (a flush takes
    /// milliseconds, and every create, rename and unlink of the tree would
    /// wait behind it). In four steps:
    /// 1. under the locks: the blob is stored and its record appended;
    /// 2. with none held: blobs, journal and staging file are flushed (or,
    ///    with one commit, written out);
    /// 3. under the locks again: the staging file is swapped in, if it is
    ///    still the file's, unwritten since, and the file still where it
    ///    was;
    /// 4. with none held: the swap is committed.
    ///
    /// If a write, a rename or another publish came between 1 and 3, the
    /// record of step 1 stands (the content it names was the file's, in
    /// the order the journal says) and the publish starts over; after a few
    /// tries it holds the locks throughout, as a file written without pause
    /// would otherwise starve it.
    fn publish_durable(&self, ino: Ino, caller: &Caller) -> FsResult<()> {
        const TRIES: usize = 3;
        for _ in 0..TRIES {
            if self.publish_durable_once(ino, caller)? {
                return Ok(());
            }
        }
        let ns = self.namespace.read();
        let Some(of) = self.open_file(ino) else {
            return Ok(());
        };
        let Ok(loc) = self.loc(ino) else {
            return Ok(());
        };
        let mut s = of.state.lock();
        if s.staging.as_ref().is_some_and(|stg| stg.dirty) {
            return self.publish_locked(&mut s, &loc, Op::Write, true, caller);
        }
        let live = Arc::clone(&s.live);
        let parent = self.parent_to_sync(&loc)?;
        drop((s, ns));
        self.make_durable(&live, parent, &loc)
    }

    /// One try of `publish_durable`: whether it is done.
    fn publish_durable_once(&self, ino: Ino, caller: &Caller) -> FsResult<bool> {
        let ns = self.namespace.read();
        let Some(of) = self.open_file(ino) else {
            return Ok(true);
        };
        let Ok(loc) = self.loc(ino) else {
            return Ok(true); // unlinked while open: nothing left to publish to
        };
        let mut s = of.state.lock();
        let Some(stg) = s.staging.as_ref().filter(|stg| stg.dirty) else {
            // Already published: make it durable in the same order.
            let live = Arc::clone(&s.live);
            let parent = self.parent_to_sync(&loc)?;
            drop((s, ns));
            self.make_durable(&live, parent, &loc)?;
            return Ok(true);
        };
        let stg_file = Arc::clone(&stg.file);
        let path = self.versioned(&loc);
        if stg.in_place {
            // Nothing to swap: recorded (if visible now) and flushed.
            let want = match &path {
                Some(p) => Some(
                    self.store_and_record(&stg_file, p, Op::Write, true, caller)?
                        .1,
                ),
                None => None,
            };
            s.staging = None;
            drop((s, ns));
            if let Some(want) = want {
                self.commit.sync_through(&self.ledger, &self.blobs, want)?;
            }
            live_fsync(&stg_file, &loc)?;
            return Ok(true);
        }
        let edits = stg.edits;
        let (recorded, want) = match &path {
            Some(p) => {
                let (made, want) = self.store_and_record(&stg_file, p, Op::Write, true, caller)?;
                (made.then(|| p.clone()), Some(want))
            }
            None => (None, None),
        };
        drop((s, ns));

        let swapped = std::cell::Cell::new(false);
        let steps = || -> std::io::Result<()> {
            if self.ordered_commit {
                // One fsync (of the staging file, swapped in or not)
                // commits the blob, the journal and the swap together.
                let commit = || {
                    sys::write_out(&*stg_file)?;
                    let done = self.swap_if_unchanged(ino, &of, &stg_file, edits, &loc, false)?;
                    swapped.set(done.is_some());
                    match done {
                        // The rename put the staging file's inode in the
                        // running transaction.
                        Some(_) => live_fsync(&stg_file, &loc),
                        None => self.commit_all(),
                    }
                };
                match want {
                    Some(_) => self
                        .commit
                        .write_out_then(&self.ledger, &self.blobs, commit),
                    None => commit(),
                }
            } else {
                if let Some(want) = want {
                    self.commit.sync_through(&self.ledger, &self.blobs, want)?;
                }
                live_fsync(&stg_file, &loc)?;
                let dir = self.swap_if_unchanged(ino, &of, &stg_file, edits, &loc, true)?;
                swapped.set(dir.is_some());
                match dir.flatten() {
                    Some(dir) => live_fsync(&dir, &loc),
                    None => Ok(()),
                }
            }
        };
        let result = steps();
        if result.is_err()
            && !swapped.get()
            && let Some(path) = recorded
        {
            // Recorded, never swapped in: unless another publish swapped
            // these bytes in meanwhile, the journal names a version the
            // live file never held. Record the live content again.
            let s = of.state.lock();
            if s.staging
                .as_ref()
                .is_some_and(|stg| Arc::ptr_eq(&stg.file, &stg_file))
            {
                self.record_live(&s, &path, caller);
            }
        }
        result?;
        Ok(swapped.get())
    }

    /// Step 3 of `publish_durable`, under the locks: swaps `stg_file` in at
    /// `loc` if it is still the staging file of `ino`, unwritten since
    /// (`edits`), and the file still at `loc`. `None` if not; else, with
    /// `parent`, the directory whose fsync commits the swap.
    fn swap_if_unchanged(
        &self,
        ino: Ino,
        of: &OpenFile,
        stg_file: &Arc<File>,
        edits: u64,
        loc: &Location,
        parent: bool,
    ) -> std::io::Result<Option<Option<File>>> {
        let _ns = self.namespace.read();
        let here = self
            .loc(ino)
            .is_ok_and(|l| l.dirfd == loc.dirfd && l.phys == loc.phys);
        let mut s = of.state.lock();
        let same = s
            .staging
            .as_ref()
            .is_some_and(|stg| Arc::ptr_eq(&stg.file, stg_file) && stg.edits == edits);
        if !(here && same) {
            return Ok(None);
        }
        self.swap_in(&mut s, loc)?;
        if !parent {
            return Ok(Some(None));
        }
        // Swapped: an error from here on is the commit's, not the swap's.
        Ok(Some(open_parent_of(loc).ok()))
    }

    /// Where each step is fsynced in order: the directory of `loc`, whose
    /// fsync commits its entry (opened under the namespace lock, flushed
    /// after it).
    fn parent_to_sync(&self, loc: &Location) -> FsResult<Option<File>> {
        if self.ordered_commit {
            return Ok(None);
        }
        Ok(Some(open_parent_of(loc)?))
    }

    /// Where `ordered_commit` holds, commits every change made so far (data
    /// written out beforehand included): an `fsync` commits the journal
    /// transaction its inode was last changed in, and everything before it,
    /// but nothing after; the fsync of a file last changed a while ago
    /// would leave out what was written out since (the journal's blocks).
    /// Touching the marker puts it in the running transaction.
    fn commit_all(&self) -> std::io::Result<()> {
        sys::futimens(&self.marker, Time::Now, Time::Now)?;
        StoreIo::real().sync_all(&self.marker, &self.dirs.tmp.join("commit"))
    }

    /// Makes the published file `live` durable with everything recorded
    /// before it, in the durability order (see `publish_locked`).
    fn make_durable(&self, live: &File, parent: Option<File>, loc: &Location) -> FsResult<()> {
        if self.ordered_commit {
            self.commit.write_out_then(&self.ledger, &self.blobs, || {
                sys::write_out(live)?;
                self.commit_all()
            })?;
        } else {
            self.sync_records()?;
            live_fsync(live, loc)?;
            if let Some(dir) = parent {
                live_fsync(&dir, loc)?;
            }
        }
        Ok(())
    }

    /// Durability order: blob, journal record, then the live file replaced.
    /// A hidden or untracked file skips the first two: it is not versioned.
    ///
    /// Made durable (fsync) in one of two ways: in general each step is
    /// fsynced before the next (blob, its directory, journal, staging file,
    /// live directory). Where one `fsync` commits every metadata change made
    /// before it (ext4, XFS: `sys::has_ordered_commit`), the data of blob,
    /// journal and staging file is written out in that order, the staging
    /// file renamed over the live one, and a single `fsync` of it commits all
    /// of it at once: one device flush instead of five.
    fn publish_locked(
        &self,
        s: &mut OpenState,
        loc: &Location,
        op: Op,
        durable: bool,
        caller: &Caller,
    ) -> FsResult<()> {
        let stg = s.staging.as_ref().expect("caller checked");
        if stg.in_place {
            return self.publish_in_place(s, loc, op, durable, caller);
        }
        let fast = durable && self.ordered_commit;
        let stg_file = Arc::clone(&stg.file);
        let one_commit = |s: &mut OpenState| -> std::io::Result<()> {
            sys::write_out(&*stg_file)?;
            self.swap_in(s, loc)?;
            live_fsync(&stg_file, loc)
        };
        // The path whose record this publish appended, until the swap makes
        // it true.
        let mut recorded: Option<RelPath> = None;
        let steps = |s: &mut OpenState, recorded: &mut Option<RelPath>| -> FsResult<()> {
            let mut replaced = false;
            if let Some(path) = &self.versioned(loc) {
                // Without its record the version must not become live.
                let (made, want) = self.store_and_record(&stg_file, path, op, durable, caller)?;
                if made {
                    *recorded = Some(path.clone());
                }
                // Both outside the ledger's lock (group commit).
                if fast {
                    self.commit
                        .write_out_then(&self.ledger, &self.blobs, || one_commit(s))?;
                    replaced = true;
                } else if durable {
                    self.commit.sync_through(&self.ledger, &self.blobs, want)?;
                }
            }
            if !replaced {
                if fast {
                    one_commit(s)?;
                } else if durable {
                    live_fsync(&stg_file, loc)?;
                    self.swap_in(s, loc)?;
                    sync_parent_of(loc)?;
                } else {
                    // What a rename over a file would have done on ext4
                    // (auto_da_alloc): start writing the new content now, so a
                    // later commit of the swap does not expose an empty file.
                    // Replacing an empty file (a fresh create) risks nothing:
                    // empty is the version it had.
                    if sys::fstat(&*s.live).is_ok_and(|st| st.st_size > 0) {
                        sys::start_write_out(&*stg_file)?;
                    }
                    self.swap_in(s, loc)?;
                }
            }
            Ok(())
        };
        let result = steps(s, &mut recorded);
        if result.is_err()
            && s.staging.is_some()
            && let Some(path) = recorded
        {
            // Recorded, never swapped in: the journal names a version the
            // live file never held. Record the live content again, so the
            // newest version is what the file holds.
            self.record_live(s, &path, caller);
        }
        result
    }

    /// Records the live file's content as the newest version of `path`
    /// (after a publish that recorded a version it could not make live).
    /// If even that fails, the next mount's scan records what the file holds.
    fn record_live(&self, s: &OpenState, path: &RelPath, caller: &Caller) {
        let done = self.stored_state(&s.live, false).and_then(|state| {
            let change = Change::new(Op::Write, path.clone(), Some(state));
            Ok(self.ledger.lock().record(change, caller.actor())?)
        });
        if let Err(e) = done {
            tracing::error!(
                "could not record the live content of {path} after a failed publish: {e:?}"
            );
        }
    }

    /// Stores `file`'s content as a blob and records it as the new version
    /// of `path` unless it is the version already recorded: whether it
    /// recorded, and the last sequence number a sync must then cover. The
    /// blob gets no sync of its own: a durable publish syncs it with the
    /// journal, one sync for every blob and record of the publishes waiting
    /// at that moment (group commit).
    fn store_and_record(
        &self,
        file: &File,
        path: &RelPath,
        op: Op,
        durable: bool,
        caller: &Caller,
    ) -> FsResult<(bool, u64)> {
        let state = self.stored_state(file, false)?;
        if durable {
            self.blobs
                .mark_pending(state.blob.as_deref().expect("just stored"));
        }
        let mut ledger = self.ledger.lock();
        let made = record_unless_same(&mut ledger, path, state, op, caller)?;
        Ok((made, ledger.last_seq()))
    }

    /// Stores the content of `file` as a blob and returns its state.
    fn stored_state(&self, file: &File, durable: bool) -> FsResult<EntryState> {
        let (blob, size) = self.blobs.put_file(file, durable)?;
        let st = sys::fstat(file)?;
        let mut state = state_from_stat(&st, Kind::File);
        state.size = size;
        state.blob = Some(blob);
        Ok(state)
    }

    /// Publishing a file written in place (hidden when its writer started):
    /// nothing to swap. Still hidden, it is only made durable if asked;
    /// made visible meanwhile, its content is versioned now.
    fn publish_in_place(
        &self,
        s: &mut OpenState,
        loc: &Location,
        op: Op,
        durable: bool,
        caller: &Caller,
    ) -> FsResult<()> {
        // Taken out only once recorded: a failure leaves the content dirty,
        // still owed a version.
        let file = Arc::clone(&s.staging.as_ref().expect("caller checked").file);
        if let Some(path) = &self.versioned(loc) {
            let (_, want) = self.store_and_record(&file, path, op, durable, caller)?;
            if durable {
                self.commit.sync_through(&self.ledger, &self.blobs, want)?;
            }
        }
        s.staging = None;
        if durable {
            live_fsync(&file, loc)?;
        }
        Ok(())
    }

    /// Swaps the staging file in for the live one, and the open state with
    /// it at once (an error after this point must not leave the two apart).
    /// Swapped, not renamed over: the replaced inode lands at the staging
    /// path, to be reused (see `spares`).
    fn swap_in(&self, s: &mut OpenState, loc: &Location) -> std::io::Result<()> {
        let stg_path = s.staging.as_ref().expect("caller checked").path.clone();
        let from = stg_path.as_os_str().as_encoded_bytes();
        let exchanged = match sys::renameat2(
            libc::AT_FDCWD,
            from,
            loc.dirfd,
            &loc.phys,
            libc::RENAME_EXCHANGE,
        ) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                sys::renameat2(libc::AT_FDCWD, from, loc.dirfd, &loc.phys, 0)?;
                false
            }
            Err(e) => return Err(e),
        };
        let stg = s.staging.take().expect("caller checked");
        let old = std::mem::replace(&mut s.live, stg.file);
        self.swaps.fetch_add(1, Ordering::SeqCst);
        if exchanged {
            self.recycle(old, stg.path);
        }
        Ok(())
    }

    /// A reference to the file at `loc`, taken before a call that may drop
    /// its last name: while it is held, that call does not free the blocks.
    fn hold(&self, loc: &Location) -> Option<File> {
        // Each held reference is a descriptor: past a bound (a big rmtree
        // outrunning the janitor) files are freed in the request again.
        if self.held.load(Ordering::Relaxed) >= MAX_HELD {
            return None;
        }
        sys::openat(
            loc.dirfd,
            &loc.phys,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .ok()
    }

    /// Drops a reference from `hold` on the janitor thread: freeing the
    /// blocks of a replaced or removed file (hundreds of microseconds on
    /// ext4 with `discard`) happens off the request path, as XFS does with
    /// its background inode reclaim.
    fn free_later(&self, held: Option<File>) {
        let Some(f) = held else { return };
        // A janitor far behind (a big rmtree): free it here instead.
        if self.held.load(Ordering::Relaxed) >= 2 * MAX_HELD {
            return;
        }
        if let Some((tx, _)) = self.janitor.lock().as_ref() {
            self.held.fetch_add(1, Ordering::Relaxed);
            if let Err(std::sync::mpsc::SendError(chore)) = tx.send(Chore::Close(f)) {
                self.held.fetch_sub(1, Ordering::Relaxed);
                drop(chore);
            }
        }
    }

    /// The inode a publish swapped out now sits at `path` in `staging/`:
    /// keep it, emptied, for the next writer, unless a read still holds it
    /// (it keeps its bytes) or enough are kept already.
    fn recycle(&self, old: Arc<File>, path: PathBuf) {
        match self.janitor.lock().as_ref() {
            Some((tx, _)) => {
                let _ = tx.send(Chore::Recycle(old, path, self.ordered_commit));
            }
            None => {
                drop(old);
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    // ------------------------------------------------------------ directories

    /// The entries of directory `ino` as they are now, `.` and `..` first.
    fn listing(&self, ino: Ino) -> FsResult<Vec<DirEntry>> {
        if let Some(v) = decode(ino) {
            return self.vlisting(ino, v);
        }
        let _ns = self.namespace.read();
        let loc = self.loc(ino)?;
        let mut raw = sys::read_dir_at(loc.dirfd, &loc.phys)?;
        let mut attached_names: Vec<Vec<u8>> = Vec::new();
        if loc.is_hidden() {
            // Reached by path inside a hidden tree: the listing is whole,
            // its own hidden children included.
            let key = self.key_of(ino, &loc)?;
            match sys::read_dir_at(self.parked_raw(), key.as_bytes()) {
                Ok(extra) => {
                    attached_names = extra.iter().map(|e| e.name.clone()).collect();
                    raw.extend(extra);
                }
                Err(e) if enoent(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let parent = self.tree.lock().parent_of(ino);
        let mut entries = Vec::with_capacity(raw.len() + 2);
        entries.push(DirEntry {
            name: b".".to_vec(),
            kind: Kind::Dir,
            ino,
            special: 0,
        });
        entries.push(DirEntry {
            name: b"..".to_vec(),
            kind: Kind::Dir,
            ino: parent,
            special: 0,
        });
        let tree = self.tree.lock();
        for e in raw {
            let (kind, special) = match e.d_type {
                libc::DT_DIR => (Kind::Dir, 0),
                libc::DT_REG => (Kind::File, 0),
                libc::DT_LNK => (Kind::Symlink, 0),
                libc::DT_FIFO => (Kind::File, libc::S_IFIFO),
                libc::DT_SOCK => (Kind::File, libc::S_IFSOCK),
                libc::DT_UNKNOWN if !attached_names.contains(&e.name) => {
                    match loc.child(&e.name).lstat() {
                        Ok(st) => match node_kind(&st) {
                            Some(k) => (k, special_of(&st)),
                            None => continue,
                        },
                        Err(_) => continue,
                    }
                }
                // Device nodes are not kept in a skills tree.
                _ => continue,
            };
            let ino = tree.child(ino, &e.name).unwrap_or(e.d_ino | 1 << 63);
            entries.push(DirEntry {
                name: e.name,
                kind,
                ino,
                special,
            });
        }
        drop(tree);
        Ok(entries)
    }

    /// The listing of `ino` for a read at `offset` with no open handle, and
    /// the index to continue at. Offsets name a snapshot and an index
    /// (`snapshot << 32 | index + 1`): a listing is taken at offset 0 and
    /// kept until read to its end, so each pass reads one consistent listing
    /// even while another pass of the same directory starts.
    pub fn readdir_at(&self, ino: Ino, offset: u64) -> FsResult<(u64, Arc<Vec<DirEntry>>, usize)> {
        let (snap, index) = (offset >> 32, (offset & 0xffff_ffff) as usize);
        if offset > 0
            && let Some(e) = self.listings.lock().get(&snap)
        {
            return Ok((snap, Arc::clone(e), index));
        }
        let entries = Arc::new(self.listing(ino)?);
        let snap = self.next_fh.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
        let mut listings = self.listings.lock();
        if listings.len() > 1024 {
            listings.clear(); // abandoned passes; a later read takes a new listing
        }
        listings.insert(snap, Arc::clone(&entries));
        Ok((snap, entries, index))
    }

    /// A handle-less listing was read to its end.
    pub fn readdir_done(&self, snap: u64) {
        self.listings.lock().remove(&snap);
    }

    pub fn fsyncdir(&self, ino: Ino) -> FsResult<()> {
        if is_virtual(ino) {
            return Ok(());
        }
        // Opened under the namespace lock, flushed after it.
        let dir = {
            let _ns = self.namespace.read();
            match self.loc(ino) {
                Ok(loc) => Some((File::from(sys::open_dir(loc.dirfd, &loc.phys)?), loc)),
                // A directory removed while open has nothing left to make
                // durable but the record of its removal, synced below.
                Err(FsError::ENOENT | FsError::ESTALE) => None,
                Err(e) => return Err(e),
            }
        };
        self.sync_records()?;
        if let Some((dir, loc)) = dir {
            live_fsync(&dir, &loc)?;
        }
        Ok(())
    }

    /// Called at unmount: publish what writers left and make it durable.
    pub fn shutdown(&self) {
        self.pages.stop();
        let inos: Vec<Ino> = self.open_files.lock().keys().copied().collect();
        let daemon = Caller::kernel();
        for ino in inos {
            if let Err(e) = self.publish(ino, false, &daemon) {
                tracing::error!("could not publish inode {ino} at unmount: {e:?}");
            }
        }
        if let Err(e) = self.ledger.lock().sync(&self.blobs) {
            tracing::error!("could not sync the journal at unmount: {e}");
        }
        if let Some((tx, handle)) = self.janitor.lock().take() {
            let _ = tx.send(Chore::Stop);
            let _ = handle.join();
        }
        self.spares.clear();
        // Live files replaced by plain closes become durable too.
        if let Err(e) = sys::syncfs(&self.root_fd) {
            tracing::error!("syncfs at unmount: {e}");
        }
    }
}

/// The thread that empties swapped-out inodes into `spares`, unless a read
/// still holds one (it keeps its bytes) or enough are kept already, and
/// makes new ones when they run low.
fn start_janitor(
    spares: Arc<Spares>,
    held: Arc<AtomicUsize>,
    shared: Arc<Mutex<HashSet<(u64, u64)>>>,
) -> Janitor {
    let (tx, rx) = std::sync::mpsc::channel::<Chore>();
    let handle = std::thread::spawn(move || {
        for chore in rx {
            match chore {
                Chore::Recycle(old, path, reuse) => {
                    recycle_inode(&spares, &shared, old, path, reuse)
                }
                Chore::TopUp => {
                    if let Err(e) = spares.top_up() {
                        tracing::warn!("could not make spare files: {e}");
                    }
                }
                Chore::Close(f) => {
                    drop(f);
                    held.fetch_sub(1, Ordering::Relaxed);
                }
                Chore::Stop => break,
            }
        }
    });
    (tx, handle)
}

/// Empties the inode a publish swapped out (now only at `path`) into the
/// spares, or removes that name.
///
/// Never empties an inode that another name still points at: a hard link
/// made while unmounted (a `cp -al` backup, a package store outside the
/// root, the other name of a pair inside it) keeps its bytes. After the
/// exchange the staging name is one link, so any count above one is such a
/// name. `recycle` is false where the filesystem does not order metadata
/// (ext4 without a journal): there a truncate lost in a power cut could
/// bring an inode back with its old bytes after it was swapped in elsewhere.
fn recycle_inode(
    spares: &Spares,
    shared: &Mutex<HashSet<(u64, u64)>>,
    old: Arc<File>,
    path: PathBuf,
    recycle: bool,
) {
    // A read in flight holds the old file: wait for it to finish.
    let mut waited = 0;
    while recycle && Arc::strong_count(&old) > 1 && waited < 100 {
        std::thread::sleep(std::time::Duration::from_millis(1));
        waited += 1;
    }
    let old_st = sys::fstat(&*old).ok();
    let identity = old_st.map(|st| (st.st_dev, st.st_ino));
    let only_link = old_st.is_some_and(|st| st.st_nlink == 1);
    // Never one another name may still be read through, nor one carrying
    // extended attributes (an ACL or a label would pass to the next file).
    let unshared = identity.is_some_and(|id| !shared.lock().contains(&id));
    let reusable = recycle
        && only_link
        && unshared
        && !sys::has_xattrs(&*old)
        && Arc::strong_count(&old) == 1
        && spares.wants_more();
    drop(old);
    let is_file = sys::lstatat(libc::AT_FDCWD, path.as_os_str().as_encoded_bytes())
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
    if reusable && is_file {
        // Empty only the very inode that was swapped out.
        let emptied = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .and_then(|f| {
                let st = sys::fstat(&f)?;
                if Some((st.st_dev, st.st_ino)) != identity || st.st_nlink != 1 {
                    return Err(std::io::Error::other("not the swapped-out inode alone"));
                }
                sys::ftruncate(&f, 0).map(|()| f)
            });
        if let Ok(f) = emptied
            && spares.put(path.clone(), f)
        {
            return;
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// Renames a spare (made `ready` for its new place) to `rel` in `dirfd`,
/// never over an existing entry; on failure the spare is removed.
fn put_spare(
    ready: std::io::Result<()>,
    spare: &std::path::Path,
    dirfd: RawFd,
    rel: &[u8],
) -> std::io::Result<()> {
    let from = spare.as_os_str().as_encoded_bytes();
    let placed = ready
        .and_then(|()| sys::renameat2(libc::AT_FDCWD, from, dirfd, rel, libc::RENAME_NOREPLACE));
    if placed.is_err() {
        let removed = std::fs::remove_file(spare).or_else(|_| std::fs::remove_dir(spare));
        if let Err(e) = removed {
            tracing::warn!("could not remove spare {}: {e}", spare.display());
        }
    }
    placed
}

/// Journals a file's new `state` at `path`, unless it is the version the
/// catalog has already (same content, mode and owner: nothing to record).
/// Whether it recorded.
fn record_unless_same(
    ledger: &mut Ledger,
    path: &RelPath,
    state: EntryState,
    op: Op,
    caller: &Caller,
) -> FsResult<bool> {
    let same = ledger.catalog().get(path).is_some_and(|old| {
        old.kind == Kind::File
            && old.blob == state.blob
            && old.mode == state.mode
            && old.uid == state.uid
            && old.gid == state.gid
    });
    if !same
        && let Err(e) = ledger.record(Change::new(op, path.clone(), Some(state)), caller.actor())
    {
        tracing::error!("could not journal {} of {path}: {e}", op.name());
        return Err(e.into());
    }
    Ok(!same)
}

/// Fills `buf` from `offset` until it is full or the end is reached.
fn read_full(
    read_at: impl Fn(&mut [u8], u64) -> std::io::Result<usize>,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = read_at(&mut buf[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// An fsync of the live tree (a file or directory at `loc`), under the
/// store's poison rule: after a failed one (the kernel may have dropped the
/// pages that failed to write and marked them clean), no later fsync is
/// acknowledged until remount.
fn live_fsync(f: &File, loc: &Location) -> std::io::Result<()> {
    let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(loc.logical.as_bytes()));
    StoreIo::real().sync_all(f, &path)
}

fn sync_parent_of(loc: &Location) -> FsResult<()> {
    live_fsync(&open_parent_of(loc)?, loc)?;
    Ok(())
}

/// The directory holding the entry at `loc`.
fn open_parent_of(loc: &Location) -> std::io::Result<File> {
    let parent_phys = match loc.phys.iter().rposition(|&b| b == b'/') {
        Some(i) => &loc.phys[..i],
        None => &b""[..],
    };
    Ok(File::from(sys::open_dir(loc.dirfd, parent_phys)?))
}

/// The metadata change that puts back what `attr` changes, from `old`.
fn undo_of(attr: &SetAttr, old: &libc::stat) -> SetAttr {
    SetAttr {
        mode: attr.mode.map(|_| old.st_mode),
        uid: attr.uid.map(|_| old.st_uid),
        gid: attr.gid.map(|_| old.st_gid),
        atime: attr
            .atime
            .or(attr.mtime)
            .map(|_| Time::At(old.st_atime, old.st_atime_nsec)),
        mtime: attr
            .mtime
            .or(attr.atime)
            .map(|_| Time::At(old.st_mtime, old.st_mtime_nsec)),
        ..SetAttr::default()
    }
}

/// Applies a metadata change to the entry at `l`, by path, never following
/// a symlink (a symlink's own mode does not change).
fn apply_meta_at(l: &Location, attr: &SetAttr) -> FsResult<()> {
    let (fd, rel) = (l.dirfd, l.phys.as_slice());
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
    Ok(())
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
