//! Unparking: a hidden (or untracked) directory renamed into the
//! versioned tree has its subtree settled (what the rules hide in it goes
//! back to the parks, the rest is recorded).
//!
//! Owns: `prehash` (the files' content stored before the rename takes the
//! namespace lock, with none held) and `unpark` (the settle, under the
//! rename's exclusive lock, reading only metadata for what was stored
//! ahead and is unchanged since; see `scan::Prehashed`).
//! Locks: `prehash` takes `namespace` shared only to resolve the source;
//! `unpark` runs under the caller's exclusive `namespace` and holds
//! `ledger` for the settle.

use super::*;

impl SkillFs {
    /// Before a rename takes the namespace lock: if it is about to make a
    /// hidden directory visible (an unpark), the content of the files in
    /// it is stored now, with no lock held, so that the settle under the
    /// lock (`unpark`) reads only their metadata. A file changed since is
    /// read again there (see `scan::Prehashed`); a name the rules hide in
    /// it is left out (it stays hidden).
    pub(super) fn prehash(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
    ) -> Prehashed {
        let mut prehashed = Prehashed::new();
        let dir = {
            let _ns = self.namespace.read();
            let (Ok(ploc), Ok(nploc)) = (self.loc(parent), self.loc(newparent)) else {
                return prehashed;
            };
            let Ok(src) = self.find(parent, &ploc, name) else {
                return prehashed;
            };
            let Some(to_dir) = nploc.visible.clone() else {
                return prehashed;
            };
            if kind_of(&src.st) != Some(Kind::Dir)
                || self.versioned(&src.loc).is_some()
                || self.rules.is_untracked(&to_dir.join(newname))
            {
                return prehashed;
            }
            let mut in_pkg = || self.inside_skill(Some(to_dir.clone()));
            if self
                .rules
                .is_hidden(newname, Kind::Dir, to_dir.is_root(), &mut in_pkg)
            {
                return prehashed;
            }
            // Walked through its descriptor: no name of it needs the lock.
            match sys::open_dir(src.loc.dirfd, &src.loc.phys) {
                Ok(fd) => fd,
                Err(_) => return prehashed,
            }
        };
        let dir_fd = dir.as_raw_fd();
        // A write within the clock's tick of the read keeps the times.
        const TICK_NS: i128 = 20_000_000;
        let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
        while let Some(rel) = stack.pop() {
            let Ok(names) = sys::read_dir_at(dir_fd, if rel.is_empty() { b"." } else { &rel })
            else {
                continue;
            };
            for n in names {
                let mut child = rel.clone();
                if !child.is_empty() {
                    child.push(b'/');
                }
                child.extend_from_slice(&n.name);
                let Ok(st) = sys::lstatat(dir_fd, &child) else {
                    continue;
                };
                let Some(kind) = kind_of(&st) else { continue };
                // Left hidden by the settle: not stored (it is no version).
                if self.rules.is_hidden(&n.name, kind, false, &mut || false)
                    || self.rules.is_hidden(&n.name, kind, false, &mut || true)
                {
                    continue;
                }
                match kind {
                    Kind::Dir => stack.push(child),
                    Kind::File => {
                        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                        if let Ok(f) = sys::openat(dir_fd, &child, flags, 0)
                            && let Err(e) = prehashed.add(&f, &self.blobs, TICK_NS)
                        {
                            tracing::debug!("prehash: {e}");
                        }
                    }
                    Kind::Symlink => {}
                }
            }
        }
        prehashed
    }

    /// A hidden (or untracked) entry became versioned at `path`: settle its
    /// subtree (hide what the rules hide inside it, record the rest).
    pub(super) fn unpark(
        &self,
        path: &RelPath,
        hidden: &RelPath,
        prehashed: Prehashed,
        caller: &Caller,
    ) -> FsResult<()> {
        let in_pkg = self.inside_skill(path.parent());
        let mut ledger = self.ledger.lock();
        let mut settler = Settler::new(
            self.areas(),
            &self.rules,
            &mut ledger,
            &self.blobs,
            caller.actor(),
        );
        settler.prehashed = prehashed;
        let result = settler.settle(path, Op::Unpark, true, in_pkg, Some(hidden.clone()));
        self.parks.lock().clear(); // the settler may have made or removed parks
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
