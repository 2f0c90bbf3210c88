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
//! Which replica a file came from is read from the journal
//! (`passed_on`): every version of the path here was made by a replica's
//! applier (anything this tree did there itself makes it an author), the
//! content was first written here by that replica's applier, and it is
//! that replica's side as of its last commit merged here; so nothing of
//! this tree's own is ever taken for passed on (a process that names
//! itself like an applier can only pass that replica's own side for
//! passed on). A side taken by `sync --take`, or put back by
//! `restore REPLICA:ID` as of that commit, is written the same way and
//! counts alike.
//!
//! A path that a replica says it kept against this one (`skillfs-kept:`)
//! and that this tree only passed on is *contested*: its base is left out
//! of the merge (so its unit is merged path by path) and the two entries
//! are decided whole by the rule, never merged by lines, rather than this
//! tree keeping what it passed on by that replica's word (two third
//! replicas that sync with each other would otherwise each keep what
//! they had).
//!
//! Locks: the caller's `sync/lock`; reads the journal.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use skillfs_sync::merge::{Conflict, Merged, Reason, Side, Third, merge_passing};
use skillfs_sync::tree::{Entry, Tree};

use super::apply::actor_of;
use super::gittree::{Both, GitBlobs};
use super::pull::Base;
use crate::commands::Store;
use crate::relpath::RelPath;
use crate::store::journal::EntryState;

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
/// came from: the path's content here (as its newest version has it) was
/// first written, in the run of versions that hold it, by the merge (or
/// take) of a replica this store merged, other than `replica` (whose
/// merge this is), as the journal's actor says (`actor_of`); and it is
/// that replica's own entry at its last commit merged here (not a text
/// merged by lines with this tree's own, nor an older version restored);
/// and no version of the path was ever made by anything but a replica's
/// applier (this tree never wrote, removed or restored it itself: a text
/// two replicas merged by lines and passed back and forth is theirs
/// both). The run matters: a merge swaps a skill in whole, giving every
/// file of it a version (and one where the old skill was parked, gone
/// from here). A replica with units waiting here is left out: what this
/// tree keeps against it is not published meanwhile
/// (`merged_trailers`).
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
    // A merge's actor names the first 8 digits of its replica's id: two
    // replicas that share them (the merged one among them) name neither.
    let mut by_actor: HashMap<String, Option<&String>> = HashMap::new();
    let merged = replica.to_string();
    for r in bases.keys().chain([&merged]) {
        by_actor
            .entry(actor_of(r))
            .and_modify(|v| *v = None)
            .or_insert(Some(r));
    }
    let appliers: HashSet<String> = by_actor.keys().cloned().collect();
    by_actor.retain(|_, r| {
        r.is_some_and(|r| *r != merged && bases.get(r).is_some_and(|b| b.pending.is_empty()))
    });
    let same = |a: &EntryState, b: &EntryState| {
        (a.kind, &a.blob, &a.target, a.mode & 0o100) == (b.kind, &b.blob, &b.target, b.mode & 0o100)
    };
    let mut trees: HashMap<String, Option<Tree>> = HashMap::new();
    let mut out = HashMap::new();
    for p in paths {
        let Some(idx) = RelPath::parse(p).and_then(|rp| store.index.idx(&rp)) else {
            continue;
        };
        let versions = store.index.versions(idx);
        let Some((_, Some(now))) = versions.last() else {
            continue;
        };
        // Anything this tree ever did at the path itself (a write, a
        // removal, a restore; a text merged by lines that another replica
        // took whole and passed back is partly its own too) makes it an
        // author there, not a third: it keeps its side, as authors do.
        let own = versions.iter().any(|(seq, _)| {
            records
                .binary_search_by_key(seq, |r| r.seq)
                .map_or(true, |i| !appliers.contains(&records[i].actor.comm))
        });
        if own {
            continue;
        }
        // The first version of the run that holds this content (across
        // the moments a swap had the file parked: gone from here, then
        // back as it was).
        let first = versions
            .iter()
            .rev()
            .take_while(|(_, s)| s.as_ref().is_none_or(|s| same(s, now)))
            .filter(|(_, s)| s.is_some())
            .last()
            .map(|(seq, _)| *seq);
        let Some(at) = first.and_then(|seq| records.binary_search_by_key(&seq, |r| r.seq).ok())
        else {
            continue;
        };
        let Some(Some(from)) = by_actor.get(&records[at].actor.comm) else {
            continue;
        };
        let commit = &bases[*from].commit;
        let theirs = trees
            .entry((*from).clone())
            .or_insert_with(|| blobs.tree(commit, &mut Vec::new()).ok());
        let equal = theirs
            .as_ref()
            .is_some_and(|t| t.get(p).is_some() && t.get(p) == ours.get(p));
        if equal {
            out.insert(p.to_vec(), (*from).clone());
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
    let contested: HashSet<Vec<u8>> = passed.keys().cloned().collect();
    // The base as it is unless a path is contested (no copy of it).
    let base: Cow<Tree> = if passed.is_empty() {
        Cow::Borrowed(base)
    } else {
        let mut t = Tree::new();
        for (p, e) in base.iter().filter(|(p, _)| !passed.contains_key(*p)) {
            t.insert(p, e.clone());
        }
        Cow::Owned(t)
    };
    let made: HashMap<String, Vec<u8>> = made.iter().cloned().collect();
    let run = |blobs: &GitBlobs, passed: &HashMap<Vec<u8>, String>, made| {
        let contents = Both {
            store: &store.blobs,
            git: blobs,
            made,
        };
        let third = Third {
            passed_on: &|p| passed.contains_key(p),
            contested: &|p| contested.contains(p),
        };
        let m = merge_passing(&base, ours, theirs, &contents, &third);
        (m, contents.made)
    };
    let (mut m, made) = run(blobs, &passed, made);
    let more: Vec<Vec<u8>> = candidates(&m.conflicts)
        .into_iter()
        .filter(|p| !passed.contains_key(p))
        .collect();
    let found = passed_on(store, blobs, (replica, ours), bases, &more);
    if !found.is_empty() {
        passed.extend(found);
        m = run(blobs, &passed, made).0;
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
