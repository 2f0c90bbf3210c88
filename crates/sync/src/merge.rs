//! The merge of two replicas' trees against their last merged base: per
//! skill, then per file, then per line (`diff3`), with conflicts kept as
//! versions, never as files in the live tree.
//!
//! The unit of decision is a skill (a directory holding `SKILL.md` in any
//! of the three trees, with everything below it); an entry outside every
//! skill is a unit of its own. For each unit:
//! - one side changed it (or both alike): that side's;
//! - both changed it: file by file. A file one side changed: that side's.
//!   Text both changed: a three-way merge by lines; if the changes
//!   overlap, **ours** stays and theirs is a conflict. Binary content, a
//!   kind against another kind, or two different links: ours stays,
//!   theirs is a conflict. A delete against a modify: **the modify stays**
//!   (whichever side made it) and the delete is the conflict.
//! - A unit whose merge is not a whole tree (a file where the other side
//!   needs a directory), whose `SKILL.md` lost the frontmatter both sides
//!   had, or that makes two skills share a name neither side had twice,
//!   is ours whole, and theirs the conflict.
//!
//! Invariants (the tests check them on random histories):
//! - nothing is lost: every entry a side changed is in the result, or was
//!   merged into a new text, or is in a conflict that says which side lost
//!   it (a conflict's `entries` are what the losing side had);
//! - a side that changed nothing gives the other side's tree exactly;
//! - the two replicas of a pair find the same conflicts, and agree on
//!   every path outside them (each keeps its own side where they differ).
//!   One exception, a limit: two skills given one name on the two
//!   replicas at once are each kept live where they were made, each
//!   replica listing the other's as its conflict, until one is resolved;
//! - the result is whole (every entry's parent is a directory).
//!
//! A third replica (one whose file is another replica's side, taken by a
//! merge and not changed since: `merge_passing`'s `Third`) that meets
//! a conflict there between that side and another replica's keeps
//! neither by being first: the side [`prefer`] names stays (the same on
//! every replica, whatever order they merged in), and the other is the
//! conflict, ours (`lost: Ours`) when theirs stays.
//!
//! No clock and no replica id decides anything here.
//!
//! Locks: none; a pure function of its inputs and the contents it reads.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use crate::diff3;
use crate::skill::{self, SKILL_MD};
use crate::tree::{Entry, Tree, within};

/// The contents of files, by the hash that names them.
pub trait Contents {
    fn read(&self, blob: &str) -> Option<Vec<u8>>;
}

/// One side of a merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Ours,
    Theirs,
}

/// Why a side's change did not reach the merged tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Both changed the same lines of a text.
    Overlap,
    /// Both changed a file that is not text.
    Binary,
    /// Different kinds, or two different symlinks.
    Kind,
    /// One side deleted what the other changed; the change stayed.
    DeleteModify,
    /// The unit's merge was not whole, or failed the skill checks (why).
    Check(String),
}

/// A change kept as a version rather than in the live tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The file, or the unit (skill directory), it is about.
    pub path: Vec<u8>,
    pub reason: Reason,
    /// The side whose change did not reach the tree.
    pub lost: Side,
    /// What that side had at `path` and below (empty: it deleted them).
    pub entries: Vec<(Vec<u8>, Entry)>,
}

/// The result of a merge.
#[derive(Debug, Default)]
pub struct Merged {
    pub tree: Tree,
    pub conflicts: Vec<Conflict>,
    /// Texts made by a line merge, by their hash (sha256, hex).
    pub new_blobs: Vec<(String, Vec<u8>)>,
}

type Sub<'a> = BTreeMap<&'a [u8], &'a Entry>;

fn entries_of(sub: &Sub<'_>) -> Vec<(Vec<u8>, Entry)> {
    sub.iter()
        .map(|(p, e)| (p.to_vec(), (*e).clone()))
        .collect()
}

/// The unit each path belongs to: its innermost skill, else itself
/// (found by walking up its ancestors: linear in the tree).
fn unit_of<'a>(path: &'a [u8], roots: &BTreeSet<Vec<u8>>) -> &'a [u8] {
    let mut at = Some(path);
    while let Some(p) = at {
        if roots.contains(p) {
            return p;
        }
        at = crate::tree::parent(p);
    }
    path
}

fn text(contents: &dyn Contents, e: Option<&Entry>) -> Option<Option<String>> {
    match e {
        None => Some(None),
        Some(Entry::File { blob, .. }) => {
            let bytes = contents.read(blob)?;
            if bytes.contains(&0) {
                return None;
            }
            String::from_utf8(bytes).ok().map(Some)
        }
        Some(_) => None,
    }
}

/// Merges `ours` and `theirs`, both descended from `base`.
pub fn merge(base: &Tree, ours: &Tree, theirs: &Tree, contents: &dyn Contents) -> Merged {
    let none = |_: &[u8]| false;
    let third = Third {
        passed_on: &none,
        contested: &none,
    };
    merge_passing(base, ours, theirs, contents, &third)
}

/// Which of two conflicting entries a third replica keeps live: the one
/// whose content sorts first (a file by its content's hash, then its
/// executable bit; a link by its target; a file before a link). Only
/// what every replica sees alike decides it.
pub fn prefer(a: &Entry, b: &Entry) -> bool {
    let key = |e: &Entry| match e {
        Entry::File { blob, exec } => (0, blob.as_bytes().to_vec(), *exec),
        Entry::Symlink { target } => (1, target.clone(), false),
        Entry::Dir => (2, Vec::new(), false),
    };
    key(a) < key(b)
}

/// A predicate on paths.
pub type Paths<'a> = &'a dyn Fn(&[u8]) -> bool;

/// What a third replica knows of its own tree (see [`merge_passing`]).
pub struct Third<'a> {
    /// This tree's entry at the path is another replica's side, taken by
    /// a merge and unchanged here since.
    pub passed_on: Paths<'a>,
    /// Of those, the paths where the other side must meet this one as a
    /// conflict whatever the base says (its replica says it kept its side
    /// against this tree's): two different files or links there are
    /// decided whole by [`prefer`], never merged by lines.
    pub contested: Paths<'a>,
}

/// [`merge`], for a tree that passed some entries on (`third`): a
/// conflict at such a path between two files or links is decided by
/// [`prefer`] rather than kept ours (see the module's doc).
pub fn merge_passing(
    base: &Tree,
    ours: &Tree,
    theirs: &Tree,
    contents: &dyn Contents,
    third: &Third<'_>,
) -> Merged {
    let roots: BTreeSet<Vec<u8>> = [base, ours, theirs]
        .iter()
        .flat_map(|t| skill::roots(t))
        .collect();
    let mut units: BTreeSet<&[u8]> = BTreeSet::new();
    for t in [base, ours, theirs] {
        for (p, _) in t.iter() {
            units.insert(unit_of(p, &roots));
        }
    }
    let mut m = Merged::default();
    // Units whose result is not ours verbatim, for the checks below.
    let mut not_ours: BTreeSet<Vec<u8>> = BTreeSet::new();
    for unit in &units {
        let sub = |t: &'_ Tree| -> BTreeMap<Vec<u8>, Entry> {
            let s = if roots.contains(*unit) {
                // Without a skill inside it: that one is a unit of its own.
                let mut s = t.subtree(unit);
                s.retain(|p, _| unit_of(p, &roots) == *unit);
                s
            } else {
                t.get(unit)
                    .map(|e| BTreeMap::from([(*unit, e)]))
                    .unwrap_or_default()
            };
            s.into_iter()
                .map(|(p, e)| (p.to_vec(), e.clone()))
                .collect()
        };
        let (ub, uo, ut) = (sub(base), sub(ours), sub(theirs));
        let chosen = if uo == ut || ut == ub {
            uo.clone()
        } else if uo == ub {
            ut.clone()
        } else {
            by_path(&ub, &uo, &ut, (contents, third), &mut m)
        };
        if chosen != uo {
            not_ours.insert(unit.to_vec());
        }
        for (p, e) in chosen {
            m.tree.0.insert(p, e);
        }
    }
    // The directories above a unit's entries (a category deleted on one
    // side and given a new skill on the other: the modify stays).
    let all: Vec<Vec<u8>> = m.tree.0.keys().cloned().collect();
    for p in all {
        if let Some(e) = m.tree.0.get(&p).cloned() {
            m.tree.insert(&p, e);
        }
    }
    check(base, ours, theirs, contents, &roots, &not_ours, &mut m);
    m
}

/// Both sides changed a unit: its entries merged one by one.
fn by_path(
    base: &BTreeMap<Vec<u8>, Entry>,
    ours: &BTreeMap<Vec<u8>, Entry>,
    theirs: &BTreeMap<Vec<u8>, Entry>,
    (contents, third): (&dyn Contents, &Third<'_>),
    m: &mut Merged,
) -> BTreeMap<Vec<u8>, Entry> {
    let paths: BTreeSet<&Vec<u8>> = base
        .keys()
        .chain(ours.keys())
        .chain(theirs.keys())
        .collect();
    let mut out = BTreeMap::new();
    for p in paths {
        let (b, o, t) = (base.get(p), ours.get(p), theirs.get(p));
        let conflict = |reason, lost, e: Option<&Entry>| Conflict {
            path: p.clone(),
            reason,
            lost,
            entries: e.map(|e| vec![(p.clone(), e.clone())]).unwrap_or_default(),
        };
        // Both sides changed a file or link that this tree only passed on:
        // the side `prefer` names stays, and the other is the conflict.
        let leaf = |e: Option<&Entry>| e.is_some_and(|e| *e != Entry::Dir);
        let decide = |reason, m: &mut Merged| match (o, t) {
            (Some(eo), Some(et))
                if leaf(o) && leaf(t) && (third.passed_on)(p) && prefer(et, eo) =>
            {
                m.conflicts.push(conflict(reason, Side::Ours, o));
                t
            }
            _ => {
                m.conflicts.push(conflict(reason, Side::Theirs, t));
                o
            }
        };
        if o != t && leaf(o) && leaf(t) && (third.contested)(p) {
            let reason = match (o, t) {
                (Some(Entry::File { .. }), Some(Entry::File { .. })) => {
                    match (text(contents, o), text(contents, t)) {
                        (Some(Some(_)), Some(Some(_))) => Reason::Overlap,
                        _ => Reason::Binary,
                    }
                }
                _ => Reason::Kind,
            };
            if let Some(e) = decide(reason, m) {
                out.insert(p.clone(), e.clone());
            }
            continue;
        }
        let kept = if o == t || t == b {
            o
        } else if o == b {
            t
        } else {
            match (o, t) {
                (None, Some(_)) => {
                    m.conflicts
                        .push(conflict(Reason::DeleteModify, Side::Ours, None));
                    t
                }
                (Some(_), None) => {
                    m.conflicts
                        .push(conflict(Reason::DeleteModify, Side::Theirs, None));
                    o
                }
                (Some(Entry::File { exec: eo, .. }), Some(Entry::File { exec: et, .. })) => {
                    // The executable bit merges on its own: the side that
                    // changed it from the base wins (ours if both did).
                    let eb = match b {
                        Some(Entry::File { exec, .. }) => *exec,
                        _ => *eo,
                    };
                    let exec = if eo == &eb { et } else { eo };
                    match (text(contents, b), text(contents, o), text(contents, t)) {
                        (Some(tb), Some(Some(to)), Some(Some(tt))) => {
                            match diff3::merge(tb.as_deref().unwrap_or(""), &to, &tt) {
                                Some(merged) => {
                                    let blob = hex(&Sha256::digest(merged.as_bytes()));
                                    m.new_blobs.push((blob.clone(), merged.into_bytes()));
                                    out.insert(p.clone(), Entry::File { blob, exec: *exec });
                                    continue;
                                }
                                None => decide(Reason::Overlap, m),
                            }
                        }
                        _ => decide(Reason::Binary, m),
                    }
                }
                _ => decide(Reason::Kind, m),
            }
        };
        if let Some(e) = kept {
            out.insert(p.clone(), e.clone());
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checks on the merged tree: a unit that fails one is ours whole.
fn check(
    base: &Tree,
    ours: &Tree,
    theirs: &Tree,
    contents: &dyn Contents,
    roots: &BTreeSet<Vec<u8>>,
    not_ours: &BTreeSet<Vec<u8>>,
    m: &mut Merged,
) {
    let _ = base;
    let fresh: std::collections::HashMap<String, Vec<u8>> = m.new_blobs.iter().cloned().collect();
    let read = |_: &Merged, t: &Tree, root: &[u8]| -> Option<String> {
        let mut p = root.to_vec();
        p.push(b'/');
        p.extend_from_slice(SKILL_MD);
        match t.get(&p)? {
            Entry::File { blob, .. } => fresh
                .get(blob)
                .cloned()
                .or_else(|| contents.read(blob))
                .and_then(|b| String::from_utf8(b).ok()),
            _ => None,
        }
    };
    let mut reverted: BTreeSet<Vec<u8>> = BTreeSet::new();
    loop {
        let mut bad: Option<(Vec<u8>, String)> = None;
        // A unit that is not whole, or lost the frontmatter ours had.
        for unit in not_ours.iter().filter(|u| !reverted.contains(*u)) {
            let whole =
                m.tree.subtree(unit).keys().all(|p| {
                    crate::tree::parent(p).is_none_or(|d| m.tree.get(d) == Some(&Entry::Dir))
                });
            if !whole {
                bad = Some((
                    unit.clone(),
                    "a file where the other side needs a directory".into(),
                ));
                break;
            }
            if roots.contains(unit) {
                // Only a text the merge made: a side that broke its own
                // frontmatter is that side's change, taken as it is.
                let fm = |t: Option<String>| t.is_some_and(|t| skill::frontmatter(&t).is_some());
                let both_had = fm(read(m, ours, unit)) && fm(read(m, theirs, unit));
                if both_had && !fm(read(m, &m.tree, unit)) {
                    bad = Some((
                        unit.clone(),
                        "its SKILL.md would lose its frontmatter".into(),
                    ));
                    break;
                }
            }
        }
        // Two skills with one name that neither side had twice: the merge
        // made the clash, so a unit of it not ours verbatim is ours again.
        if bad.is_none() {
            let names = |t: &Tree| -> BTreeMap<String, usize> {
                let mut n = BTreeMap::new();
                for r in skill::roots(t) {
                    *n.entry(skill::skill_name(&r, read(m, t, &r).as_deref()))
                        .or_default() += 1;
                }
                n
            };
            let (no, nt) = (names(ours), names(theirs));
            let mut by_name: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
            for r in skill::roots(&m.tree) {
                let text = read(m, &m.tree, &r);
                by_name
                    .entry(skill::skill_name(&r, text.as_deref()))
                    .or_default()
                    .push(r);
            }
            bad = by_name.into_iter().find_map(|(name, rs)| {
                let had = |n: &BTreeMap<String, usize>| n.get(&name).copied().unwrap_or(0);
                (rs.len() > had(&no).max(had(&nt)).max(1))
                    .then(|| {
                        rs.into_iter()
                            .find(|r| not_ours.contains(r) && !reverted.contains(r))
                    })
                    .flatten()
                    .map(|r| (r, format!("two skills would be named '{name}'")))
            });
        }
        let Some((unit, why)) = bad else { return };
        // Ours whole, theirs the conflict.
        // Ours whole, skills inside it included, and theirs the conflict:
        // what it had there, all of it (the conflicts inside give way).
        m.conflicts.retain(|c| !within(&c.path, &unit));
        let keys: Vec<Vec<u8>> = m.tree.subtree(&unit).keys().map(|p| p.to_vec()).collect();
        for k in keys {
            m.tree.0.remove(&k);
        }
        for (p, e) in ours.subtree(&unit) {
            m.tree.0.insert(p.to_vec(), e.clone());
        }
        m.conflicts.push(Conflict {
            path: unit.clone(),
            reason: Reason::Check(why),
            lost: Side::Theirs,
            entries: entries_of(&theirs.subtree(&unit)),
        });
        reverted.insert(unit);
    }
}
