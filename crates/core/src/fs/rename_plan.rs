//! The decisions of a `rename` (see `rename`), as values: what the flags
//! ask (`RenameMode`), what a name in the other place allows
//! (`other_place`), which system call is made (`RenameCall`), how an
//! exchange is journaled (`exchange_journal`), the plan made under the
//! namespace lock (`RenamePlan`), where the entries landed (`Landed`) and
//! the inode table's change (`RenamePlan::update_tree`). None needs the
//! disk; all are unit-tested.
//! Locks: none taken here (`update_tree` is given the table locked).

use super::*;

/// What a rename's flags ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RenameMode {
    /// As asked, for the system call.
    pub(super) flags: u32,
    pub(super) exchange: bool,
    pub(super) noreplace: bool,
}

impl RenameMode {
    /// `EINVAL` for any flag but `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
    pub(super) fn of(flags: u32) -> FsResult<RenameMode> {
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(FsError::EINVAL);
        }
        Ok(RenameMode {
            flags,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
            noreplace: flags & libc::RENAME_NOREPLACE != 0,
        })
    }
}

/// What a rename does to the entry its target name has in the other place
/// (only possible for entries of different kinds: a rule that names one
/// kind, or a rule that changed), as ext4 would with one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OtherPlace {
    /// A directory replaces it if it is empty in both of its places.
    ReplaceIfEmpty,
    /// A non-directory replaces it: removed once the rename is made (two
    /// steps, not one; a failed rename leaves it as it was).
    Replace,
}

/// [`OtherPlace`] for an entry moving over one in the other place, or the
/// rename's error.
pub(super) fn other_place(
    moving_dir: bool,
    other_dir: bool,
    noreplace: bool,
) -> FsResult<OtherPlace> {
    if noreplace {
        return Err(FsError::EEXIST);
    }
    match (moving_dir, other_dir) {
        (true, false) => Err(FsError::ENOTDIR),
        (false, true) => Err(FsError::EISDIR),
        // (An exchange can leave a directory's attached child in the
        // other place once it is hidden.)
        (true, true) => Ok(OtherPlace::ReplaceIfEmpty),
        (false, false) => Ok(OtherPlace::Replace),
    }
}

/// The system call a rename makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RenameCall {
    /// `renameat2` with the flags asked.
    Rename,
    /// Two names of one file (hard links made while unmounted, which the
    /// kernel sees as two inodes): `renameat2` would leave both, as
    /// rename(2) says; the kernel takes the rename as made and moves its
    /// entry, so the source name goes, as it believes.
    UnlinkSource,
    /// An exchange of two names of one file: nothing changes.
    Nothing,
}

impl RenameCall {
    /// `same_file`: the source and the target are one file.
    pub(super) fn of(same_file: bool, mode: RenameMode) -> FsResult<RenameCall> {
        match (same_file, mode) {
            (
                true,
                RenameMode {
                    noreplace: true, ..
                },
            ) => Err(FsError::EEXIST),
            (false, _) => Ok(RenameCall::Rename),
            (
                true,
                RenameMode {
                    exchange: false, ..
                },
            ) => Ok(RenameCall::UnlinkSource),
            (true, _) => Ok(RenameCall::Nothing),
        }
    }
}

/// How an exchange of two versionable entries is journaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExchangeJournal {
    /// One `Exchange` record: both are versioned before and after.
    One,
    /// A move each, in this order of the two (0: the source's): what left
    /// the versioned tree first, what entered it last, so no path is
    /// claimed twice.
    Moves([usize; 2]),
}

/// [`ExchangeJournal`] from whether each entry is versioned (before,
/// after).
pub(super) fn exchange_journal(versioned: [(bool, bool); 2]) -> ExchangeJournal {
    if versioned == [(true, true), (true, true)] {
        return ExchangeJournal::One;
    }
    let rank = |v: (bool, bool)| match v {
        (_, false) => 0,
        (true, true) => 1,
        (false, true) => 2,
    };
    let mut order = [0, 1];
    order.sort_by_key(|&i| rank(versioned[i]));
    ExchangeJournal::Moves(order)
}

/// The two names of a rename.
#[derive(Clone, Copy)]
pub(super) struct RenameNames<'a> {
    pub(super) parent: Ino,
    pub(super) name: &'a [u8],
    pub(super) newparent: Ino,
    pub(super) newname: &'a [u8],
}

/// A rename decided: what moves, where, and what it replaces.
pub(super) struct RenamePlan {
    pub(super) mode: RenameMode,
    /// The entry that moves (for an exchange, the first of the two).
    pub(super) src: Found,
    pub(super) kind: Kind,
    /// Where it goes (for an exchange, where the other entry is).
    pub(super) dst: Location,
    pub(super) dst_att: bool,
    /// What is at `dst` (for an exchange, the other entry), as planned.
    pub(super) dst_st: Option<libc::stat>,
    pub(super) dst_is_dir: bool,
    /// The target name's entry in the other place, replaced (see
    /// [`OtherPlace`]).
    pub(super) replaced_other: Option<Found>,
    /// The key of a directory this rename replaces: its hidden children's
    /// attachment goes with it (they become orphans).
    pub(super) replaced_key: Option<String>,
    pub(super) call: RenameCall,
}

/// Where the two entries of a rename ended up, when not where planned:
/// after an exchange, either may have been moved to its own place (see
/// `settle_exchanged`).
#[derive(Default)]
pub(super) struct Landed {
    pub(super) a: Option<(Location, bool)>,
    pub(super) b: Option<(Location, bool)>,
}

impl RenamePlan {
    /// Where the source entry is now, and whether attached.
    pub(super) fn a_at<'a>(&'a self, landed: &'a Landed) -> (&'a Location, bool) {
        landed
            .a
            .as_ref()
            .map_or((&self.dst, self.dst_att), |(l, a)| (l, *a))
    }

    /// Where the target entry is now (moved only by an exchange).
    pub(super) fn b_at<'a>(&'a self, landed: &'a Landed) -> (&'a Location, bool) {
        landed
            .b
            .as_ref()
            .map_or((&self.src.loc, self.src.attached), |(l, a)| (l, *a))
    }

    /// The kind of the entry at the target, if any.
    pub(super) fn b_kind(&self) -> Option<Kind> {
        self.dst_st.as_ref().and_then(kind_of)
    }

    /// The inode table's change: the source takes the new name (an
    /// exchange swaps the two), and a directory it replaces is kept as
    /// gone for its open handles.
    pub(super) fn update_tree(&self, tree: &mut Tree, n: RenameNames<'_>, landed: &Landed) {
        if self.mode.exchange {
            let (_, a_att) = self.a_at(landed);
            let (_, b_att) = self.b_at(landed);
            tree.exchange(n.parent, n.name, n.newparent, n.newname, b_att, a_att);
            return;
        }
        if let Some(st) = self.dst_st.filter(|_| self.dst_is_dir) {
            tree.keep_gone(n.newparent, n.newname, st);
        }
        if let Some(other) = self
            .replaced_other
            .as_ref()
            .filter(|o| kind_of(&o.st) == Some(Kind::Dir))
        {
            tree.keep_gone(n.newparent, n.newname, other.st);
        }
        tree.move_entry(n.parent, n.name, n.newparent, n.newname, self.dst_att);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
    const EXCHANGE: u32 = libc::RENAME_EXCHANGE;

    fn errno<T: std::fmt::Debug>(r: FsResult<T>) -> i32 {
        r.unwrap_err().errno()
    }

    #[test]
    fn the_flags_asked() {
        let m = RenameMode::of(0).unwrap();
        assert!(!m.exchange && !m.noreplace);
        let m = RenameMode::of(NOREPLACE).unwrap();
        assert!(!m.exchange && m.noreplace);
        let m = RenameMode::of(EXCHANGE).unwrap();
        assert!(m.exchange && !m.noreplace && m.flags == EXCHANGE);
        assert_eq!(errno(RenameMode::of(libc::RENAME_WHITEOUT)), libc::EINVAL);
        assert_eq!(errno(RenameMode::of(1 << 7)), libc::EINVAL);
    }

    #[test]
    fn a_name_in_the_other_place() {
        use OtherPlace::*;
        assert_eq!(other_place(false, false, false).unwrap(), Replace);
        assert_eq!(other_place(true, true, false).unwrap(), ReplaceIfEmpty);
        assert_eq!(errno(other_place(true, false, false)), libc::ENOTDIR);
        assert_eq!(errno(other_place(false, true, false)), libc::EISDIR);
        for (a, b) in [(false, false), (true, true), (true, false), (false, true)] {
            assert_eq!(errno(other_place(a, b, true)), libc::EEXIST);
        }
    }

    #[test]
    fn the_system_call_made() {
        let m = |f| RenameMode::of(f).unwrap();
        assert_eq!(RenameCall::of(false, m(0)).unwrap(), RenameCall::Rename);
        assert_eq!(
            RenameCall::of(false, m(NOREPLACE)).unwrap(),
            RenameCall::Rename
        );
        assert_eq!(
            RenameCall::of(false, m(EXCHANGE)).unwrap(),
            RenameCall::Rename
        );
        // Two names of one file.
        assert_eq!(
            RenameCall::of(true, m(0)).unwrap(),
            RenameCall::UnlinkSource
        );
        assert_eq!(
            RenameCall::of(true, m(EXCHANGE)).unwrap(),
            RenameCall::Nothing
        );
        assert_eq!(errno(RenameCall::of(true, m(NOREPLACE))), libc::EEXIST);
    }

    #[test]
    fn an_exchange_journaled() {
        use ExchangeJournal::*;
        let both = (true, true);
        assert_eq!(exchange_journal([both, both]), One);
        // What leaves first, what enters last.
        assert_eq!(
            exchange_journal([(true, false), (false, true)]),
            Moves([0, 1])
        );
        assert_eq!(
            exchange_journal([(false, true), (true, false)]),
            Moves([1, 0])
        );
        assert_eq!(exchange_journal([(false, true), both]), Moves([1, 0]));
        assert_eq!(exchange_journal([both, (true, false)]), Moves([1, 0]));
        assert_eq!(
            exchange_journal([(false, false), (false, false)]),
            Moves([0, 1])
        );
    }

    fn stat_of(kind: Kind) -> libc::stat {
        let mut st = sys::empty_stat();
        st.st_mode = match kind {
            Kind::Dir => libc::S_IFDIR | 0o755,
            Kind::Symlink => libc::S_IFLNK | 0o777,
            Kind::File => libc::S_IFREG | 0o644,
        };
        st.st_nlink = 1;
        st
    }

    /// The areas' directories: `/` for both, never read unless a key is
    /// missing (none is, in these trees).
    fn dirs() -> AreaDirs<'static> {
        static TOP: std::sync::LazyLock<File> =
            std::sync::LazyLock::new(|| File::open("/").expect("/ opens"));
        AreaDirs {
            root: TOP.as_fd(),
            parked: TOP.as_fd(),
            home: None,
        }
    }

    /// A plan as `plan_rename` makes it, over entries of `tree`.
    fn plan(
        tree: &mut Tree,
        flags: u32,
        src: Ino,
        kind: Kind,
        dst: (Location, bool, Option<Kind>),
    ) -> RenamePlan {
        let loc = tree.location(src, dirs()).unwrap();
        let dst_st = dst.2.map(stat_of);
        RenamePlan {
            mode: RenameMode::of(flags).unwrap(),
            src: Found {
                attached: loc.area == Area::Parked,
                loc,
                st: stat_of(kind),
            },
            kind,
            dst_is_dir: dst.2 == Some(Kind::Dir),
            dst: dst.0,
            dst_att: dst.1,
            dst_st,
            replaced_other: None,
            replaced_key: None,
            call: RenameCall::Rename,
        }
    }

    fn names<'a>(
        parent: Ino,
        name: &'a [u8],
        newparent: Ino,
        newname: &'a [u8],
    ) -> RenameNames<'a> {
        RenameNames {
            parent,
            name,
            newparent,
            newname,
        }
    }

    fn tree() -> Tree {
        Tree::new("root".into(), None)
    }

    #[test]
    fn the_tree_after_a_move_in_one_directory() {
        let mut t = tree();
        let a = t.link(ROOT_INO, b"a", Kind::File, false);
        let to = Location::root().child(b"b");
        let p = plan(&mut t, 0, a, Kind::File, (to, false, None));
        p.update_tree(
            &mut t,
            names(ROOT_INO, b"a", ROOT_INO, b"b"),
            &Landed::default(),
        );
        assert_eq!(t.child(ROOT_INO, b"b"), Some(a));
        assert_eq!(t.child(ROOT_INO, b"a"), None);
        assert_eq!(t.location(a, dirs()).unwrap().phys, b"b");
    }

    #[test]
    fn the_tree_after_a_move_across_places() {
        let mut t = tree();
        let d = t.link(ROOT_INO, b"d", Kind::Dir, false);
        let a = t.link(d, b"a", Kind::File, false);
        // Placed attached to the root (a hidden name): in `parked/<key>/`.
        let to = Location::root().attached_child("root", b"a.tmp");
        let p = plan(&mut t, 0, a, Kind::File, (to, true, None));
        p.update_tree(
            &mut t,
            names(d, b"a", ROOT_INO, b"a.tmp"),
            &Landed::default(),
        );
        assert_eq!(t.child(ROOT_INO, b"a.tmp"), Some(a));
        assert_eq!(t.child(d, b"a"), None);
        let at = t.location(a, dirs()).unwrap();
        assert_eq!(
            (at.area, at.phys.as_slice()),
            (Area::Parked, &b"root/a.tmp"[..])
        );
        assert!(at.is_hidden());
    }

    #[test]
    fn the_tree_after_a_move_over_a_directory() {
        let mut t = tree();
        let a = t.link(ROOT_INO, b"a", Kind::Dir, false);
        let old = t.link(ROOT_INO, b"b", Kind::Dir, false);
        t.forget(old, 0);
        let to = Location::root().child(b"b");
        let p = plan(&mut t, 0, a, Kind::Dir, (to, false, Some(Kind::Dir)));
        p.update_tree(
            &mut t,
            names(ROOT_INO, b"a", ROOT_INO, b"b"),
            &Landed::default(),
        );
        assert_eq!(t.child(ROOT_INO, b"b"), Some(a));
        // The replaced directory is gone but still answers its attributes
        // (an open handle of it), with no links.
        assert_eq!(t.gone(old).map(|st| st.st_nlink), Some(0));
        assert!(t.location(old, dirs()).is_err());
    }

    #[test]
    fn the_tree_after_a_move_over_a_file() {
        let mut t = tree();
        let a = t.link(ROOT_INO, b"a", Kind::File, false);
        let old = t.link(ROOT_INO, b"b", Kind::File, false);
        let to = Location::root().child(b"b");
        let p = plan(&mut t, 0, a, Kind::File, (to, false, Some(Kind::File)));
        p.update_tree(
            &mut t,
            names(ROOT_INO, b"a", ROOT_INO, b"b"),
            &Landed::default(),
        );
        assert_eq!(t.child(ROOT_INO, b"b"), Some(a));
        assert!(t.gone(old).is_none(), "only a directory is kept as gone");
        assert_eq!(t.location(old, dirs()).unwrap_err().errno(), libc::ESTALE);
    }

    #[test]
    fn the_tree_after_an_exchange() {
        let mut t = tree();
        let a = t.link(ROOT_INO, b"a", Kind::File, false);
        let b = t.link(ROOT_INO, b"b", Kind::Dir, false);
        let to = Location::root().child(b"b");
        let p = plan(
            &mut t,
            EXCHANGE,
            a,
            Kind::File,
            (to, false, Some(Kind::Dir)),
        );
        p.update_tree(
            &mut t,
            names(ROOT_INO, b"a", ROOT_INO, b"b"),
            &Landed::default(),
        );
        assert_eq!(t.child(ROOT_INO, b"b"), Some(a));
        assert_eq!(t.child(ROOT_INO, b"a"), Some(b));
        assert!(t.gone(b).is_none(), "an exchange replaces nothing");
    }

    #[test]
    fn the_tree_after_an_exchange_settled_in_its_own_place() {
        let mut t = tree();
        let a = t.link(ROOT_INO, b"a", Kind::File, false);
        let b = t.link(ROOT_INO, b"b", Kind::File, false);
        let to = Location::root().child(b"b");
        let p = plan(
            &mut t,
            EXCHANGE,
            a,
            Kind::File,
            (to, false, Some(Kind::File)),
        );
        // The source, now `b`, was moved to its own place: attached.
        let landed = Landed {
            a: Some((Location::root().attached_child("root", b"b"), true)),
            b: None,
        };
        p.update_tree(&mut t, names(ROOT_INO, b"a", ROOT_INO, b"b"), &landed);
        assert_eq!(t.location(a, dirs()).unwrap().area, Area::Parked);
        assert_eq!(t.location(b, dirs()).unwrap().area, Area::Root);
    }
}
