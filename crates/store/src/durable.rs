//! `StoreIo`: the one door through which skillfs makes anything durable,
//! and [`Durability`], the order a durable publish takes through it.
//!
//! Invariants:
//! - every `fsync`, `fdatasync`, `syncfs` and written-out-and-waited range
//!   that a durability promise rests on goes through a `StoreIo` *passed
//!   in*: the journal (appends, the torn tail set aside, `repair`), loose
//!   blobs and packs and the directories naming them, `Dir::sync` and
//!   `Dir::replace` (so the checkpoint, `RULES` and `ROOT`), the store's
//!   directories made at open (`StoreFds::open`), and in the core every
//!   fsync of the live tree for a durable publish, the commit marker and the
//!   unmount's `syncfs`. Nothing below the application makes one of its
//!   own: the daemon and the command-line commands that open a store
//!   unmounted build the one real instance ([`StoreIo::real`]); a test
//!   builds another ([`StoreIo::with_backend`]) and stands in for the disk
//!   (`tests/it/power_loss.rs`, `tests/it/power_loss_core.rs`: a live and a
//!   durable image, power lost at every sync point);
//! - after one of them fails the store is *poisoned*: Linux may have marked
//!   the pages that failed to write as clean, so a retry could "succeed"
//!   without the data on disk (PostgreSQL's fsyncgate). From then on every
//!   durable sync answers `EIO` until the daemon is restarted (remount);
//!   work that promises no durability goes on. One error line is logged
//!   when it happens.
//! - the real backend and its poison flag are shared by the whole process
//!   (one daemon serves one store), so the journal, the blob store and the
//!   live tree poison each other;
//! - the [`Durability`] of a mount is chosen once, by the application
//!   (`SKILLFS_PORTABLE_FSYNC` is read there and nowhere else), and passed
//!   to the core.
//!
//! Locks: none; the poison flag is an atomic, and the backend is called
//! with whatever lock its caller holds (see `ledger::GroupCommit`).

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::dir::Dir;
use skillfs_base::sys;

/// How the store's durability points reach the disk.
pub trait SyncBackend: Send + Sync {
    /// `fdatasync`.
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// `fsync`.
    fn sync_all(&self, file: &File) -> io::Result<()>;
    /// `fsync` of a directory held open as `dir` (at `path`, for messages
    /// and test images): the entries it holds are durable.
    fn sync_dir(&self, dir: &File, path: &Path) -> io::Result<()>;
    /// `syncfs` of the filesystem `file` is on: everything on it.
    fn syncfs(&self, file: &File) -> io::Result<()>;
    /// Writes the dirty pages of `file` out and waits, without a commit
    /// (the caller's later `fsync` commits them; see `sys::write_out`).
    fn write_out(&self, file: &File) -> io::Result<()>;
}

/// The system calls themselves.
pub struct Disk;

/// A debug build's stand-in for a slow device: every device flush first
/// sleeps `SKILLFS_TEST_SYNC_DELAY_MS`, so that a test can tell whether a
/// lock is held across one (`tests/it/concurrency.rs`). Release builds read no
/// such variable.
fn slow_device() {
    test_delay("SKILLFS_TEST_SYNC_DELAY_MS");
}

/// A variable of [`test_delay`] and what it was read as.
type TestDelay = (&'static str, Option<std::time::Duration>);

/// In a debug build, sleeps the milliseconds the variable `var` names, if
/// set (read once per variable); release builds read nothing.
pub(crate) fn test_delay(var: &'static str) {
    if cfg!(debug_assertions) {
        static DELAYS: OnceLock<parking_lot::Mutex<Vec<TestDelay>>> = OnceLock::new();
        let delay = {
            let mut all = DELAYS.get_or_init(Default::default).lock();
            match all.iter().find(|(v, _)| *v == var) {
                Some((_, d)) => *d,
                None => {
                    let d = std::env::var(var)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .map(std::time::Duration::from_millis);
                    all.push((var, d));
                    d
                }
            }
        };
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
    }
}

impl SyncBackend for Disk {
    fn sync_data(&self, file: &File) -> io::Result<()> {
        slow_device();
        sys::fdatasync(file)
    }
    fn sync_all(&self, file: &File) -> io::Result<()> {
        slow_device();
        sys::fsync(file)
    }
    fn sync_dir(&self, dir: &File, _path: &Path) -> io::Result<()> {
        slow_device();
        sys::fsync(dir)
    }
    fn syncfs(&self, file: &File) -> io::Result<()> {
        slow_device();
        sys::syncfs(file)
    }
    fn write_out(&self, file: &File) -> io::Result<()> {
        sys::write_out(file)
    }
}

/// How a durable publish reaches the disk, chosen once at mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// One `fsync` commits every metadata change made before it (ext4
    /// with its journal, XFS: `sys::has_ordered_commit`): the data of blob,
    /// journal and staging file is written out in that order and a single
    /// fsync, of a file in the running transaction, commits it all (one
    /// device flush). Swapped-out inodes are emptied for reuse.
    OneCommit,
    /// Each step fsynced before the next (blob, its directory, journal,
    /// staging file, the live directory): right on any filesystem.
    StepByStep,
}

impl Durability {
    /// What the filesystem of `fd` allows: [`Durability::OneCommit`] where
    /// it orders its commits, unless `portable` asks for the steps.
    pub fn of_filesystem(fd: &impl std::os::fd::AsFd, portable: bool) -> Durability {
        if !portable && sys::has_ordered_commit(fd) {
            Durability::OneCommit
        } else {
            Durability::StepByStep
        }
    }

    /// Whether one fsync commits everything before it.
    pub fn one_commit(self) -> bool {
        self == Durability::OneCommit
    }

    /// For the log.
    pub fn describe(self) -> &'static str {
        match self {
            Durability::OneCommit => "one commit per durability point (journaled filesystem)",
            Durability::StepByStep => "each step fsynced in order",
        }
    }
}

/// A backend and the poison flag of the store using it.
#[derive(Clone)]
pub struct StoreIo {
    backend: Arc<dyn SyncBackend>,
    poisoned: Arc<AtomicBool>,
}

impl StoreIo {
    /// The real disk, shared by the whole process: built by the
    /// application only (the daemon, the commands that open a store
    /// unmounted), and passed down from there.
    pub fn real() -> StoreIo {
        static REAL: OnceLock<StoreIo> = OnceLock::new();
        REAL.get_or_init(|| StoreIo::with_backend(Arc::new(Disk)))
            .clone()
    }

    /// Another backend (tests), with a poison flag of its own.
    pub fn with_backend(backend: Arc<dyn SyncBackend>) -> StoreIo {
        StoreIo {
            backend,
            poisoned: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// `Err(EIO)` once poisoned: no durable acknowledgement may be given.
    pub fn check(&self) -> io::Result<()> {
        if self.is_poisoned() {
            return Err(io::Error::other(PoisonedError));
        }
        Ok(())
    }

    /// Marks the store poisoned after `err` while making `path` durable
    /// (logged once, on the first failure).
    pub fn poison(&self, what: &str, path: &Path, err: &io::Error) {
        if !self.poisoned.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "could not {what} '{}': {err}; no durable acknowledgement is given \
                 until skillfs is remounted (the kernel may have dropped the data \
                 that failed to write)",
                path.display()
            );
        }
    }

    fn guarded(
        &self,
        what: &str,
        path: &Path,
        op: impl FnOnce(&dyn SyncBackend) -> io::Result<()>,
    ) -> io::Result<()> {
        self.check()?;
        op(&*self.backend).inspect_err(|e| self.poison(what, path, e))
    }

    pub fn sync_data(&self, file: &File, path: &Path) -> io::Result<()> {
        self.guarded("fdatasync", path, |b| b.sync_data(file))
    }

    pub fn sync_all(&self, file: &File, path: &Path) -> io::Result<()> {
        self.guarded("fsync", path, |b| b.sync_all(file))
    }

    pub fn sync_dir(&self, dir: &Dir) -> io::Result<()> {
        self.guarded("fsync directory", dir.path(), |b| {
            b.sync_dir(dir.file(), dir.path())
        })
    }

    pub fn syncfs(&self, file: &File, path: &Path) -> io::Result<()> {
        self.guarded("syncfs the filesystem of", path, |b| b.syncfs(file))
    }

    /// `syncfs` even when poisoned (the unmount's: it acknowledges
    /// nothing, and what can still be written should be); a failure
    /// poisons as any other.
    pub fn syncfs_anyway(&self, file: &File, path: &Path) -> io::Result<()> {
        self.backend
            .syncfs(file)
            .inspect_err(|e| self.poison("syncfs the filesystem of", path, e))
    }

    pub fn write_out(&self, file: &File, path: &Path) -> io::Result<()> {
        self.guarded("write out", path, |b| b.write_out(file))
    }
}

/// The error every durable sync answers once the store is poisoned.
#[derive(Debug)]
pub struct PoisonedError;

impl std::fmt::Display for PoisonedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "an earlier fsync of the store failed; nothing more can be made durable \
             until skillfs is remounted",
        )
    }
}

impl std::error::Error for PoisonedError {}
