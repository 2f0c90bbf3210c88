//! The parks at mount: each park checked against the rules and its
//! directory (given back when no rule hides it any more, orphaned when its
//! directory is gone, swept when old), and the trash a sweep moves them to.
//!
//! Locks: none; run by the mount's settle, or by the sweep under the
//! namespace lock for one park at a time (see `fs::sweep`).

use super::*;

/// Mount-time housekeeping of `parked/` and `orphans/` after the visible
/// tree was settled: orphan attached areas whose directory is gone, give
/// back entries no rule hides any more, sweep old parks and orphans (each
/// moved whole into the store's `tmp` directory, recorded, then deleted).
pub fn tend_parked(
    settler: &mut Settler<'_>,
    now_ns: i64,
    tmp: &std::sync::Arc<Dir>,
) -> io::Result<()> {
    let areas = settler.areas;
    // Keys of hidden directories: their attached areas are alive too.
    let mut hidden_keys: HashSet<String> = HashSet::new();
    let mut stack: Vec<Vec<u8>> = Vec::new();
    for e in sys::read_dir_at(areas.parked_fd, b"")? {
        for c in sys::read_dir_at(areas.parked_fd, &e.name).unwrap_or_default() {
            stack.push(join_bytes(&e.name, &c.name));
        }
    }
    while let Some(p) = stack.pop() {
        let Ok(st) = sys::lstatat(areas.parked_fd, &p) else {
            continue;
        };
        if kind_of(&st) != Some(Kind::Dir) {
            continue;
        }
        if let Ok(k) = sys::dir_key(areas.parked_fd, &p) {
            hidden_keys.insert(k);
        }
        for c in sys::read_dir_at(areas.parked_fd, &p).unwrap_or_default() {
            stack.push(join_bytes(&p, &c.name));
        }
    }
    let max_age = settler.rules.park_max_age_ns;
    for e in sys::read_dir_at(areas.parked_fd, b"")? {
        let key = String::from_utf8_lossy(&e.name).into_owned();
        if let Some((dir, in_pkg)) = settler.keys.get(&key).cloned() {
            for c in sys::read_dir_at(areas.parked_fd, &e.name)? {
                let hp = join_bytes(&e.name, &c.name);
                let Ok(st) = sys::lstatat(areas.parked_fd, &hp) else {
                    continue;
                };
                let Some(kind) = kind_of(&st) else { continue };
                let logical = dir.join(&c.name);
                let target = (kind == Kind::Symlink)
                    .then(|| sys::readlinkat(areas.parked_fd, &hp).ok())
                    .flatten();
                let mut hidden = |k: Kind| {
                    settler
                        .rules
                        .is_hidden(&c.name, k, dir.is_root(), &mut || in_pkg)
                };
                let (root, parked) = (areas.root_fd, areas.parked_fd);
                if !crate::follow::hides(
                    root,
                    parked,
                    settler.rules,
                    &dir,
                    &c.name,
                    kind,
                    target.as_deref(),
                    &mut hidden,
                ) {
                    if !settler.relocate {
                        continue; // given back at the next mount, never swept
                    }
                    // No rule hides it any more: give it back unless taken.
                    if sys::lstatat(areas.root_fd, logical.as_bytes()).is_err() {
                        sys::renameat2(areas.parked_fd, &hp, areas.root_fd, logical.as_bytes(), 0)?;
                        settler.settle(
                            &logical,
                            Op::Unpark,
                            true,
                            in_pkg,
                            Some(logical.clone()),
                        )?;
                        settler.report.unparked += 1;
                    }
                    continue;
                }
                if settler.rules.sweepable(&c.name, kind, dir.is_root())
                    && sys::newest_mtime_at(areas.parked_fd, &hp)?
                        < now_ns as i128 - max_age as i128
                {
                    // Moved out whole first (a deletion that fails half-way
                    // must not leave a partial park to unpark as if whole),
                    // recorded, then deleted; what cannot be deleted stays
                    // in tmp/ for the next mount. A sweep never refuses the
                    // mount.
                    let trash = match move_to_trash(areas.parked_fd, &hp, tmp) {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::warn!("could not sweep the park of {logical}: {e}");
                            continue;
                        }
                    };
                    settler.swept_entries.push((dir.clone(), c.name.clone()));
                    let mut ch = Change::new(Op::Sweep, logical.clone(), None);
                    ch.hidden = Some(logical);
                    settler.record(ch)?;
                    settler.report.swept += 1;
                    delete_trash(&trash);
                }
            }
        } else if !hidden_keys.contains(&key) {
            let _ =
                settler
                    .areas
                    .orphan_key(&key, &RelPath::root(), settler.ledger, &settler.actor)?;
            settler.report.orphaned += 1;
        }
    }
    for (name, sweep) in old_orphans(areas.orphans_fd, now_ns, max_age)? {
        // As a park: moved out whole, recorded, then deleted.
        let trash = match move_to_trash(areas.orphans_fd, &name, tmp) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("could not sweep an orphan: {e}");
                continue;
            }
        };
        settler.record(sweep)?;
        settler.report.swept += 1;
        delete_trash(&trash);
    }
    Ok(())
}

/// Moves `rel` under `dir` whole into the store's `tmp` directory, under a
/// name no other sweep uses: a sweep takes a park or an orphan out of
/// reach at once, records it, and only then deletes it (`delete_trash`).
pub fn move_to_trash(
    dir: BorrowedFd<'_>,
    rel: &[u8],
    tmp: &std::sync::Arc<Dir>,
) -> io::Result<Named> {
    static SWEPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SWEPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let trash = Named::new(tmp, format!("swept.{}.{n}", std::process::id()));
    tmp.rename_in(dir, rel, &trash.name, libc::RENAME_NOREPLACE)?;
    Ok(trash)
}

/// Deletes what `move_to_trash` moved (read-only directories included),
/// from `tmp/`'s held fd; what cannot be deleted stays in `tmp`, which the
/// next mount clears.
pub fn delete_trash(trash: &Named) {
    if let Err(e) = trash.remove_tree() {
        tracing::warn!("could not delete the swept {}: {e}", trash.path().display());
    }
}

/// The orphans (`orphans/<key>.<time>`) past `max_age` at `now_ns`, each
/// with the record of its sweep.
pub fn old_orphans(
    orphans_fd: BorrowedFd<'_>,
    now_ns: i64,
    max_age: i64,
) -> io::Result<Vec<(Vec<u8>, Change)>> {
    let mut old = Vec::new();
    for e in sys::read_dir_at(orphans_fd, b"")? {
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let ts: i64 = name
            .rsplit('.')
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        if ts < now_ns.saturating_sub(max_age) {
            let c = Change::new(
                Op::Sweep,
                RelPath::parse(format!("orphans/{name}").as_bytes()).unwrap_or_default(),
                None,
            );
            old.push((e.name, c));
        }
    }
    Ok(old)
}
