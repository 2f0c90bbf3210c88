//! Blobs stored without `durable`, until they are made durable: the list
//! of pending blobs and the syncs that empty it.
//!
//! Invariants: a blob is pending before it is visible: a pack entry's pack
//! is made pending before the entry is in the packs' index
//! (`Packs::append_noting`), so that any writer who finds it there and
//! deduplicates onto it has it synced by the durability point that makes
//! its record durable; blobs written without `durable` are remembered until
//! [`BlobStore::sync_pending`] makes them durable (or the caller's `fsync`
//! commits what [`BlobStore::write_out_pending`] wrote out), which must
//! happen before any journal record naming them is made durable (the
//! durability order of docs/design.md: blob, then journal record, then live
//! file); what a failed sync or commit leaves stays pending, so a later one
//! retries; a loose blob whose content a sync made durable is marked so
//! ([`super::DURABLE_MTIME`]).
//!
//! Locks: `sync_lock` (one sync or write-out of the pending blobs at a
//! time) is taken before `unsynced`; both are leaves below the core's
//! `ledger` and open-file locks.

use std::fs::File;
use std::io;
use std::path::PathBuf;

use super::{BlobStore, mark_durable, raw_id};
use crate::packs::PACKS;

/// Past this many pending blobs one `syncfs` beats one `fsync` each.
const MANY: usize = 64;

/// What a durability point must still sync, named within the held
/// `blobs/` directory (never by path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// A loose blob, `blobs/ab/<id>`.
    Loose(String),
    /// A fan-out directory just made, `blobs/ab/` (its entry in `blobs/`).
    Fan(String),
    /// Pack `n`, `blobs/packs/<n>.zpack` (or an earlier build's `.pack`).
    Pack(u32),
    /// The entry of a new pack in `blobs/packs/` (and of a new `packs/` in
    /// `blobs/`).
    PacksDir,
}

impl BlobStore {
    /// Makes `id` part of the next durability point, even though it was
    /// found already stored (deduplicated).
    pub fn mark_pending(&self, id: &str) {
        let raw = raw_id(id);
        let p = raw
            .and_then(|raw| self.packs.pack_of(&raw))
            .map_or_else(|| Pending::Loose(id.to_string()), Pending::Pack);
        // A chunked content is durable with its chunks.
        let mut all = raw.map(|r| self.chunk_packs(&r)).unwrap_or_default();
        all.push(p);
        let mut pending = self.unsynced.lock();
        for p in all {
            if !pending.contains(&p) {
                pending.push(p);
            }
        }
    }

    /// Where a pending file or directory is (for messages).
    fn pending_path(&self, p: &Pending) -> PathBuf {
        match p {
            Pending::Loose(id) => self.path(id),
            Pending::Fan(fan) => self.dir.join(fan),
            Pending::Pack(n) => self.packs.path(*n),
            Pending::PacksDir => self.dir.join(PACKS),
        }
    }

    /// Opens a pending file (a loose blob or a pack); `None` for a
    /// directory.
    fn open_pending(&self, p: &Pending) -> Option<io::Result<File>> {
        match p {
            Pending::Loose(id) => Some(self.open_loose(id)),
            Pending::Pack(n) => Some(self.packs.open_pack(*n)),
            Pending::Fan(_) | Pending::PacksDir => None,
        }
    }

    /// Splits `pending` into what is in place and the loose blobs not yet
    /// renamed into place: a blob is pending before it is visible (see
    /// `install`), so a sync can meet one whose store is still under way.
    /// Nothing durable can name such a blob yet (its record is appended
    /// after the rename, so after the durability point that met it
    /// began), and it stays pending for the sync that covers that record.
    /// (Checked under `sync_lock`, before the sync: a `syncfs` then covers
    /// every blob found here.)
    fn placed(&self, pending: Vec<Pending>) -> (Vec<Pending>, Vec<Pending>) {
        pending.into_iter().partition(|p| match p {
            Pending::Loose(id) => !matches!(
                self.fan(id).and_then(|f| f.lstat(id)),
                Err(e) if e.kind() == io::ErrorKind::NotFound
            ),
            _ => true,
        })
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
        let (pending, not_yet) = self.placed(pending);
        if pending.len() > MANY {
            let r = self.sync_all(pending);
            self.unsynced.lock().extend(not_yet);
            return r;
        }
        // The directories whose entries must be made durable: fan-out
        // directories (of loose blobs), and `blobs/` (of a new fan-out
        // directory or `packs/`). A pack's own entry is synced once, when
        // it is new (then `PacksDir` is pending).
        let mut fans: Vec<&str> = Vec::new();
        let mut blobs_dir = false;
        let result = (|| {
            for p in &pending {
                match p {
                    Pending::Loose(id) | Pending::Fan(id) => {
                        let fan = &id[..2];
                        if matches!(p, Pending::Fan(_)) {
                            self.io.sync_dir(&self.dir.sub(fan)?)?;
                            blobs_dir = true;
                            continue;
                        }
                        let f = self.open_loose(id)?;
                        self.io.sync_all(&f, &self.path(id))?;
                        mark_durable(&f);
                        if !fans.contains(&fan) {
                            fans.push(fan);
                        }
                    }
                    Pending::Pack(n) => {
                        let f = match self.packs.open_pack(*n) {
                            // Rewritten by a prune since it was marked: its
                            // entries were synced in their new pack before
                            // it was removed.
                            Err(e)
                                if e.kind() == io::ErrorKind::NotFound && !self.packs.holds(*n) =>
                            {
                                continue;
                            }
                            r => r?,
                        };
                        self.io.sync_all(&f, &self.packs.path(*n))?;
                    }
                    Pending::PacksDir => {
                        if let Some(d) = self.packs.opened_dir() {
                            self.io.sync_dir(&d)?;
                        }
                        blobs_dir = true;
                    }
                }
            }
            for fan in &fans {
                self.io.sync_dir(&self.dir.sub(fan)?)?;
            }
            if blobs_dir {
                self.io.sync_dir(&self.dir)?;
            }
            Ok(())
        })();
        self.unsynced.lock().extend(not_yet);
        if result.is_err() {
            // Keep them pending so a later sync retries.
            self.unsynced.lock().extend(pending);
        } else if pending.contains(&Pending::PacksDir) {
            // A new pack's directory entry is durable now: not again.
            let packs: Vec<u32> = pending
                .iter()
                .filter_map(|p| match p {
                    Pending::Pack(n) => Some(*n),
                    _ => None,
                })
                .collect();
            self.packs.mark_dir_synced(&packs);
        }
        result
    }

    fn sync_all(&self, pending: Vec<Pending>) -> io::Result<()> {
        let r = self.io.syncfs(self.dir.file(), self.dir.path());
        if r.is_err() {
            self.unsynced.lock().extend(pending);
        } else {
            for p in &pending {
                if let Pending::Loose(id) = p
                    && let Ok(f) = self.open_loose(id)
                {
                    mark_durable(&f);
                }
            }
        }
        r
    }

    /// Writes out the data of every pending blob and waits for it, without
    /// the commit: the caller's one `fsync` afterwards makes them durable
    /// (on a filesystem with an ordered commit, see `sys::has_ordered_commit`).
    /// Until that succeeds they stay pending.
    pub fn write_out_pending(&self) -> io::Result<Vec<Pending>> {
        let _one = self.sync_lock.lock();
        self.io.check()?;
        let pending = std::mem::take(&mut *self.unsynced.lock());
        let (pending, not_yet) = self.placed(pending);
        self.unsynced.lock().extend(not_yet);
        if pending.len() > MANY {
            self.sync_all(pending)?;
            return Ok(Vec::new());
        }
        for p in &pending {
            // A directory: metadata, in the commit.
            let Some(opened) = self.open_pending(p) else {
                continue;
            };
            let opened = match (p, opened) {
                // Rewritten by a prune since it was marked (as in
                // `sync_pending`).
                (Pending::Pack(n), Err(e))
                    if e.kind() == io::ErrorKind::NotFound && !self.packs.holds(*n) =>
                {
                    continue;
                }
                (_, opened) => opened,
            };
            if let Err(e) = opened.and_then(|f| self.io.write_out(&f, &self.pending_path(p))) {
                self.unsynced.lock().extend(pending.iter().cloned());
                return Err(e);
            }
        }
        Ok(pending)
    }

    /// Puts back blobs whose commit failed.
    pub fn restore_pending(&self, pending: Vec<Pending>) {
        self.unsynced.lock().extend(pending);
    }
}
