//! Namespace calls that make a name: create, mkdir, symlink, mknod.
//!
//! Owns: each new entry and its journal record; a new file where a file
//! was just renamed to an editor's backup name resumes that path's history
//! (`Ledger::resume`) instead of recording a creation.
//! Invariants: each holds `namespace` exclusively (`ns_write`) for the
//! system call and the inode table update; a name is made only when the
//! journal has room for its record (`journal_room`), in a directory the
//! journal has (`meet`); a file this create made is the daemon's own, one
//! it opens that was there is met first. Locks: `namespace` → `tree` →
//! `open_files` → an `OpenFile` → `ledger`.

use super::*;

impl SkillFs {
    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> FsResult<Entry> {
        self.make(parent, name, Kind::Dir, None, caller, |loc| {
            self.new_dir_at(loc, mode & 0o7777)
        })
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: &Caller,
    ) -> FsResult<Entry> {
        self.make(parent, name, Kind::Symlink, Some(target), caller, |loc| {
            sys::symlinkat(target, self.at(loc), &loc.phys)
        })
    }

    /// Creates a new directory, symlink, or (`kind` `File`) FIFO or socket
    /// `name` in `parent` where the hide rules place it, and journals it
    /// when it is versioned (never a FIFO or socket).
    pub(super) fn make(
        &self,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        target: Option<&[u8]>,
        caller: &Caller,
        create: impl FnOnce(&Location) -> std::io::Result<()>,
    ) -> FsResult<Entry> {
        self.writable(parent, name, true)?;
        self.journal_room()?;
        check_name(name)?;
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        // A name is recorded in a directory the journal has.
        self.meet(&ploc)?;
        let (loc, attached) = self.place(parent, &ploc, name, kind, target)?;
        if self
            .in_other_place(parent, &ploc, name, attached)?
            .is_some()
        {
            return Err(FsError::EEXIST);
        }
        let made = create(&loc);
        self.touched(&loc);
        made?;
        self.give_to_caller(&loc, caller);
        let st = loc.lstat(self.area_dirs()).inspect_err(|_| {
            // Made, but answered as failed: the kernel's negative entry for
            // the name (see `absence_is_cacheable`) must go.
            self.invalidate_entry(parent, name.to_vec());
        })?;
        let ino = self.tree.lock().link(parent, name, kind, attached);
        // `File` here is a FIFO or socket from `mknod`: not versioned.
        if kind != Kind::File
            && let Some(p) = &self.versioned(&loc, kind)
        {
            let mut state = state_from_stat(&st, kind);
            state.target = target.map(|t| ByteString(t.to_vec()));
            let op = if kind == Kind::Dir {
                Op::Mkdir
            } else {
                Op::Symlink
            };
            self.record(Change::new(op, p.clone(), Some(state)), caller);
        }
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, None, st), // a directory or symlink
            ttl: Ttl::Live,
        })
    }

    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> FsResult<(Entry, OpenReply)> {
        // The inode is not known before the lookup: wait for any store.
        self.retry_after_store(None, || self.create_once(parent, name, mode, flags, caller))
            .inspect_err(|_| {
                // It may have failed after the file was made (no spare
                // left, say): the kernel's negative entry for the name (see
                // `absence_is_cacheable`) must go.
                self.invalidate_entry(parent, name.to_vec());
            })
    }

    pub(super) fn create_once(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: &Caller,
    ) -> TryResult<(Entry, OpenReply)> {
        self.writable(parent, name, true)?;
        check_name(name)?;
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        let (loc, attached, created) = match self.find(parent, &ploc, name) {
            Ok(_) if flags & libc::O_EXCL != 0 => return Err(FsError::EEXIST.into()),
            Ok(f) => (f.loc, f.attached, false),
            Err(e) if e.is(libc::ENOENT) => {
                self.journal_room()?;
                // A name is recorded in a directory the journal has.
                self.meet(&ploc)?;
                let (loc, attached) = self.place(parent, &ploc, name, Kind::File, None)?;
                self.new_file_at(&loc, mode & 0o7777, caller)?;
                self.touched(&loc);
                (loc, attached, true)
            }
            Err(e) => return Err(e.into()),
        };
        // An existing file opened to be written: what it holds is kept
        // first if the daemon never saw it (`meet`); one this create made
        // is the daemon's own (recorded below, or its path resumed).
        if !created && super::open::opens_for_writing(flags) {
            self.meet(&loc)?;
        }
        let st = loc.lstat(self.area_dirs())?;
        let kind = kind_of(&st).ok_or(Attempt::Failed(FsError::EPERM))?;
        if kind == Kind::Dir {
            return Err(FsError::EISDIR.into());
        }
        let ino = self.tree.lock().link(parent, name, kind, attached);
        // A create that finds the file (the kernel's negative entry was
        // stale) and empties it: the kernel checks for a running program
        // only once this is answered (see `open`).
        if !created && flags & libc::O_TRUNC != 0 && self.runs_as_program(ino, false) {
            // (The kernel gets no entry: the lookup `link` counted goes.)
            self.tree.lock().forget(ino, 1);
            return Err(super::programs::busy_program(ino).into());
        }
        let record_create = |p: &RelPath| {
            // From the content stored to its record: no prune starts between.
            let _writing = self.blobs.writing();
            match self.blobs.put_bytes(b"", false) {
                Ok(blob) => self.record(
                    Change::new(Op::Create, p.clone(), Some(empty_blob_state(&st, blob))),
                    caller,
                ),
                Err(e) => tracing::error!("could not journal the creation of {p}: {e}"),
            }
        };
        // A new file where a file was just renamed to an editor's backup
        // name (`Ledger::defer`): the same path's history goes on. Opened
        // as if truncating, so that its last release publishes whatever
        // it holds then as the next version (none if it is the old
        // content again).
        let mut resumed = None;
        if created && let Some(p) = self.versioned(&loc, Kind::File) {
            if self.versions.ledger().resume(&p) {
                resumed = Some(p);
            } else {
                record_create(&p);
            }
        }
        let flags = match resumed {
            Some(_) => flags | libc::O_TRUNC,
            None => flags,
        };
        let opened = self
            .open_live(ino, Ok(&loc))
            .map_err(Attempt::from)
            .and_then(|of| self.finish_open(ino, Some(&loc), of, flags, true, caller));
        let reply = match opened {
            Ok(r) => r,
            Err(e) => {
                // Not opened: nothing will publish it, so it is recorded
                // as what it is, new and empty.
                if let Some(p) = &resumed {
                    record_create(p);
                }
                self.tree.lock().forget(ino, 1);
                return Err(e);
            }
        };
        Ok((
            Entry {
                ino,
                stat: self.finish_stat(ino, self.open_file(ino).as_deref(), st),
                ttl: Ttl::Live,
            },
            reply,
        ))
    }

    /// `mknod` of a regular file is a create without an open handle. A
    /// FIFO or a socket (a skill's helper binding a unix socket in its
    /// folder) is made in place, like any scratch file, and never
    /// versioned; device nodes are not kept in a skills tree.
    pub fn mknod(&self, parent: Ino, name: &[u8], mode: u32, caller: &Caller) -> FsResult<Entry> {
        self.writable(parent, name, true)?;
        match mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFIFO | libc::S_IFSOCK => {
                return self.make(parent, name, Kind::File, None, caller, |loc| {
                    sys::mknodat(self.at(loc), &loc.phys, mode & (libc::S_IFMT | 0o7777))
                });
            }
            _ => return Err(FsError::EPERM),
        }
        let (entry, reply) =
            self.create(parent, name, mode, libc::O_RDONLY | libc::O_EXCL, caller)?;
        self.release(reply.fh, caller)?;
        Ok(entry)
    }
}
