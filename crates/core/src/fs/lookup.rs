//! What the kernel knows: lookups, the inode table's reference counts,
//! attributes, symlink targets and `statfs`.
//!
//! Owns: `lookup`/`forget`, the files kept for a path resolved just before
//! a rename or unlink replaced it (`keep_stale`, `stale`), the inodes seen
//! with more than one name (`shared`), and the attributes answered
//! (`finish_stat`: an open file's staged size and times win).
//! Locks: `namespace` shared for the resolution; `tree` briefly (`stale`
//! and `shared` are `kept`'s leaves).

use super::*;

impl SkillFs {
    /// Whether the kernel may remember that `name` is missing from
    /// `parent` (a negative entry) as long as an entry. In the live tree a
    /// name appears only through the kernel (create, mkdir, symlink,
    /// rename), which replaces its negative entry itself; what the daemon
    /// removes behind it it invalidates. Not so under `.history`, which
    /// grows with every change, nor for `.history` itself, which exists in
    /// a directory only while that directory is visible.
    pub(super) fn absence_is_cacheable(&self, parent: Ino, name: &[u8]) -> bool {
        !is_virtual(parent) && (name != HISTORY || self.tree.lock().is_outside(parent))
    }

    /// `lookup` as the kernel asks it: a name missing where its absence may
    /// be cached (`absence_is_cacheable`) is a negative entry (inode 0)
    /// with a timeout, so the kernel answers the next lookups of the name
    /// itself (`copy2` stats its destination twice before creating it,
    /// `exists()` probes).
    pub fn lookup_or_negative(&self, parent: Ino, name: &[u8]) -> FsResult<Entry> {
        match self.lookup(parent, name) {
            Err(e) if e.is(libc::ENOENT) && self.absence_is_cacheable(parent, name) => {
                Ok(Entry {
                    ino: 0,
                    // SAFETY: `stat` is plain data; all zeros is a valid value.
                    stat: unsafe { std::mem::zeroed() },
                    ttl: Ttl::Live,
                })
            }
            r => r,
        }
    }

    /// Hard links are refused: a new version replaces the live file by
    /// rename, which would silently split the links; and a link between the
    /// home and the versioned tree would let a write to the home's name
    /// change a versioned file with no version.
    pub fn link(&self, _ino: Ino, _newparent: Ino, _newname: &[u8]) -> FsResult<Entry> {
        Err(FsError::EPERM)
    }

    /// Extended attributes are not kept (a version would have to carry
    /// them). `ENOSYS` makes the kernel stop asking and answer `ENOTSUP`
    /// itself, which `cp -a` and `shutil.copystat` take as "no xattrs".
    pub fn xattr(&self, _ino: Ino) -> FsResult<()> {
        Err(FsError::ENOSYS)
    }

    /// Directories are not opened: `ENOSYS` makes the kernel list them
    /// without a handle (`readdir` offsets name a listing, see `listing`).
    pub fn opendir(&self, _ino: Ino) -> FsResult<u64> {
        Err(FsError::ENOSYS)
    }

    /// Permissions are checked by the kernel (`default_permissions`).
    pub fn access(&self, _ino: Ino, _mask: i32) -> FsResult<()> {
        Ok(())
    }

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<Entry> {
        if name.len() > NAME_MAX {
            return Err(FsError::ENAMETOOLONG);
        }
        if let Some(v) = decode(parent) {
            return self.history().lookup(v, name);
        }
        if self.pinned(parent, name).is_err() {
            // The versioned root in its home: always that inode, whatever
            // was done to the name underneath.
            return self.getattr(self.vroot);
        }
        let _ns = self.namespace.read();
        if name == HISTORY && !self.tree.lock().is_outside(parent) {
            let path = self.loc(parent)?.visible.ok_or(FsError::ENOENT)?;
            return self.history().listing_of(&path);
        }
        let ploc = self.loc(parent)?;
        let swaps = self.swaps.load(Ordering::SeqCst);
        let f = self.find(parent, &ploc, name)?;
        let kind = node_kind(&f.st).ok_or(FsError::ENOENT)?;
        let ino = self.tree.lock().link(parent, name, kind, f.attached);
        let of = self.open_file(ino);
        // `find` stat'ed before the open state was looked up (see
        // `finish_stat`): if a version was swapped in since, and the file
        // is not open, stat again.
        let st = match &of {
            None if self.swaps.load(Ordering::SeqCst) != swaps => {
                f.loc.lstat(self.area_dirs()).unwrap_or(f.st)
            }
            _ => f.st,
        };
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, of.as_deref(), st),
            ttl: Ttl::Live,
        })
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        let gone = {
            let mut tree = self.tree.lock();
            tree.forget(ino, n);
            !tree.knows(ino)
        };
        if gone {
            let file = self.stale.take(ino);
            self.free_later(file);
        }
    }

    /// A reference to the file `parent/name` at `loc`, taken before a call
    /// that unlinks or replaces it (see `hold`). Where the kernel knows its
    /// inode, taken whatever the janitor's backlog, to be kept for the
    /// kernel's late opens (`keep_stale`).
    pub(super) fn hold_name(&self, parent: Ino, name: &[u8], loc: &Location) -> Option<File> {
        let known = self.tree.lock().child(parent, name).is_some();
        if known && self.stale.has_room() {
            return sys::openat(
                self.at(loc),
                &loc.phys,
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0,
            )
            .ok();
        }
        self.hold(loc)
    }

    /// Remembers `f`'s inode as shared (see `shared`) when it has more than
    /// `names` links.
    pub(super) fn note_if_shared(&self, f: &File, names: u64) {
        self.shared.note(f, names);
    }

    /// Keeps `held` (from `hold_name`: the file `parent/name`, just
    /// unlinked or replaced) for the kernel's late opens of its inode, if
    /// the kernel knows one, until it forgets it; otherwise it is freed off
    /// the request path. Called under the namespace lock, before the tree
    /// forgets the name.
    pub(super) fn keep_stale(&self, parent: Ino, name: &[u8], held: Option<File>) {
        let known = self.tree.lock().child(parent, name);
        if let Some(f) = held.as_ref() {
            // Another name still has it: it may be written through that one.
            self.note_if_shared(f, 0);
        }
        if let (Some(ino), Some(f)) = (known, held.as_ref())
            && self.stale.keep(ino, f)
        {
            // The kept one holds the inode: closing this frees nothing.
            return;
        }
        self.free_later(held);
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Entry> {
        if let Some(v) = decode(ino) {
            let ttl = match v {
                // The root's own mode and owner are not versioned: a
                // snapshot of the root shows the current ones.
                // Another replica's entries are owned like the root too.
                VNode::Listing(_) | VNode::Snap(history::ROOT_IDX, _) | VNode::Theirs(..) => {
                    Ttl::Volatile
                }
                VNode::Snap(..) => Ttl::Immutable,
            };
            return self.history().attr(v, ttl);
        }
        let _ns = self.namespace.read();
        // Looked up before the stat (see `finish_stat`).
        let of = self.open_file(ino);
        let st = match self.loc(ino) {
            Ok(loc) => loc.lstat(self.area_dirs())?,
            Err(e) => {
                // A removed directory still open somewhere: as it was.
                if let Some(st) = self.tree.lock().gone(ino) {
                    return Ok(Entry {
                        ino,
                        stat: self.finish_stat(ino, None, st),
                        ttl: Ttl::Live,
                    });
                }
                // Unlinked but open: the open file still has attributes.
                let Some(of) = of.as_ref() else {
                    // Replaced or removed just after the kernel resolved a
                    // path to it: as it is now, as on ext4.
                    if let Some(st) = self.stale.stat(ino) {
                        let mut st = st?;
                        st.st_ino = ino;
                        return Ok(Entry {
                            ino,
                            stat: st,
                            ttl: Ttl::Live,
                        });
                    }
                    return Err(e);
                };
                let s = of.lock();
                let mut st = sys::fstat(&*s.live)?;
                st.st_nlink = 0;
                st
            }
        };
        Ok(Entry {
            ino,
            stat: self.finish_stat(ino, of.as_deref(), st),
            ttl: Ttl::Live,
        })
    }

    /// Attributes as the kernel must see them: our inode number, and the
    /// staged size and times while a writer has unpublished bytes.
    ///
    /// Of an open file (`of`, looked up before `st` was taken), they come
    /// from the open state, not from `st`: that stat of the path may predate
    /// a publish that swapped a new file in, and a reply with the old size,
    /// sent after the kernel's last write, would be taken as newer than it
    /// (seen as short reads). A stat taken after finding no open state is
    /// current: an open state outlives its publishes.
    pub(super) fn finish_stat(
        &self,
        ino: Ino,
        of: Option<&OpenFile>,
        mut st: libc::stat,
    ) -> libc::stat {
        if let Some(of) = of {
            let s = of.lock();
            let fresh = match &s.staging {
                Some(stg) => sys::fstat(&*stg.file).ok(),
                None => {
                    if let Ok(live) = sys::fstat(&*s.live)
                        && live.st_nlink > 0
                    {
                        st = live;
                    }
                    None
                }
            };
            if let Some(f) = fresh {
                st.st_size = f.st_size;
                st.st_blocks = f.st_blocks;
                st.st_mtime = f.st_mtime;
                st.st_mtime_nsec = f.st_mtime_nsec;
                st.st_ctime = f.st_ctime;
                st.st_ctime_nsec = f.st_ctime_nsec;
            }
        }
        st.st_ino = ino;
        st
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        if let Some(v) = decode(ino) {
            return self.history().readlink(v);
        }
        let _ns = self.namespace.read();
        let loc = self.loc(ino)?;
        Ok(sys::readlinkat(self.at(&loc), &loc.phys)?)
    }

    pub fn statfs(&self) -> FsResult<libc::statvfs> {
        Ok(sys::fstatvfs(&self.root_fd)?)
    }
}
