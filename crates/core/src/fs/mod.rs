//! `SkillFs`: the filesystem core, free of any FUSE type.
//!
//! Every handler takes plain values (inode numbers, names, a [`Caller`]) and
//! returns `FsResult`; `fuse` only converts and replies.
//!
//! One question per file, all of them `impl SkillFs` blocks over the state
//! declared here:
//! - `place`: where an entry lives and how names are placed;
//! - `lookup`: what the kernel knows (lookups, attributes, stale names);
//! - `open`: open files and the copy-on-write write path;
//! - `publish`: a version made (blob, record, swap) and made durable;
//! - `namespace`: unlink, rmdir (`create`: create, mkdir, symlink, mknod);
//! - `rename`: rename, as a plan, its system calls, the tree's update and
//!   its records (`rename_plan`: its decisions, as values);
//! - `unpark`: a hidden directory made visible;
//! - `attr`: chmod, chown, utimes, truncate;
//! - `listing`: directory listings and `fsyncdir`;
//! - `janitor`: the background thread (spares, reuse, late frees);
//! - `sweep`: old parks and orphans swept while mounted;
//! - `retention`: `forget` while mounted (the work is `skillfs_model::retention`'s);
//! - `home`: the home around the versioned root (a mount `--versioned`);
//! - `history_view`, `tree`: the `.history` tree, the inode table.
//!
//! The state is in parts that own their locks behind narrow methods, so
//! that an invariant spanning files is kept by a type, not by each author:
//! - `files::OpenFiles` (the open inodes: an `OpenFile` lives exactly as
//!   long as its handles) and `files::Handles` (handle numbers never given
//!   twice);
//! - `versions::Versioning`: the ledger, its group commit, `forget`'s turn
//!   and the unmount's checkpoint;
//! - `notify::KernelNotices`: invalidations, passthrough, the page store
//!   (`pages`);
//! - `parks::Parks`: what is known of the parks (made only by
//!   `ensure_park` or the settler, forgotten whole after a settler run);
//! - `kept::StaleFiles` (bounded by `MAX_STALE`), `kept::SharedInodes`
//!   (never forgotten, so never recycled), `kept::HeldRefs` (bounded by
//!   `MAX_HELD`).
//!
//! This file holds the types, the core's state, its construction and its
//! shutdown, and the helpers every concern uses (the namespace lock, the
//! journal).
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
//! - A file an unlink or a rename takes away stays reachable (`stale`)
//!   while the kernel still names its inode; an inode seen with another
//!   name while mounted (`shared`) is never emptied for reuse.
//!
//! Lock order, as the parts take their locks: `namespace` → `tree` →
//! `files::OpenFiles` (its table, then an `OpenFile`: its methods take
//! them in that order only) → an `OpenFile` → the ledger
//! (`versions::Versioning::ledger`); an `OpenFile` → the page store's
//! slots (`notify::KernelNotices::pages`, see `pages`). The group commit
//! is reached only through `Versioning` (`sync_through`, `sync_all`,
//! `write_out_then`), which takes the ledger's lock inside, briefly and on
//! its own: it is entered holding at most `namespace` and an `OpenFile` (a
//! close's publish, a rename's), never the ledger, and by an `fsync`
//! holding none of them (see `publish`). No lock is held across a device
//! flush by a request, nor across a walk of a subtree (an unpark is
//! planned with none held, see `unpark`; only a plan something changed is
//! walked again under the rename's lock). Leaves, whose locks are taken
//! and let go of inside their methods with no other taken meanwhile:
//! `files::Handles`, `kept::StaleFiles`, `kept::SharedInodes`,
//! `parks::Parks`, `listings`, the janitor's inbox.
//! The blob store's writing gate (`BlobStore::writing`, shared) is taken
//! from storing a content to appending its record, wherever in this order
//! that starts, but never while holding the ledger: its one exclusive taker,
//! a prune, holds nothing else while it waits, then takes the ledger.

mod attr;
mod create;
mod direct;
mod files;
mod fsync_publish;
mod history_view;
mod home;
mod janitor;
mod kept;
mod listing;
mod lookup;
mod meet;
mod namespace;
mod notify;
mod open;
mod pages;
mod parks;
mod place;
mod programs;
mod publish;
mod rename;
mod rename_plan;
mod reply;
mod retention;
mod sweep;
mod theirs;
mod tree;
mod unpark;
mod versions;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::error::{Context, FsError, FsResult};
use crate::hide::HideRules;
use crate::scan::{Areas, Prehashed, Settler, kind_of, state_from_stat};
use skillfs_base::relpath::{ByteString, RelPath};
use skillfs_model::history;
use skillfs_model::ledger::{GroupCommit, Ledger};
use skillfs_store::blobs::{BlobStore, Opened, copy_range};
use skillfs_store::durable::Durability;
use skillfs_store::journal::{Actor, Change, EntryState, Kind, Op};
use skillfs_store::spares::Spares;
use skillfs_store::{Named, StoreFds};

/// The file in `tmp/` whose fsync commits everything before it (see
/// `commit_all`).
const COMMIT_MARKER: &str = "commit";
use skillfs_base::sys::{self, Time};
use unpark::{Freezes, UnparkPlan};

use files::{FileHandle, Handles, OpenFile, OpenFiles, OpenState, Staging};
use history_view::{HISTORY, HistoryView, VNode, check_writable, decode, is_virtual};
pub use home::Home;
use janitor::{put_spare, start_janitor};
use kept::{HeldRefs, SharedInodes, StaleFiles};
pub use listing::{DirectoryEntry, DirectoryReplier};
use notify::KernelNotices;
use pages::{Claim, PageStore};
pub use pages::{Kernel as PageKernel, PageOp};
use parks::Parks;
pub use reply::{DirEntry, Entry, Invalidation, OpenReply, SetAttr, Ttl};
pub use theirs::{Replicas, TheirEntry, TheirTree};
use tree::{Area, AreaDirs, Tree};
pub use tree::{Ino, Location, ROOT_INO};
use versions::Versioning;

const NAME_MAX: usize = 255;

/// How a try of a change ends short of its answer: it met a store into
/// the page cache being written (see `lock_to_change`), and must let go of
/// every lock, wait and start over (`retry_after_store`), or it failed.
/// Never answered to the kernel as such: only `Failed` becomes an errno.
enum Attempt {
    StoreBusy,
    Failed(FsError),
}

impl From<FsError> for Attempt {
    fn from(e: FsError) -> Attempt {
        Attempt::Failed(e)
    }
}

impl From<std::io::Error> for Attempt {
    fn from(e: std::io::Error) -> Attempt {
        Attempt::Failed(e.into())
    }
}

/// The result of one try of a change that may meet a store.
type TryResult<T> = Result<T, Attempt>;

/// Who is asking, from the FUSE request header.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Its process name, read already: kept with a writer's staged bytes,
    /// whose thread may be gone (or its id reused) when they are
    /// published. `None`: read from `/proc` when a record names it.
    pub comm: Option<Comm>,
}

/// A process name as read once (`/proc/<pid>/comm`: at most 15 bytes;
/// kept up to 63, cut at a character).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm {
    bytes: [u8; 63],
    len: u8,
}

impl Comm {
    /// The name of `pid` now (`?` if it is gone).
    pub fn of(pid: u32) -> Comm {
        let name = skillfs_base::process::process_name(pid);
        let mut end = name.len().min(63);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0u8; 63];
        bytes[..end].copy_from_slice(&name.as_bytes()[..end]);
        Comm {
            bytes,
            len: end as u8,
        }
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len as usize]).expect("cut at a character")
    }
}

impl Caller {
    /// The daemon itself (work at unmount, with no request behind it).
    fn kernel() -> Caller {
        Caller {
            uid: skillfs_base::process::geteuid(),
            gid: 0,
            pid: std::process::id(),
            comm: None,
        }
    }

    /// This caller with its process name read now (see `comm`).
    pub fn named(&self) -> Caller {
        Caller {
            comm: Some(self.comm.unwrap_or_else(|| Comm::of(self.pid))),
            ..*self
        }
    }

    fn actor(&self) -> Actor {
        Actor {
            uid: self.uid,
            pid: self.pid,
            comm: match &self.comm {
                Some(c) => c.as_str().to_string(),
                None => skillfs_base::process::process_name(self.pid),
            },
        }
    }
}

pub struct SkillFs {
    root_fd: OwnedFd,
    /// The home around the versioned root, when the mount is over one.
    home: Option<Home>,
    /// The versioned root's inode (`tree::Tree::root`).
    vroot: Ino,
    /// The store's directories, held open: staging files, spares, the
    /// commit marker and swept trees are reached only from these fds.
    dirs: StoreFds,
    rules: HideRules,
    blobs: BlobStore,
    /// The ledger and its group commit (see `versions`).
    versions: Versioning,
    namespace: RwLock<()>,
    /// The subtrees unparks are being planned over (see `unpark`).
    freezes: Arc<Freezes>,
    tree: Mutex<Tree>,
    /// The open inodes and the file handles (see `files`).
    open_files: OpenFiles,
    handles: Handles,
    /// The daemon runs as root: new entries are given to their caller.
    chown_new: bool,
    /// The listing kept for each directory being read (see `readdir_at`).
    listings: Mutex<HashMap<Ino, listing::Listing>>,
    /// What the core tells the kernel (invalidations, pages) and knows it
    /// takes (passthrough); see `notify`.
    notices: KernelNotices,
    /// How a durable publish reaches the disk (chosen at mount; every sync
    /// goes through `dirs.io`).
    durability: Durability,
    /// A store file touched and fsynced to commit everything before it
    /// with `Durability::OneCommit` and no file of the change is sure to be
    /// in the running transaction (see `commit_all`).
    marker: File,
    /// Empty files in `staging/` for new staging and blob files: the
    /// inodes that publishing swaps out of the live tree, emptied, and new
    /// ones made ahead of need (see `store::spares`).
    spares: Arc<Spares>,
    /// Whether the park of a directory exists, where known (see `parks`).
    parks: Parks,
    /// References taken by `hold` that the janitor has yet to drop.
    held: Arc<HeldRefs>,
    /// Inodes seen with more than one name while mounted: never emptied
    /// for reuse (see `kept::SharedInodes`).
    shared: Arc<SharedInodes>,
    /// Fills `spares` off the request path (freeing the blocks of a
    /// swapped-out inode, or allocating one, can take hundreds of
    /// microseconds).
    janitor: Mutex<Option<Janitor>>,
    /// Bumped by every swap of a new version into the live tree (see
    /// `lookup`).
    swaps: AtomicU64,
    /// The files that an unlink or a rename over them took from the tree
    /// while the kernel still names their inode (see `kept::StaleFiles`).
    stale: StaleFiles,
    /// Other replicas' versions under `.history` (see `theirs`).
    theirs: theirs::Theirs,
}

/// Work for the janitor thread.
enum Chore {
    /// A swapped-out inode, now at this path in `staging/`; whether it may
    /// be reused (see `recycle_inode`).
    Recycle(Arc<File>, Named, bool),
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
        home: Option<Home>,
        dirs: StoreFds,
        rules: HideRules,
        blobs: BlobStore,
        ledger: Ledger,
        durability: Durability,
    ) -> FsResult<SkillFs> {
        let root_key = sys::dir_key(root_fd.as_fd(), b"")?;
        let home_key = match &home {
            Some(h) => Some((sys::dir_key(h.fd.as_fd(), b"")?, h.versioned.clone())),
            None => None,
        };
        let tree = Tree::new(root_key, home_key);
        let vroot = tree.root;
        let spares = Arc::new(Spares::new(
            Arc::clone(&dirs.staging),
            Arc::clone(&dirs.tmp),
        ));
        let held = Arc::new(HeldRefs::default());
        let shared = Arc::new(SharedInodes::default());
        let janitor = start_janitor(Arc::clone(&spares), Arc::clone(&held), Arc::clone(&shared));
        let low = Mutex::new(janitor.0.clone());
        spares.set_on_low(Box::new(move || {
            let _ = low.lock().send(Chore::TopUp);
        }));
        let _ = janitor.0.send(Chore::TopUp);
        let marker = dirs.tmp.open(
            COMMIT_MARKER,
            libc::O_RDWR | libc::O_CREAT,
            skillfs_store::fsutil::FILE_MODE,
        )?;
        tracing::info!("fsync: {}", durability.describe());
        Ok(SkillFs {
            root_fd,
            home,
            vroot,
            dirs,
            rules,
            blobs,
            versions: Versioning::new(ledger),
            namespace: RwLock::new(()),
            freezes: Arc::default(),
            tree: Mutex::new(tree),
            open_files: OpenFiles::default(),
            handles: Handles::default(),
            chown_new: skillfs_base::process::geteuid() == 0,
            listings: Mutex::new(HashMap::new()),
            notices: KernelNotices::default(),
            durability,
            marker,
            janitor: Mutex::new(Some(janitor)),
            swaps: AtomicU64::new(0),
            stale: StaleFiles::default(),
            theirs: theirs::Theirs::default(),
            parks: Parks::default(),
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
        self.notices.set_invalidator(f);
    }

    /// Where other replicas' versions are read from (set once, by the
    /// application, before the mount serves; see `theirs`).
    pub fn set_replicas(&self, r: Box<dyn Replicas>) {
        self.theirs.set(r);
    }

    /// Whether the kernel takes backing files (set by the adapter at INIT,
    /// and cleared if registering one fails).
    pub fn set_passthrough(&self, on: bool) {
        self.notices.set_passthrough(on);
    }

    /// Starts pushing the pages of files just written into the kernel's
    /// page cache, through `kernel` (see `pages`).
    pub fn start_page_store(&self, kernel: PageKernel) -> std::io::Result<()> {
        self.notices.pages().start(kernel)
    }

    /// Locks `of`'s state for a change of its content, once no store of an
    /// earlier content into the kernel's page cache can land after it.
    /// [`Attempt::StoreBusy`] if a store is being written: the caller lets go of
    /// every lock, waits (`retry_after_store`) and starts over, because the
    /// store may wait on a read that needs a request thread, and a thread
    /// waiting with the namespace lock would hold up the others.
    fn lock_to_change<'a>(
        &self,
        ino: Ino,
        of: &'a OpenFile,
    ) -> TryResult<parking_lot::MutexGuard<'a, OpenState>> {
        let s = of.lock();
        match self.notices.pages().claim(ino) {
            Claim::Clear => Ok(s),
            Claim::Busy => Err(Attempt::StoreBusy),
        }
    }

    /// Runs `op` (which takes its own locks) again for as long as it meets
    /// a store being written, waiting for the store between tries.
    fn retry_after_store<T>(&self, ino: Option<Ino>, op: impl Fn() -> TryResult<T>) -> FsResult<T> {
        loop {
            match op() {
                Err(Attempt::StoreBusy) => self.notices.pages().wait(ino),
                Err(Attempt::Failed(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    /// The namespace lock for a change of the tree (a change made under it
    /// also marks the unparks and sweeps planned over it: `touched`).
    fn ns_write(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.namespace.write()
    }

    /// A change was made at `loc`: an unpark planned over a subtree at,
    /// inside or above it must not use its plan (see `unpark`).
    fn touched(&self, loc: &Location) {
        self.freezes.touched(loc.area, &loc.phys);
    }

    /// Whether an unpark is being planned (a change whose location is not
    /// at hand need only be placed then).
    fn freezing(&self) -> bool {
        self.freezes.any()
    }

    /// The `.history` tree, over the history index.
    fn history(&self) -> HistoryView<'_> {
        HistoryView {
            ledger: self.versions.ledger_lock(),
            blobs: &self.blobs,
            root: &self.root_fd,
            theirs: &self.theirs,
        }
    }

    fn root_dir(&self) -> BorrowedFd<'_> {
        self.root_fd.as_fd()
    }

    fn parked_dir(&self) -> BorrowedFd<'_> {
        self.dirs.parked.fd()
    }

    /// What each area's locations are relative to.
    fn area_dirs(&self) -> AreaDirs<'_> {
        AreaDirs {
            root: self.root_dir(),
            parked: self.parked_dir(),
            home: self.home.as_ref().map(|h| h.fd.as_fd()),
        }
    }

    /// The directory `loc.phys` is relative to.
    fn at(&self, loc: &Location) -> BorrowedFd<'_> {
        self.area_dirs().at(loc)
    }

    fn areas(&self) -> Areas<'_> {
        Areas {
            root_fd: self.root_dir(),
            parked_fd: self.parked_dir(),
            orphans_fd: self.dirs.orphans.fd(),
        }
    }

    fn open_file(&self, ino: Ino) -> Option<Arc<OpenFile>> {
        self.open_files.get(ino)
    }

    /// Refuses a change that adds or moves a name (`ENOSPC`) when its record
    /// could not be written (a full disk with no room left in the journal's
    /// reserve): made with no record, it would be missing from `.history`
    /// until the next mount's scan. (Removals are not refused: see
    /// `remove`.)
    fn journal_room(&self) -> FsResult<()> {
        Ok(self.versions.ledger().ensure_room()?)
    }

    /// Makes every record appended so far durable (group commit: the
    /// ledger's lock is not held across the flush).
    fn sync_records(&self) -> FsResult<()> {
        Ok(self.versions.sync_all(&self.blobs)?)
    }

    fn record(&self, change: Change, caller: &Caller) {
        let mut ledger = self.versions.ledger();
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

    /// Journals the removals held back (`Ledger::defer`) that no new file
    /// took up within `ledger::DEFER_MAX`. Called every so often while
    /// mounted.
    pub fn flush_deferred(&self) {
        if let Err(e) = self
            .versions
            .ledger()
            .flush_deferred(skillfs_model::ledger::DEFER_MAX)
        {
            tracing::error!("could not journal a removal held back: {e}");
        }
    }

    /// Called at unmount: publish what writers left and make it durable.
    pub fn shutdown(&self) {
        self.notices.pages().stop();
        let inos: Vec<Ino> = self.open_files.inos();
        let daemon = Caller::kernel();
        for ino in inos {
            if let Err(e) = self.publish(ino, false, &daemon) {
                tracing::error!("could not publish inode {ino} at unmount: {e:?}");
            }
        }
        {
            let mut ledger = self.versions.ledger();
            if let Err(e) = ledger.flush_deferred(std::time::Duration::ZERO) {
                tracing::error!("could not journal the removals held back at unmount: {e}");
            }
            match ledger.sync(&self.blobs) {
                Err(e) => tracing::error!("could not sync the journal at unmount: {e}"),
                // The next mount loads the fold instead of making it again.
                Ok(()) => {
                    if self.versions.checkpoint_owed(ledger.last_seq())
                        && let Err(e) = ledger.checkpoint(&self.dirs.journal)
                    {
                        tracing::warn!("could not write the journal's checkpoint: {e}");
                    }
                }
            }
        }
        if let Some((tx, handle)) = self.janitor.lock().take() {
            let _ = tx.send(Chore::Stop);
            let _ = handle.join();
        }
        self.spares.clear();
        // Live files replaced by plain closes become durable too (tried
        // even after a failed sync: it promises nothing).
        let root = self.root_fd.try_clone().map(File::from);
        if let Err(e) =
            root.and_then(|f| self.dirs.io.syncfs_anyway(&f, std::path::Path::new("ROOT")))
        {
            tracing::error!("syncfs at unmount: {e}");
        }
    }
}
