//! The store: the durable truth about history, kept beside the skills root.
//!
//! On-disk layout (the one place it is written down):
//!
//! ```text
//! LOCK              flock held by the mounted daemon; holds its pid
//! DIRTY             made (and synced) by a daemon before it serves, removed
//!                   at its clean end: found at mount, the last one did not
//!                   finish (killed, crashed, the power went; see `clean`)
//! journal/*.jsonl   append-only change records, one JSON object per line
//! blobs/packs/<n>.zpack  contents, appended: small ones whole (compressed
//!                   where smaller), larger ones as chunks and their list
//!                   (see `packs`, `blobs::chunked`)
//! blobs/packs/<n>.pack  packs of earlier builds (read, never appended to)
//! blobs/ab/<sha256> larger contents as earlier builds stored them (read only)
//! tmp/              where spare files are made (see `spares`)
//! staging/          copy-on-write scratch files of open writers, and empty
//!                   files made ahead of need (see `spares`)
//! parked/<key>/     hidden entries of the directory whose identity is <key>
//!                   (inode number and birth time: it survives renames)
//! orphans/          hidden entries whose directory was removed, kept until swept
//! config.json       hide rules and park age set for this store (optional)
//! RULES             the hide rules in force while mounted (for `status`)
//! ROOT              the root this store versions: its path, then its
//!                   device and inode numbers (one store per root)
//! daemon.log        the mounted daemon's log (`daemon.log.1`: the one before,
//!                   moved aside when the log grew past its cap; for a moment
//!                   of that, the new one is `daemon.log.new`)
//! control           the mounted daemon's control socket (`CONTROL`)
//! ```
//!
//! Invariants: the store is outside the root and on the same filesystem
//! (renames between the two stay atomic), and the root is not inside it;
//! the journal and the blobs are the only durable truth, everything else is
//! rebuilt from them; `staging/` and `tmp/` hold nothing of value once no
//! daemon runs and are emptied at mount. The store is private: its modes
//! are [`fsutil`]'s to decide; once a daemon has opened it ([`Layout::create`]
//! hands back its directories held open, [`StoreFds`]), everything in it is
//! reached from those fds, never by path again ([`dir`]). `Layout`'s paths
//! name things in messages, and serve the checks before the store is opened
//! and the read-only commands.
//!
//! Errors: the checks and set-up steps here, in `fsutil` and in `journal`
//! fail with a [`StoreError`] (kind, path, source); the store knows no exit
//! codes, the command line maps the kinds to them (`error::Failure`).
//!
//! Locks: [`StoreLock`] is the flock that makes one daemon the store's only
//! writer; the in-process locks are the submodules' own (see `blobs`,
//! `packs`, `spares`, `durable`).

// The daemon answers errors, never unwraps them, here and in every store
// module below (tests may; see clippy.toml).
#![deny(clippy::unwrap_used)]
// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod blobs;
pub mod dir;
pub mod durable;
pub mod error;
pub mod fsutil;
pub mod journal;
pub mod packs;
pub mod spares;

/// Fixtures for the tests here and in the crates above (their
/// dev-dependencies turn on `fixtures`).
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures {
    /// Bytes no compressor shrinks (xorshift from `seed`): a large content
    /// is stored as it is, its chunks plain entries of a pack.
    pub fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }
}

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub use dir::{Dir, Named, StoreFds};
use durable::StoreIo;
pub use error::{ErrorKind, StoreError, StoreResult};
use skillfs_base::sys;

pub const LOCK: &str = "LOCK";
pub const JOURNAL: &str = "journal";
pub const BLOBS: &str = "blobs";
pub const TMP: &str = "tmp";
pub const STAGING: &str = "staging";
pub const PARKED: &str = "parked";
pub const ORPHANS: &str = "orphans";
pub const RULES: &str = "RULES";
pub const LOG: &str = "daemon.log";
/// The log before the current one, moved aside when that grew past its cap.
pub const LOG_OLD: &str = "daemon.log.1";
pub const ROOT_ID: &str = "ROOT";
/// The mounted daemon's control socket (the application's `daemon::control`
/// serves it; the store only knows its name, to leave it alone).
pub const CONTROL: &str = "control";

/// Paths inside one store directory.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: PathBuf) -> Layout {
        Layout { dir }
    }

    /// `<parent of ROOT>/.skillfs/<name of ROOT>/`.
    pub fn default_dir(root: &Path) -> Option<PathBuf> {
        let name = root.file_name()?;
        Some(root.parent()?.join(".skillfs").join(name))
    }

    pub fn lock(&self) -> PathBuf {
        self.dir.join(LOCK)
    }
    pub fn journal(&self) -> PathBuf {
        self.dir.join(JOURNAL)
    }
    pub fn blobs(&self) -> PathBuf {
        self.dir.join(BLOBS)
    }
    pub fn tmp(&self) -> PathBuf {
        self.dir.join(TMP)
    }
    pub fn staging(&self) -> PathBuf {
        self.dir.join(STAGING)
    }
    pub fn parked(&self) -> PathBuf {
        self.dir.join(PARKED)
    }
    pub fn orphans(&self) -> PathBuf {
        self.dir.join(ORPHANS)
    }
    pub fn rules(&self) -> PathBuf {
        self.dir.join(RULES)
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join(LOG)
    }
    pub fn root_id(&self) -> PathBuf {
        self.dir.join(ROOT_ID)
    }

    /// Creates the directories of the layout (idempotent), each 0700, and
    /// the missing ancestors of the store too (the default `.skillfs/`);
    /// returns them held open (the directories of the store made and
    /// opened from the store's fd, see [`StoreFds::open`]).
    pub fn create(&self, io: StoreIo) -> StoreResult<StoreFds> {
        fsutil::create_dir_all(&self.dir, &io).map_err(|e| {
            StoreError::io(ErrorKind::Store, "create store directory", &self.dir, e)
        })?;
        StoreFds::open(self, io)
    }
}

/// What `LOCK` says of a store's daemon (see [`StoreLock::state`]).
#[derive(Debug)]
pub enum LockState {
    /// No daemon: this process could take the lock.
    Free,
    /// A daemon holds it; the pid it wrote, if any (unproven).
    Held(Option<u32>),
    /// `LOCK` could not be opened or locked: unknown.
    Unknown(io::Error),
}

/// The exclusive lock of a mounted store; released when dropped (or when the
/// daemon dies, which is why it is an flock and not a pid file).
pub struct StoreLock {
    _file: File,
}

/// Whether the last daemon ended cleanly: `DIRTY` is made (and synced)
/// by a daemon once it is about to serve, and removed at its clean end,
/// once everything it wrote is durable. Only the daemon (and the core
/// opened without a kernel) makes or removes it: the commands that take
/// the store's lock unmounted (`forget`, `import`, `repair`) leave it
/// alone, so they never make a mount think the last one crashed.
pub mod clean {
    use super::{Dir, durable::StoreIo, fsutil};
    use std::io::{self, Write};

    pub const DIRTY: &str = "DIRTY";

    /// Whether the last daemon of the store held by `top` did not finish.
    pub fn last_unclean(top: &Dir) -> bool {
        top.lstat(DIRTY).is_ok()
    }

    /// Marks the store served: made durable before anything is served, so
    /// that a power cut at any later moment is seen at the next mount.
    pub fn mark_serving(top: &Dir, io: &StoreIo) -> io::Result<()> {
        let mut f = top.open(
            DIRTY,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            fsutil::FILE_MODE,
        )?;
        writeln!(f, "{}", std::process::id())?;
        io.sync_all(&f, &top.join(DIRTY))?;
        io.sync_dir(top)
    }

    /// The clean end: call it only once everything the daemon wrote is
    /// durable (never after a failed sync).
    pub fn mark_clean(top: &Dir, io: &StoreIo) -> io::Result<()> {
        match top.unlink(DIRTY) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        io.sync_dir(top)
    }
}

impl StoreLock {
    /// Takes the lock of the store held open as `top` (`LOCK` opened from
    /// its fd, never through a symlink).
    pub fn acquire(top: &Dir, layout: &Layout) -> StoreResult<StoreLock> {
        let path = layout.lock();
        let mut file = top
            .open(LOCK, libc::O_RDWR | libc::O_CREAT, fsutil::FILE_MODE)
            .map_err(|e| StoreError::io(ErrorKind::Store, "open lock file", &path, e))?;
        let got = sys::try_lock_exclusive(&file)
            .map_err(|e| StoreError::io(ErrorKind::Store, "lock", &path, e))?;
        if !got {
            return Err(Self::in_use(layout));
        }
        file.set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(|e| StoreError::io(ErrorKind::Store, "write", &path, e))?;
        Ok(StoreLock { _file: file })
    }

    /// The pid written by the daemon holding the lock, if one holds it
    /// (what `status` shows; never signal it without [`Self::daemon`]).
    pub fn holder(layout: &Layout) -> Option<u32> {
        let (file, pid) = Self::probe(layout)?;
        drop(file);
        pid
    }

    fn in_use(layout: &Layout) -> StoreError {
        let pid = Self::holder(layout).map_or("?".to_string(), |p| p.to_string());
        StoreError::refused(
            ErrorKind::Store,
            &layout.lock(),
            format!(
                "store '{}' is in use by another skillfs daemon (pid {pid}): one mount per store",
                layout.dir.display(),
            ),
        )
    }

    /// Refuses a store a daemon serves, without creating anything (the
    /// check before the other checks of a mount).
    pub fn refuse_if_held(layout: &Layout) -> StoreResult<()> {
        if Self::is_held(layout) {
            Err(Self::in_use(layout))
        } else {
            Ok(())
        }
    }

    /// Whether a daemon holds the store, as far as `LOCK` can tell: a
    /// `LOCK` that cannot be opened or locked says nothing (a store moved
    /// or its `LOCK` removed while mounted), which is not "free": only a
    /// lock this process could take proves that no daemon runs.
    pub fn state(layout: &Layout) -> LockState {
        let mut file = match fsutil::options().read(true).open(layout.lock()) {
            Ok(f) => f,
            Err(e) => return LockState::Unknown(e),
        };
        match sys::try_lock_exclusive(&file) {
            Ok(true) => LockState::Free,
            Ok(false) => {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut file, &mut text);
                LockState::Held(text.trim().parse().ok())
            }
            Err(e) => LockState::Unknown(e),
        }
    }

    /// Whether a process holds the flock (a daemon serves the store).
    pub fn is_held(layout: &Layout) -> bool {
        Self::probe(layout).is_some()
    }

    /// Opens `LOCK` (never through a symlink); `None` when nobody holds
    /// its flock (our probe lock drops with the file), else the pid it
    /// names, if it names one.
    fn probe(layout: &Layout) -> Option<(File, Option<u32>)> {
        let mut file = fsutil::options().read(true).open(layout.lock()).ok()?;
        if sys::try_lock_exclusive(&file).ok()? {
            return None;
        }
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut file, &mut text);
        let pid = text.trim().parse().ok();
        Some((file, pid))
    }

    /// The pid of the daemon serving this store, only when proven: the
    /// flock on `LOCK` is held, the kernel's lock table says that pid holds
    /// an flock on `LOCK`'s inode, and the process is a skillfs. The pid
    /// written in `LOCK` alone proves nothing (it is a file), and it is
    /// the only pid `skillfs umount` may signal.
    pub fn daemon(layout: &Layout) -> Option<u32> {
        let (file, pid) = Self::probe(layout)?;
        let pid = pid?;
        let st = sys::fstat(&file).ok()?;
        let locks = fs::read_to_string("/proc/locks").ok()?;
        let holds = locks.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`; waiters
            // are listed with `->` after the number and hold nothing.
            f.len() >= 6
                && f[1] == "FLOCK"
                && f[4].parse::<u32>().ok() == Some(pid)
                && lock_names(f[5], &st)
        });
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        (holds && comm.trim_end().starts_with("skillfs")).then_some(pid)
    }
}

/// Whether a `/proc/locks` file field (`MAJ:MIN:INODE`, the device numbers
/// in hex) names the file of `st`: its device as well as its inode.
fn lock_names(field: &str, st: &libc::stat) -> bool {
    let mut parts = field.split(':');
    let (Some(maj), Some(min), Some(ino), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    u32::from_str_radix(maj, 16).ok() == Some(libc::major(st.st_dev))
        && u32::from_str_radix(min, 16).ok() == Some(libc::minor(st.st_dev))
        && ino.parse::<u64>().ok() == Some(st.st_ino)
}

/// Checks the store may serve `root`: outside it, on the same filesystem,
/// writable. `root` must be canonical; `store` is the store as it will be
/// (canonical, possibly not yet created) and `existing` its deepest existing
/// ancestor (itself once created).
pub fn check_placement(root: &Path, store: &Path, existing: &Path) -> StoreResult<()> {
    if let Some(s) = root.ancestors().find(|a| *a == store || is_store(a)) {
        return Err(StoreError::refused(
            ErrorKind::Store,
            s,
            format!(
                "ROOT '{}' is inside the skillfs store '{}': a store holds history, never a \
                 tree to version",
                root.display(),
                s.display()
            ),
        ));
    }
    if store.starts_with(root) {
        return Err(StoreError::refused(
            ErrorKind::Store,
            store,
            format!(
                "store '{}' is inside ROOT '{}': it must live outside the tree it versions",
                store.display(),
                root.display()
            ),
        ));
    }
    let rdev = fs::metadata(root)
        .map_err(|e| StoreError::io(ErrorKind::Root, "stat", root, e))?
        .dev();
    let sdev = fs::metadata(existing)
        .map_err(|e| StoreError::io(ErrorKind::Store, "stat", existing, e))?
        .dev();
    if rdev != sdev {
        return Err(StoreError::refused(
            ErrorKind::Store,
            store,
            format!(
                "store '{}' is on another filesystem than ROOT '{}': versions are published by \
                 rename, which only stays atomic within one filesystem",
                store.display(),
                root.display()
            ),
        ));
    }
    // Asked, not tried: a probe file would be a write outside ROOT and the
    // store (G8). The kernel answers EROFS for a read-only mount too.
    sys::access_write(existing).map_err(|e| {
        if existing == store {
            StoreError::io(ErrorKind::Store, "write to store directory", existing, e)
        } else {
            // The store is yet to be made: name it, and the directory that
            // stops it.
            StoreError::refused(
                ErrorKind::Store,
                store,
                format!(
                    "store '{}' does not exist and cannot be made: '{}' is not writable ({e})",
                    store.display(),
                    existing.display()
                ),
            )
        }
    })?;
    Ok(())
}

/// Whether `dir` looks like a skillfs store: a `journal/` and a `LOCK`.
pub fn is_store(dir: &Path) -> bool {
    dir.join(JOURNAL).is_dir() && dir.join(LOCK).is_file()
}

/// Which root a store versions, as its `ROOT` file says: the path, and
/// the device and inode numbers of the directory.
#[derive(Debug, PartialEq, Eq)]
pub struct RootId {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
}

impl RootId {
    pub fn of(root: &Path) -> StoreResult<RootId> {
        let md =
            fs::metadata(root).map_err(|e| StoreError::io(ErrorKind::Root, "stat", root, e))?;
        Ok(RootId {
            path: root.to_path_buf(),
            dev: md.dev(),
            ino: md.ino(),
        })
    }

    /// `<dev> <ino>\n<path bytes>\n` (the path last: it may hold any byte
    /// but NUL).
    fn encode(&self) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let mut out = format!("{} {}\n", self.dev, self.ino).into_bytes();
        out.extend_from_slice(self.path.as_os_str().as_bytes());
        out.push(b'\n');
        out
    }

    fn decode(data: &[u8]) -> Option<RootId> {
        use std::os::unix::ffi::OsStrExt;
        let nl = data.iter().position(|b| *b == b'\n')?;
        let (head, rest) = (std::str::from_utf8(&data[..nl]).ok()?, &data[nl + 1..]);
        let (dev, ino) = head.split_once(' ')?;
        let path = rest.strip_suffix(b"\n")?;
        Some(RootId {
            path: PathBuf::from(std::ffi::OsStr::from_bytes(path)),
            dev: dev.parse().ok()?,
            ino: ino.parse().ok()?,
        })
    }

    /// Checks the store is `self`'s (one store per root): refused when the
    /// store names another root by both path and identity. `Ok(true)` when
    /// `ROOT` must be (re)written: missing (a store from before the file
    /// existed), or the root moved or was made again at the same path.
    pub fn check(&self, layout: &Layout) -> StoreResult<bool> {
        let path = layout.root_id();
        let data = fsutil::read_small(&path, 64 * 1024)
            .map_err(|e| StoreError::io(ErrorKind::Store, "read", &path, e))?;
        let Some(data) = data else {
            return Ok(true);
        };
        let Some(old) = RootId::decode(&data) else {
            return Err(StoreError::refused(
                ErrorKind::Store,
                &path,
                format!(
                    "'{}' does not name a root (expected '<dev> <ino>' then a path)",
                    path.display()
                ),
            ));
        };
        if old == *self {
            return Ok(false);
        }
        if old.path == self.path || (old.dev, old.ino) == (self.dev, self.ino) {
            return Ok(true);
        }
        // Say what to type: never to delete a file of the store (a store
        // rebound to another root would record every path as removed).
        let hint = match (old.path.parent(), old.path.file_name()) {
            (Some(p), Some(name)) if p == self.path => format!(
                "it versions '{}' inside it: mount with `--versioned {}` (or with no \
                 --versioned: the store remembers it)",
                name.to_string_lossy(),
                name.to_string_lossy()
            ),
            (Some(p), Some(name)) if Some(p) == self.path.parent() => format!(
                "mount with `--versioned {}`, or give another --store for '{}'",
                name.to_string_lossy(),
                self.path.display()
            ),
            _ => format!(
                "one store per root: give another --store for '{}'",
                self.path.display()
            ),
        };
        Err(StoreError::refused(
            ErrorKind::Store,
            &path,
            format!(
                "store '{}' versions ROOT '{}', not '{}': {hint}",
                layout.dir.display(),
                old.path.display(),
                self.path.display(),
            ),
        ))
    }

    /// The root a store's `ROOT` file names, if it names one.
    pub fn read(layout: &Layout) -> Option<RootId> {
        let data = fsutil::read_small(&layout.root_id(), 64 * 1024).ok()??;
        RootId::decode(&data)
    }

    /// Writes `ROOT` into the store held open as `top`, durably through
    /// `io`.
    pub fn write(&self, top: &Dir, io: &StoreIo) -> StoreResult<()> {
        let path = top.join(ROOT_ID);
        top.replace(ROOT_ID, &self.encode(), io)
            .map_err(|e| StoreError::io(ErrorKind::Store, "write", &path, e))
    }
}

/// Size in bytes of every regular file under `dir`.
///
/// A mounted store changes while it is walked (the janitor renames spares
/// from `tmp/` into `staging/`, publishes remove staging files): an entry
/// gone between its listing and its stat is skipped, not an error that
/// would make the whole size unknown.
pub fn disk_usage(dir: &Path) -> io::Result<u64> {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = match fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if gone(&e) && d != dir => continue,
            Err(e) => return Err(e),
        };
        for ent in rd {
            let ent = ent?;
            let md = match ent.metadata() {
                Ok(md) => md,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            };
            if md.is_dir() {
                stack.push(ent.path());
            } else {
                total += md.len();
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holder_of_the_flock_is_proven_the_daemon() {
        let d = std::env::temp_dir().join(format!("skillfs-lockproof-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let layout = Layout::new(d.clone());
        let fds = layout.create(StoreIo::real()).unwrap();
        assert_eq!(StoreLock::daemon(&layout), None, "no LOCK");
        let lock = StoreLock::acquire(&fds.top, &layout).unwrap();
        // This test process holds the flock and its comm starts with
        // "skillfs" (the test binary is skillfs-<hash>).
        assert_eq!(StoreLock::daemon(&layout), Some(std::process::id()));
        // Another pid written in LOCK proves nothing.
        fs::write(layout.lock(), "1\n").unwrap();
        assert!(StoreLock::is_held(&layout));
        assert_eq!(StoreLock::daemon(&layout), None);
        drop(lock);
        assert!(!StoreLock::is_held(&layout));
        assert_eq!(StoreLock::daemon(&layout), None, "nobody holds it");
        fs::remove_dir_all(&d).unwrap();
    }
}
