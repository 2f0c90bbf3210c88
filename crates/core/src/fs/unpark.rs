//! Unparking: a hidden (or untracked) directory renamed into the
//! versioned tree has its subtree settled: what the rules hide in it goes
//! back to the parks, the rest is recorded (`Op::Unpark`).
//!
//! Owns: `plan_unpark` and `unpark`. Before the rename takes the namespace
//! lock, with no lock held, the subtree is walked through a descriptor of
//! the source directory and the settle worked out in full: each entry's
//! state with its content stored (`UnparkPlan`). While the plan is made
//! and until it is used, the source subtree is *frozen*: every change the
//! core makes at, inside or above it (a create, unlink, rename, chmod,
//! truncate, a write in place, a swap, a sweep or an orphaning) marks the
//! freeze (`touched`), after the change is made. Under the rename's lock
//! `unpark` then only appends the plan's records and moves what the rules
//! hide, with no walk of the subtree; a plan that is marked, or was made
//! for another source or target, is dropped and the subtree settled under
//! the lock as before (its stored content still saves the reads, see
//! `scan::Prehashed`).
//!
//! Invariants: a plan is used only if no change reached its subtree from
//! the moment its freeze was registered (under the shared namespace lock,
//! so no namespace change is in flight) to the moment it is used. Every
//! change of the tree goes through the core (no writeback cache: a write
//! reaches the daemon before the call returns), so a file's content read
//! after the freeze is what it holds unless the freeze is marked; its
//! times are checked across the read all the same.
//! Locks: `plan_unpark` takes `namespace` shared only to resolve the
//! source and register the freeze; `freezes` is a leaf, taken after each
//! change; `unpark` runs under the caller's exclusive `namespace` and
//! holds `ledger` for the records.

use super::*;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;

/// A write within the clock's tick of a read can keep the file's times
/// (kernels before multigrain timestamps tick every few milliseconds).
pub(super) const TICK_NS: i128 = 20_000_000;

/// A subtree an unpark is planned over, and whether a change reached it.
pub(super) struct Freeze {
    area: Area,
    phys: Vec<u8>,
    dirty: AtomicBool,
}

/// The subtrees being planned over.
#[derive(Default)]
pub(super) struct Freezes {
    list: Mutex<Vec<Arc<Freeze>>>,
    /// How many are in `list`: a change reads this, not the lock, when
    /// none is (nearly always).
    count: AtomicUsize,
}

impl Freezes {
    /// A change was made at `phys` in `area`: marks every freeze of a
    /// subtree at, inside or above it. Called after the change, so that a
    /// freeze registered after this check walks a tree that has it.
    pub(super) fn touched(&self, area: Area, phys: &[u8]) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        for f in self.list.lock().iter() {
            if f.area == area && (within(phys, &f.phys) || within(&f.phys, phys)) {
                f.dirty.store(true, Ordering::SeqCst);
            }
        }
    }

    pub(super) fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    pub(super) fn register(self: &Arc<Self>, area: Area, phys: Vec<u8>) -> FreezeGuard {
        let freeze = Arc::new(Freeze {
            area,
            phys,
            dirty: AtomicBool::new(false),
        });
        self.list.lock().push(Arc::clone(&freeze));
        self.count.fetch_add(1, Ordering::SeqCst);
        FreezeGuard {
            freezes: Arc::clone(self),
            freeze,
        }
    }
}

/// Whether `a` is `b` or inside it (paths of one area).
fn within(a: &[u8], b: &[u8]) -> bool {
    b.is_empty() || (a.starts_with(b) && matches!(a.get(b.len()), None | Some(b'/')))
}

/// A registered freeze; dropping it ends the freeze.
pub(super) struct FreezeGuard {
    freezes: Arc<Freezes>,
    freeze: Arc<Freeze>,
}

impl FreezeGuard {
    /// Whether a change reached the frozen subtree.
    pub(super) fn dirty(&self) -> bool {
        self.freeze.dirty.load(Ordering::SeqCst)
    }
}

impl Drop for FreezeGuard {
    fn drop(&mut self) {
        let mut list = self.freezes.list.lock();
        list.retain(|f| !Arc::ptr_eq(f, &self.freeze));
        self.freezes.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One step of a planned settle, in the settle's order.
enum Step {
    Record(RelPath, EntryState),
    /// Move `dir/name` to the park of `dir` (the rules hide it).
    Hide(RelPath, Vec<u8>),
}

/// An unpark worked out before its rename took the namespace lock.
pub(super) struct UnparkPlan {
    guard: FreezeGuard,
    /// The visible path it was planned for.
    to: RelPath,
    /// Whether that was inside a skill then (a `SKILL.md` above it comes
    /// and goes with no change to the subtree itself).
    in_pkg: bool,
    steps: Vec<Step>,
    /// The content stored, for a settle if the plan cannot be used.
    prehashed: Prehashed,
}

impl UnparkPlan {
    fn usable(&self, from: &Location, to: &RelPath, in_pkg: bool) -> bool {
        let f = &self.guard.freeze;
        !f.dirty.load(Ordering::SeqCst)
            && f.area == from.area
            && f.phys == from.phys
            && &self.to == to
            && self.in_pkg == in_pkg
    }
}

impl SkillFs {
    /// Before a rename takes the namespace lock: if it is about to make a
    /// hidden directory visible, the plan of its unpark (see the module
    /// doc), made with no lock held. `None` when it is no unpark of a
    /// directory, or the source cannot be read. A full disk fails it
    /// (`ENOSPC`, `EDQUOT`): the rename is refused before anything moves,
    /// as it could not record what it makes visible.
    pub(super) fn plan_unpark(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<Option<UnparkPlan>> {
        let Some((dir, guard, to, in_pkg)) =
            self.unpark_source(parent, name, newparent, newname, flags)
        else {
            return Ok(None);
        };
        let mut plan = UnparkPlan {
            guard,
            to: to.clone(),
            in_pkg,
            steps: Vec::new(),
            prehashed: Prehashed::new(),
        };
        match self.walk_for_plan(dir, &to, in_pkg, &mut plan) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                ) =>
            {
                Err(FsError::from(e).context(format_args!("store the content of {to}")))
            }
            Err(e) => {
                tracing::debug!("unpark of {to} planned under the lock instead: {e}");
                plan.guard.freeze.dirty.store(true, Ordering::SeqCst);
                Ok(Some(plan))
            }
            Ok(()) => Ok(Some(plan)),
        }
    }

    /// What `plan_unpark` walks, if the rename is an unpark of a
    /// directory that can be made: the source, its freeze (registered under the shared
    /// namespace lock, so no namespace change is in flight), the visible
    /// path and whether that is inside a skill.
    fn unpark_source(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
    ) -> Option<(OwnedFd, FreezeGuard, RelPath, bool)> {
        let _ns = self.namespace.read();
        let (ploc, nploc) = (self.loc(parent).ok()?, self.loc(newparent).ok()?);
        let src = self.find(parent, &ploc, name).ok()?;
        // A rename that will fail (onto a name taken with NOREPLACE, a
        // non-directory or a directory that is not empty) is not planned:
        // it answers its own errno, and nothing is read or stored for it.
        if let Ok(dst) = self.find(newparent, &nploc, newname) {
            let empty_dir = kind_of(&dst.st) == Some(Kind::Dir)
                && sys::read_dir_at(self.at(&dst.loc), &dst.loc.phys).is_ok_and(|e| e.is_empty());
            if flags & libc::RENAME_NOREPLACE != 0 || !empty_dir {
                return None;
            }
        }
        let to_dir = nploc.visible.clone()?;
        let to = to_dir.join(newname);
        if kind_of(&src.st) != Some(Kind::Dir)
            || self.versioned(&src.loc, Kind::Dir).is_some()
            || self.rules.is_untracked(&to, Kind::Dir)
        {
            return None;
        }
        let in_pkg = self.inside_skill(Some(to_dir.clone()));
        if self
            .rules
            .is_hidden(newname, Kind::Dir, to_dir.is_root(), &mut || in_pkg)
        {
            return None;
        }
        // Walked through its descriptor: no name of it needs the lock.
        let dir = sys::open_dir(self.at(&src.loc), &src.loc.phys).ok()?;
        let guard = self.freezes.register(src.loc.area, src.loc.phys.clone());
        Some((dir, guard, to, in_pkg))
    }

    /// The settle of `scan::Settler::settle`, worked out from the source
    /// directory `fd` for the visible path `to`, in its order: the top, then
    /// depth-first in name order; a hidden entry is moved, not entered; an
    /// untracked one is left out.
    fn walk_for_plan(
        &self,
        top: OwnedFd,
        to: &RelPath,
        in_pkg: bool,
        plan: &mut UnparkPlan,
    ) -> std::io::Result<()> {
        let top_st = sys::fstat(&top)?;
        plan.steps.push(Step::Record(
            to.clone(),
            state_from_stat(&top_st, Kind::Dir),
        ));
        // Each directory is opened from its parent's descriptor by one name,
        // never followed through a symlink: nothing outside the subtree is
        // read, whatever is renamed in it meanwhile (a change marks the
        // plan). Opened when its turn comes, so a wide tree holds few.
        enum Dir {
            Open(OwnedFd),
            In(Arc<OwnedFd>, Vec<u8>, u64),
        }
        let mut stack: Vec<(Dir, RelPath, bool)> = vec![(Dir::Open(top), to.clone(), in_pkg)];
        while let Some((d, dir, above_pkg)) = stack.pop() {
            let fd = match d {
                Dir::Open(fd) => fd,
                Dir::In(parent, name, ino) => {
                    let flags =
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                    let f = OwnedFd::from(sys::openat(parent.as_fd(), &name, flags, 0)?);
                    if sys::fstat(&f)?.st_ino != ino {
                        return Err(std::io::Error::other(format!("{dir} was replaced")));
                    }
                    f
                }
            };
            let fd = Arc::new(fd);
            let raw = fd.as_fd();
            let mut names = sys::read_dir_at(raw, b".")?;
            names.sort_by(|a, b| a.name.cmp(&b.name));
            let in_pkg = above_pkg || names.iter().any(|n| n.name == b"SKILL.md");
            let mut subdirs = Vec::new();
            for n in names {
                let path = dir.join(&n.name);
                let st = sys::lstatat(raw, &n.name)?;
                let Some(kind) = kind_of(&st) else {
                    continue; // not versioned (the settle says so)
                };
                if kind == Kind::Symlink {
                    // Judged by where it leads (`follow`), which is only
                    // known once the subtree is in place: settled then.
                    return Err(std::io::Error::other(format!("{path} is a symlink")));
                }
                if self
                    .rules
                    .is_hidden(&n.name, kind, dir.is_root(), &mut || in_pkg)
                {
                    plan.steps.push(Step::Hide(dir.clone(), n.name));
                    continue;
                }
                if self.rules.is_untracked(&path, kind) {
                    continue;
                }
                let mut state = state_from_stat(&st, kind);
                match kind {
                    Kind::File => {
                        // Never blocks on a FIFO put in its place.
                        let flags =
                            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
                        let f = sys::openat(raw, &n.name, flags, 0)?;
                        let same = |now: &libc::stat| {
                            now.st_mode & libc::S_IFMT == libc::S_IFREG
                                && now.st_ino == st.st_ino
                                && now.st_size == st.st_size
                                && sys::mtime_ns(now) == sys::mtime_ns(&st)
                        };
                        if !sys::fstat(&f).is_ok_and(|now| same(&now)) {
                            return Err(std::io::Error::other(format!("{path} was replaced")));
                        }
                        // Used by the plan whatever its times (a write
                        // through the mount after the freeze marks it, see
                        // the module doc); kept for a settle only if older
                        // than the clock's tick.
                        let blob = plan.prehashed.add(&f, &self.blobs, TICK_NS)?;
                        let blob = blob.filter(|_| sys::fstat(&f).is_ok_and(|now| same(&now)));
                        let Some(blob) = blob else {
                            return Err(std::io::Error::other(format!(
                                "{path} changed as it was read"
                            )));
                        };
                        state.blob = Some(blob);
                    }
                    Kind::Symlink => {
                        state.target = Some(ByteString(sys::readlinkat(raw, &n.name)?));
                    }
                    Kind::Dir => subdirs.push((
                        Dir::In(Arc::clone(&fd), n.name.clone(), st.st_ino),
                        path.clone(),
                        in_pkg,
                    )),
                }
                plan.steps.push(Step::Record(path, state));
            }
            // Depth-first in name order: push in reverse so the first pops first.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    /// A hidden (or untracked) entry at `from` became versioned at `path`:
    /// its subtree is settled, from `plan` if it was made for this move
    /// and nothing changed it since, else by a walk under the lock.
    pub(super) fn unpark(
        &self,
        path: &RelPath,
        from: &Location,
        plan: Option<UnparkPlan>,
        caller: &Caller,
    ) -> FsResult<()> {
        let in_pkg = self.inside_skill(path.parent());
        let mut ledger = self.versions.ledger();
        let mut settler = Settler::new(
            self.areas(),
            &self.rules,
            &mut ledger,
            &self.blobs,
            caller.actor(),
        );
        let result = match plan {
            Some(plan) if plan.usable(from, path, in_pkg) => {
                let hidden = from.logical.clone();
                (|| {
                    for step in plan.steps {
                        match step {
                            Step::Hide(dir, name) => settler.hide(&dir, &name)?,
                            Step::Record(p, state) => {
                                if settler.differs(&p, &state, true) {
                                    let mut c = Change::new(Op::Unpark, p.clone(), Some(state));
                                    if &p == path && from.visible.is_none() {
                                        c.hidden = Some(hidden.clone());
                                    }
                                    settler.record(c)?;
                                }
                            }
                        }
                    }
                    Ok::<(), std::io::Error>(())
                })()
            }
            plan => {
                settler.prehashed = plan.map(|p| p.prehashed).unwrap_or_default();
                // An untracked name is not recorded (see `journal_move`).
                let hidden = from.visible.is_none().then(|| from.logical.clone());
                settler.settle(path, Op::Unpark, true, in_pkg, hidden)
            }
        };
        self.parks.forget_all(); // the settler may have made or removed parks
        let moved = std::mem::take(&mut settler.moved_to_hidden);
        drop(ledger);
        if !moved.is_empty() {
            let mut dirs = Vec::new();
            {
                let mut tree = self.tree.lock();
                for p in &moved {
                    if let Some(ino) = tree.find(p) {
                        tree.set_attached(ino, true);
                    }
                    if let Some(d) = p.parent().and_then(|d| tree.find(&d)) {
                        dirs.push(d);
                    }
                }
            }
            // Their directories' listings changed behind the kernel's back.
            dirs.dedup();
            for d in dirs {
                self.invalidate(d);
            }
            self.invalidations_delivered();
        }
        Ok(result?)
    }
}
