//! Attribute changes: chmod, chown, utimes and truncate.
//!
//! Owns: `setattr`, the split of a file hard-linked while unmounted before
//! its metadata changes (`split_if_linked`), the private copy of an open
//! file whose name was removed, and truncation (by path a change of its
//! own, through a handle part of that writer's staged content).
//! Invariants: a change that cannot be journaled is undone and refused; a
//! writer's staging carries the same metadata, so publishing it keeps the
//! change. Locks: `namespace` shared; an `OpenFile` (through
//! `lock_to_change`) for a truncation; `ledger` briefly to record.

use super::*;

impl SkillFs {
    pub fn setattr(&self, ino: Ino, attr: SetAttr, caller: &Caller) -> FsResult<Entry> {
        self.retry_after_store(Some(ino), || self.setattr_once(ino, attr, caller))
    }

    pub(super) fn setattr_once(
        &self,
        ino: Ino,
        attr: SetAttr,
        caller: &Caller,
    ) -> TryResult<Entry> {
        if is_virtual(ino) {
            return Err(FsError::EROFS.into());
        }
        let _ns = self.namespace.read();
        let loc = self.loc(ino);
        // What it is now, first: the change must not leave a record (or a
        // truncation) of a file the journal has no content for.
        if let Ok(l) = &loc {
            self.meet(l)?;
        }
        let of = self.open_file(ino);
        if let Some(size) = attr.size {
            self.truncate(ino, loc.as_ref().ok(), size, attr.via_handle, caller)?;
        }
        let staged = of
            .as_ref()
            .and_then(|of| of.lock().staging.as_ref().map(|s| Arc::clone(&s.file)));
        let meta_change = attr.mode.is_some()
            || attr.uid.is_some()
            || attr.gid.is_some()
            || attr.atime.is_some()
            || attr.mtime.is_some();
        if meta_change && let Ok(l) = &loc {
            self.split_if_linked(ino, l)?;
        }
        if meta_change {
            // As it was, to put back if the change cannot be journaled.
            let before = match &loc {
                Ok(l) if self.versioned_now(l).is_some() => Some(l.lstat(self.area_dirs())?),
                _ => None,
            };
            match &loc {
                Ok(l) => {
                    let applied = apply_meta_at(self.at(l), l, &attr);
                    self.touched(l);
                    applied?
                }
                Err(e) => {
                    // Unlinked but open: change the open file itself, or,
                    // if another name (a hard link made while unmounted)
                    // still points at it, a private copy of it.
                    let of = of.as_ref().ok_or_else(|| e.clone())?;
                    let mut s = of.lock();
                    if sys::fstat(&*s.live).is_ok_and(|st| st.st_nlink > 0) {
                        let copy = self.private_copy(&s.live)?;
                        s.live = Arc::new(copy);
                    }
                    apply_meta_fd(&s.live, &attr)?;
                }
            }
            // The staged copy carries the same metadata, so publishing it
            // does not undo this change.
            if let Some(stg) = &staged {
                apply_meta_fd(stg, &attr)?;
            }
            // FIFOs and sockets are never versioned.
            let special = before.as_ref().is_some_and(|st| special_of(st) != 0);
            if let Ok(l) = &loc
                && let Some(p) = &self.versioned_now(l)
                && !special
            {
                let op = match (
                    attr.mode.is_some(),
                    attr.uid.is_some() || attr.gid.is_some(),
                    attr.atime.is_some() || attr.mtime.is_some(),
                ) {
                    (true, false, false) => Op::Chmod,
                    (false, true, false) => Op::Chown,
                    (false, false, true) => Op::Utimes,
                    _ => Op::Setattr,
                };
                // A change that cannot be journaled is not made: put back
                // what it changed and answer the error.
                let recorded = self.state_of(l, p).and_then(|state| {
                    let mut ledger = self.versions.ledger();
                    // One that leaves the recorded state as it was (vim
                    // sets the mode its new file has already) is none.
                    if ledger.catalog().get(p) != Some(&state) {
                        let change = Change::new(op, p.clone(), Some(state));
                        ledger.record(change, caller.actor())?;
                    }
                    Ok(())
                });
                if let Err(e) = recorded {
                    if let Some(old) = &before {
                        let undo = undo_of(&attr, old);
                        let undone = apply_meta_at(self.at(l), l, &undo);
                        if let Some(stg) = &staged {
                            let _ = apply_meta_fd(stg, &undo);
                        }
                        if let Err(u) = undone {
                            tracing::error!("could not undo the {} of {p}: {u:?}", op.name());
                        }
                    }
                    return Err(e
                        .context(format_args!("journal {} of {p} (undone)", op.name()))
                        .into());
                }
            }
        }
        drop(_ns);
        Ok(self.getattr(ino)?)
    }

    /// A regular file with another hard link (made while unmounted) gets an
    /// inode of its own before its mode, owner or times change: a change
    /// through the mount never reaches the other name (as a write does, see
    /// `recycle_inode`). The live content is copied, with its mode, owner
    /// and times, and swapped in; a writer's staged bytes are left alone
    /// (they publish at its own close). The content is unchanged, so
    /// nothing is recorded. Called under the namespace lock.
    pub(super) fn split_if_linked(&self, ino: Ino, loc: &Location) -> TryResult<()> {
        let st = loc.lstat(self.area_dirs())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink <= 1 {
            return Ok(());
        }
        let of = self.open_live(ino, Ok(loc))?;
        let result = (|| {
            let mut s = self.lock_to_change(ino, &of)?;
            let (path, copy) = self.copy_of(&s.live)?;
            if let Err(e) = path.exchange(self.at(loc), &loc.phys) {
                let _ = path.unlink();
                return Err(e.into());
            }
            self.touched(loc);
            let old = std::mem::replace(&mut s.live, Arc::new(copy));
            self.swaps.fetch_add(1, Ordering::SeqCst);
            // Another name has it: removed, never reused (`recycle_inode`).
            self.recycle(old, path);
            Ok(())
        })();
        self.release_open(ino, false);
        result
    }

    /// A copy of `live` in a spare (bytes, mode, owner and times: not a
    /// write, so G7 keeps its times), at the path returned.
    pub(super) fn copy_of(&self, live: &File) -> FsResult<(Named, File)> {
        let st = sys::fstat(live)?;
        let (path, copy) = self.spares.take()?;
        let made = (|| {
            copy_range(live, &copy, st.st_size as u64)?;
            if self.chown_new {
                sys::fchown(&copy, st.st_uid, st.st_gid)?;
            }
            sys::fchmod(&copy, st.st_mode & 0o7777)?;
            sys::futimens(
                &copy,
                Time::At(st.st_atime, st.st_atime_nsec),
                Time::At(st.st_mtime, st.st_mtime_nsec),
            )
        })();
        if let Err(e) = made {
            let _ = path.unlink();
            return Err(e.into());
        }
        Ok((path, copy))
    }

    /// An unnamed copy of `live`, for an open file whose inode another name
    /// still points at.
    pub(super) fn private_copy(&self, live: &File) -> FsResult<File> {
        let (path, copy) = self.copy_of(live)?;
        let _ = path.unlink();
        Ok(copy)
    }

    /// A size change. By path (`truncate(2)`) it is a change of its own and
    /// is published at once, whoever else has the file open (a handle closed
    /// a moment ago may not be released yet); through a write handle it is
    /// part of that writer's staged content.
    pub(super) fn truncate(
        &self,
        ino: Ino,
        loc: Option<&Location>,
        size: u64,
        via_handle: bool,
        caller: &Caller,
    ) -> TryResult<()> {
        // A handle's share of the open state, held for the whole change:
        // without it the last reader's release could drop the state midway
        // and a new open start another one on the file about to be replaced.
        let of = match loc {
            Some(l) => self.open_live(ino, Ok(l))?,
            None => {
                // Unlinked: reachable only through an open handle. Joined
                // under the map's lock, so a release cannot drop it between.
                self.open_files
                    .join(ino)
                    .ok_or(Attempt::Failed(FsError::ESTALE))?
            }
        };
        let result = (|| {
            let mut s = self.lock_to_change(ino, &of)?;
            // The content just before the truncation is kept (the empty
            // moment of an `O_TRUNC` open is none: vim truncates the file
            // it has just made).
            if s.staging
                .as_ref()
                .is_some_and(|stg| stg.dirty && !stg.trunc_only)
                && let Some(l) = loc
            {
                self.publish_locked(&mut s, l, Op::Write, false, caller)?;
            }
            if let Some(l) = loc {
                self.keep_direct(&s, l, caller)?;
            }
            if s.direct > 0
                && let Some(file) = s.backing.clone()
            {
                return Ok(self.truncate_direct(&s, &file, loc, size, via_handle, caller)?);
            }
            self.ensure_staging(&mut s, size == 0, self.write_place(loc))?;
            let stg = s.staging.as_mut().expect("just ensured");
            sys::ftruncate(&*stg.file, size)?;
            stg.written_by(caller);
            if let Some(l) = loc {
                self.touched(l);
            }
            if (s.writers == 0 || !via_handle)
                && let Some(l) = loc
            {
                self.publish_locked(&mut s, l, Op::Truncate, false, caller)?;
            }
            Ok(())
        })();
        self.release_open(ino, false);
        result
    }
}

impl SkillFs {
    /// A size change of a file the kernel reads (and direct writers write)
    /// itself: made on the live file in place, and versioned now unless a
    /// direct writer's handle makes it (then at that writer's close). If
    /// the new content cannot be versioned (a full disk), the file gets the
    /// version it had back (`put_back_version`) and the call fails.
    fn truncate_direct(
        &self,
        s: &OpenState,
        file: &File,
        loc: Option<&Location>,
        size: u64,
        via_handle: bool,
        caller: &Caller,
    ) -> FsResult<()> {
        sys::ftruncate(file, size)?;
        let Some(l) = loc else {
            return Ok(());
        };
        self.touched(l);
        if via_handle && s.direct_writers > 0 {
            return Ok(());
        }
        let Some(path) = self.versioned(l, Kind::File) else {
            return Ok(());
        };
        let recorded = self
            .store_and_record(file, &path, Op::Truncate, false, caller)
            .context(format_args!("version {} truncated", l.logical));
        if let Err(e) = recorded {
            if let Err(back) = self.put_back_version(file, l) {
                tracing::error!(
                    "{}: truncated in place, only partly put back: {back}",
                    l.logical
                );
            }
            return Err(e);
        }
        Ok(())
    }
}

/// The metadata change that puts back what `attr` changes, from `old`.
pub(super) fn undo_of(attr: &SetAttr, old: &libc::stat) -> SetAttr {
    SetAttr {
        mode: attr.mode.map(|_| old.st_mode),
        uid: attr.uid.map(|_| old.st_uid),
        gid: attr.gid.map(|_| old.st_gid),
        atime: attr
            .atime
            .or(attr.mtime)
            .map(|_| Time::At(old.st_atime, old.st_atime_nsec)),
        mtime: attr
            .mtime
            .or(attr.atime)
            .map(|_| Time::At(old.st_mtime, old.st_mtime_nsec)),
        ..SetAttr::default()
    }
}

/// Applies a metadata change to the entry at `l`, by path, never following
/// a symlink (a symlink's own mode does not change).
pub(super) fn apply_meta_at(dir: BorrowedFd<'_>, l: &Location, attr: &SetAttr) -> FsResult<()> {
    let (fd, rel) = (dir, l.phys.as_slice());
    if let Some(mode) = attr.mode {
        let st = sys::lstatat(fd, rel)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
            sys::fchmodat(fd, rel, mode & 0o7777)?;
        }
    }
    if attr.uid.is_some() || attr.gid.is_some() {
        sys::lchownat(
            fd,
            rel,
            attr.uid.unwrap_or(u32::MAX),
            attr.gid.unwrap_or(u32::MAX),
        )?;
    }
    if attr.atime.is_some() || attr.mtime.is_some() {
        sys::lutimensat(
            fd,
            rel,
            attr.atime.unwrap_or(Time::Keep),
            attr.mtime.unwrap_or(Time::Keep),
        )?;
    }
    Ok(())
}

pub(super) fn apply_meta_fd(f: &File, attr: &SetAttr) -> FsResult<()> {
    if let Some(mode) = attr.mode {
        sys::fchmod(f, mode & 0o7777)?;
    }
    if attr.uid.is_some() || attr.gid.is_some() {
        sys::fchown(
            f,
            attr.uid.unwrap_or(u32::MAX),
            attr.gid.unwrap_or(u32::MAX),
        )?;
    }
    if attr.atime.is_some() || attr.mtime.is_some() {
        sys::futimens(
            f,
            attr.atime.unwrap_or(Time::Keep),
            attr.mtime.unwrap_or(Time::Keep),
        )?;
    }
    Ok(())
}
