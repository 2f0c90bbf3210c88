//! Namespace calls that remove or move: unlink, rmdir, and `rename` (its
//! own module; the calls that make a name are `create`).
//!
//! Owns: each change of the tree and its journal record (a rename's
//! `journal_move` tells a rename from a park or an unpark), the publish of
//! staged bytes about to be replaced or to leave the versioned tree, and
//! the orphaning of a removed directory's hidden children. A file renamed
//! to an untracked name beside it (an editor's backup) has its removal held
//! back (`Ledger::defer`); a new file or a rename at its path resumes its
//! history (`create::create_once`, `journal_move`).
//! Invariants: each holds `namespace` exclusively (`ns_write`) for the
//! system call and the inode table update, so a location resolved under the
//! shared lock stays valid until it is released; a change is made only
//! when the journal has room for its record (`journal_room`); removals are
//! never refused for want of room. Locks: `namespace` → `tree` →
//! `open_files` → an `OpenFile` → `ledger`.

use super::*;

impl SkillFs {
    pub fn unlink(&self, parent: Ino, name: &[u8], caller: &Caller) -> FsResult<()> {
        self.remove(parent, name, false, caller)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8], caller: &Caller) -> FsResult<()> {
        self.remove(parent, name, true, caller)
    }

    pub(super) fn remove(
        &self,
        parent: Ino,
        name: &[u8],
        dir: bool,
        caller: &Caller,
    ) -> FsResult<()> {
        self.writable(parent, name, false)?;
        self.pinned(parent, name)?;
        // Not refused for want of journal room: removing files is how a
        // full disk is freed. Its record takes what room is left (the
        // reserve of `ensure_room`), and past that the next mount's scan
        // records the removal.
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        let f = self.find(parent, &ploc, name)?;
        let is_dir = f.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if dir && is_dir && f.loc.is_hidden() && !self.outside(&f.loc) {
            // Inside a hidden tree the listing shows attached children too:
            // a directory that lists entries is not empty.
            let key = sys::dir_key(self.at(&f.loc), &f.loc.phys)?;
            if sys::read_dir_at(self.parked_dir(), key.as_bytes()).is_ok_and(|v| !v.is_empty()) {
                return Err(FsError::ENOTEMPTY);
            }
        }
        if !is_dir {
            self.publish_dirty_under(&f.loc, caller)?;
        }
        // What is removed is kept, found behind the daemon or not.
        self.meet(&f.loc)?;
        // A directory whose only children are hidden is empty underneath
        // (they are attached, elsewhere): it is removed and they become
        // orphans. Its key is taken before it is gone.
        let key = if dir && is_dir {
            Some(sys::dir_key(self.at(&f.loc), &f.loc.phys)?)
        } else {
            None
        };
        let last_ref = (!is_dir)
            .then(|| self.hold_name(parent, name, &f.loc))
            .flatten();
        sys::unlinkat(self.at(&f.loc), &f.loc.phys, dir)?;
        self.touched(&f.loc);
        self.keep_stale(parent, name, last_ref);
        {
            let mut tree = self.tree.lock();
            if is_dir {
                tree.keep_gone(parent, name, f.st);
            }
            tree.detach(parent, name);
        }
        if let Some(p) = &self.versioned(&f.loc, kind_of(&f.st).unwrap_or(Kind::File))
            && special_of(&f.st) == 0
        {
            let op = if dir { Op::Rmdir } else { Op::Unlink };
            self.record(Change::new(op, p.clone(), None), caller);
        }
        if let Some(key) = key {
            self.orphan_attached(&key, &f.loc.logical, caller);
        }
        Ok(())
    }

    /// The directory `name` of `parent`, just moved out of the versioned
    /// tree to `at` (outside, where no rule hides anything): the hidden
    /// entries attached to it and to every directory below it are moved
    /// into those directories, as they would be on a plain filesystem, and
    /// their parks removed. Walked under the rename's lock, once. A name
    /// taken there (never, by the invariant that a name is in one place)
    /// leaves its entry in the park, swept in time as an orphan.
    pub(super) fn bring_hidden_out(&self, parent: Ino, name: &[u8], at: &Location) {
        let parked = self.parked_dir();
        let mut moved = false;
        let mut stack = vec![at.phys.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(key) = sys::dir_key(self.at(at), &dir) else {
                continue;
            };
            let inside = |n: &[u8]| [dir.as_slice(), b"/", n].concat();
            if let Ok(entries) = sys::read_dir_at(parked, key.as_bytes()) {
                for e in entries {
                    let from = [key.as_bytes(), b"/", &e.name].concat();
                    let to = inside(&e.name);
                    match sys::renameat2(parked, &from, self.at(at), &to, libc::RENAME_NOREPLACE) {
                        Ok(()) => moved = true,
                        Err(err) => tracing::warn!(
                            "a hidden entry of {} stays in its park: {err}",
                            at.logical
                        ),
                    }
                }
                let _ = sys::unlinkat(parked, key.as_bytes(), true);
                self.parks.removed(&key);
                self.freezes.touched(Area::Parked, key.as_bytes());
            }
            for e in sys::read_dir_at(self.at(at), &dir).unwrap_or_default() {
                let p = inside(&e.name);
                let is_dir = match e.d_type {
                    libc::DT_DIR => true,
                    libc::DT_UNKNOWN => sys::lstatat(self.at(at), &p)
                        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
                    _ => false,
                };
                if is_dir {
                    stack.push(p);
                }
            }
        }
        if moved {
            let mut tree = self.tree.lock();
            if let Some(top) = tree.child(parent, name) {
                for i in tree.subtree(top) {
                    tree.set_attached(i, false);
                }
            }
        }
    }

    /// Removes `other`, a non-directory (or an empty directory) in the other place that a rename
    /// just made replaced (see `rename`), as an unlink would, journaled
    /// before the rename's own record. A failure is logged: the rename is
    /// made, and the next mount settles the name.
    pub(super) fn remove_other(&self, other: &Found, caller: &Caller) {
        let dir = kind_of(&other.st) == Some(Kind::Dir);
        let last_ref = (!dir).then(|| self.hold(&other.loc)).flatten();
        if let Err(e) = sys::unlinkat(self.at(&other.loc), &other.loc.phys, dir) {
            tracing::error!(
                "could not remove {} replaced by a rename: {e}",
                other.loc.logical
            );
            return;
        }
        self.free_later(last_ref);
        let kind = kind_of(&other.st).unwrap_or(Kind::File);
        if let Some(p) = self.versioned(&other.loc, kind) {
            let op = if dir { Op::Rmdir } else { Op::Unlink };
            self.record(Change::new(op, p, None), caller);
        }
    }

    /// After an exchange an entry of `kind` now called `name` in `parent`
    /// sits at `at`, the other entry's place. A rule that names one kind
    /// (`.*.tmp:file`) can make that the wrong place for this one (hidden
    /// where it should be listed, or the reverse): then it is moved to its
    /// own, which is free (the name was only in the other), and where it
    /// went is returned. A move that fails is logged and left to the next
    /// mount, which places every entry by the rules again.
    pub(super) fn settle_exchanged(
        &self,
        at: &Location,
        attached: bool,
        parent: Ino,
        ploc: &Location,
        name: &[u8],
        kind: Kind,
    ) -> Option<(Location, bool)> {
        let target = (kind == Kind::Symlink)
            .then(|| sys::readlinkat(self.at(at), &at.phys).ok())
            .flatten();
        let (want, want_att) = match self.place(parent, ploc, name, kind, target.as_deref()) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("could not place {} after an exchange: {e:?}", at.logical);
                return None;
            }
        };
        if want_att == attached {
            return None;
        }
        let moved = sys::renameat2(
            self.at(at),
            &at.phys,
            self.at(&want),
            &want.phys,
            libc::RENAME_NOREPLACE,
        );
        match moved {
            Ok(()) => Some((want, want_att)),
            Err(e) => {
                tracing::error!(
                    "could not move {} to its place after an exchange: {e}",
                    at.logical
                );
                None
            }
        }
    }

    /// Journals one entry moving from `from` to `to` (its new location),
    /// by versioning: a rename, a park, an unpark, or nothing. The move is
    /// made; a failure to journal it is logged and left to the next scan.
    pub(super) fn journal_move(
        &self,
        from: &Location,
        to: &Location,
        kind: Kind,
        noreplace: bool,
        plan: &mut Option<UnparkPlan>,
        caller: &Caller,
    ) {
        match (self.versioned(from, kind), self.versioned(to, kind)) {
            (Some(a), Some(b)) => {
                self.versions.ledger().resume(&b);
                let mut c = Change::new(Op::Rename, a, None);
                c.to = Some(b);
                c.noreplace = noreplace;
                self.record(c, caller);
            }
            (Some(a), None) => {
                let mut c = Change::new(Op::Park, a.clone(), None);
                // Only a hidden name is recorded: an untracked one is an
                // editor's scratch, kept out of the log.
                c.hidden = to.visible.is_none().then(|| to.logical.clone());
                // A file renamed to an untracked name beside it is how
                // vim, emacs and JetBrains IDEs make their backup before
                // writing the file anew: its removal waits a moment.
                let backup = to
                    .visible
                    .as_ref()
                    .is_some_and(|t| t.parent() == a.parent());
                if kind == Kind::File && backup {
                    self.versions.ledger().defer(c, caller.actor());
                } else {
                    self.record(c, caller);
                }
            }
            (None, Some(b)) => {
                // A removal of `b` held back is void: `b` is there again,
                // and the unpark records it if it differs.
                self.versions.ledger().resume(&b);
                if let Err(e) = self.unpark(&b, from, plan.take(), caller) {
                    tracing::error!("could not settle {b} after it became visible: {e:?}");
                }
            }
            (None, None) => {}
        }
    }
}
