//! The versioning state of the mount: the ledger (the journal and its
//! fold: catalog and history), its group commit, and what runs one at a
//! time over them (a `forget`, the checkpoint at unmount).
//!
//! Owns: `Versioning`, whose methods take the ledger's lock and the group
//! commit's in the one order the commit needs: the commit is entered
//! (`sync_through`, `write_out_then`, `sync_all`) without the ledger's
//! lock, and takes it inside only briefly, on its own. The blob store is
//! the caller's (`SkillFs::blobs`), passed in.
//! Locks: `ledger` is taken last of the core's locks (after `namespace`,
//! `tree`, the open files, an `OpenFile`), and never held into the group
//! commit, nor while waiting for the blob store's writing gate (see
//! `SkillFs`'s lock order); `forgetting` is held for a whole `forget` and
//! taken before everything else.

use super::*;

pub(super) struct Versioning {
    ledger: Mutex<Ledger>,
    /// Syncs the journal outside `ledger`'s lock (see
    /// `ledger::GroupCommit`).
    commit: GroupCommit,
    /// Held for a whole `forget` (one at a time; see `retention`).
    forgetting: Mutex<()>,
    /// The last id a checkpoint was written for (see `shutdown`).
    checkpointed: Checkpointed,
}

impl Versioning {
    pub(super) fn new(ledger: Ledger) -> Versioning {
        Versioning {
            commit: GroupCommit::new(ledger.durable_through()),
            ledger: Mutex::new(ledger),
            forgetting: Mutex::new(()),
            checkpointed: Checkpointed::default(),
        }
    }

    /// The ledger, locked (last of the core's locks; let go of before the
    /// group commit).
    pub(super) fn ledger(&self) -> parking_lot::MutexGuard<'_, Ledger> {
        self.ledger.lock()
    }

    /// The ledger's lock itself, for the borrowers that take it briefly on
    /// their own (the `.history` view, `forget`).
    pub(super) fn ledger_lock(&self) -> &Mutex<Ledger> {
        &self.ledger
    }

    /// Returns once every record up to `seq` is durable (group commit;
    /// called without the ledger's lock).
    pub(super) fn sync_through(&self, blobs: &BlobStore, seq: u64) -> std::io::Result<()> {
        self.commit.sync_through(&self.ledger, blobs, seq)
    }

    /// Makes every record appended so far durable.
    pub(super) fn sync_all(&self, blobs: &BlobStore) -> std::io::Result<()> {
        let want = self.ledger.lock().last_seq();
        self.sync_through(blobs, want)
    }

    /// The one-commit durability point (see `GroupCommit::write_out_then`;
    /// called without the ledger's lock).
    pub(super) fn write_out_then(
        &self,
        blobs: &BlobStore,
        commit: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.commit.write_out_then(&self.ledger, blobs, commit)
    }

    /// Held for a whole `forget`: one at a time.
    pub(super) fn forgetting(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.forgetting.lock()
    }

    /// Whether the checkpoint of the journal synced through `last` is
    /// owed (see `Checkpointed::owed`).
    pub(super) fn checkpoint_owed(&self, last: u64) -> bool {
        self.checkpointed
            .owed(last, skillfs_model::checkpoint::min_records())
    }
}

/// The last record id a checkpoint was written for: one is written at an
/// unmount only for a journal long enough to be worth it, and not twice
/// for one id.
#[derive(Default)]
pub(super) struct Checkpointed(AtomicU64);

impl Checkpointed {
    /// Whether a checkpoint through `last` is owed (at least `min`
    /// records, and none written through `last` yet); remembers `last`
    /// either way.
    fn owed(&self, last: u64, min: u64) -> bool {
        let before = self.0.swap(last, Ordering::SeqCst);
        last >= min && last != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_owed_once_per_id_and_only_past_the_minimum() {
        let c = Checkpointed::default();
        assert!(!c.owed(5, 10), "too short a journal");
        assert!(c.owed(10, 10));
        assert!(!c.owed(10, 10), "written through 10 already");
        assert!(c.owed(11, 10));
        // (An id seen below the minimum is remembered too.)
        assert!(!c.owed(3, 10));
        assert!(c.owed(11, 10));
    }
}
