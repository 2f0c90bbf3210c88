//! Blobs stored without `durable`, until they are made durable: the list
//! of pending blobs and the syncs that empty it.
//!
//! Invariants: a blob is pending before it is visible under its final name
//! (see `install`), so a durable writer that finds it by name syncs it
//! first; blobs written without `durable` are remembered until
//! [`BlobStore::sync_pending`] makes them durable (or the caller's `fsync`
//! commits what [`BlobStore::write_out_pending`] wrote out), which must
//! happen before any journal record naming them is made durable (the
//! durability order of DESIGN.md: blob, then journal record, then live
//! file); what a failed sync or commit leaves stays pending, so a later one
//! retries; a loose blob whose content a sync made durable is marked so
//! ([`super::DURABLE_MTIME`]).
//!
//! Locks: `sync_lock` (one sync or write-out of the pending blobs at a
//! time) is taken before `unsynced`; both are leaves below the core's
//! `ledger` and open-file locks.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::{BlobStore, mark_durable, raw_id};

/// Past this many pending blobs one `syncfs` beats one `fsync` each.
const MANY: usize = 64;

impl BlobStore {
    /// Makes `id` part of the next durability point, even though it was
    /// found already stored (deduplicated).
    pub fn mark_pending(&self, id: &str) {
        let p = raw_id(id)
            .and_then(|raw| self.packs.pack_of(&raw))
            .unwrap_or_else(|| self.path(id));
        let mut pending = self.unsynced.lock();
        if !pending.contains(&p) {
            pending.push(p);
        }
    }

    /// Makes every blob stored without `durable` durable (file data, then the
    /// directory entries naming it).
    pub fn sync_pending(&self) -> io::Result<()> {
        // One sync at a time: a second caller must not return while the
        // first is still flushing blobs the second depends on.
        let _one = self.sync_lock.lock();
        self.io.check()?;
        let pending = std::mem::take(&mut *self.unsynced.lock());
        if pending.is_empty() {
            return Ok(());
        }
        if pending.len() > MANY {
            return self.sync_all(pending);
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        let result = (|| {
            for p in &pending {
                let f = File::open(p)?;
                self.io.sync_all(&f, p)?;
                if self.is_loose(p) {
                    mark_durable(&f);
                }
                // A pack's own directory entry is synced once, when it is
                // new (then the directory itself is pending).
                if let Some(parent) = p.parent()
                    && parent != self.packs.dir()
                    && !dirs.iter().any(|d| d == parent)
                {
                    dirs.push(parent.to_path_buf());
                }
            }
            for d in &dirs {
                self.io.sync_dir(d)?;
            }
            Ok(())
        })();
        if result.is_err() {
            // Keep them pending so a later sync retries.
            self.unsynced.lock().extend(pending);
        } else if pending.iter().any(|p| p == self.packs.dir()) {
            // A new pack's directory entry is durable now: not again.
            self.packs.mark_dir_synced(&pending);
        }
        result
    }

    fn sync_all(&self, pending: Vec<PathBuf>) -> io::Result<()> {
        let r = File::open(&self.dir).and_then(|d| self.io.syncfs(&d, &self.dir));
        if r.is_err() {
            self.unsynced.lock().extend(pending);
        } else {
            for p in pending.iter().filter(|p| self.is_loose(p)) {
                if let Ok(f) = File::open(p) {
                    mark_durable(&f);
                }
            }
        }
        r
    }

    /// `blobs/ab/<hex>` (not a pack, not a directory).
    fn is_loose(&self, p: &Path) -> bool {
        p.parent().and_then(Path::parent) == Some(&self.dir) && p.parent() != Some(self.packs.dir())
    }

    /// Writes out the data of every pending blob and waits for it, without
    /// the commit: the caller's one `fsync` afterwards makes them durable
    /// (on a filesystem with an ordered commit, see `sys::has_ordered_commit`).
    /// Until that succeeds they stay pending.
    pub fn write_out_pending(&self) -> io::Result<Vec<PathBuf>> {
        let _one = self.sync_lock.lock();
        self.io.check()?;
        let pending = std::mem::take(&mut *self.unsynced.lock());
        if pending.len() > MANY {
            self.sync_all(pending)?;
            return Ok(Vec::new());
        }
        for p in &pending {
            if p.is_dir() {
                continue; // a fan-out directory: metadata, in the commit
            }
            if let Err(e) = File::open(p).and_then(|f| self.io.write_out(&f, p)) {
                self.unsynced.lock().extend(pending.iter().cloned());
                return Err(e);
            }
        }
        Ok(pending)
    }

    /// Puts back blobs whose commit failed.
    pub fn restore_pending(&self, pending: Vec<PathBuf>) {
        self.unsynced.lock().extend(pending);
    }
}
