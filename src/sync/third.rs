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
//! Which replica a file came from is read from the journal and
//! `sync/origins.jsonl` (`passed_on`): the path's newest version was
//! written by that replica's applier and is that replica's side as of
//! its last commit merged here. A side taken by `sync --take` is written
//! the same way and counts alike.
//!
//! A path that a replica says it kept against this one (`skillfs-kept:`)
//! and that this tree only passed on is *contested*: its base is left out
//! of the merge, so that the two sides meet as a conflict and the rule
//! decides it, rather than this tree keeping what it passed on by that
//! replica's word (two third replicas that sync with each other would
//! otherwise each keep what they had).
//!
//! Locks: the caller's `sync/lock`; reads the journal.

use std::collections::{BTreeMap, HashMap};

use skillfs_sync::merge::{Conflict, Merged, Reason, Side, merge_passing};

use skillfs_sync::tree::{Entry, Tree};

use super::apply::actor_of;
use super::gittree::{Both, GitBlobs};
use super::pull::Base;
use crate::commands::Store;
use crate::relpath::RelPath;

/// Whether a conflict is one the rule decides: two files or links.
pub(super) fn decidable(c: &Conflict) -> bool {
    matches!(c.reason, Reason::Overlap | Reason::Binary | Reason::Kind)
}

/// The paths of the conflicts the rule may decide ([`decidable`], kept
/// ours) in `conflicts`.
pub(super) fn candidates(conflicts: &[Conflict]) -> Vec<Vec<u8>> {
    conflicts
        .iter()
        .filter(|c| decidable(c) && c.lost == Side::Theirs)
        .map(|c| c.path.clone())
        .collect()
}

/// Which of `paths` this tree only passed on, each with the replica it
/// came from: the path's newest version here was written by the merge
/// (or take) of a replica this store merged, other than `replica` (whose
/// merge this is), as both the journal's actor (`actor_of`) and
/// `sync/origins.jsonl` say (a process cannot name itself into the
/// latter), and the entry here is that replica's own at its last commit
/// merged here (not a text merged by lines with this tree's own, nor an
/// older version restored).
pub(super) fn passed_on(
    store: &Store,
    blobs: &mut GitBlobs,
    (replica, ours): (&str, &Tree),
    bases: &BTreeMap<String, Base>,
    paths: &[Vec<u8>],
) -> HashMap<Vec<u8>, String> {
    if paths.is_empty() {
        return HashMap::new();
    }
    let Ok(records) = crate::commands::read_records(&store.layout) else {
        return HashMap::new();
    };
    let origins = super::origins::origins(&store.layout);
    let mut trees: HashMap<String, Option<Tree>> = HashMap::new();
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
        let Some(from) = origins.get(seq).map(|o| &o.replica) else {
            continue;
        };
        let Some(base) = bases.get(from).filter(|_| from != replica) else {
            continue;
        };
        if records[at].actor.comm != actor_of(from) {
            continue;
        }
        let theirs = trees
            .entry(from.clone())
            .or_insert_with(|| blobs.tree(&base.commit, &mut Vec::new()).ok());
        let same = theirs
            .as_ref()
            .is_some_and(|t| t.get(p).is_some() && t.get(p) == ours.get(p));
        if same {
            out.insert(p.to_vec(), from.clone());
        }
    }
    out
}

/// The merge of `theirs` (replica `replica`'s tip) into `ours` against
/// `base`, under the rule: the paths `kept_by_them` that this tree only
/// passed on are contested (their base left out), and a conflict at a
/// path this tree only passed on is decided by `prefer`. `made`: texts a
/// virtual base made. Returns the merge, and the paths passed on with the
/// replica each came from.
pub(super) fn merge(
    (store, blobs): (&Store, &mut GitBlobs),
    (replica, bases): (&str, &BTreeMap<String, Base>),
    (base, ours, theirs): (&Tree, &Tree, &Tree),
    made: &[(String, Vec<u8>)],
    kept_by_them: &[Vec<u8>],
) -> (Merged, HashMap<Vec<u8>, String>) {
    let file = |e: Option<&Entry>| e.is_some_and(|e| *e != Entry::Dir);
    let contested: Vec<Vec<u8>> = kept_by_them
        .iter()
        .filter(|p| file(ours.get(p)) && file(theirs.get(p)) && ours.get(p) != theirs.get(p))
        .cloned()
        .collect();
    let mut passed = passed_on(store, blobs, (replica, ours), bases, &contested);
    let base = if passed.is_empty() {
        base.clone()
    } else {
        let mut t = Tree::new();
        for (p, e) in base.iter().filter(|(p, _)| !passed.contains_key(*p)) {
            t.insert(p, e.clone());
        }
        t
    };
    let run = |blobs: &GitBlobs, passed: &HashMap<Vec<u8>, String>| {
        let contents = Both {
            store: &store.blobs,
            git: blobs,
            made: made.iter().cloned().collect(),
        };
        merge_passing(&base, ours, theirs, &contents, &|p| passed.contains_key(p))
    };
    let mut m = run(blobs, &passed);
    let more: Vec<Vec<u8>> = candidates(&m.conflicts)
        .into_iter()
        .filter(|p| !passed.contains_key(p))
        .collect();
    let found = passed_on(store, blobs, (replica, ours), bases, &more);
    if !found.is_empty() {
        passed.extend(found);
        m = run(blobs, &passed);
    }
    (m, passed)
}

/// Conflicts listed against other replicas than the merged one: by
/// replica, the commit they are listed with, and the conflicts.
pub(super) type Elsewhere = BTreeMap<String, (String, Vec<Conflict>)>;

/// A merge's conflicts under the rule.
pub(super) struct Settled {
    /// The merged replica's.
    pub here: Vec<Conflict>,
    /// Those where the merged replica's side stayed and this tree's,
    /// passed on from another replica, did not: that replica's.
    pub elsewhere: Elsewhere,
    /// The paths now kept against each of those replicas.
    pub kept: Vec<(String, Vec<u8>)>,
}

/// Sorts a merge's conflicts `decided` (see [`Settled`]); `from` says
/// where each path passed on came from, and `failed` which paths were not
/// written (their unit could not be): a side that stayed there did not,
/// and is nobody's conflict. Changes nothing: the caller records them
/// and moves `bases` with the merge's own.
pub(super) fn settle(
    decided: Vec<Conflict>,
    from: &HashMap<Vec<u8>, String>,
    bases: &BTreeMap<String, Base>,
    failed: &dyn Fn(&[u8]) -> bool,
) -> Settled {
    let mut out = Settled {
        here: Vec::new(),
        elsewhere: Elsewhere::new(),
        kept: Vec::new(),
    };
    for c in decided {
        if !(c.lost == Side::Ours && decidable(&c)) {
            out.here.push(c);
            continue;
        }
        if failed(&c.path) {
            continue;
        }
        let Some((r, base)) = from.get(&c.path).and_then(|r| bases.get(r).map(|b| (r, b))) else {
            out.here.push(c);
            continue;
        };
        out.kept.push((r.clone(), c.path.clone()));
        // Theirs, as that replica's conflict: its side is the one not live.
        let c = Conflict {
            lost: Side::Theirs,
            ..c
        };
        out.elsewhere
            .entry(r.clone())
            .or_insert_with(|| (base.commit.clone(), Vec::new()))
            .1
            .push(c);
    }
    out
}
