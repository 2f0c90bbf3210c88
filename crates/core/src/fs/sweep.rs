//! The sweep while mounted: parks and orphans older than the park age go
//! (and are journaled), while the agent keeps working.
//!
//! Owns: `SkillFs::sweep`, run by the daemon's sweep thread. The mount-time
//! scan (`scan::Settler`, `scan::tend_parked`) does the same and more (gives
//! back parks no rule hides, records what changed while unmounted) before
//! any request; while mounted nothing reaches the tree but through the
//! core, so only age is left to act on.
//!
//! Invariants and locks:
//! - No lock is held across a walk of a subtree. The candidates are found
//!   with none: the parks (`parked/<key>/<name>`) whose newest time is past
//!   the age, the orphans past it, and, only when a park is due, the
//!   visible directories its keys belong to (a walk of the tree, stopped
//!   once every key is found).
//! - Each due park is frozen (see `unpark`: every change the core makes at,
//!   inside or above it marks it) and its age checked again; under the
//!   namespace lock it then goes in constant time: only if its freeze is
//!   unmarked, its directory still has that key at that path, a rule still
//!   hides it there and no file inside it is open. It is renamed into the
//!   store's `tmp/` and its sweep recorded (a sweep that cannot be
//!   journaled is renamed back, not done), and its files are deleted after
//!   the lock is released (read-only directories included; what cannot be
//!   deleted stays in `tmp/` until the next mount clears it). `.history`
//!   keeps its versions either way.
//! - Orphans (the parks of removed directories) are out of the mount's
//!   reach: moved into `tmp/`, recorded and deleted with no namespace lock.
//! - A `keep` rule's parks, and a park no rule hides any more (given back
//!   at the next mount), are never swept.

use skillfs_store::Named;
use skillfs_store::journal::Kind;
use std::collections::{HashMap, HashSet};

use super::tree::Area;
use super::unpark::FreezeGuard;
use super::{FsResult, Ino, SkillFs};
use crate::scan::{ScanReport, kind_of};
use skillfs_base::relpath::RelPath;
use skillfs_base::sys;
use skillfs_store::journal::{Actor, Change, Op};

/// A park past the age: `parked/<key>/<name>`.
struct Due {
    key: String,
    name: Vec<u8>,
}

impl SkillFs {
    /// Sweeps old parks and orphans (see the module doc).
    pub fn sweep(&self) -> FsResult<ScanReport> {
        let mut report = ScanReport::default();
        let now = skillfs_base::time::now_ns();
        let cutoff = now as i128 - self.rules.park_max_age_ns as i128;
        if let Err(e) = self.sweep_orphans(now, &mut report) {
            tracing::warn!("sweep of the orphans: {e}");
        }
        let due = self.due_parks(cutoff)?;
        if due.is_empty() {
            return Ok(report);
        }
        let parked = self.parked_dir();
        // Frozen under the shared lock (no namespace change in flight), then
        // checked again with none: a change after the freeze marks it, one
        // before it is seen by the second look.
        let frozen: Vec<(Due, FreezeGuard)> = {
            let _ns = self.namespace.read();
            due.into_iter()
                .map(|d| {
                    let guard = self
                        .freezes
                        .register(Area::Parked, park_path(&d.key, &d.name));
                    (d, guard)
                })
                .collect()
        };
        let frozen: Vec<(Due, FreezeGuard)> = frozen
            .into_iter()
            .filter(|(d, _)| {
                sys::newest_mtime_at(parked, &park_path(&d.key, &d.name)).is_ok_and(|t| t < cutoff)
            })
            .collect();
        let keys: HashSet<&str> = frozen.iter().map(|(d, _)| d.key.as_str()).collect();
        let dirs = self.dirs_with_keys(&keys);
        let mut trash = Vec::new();
        let mut gone: Vec<(Ino, Vec<u8>)> = Vec::new();
        {
            let _ns = self.ns_write();
            for (d, guard) in &frozen {
                let Some((dir, _)) = dirs.get(&d.key) else {
                    continue;
                };
                if guard.dirty() {
                    continue; // changed since it was found old: not old
                }
                match self.take_park(d, dir) {
                    Ok(Some(t)) => {
                        trash.push(t);
                        report.swept += 1;
                        let mut tree = self.tree.lock();
                        if let Some(p) = tree.find(dir) {
                            tree.detach(p, &d.name);
                            gone.push((p, d.name.clone()));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!("sweep of a park in {dir}: {e}");
                    }
                }
            }
            self.parks.forget_all();
        }
        drop(frozen);
        for (p, name) in gone {
            self.invalidate_entry(p, name);
        }
        for t in trash {
            crate::scan::delete_trash(&t);
        }
        Ok(report)
    }

    /// The parks of visible directories' hidden entries past `cutoff`,
    /// found with no lock held.
    fn due_parks(&self, cutoff: i128) -> FsResult<Vec<Due>> {
        let parked = self.parked_dir();
        let mut due = Vec::new();
        for e in sys::read_dir_at(parked, b"")? {
            let Ok(key) = String::from_utf8(e.name.clone()) else {
                continue;
            };
            for c in sys::read_dir_at(parked, &e.name).unwrap_or_default() {
                let hp = park_path(&key, &c.name);
                let Ok(st) = sys::lstatat(parked, &hp) else {
                    continue;
                };
                let Some(kind) = kind_of(&st) else { continue };
                // `sweepable` needs no directory: whether the entry is in
                // the root is checked again under the lock.
                if !self.rules.sweepable(&c.name, kind, false)
                    && !self.rules.sweepable(&c.name, kind, true)
                {
                    continue;
                }
                if sys::newest_mtime_at(parked, &hp).is_ok_and(|t| t < cutoff) {
                    due.push(Due {
                        key: key.clone(),
                        name: c.name,
                    });
                }
            }
        }
        Ok(due)
    }

    /// The visible directories (path, and whether inside a skill) whose
    /// keys are in `keys`: a walk of the tree with no lock held, stopped
    /// once all are found. What a concurrent change moves is checked again
    /// under the lock (`take_park`).
    fn dirs_with_keys(&self, keys: &HashSet<&str>) -> HashMap<String, (RelPath, bool)> {
        let root = self.root_dir();
        let mut found = HashMap::new();
        let mut stack = vec![(RelPath::root(), false)];
        while let Some((dir, above_pkg)) = stack.pop() {
            let Ok(names) = sys::read_dir_at(root, dir.as_bytes()) else {
                continue; // removed meanwhile
            };
            let in_pkg = above_pkg || names.iter().any(|n| n.name == b"SKILL.md");
            if let Ok(key) = sys::dir_key(root, dir.as_bytes())
                && keys.contains(key.as_str())
            {
                found.insert(key, (dir.clone(), in_pkg));
                if found.len() == keys.len() {
                    break;
                }
            }
            for n in names {
                if n.d_type == libc::DT_DIR {
                    stack.push((dir.join(&n.name), in_pkg));
                }
            }
        }
        found
    }

    /// Under the namespace lock: moves one due park into `tmp/` and
    /// records its sweep, if it may still go (its freeze unmarked, checked
    /// by the caller). Its path in `tmp/`, or `None` if it stays.
    fn take_park(&self, d: &Due, dir: &RelPath) -> std::io::Result<Option<Named>> {
        let parked = self.parked_dir();
        if sys::dir_key(self.root_dir(), dir.as_bytes()).ok().as_ref() != Some(&d.key) {
            return Ok(None); // moved or removed since: the next sweep sees it
        }
        let hp = park_path(&d.key, &d.name);
        let Ok(st) = sys::lstatat(parked, &hp) else {
            return Ok(None);
        };
        let Some(kind) = kind_of(&st) else {
            return Ok(None);
        };
        // Whether it is inside a skill now (a SKILL.md may have come since
        // the walk): a park no rule hides any more is given back at the
        // next mount, never swept.
        let in_pkg = self.inside_skill(Some(dir.clone()));
        let rules = &self.rules;
        let target = (kind == Kind::Symlink)
            .then(|| sys::readlinkat(parked, &hp).ok())
            .flatten();
        let mut hidden = |k: Kind| rules.is_hidden(&d.name, k, dir.is_root(), &mut || in_pkg);
        let root = self.root_dir();
        if !crate::follow::hides(
            root,
            parked,
            rules,
            dir,
            &d.name,
            kind,
            target.as_deref(),
            &mut hidden,
        ) || !rules.sweepable(&d.name, kind, dir.is_root())
        {
            return Ok(None);
        }
        if self.open_inside(&hp) {
            return Ok(None);
        }
        let to = crate::scan::move_to_trash(parked, &hp, &self.dirs.tmp)?;
        self.freezes.touched(Area::Parked, &hp);
        let logical = dir.join(&d.name);
        let mut c = Change::new(Op::Sweep, logical.clone(), None);
        c.hidden = Some(logical);
        if let Err(e) = self.versions.ledger().record(c, Actor::daemon()) {
            // Not journaled: not swept.
            to.rename_out(parked, &hp, libc::RENAME_NOREPLACE)?;
            return Err(e);
        }
        Ok(Some(to))
    }

    /// Whether a file at or below `parked/<hp>` is open.
    fn open_inside(&self, hp: &[u8]) -> bool {
        let inos: Vec<Ino> = self.open_files.inos();
        inos.into_iter().any(|ino| {
            self.loc(ino).is_ok_and(|l| {
                l.area == Area::Parked
                    && l.phys.starts_with(hp)
                    && matches!(l.phys.get(hp.len()), None | Some(b'/'))
            })
        })
    }

    /// Orphans past the park age: out of the mount's reach, so swept with
    /// no namespace lock: each is moved into `tmp/`, recorded (moved back
    /// if the record cannot be written), and deleted.
    fn sweep_orphans(&self, now: i64, report: &mut ScanReport) -> FsResult<()> {
        let orphans = self.dirs.orphans.fd();
        let max_age = self.rules.park_max_age_ns;
        for (name, sweep) in crate::scan::old_orphans(orphans, now, max_age)? {
            let to = crate::scan::move_to_trash(orphans, &name, &self.dirs.tmp)?;
            if let Err(e) = self.versions.ledger().record(sweep, Actor::daemon()) {
                to.rename_out(orphans, &name, libc::RENAME_NOREPLACE)?;
                return Err(e.into());
            }
            report.swept += 1;
            crate::scan::delete_trash(&to);
        }
        Ok(())
    }
}

fn park_path(key: &str, name: &[u8]) -> Vec<u8> {
    let mut p = key.as_bytes().to_vec();
    p.push(b'/');
    p.extend_from_slice(name);
    p
}
