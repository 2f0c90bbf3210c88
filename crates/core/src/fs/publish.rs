//! Publishing a version: staged bytes become a blob, a journal record and
//! then the live file, in that order.
//!
//! Owns: `publish` (a close: not flushed; an fsync's is `fsync_publish`),
//! the one-commit and the step-by-step durability orders, the swap of a
//! staging file in for the live one, and what a failed publish leaves
//! recorded (`record_live`).
//! Invariants: a record made durable never names a blob that is not; a
//! version never becomes live without its record; a record of a version
//! that never became live is followed by one of the live content. Where
//! one fsync commits all earlier metadata (`Durability::OneCommit`), the
//! fsync is of a file in the running transaction (`commit_all`). Every
//! fsync and write-out of the live tree and the marker goes through the
//! store's door (`dirs.io`, see `store::durable`).
//! Locks: `namespace` shared → an `OpenFile` → `ledger` briefly; the group
//! commit is entered holding neither `ledger` nor, for a durable publish,
//! `namespace`.

use super::*;

impl SkillFs {
    /// Publishes the staged bytes of open files at or below `under` before
    /// that entry is removed, replaced, parked or truncated: what a reader
    /// sees is content, and G1 keeps it. Called under the namespace lock.
    /// A failure (a full disk) is the caller's: the change that would lose
    /// those bytes must be refused with it.
    pub(super) fn publish_dirty_under(&self, under: &Location, caller: &Caller) -> FsResult<()> {
        let inos: Vec<Ino> = self.open_files.inos();
        for ino in inos {
            let Ok(loc) = self.loc(ino) else { continue };
            if !loc.logical.starts_with(&under.logical) {
                continue;
            }
            let Some(of) = self.open_file(ino) else {
                continue;
            };
            let mut s = of.lock();
            if s.staging.as_ref().is_some_and(|stg| stg.dirty) {
                self.publish_locked(&mut s, &loc, Op::Write, false, caller)
                    .context(format_args!("publish {} before it changed", loc.logical))?;
            }
            self.keep_direct(&s, &loc, caller)?;
        }
        Ok(())
    }

    pub(super) fn publish(&self, ino: Ino, durable: bool, caller: &Caller) -> FsResult<()> {
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
        let mut s = of.lock();
        if s.staging.as_ref().is_some_and(|stg| stg.dirty) {
            self.publish_locked(&mut s, &loc, Op::Write, false, caller)?;
        }
        Ok(())
    }

    /// Where each step is fsynced in order: the directory of `loc`, whose
    /// fsync commits its entry (opened under the namespace lock, flushed
    /// after it).
    pub(super) fn parent_to_sync(&self, loc: &Location) -> FsResult<Option<File>> {
        if self.durability.one_commit() {
            return Ok(None);
        }
        Ok(Some(open_parent_of(self.at(loc), loc)?))
    }

    /// With `Durability::OneCommit`, commits every change made so far (data
    /// written out beforehand included): an `fsync` commits the journal
    /// transaction its inode was last changed in, and everything before it,
    /// but nothing after; the fsync of a file last changed a while ago
    /// would leave out what was written out since (the journal's blocks).
    /// Touching the marker puts it in the running transaction.
    pub(super) fn commit_all(&self) -> std::io::Result<()> {
        sys::futimens(&self.marker, Time::Now, Time::Now)?;
        self.dirs
            .io
            .sync_all(&self.marker, &self.dirs.tmp.join(COMMIT_MARKER))
    }

    /// Makes the published file `live` durable with everything recorded
    /// before it, in the durability order (see `publish_locked`).
    pub(super) fn make_durable(
        &self,
        live: &File,
        parent: Option<File>,
        loc: &Location,
    ) -> FsResult<()> {
        if self.durability.one_commit() {
            self.versions.write_out_then(&self.blobs, || {
                self.live_write_out(live, loc)?;
                self.commit_all()
            })?;
        } else {
            self.sync_records()?;
            self.live_fsync(live, loc)?;
            if let Some(dir) = parent {
                self.live_fsync(&dir, loc)?;
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
    pub(super) fn publish_locked(
        &self,
        s: &mut OpenState,
        loc: &Location,
        op: Op,
        durable: bool,
        caller: &Caller,
    ) -> FsResult<()> {
        let stg = s.staging.as_ref().expect("caller checked");
        let caller = &stg.author(caller);
        if stg.in_place {
            return self.publish_in_place(s, loc, op, durable, caller);
        }
        let fast = durable && self.durability.one_commit();
        let stg_file = Arc::clone(&stg.file);
        let one_commit = |s: &mut OpenState| -> std::io::Result<()> {
            self.live_write_out(&stg_file, loc)?;
            self.swap_in(s, loc, caller)?;
            self.live_fsync(&stg_file, loc)
        };
        // The path whose record this publish appended, until the swap makes
        // it true.
        let mut recorded: Option<RelPath> = None;
        let steps = |s: &mut OpenState, recorded: &mut Option<RelPath>| -> FsResult<()> {
            let mut replaced = false;
            if let Some(path) = &self.versioned(loc, Kind::File) {
                self.meet_under_writer(s, loc)?;
                // Without its record the version must not become live.
                let (made, want) = self.store_and_record(&stg_file, path, op, durable, caller)?;
                if made {
                    *recorded = Some(path.clone());
                }
                // Both outside the ledger's lock (group commit).
                if fast {
                    self.versions
                        .write_out_then(&self.blobs, || one_commit(s))?;
                    replaced = true;
                } else if durable {
                    self.versions.sync_through(&self.blobs, want)?;
                }
            }
            if !replaced {
                if fast {
                    one_commit(s)?;
                } else if durable {
                    self.live_fsync(&stg_file, loc)?;
                    self.swap_in(s, loc, caller)?;
                    self.sync_parent_of(loc)?;
                } else {
                    // What a rename over a file would have done on ext4
                    // (auto_da_alloc): start writing the new content now, so a
                    // later commit of the swap does not expose an empty file.
                    // Replacing an empty file (a fresh create) risks nothing:
                    // empty is the version it had.
                    if sys::fstat(&*s.live).is_ok_and(|st| st.st_size > 0) {
                        sys::start_write_out(&*stg_file)?;
                    }
                    self.swap_in(s, loc, caller)?;
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
    pub(super) fn record_live(&self, s: &OpenState, path: &RelPath, caller: &Caller) {
        // From the content stored to its record: no prune starts between.
        let _writing = self.blobs.writing();
        let done = self.stored_state(&s.live, false).and_then(|state| {
            record_unless_same(&mut self.versions.ledger(), path, state, Op::Write, caller)
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
    pub(super) fn store_and_record(
        &self,
        file: &File,
        path: &RelPath,
        op: Op,
        durable: bool,
        caller: &Caller,
    ) -> FsResult<(bool, u64)> {
        // From the content stored to its record: no prune starts between.
        let _writing = self.blobs.writing();
        let state = self.stored_state(file, false)?;
        if durable {
            self.blobs
                .mark_pending(state.blob.as_deref().expect("just stored"));
        }
        let mut ledger = self.versions.ledger();
        let made = record_unless_same(&mut ledger, path, state, op, caller)?;
        Ok((made, ledger.last_seq()))
    }

    /// Stores the content of `file` as a blob and returns its state.
    pub(super) fn stored_state(&self, file: &File, durable: bool) -> FsResult<EntryState> {
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
    pub(super) fn publish_in_place(
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
        if let Some(path) = &self.versioned(loc, Kind::File) {
            let (_, want) = self.store_and_record(&file, path, op, durable, caller)?;
            if durable {
                self.versions.sync_through(&self.blobs, want)?;
            }
        }
        s.staging = None;
        if durable {
            self.live_fsync(&file, loc)?;
        }
        Ok(())
    }

    /// Swaps the staging file in for the live one, and the open state with
    /// it at once (an error after this point must not leave the two apart).
    /// Swapped, not renamed over: the replaced inode lands at the staging
    /// path, to be reused (see `spares`).
    pub(super) fn swap_in(
        &self,
        s: &mut OpenState,
        loc: &Location,
        caller: &Caller,
    ) -> std::io::Result<()> {
        // From the held fd of `staging/`: a path to it could have been
        // redirected since the mount.
        let spare = s.staging.as_ref().expect("caller checked").spare.clone();
        let spare = spare.ok_or_else(|| std::io::Error::other("no staging file to swap in"))?;
        if let Some(pause) = swap_delay() {
            std::thread::sleep(pause);
        }
        let exchanged = match spare.exchange(self.at(loc), &loc.phys) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                spare.rename_out(self.at(loc), &loc.phys, 0)?;
                false
            }
            Err(e) => return Err(e),
        };
        self.touched(loc);
        let stg = s.staging.take().expect("caller checked");
        let old = std::mem::replace(&mut s.live, stg.file);
        self.swaps.fetch_add(1, Ordering::SeqCst);
        if exchanged && self.keep_swapped_out(s, loc, &old, &spare, caller) {
            self.recycle(old, spare);
        }
        Ok(())
    }

    /// After an exchange: whether what it took out of the tree (now at
    /// `spare`) may be recycled. It is the writer's own file (`old`) unless
    /// another was put at the name behind the daemon after the publish met
    /// it (a rename in another mount of the directory, in the moment
    /// between `meet_under_writer` and the exchange); a recycle would
    /// remove that one unrecorded. A file or symlink is recorded first,
    /// then the content swapped in again, so the newest version is the
    /// live one, and both are made durable before the recycle (the
    /// publish's own sync came before them). Anything else, a file that
    /// cannot be recorded, and whatever is found at a name that is not
    /// versioned (hidden, untracked, outside) is moved to an area of the
    /// store's `orphans/`, swept as any orphan.
    fn keep_swapped_out(
        &self,
        s: &OpenState,
        loc: &Location,
        old: &File,
        spare: &Named,
        caller: &Caller,
    ) -> bool {
        let (Ok(mine), Ok(out)) = (sys::fstat(old), spare.lstat()) else {
            return true;
        };
        if (mine.st_dev, mine.st_ino) == (out.st_dev, out.st_ino) {
            return true;
        }
        let kind = match out.st_mode & libc::S_IFMT {
            libc::S_IFREG => Some(Kind::File),
            libc::S_IFLNK => Some(Kind::Symlink),
            _ => None,
        };
        let recorded = match kind.and_then(|k| Some((k, self.versioned(loc, k)?))) {
            Some((k, path)) => self.record_swapped_out(s, (&path, k), spare, &out, caller),
            None => Err(FsError::from(std::io::Error::other(
                "not a file or symlink at a versioned name",
            ))),
        };
        let Err(why) = recorded else {
            return true;
        };
        // An area of its own, as the orphans of a removed directory have
        // (the mount's check takes only directories there), under its name.
        let area = format!("behind.{}", skillfs_base::time::now_ns());
        let base = loc.phys.rsplit(|&b| b == b'/').next().unwrap_or(b"entry");
        let orphans = &self.dirs.orphans;
        let moved = orphans
            .make_sub(&area)
            .and_then(|_| orphans.sub(&area))
            .and_then(|d| spare.rename_out(d.fd(), base, libc::RENAME_NOREPLACE));
        let logical = &loc.logical;
        match moved {
            Ok(()) => tracing::warn!(
                "{logical}: what was put in its place behind the daemon while a writer's bytes \
                 replaced it is not recorded ({why:?}); it is kept in the store's orphans/{area}/"
            ),
            Err(e) => tracing::error!(
                "{logical}: what was put in its place behind the daemon while a writer's bytes \
                 replaced it is not recorded ({why:?}), nor moved to the orphans ({e}); it is \
                 at {} until the next mount",
                spare.path().display()
            ),
        }
        false
    }

    /// Records `spare` (`out`, its `lstat`: a file or symlink found at
    /// `path` behind the daemon) and then the live content again, durably.
    fn record_swapped_out(
        &self,
        s: &OpenState,
        (path, kind): (&RelPath, Kind),
        spare: &Named,
        out: &libc::stat,
        caller: &Caller,
    ) -> FsResult<()> {
        if kind == Kind::File {
            let f = spare.open(libc::O_RDONLY)?;
            self.store_and_record(&f, path, Op::Scan, true, &Caller::kernel())?;
        } else {
            let mut state = state_from_stat(out, Kind::Symlink);
            state.target = Some(ByteString(sys::readlinkat(
                spare.dir.fd(),
                spare.name.as_bytes(),
            )?));
            let mut ledger = self.versions.ledger();
            record_unless_same(&mut ledger, path, state, Op::Scan, &Caller::kernel())?;
        }
        tracing::info!("{path}: found behind the daemon as a writer's bytes replaced it, recorded");
        self.record_live(s, path, caller);
        self.versions.sync_all(&self.blobs)?;
        Ok(())
    }
}

/// Test hook (debug builds only): `SKILLFS_TEST_SWAP_DELAY_MS` holds every
/// swap of a writer's bytes that long before its exchange, so that a test
/// can replace the file behind the daemon in that moment
/// (`tests/it/behind.rs`).
fn swap_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| skillfs_base::time::test_pause("SKILLFS_TEST_SWAP_DELAY_MS"))
}

impl SkillFs {
    /// A write-out (see `sys::write_out`) of a file of the live tree, under
    /// the store's poison rule like `live_fsync`: `sync_file_range` reports
    /// a failed write-back once, and a later fsync could then succeed over
    /// the lost pages.
    pub(super) fn live_write_out(&self, f: &File, loc: &Location) -> std::io::Result<()> {
        self.dirs.io.write_out(f, &logical_path(loc))
    }

    /// An fsync of the live tree (a file or directory at `loc`), under the
    /// store's poison rule: after a failed one (the kernel may have dropped
    /// the pages that failed to write and marked them clean), no later fsync
    /// is acknowledged until remount.
    pub(super) fn live_fsync(&self, f: &File, loc: &Location) -> std::io::Result<()> {
        self.dirs.io.sync_all(f, &logical_path(loc))
    }

    pub(super) fn sync_parent_of(&self, loc: &Location) -> FsResult<()> {
        self.live_fsync(&open_parent_of(self.at(loc), loc)?, loc)?;
        Ok(())
    }
}

/// The path of `loc` in ROOT, for messages and test images.
fn logical_path(loc: &Location) -> std::path::PathBuf {
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(loc.logical.as_bytes()))
}

/// The directory holding the entry at `loc`.
pub(super) fn open_parent_of(dir: BorrowedFd<'_>, loc: &Location) -> std::io::Result<File> {
    let parent_phys = match loc.phys.iter().rposition(|&b| b == b'/') {
        Some(i) => &loc.phys[..i],
        None => &b""[..],
    };
    Ok(File::from(sys::open_dir(dir, parent_phys)?))
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
