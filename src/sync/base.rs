//! The base of a merge of another replica's tip into this tree.
//!
//! Each merge made here that changed something becomes a parent of this
//! replica's next exported commit (`sync/merges` until then), so the base
//! of a merge of replica R's tip is git's merge base of that tip and this
//! replica's history: its branch, and the newest commit of every other
//! replica merged here, which the branch shows only once exported (and a
//! merge that changed nothing, never). Several merge bases, a
//! criss-cross, are made one by `virtual_base`. At a path where this
//! tree kept its side (a conflict listed here, or one the other replica
//! listed and said so), or a unit waits, the other replicas' merged
//! commits do not say what this tree holds, and the base there is the
//! one without them (see `merged_elsewhere`). While this store's own last
//! merge of R is newer than what its branch shows (not exported yet, or
//! with units still waiting), that merge's commit is the base, each
//! waiting unit keeping its own older one. Without a common history:
//! what R's tip says it merged of this store (`skillfs-merged:`
//! trailers), else an empty tree. Where R kept its own side in a
//! conflict with this store and the two still differ (`skillfs-kept:`
//! trailers), R's side is taken for no change of R's, and this tree's
//! side counts as kept here too (`pull`).
//!
//! Everything here only reads: the trees come from the store's sync
//! repository (`gittree`), the states of this tree from the journal.

use std::collections::BTreeMap;
use std::path::Path;

use skillfs_sync::tree::{Entry, Tree};

use super::gittree::GitBlobs;
use super::pull::{Base, MERGED_TRAILER};
use super::{git, kept};
use crate::relpath::ByteString;

/// The base git's history gives a merge of `tip` into this replica,
/// whose history is `own` (its branch, and what it merged since that
/// the branch does not show yet): the tree of their merge base (with
/// several heads, of `tip` and a merge of them all), or, when there are
/// several (a criss-cross), those trees merged together.
fn graph_base(
    blobs: &mut GitBlobs,
    repo: &Path,
    (own, tip): (&[String], &str),
    made: &mut Vec<(String, Vec<u8>)>,
) -> Option<(Tree, Vec<String>)> {
    if own.is_empty() {
        return None;
    }
    let out = git(Some(repo))
        .args(["merge-base", "--all", tip])
        .args(own)
        .output()
        .ok()?;
    let bases: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let (first, rest) = bases.split_first()?;
    let mut t = blobs.tree(first, &mut Vec::new()).ok()?;
    for b in rest {
        let other = blobs.tree(b, &mut Vec::new()).ok()?;
        // The two bases' own common state: what each changed from it.
        let below = git(Some(repo))
            .args(["merge-base", first, b])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|c| !c.is_empty());
        let under = match below {
            Some(c) => blobs.tree(&c, &mut Vec::new()).ok()?,
            None => Tree::new(),
        };
        t = virtual_base(&under, &t, &other, (blobs, made));
    }
    Some((t, bases))
}

/// Two merge bases as one (a criss-cross), entry by entry against their
/// own common state `under`: what both hold alike, or what one changed
/// and the other did not; a text both changed, merged by lines (`made`
/// gets the new text, by its sha256). Where that fails the entry is left
/// out: the real merge then sees it as made on both sides and, if they
/// differ, lists a conflict rather than taking a side on a guess.
fn virtual_base(
    under: &Tree,
    a: &Tree,
    b: &Tree,
    (blobs, made): (&GitBlobs, &mut Vec<(String, Vec<u8>)>),
) -> Tree {
    let paths: std::collections::BTreeSet<&[u8]> = under
        .iter()
        .chain(a.iter())
        .chain(b.iter())
        .map(|(p, _)| p)
        .collect();
    let text = |made: &[(String, Vec<u8>)], e: Option<&Entry>| -> Option<String> {
        match e {
            None => Some(String::new()),
            Some(Entry::File { blob, .. }) => {
                let bytes = made
                    .iter()
                    .find(|(h, _)| h == blob)
                    .map(|(_, b)| b.clone())
                    .or_else(|| blobs.fetched(blob))?;
                String::from_utf8(bytes).ok().filter(|t| !t.contains('\0'))
            }
            Some(_) => None,
        }
    };
    let mut out = Tree::new();
    for p in paths {
        let (u, x, y) = (under.get(p), a.get(p), b.get(p));
        let pick = if x == y {
            x.cloned()
        } else if x == u {
            y.cloned()
        } else if y == u {
            x.cloned()
        } else if let (Some(Entry::File { exec, .. }), Some(Entry::File { .. })) = (x, y) {
            let exec = *exec;
            match (text(made, u), text(made, x), text(made, y)) {
                (Some(tu), Some(tx), Some(ty)) => {
                    skillfs_sync::diff3::merge(&tu, &tx, &ty).map(|t| {
                        let blob = super::gittree::hex_sha256(t.as_bytes());
                        made.push((blob.clone(), t.into_bytes()));
                        Entry::File { blob, exec }
                    })
                }
                _ => None,
            }
        } else {
            None
        };
        if let Some(e) = pick {
            out.insert(p, e);
        }
    }
    out
}

/// The most `skillfs-kept:` trailers a commit carries.
pub(super) const KEPT_MAX: usize = 1000;
pub(super) const KEPT_TRAILER: &str = "skillfs-kept";

/// What another replica's tip says of this store: the commit of this
/// store's branch it merged last (with the change id that commit holds),
/// and the paths where it kept its own side against this store.
#[derive(Clone)]
pub(super) struct Said {
    commit: String,
    id: u64,
    pub(super) kept: Vec<Vec<u8>>,
}

/// What `tip` says of this store (`own`, whose branch is `own_branch`).
pub(super) fn merged_by_them(repo: &Path, tip: &str, own: &str, own_branch: &str) -> Option<Said> {
    let trailers = |key: &str| -> Vec<(String, String)> {
        git(Some(repo))
            .args(["log", "-1"])
            .arg(format!("--format=%(trailers:key={key},valueonly)"))
            .arg(tip)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter_map(|l| {
                        let (r, v) = l.trim().split_once(' ')?;
                        Some((r.to_string(), v.to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let commit = trailers(MERGED_TRAILER).into_iter().find_map(|(r, c)| {
        (r == own && c.len() >= 40 && c.bytes().all(|b| b.is_ascii_hexdigit())).then_some(c)
    })?;
    // Only a commit of this store's own branch: a remote's word is not
    // taken for anything else.
    let on_ours = git(Some(repo))
        .args(["merge-base", "--is-ancestor", &commit, own_branch])
        .status()
        .is_ok_and(|s| s.success());
    if !on_ours {
        return None;
    }
    let id = git(Some(repo))
        .args([
            "log",
            "-1",
            "--format=%(trailers:key=skillfs-id,valueonly)",
            &commit,
        ])
        .output()
        .ok()
        .and_then(|o| super::parse_count(&o.stdout))?;
    let kept = trailers(KEPT_TRAILER)
        .into_iter()
        .filter(|(r, _)| r == own)
        .filter_map(|(_, h)| crate::relpath::unhex(&h))
        .filter(|p| skillfs_sync::tree::valid_path(p))
        .collect();
    Some(Said { commit, id, kept })
}

/// `t`, except at and below each of `paths`, where it is `from`: in one
/// pass over each (a graft per path would copy the tree once per path,
/// and a store may keep many conflicts).
pub(super) fn overlay(t: &Tree, paths: &[ByteString], from: &Tree) -> Tree {
    let set: std::collections::BTreeSet<&[u8]> = paths.iter().map(|p| p.0.as_slice()).collect();
    // Whether `p` or a directory above it is one of `paths`.
    let under = |p: &[u8]| {
        set.contains(p)
            || p.iter()
                .enumerate()
                .any(|(i, &b)| b == b'/' && set.contains(&p[..i]))
    };
    let mut out = Tree::new();
    for (p, e) in t.iter().filter(|(p, _)| !under(p)) {
        out.insert(p, e.clone());
    }
    for (p, e) in from.iter().filter(|(p, _)| under(p)) {
        out.insert(p, e.clone());
    }
    out
}

/// The base of a merge of a replica at `tip` (see "The base"): the tree,
/// the commit it is mostly made from (`None`: an empty tree), and whether
/// the units that wait keep their own bases. `others` are the commits of
/// the other replicas merged here whole (see [`merged_elsewhere`]).
pub(super) fn base_tree(
    blobs: &mut GitBlobs,
    (repo, own, made): (&Path, &str, &mut Vec<(String, Vec<u8>)>),
    (base, tip, others): (Option<&Base>, &str, &[String]),
    said: Option<Said>,
    (ours, theirs): (&Tree, &Tree),
) -> Result<(Tree, Option<String>, bool), String> {
    // A branch rewritten since is merged as one that never met this store:
    // an old base that is not in its history would take what it lacks for
    // its removals.
    if let Some(b) = base
        && !kept::is_ancestor(repo, &b.commit, tip).unwrap_or(false)
    {
        return Ok((Tree::new(), None, false));
    }
    let kept = said.as_ref().map(|s| s.kept.clone()).unwrap_or_default();
    // The graph knows what came from whom (merges are parents), unless
    // this store's last merge of them is newer than what its branch shows
    // (a merge not exported yet, or one with units still waiting).
    // A store that never pushed has no branch: what it merged is all.
    let heads: Vec<String> = kept::resolve(repo, &super::branch_of(own))
        .into_iter()
        .chain(others.iter().cloned())
        .collect();
    let graph = graph_base(blobs, repo, (&heads, tip), made).filter(|(_, commits)| {
        base.is_none_or(|b| {
            !commits
                .iter()
                .all(|c| *c != b.commit && kept::is_ancestor(repo, c, &b.commit).unwrap_or(false))
        })
    });
    let (from, mut t) = match (base, said) {
        // The commit a unit left for later keeps as its base: the merge
        // base this merge used (of several, the last merged one; none
        // merged yet, the first). It was the last merged commit even on a
        // first merge, where there is none: the unit was later merged
        // against an empty tree, and a skill unchanged here listed as
        // both changed (found by a three-replica test).
        _ if graph.is_some() => {
            let (t, commits) = graph.expect("matched");
            let from = match (commits.as_slice(), base) {
                ([one], _) => Some(one.clone()),
                (_, Some(b)) => Some(b.commit.clone()),
                (many, None) => many.first().cloned(),
            };
            (from, t)
        }
        // They merged this store after this store last merged them: that
        // state of ours is the newer common one.
        (Some(b), Some(s)) if s.id >= b.id => {
            let t = blobs.tree(&s.commit, &mut Vec::new())?;
            (Some(s.commit), t)
        }
        (Some(b), Some(s)) => {
            let m = blobs.tree(&b.commit, &mut Vec::new())?;
            // Their commit merged here had already merged that state of
            // ours: it is the newer one.
            if merged_by_them(repo, &b.commit, own, &super::branch_of(own))
                .is_some_and(|ms| ms.id >= s.id)
            {
                (Some(b.commit.clone()), m)
            } else {
                // Each merged the other before seeing its own come back (a
                // criss-cross): the base is both, as one.
                let c = blobs.tree(&s.commit, &mut Vec::new())?;
                let v = virtual_base(&Tree::new(), &m, &c, (blobs, made));
                (Some(b.commit.clone()), v)
            }
        }
        (Some(b), None) => (
            Some(b.commit.clone()),
            blobs.tree(&b.commit, &mut Vec::new())?,
        ),
        (None, Some(s)) => {
            let t = blobs.tree(&s.commit, &mut Vec::new())?;
            (Some(s.commit), t)
        }
        (None, None) => (None, Tree::new()),
    };
    // A unit left for later keeps the base it had. (Not in a base that
    // knows the others: the caller takes the one without them at every
    // waiting unit, see `merged_elsewhere`.)
    if let Some(b) = base.filter(|_| others.is_empty()) {
        // One pass per run of units that kept one base (a merge's units
        // share it), in their order: an inner skill's own base is laid
        // over an outer one's, as a graft per unit would.
        for run in b.pending.chunk_by(|x, y| x.1 == y.1) {
            let c = &run[0].1;
            let older = if c.is_empty() {
                Tree::new()
            } else {
                blobs.tree(c, &mut Vec::new())?
            };
            let units: Vec<ByteString> = run.iter().map(|(u, _)| u.clone()).collect();
            t = overlay(&t, &units, &older);
        }
    }
    // Where they kept their side against this store and the two still
    // differ, their side is no change of theirs: each keeps its own until
    // one takes the other's.
    let apart: Vec<ByteString> = kept
        .into_iter()
        .filter(|p| ours.subtree(p) != theirs.subtree(p))
        .map(ByteString)
        .collect();
    if !apart.is_empty() {
        t = overlay(&t, &apart, theirs);
    }
    Ok((t, from, base.is_some()))
}

/// What this replica merged of the others, for the base of a merge of
/// `replica`: the newest commit of each other replica merged here, part
/// of this replica's history though its branch shows it only once
/// exported (and a merge that changed nothing, never), and the paths
/// where that knowledge is not to be used: where this tree kept its side
/// against any replica (`Base::kept`), or a unit waits. Without the
/// commits, a replica merged after another in one sync was merged against
/// a base that did not know what the first had brought: a removal that
/// came through the first was undone by the older state of the second
/// (found by the three-replica test). At the paths, a merged commit does
/// not say what this tree holds: its side was not taken there, and a
/// base made of it would take this tree's side for no change against
/// the replica that made the other (found by review).
pub(super) fn merged_elsewhere(
    repo: &Path,
    bases: &BTreeMap<String, Base>,
    replica: &str,
) -> (Vec<String>, Vec<ByteString>) {
    let commits = bases
        .iter()
        .filter(|(r, _)| r.as_str() != replica)
        .filter(|(_, b)| kept::resolve(repo, &b.commit).is_some())
        .map(|(_, b)| b.commit.clone())
        .collect();
    let mut masked: Vec<ByteString> = bases
        .values()
        .flat_map(|b| {
            b.kept
                .iter()
                .cloned()
                .chain(b.pending.iter().map(|(u, _)| u.clone()))
        })
        .collect();
    masked.sort_by(|a, b| a.0.cmp(&b.0));
    masked.dedup_by(|a, b| a.0 == b.0);
    (commits, masked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(blob: &str) -> Entry {
        Entry::File {
            blob: blob.to_string(),
            exec: false,
        }
    }

    /// `t` with everything at and below `path` taken from `from`: the
    /// plain definition `overlay` keeps in one pass.
    fn graft(t: &Tree, path: &[u8], from: &Tree) -> Tree {
        let mut out = Tree::new();
        for (p, e) in t
            .iter()
            .filter(|(p, _)| !skillfs_sync::tree::within(p, path))
        {
            out.insert(p, e.clone());
        }
        for (p, e) in from.subtree(path) {
            out.insert(p, e.clone());
        }
        out
    }

    /// One pass gives what a graft per path gives, nested paths included.
    #[test]
    fn overlay_is_a_graft_per_path() {
        let mut wide = Tree::new();
        let mut plain = Tree::new();
        for (p, w, b) in [
            ("k/a/SKILL.md", "w1", "p1"),
            ("k/a/x/y.md", "w2", "p2"),
            ("k/ab/SKILL.md", "w3", "p3"),
            ("k/b/SKILL.md", "w4", "p4"),
            ("top.md", "w5", "p5"),
        ] {
            wide.insert(p.as_bytes(), file(w));
            plain.insert(p.as_bytes(), file(b));
        }
        wide.insert(b"k/only-wide/SKILL.md", file("w6"));
        plain.insert(b"k/a/only-plain.md", file("p6"));
        let paths: Vec<ByteString> = ["k/a", "k/a/x", "top.md", "k/none"]
            .iter()
            .map(|p| ByteString(p.as_bytes().to_vec()))
            .collect();
        let folded = paths
            .iter()
            .fold(wide.clone(), |t, p| graft(&t, &p.0, &plain));
        let one = overlay(&wide, &paths, &plain);
        assert!(one == folded, "{one:?} != {folded:?}");
        // k/ab is not under k/a.
        assert_eq!(one.get(b"k/ab/SKILL.md"), Some(&file("w3")));
        assert_eq!(one.get(b"k/a/only-plain.md"), Some(&file("p6")));
    }
}
