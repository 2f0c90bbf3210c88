//! `Ledger`: the one door through which changes are recorded, the journal
//! kept in step with its fold (`catalog::Fold`: the current state of every
//! versioned path and the history index); `GroupCommit`: making records
//! durable outside the ledger's lock.
//!
//! Invariants: a record is applied to the fold in the same critical section
//! that appends it (the ledger's mutex, held by the caller), so the journal,
//! the catalog and the history index never disagree; a record is durable
//! only after every blob it names (see `sync` and `GroupCommit`).
//! A removal held back (`defer`) is appended before any record that names
//! its path, a path above it or below it, so the journal never says a
//! thing about that path out of order; until then (at most
//! `DEFER_MAX`, see `flush_deferred`) the catalog still holds the path.
//!
//! Locks: the `Ledger` lives behind the core's `ledger` mutex; the
//! committer's own state is never held while taking it (see `GroupCommit`).

// The daemon answers errors, never unwraps them (tests may; see clippy.toml).
#![deny(clippy::unwrap_used)]

use std::io;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use crate::catalog::Catalog;
use crate::catalog::Fold;
use crate::history::HistoryIndex;
use skillfs_base::relpath::RelPath;
use skillfs_store::blobs::BlobStore;
use skillfs_store::journal::{Actor, Change, Journal, Record};

/// How long a held-back removal waits for a new file at its path (an
/// editor renames the original to its backup name and writes the new one
/// within microseconds; a person's `mv` and `cp` within seconds).
pub const DEFER_MAX: Duration = Duration::from_secs(2);

/// The journal and what it implies (the catalog of current states and the
/// history index), kept in step.
/// Group commit: makes records durable without holding the ledger's lock
/// across the device flush, one flush for every record appended before it
/// started.
///
/// Invariants: `durable` only grows, and every record up to it was synced
/// (with every blob stored before it: a blob is marked pending before its
/// record is appended, and the leader syncs the pending blobs before the
/// journal). At most one thread (the leader) syncs at a time; the others
/// wait for it, and one whose record it did not cover leads the next sync.
/// Lock order: the committer's state, never held while taking the ledger.
pub struct GroupCommit {
    state: Mutex<CommitState>,
    synced: Condvar,
    /// Held across each flush or write-out of the journal file: the kernel
    /// reports a failed write-back once per open file, so two at a time
    /// could let the second one miss the error and call its records
    /// durable. Each checks the poison flag once it holds this.
    journal_io: Mutex<()>,
}

struct CommitState {
    durable: u64,
    leader: bool,
}

impl GroupCommit {
    /// For a journal whose records up to `durable` are durable.
    pub fn new(durable: u64) -> GroupCommit {
        GroupCommit {
            state: Mutex::new(CommitState {
                durable,
                leader: false,
            }),
            synced: Condvar::new(),
            journal_io: Mutex::new(()),
        }
    }

    /// Returns once every record up to `seq` (and every blob stored before
    /// it) is durable. Fails with the errno of a failed sync (the store is
    /// then poisoned until remount).
    pub fn sync_through(
        &self,
        ledger: &Mutex<Ledger>,
        blobs: &BlobStore,
        seq: u64,
    ) -> io::Result<()> {
        let mut st = self.state.lock();
        loop {
            if st.durable >= seq {
                return Ok(());
            }
            if !st.leader {
                break;
            }
            self.synced.wait(&mut st);
        }
        st.leader = true;
        drop(st);
        let synced = (|| {
            let (file, path, target, io) = {
                let l = ledger.lock();
                l.journal.io().check()?;
                let (file, path, target) = l.journal.sync_target();
                (file, path, target, l.journal.io().clone())
            };
            blobs.sync_pending()?;
            {
                let _one = self.journal_io.lock();
                io.check()?;
                io.sync_data(&file, &path)?;
            }
            ledger.lock().journal.mark_durable(target);
            Ok(target)
        })();
        let mut st = self.state.lock();
        st.leader = false;
        if let Ok(t) = synced {
            st.durable = st.durable.max(t);
        }
        self.synced.notify_all();
        drop(st);
        synced.map(drop)
    }

    /// The one-commit durability point (ext4 with a journal, XFS), outside
    /// the ledger's lock: every pending blob and the journal are written
    /// out (waited for, not committed) in that order, then `commit` (the
    /// caller's `fsync` of the file whose replacement the records describe)
    /// commits them all with its own metadata. Every record appended before
    /// the write-out began is durable when it returns. Write-outs of blobs
    /// are one at a time (`BlobStore::write_out_pending`), so a blob taken
    /// by another caller's write-out is on disk before this commit.
    pub fn write_out_then(
        &self,
        ledger: &Mutex<Ledger>,
        blobs: &BlobStore,
        commit: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let (file, path, target, io) = {
            let l = ledger.lock();
            l.journal.io().check()?;
            let (file, path, target) = l.journal.sync_target();
            (file, path, target, l.journal.io().clone())
        };
        let pending = blobs.write_out_pending()?;
        let written = {
            let _one = self.journal_io.lock();
            io.check().and_then(|()| io.write_out(&file, &path))
        };
        let committed = written.and_then(|()| {
            // A commit that fails to write (EIO) may have had its pages
            // marked clean without being on disk: no later sync could be
            // trusted. (`commit` also renames, and a rename's ENOSPC writes
            // nothing; its own fsync poisons through the store's io.)
            commit().inspect_err(|e| {
                if e.raw_os_error() == Some(libc::EIO) {
                    io.poison("commit", &path, e)
                }
            })
        });
        // A failure another caller met meanwhile (it poisons first) may
        // have been on pages this commit counted on.
        match committed.and_then(|()| io.check()) {
            Ok(()) => {
                ledger.lock().journal.mark_durable(target);
                let mut st = self.state.lock();
                st.durable = st.durable.max(target);
                self.synced.notify_all();
                Ok(())
            }
            Err(e) => {
                blobs.restore_pending(pending);
                Err(e)
            }
        }
    }
}

pub struct Ledger {
    journal: Journal,
    fold: Fold,
    /// Removals held back, oldest first (see `defer`).
    deferred: Vec<Deferred>,
}

/// A removal from the versioned tree whose record waits (see
/// [`Ledger::defer`]).
struct Deferred {
    change: Change,
    actor: Actor,
    since: Instant,
}

/// Whether `a` and `b` are one path, or one lies below the other.
fn overlap(a: &RelPath, b: &RelPath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

impl Ledger {
    /// `records` are the journal's, as read before opening it.
    pub fn new(journal: Journal, records: &[Record]) -> Ledger {
        Ledger {
            journal,
            fold: Fold::replay(records),
            deferred: Vec::new(),
        }
    }

    /// [`Ledger::new`] of records given away (a mount's: folded once, then
    /// not needed), on the index of a checkpoint if there is one.
    pub fn from_records(
        journal: Journal,
        base: Option<crate::history::HistoryIndex>,
        records: Vec<Record>,
    ) -> Ledger {
        Ledger {
            journal,
            fold: crate::checkpoint::fold(base, records),
            deferred: Vec::new(),
        }
    }

    /// Writes the checkpoint of this ledger's fold into the journal's
    /// directory `dir` (at unmount, once synced), through the journal's
    /// door.
    pub fn checkpoint(&self, dir: &skillfs_store::Dir) -> io::Result<()> {
        let (file, len) = self.journal.segment();
        let name = self
            .journal
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let io = self.journal.io();
        crate::checkpoint::write(dir, io, self.fold.history(), &name, file, len)
    }

    pub fn catalog(&self) -> &Catalog {
        self.fold.catalog()
    }

    pub fn history(&self) -> &HistoryIndex {
        self.fold.history()
    }

    pub fn history_mut(&mut self) -> &mut HistoryIndex {
        self.fold.history_mut()
    }

    pub fn next_seq(&self) -> u64 {
        self.journal.next_seq()
    }

    /// The highest sequence number known durable.
    pub fn durable_through(&self) -> u64 {
        self.journal.durable_through()
    }

    /// Room for the next records (see `Journal::ensure_room`).
    pub fn ensure_room(&mut self) -> io::Result<()> {
        self.journal.ensure_room()
    }

    /// The sequence number of the last record appended (0 for none).
    pub fn last_seq(&self) -> u64 {
        self.journal.next_seq() - 1
    }

    /// Appends `change` and applies it. The caller has already made every
    /// blob the change names exist (durably, if the record is to be).
    pub fn record(&mut self, change: Change, actor: Actor) -> io::Result<Record> {
        self.record_at(change, actor, skillfs_base::time::now_ns())
    }

    /// [`Ledger::record`] of a change made at `ts`, not now (the agent's
    /// own history, imported by the application's `import`).
    pub fn record_at(&mut self, change: Change, actor: Actor, ts: i64) -> io::Result<Record> {
        if !self.deferred.is_empty() {
            let names = |d: &Deferred| {
                overlap(&d.change.path, &change.path)
                    || change
                        .to
                        .as_ref()
                        .is_some_and(|t| overlap(&d.change.path, t))
            };
            self.append_deferred(names)?;
        }
        self.append(change, actor, ts)
    }

    fn append(&mut self, change: Change, actor: Actor, ts: i64) -> io::Result<Record> {
        let rec = self.journal.append(change, actor, ts)?;
        self.fold.apply(&rec);
        Ok(rec)
    }

    /// Holds back `change`, the removal of one file from the versioned
    /// tree by a rename to a name that is not versioned (an editor's
    /// backup: vim and emacs rename `SKILL.md` to `SKILL.md~`, JetBrains
    /// to `SKILL.md___jb_old___`), because a new file at its path usually
    /// follows at once: then [`Ledger::resume`] drops it and the new
    /// file's content is the next version of the same path, not a removal
    /// and a creation. Nothing is lost meanwhile: the old content is the
    /// path's last version. It is appended (as made now) before any record
    /// that names its path, above or below it, and by `flush_deferred`.
    /// A crash loses it; the next mount's scan finds the path gone and
    /// records that.
    pub fn defer(&mut self, change: Change, actor: Actor) {
        let path = change.path.clone();
        if let Err(e) = self.append_deferred(|d| d.change.path == path) {
            tracing::error!("could not journal a removal held back: {e}");
        }
        self.deferred.push(Deferred {
            change,
            actor,
            since: Instant::now(),
        });
    }

    /// A versioned entry is at `path` again: a removal of it held back is
    /// dropped, unrecorded. Whether there was one.
    pub fn resume(&mut self, path: &RelPath) -> bool {
        let before = self.deferred.len();
        self.deferred.retain(|d| d.change.path != *path);
        self.deferred.len() != before
    }

    /// Appends the removals held back for `older_than` or longer (all of
    /// them for zero: at unmount).
    pub fn flush_deferred(&mut self, older_than: Duration) -> io::Result<()> {
        self.append_deferred(|d| d.since.elapsed() >= older_than)
    }

    /// Appends the held-back removals `which` picks, in the order they
    /// were made. One that fails stays held (tried again later).
    fn append_deferred(&mut self, which: impl Fn(&Deferred) -> bool) -> io::Result<()> {
        let mut i = 0;
        while i < self.deferred.len() {
            if !which(&self.deferred[i]) {
                i += 1;
                continue;
            }
            let d = &self.deferred[i];
            let (change, actor) = (d.change.clone(), d.actor.clone());
            self.append(change, actor, skillfs_base::time::now_ns())?;
            self.deferred.remove(i);
        }
        Ok(())
    }

    /// Durability point: every blob stored so far, then every record.
    /// Fails with `EIO` once any durable sync of the store has failed (the
    /// store is poisoned until remount, see `store::durable`).
    pub fn sync(&mut self, blobs: &BlobStore) -> io::Result<()> {
        self.journal.io().check()?;
        blobs.sync_pending()?;
        self.journal.sync()
    }

    /// The first half of a single-commit durability point: blobs, then
    /// records, written out in that order; `commit` is the caller's `fsync`
    /// of the file whose replacement they describe, which commits them all.
    pub fn write_out_then(
        &mut self,
        blobs: &BlobStore,
        commit: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        self.journal.io().check()?;
        let pending = blobs.write_out_pending()?;
        let r = self.journal.write_out().and_then(|()| {
            // The commit of the blobs and records written out above: if it
            // fails to write (EIO), their pages may have been marked clean
            // without being on disk, so no later sync could be trusted to
            // write them. `commit` also renames, and a rename's ENOSPC
            // writes nothing; its own fsync goes through the store's io and
            // poisons by itself on any failure.
            let path = self.journal.path().to_path_buf();
            commit().inspect_err(|e| {
                if e.raw_os_error() == Some(libc::EIO) {
                    self.journal.io().poison("commit", &path, e)
                }
            })
        });
        match r {
            Ok(()) => {
                self.journal.mark_synced();
                Ok(())
            }
            Err(e) => {
                blobs.restore_pending(pending);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillfs_base::relpath::RelPath;
    use skillfs_store::journal::Op;

    /// A disk whose syncs fail while `fail` is set.
    struct Flaky {
        fail: std::sync::atomic::AtomicBool,
    }

    impl Flaky {
        fn answer(&self, real: io::Result<()>) -> io::Result<()> {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            real
        }
    }

    impl skillfs_store::durable::SyncBackend for Flaky {
        fn sync_data(&self, f: &std::fs::File) -> io::Result<()> {
            self.answer(skillfs_base::sys::fdatasync(f))
        }
        fn sync_all(&self, f: &std::fs::File) -> io::Result<()> {
            self.answer(skillfs_base::sys::fsync(f))
        }
        fn sync_dir(&self, d: &std::fs::File, _path: &std::path::Path) -> io::Result<()> {
            self.answer(skillfs_base::sys::fsync(d))
        }
        fn syncfs(&self, f: &std::fs::File) -> io::Result<()> {
            self.answer(skillfs_base::sys::syncfs(f))
        }
        fn write_out(&self, f: &std::fs::File) -> io::Result<()> {
            self.answer(skillfs_base::sys::write_out(f))
        }
    }

    #[test]
    fn a_failed_sync_poisons_the_store_until_remount() {
        use skillfs_store::durable::StoreIo;
        use skillfs_store::{Layout, journal};
        use std::sync::Arc;
        use std::sync::atomic::Ordering;

        let d = std::env::temp_dir().join(format!("skillfs-poison-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let layout = Layout::new(d.clone());
        layout.create(StoreIo::real()).unwrap();
        let disk = Arc::new(Flaky { fail: false.into() });
        let open = |io: &StoreIo| {
            let contents = journal::read_dir(&layout.journal()).unwrap();
            let j = Journal::open_with(&contents, io.clone()).unwrap();
            let blobs = BlobStore::open_path(&layout.blobs(), io.clone()).unwrap();
            (Ledger::new(j, &contents.records), blobs)
        };
        let change = |p: &str| Change::new(Op::Unlink, RelPath::parse(p.as_bytes()).unwrap(), None);
        let io = StoreIo::with_backend(disk.clone());
        let (mut ledger, blobs) = open(&io);
        ledger.record(change("a"), Actor::daemon()).unwrap();
        ledger.sync(&blobs).unwrap();

        disk.fail.store(true, Ordering::SeqCst);
        ledger.record(change("b"), Actor::daemon()).unwrap();
        assert!(ledger.sync(&blobs).is_err());
        disk.fail.store(false, Ordering::SeqCst);
        // The disk answers again, but what failed to write may be gone.
        assert!(io.is_poisoned());
        let e = ledger.sync(&blobs).unwrap_err();
        // (The core answers it with EIO: `skillfs_core::error`'s tests.)
        assert!(
            e.get_ref()
                .is_some_and(|i| i.is::<skillfs_store::durable::PoisonedError>()),
            "{e}"
        );
        // Work that promises no durability goes on; durable work does not.
        ledger.record(change("c"), Actor::daemon()).unwrap();
        blobs.put_bytes(b"not durable", false).unwrap();
        let src = d.join("src");
        std::fs::write(&src, b"durable").unwrap();
        assert!(
            blobs
                .put_file(&std::fs::File::open(&src).unwrap(), true)
                .is_err()
        );
        assert!(ledger.write_out_then(&blobs, || Ok(())).is_err());
        drop((ledger, blobs));

        // A remount starts afresh.
        let io = StoreIo::with_backend(disk.clone());
        let (mut ledger, blobs) = open(&io);
        assert_eq!(ledger.next_seq(), 4);
        // A single-commit durability point whose commit fails to write
        // poisons too; one that fails otherwise (a rename) does not.
        ledger.record(change("d"), Actor::daemon()).unwrap();
        let enoent =
            ledger.write_out_then(&blobs, || Err(io::Error::from_raw_os_error(libc::ENOENT)));
        assert!(enoent.is_err() && !io.is_poisoned());
        ledger.sync(&blobs).unwrap();
        ledger.record(change("e"), Actor::daemon()).unwrap();
        let eio = ledger.write_out_then(&blobs, || Err(io::Error::from_raw_os_error(libc::EIO)));
        assert!(eio.is_err() && io.is_poisoned());
        assert!(ledger.sync(&blobs).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A removal held back is dropped by `resume`, and otherwise appended
    /// before the first record that names its path (or one above or below
    /// it), after records of other paths, or once it is old enough.
    #[test]
    fn a_removal_held_back_keeps_the_journal_in_order() {
        use skillfs_store::durable::StoreIo;
        use skillfs_store::{Layout, journal};

        let d = std::env::temp_dir().join(format!("skillfs-defer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let layout = Layout::new(d.clone());
        layout.create(StoreIo::real()).unwrap();
        let contents = journal::read_dir(&layout.journal()).unwrap();
        let j = Journal::open_with(&contents, StoreIo::real()).unwrap();
        let mut ledger = Ledger::new(j, &contents.records);
        let p = |s: &str| RelPath::parse(s.as_bytes()).unwrap();
        let change = |op, s: &str| Change::new(op, p(s), None);
        let park = || change(Op::Park, "cat/demo/SKILL.md");
        let ops = |l: &Ledger| -> Vec<(Op, String)> {
            let contents = journal::read_dir(&layout.journal()).unwrap();
            assert_eq!(contents.records.len() as u64, l.last_seq());
            contents
                .records
                .iter()
                .map(|r| (r.op, r.path.to_string()))
                .collect()
        };
        ledger.defer(park(), Actor::daemon());
        assert!(ledger.resume(&p("cat/demo/SKILL.md")));
        assert!(!ledger.resume(&p("cat/demo/SKILL.md")));
        assert!(ops(&ledger).is_empty(), "resumed: nothing recorded");

        ledger.defer(park(), Actor::daemon());
        ledger
            .record(change(Op::Unlink, "cat/other"), Actor::daemon())
            .unwrap();
        ledger
            .record(change(Op::Mkdir, "cat/demo/SKILL.md"), Actor::daemon())
            .unwrap();
        assert_eq!(
            ops(&ledger),
            [
                (Op::Unlink, "cat/other".to_string()),
                (Op::Park, "cat/demo/SKILL.md".to_string()),
                (Op::Mkdir, "cat/demo/SKILL.md".to_string()),
            ]
        );
        // A rename of a directory above it, as its target too.
        for (from, to) in [("cat", "dog"), ("x", "cat/demo")] {
            ledger.defer(park(), Actor::daemon());
            let mut c = change(Op::Rename, from);
            c.to = Some(p(to));
            ledger.record(c, Actor::daemon()).unwrap();
            let got = ops(&ledger);
            assert_eq!(got[got.len() - 2].0, Op::Park, "{from} -> {to}");
        }
        ledger.defer(park(), Actor::daemon());
        ledger.flush_deferred(DEFER_MAX).unwrap();
        assert_eq!(ops(&ledger).len(), 7, "not old enough");
        ledger.flush_deferred(Duration::ZERO).unwrap();
        assert_eq!(ops(&ledger).last().unwrap().0, Op::Park);
        assert!(!ledger.resume(&p("cat/demo/SKILL.md")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A backend that counts `fdatasync`s of the journal and takes a while
    /// over each, as a device flush does.
    struct SlowCounting {
        flushes: std::sync::atomic::AtomicUsize,
    }

    impl skillfs_store::durable::SyncBackend for SlowCounting {
        fn sync_data(&self, file: &std::fs::File) -> io::Result<()> {
            self.flushes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(5));
            skillfs_base::sys::fdatasync(file)
        }
        fn sync_all(&self, file: &std::fs::File) -> io::Result<()> {
            skillfs_base::sys::fsync(file)
        }
        fn sync_dir(&self, dir: &std::fs::File, _path: &std::path::Path) -> io::Result<()> {
            skillfs_base::sys::fsync(dir)
        }
        fn syncfs(&self, _file: &std::fs::File) -> io::Result<()> {
            Ok(())
        }
        fn write_out(&self, file: &std::fs::File) -> io::Result<()> {
            skillfs_base::sys::write_out(file)
        }
    }

    /// Eight threads append and wait for their own record to be durable:
    /// each call returns only once the journal is synced past its record,
    /// and records share flushes (the ledger's lock is not held across one,
    /// so others append meanwhile).
    #[test]
    fn group_commit_covers_every_record_with_fewer_flushes() {
        use skillfs_store::durable::StoreIo;
        use skillfs_store::{Layout, journal};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let d = std::env::temp_dir().join(format!("skillfs-group-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let layout = Layout::new(d.clone());
        layout.create(StoreIo::real()).unwrap();
        let disk = Arc::new(SlowCounting {
            flushes: AtomicUsize::new(0),
        });
        let io = StoreIo::with_backend(disk.clone());
        let contents = journal::read_dir(&layout.journal()).unwrap();
        let j = Journal::open_with(&contents, io.clone()).unwrap();
        let blobs = BlobStore::open_path(&layout.blobs(), io.clone()).unwrap();
        let ledger = parking_lot::Mutex::new(Ledger::new(j, &contents.records));
        let commit = GroupCommit::new(ledger.lock().durable_through());
        const THREADS: usize = 8;
        const EACH: usize = 25;
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (ledger, blobs, commit, d) = (&ledger, &blobs, &commit, &d);
                s.spawn(move || {
                    for i in 0..EACH {
                        let p = RelPath::parse(format!("t{t}/f{i}").as_bytes()).unwrap();
                        let seq = ledger
                            .lock()
                            .record(Change::new(Op::Unlink, p, None), Actor::daemon())
                            .unwrap()
                            .seq;
                        if t % 2 == 0 {
                            commit.sync_through(ledger, blobs, seq).unwrap();
                        } else {
                            // The one-commit way: the caller's own commit.
                            let f = std::fs::File::open(d).unwrap();
                            commit
                                .write_out_then(ledger, blobs, || skillfs_base::sys::fsync(&f))
                                .unwrap();
                        }
                        assert!(ledger.lock().durable_through() >= seq);
                    }
                });
            }
        });
        let total = (THREADS * EACH) as u64;
        assert_eq!(ledger.lock().durable_through(), total);
        // Half the records go through fdatasync (the other half commit by
        // their own fsync): those share flushes.
        let flushes = disk.flushes.load(Ordering::SeqCst);
        assert!(
            flushes < THREADS * EACH / 4,
            "{flushes} flushes for {total} records"
        );
        // Every record is in the file, whole.
        drop(ledger);
        assert_eq!(
            journal::read_dir(&layout.journal()).unwrap().records.len() as u64,
            total
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
