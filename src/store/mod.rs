//! The store: the durable truth about history, kept beside the skills root.
//!
//! On-disk layout (the one place it is written down):
//!
//! ```text
//! LOCK              flock held by the mounted daemon; holds its pid
//! journal/*.jsonl   append-only change records, one JSON object per line
//! blobs/ab/<sha256> immutable file contents, content-addressed (larger ones)
//! blobs/packs/<n>.pack  small contents, appended (see `packs`)
//! tmp/              blobs being written (renamed into blobs/ when complete)
//! staging/          copy-on-write scratch files of open writers, and empty
//!                   files made ahead of need (see `spares`)
//! parked/<key>/     hidden entries of the directory whose identity is <key>
//!                   (inode number and birth time: it survives renames)
//! orphans/          hidden entries whose directory was removed, kept until swept
//! config.json       hide rules and park age set for this store (optional)
//! RULES             the hide rules in force while mounted (for `status`)
//! daemon.log        the mounted daemon's log
//! ```
//!
//! Invariants: the store is outside the root and on the same filesystem
//! (renames between the two stay atomic); the journal and the blobs are the
//! only durable truth, everything else is rebuilt from them; `staging/` and
//! `tmp/` hold nothing of value once no daemon runs and are emptied at mount.

pub mod blobs;
pub mod durable;
pub mod journal;
pub mod packs;
pub mod spares;

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Exit, Failure};
use crate::sys;

pub const LOCK: &str = "LOCK";
pub const JOURNAL: &str = "journal";
pub const BLOBS: &str = "blobs";
pub const TMP: &str = "tmp";
pub const STAGING: &str = "staging";
pub const PARKED: &str = "parked";
pub const ORPHANS: &str = "orphans";
pub const RULES: &str = "RULES";
pub const LOG: &str = "daemon.log";

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

    /// Creates the directories of the layout (idempotent).
    pub fn create(&self) -> Result<(), Failure> {
        for d in [
            self.dir.clone(),
            self.journal(),
            self.blobs(),
            self.tmp(),
            self.staging(),
            self.parked(),
            self.orphans(),
        ] {
            fs::create_dir_all(&d)
                .map_err(|e| Failure::io(Exit::BadStore, "create store directory", &d, &e))?;
        }
        Ok(())
    }

    /// Removes what crashed writers left in `staging/` and `tmp/`: neither
    /// holds anything the journal refers to.
    pub fn clear_scratch(&self) -> Result<(), Failure> {
        for d in [self.staging(), self.tmp()] {
            let entries =
                fs::read_dir(&d).map_err(|e| Failure::io(Exit::BadStore, "list", &d, &e))?;
            for ent in entries.flatten() {
                let p = ent.path();
                // Spare directories are empty: a plain rmdir suffices.
                if fs::remove_file(&p).is_err() {
                    let _ = fs::remove_dir(&p);
                }
            }
        }
        Ok(())
    }
}

/// The exclusive lock of a mounted store; released when dropped (or when the
/// daemon dies, which is why it is an flock and not a pid file).
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    pub fn acquire(layout: &Layout) -> Result<StoreLock, Failure> {
        let path = layout.lock();
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Failure::io(Exit::BadStore, "open lock file", &path, &e))?;
        let got = sys::try_lock_exclusive(&file)
            .map_err(|e| Failure::io(Exit::BadStore, "lock", &path, &e))?;
        if !got {
            let holder = fs::read_to_string(&path).unwrap_or_default();
            return Err(Failure::new(
                Exit::BadStore,
                format!(
                    "store '{}' is in use by another skillfs daemon (pid {}): one mount per store",
                    layout.dir.display(),
                    holder.trim()
                ),
            ));
        }
        file.set_len(0)
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(|e| Failure::io(Exit::BadStore, "write", &path, &e))?;
        Ok(StoreLock { _file: file })
    }

    /// The pid written by the daemon holding the lock, if one holds it.
    pub fn holder(layout: &Layout) -> Option<u32> {
        let path = layout.lock();
        let file = File::open(&path).ok()?;
        if sys::try_lock_exclusive(&file).ok()? {
            return None; // nobody holds it (our probe lock drops with `file`)
        }
        fs::read_to_string(&path).ok()?.trim().parse().ok()
    }
}

/// Checks the store may serve `root`: outside it, on the same filesystem,
/// writable. `root` must be canonical; `store` is the store as it will be
/// (canonical, possibly not yet created) and `existing` its deepest existing
/// ancestor (itself once created).
pub fn check_placement(root: &Path, store: &Path, existing: &Path) -> Result<(), Failure> {
    if store.starts_with(root) {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "store '{}' is inside ROOT '{}': it must live outside the tree it versions",
                store.display(),
                root.display()
            ),
        ));
    }
    let rdev = fs::metadata(root)
        .map_err(|e| Failure::io(Exit::BadRoot, "stat", root, &e))?
        .dev();
    let sdev = fs::metadata(existing)
        .map_err(|e| Failure::io(Exit::BadStore, "stat", existing, &e))?
        .dev();
    if rdev != sdev {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "store '{}' is on another filesystem than ROOT '{}': versions are published by \
                 rename, which only stays atomic within one filesystem",
                store.display(),
                root.display()
            ),
        ));
    }
    let probe = existing.join(format!(".skillfs-write-probe.{}", std::process::id()));
    File::create(&probe)
        .and_then(|_| fs::remove_file(&probe))
        .map_err(|e| Failure::io(Exit::BadStore, "write to store directory", existing, &e))?;
    Ok(())
}

/// Size in bytes of every regular file under `dir`.
pub fn disk_usage(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for ent in fs::read_dir(&d)? {
            let ent = ent?;
            let md = ent.metadata()?;
            if md.is_dir() {
                stack.push(ent.path());
            } else {
                total += md.len();
            }
        }
    }
    Ok(total)
}
