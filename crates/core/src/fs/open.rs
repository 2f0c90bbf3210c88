//! Open files and the copy-on-write write path.
//!
//! Owns: what the open state of an inode (`files::OpenState`: the live
//! file as last published, a writer's `Staging`, counts of handles and
//! writers) does, `open`, `read`, `write`, `flush`, `fsync` and `release`.
//! Invariants: a live file is never written in place while visible: its
//! first write makes a staging copy (empty for `O_TRUNC`), reads through
//! any handle see the staged bytes, and `flush`/`release`/`fsync` publish
//! them (see `publish`). A hidden file is scratch, written in place. The
//! one exception is a writer that joins direct (passthrough) handles,
//! which the kernel serves on the live file: it writes in place and is
//! versioned at its flush, `fsync` and close (`direct`).
//! An `O_TRUNC` open's empty moment is no version (`trunc_only`).
//! Locks: `namespace` shared only where a location is needed (a first
//! write, a last release with staged bytes); then an `OpenFile`. The
//! tables of open inodes and of handles are `files`'s.

use super::programs::{busy_program, counted_program, program_alive, truncates_unguarded};
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
        self.open_files.join_or_open(ino, || {
            Ok(match at {
                Ok(loc) => {
                    // The daemon's own reads of it (a copy for a writer, the
                    // pages handed to the kernel after a close) must not move
                    // its access time: a utime just set would be lost to them
                    // (relatime updates an atime older than the mtime). Not
                    // the owner (another user's file, --allow-other): without.
                    let flags = libc::O_RDONLY | libc::O_NOFOLLOW;
                    let f = match sys::openat(self.at(loc), &loc.phys, flags | libc::O_NOATIME, 0) {
                        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                            sys::openat(self.at(loc), &loc.phys, flags, 0)?
                        }
                        r => r?,
                    };
                    self.note_if_shared(&f, 1);
                    f
                }
                Err(err) => {
                    let kept = self.stale.reopen(ino).ok_or_else(|| err.clone())?;
                    kept.map_err(|_| err)?
                }
            })
        })
    }

    /// Drops one handle's share of the open state.
    pub(super) fn release_open(&self, ino: Ino, writer: bool) {
        self.open_files.leave(ino, writer);
    }

    /// How a file at `loc` (`None`: no longer in the tree) is written.
    pub(super) fn write_place(&self, loc: Option<&Location>) -> WritePlace {
        match loc {
            // A file of the home with another hard link is copied like a
            // hidden one: the other name may be in the versioned tree.
            Some(l) if l.is_hidden() => WritePlace::InPlaceUnlinked,
            _ => WritePlace::Copy,
        }
    }

    /// Gives the open file a staging copy if it has none (`empty`: start
    /// from nothing, as `O_TRUNC` does, instead of copying the live bytes),
    /// or, as `place` says, the live file itself to write in place.
    pub(super) fn ensure_staging(
        &self,
        s: &mut OpenState,
        empty: bool,
        place: WritePlace,
    ) -> FsResult<()> {
        // An inode with direct handles is never swapped: the kernel writes
        // it through its own backing file, which a swap would leave behind
        // (and a recycle would hand to another file).
        let place = if s.direct > 0 {
            WritePlace::InPlace
        } else {
            place
        };
        if let Some(stg) = &mut s.staging {
            if empty {
                sys::ftruncate(&*stg.file, 0)?;
                stg.mark_written();
            }
            return Ok(());
        }
        // A hidden file with another hard link (made while unmounted) is
        // copied like a visible one: writing in place would change the
        // other name's bytes too. A plain file of the home is written in
        // place whatever its links, as any filesystem does.
        let in_place = match place {
            WritePlace::InPlace => true,
            WritePlace::InPlaceUnlinked => sys::fstat(&*s.live).is_ok_and(|st| st.st_nlink <= 1),
            WritePlace::Copy => false,
        };
        if in_place {
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
                    writer: None,
                });
                return Ok(());
            }
        }
        let (path, file) = self.spares.take()?;
        let result = (|| {
            // Made or emptied a while ago: an O_TRUNC open is a change now.
            // A write is no access: the access time stays the file's, and
            // the store's reads of the copy (its hash, its pages) must not
            // move it either.
            let st = sys::fstat(&*s.live)?;
            sys::set_noatime(&file);
            sys::futimens(&file, Time::At(st.st_atime, st.st_atime_nsec), Time::Now)?;
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
            writer: None,
        });
        Ok(())
    }

    pub fn open(&self, ino: Ino, flags: i32, caller: &Caller) -> FsResult<OpenReply> {
        if let Some(v) = decode(ino) {
            let file = self.history().open(v, flags)?;
            return Ok(OpenReply {
                fh: self.handles.insert_blob(file),
                no_flush: true,
                immutable: true,
                backing: None,
            });
        }
        // With FUSE_ATOMIC_O_TRUNC the kernel checks that no program runs
        // from the file only after this open emptied it when the open
        // takes no write access first (`O_RDONLY` or access mode 3 with
        // `O_TRUNC`; `O_WRONLY` and `O_RDWR` are refused before they come
        // here): the refused open would leave the file empty and the
        // program's pages gone. Refused here as the kernel would, first.
        if truncates_unguarded(flags) && self.runs_as_program(ino, true) {
            return Err(busy_program(ino));
        }
        let waited = opens_for_writing(flags) && self.wait_for_direct_readers(ino);
        let opened = self.retry_after_store(Some(ino), || {
            let _ns = self.namespace.read();
            match self.loc(ino) {
                Ok(loc) => {
                    // What a writer replaces is kept: a file found behind
                    // the daemon is recorded whole before it can change.
                    if opens_for_writing(flags) {
                        self.meet(&loc)?;
                    }
                    let of = self.open_live(ino, Ok(&loc))?;
                    self.finish_open(ino, Some(&loc), of, flags, true, caller)
                }
                Err(e) => {
                    // What a writer puts in it is lost, as on ext4: it
                    // is no longer any file's content. (Direct if its
                    // other handles are: the kernel takes no mix.)
                    let of = self.open_live(ino, Err(e))?;
                    self.finish_open(ino, None, of, flags, true, caller)
                }
            }
        });
        if waited {
            self.release_open(ino, false);
        }
        opened
    }

    /// `loc`: where the file is, `None` for one already replaced or removed.
    /// `may_pass`: the reply can hand the kernel a backing file (not for a
    /// file the tree no longer has).
    pub(super) fn finish_open(
        &self,
        ino: Ino,
        loc: Option<&Location>,
        of: Arc<OpenFile>,
        flags: i32,
        may_pass: bool,
        caller: &Caller,
    ) -> TryResult<OpenReply> {
        let write = opens_for_writing(flags);
        let direct = if may_pass {
            // (Refused: the handle `open_live` counted in goes again.)
            self.open_direct(ino, &of, loc, flags, write, caller)
                .inspect_err(|_| self.release_open(ino, false))?
        } else {
            None
        };
        if let Some(backing) = direct {
            let fh = self.handles.insert_file(FileHandle {
                ino,
                write,
                append: flags & libc::O_APPEND != 0,
                direct: true,
                program: counted_program(&of, flags, caller),
            });
            return Ok(OpenReply {
                fh,
                no_flush: !write,
                immutable: false,
                backing: Some(backing),
            });
        }
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
                // Decided again where the file is emptied: an exec may
                // have opened it since `open` looked (see `open`).
                if truncates_unguarded(flags) && program_alive(&s.programs) {
                    drop(s);
                    self.release_open(ino, true);
                    return Err(busy_program(ino).into());
                }
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
                if let Err(e) = self.ensure_staging(&mut s, true, self.write_place(loc)) {
                    drop(s);
                    self.release_open(ino, true);
                    return Err(e.into());
                }
                let stg = s.staging.as_mut().expect("just ensured");
                stg.written_by(caller);
                stg.trunc_only = true;
                if let Some(l) = loc {
                    self.touched(l);
                }
            }
        }
        let fh = self.handles.insert_file(FileHandle {
            ino,
            write,
            append: flags & libc::O_APPEND != 0,
            direct: false,
            program: counted_program(&of, flags, caller),
        });
        Ok(OpenReply {
            fh,
            no_flush: !write,
            immutable: false,
            backing: None,
        })
    }

    pub(super) fn file_handle(&self, fh: u64) -> FsResult<(Ino, bool, bool)> {
        match self.handles.file(fh) {
            Some(h) => Ok((h.ino, h.write, h.append)),
            None => Err(FsError::EBADF),
        }
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let blob = self.handles.blob(fh);
        let mut buf = vec![0u8; size as usize];
        let got = match blob {
            Some(b) => read_full(|buf, off| b.read_at(buf, off), &mut buf, offset)?,
            None => {
                let (ino, _, _) = self.file_handle(fh)?;
                let of = self.open_file(ino).ok_or(FsError::EBADF)?;
                let file = {
                    let s = of.lock();
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

    pub fn write(&self, fh: u64, offset: u64, data: &[u8], caller: &Caller) -> FsResult<u32> {
        let (ino, write, append) = self.file_handle(fh)?;
        if !write {
            return Err(FsError::EBADF);
        }
        let of = self.open_file(ino).ok_or(FsError::EBADF)?;
        // Only a writer without staging yet needs to know where the file is:
        // resolved before the open state is locked (lock order), under the
        // namespace lock held until the staging exists, so that a rename
        // cannot make it visible in between.
        let needs_place = of.lock().staging.is_none();
        let _ns = needs_place.then(|| self.namespace.read());
        let place = match needs_place {
            true => self.write_place(self.loc(ino).ok().as_ref()),
            false => WritePlace::Copy, // (unused: it has staging)
        };
        let mut s = of.lock();
        self.ensure_staging(&mut s, false, place)?;
        let stg = s.staging.as_mut().expect("just ensured");
        let offset = if append {
            sys::fstat(&*stg.file)?.st_size as u64
        } else {
            offset
        };
        stg.file.write_all_at(data, offset)?;
        stg.written_by(caller);
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
        if self.handles.is_blob(fh) {
            return Ok(());
        }
        let (ino, write, _) = self.file_handle(fh)?;
        if write && self.is_direct(fh) {
            // An empty file is most likely an `O_TRUNC` open's empty moment
            // (the daemon never sees the kernel's writes to tell): no
            // version; the last release records it if it stays empty.
            if let Some(of) = self.open_file(ino)
                && of
                    .lock()
                    .backing
                    .as_ref()
                    .is_some_and(|b| sys::fstat(&**b).is_ok_and(|st| st.st_size > 0))
            {
                self.record_direct(ino, &of, false, caller)?;
            }
            return Ok(());
        }
        if write {
            let trunc_only = self
                .open_file(ino)
                .is_some_and(|of| of.lock().staging.as_ref().is_some_and(|stg| stg.trunc_only));
            if !trunc_only {
                self.publish(ino, false, caller)?;
            }
        }
        Ok(())
    }

    pub fn fsync(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        if self.handles.is_blob(fh) {
            return Ok(());
        }
        let (ino, write, _) = self.file_handle(fh)?;
        if write
            && self.is_direct(fh)
            && let Some(of) = self.open_file(ino)
            && let Some(want) = self.record_direct(ino, &of, true, caller)?
        {
            self.versions.sync_through(&self.blobs, want)?;
        }
        self.publish(ino, true, caller)
    }

    fn is_direct(&self, fh: u64) -> bool {
        self.handles.file(fh).is_some_and(|h| h.direct)
    }

    pub fn release(&self, fh: u64, caller: &Caller) -> FsResult<()> {
        let h = self.handles.remove(fh)?;
        if let Some(FileHandle {
            ino,
            program: Some(pid),
            ..
        }) = h
            && let Some(of) = self.open_file(ino)
        {
            let mut s = of.lock();
            if let Some(i) = s.programs.iter().position(|&p| p == pid) {
                s.programs.swap_remove(i);
            }
        }
        let (ino, write) = match h {
            Some(FileHandle {
                ino,
                write,
                direct: true,
                ..
            }) => {
                let result = self.release_direct(ino, write, caller);
                self.release_open(ino, false);
                return result;
            }
            Some(FileHandle { ino, write, .. }) => (ino, write),
            None => return Ok(()),
        };
        let mut result = Ok(());
        if write && let Some(of) = self.open_file(ino) {
            // Usually the close's flush published everything already: only
            // a last writer with staged bytes needs the location.
            let pending = {
                let mut s = of.lock();
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
                let mut s = of.lock();
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
    /// lock, so no writer can open in between. Not while the file has
    /// direct handles (a writer's release can reach the daemon after a
    /// direct writer opened): the kernel reads and writes those on the
    /// backing file, around the pages a store would leave behind.
    pub(super) fn offer_pages(&self, ino: Ino, s: &OpenState) {
        if s.writers == 0 && s.direct == 0 && !s.staging.as_ref().is_some_and(|stg| stg.dirty) {
            let file = s.staging.as_ref().map_or(&s.live, |stg| &stg.file);
            // The store's reads must not move the file's access time (a
            // utime set right after the close would be lost to them).
            sys::set_noatime(&**file);
            self.notices.pages().queue(ino, Arc::clone(file));
        }
    }
}

/// Fills `buf` from `offset` until it is full or the end is reached.
fn read_full(
    read_at: impl Fn(&mut [u8], u64) -> std::io::Result<usize>,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = read_at(&mut buf[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// How a writer's bytes reach the file (see `open::ensure_staging`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum WritePlace {
    /// A staging copy, published by swap (a versioned or untracked file).
    Copy,
    /// In place, unless the file has another hard link (a hidden file).
    InPlaceUnlinked,
    /// In place (a plain file of the home).
    InPlace,
}

/// Whether an open of `flags` may change the file: `O_RDONLY | O_TRUNC`
/// truncates too (with FUSE_ATOMIC_O_TRUNC the kernel counts on the open
/// to have done it).
pub(super) fn opens_for_writing(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}
