//! Namespace calls that remove or move: unlink, rmdir, rename (the calls
//! that make a name are `create`).
//!
//! Owns: each change of the tree and its journal record (`journal_move`
//! tells a rename from a park or an unpark), the publish of staged bytes
//! about to be replaced or to leave the versioned tree, and the orphaning
//! of a removed directory's hidden children. A file renamed to an
//! untracked name beside it (an editor's backup) has its removal held back
//! (`Ledger::defer`); a new file or a rename at its path resumes its
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
            let key = sys::dir_key(f.loc.dirfd, &f.loc.phys)?;
            if sys::read_dir_at(self.parked_raw(), key.as_bytes()).is_ok_and(|v| !v.is_empty()) {
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
            Some(sys::dir_key(f.loc.dirfd, &f.loc.phys)?)
        } else {
            None
        };
        let last_ref = (!is_dir)
            .then(|| self.hold_name(parent, name, &f.loc))
            .flatten();
        sys::unlinkat(f.loc.dirfd, &f.loc.phys, dir)?;
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

    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
        caller: &Caller,
    ) -> FsResult<()> {
        self.writable(parent, name, false)?;
        self.writable(newparent, newname, false)?;
        self.pinned(parent, name)?;
        self.pinned(newparent, newname)?;
        self.journal_room()?;
        check_name(newname)?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(FsError::EINVAL);
        }
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        // An unpark's plan stores contents that its records name only
        // under the rename's lock: no prune starts between.
        let _writing = self.blobs.writing();
        let mut plan = if exchange {
            None
        } else {
            self.plan_unpark(parent, name, newparent, newname, flags)?
        };
        let _ns = self.ns_write();
        let ploc = self.loc(parent)?;
        let nploc = self.loc(newparent)?;
        let src = self.find(parent, &ploc, name)?;
        let kind = node_kind(&src.st).ok_or(FsError::EPERM)?;
        let src_special = special_of(&src.st) != 0;
        if parent == newparent && name == newname {
            return Ok(());
        }
        // A non-directory in the other place that this rename replaces.
        let mut replaced_other = None;
        let (dst, dst_att) = if exchange {
            // Each entry takes the other's place; see `settle_exchanged`.
            let d = self.find(newparent, &nploc, newname)?;
            (d.loc, d.attached)
        } else {
            let target = (kind == Kind::Symlink)
                .then(|| sys::readlinkat(src.loc.dirfd, &src.loc.phys).ok())
                .flatten();
            let (d, att) = self.place(newparent, &nploc, newname, kind, target.as_deref())?;
            if let Some(other) = self.in_other_place(newparent, &nploc, newname, att)? {
                // The target name exists in the other place: only possible
                // for entries of different kinds (a rule that names one
                // kind, or a rule that changed).
                if flags & libc::RENAME_NOREPLACE != 0 {
                    return Err(FsError::EEXIST);
                }
                let other_dir = other.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
                match (kind == Kind::Dir, other_dir) {
                    (true, false) => return Err(FsError::ENOTDIR),
                    (false, true) => return Err(FsError::EISDIR),
                    // A directory replaces an empty directory, as ext4
                    // would (an exchange can leave a directory's attached
                    // child in the other place once it is hidden); one with
                    // entries, in either of its places, is ENOTEMPTY.
                    (true, true) => {
                        let key = sys::dir_key(other.loc.dirfd, &other.loc.phys)?;
                        let empty = |fd, rel: &[u8]| match sys::read_dir_at(fd, rel) {
                            Ok(e) => e.is_empty(),
                            Err(e) => enoent(&e),
                        };
                        if !empty(other.loc.dirfd, &other.loc.phys)
                            || !empty(self.parked_raw(), key.as_bytes())
                        {
                            return Err(FsError::of(libc::ENOTEMPTY));
                        }
                        replaced_other = Some(other);
                    }
                    // A non-directory replaces a non-directory, as ext4
                    // would: removed once the rename is made (two steps,
                    // not one; a failed rename leaves it as it was).
                    (false, false) => {
                        self.publish_dirty_under(&other.loc, caller)?;
                        replaced_other = Some(other);
                    }
                }
            }
            (d, att)
        };
        // Staged bytes of what is replaced, or leaves the versioned tree,
        // are published first.
        let dst_st = dst.lstat().ok();
        if dst_st.is_some() {
            self.publish_dirty_under(&dst, caller)?;
        }
        // (An untracked name is visible, but leaves the versioned tree all
        // the same: vim's `SKILL.md~`.)
        let leaves =
            self.versioned(&src.loc, kind).is_some() && self.versioned(&dst, kind).is_none();
        if exchange || dst.is_hidden() || leaves {
            self.publish_dirty_under(&src.loc, caller)?;
        }
        // What moves and what it replaces are in the journal as they are
        // (the move's record carries what the catalog has), and so is the
        // directory a name is made in.
        self.meet(&src.loc)?;
        self.meet(&dst)?;
        // Two names of one file (hard links made while unmounted, which the
        // kernel sees as two inodes): renameat2 would leave both, as rename(2)
        // says; the kernel takes the rename as made and moves its entry, so
        // the source name goes (below), as it believes. A record says so.
        // Judged on the files as they are now: a publish above swaps a new
        // inode in (a name written since stopped being the other's file).
        let dst_st = dst.lstat().ok();
        let same_file = match (&dst_st, src.loc.lstat()) {
            (Some(d), Ok(s)) => d.st_dev == s.st_dev && d.st_ino == s.st_ino,
            _ => false,
        };
        if same_file && flags & libc::RENAME_NOREPLACE != 0 {
            return Err(FsError::EEXIST);
        }
        // A directory replaced by this rename takes its hidden children's
        // attachment with it: they become orphans.
        let dst_is_dir = dst_st.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
        let replaced_key = if !exchange && dst_is_dir {
            sys::dir_key(dst.dirfd, &dst.phys).ok()
        } else {
            None
        };
        let last_ref = (!exchange && dst_st.is_some() && !dst_is_dir)
            .then(|| self.hold_name(newparent, newname, &dst))
            .flatten();
        if !same_file {
            sys::renameat2(src.loc.dirfd, &src.loc.phys, dst.dirfd, &dst.phys, flags)?;
        } else if !exchange {
            sys::unlinkat(src.loc.dirfd, &src.loc.phys, false)?;
        }
        self.keep_stale(newparent, newname, last_ref);
        if let Some(other) = &replaced_other {
            self.remove_other(other, caller);
        }
        // Where each entry ends up: the source's at the new name, the
        // target's (exchanged) at the old one; moved only after an exchange.
        let b_kind = dst_st.as_ref().and_then(kind_of);
        let (a_moved, b_moved) = match b_kind {
            Some(b_kind) if exchange => (
                self.settle_exchanged(&dst, dst_att, newparent, &nploc, newname, kind),
                self.settle_exchanged(&src.loc, src.attached, parent, &ploc, name, b_kind),
            ),
            _ => (None, None),
        };
        let (a_at, a_att) = a_moved.as_ref().map_or((&dst, dst_att), |(l, a)| (l, *a));
        let (b_at, b_att) = b_moved
            .as_ref()
            .map_or((&src.loc, src.attached), |(l, a)| (l, *a));
        {
            let mut tree = self.tree.lock();
            if exchange {
                tree.exchange(parent, name, newparent, newname, b_att, a_att);
            } else {
                if let Some(st) = dst_st.filter(|_| dst_is_dir) {
                    tree.keep_gone(newparent, newname, st);
                }
                if let Some(other) = replaced_other
                    .as_ref()
                    .filter(|o| kind_of(&o.st) == Some(Kind::Dir))
                {
                    tree.keep_gone(newparent, newname, other.st);
                }
                tree.move_entry(parent, name, newparent, newname, dst_att);
            }
        }
        if let Some(key) = replaced_key {
            self.orphan_attached(&key, &dst.logical, caller);
        }
        // A directory of the versioned tree moved out of it: its hidden
        // entries come along (before the notices below go out).
        if kind == Kind::Dir && !src.loc.is_hidden() && self.outside(a_at) {
            self.bring_hidden_out(newparent, newname, a_at);
        }
        if exchange && b_kind == Some(Kind::Dir) && !dst.is_hidden() && self.outside(b_at) {
            self.bring_hidden_out(parent, name, b_at);
        }
        // A directory that moved between the hidden and the visible tree
        // lists differently (whole while hidden, filtered while visible);
        // nothing in it changed, so the kernel would keep the old listing.
        let crossed = src.loc.is_hidden() != a_at.is_hidden()
            || (exchange && dst.is_hidden() != b_at.is_hidden());
        if crossed {
            let moved: Vec<Ino> = {
                let tree = self.tree.lock();
                let mut v = Vec::new();
                for (p, n) in [(newparent, newname), (parent, name)] {
                    if let Some(i) = tree.child(p, n) {
                        v.extend(tree.subtree(i));
                    }
                }
                v
            };
            for i in moved {
                self.invalidate(i);
            }
            // A directory lists differently now: the reply must not let a
            // listing read overtake the notice.
            if kind == Kind::Dir || (exchange && b_kind == Some(Kind::Dir)) {
                self.invalidations_delivered();
            }
        }
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        // FIFOs and sockets are never versioned: a move of one journals
        // only what it replaced (a versioned file, now gone).
        let dst_special = dst_st.as_ref().is_some_and(|st| special_of(st) != 0);
        if src_special || (exchange && dst_special) {
            if exchange {
                if !src_special {
                    self.journal_move(&src.loc, a_at, kind, false, &mut plan, caller);
                }
                if let Some(b_kind) = b_kind.filter(|_| !dst_special) {
                    self.journal_move(&dst, b_at, b_kind, false, &mut plan, caller);
                }
            } else if let Some(dst_kind) = dst_st.as_ref().and_then(kind_of)
                && !dst_special
                && let Some(p) = self.versioned(&dst, dst_kind)
            {
                self.record(Change::new(Op::Unlink, p, None), caller);
            }
        } else if exchange {
            let b_kind = b_kind.unwrap_or(Kind::File);
            let moves = [(&src.loc, a_at, kind), (&dst, b_at, b_kind)];
            let versioned = |(from, to, k): &(&Location, &Location, Kind)| {
                (
                    self.versioned(from, *k).is_some(),
                    self.versioned(to, *k).is_some(),
                )
            };
            if let (Some(a), Some(b), [(true, true), (true, true)]) = (
                self.versioned(&src.loc, kind),
                self.versioned(&dst, b_kind),
                moves.map(|m| versioned(&m)),
            ) {
                let mut c = Change::new(Op::Exchange, a, None);
                c.to = Some(b);
                self.record(c, caller);
            } else {
                // What left the visible tree is journaled first, what
                // entered it last, so no path is claimed twice.
                let mut moves = moves;
                moves.sort_by_key(|m| match versioned(m) {
                    (_, false) => 0,
                    (true, true) => 1,
                    (false, true) => 2,
                });
                for (from, to, k) in moves {
                    self.journal_move(from, to, k, false, &mut plan, caller);
                }
            }
        } else {
            self.journal_move(&src.loc, &dst, kind, noreplace, &mut plan, caller);
        }
        // After the records: this rename's own unpark used its plan first.
        drop(plan);
        self.touched(&src.loc);
        self.touched(&dst);
        if let Some(other) = &replaced_other {
            self.touched(&other.loc);
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
        let parked = self.parked_raw();
        let mut moved = false;
        let mut stack = vec![at.phys.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(key) = sys::dir_key(at.dirfd, &dir) else {
                continue;
            };
            let inside = |n: &[u8]| [dir.as_slice(), b"/", n].concat();
            if let Ok(entries) = sys::read_dir_at(parked, key.as_bytes()) {
                for e in entries {
                    let from = [key.as_bytes(), b"/", &e.name].concat();
                    let to = inside(&e.name);
                    match sys::renameat2(parked, &from, at.dirfd, &to, libc::RENAME_NOREPLACE) {
                        Ok(()) => moved = true,
                        Err(err) => tracing::warn!(
                            "a hidden entry of {} stays in its park: {err}",
                            at.logical
                        ),
                    }
                }
                let _ = sys::unlinkat(parked, key.as_bytes(), true);
                self.parks.removed(&key);
                self.freezes.touched(parked, key.as_bytes());
            }
            for e in sys::read_dir_at(at.dirfd, &dir).unwrap_or_default() {
                let p = inside(&e.name);
                let is_dir = match e.d_type {
                    libc::DT_DIR => true,
                    libc::DT_UNKNOWN => sys::lstatat(at.dirfd, &p)
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
        if let Err(e) = sys::unlinkat(other.loc.dirfd, &other.loc.phys, dir) {
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
            .then(|| sys::readlinkat(at.dirfd, &at.phys).ok())
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
            at.dirfd,
            &at.phys,
            want.dirfd,
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
                self.ledger.lock().resume(&b);
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
                    self.ledger.lock().defer(c, caller.actor());
                } else {
                    self.record(c, caller);
                }
            }
            (None, Some(b)) => {
                // A removal of `b` held back is void: `b` is there again,
                // and the unpark records it if it differs.
                self.ledger.lock().resume(&b);
                if let Err(e) = self.unpark(&b, from, plan.take(), caller) {
                    tracing::error!("could not settle {b} after it became visible: {e:?}");
                }
            }
            (None, None) => {}
        }
    }
}
