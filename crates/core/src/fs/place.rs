//! Where an entry lives and how names are placed.
//!
//! Owns: resolving an inode to its `Location` (the root fd or `parked/`,
//! a physical path, its logical and visible names), finding a name in a
//! directory (inside it, or attached to it in `parked/<key>/`), placing a
//! new name by the hide rules, making files and directories (from spares
//! where they fit), and the parks of directories.
//!
//! Invariants: the hide rules are consulted only here, where a name is
//! placed; a name exists in at most one of a directory's two places.
//! Locks: callers hold `namespace` (shared to resolve, exclusive to place);
//! `tree` is taken briefly inside; `parks` (what is known of the parks) is
//! a leaf.

use super::*;

impl SkillFs {
    pub(super) fn loc(&self, ino: Ino) -> FsResult<Location> {
        self.tree.lock().location(ino, self.area_dirs())
    }

    pub(super) fn key_of(&self, ino: Ino, loc: &Location) -> FsResult<String> {
        self.tree.lock().key_of(ino, loc, self.area_dirs())
    }

    /// `name` in directory `parent` (at `ploc`): inside it, else attached.
    pub(super) fn find(&self, parent: Ino, ploc: &Location, name: &[u8]) -> FsResult<Found> {
        let inside = ploc.child(name);
        match inside.lstat(self.area_dirs()) {
            Ok(st) => {
                return Ok(Found {
                    loc: inside,
                    st,
                    attached: false,
                });
            }
            Err(e) if enoent(&e) => {}
            Err(e) => return Err(e.into()),
        }
        if self.outside(ploc) {
            return Err(FsError::ENOENT); // no rule places anything there
        }
        let key = self.key_of(parent, ploc)?;
        if self.parks.known_missing(&key) {
            return Err(FsError::ENOENT);
        }
        let att = ploc.attached_child(&key, name);
        match att.lstat(self.area_dirs()) {
            Ok(st) => Ok(Found {
                loc: att,
                st,
                attached: true,
            }),
            Err(e) if enoent(&e) || e.raw_os_error() == Some(libc::ENOTDIR) => {
                // Most directories have no park: remember, and save the
                // next lookups of names that are not there the second stat.
                self.parks.learn(&key, || {
                    match sys::lstatat(self.parked_dir(), key.as_bytes()) {
                        Ok(_) => Ok(true),
                        Err(e) if enoent(&e) => Ok(false),
                        Err(e) => Err(e),
                    }
                })?;
                Err(FsError::ENOENT)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Where a new `name` of `kind` goes in directory `parent` (at `ploc`):
    /// inside a hidden directory, always inside (no rule applies there);
    /// in a visible one, attached when a hide rule says so, a symlink (its
    /// `target`) judged by where it leads (see `follow`).
    pub(super) fn place(
        &self,
        parent: Ino,
        ploc: &Location,
        name: &[u8],
        kind: Kind,
        target: Option<&[u8]>,
    ) -> FsResult<(Location, bool)> {
        let Some(pvis) = &ploc.visible else {
            return Ok((ploc.child(name), false));
        };
        let mut in_pkg = None;
        let mut hidden = |k: Kind| {
            let mut inside_skill =
                || *in_pkg.get_or_insert_with(|| self.inside_skill(Some(pvis.clone())));
            self.rules
                .is_hidden(name, k, parent == self.vroot, &mut inside_skill)
        };
        let (root, parked) = (self.root_dir(), self.parked_dir());
        if crate::follow::hides(
            root,
            parked,
            &self.rules,
            pvis,
            name,
            kind,
            target,
            &mut hidden,
        ) {
            let key = self.key_of(parent, ploc)?;
            self.ensure_park(&key)?;
            Ok((ploc.attached_child(&key, name), true))
        } else {
            Ok((ploc.child(name), false))
        }
    }

    /// Whether visible directory `dir` or one of its ancestors is a skill
    /// package (holds a `SKILL.md`).
    pub(super) fn inside_skill(&self, mut dir: Option<RelPath>) -> bool {
        while let Some(d) = dir {
            if sys::lstatat(self.root_dir(), d.join(b"SKILL.md").as_bytes()).is_ok() {
                return true;
            }
            dir = d.parent();
        }
        false
    }

    /// The entry `name` has in the place other than `attached`, if any.
    pub(super) fn in_other_place(
        &self,
        parent: Ino,
        ploc: &Location,
        name: &[u8],
        attached: bool,
    ) -> FsResult<Option<Found>> {
        match self.find(parent, ploc, name) {
            Ok(f) if f.attached != attached => Ok(Some(f)),
            Ok(_) => Ok(None),
            Err(e) if e.is(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The state of a visible entry for a record (content from the catalog).
    pub(super) fn state_of(&self, loc: &Location, path: &RelPath) -> FsResult<EntryState> {
        let st = loc.lstat(self.area_dirs())?;
        let kind = kind_of(&st).ok_or(FsError::EPERM)?;
        let mut s = state_from_stat(&st, kind);
        let known = self.versions.ledger().catalog().get(path).cloned();
        match kind {
            Kind::File => s.blob = known.and_then(|c| c.blob),
            Kind::Symlink => {
                // From the catalog where it has it: reading the link would
                // set its access time, undoing a `touch -h` just made.
                s.target = match known.and_then(|c| c.target) {
                    Some(t) => Some(t),
                    None => Some(ByteString(sys::readlinkat(self.at(loc), &loc.phys)?)),
                };
            }
            Kind::Dir => {}
        }
        Ok(s)
    }

    /// Whether an entry made at `loc` can come from the spares (see
    /// `store::spares`): renamed into place, it must end up as a create
    /// there would have made it.
    pub(super) fn spare_fits(&self, loc: &Location) -> bool {
        let parent = match loc.phys.iter().rposition(|&b| b == b'/') {
            Some(i) => &loc.phys[..i],
            None => &b""[..],
        };
        if loc.area == Area::Parked && !parent.contains(&b'/') {
            return true; // a park itself: the daemon's own plain directory
        }
        sys::dir_passes_on_more(self.at(loc), parent).is_ok_and(|more| !more)
    }

    /// Creates the empty file `loc` (exclusively) for `caller`. A spare
    /// file renamed into place spares the request an inode allocation.
    pub(super) fn new_file_at(
        &self,
        loc: &Location,
        mode: u32,
        caller: &Caller,
    ) -> std::io::Result<()> {
        if self.spare_fits(loc) {
            let (path, file) = self.spares.take()?;
            let ready = (|| {
                // A recycled spare still has its last owner; chown before
                // chmod, which chown would strip of set-ID bits.
                if self.chown_new {
                    sys::fchown(&file, caller.uid, caller.gid)?;
                }
                sys::fchmod(&file, mode)?;
                sys::futimens(&file, Time::Now, Time::Now)
            })();
            return put_spare(ready, &path, self.at(loc), &loc.phys);
        }
        let f = sys::openat(
            self.at(loc),
            &loc.phys,
            libc::O_RDONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode,
        )?;
        drop(f);
        self.give_to_caller(loc, caller);
        Ok(())
    }

    /// Creates the directory `loc` (its owner is set by the caller), from a
    /// spare where one fits, like `new_file_at`.
    pub(super) fn new_dir_at(&self, loc: &Location, mode: u32) -> std::io::Result<()> {
        if !self.spare_fits(loc) {
            return sys::mkdirat(self.at(loc), &loc.phys, mode);
        }
        let dir = self.spares.take_dir()?;
        // Set through the spare's own fd, opened from `staging/`'s.
        let ready = dir.dir.sub(&dir.name).and_then(|d| {
            sys::fchmod(d.file(), mode)?;
            sys::futimens(d.file(), Time::Now, Time::Now)
        });
        put_spare(ready, &dir, self.at(loc), &loc.phys)
    }

    /// Makes sure the park of the directory with `key` exists (from a spare
    /// directory the first time).
    pub(super) fn ensure_park(&self, key: &str) -> std::io::Result<()> {
        // Known to exist: it was seen, or made, and only a sweep removes
        // parks (which forgets what is known).
        if self.parks.known_made(key) {
            return Ok(());
        }
        match sys::lstatat(self.parked_dir(), key.as_bytes()) {
            Ok(_) => {}
            Err(e) if enoent(&e) => {
                let dir = self.spares.take_dir()?;
                match put_spare(Ok(()), &dir, self.parked_dir(), key.as_bytes()) {
                    // Made by a racing request.
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    r => r?,
                }
            }
            Err(e) => return Err(e),
        }
        self.parks.made(key);
        Ok(())
    }

    pub(super) fn give_to_caller(&self, loc: &Location, caller: &Caller) {
        if self.chown_new
            && (caller.uid != 0 || caller.gid != 0)
            && let Err(e) = sys::lchownat(self.at(loc), &loc.phys, caller.uid, caller.gid)
        {
            tracing::warn!("could not give {} to uid {}: {e}", loc.logical, caller.uid);
        }
    }

    /// The path to journal a change of the entry at `loc`, of `kind`,
    /// under: its visible path, unless it is hidden or untracked (not
    /// versioned).
    pub(super) fn versioned(&self, loc: &Location, kind: Kind) -> Option<RelPath> {
        loc.visible
            .as_ref()
            .filter(|p| !self.rules.is_untracked(p, kind))
            .cloned()
    }

    /// [`SkillFs::versioned`] of the entry that is at `loc` now, of the
    /// kind it has (a file if it cannot be told).
    pub(super) fn versioned_now(&self, loc: &Location) -> Option<RelPath> {
        let kind = loc.lstat(self.area_dirs()).ok().and_then(|st| kind_of(&st));
        self.versioned(loc, kind.unwrap_or(Kind::File))
    }

    /// Moves the attached area of a removed directory to the orphans.
    pub(super) fn orphan_attached(&self, key: &str, logical: &RelPath, caller: &Caller) {
        self.parks.removed(key);
        let mut ledger = self.versions.ledger();
        if let Err(e) = self
            .areas()
            .orphan_key(key, logical, &mut ledger, &caller.actor())
        {
            tracing::error!("could not move the hidden entries of {logical} to the orphans: {e}");
        }
        self.freezes.touched(Area::Parked, key.as_bytes());
    }
}
