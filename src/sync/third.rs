//! The third replica's rule: where this tree only passed a file on (it
//! holds another replica's side, written by a merge of that replica and
//! not changed here since) and a merge of a second replica meets a
//! conflict there, the side `skillfs_sync::merge::prefer` names stays
//! live, the same on every replica whatever order it merged the two in;
//! the other side is the conflict (`skillfs_sync::merge::merge_passing`).
//!
//! When the second replica's side stays, the conflict is the first's: it
//! is listed against that replica (its last commit merged here), and
//! this tree's side is published as kept against it (`skillfs-kept:`),
//! so that the first replica keeps its own side rather than taking this
//! one back as a change (docs/limits.md, "Skills across machines").
//!
//! Which replica a file came from is read from the journal: the actor of
//! the path's newest version is a merge's thread, named for the replica
//! (`apply::actor_of`). A side taken by `sync --take` or `restore
//! REPLICA:ID` is written the same way and counts alike.
//!
//! Locks: the caller's `sync/lock`; reads the journal.

use std::collections::{BTreeMap, HashMap};

use skillfs_sync::merge::{Conflict, Reason, Side};

use super::apply::actor_of;
use super::pull::Base;
use crate::commands::Store;
use crate::relpath::{ByteString, RelPath};

/// Whether a conflict is one the rule decides: two files or links.
pub(super) fn decidable(c: &Conflict) -> bool {
    matches!(c.reason, Reason::Overlap | Reason::Binary | Reason::Kind)
}

/// The paths of `conflicts` (those [`decidable`], kept ours) whose entry
/// here another replica's merge wrote last, each with that replica: one
/// this store merged, other than `replica` (whose merge this is).
pub(super) fn passed_on(
    store: &Store,
    replica: &str,
    bases: &BTreeMap<String, Base>,
    conflicts: &[Conflict],
) -> HashMap<Vec<u8>, String> {
    let paths: Vec<&[u8]> = conflicts
        .iter()
        .filter(|c| decidable(c) && c.lost == Side::Theirs)
        .map(|c| c.path.as_slice())
        .collect();
    if paths.is_empty() {
        return HashMap::new();
    }
    // A merge's actor names the first 8 digits of its replica's id: two
    // replicas that share them name neither.
    let mut by_actor: HashMap<String, Option<&str>> = HashMap::new();
    for r in bases.keys().filter(|r| *r != replica) {
        by_actor
            .entry(actor_of(r))
            .and_modify(|v| *v = None)
            .or_insert(Some(r));
    }
    let Ok(records) = crate::commands::read_records(&store.layout) else {
        return HashMap::new();
    };
    let mut out = HashMap::new();
    for p in paths {
        let Some(idx) = RelPath::parse(p).and_then(|rp| store.index.idx(&rp)) else {
            continue;
        };
        let Some((seq, Some(_))) = store.index.versions(idx).last() else {
            continue;
        };
        let Ok(at) = records.binary_search_by_key(seq, |r| r.seq) else {
            continue;
        };
        if let Some(Some(from)) = by_actor.get(&records[at].actor.comm) {
            out.insert(p.to_vec(), from.to_string());
        }
    }
    out
}

/// Conflicts listed against other replicas than the merged one: by
/// replica, its commit they are listed with, and the conflicts.
pub(super) type Elsewhere = BTreeMap<String, (String, Vec<Conflict>)>;

/// The conflicts of a merge under the rule: those where the merged
/// replica's side stayed (`lost: Ours`, [`decidable`]) are listed against
/// the replica this tree's side came from (`from`), with its last commit
/// merged here, and kept against it in `bases`; returned apart from the
/// rest, which stay the merged replica's.
pub(super) fn settle(
    decided: Vec<Conflict>,
    from: &HashMap<Vec<u8>, String>,
    bases: &mut BTreeMap<String, Base>,
) -> (Vec<Conflict>, Elsewhere) {
    let mut theirs = Vec::new();
    let mut others = Elsewhere::new();
    for c in decided {
        let first = (c.lost == Side::Ours && decidable(&c))
            .then(|| from.get(&c.path))
            .flatten()
            .and_then(|r| bases.get_mut(r).map(|b| (r, b)));
        let Some((r, base)) = first else {
            theirs.push(c);
            continue;
        };
        if !base.kept.iter().any(|k| k.0 == c.path) {
            base.kept.push(ByteString(c.path.clone()));
            base.kept.sort_by(|a, b| a.0.cmp(&b.0));
        }
        let commit = base.commit.clone();
        // Theirs, as that replica's conflict: its side is the one not live.
        let c = Conflict {
            lost: Side::Theirs,
            ..c
        };
        others
            .entry(r.clone())
            .or_insert_with(|| (commit, Vec::new()))
            .1
            .push(c);
    }
    (theirs, others)
}
