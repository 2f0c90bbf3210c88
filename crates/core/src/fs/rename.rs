//! `rename`, in four steps under the namespace lock: `plan_rename`
//! decides what moves where and what it replaces (a `RenamePlan`),
//! publishing and meeting first what the change would lose;
//! `execute_rename` makes the system calls and settles an exchanged entry
//! in its place (`Landed`); `update_tree_after_rename` makes the inode
//! table and the kernel's caches say the same; `journal_rename` records
//! it. The decisions that need no disk are values and plain functions in
//! `rename_plan`, unit-tested there.
//! Invariants: those of `namespace` (the lock held exclusively from the
//! plan to the records; a rename is made only when the journal has room
//! for its record). An unpark's plan is made before the lock, and used by
//! the journal step. Locks: `namespace` → `tree` (briefly, inside) →
//! `open_files` → an `OpenFile` → `ledger`; the blob store's writing gate
//! is held throughout (an unpark's plan stores contents that its records
//! name only under the rename's lock).

use super::*;
use rename_plan::*;

impl SkillFs {
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
        let mode = RenameMode::of(flags)?;
        // An unpark's plan stores contents that its records name only
        // under the rename's lock: no prune starts between.
        let _writing = self.blobs.writing();
        let mut unpark = if mode.exchange {
            None
        } else {
            self.plan_unpark(parent, name, newparent, newname, flags)?
        };
        let _ns = self.ns_write();
        let n = RenameNames {
            parent,
            name,
            newparent,
            newname,
        };
        let ploc = self.loc(parent)?;
        let nploc = self.loc(newparent)?;
        let Some(plan) = self.plan_rename(n, &ploc, &nploc, mode, caller)? else {
            return Ok(());
        };
        let landed = self.execute_rename(&plan, n, &ploc, &nploc, caller)?;
        self.update_tree_after_rename(&plan, n, &landed, caller);
        self.journal_rename(&plan, &landed, &mut unpark, caller);
        // After the records: this rename's own unpark used its plan first.
        drop(unpark);
        self.touched(&plan.src.loc);
        self.touched(&plan.dst);
        if let Some(other) = &plan.replaced_other {
            self.touched(&other.loc);
        }
        Ok(())
    }

    /// Decides the rename of `n` (`None`: a name renamed onto itself, which
    /// changes nothing), refusing it as the system call would, and first
    /// publishes the staged bytes and meets the entries it would change.
    fn plan_rename(
        &self,
        n: RenameNames<'_>,
        ploc: &Location,
        nploc: &Location,
        mode: RenameMode,
        caller: &Caller,
    ) -> FsResult<Option<RenamePlan>> {
        let src = self.find(n.parent, ploc, n.name)?;
        let kind = node_kind(&src.st).ok_or(FsError::EPERM)?;
        if n.parent == n.newparent && n.name == n.newname {
            return Ok(None);
        }
        // A non-directory in the other place that this rename replaces.
        let mut replaced_other = None;
        let (dst, dst_att) = if mode.exchange {
            // Each entry takes the other's place; see `settle_exchanged`.
            let d = self.find(n.newparent, nploc, n.newname)?;
            (d.loc, d.attached)
        } else {
            let target = (kind == Kind::Symlink)
                .then(|| sys::readlinkat(self.at(&src.loc), &src.loc.phys).ok())
                .flatten();
            let (d, att) = self.place(n.newparent, nploc, n.newname, kind, target.as_deref())?;
            if let Some(other) = self.in_other_place(n.newparent, nploc, n.newname, att)? {
                let other_dir = other.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
                match other_place(kind == Kind::Dir, other_dir, mode.noreplace)? {
                    // One with entries, in either of its places, is
                    // ENOTEMPTY.
                    OtherPlace::ReplaceIfEmpty => {
                        let key = sys::dir_key(self.at(&other.loc), &other.loc.phys)?;
                        let empty = |fd, rel: &[u8]| match sys::read_dir_at(fd, rel) {
                            Ok(e) => e.is_empty(),
                            Err(e) => enoent(&e),
                        };
                        if !empty(self.at(&other.loc), &other.loc.phys)
                            || !empty(self.parked_dir(), key.as_bytes())
                        {
                            return Err(FsError::of(libc::ENOTEMPTY));
                        }
                        replaced_other = Some(other);
                    }
                    OtherPlace::Replace => {
                        self.publish_dirty_under(&other.loc, caller)?;
                        replaced_other = Some(other);
                    }
                }
            }
            (d, att)
        };
        // Staged bytes of what is replaced, or leaves the versioned tree,
        // are published first.
        let dst_st = dst.lstat(self.area_dirs()).ok();
        if dst_st.is_some() {
            self.publish_dirty_under(&dst, caller)?;
        }
        // (An untracked name is visible, but leaves the versioned tree all
        // the same: vim's `SKILL.md~`.)
        let leaves =
            self.versioned(&src.loc, kind).is_some() && self.versioned(&dst, kind).is_none();
        if mode.exchange || dst.is_hidden() || leaves {
            self.publish_dirty_under(&src.loc, caller)?;
        }
        // What moves and what it replaces are in the journal as they are
        // (the move's record carries what the catalog has), and so is the
        // directory a name is made in.
        self.meet(&src.loc)?;
        self.meet(&dst)?;
        // Two names of one file (see `RenameCall::UnlinkSource`): a record
        // says so. Judged on the files as they are now: a publish above
        // swaps a new inode in (a name written since stopped being the
        // other's file).
        let dst_st = dst.lstat(self.area_dirs()).ok();
        let same_file = match (&dst_st, src.loc.lstat(self.area_dirs())) {
            (Some(d), Ok(s)) => d.st_dev == s.st_dev && d.st_ino == s.st_ino,
            _ => false,
        };
        let call = RenameCall::of(same_file, mode)?;
        let dst_is_dir = dst_st.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
        let replaced_key = if !mode.exchange && dst_is_dir {
            sys::dir_key(self.at(&dst), &dst.phys).ok()
        } else {
            None
        };
        Ok(Some(RenamePlan {
            mode,
            src,
            kind,
            dst,
            dst_att,
            dst_st,
            dst_is_dir,
            replaced_other,
            replaced_key,
            call,
        }))
    }

    /// Makes the system calls of `plan`: the rename, the removal of what
    /// it replaced in the other place, and the moves of exchanged entries
    /// to their own places. Keeps what it replaced for the kernel's late
    /// opens.
    fn execute_rename(
        &self,
        plan: &RenamePlan,
        n: RenameNames<'_>,
        ploc: &Location,
        nploc: &Location,
        caller: &Caller,
    ) -> FsResult<Landed> {
        let (src, dst) = (&plan.src, &plan.dst);
        let last_ref = (!plan.mode.exchange && plan.dst_st.is_some() && !plan.dst_is_dir)
            .then(|| self.hold_name(n.newparent, n.newname, dst))
            .flatten();
        match plan.call {
            RenameCall::Rename => sys::renameat2(
                self.at(&src.loc),
                &src.loc.phys,
                self.at(dst),
                &dst.phys,
                plan.mode.flags,
            )?,
            RenameCall::UnlinkSource => sys::unlinkat(self.at(&src.loc), &src.loc.phys, false)?,
            RenameCall::Nothing => {}
        }
        self.keep_stale(n.newparent, n.newname, last_ref);
        if let Some(other) = &plan.replaced_other {
            self.remove_other(other, caller);
        }
        // Where each entry ends up: the source's at the new name, the
        // target's (exchanged) at the old one; moved only after an exchange.
        Ok(match plan.b_kind() {
            Some(b_kind) if plan.mode.exchange => Landed {
                a: self.settle_exchanged(
                    dst,
                    plan.dst_att,
                    n.newparent,
                    nploc,
                    n.newname,
                    plan.kind,
                ),
                b: self.settle_exchanged(&src.loc, src.attached, n.parent, ploc, n.name, b_kind),
            },
            _ => Landed::default(),
        })
    }

    /// The inode table after the rename, the orphans of a directory it
    /// replaced, the hidden entries of a directory it moved out of the
    /// versioned tree, and what the kernel must forget.
    fn update_tree_after_rename(
        &self,
        plan: &RenamePlan,
        n: RenameNames<'_>,
        landed: &Landed,
        caller: &Caller,
    ) {
        let (src, dst, kind) = (&plan.src, &plan.dst, plan.kind);
        let (a_at, _) = plan.a_at(landed);
        let (b_at, _) = plan.b_at(landed);
        let b_kind = plan.b_kind();
        plan.update_tree(&mut self.tree.lock(), n, landed);
        if let Some(key) = &plan.replaced_key {
            self.orphan_attached(key, &dst.logical, caller);
        }
        // A directory of the versioned tree moved out of it: its hidden
        // entries come along (before the notices below go out).
        if kind == Kind::Dir && !src.loc.is_hidden() && self.outside(a_at) {
            self.bring_hidden_out(n.newparent, n.newname, a_at);
        }
        if plan.mode.exchange && b_kind == Some(Kind::Dir) && !dst.is_hidden() && self.outside(b_at)
        {
            self.bring_hidden_out(n.parent, n.name, b_at);
        }
        // A directory that moved between the hidden and the visible tree
        // lists differently (whole while hidden, filtered while visible);
        // nothing in it changed, so the kernel would keep the old listing.
        let crossed = src.loc.is_hidden() != a_at.is_hidden()
            || (plan.mode.exchange && dst.is_hidden() != b_at.is_hidden());
        if crossed {
            let moved: Vec<Ino> = {
                let tree = self.tree.lock();
                let mut v = Vec::new();
                for (p, name) in [(n.newparent, n.newname), (n.parent, n.name)] {
                    if let Some(i) = tree.child(p, name) {
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
            if kind == Kind::Dir || (plan.mode.exchange && b_kind == Some(Kind::Dir)) {
                self.invalidations_delivered();
            }
        }
    }

    /// Journals the rename made: a move (a rename, a park, an unpark), an
    /// exchange, or, for FIFOs and sockets (never versioned), only what it
    /// replaced.
    fn journal_rename(
        &self,
        plan: &RenamePlan,
        landed: &Landed,
        unpark: &mut Option<UnparkPlan>,
        caller: &Caller,
    ) {
        let (src, dst, kind, exchange) = (&plan.src, &plan.dst, plan.kind, plan.mode.exchange);
        let (a_at, _) = plan.a_at(landed);
        let (b_at, _) = plan.b_at(landed);
        let b_kind = plan.b_kind();
        let src_special = special_of(&src.st) != 0;
        // FIFOs and sockets are never versioned: a move of one journals
        // only what it replaced (a versioned file, now gone).
        let dst_special = plan.dst_st.as_ref().is_some_and(|st| special_of(st) != 0);
        if src_special || (exchange && dst_special) {
            if exchange {
                if !src_special {
                    self.journal_move(&src.loc, a_at, kind, false, unpark, caller);
                }
                if let Some(b_kind) = b_kind.filter(|_| !dst_special) {
                    self.journal_move(dst, b_at, b_kind, false, unpark, caller);
                }
            } else if let Some(dst_kind) = b_kind
                && !dst_special
                && let Some(p) = self.versioned(dst, dst_kind)
            {
                self.record(Change::new(Op::Unlink, p, None), caller);
            }
        } else if exchange {
            let b_kind = b_kind.unwrap_or(Kind::File);
            let moves = [(&src.loc, a_at, kind), (dst, b_at, b_kind)];
            let versioned = |(from, to, k): &(&Location, &Location, Kind)| {
                (
                    self.versioned(from, *k).is_some(),
                    self.versioned(to, *k).is_some(),
                )
            };
            match exchange_journal(moves.map(|m| versioned(&m))) {
                ExchangeJournal::One => {
                    if let (Some(a), Some(b)) =
                        (self.versioned(&src.loc, kind), self.versioned(dst, b_kind))
                    {
                        let mut c = Change::new(Op::Exchange, a, None);
                        c.to = Some(b);
                        self.record(c, caller);
                    }
                }
                ExchangeJournal::Moves(order) => {
                    for i in order {
                        let (from, to, k) = moves[i];
                        self.journal_move(from, to, k, false, unpark, caller);
                    }
                }
            }
        } else {
            self.journal_move(&src.loc, dst, kind, plan.mode.noreplace, unpark, caller);
        }
    }
}
