//! `skillfs undo [PATH]`: puts back the state before the newest operation
//! (of PATH, or of the whole tree), through the mount, as an operation of
//! its own, so that the next `undo` undoes the undo.
//!
//! The newest operation is the newest group of `log` (one process, in one
//! go). Each path it left changed is restored as of the change before it
//! (`commands::restore`, one swap each) or, if it did not exist then, set
//! aside (`commands::remove`); only the outermost of nested paths is
//! touched. Nothing else changes: the state before the operation differs
//! from the present only where the operation wrote. `--dry-run` prints
//! that plan, each path to restore or remove, and the diff from now to
//! the state it goes back to.
//!
//! Locks: none; the writes go through the mount, under the daemon's locks.

use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::journal::{Op, Record};

use super::locate::Target;
use super::log;

/// Whether `r` changed `path` or something below it, or moved or removed
/// an ancestor of it while `path` was in it (`index` says whether `path`
/// itself was there, or changed, across `r`: the removal of an empty
/// category after its last skill was deleted does not touch the skill).
fn touches(r: &Record, path: &RelPath, index: &crate::history::HistoryIndex) -> bool {
    let at_or_below = |p: &RelPath| p.starts_with(path);
    let above = |p: &RelPath| path.starts_with(p) && !p.is_root();
    let moved_with = || {
        index
            .idx(path)
            .is_some_and(|i| r.seq > 0 && index.state_at(i, r.seq - 1) != index.state_at(i, r.seq))
    };
    at_or_below(&r.path)
        || r.to.as_ref().is_some_and(at_or_below)
        || (matches!(
            r.op,
            Op::Rename
                | Op::Exchange
                | Op::Park
                | Op::Rmdir
                | Op::Unlink
                | Op::Unpark
                | Op::ScanRemove
                | Op::ImportRemove
        ) && (above(&r.path) || r.to.as_ref().is_some_and(above))
            && moved_with())
}

pub fn undo(t: &Target, path: Option<RelPath>, dry_run: bool) -> Result<(), Failure> {
    if !dry_run {
        t.live_mount()?;
    }
    let path = path.filter(|p| !p.is_root());
    let records = crate::commands::read_records(&t.layout)?;
    let store = Store::open(t.layout.clone())?;
    let groups = log::group(&records);
    let newest = groups
        .iter()
        .rev()
        .find(|g| {
            g.iter().any(|r| {
                !matches!(r.op, Op::Sweep | Op::Orphan | Op::Lost | Op::Forget)
                    && path.as_ref().is_none_or(|p| touches(r, p, &store.index))
            })
        })
        .ok_or_else(|| {
            Failure::new(
                Exit::NotFound,
                match &path {
                    Some(p) => format!("'{p}' has no change to undo"),
                    None => "the history holds no change to undo".to_string(),
                },
            )
        })?;
    let (first, last) = (&newest[0], &newest[newest.len() - 1]);
    let before = first.seq - 1;
    if before == 0 {
        return Err(Failure::new(
            Exit::NotFound,
            "the newest change is the first one recorded: nothing is before it to go back to",
        ));
    }
    if store.index.is_forgotten(before) {
        return Err(Failure::new(
            Exit::NotFound,
            format!(
                "the state before change {} was forgotten (skillfs forget): nothing to go back to",
                first.seq
            ),
        ));
    }
    let mut targets = match &path {
        Some(p) => vec![p.clone()],
        None => log::touched(&newest.iter().collect::<Vec<_>>()),
    };
    targets.sort();
    targets.dedup();
    // Only the outermost of nested paths: restoring it restores the rest.
    let mut outer: Vec<RelPath> = Vec::new();
    for p in targets {
        if !outer.iter().any(|o| p.starts_with(o)) {
            outer.push(p);
        }
    }
    let ids = if first.seq == last.seq {
        format!("change {}", first.seq)
    } else {
        format!("changes {}-{}", first.seq, last.seq)
    };
    let existed = |p: &RelPath| {
        store
            .index
            .idx(p)
            .is_some_and(|i| store.index.state_at(i, before).is_some())
    };
    if dry_run {
        // What the undo will do, not what the operation did: each path it
        // puts back, then the diff from now to the state it goes back to.
        let now = store.index.last();
        println!(
            "undo would put back the state before {ids} by {}[{}] (that of change {before}):",
            last.actor.comm, last.actor.pid
        );
        for p in &outer {
            if existed(p) {
                println!("  restore {p} as of change {before}");
            } else if t.root.join(p.as_os_str()).symlink_metadata().is_ok() {
                println!("  remove {p} (it did not exist then)");
            }
        }
        for p in &outer {
            if existed(p)
                || store
                    .index
                    .idx(p)
                    .is_some_and(|i| store.index.exists_at(i, now))
            {
                crate::commands::diff(&store, &now.to_string(), Some(&before.to_string()), p)?;
            }
        }
        return Ok(());
    }
    let (mut restored, mut removed) = (0, 0);
    for p in &outer {
        if existed(p) {
            crate::commands::restore(&store, &t.root, before, p)?;
            restored += 1;
        } else if t.root.join(p.as_os_str()).symlink_metadata().is_ok() {
            crate::commands::remove(&t.root, p)?;
            removed += 1;
        }
    }
    println!(
        "undid {ids} by {}[{}]: {restored} restored, {removed} removed, as of change {before}; \
         `skillfs undo` again undoes this",
        last.actor.comm, last.actor.pid
    );
    Ok(())
}
