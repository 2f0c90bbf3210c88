//! Open files and the copy-on-write write path.
//!
//! Owns: the open state of an inode (`OpenState`: the live file as last
//! published, a writer's `Staging`, counts of handles and writers), file
//! handles, `open`, `read`, `write`, `flush`, `fsync` and `release`.
//! Invariants: a live file is never written in place while visible: its
//! first write makes a staging copy (empty for `O_TRUNC`), reads through
//! any handle see the staged bytes, and `flush`/`release`/`fsync` publish
//! them (see `publish`). A hidden file is scratch, written in place.
//! An `O_TRUNC` open's empty moment is no version (`trunc_only`).
//! Locks: `namespace` shared only where a location is needed (a first
//! write, a last release with staged bytes); then an `OpenFile`;
//! `open_files` and `handles` are taken briefly.

use super::*;

impl SkillFs {
    /// Opens the live file of `ino` and registers (or joins) its open state.
    /// `at`: where the file is, or, for one the tree no longer has, why not
    /// (from `loc`): then the file is the one `keep_stale` kept, which the
    /// kernel resolved a path to just before it was replaced or removed.
    pub(super) fn open_live(
        &self,
        ino: Ino,
        at: Result<&Location, FsError>,
    ) -> FsResult<Arc<OpenFile>> {
        let mut files = self.open_files.lock();
        if let Some(of) = files.get(&ino) {
            of.state.lock().handles += 1;
            return Ok(Arc::clone(of));
        }
        let live = match at {
            Ok(loc) => {
                let f = sys::openat(loc.dirfd, &loc.phys, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
                self.note_if_shared(&f, 1);
                f
            }
            Err(err) => {
                let stale = self.stale.lock();
                let kept = stale.get(&ino).ok_or_else(|| err.clone())?;
                let again = format!("/proc/self/fd/{}", kept.as_raw_fd());
                File::open(again).map_err(|_| err)?
            }
        };
        let of = Arc::new(OpenFile {
            state: Mutex::new(OpenState {
                live: Arc::new(live),
                staging: None,
                handles: 1,
                writers: 0,
            }),
        });
        files.insert(ino, Arc::clone(&of));
        Ok(of)
    }

    /// Drops one handle's share of the open state.
    pub(super) fn release_open(&self, ino: Ino, writer: bool) {
        let mut files = self.open_files.lock();
        let Some(of) = files.get(&ino).cloned() else {
            return;
        };
        let mut s = of.state.lock();
        s.handles = s.handles.saturating_sub(1);
        if writer {
            s.writers = s.writers.saturating_sub(1);
        }
        if s.handles == 0 {
            if let Some(spare) = s.staging.take().and_then(|stg| stg.spare) {
                let _ = spare.unlink();
            }
            drop(s);
            files.remove(&ino);
        }
    }

    /// Gives the open file a staging copy if it has none (`empty`: start
    /// from nothing, as `O_TRUNC` does, instead of copying the live bytes).
    /// A `hidden` file is written in place instead.
    pub(super) fn ensure_staging(
        &self,
        s: &mut OpenState,
        empty: bool,
        hidden: bool,
    ) -> FsResult<()> {
        if let Some(stg) = &mut s.staging {
            if empty {
                sys::ftruncate(&*stg.file, 0)?;
                stg.mark_written();
            }
            return Ok(());
        }
        // A hidden file with another hard link (made while unmounted) is
        // copied like a visible one: writing in place would change the
        // other name's bytes too.
        if hidden && sys::fstat(&*s.live).is_ok_and(|st| st.st_nlink <= 1) {
            // The live file again, for writing (through /proc: the daemon
            // holds it by descriptor, not by a name it may have lost). Where
            // that is refused, the copy below serves as for any file.
            let again = format!("/proc/self/fd/{}", s.live.as_raw_fd());
            if let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(again)
            {
                if empty {
                    sys::ftruncate(&file, 0)?;
                }
                s.staging = Some(Staging {
                    file: Arc::new(file),
                    spare: None,
                    dirty: empty,
                    trunc_only: false,
                    in_place: true,
                    edits: 0,
                });
                return Ok(());
            }
        }
        let (path, file) = self.spares.take()?;
        let result = (|| {
            // Made or emptied a while ago: an O_TRUNC open is a change now.
            sys::futimens(&file, Time::Now, Time::Now)?;
            let st = sys::fstat(&*s.live)?;
            if !empty {
                copy_range(&s.live, &file, st.st_size as u64)?;
            }
            sys::fchmod(&file, st.st_mode & 0o7777)?;
            if self.chown_new {
                sys::fchown(&file, st.st_uid, st.st_gid)?;
            }
            Ok::<(), FsError>(())
        })();
        if let Err(e) = result {
            let _ = path.unlink();
            return Err(e);
        }
        s.staging = Some(Staging {
            file: Arc::new(file),
            spare: Some(path),
            dirty: empty,
            trunc_only: false,
            in_place: false,
            edits: 0,
        });
        Ok(())
    }

    pub(super) fn new_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, h);
        fh
    }

    pub fn open(&self, ino: Ino, flags: i32, caller: &Caller) -> FsResult<OpenReply> {
        if let Some(v) = decode(ino) {
            let file = Arc::new(self.history().open(v, flags)?);
            return Ok(OpenReply {
                fh: self.new_handle(Handle::Blob { file }),
                no_flush: true,
                immutable: true,
            });
        }
        self.retry_after_store(Some(ino), || {
            let _ns = self.namespace.read();
            match self.loc(ino) {
                Ok(loc) => {
                    let of = self.open_live(ino, Ok(&loc))?;
                    self.finish_open(ino, Some(&loc), of, flags, caller)
                }
                Err(e) => {
                    // What a writer puts in it is lost, as on ext4: it
                    // is no longer any file's content.
                    let of = self.open_live(ino, Err(e))?;
                    self.finish_open(ino, None, of, flags, caller)
                }
            }
        })
    }

    /// `loc`: where the file is, `None` for one already replaced or removed.
    pub(super) fn finish_open(
        &self,
        ino: Ino,
        loc: Option<&Location>,
        of: Arc<OpenFile>,
        flags: i32,
        caller: &Caller,
    ) -> TryResult<OpenReply> {
        // `O_RDONLY | O_TRUNC` truncates too (with FUSE_ATOMIC_O_TRUNC the
        // kernel counts on the open to have done it).
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if write {
            let mut s = match self.lock_to_change(ino, &of) {
                Ok(s) => s,
                Err(e) => {
                    self.release_open(ino, false);
                    return Err(e);
                }
            };
            s.writers += 1;
            if flags & libc::O_TRUNC != 0 {
                // Another writer's staged bytes were visible: keep them, or
                // refuse the truncating open.
                if s.staging.as_ref().is_some_and(|stg| stg.dirty)
                    && let Some(loc) = loc
                    && let Err(e) = self.publish_locked(&mut s, loc, Op::Write, false, caller)
                {
                    drop(s);
                    self.release_open(ino, true);
                    let what = format_args!("publish {} before O_TRUNC", loc.logical);
                    return Err(e.context(what).into());
                }
                let hidden = loc.is_some_and(|l| l.is_hidden());
                if let Err(e) = self.ensure_staging(&mut s, true, hidden) {
                    drop(s);
                    self.release_open(ino, true);
                    return Err(e.into());
                }
                let stg = s.staging.as_mut().expect("just ensured");
                stg.mark_written();
                stg.trunc_only = true;
                if let Some(l) = loc {
                    self.touched(l);
                }
            }
        }
        let fh = self.new_handle(Handle::File {
            ino,
            write,
            append: flags & libc::O_APPEND != 0,
        });
        Ok(OpenReply {
            fh,
            no_flush: !write,
            immutable: false,
        })
    }

    pub(super) fn file_handle(&self, fh: u64) -> FsResult<(Ino, bool, bool)> {
        match self.handles.lock().get(&fh) {
            Some(Handle::File { ino, write, append }) => Ok((*ino, *write, *append)),
            _ => Err(FsError::EBADF),
        }
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let blob = match self.handles.lock().get(&fh) {
            Some(Handle::Blob { file }) => Some(Arc::clone(file)),
            _ => None,
        };
        let mut buf = vec![0u8; size as usize];
        let got = match blob {
            Some(b) => read_full(|buf, off| b.read_at(buf, off), &mut buf, offset)?,
            None => {
                let (ino, _, _) = self.file_handle(fh)?;
                let of = self.open_file(ino).ok_or(FsError::EBADF)?;
                let file = {
                    let s = of.state.lock();
                    match &s.staging {
                        Some(stg) => Arc::clone(&stg.file),
                        None => Arc::clone(&s.live),
                    }
                };
                read_full(|buf, off| file.read_at(buf, off), &mut buf, offset)?
            }
        };
        buf.truncate(got);
        Ok(buf)
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let (ino, write, append) = self.file_handle(fh)?;
        if !write {
            return Err(FsError::EBADF);
        }
        let of = self.open_file(ino).ok_or(FsError::EBADF)?;
        // Only a writer without staging yet needs to know where the file is:
        // resolved before the open state is locked (lock order), under the
        // namespace lock held until the staging exists, so that a rename
        // cannot make it visible in between.
        let needs_place = of.state.lock().staging.is_none();
        let _ns = needs_place.then(|| self.namespace.read());
        let hidden = needs_place && self.loc(ino).is_ok_and(|l| l.is_hidden());
        let mut s = of.state.lock();
        self.ensure_staging(&mut s, false, hidden)?;
        let stg = s.staging.as_mut().expect("just ensured");
        let offset = if append {
            sys::fstat(&*stg.file)?.st_size as u64
        } else {
            offset
        };
        stg.file.write_all_at(data, offset)?;
        stg.mark_written();
        let in_place = stg.in_place;
        drop(s);
        // Written in place: a hidden file, which an unpark may be planned
        // over (its location is resolved only then; lock order).
        if in_place
            && self.freezing()
            && let Ok(l) = self.loc(ino)
        {
            self.touched(&l);
        }
        Ok(data.len() as u32)
    }

    /// Publishes a writer's staged bytes as a version (not yet durable).
    ///
    /// Not a file only emptied by its `O_TRUNC` open: a shell's `echo x >
    /// f` opens with `O_TRUNC`, `dup2`s and closes the first descriptor (a
    /// flush) before it writes, and that empty moment is no version. It is
    /// published by the next flush after a write, or at the last release.
    pub fn flush(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        if matches!(self.handles.lock().get(&fh), Some(Handle::Blob { .. })) {
            return Ok(());
        }
        let (ino, write, _) = self.file_handle(fh)?;
        if write {
            let trunc_only = self.open_file(ino).is_some_and(|of| {
                of.state
                    .lock()
                    .staging
                    .as_ref()
                    .is_some_and(|stg| stg.trunc_only)
            });
            if !trunc_only {
                self.publish(ino, false, caller)?;
            }
        }
        Ok(())
    }

    pub fn fsync(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        if matches!(self.handles.lock().get(&fh), Some(Handle::Blob { .. })) {
            return Ok(());
        }
        let (ino, _, _) = self.file_handle(fh)?;
        self.publish(ino, true, caller)
    }

    pub fn release(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        let h = self.handles.lock().remove(&fh);
        let (ino, write) = match h {
            Some(Handle::File { ino, write, .. }) => (ino, write),
            Some(Handle::Blob { .. }) => return Ok(()),
            _ => return Err(FsError::EBADF),
        };
        let mut result = Ok(());
        if write && let Some(of) = self.open_file(ino) {
            // Usually the close's flush published everything already: only
            // a last writer with staged bytes needs the location.
            let pending = {
                let mut s = of.state.lock();
                s.writers = s.writers.saturating_sub(1);
                let pending = s.writers == 0 && s.staging.as_ref().is_some_and(|stg| stg.dirty);
                if !pending {
                    self.offer_pages(ino, &s);
                }
                pending
            };
            if pending {
                let _ns = self.namespace.read();
                let loc = self.loc(ino).ok();
                let mut s = of.state.lock();
                // Decided again under the lock: a writer may have opened
                // since (it publishes at its own close).
                if s.writers == 0
                    && s.staging.as_ref().is_some_and(|stg| stg.dirty)
                    && let Some(loc) = &loc
                {
                    result = self
                        .publish_locked(&mut s, loc, Op::Write, false, caller)
                        .context(format_args!("publish {} at close", loc.logical));
                    if result.is_err() {
                        // The close fails, and no writer is left to try
                        // again: the staged bytes are in no version, so
                        // nobody may read them. Back to the live file, and
                        // the kernel forgets the size and pages it cached.
                        if let Some(spare) = s.staging.take().and_then(|stg| stg.spare) {
                            let _ = spare.unlink();
                        }
                        self.invalidate(ino);
                    }
                }
                self.offer_pages(ino, &s);
            }
        }
        self.release_open(ino, false);
        result
    }

    /// Once the last writer is gone and everything is published, the
    /// kernel may keep the file's pages (see `pages`). Called under `s`'s
    /// lock, so no writer can open in between.
    pub(super) fn offer_pages(&self, ino: Ino, s: &OpenState) {
        if s.writers == 0 && !s.staging.as_ref().is_some_and(|stg| stg.dirty) {
            let file = s.staging.as_ref().map_or(&s.live, |stg| &stg.file);
            self.pages.queue(ino, Arc::clone(file));
        }
    }
}
