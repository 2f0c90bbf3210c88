//! An fsync's publish (`publish_durable`): the staged bytes become a
//! durable version in four steps that keep every device flush outside the
//! namespace lock, tried again when a rename or another handle's close
//! came between, with a fallback that records what became live.
//! Invariants and locks: as `publish`'s, whose steps it uses
//! (`store_and_record`, `swap_in`, `make_durable`); the group commit is
//! entered holding neither `ledger` nor `namespace`.

use super::publish::open_parent_of;
use super::*;

impl SkillFs {
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
    /// the order the journal says) and the publish starts over; after
    /// seconds of that it holds the locks throughout, as a file moved
    /// without pause would otherwise starve it.
    pub(super) fn publish_durable(&self, ino: Ino, caller: &Caller) -> FsResult<()> {
        // Whether a try recorded a version that no try swapped in yet.
        let mut owed = false;
        let result = self.publish_durable_tries(ino, caller, &mut owed);
        if result.is_err() && owed {
            self.record_live_now(ino, caller);
        }
        result
    }

    /// The tries of `publish_durable`, then the fallback.
    fn publish_durable_tries(&self, ino: Ino, caller: &Caller, owed: &mut bool) -> FsResult<()> {
        // A try is undone only by a rename of the file's directory or a close
        // of another handle of it (the kernel holds the file's inode lock
        // across an fsync): three at once, then with growing pauses, so a
        // burst of renames passes; only a file moved without pause for
        // seconds gets the last try, which holds the locks throughout.
        const TRIES: u32 = 24;
        for i in 0..TRIES {
            if self.publish_durable_once(ino, caller, owed)? {
                return Ok(());
            }
            if i >= 2 {
                std::thread::sleep(std::time::Duration::from_millis(1 << (i - 2).min(7)));
            }
        }
        let ns = self.namespace.read();
        let Some(of) = self.open_file(ino) else {
            return Ok(());
        };
        let Ok(loc) = self.loc(ino) else {
            return Ok(());
        };
        let mut s = of.lock();
        if s.staging.as_ref().is_some_and(|stg| stg.dirty) {
            return self.publish_locked(&mut s, &loc, Op::Write, true, caller);
        }
        let live = Arc::clone(&s.live);
        let parent = self.parent_to_sync(&loc)?;
        drop((s, ns));
        self.make_durable(&live, parent, &loc)
    }

    /// One try of `publish_durable`: whether it is done.
    pub(super) fn publish_durable_once(
        &self,
        ino: Ino,
        caller: &Caller,
        owed: &mut bool,
    ) -> FsResult<bool> {
        let ns = self.namespace.read();
        let Some(of) = self.open_file(ino) else {
            return Ok(true);
        };
        let Ok(loc) = self.loc(ino) else {
            return Ok(true); // unlinked while open: nothing left to publish to
        };
        let mut s = of.lock();
        let Some(stg) = s.staging.as_ref().filter(|stg| stg.dirty) else {
            let live = Arc::clone(&s.live);
            drop(s);
            if self.outside(&loc) {
                // A plain file of the home: its own fsync, as any
                // filesystem's (nothing of the store is ordered with it).
                drop(ns);
                self.live_fsync(&live, &loc)?;
                return Ok(true);
            }
            // Already published: make it durable in the same order.
            let parent = self.parent_to_sync(&loc)?;
            drop(ns);
            self.make_durable(&live, parent, &loc)?;
            return Ok(true);
        };
        let stg_file = Arc::clone(&stg.file);
        let caller = &stg.author(caller);
        let path = self.versioned(&loc, Kind::File);
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
                self.versions.sync_through(&self.blobs, want)?;
            }
            self.live_fsync(&stg_file, &loc)?;
            return Ok(true);
        }
        let edits = stg.edits;
        if path.is_some() {
            self.meet_under_writer(&s, &loc)?;
        }
        let want = match &path {
            Some(p) => {
                let (made, want) = self.store_and_record(&stg_file, p, Op::Write, true, caller)?;
                *owed |= made;
                Some(want)
            }
            None => None,
        };
        drop((s, ns));

        let swapped = std::cell::Cell::new(false);
        let steps = || -> std::io::Result<()> {
            if self.durability.one_commit() {
                // One fsync (of the staging file, swapped in or not)
                // commits the blob, the journal and the swap together.
                let commit = || {
                    self.live_write_out(&stg_file, &loc)?;
                    let done =
                        self.swap_if_unchanged(ino, &of, (&stg_file, edits), &loc, false, caller)?;
                    swapped.set(done.is_some());
                    match done {
                        // The rename put the staging file's inode in the
                        // running transaction.
                        Some(_) => self.live_fsync(&stg_file, &loc),
                        None => self.commit_all(),
                    }
                };
                match want {
                    Some(_) => self.versions.write_out_then(&self.blobs, commit),
                    None => commit(),
                }
            } else {
                if let Some(want) = want {
                    self.versions.sync_through(&self.blobs, want)?;
                }
                self.live_fsync(&stg_file, &loc)?;
                let dir =
                    self.swap_if_unchanged(ino, &of, (&stg_file, edits), &loc, true, caller)?;
                swapped.set(dir.is_some());
                match dir.flatten() {
                    Some(dir) => self.live_fsync(&dir, &loc),
                    None => Ok(()),
                }
            }
        };
        let result = steps();
        if swapped.get() {
            *owed = false;
        }
        result?;
        Ok(swapped.get())
    }

    /// After a durable publish failed with a version recorded that it
    /// never swapped in: unless that was published meanwhile (the file
    /// holds no staged bytes any more), the journal names a version the
    /// live file never held. The live content is recorded again, at the
    /// file's path now (it may have moved between the tries).
    fn record_live_now(&self, ino: Ino, caller: &Caller) {
        let _ns = self.namespace.read();
        let Some(of) = self.open_file(ino) else {
            return;
        };
        let Some(path) = self
            .loc(ino)
            .ok()
            .and_then(|l| self.versioned(&l, Kind::File))
        else {
            return;
        };
        let s = of.lock();
        if let Some(stg) = s.staging.as_ref().filter(|stg| stg.dirty) {
            self.record_live(&s, &path, &stg.author(caller));
        }
    }

    /// Step 3 of `publish_durable`, under the locks: swaps `stg_file` in at
    /// `loc` if it is still the staging file of `ino`, unwritten since
    /// (`edits`), and the file still at `loc`. `None` if not; else, with
    /// `parent`, the directory whose fsync commits the swap.
    pub(super) fn swap_if_unchanged(
        &self,
        ino: Ino,
        of: &OpenFile,
        (stg_file, edits): (&Arc<File>, u64),
        loc: &Location,
        parent: bool,
        caller: &Caller,
    ) -> std::io::Result<Option<Option<File>>> {
        let _ns = self.namespace.read();
        let here = self
            .loc(ino)
            .is_ok_and(|l| l.area == loc.area && l.phys == loc.phys);
        let mut s = of.lock();
        let same = s
            .staging
            .as_ref()
            .is_some_and(|stg| Arc::ptr_eq(&stg.file, stg_file) && stg.edits == edits);
        if !(here && same) {
            return Ok(None);
        }
        // Opened first: a swap whose commit cannot be made (no descriptor
        // left) must not be answered as durable.
        let dir = if parent {
            Some(open_parent_of(self.at(loc), loc)?)
        } else {
            None
        };
        self.swap_in(&mut s, loc, caller)?;
        Ok(Some(dir))
    }
}
