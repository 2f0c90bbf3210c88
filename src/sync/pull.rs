//! The other replicas' versions merged into this tree: for each replica
//! this store keeps (`kept`), its kept tip is merged with the newest state
//! of the live tree against the last of its commits merged here (none
//! yet: an empty tree), per skill, per file, per line
//! (`skillfs_sync::merge`), and what changed is written through the mount
//! (`apply`). Then that commit is the replica's base for the next merge.
//!
//! Layout in `sync/`:
//! ```text
//! merged.json      {"<replica>": {"commit": C, "id": N}}: the last
//!                  commit of each replica merged here, and this store's
//!                  newest change once it was (see "The base" below)
//! conflicts.jsonl  one line per conflict (see `conflicts`)
//! blobmap          git ids to sha256 (see `gittree`)
//! merges           the commits merged here, until a pushed commit of
//!                  this replica has them as parents
//! ```
//!
//! The base. Each merge made here that changed something becomes a
//! parent of this replica's next exported commit (`sync/merges` until
//! then), so the base of a merge of replica R's tip is git's merge base
//! of that tip and this replica's history: its branch, and the newest
//! commit of every other replica merged here, which the branch shows
//! only once exported (and a merge that changed nothing, never). Several
//! merge bases, a criss-cross, are made one by `virtual_base`. At a path
//! where a conflict kept this tree's side (against any replica) or a
//! unit waits, the other replicas' merged commits do not say what this
//! tree holds, and the base there is the one of this replica's branch
//! alone (see `merged_elsewhere`). While this store's own last merge of R
//! is newer than what its branch shows (not exported yet, or with units
//! still waiting), that merge's commit is the base, each waiting unit
//! keeping its own older one. Without a common history: what R's tip
//! says it merged of this store (`skillfs-merged:` trailers), else an
//! empty tree. Where R kept its own side in a conflict with this store
//! and the two still differ (`skillfs-kept:` trailers), R's side is taken
//! for no change of R's.
//!
//! Invariants: a base moves only when every unit of its merge was applied
//! (a busy one is merged again at the next sync, where the applied units
//! are no longer a difference); a conflict keeps the local side live and
//! the other side stays in the kept history, never a file in the tree.
//!
//! Locks: `sync/lock` for the whole merge; the writes go through the
//! mount.

use std::collections::BTreeMap;
use std::path::Path;

use skillfs_sync::merge::{Conflict, Reason, Side, merge};
use skillfs_sync::tree::{Entry, Tree, within};

use crate::relpath::ByteString;

use super::apply::{Applied, Meta, apply};
use super::gittree::{Both, GitBlobs};
use super::remotes::sync_dir;
use super::{git, kept, lock};
use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::history::ROOT_IDX;
use crate::store::Layout;
use crate::store::durable::StoreIo;
use crate::store::journal::Kind;

pub(super) const MERGED: &str = "merged.json";
/// The trailer that says what a replica had merged of another.
const MERGED_TRAILER: &str = "skillfs-merged";

/// The last commit of a replica merged here.
#[derive(serde::Serialize, serde::Deserialize, Clone)]
pub(super) struct Base {
    pub(super) commit: String,
    /// This store's newest change once the merge was applied.
    id: u64,
    /// Whether any merge of this replica so far left a conflict.
    #[serde(default)]
    conflicted: bool,
    /// Units left for a later sync (busy, or failed), each with the commit
    /// its base stays at (empty: an empty tree).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pending: Vec<(ByteString, String)>,
    /// Paths where a conflict with this replica kept this tree's side and
    /// the two still differ (as of its newest commit merged): published
    /// in `skillfs-kept:` trailers (see "The base").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) kept: Vec<ByteString>,
}

pub(super) fn load_bases(dir: &crate::store::Dir) -> Result<BTreeMap<String, Base>, Failure> {
    let path = dir.join(MERGED);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            Failure::new(
                Exit::BadStore,
                format!("'{}' is damaged: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(Failure::io(Exit::BadStore, "read", &path, &e)),
    }
}

/// The trailer lines for this store's next commits (see "The base"):
/// `skillfs-merged: <replica> <commit>`, the last commit of each replica
/// merged here whole (none while a unit of it waits), and `skillfs-kept:
/// <replica> <path in hex>`, each path where a conflict with that replica
/// kept this tree's side and the two still differ (at most [`KEPT_MAX`]).
pub fn merged_trailers(layout: &Layout) -> Result<String, Failure> {
    let Some(dir) = sync_dir(layout, false)? else {
        return Ok(String::new());
    };
    let mut out = String::new();
    let mut kept = 0;
    for (r, b) in load_bases(&dir)? {
        if !b.pending.is_empty() {
            continue;
        }
        out.push_str(&format!("{MERGED_TRAILER}: {r} {}\n", b.commit));
        for p in b.kept.iter().take(KEPT_MAX.saturating_sub(kept)) {
            out.push_str(&format!(
                "{KEPT_TRAILER}: {r} {}\n",
                crate::relpath::hex(&p.0)
            ));
            kept += 1;
        }
    }
    Ok(out)
}

/// Each merge made here, a line `<commit>` of `sync/merges`, until the
/// export has made it a parent of this replica's branch.
const MERGES: &str = "merges";

/// The commits merged here that this replica's branch does not have as
/// ancestors yet (each once).
pub fn unattached_merges(dir: &crate::store::Dir, repo: &Path, branch: &str) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(MERGES)).unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for c in text.lines().map(str::trim) {
        let sound = c.len() >= 40 && c.bytes().all(|b| b.is_ascii_hexdigit());
        if sound
            && !out.iter().any(|o| o == c)
            && kept::resolve(repo, c).is_some()
            && !kept::is_ancestor(repo, c, branch).unwrap_or(false)
        {
            out.push(c.to_string());
        }
    }
    out
}

/// Forgets the merges the branch now has as ancestors.
pub fn merges_attached(dir: &crate::store::Dir, repo: &Path, branch: &str) {
    let left = unattached_merges(dir, repo, branch);
    let text: String = left.iter().map(|c| format!("{c}\n")).collect();
    if let Err(e) = dir.replace(MERGES, text.as_bytes(), &StoreIo::real()) {
        tracing::warn!("sync: could not write {}: {e}", dir.join(MERGES).display());
    }
}

/// Notes that `commit` was merged here (see [`MERGES`]).
fn note_merge(dir: &crate::store::Dir, commit: &str) -> Result<(), String> {
    let path = dir.join(MERGES);
    let mut f = dir
        .open_append(MERGES)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::Write::write_all(&mut f, format!("{commit}\n").as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

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
const KEPT_MAX: usize = 1000;
const KEPT_TRAILER: &str = "skillfs-kept";

/// What another replica's tip says of this store: the commit of this
/// store's branch it merged last (with the change id that commit holds),
/// and the paths where it kept its own side against this store.
#[derive(Clone)]
struct Said {
    commit: String,
    id: u64,
    kept: Vec<Vec<u8>>,
}

/// What `tip` says of this store (`own`, whose branch is `own_branch`).
fn merged_by_them(repo: &Path, tip: &str, own: &str, own_branch: &str) -> Option<Said> {
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

/// What merging one replica did.
pub struct Pulled {
    pub replica: String,
    pub commit: String,
    pub applied: Applied,
    pub conflicts: Vec<Conflict>,
    /// Entries of its commit left out (not a path, a submodule).
    pub skipped: Vec<String>,
    /// Why its merge failed, if it did (nothing moved).
    pub error: Option<String>,
}

impl Pulled {
    /// What it did, in a line.
    pub fn summary(&self) -> String {
        let short = &self.replica[..8.min(self.replica.len())];
        let mut s = format!(
            "merged replica {short} at {}: {} unit{} changed",
            &self.commit[..12.min(self.commit.len())],
            self.applied.done.len(),
            if self.applied.done.len() == 1 {
                ""
            } else {
                "s"
            }
        );
        if !self.conflicts.is_empty() {
            s.push_str(&format!(
                ", {} conflict{} (`skillfs sync --conflicts` lists them)",
                self.conflicts.len(),
                if self.conflicts.len() == 1 { "" } else { "s" }
            ));
        }
        if !self.applied.busy.is_empty() {
            s.push_str(&format!(
                ", {} left for the next sync (busy)",
                self.applied.busy.len()
            ));
        }
        s
    }
}

/// The live tree's newest state as a merge sees it, its change id, and
/// each entry's mode and mtime.
pub(super) fn ours(store: &Store) -> (Tree, u64, Meta) {
    let id = store.index.last();
    let mut t = Tree::new();
    let mut meta = Meta::new();
    for (p, s) in store.subtree(ROOT_IDX, id) {
        meta.insert(p.as_bytes().to_vec(), (s.mode, s.mtime_ns));
        let e = match s.kind {
            Kind::Dir => Entry::Dir,
            Kind::File => Entry::File {
                blob: s.blob.clone().unwrap_or_default(),
                exec: s.mode & 0o100 != 0,
            },
            Kind::Symlink => Entry::Symlink {
                target: s.target.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
            },
        };
        t.insert(p.as_bytes(), e);
    }
    (t, id, meta)
}

pub(super) fn reason(r: &Reason) -> String {
    match r {
        Reason::Overlap => "both changed the same lines".into(),
        Reason::Binary => "both changed it, and it is not text".into(),
        Reason::Kind => "both made it, as different kinds".into(),
        Reason::DeleteModify => "one side deleted what the other changed".into(),
        Reason::Check(why) => why.clone(),
    }
}

/// Merges every replica this store keeps into the live tree under the
/// mounted `root` (the caller made sure it is mounted).
pub fn pull(layout: &Layout, root: &Path) -> Result<Vec<Pulled>, Failure> {
    let Some(dir) = sync_dir(layout, false)? else {
        return Ok(Vec::new());
    };
    let _lock = lock(&dir, layout)?;
    let repo = dir.join("repo.git");
    let own = super::replica_id(layout, false)?.unwrap_or_default();
    let mut bases = load_bases(&dir)?;
    let mut blobs = GitBlobs::open(dir.path(), &repo);
    let mut out = Vec::new();
    for (replica, tip) in waiting(&repo, &own, &bases) {
        // One replica's failure is its own: the others are still merged.
        let pulled = match merge_one(
            (layout, root, &dir),
            (&replica, &tip, &own),
            &mut bases,
            &mut blobs,
        ) {
            Ok(p) => p,
            Err(why) => Pulled {
                replica,
                commit: tip,
                applied: Applied::default(),
                conflicts: Vec::new(),
                skipped: Vec::new(),
                error: Some(why),
            },
        };
        out.push(pulled);
    }
    blobs.save().map_err(|why| {
        Failure::new(
            Exit::BadStore,
            format!("could not write the blob map: {why}"),
        )
    })?;
    Ok(out)
}

/// The replicas this store keeps whose newest commit is not merged yet,
/// with that commit.
fn waiting(repo: &Path, own: &str, bases: &BTreeMap<String, Base>) -> Vec<(String, String)> {
    let listed = git(Some(repo))
        .args(["for-each-ref", "--format=%(refname)", "refs/skillfs/kept/"])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    String::from_utf8_lossy(&listed)
        .lines()
        .filter_map(|r| super::replica::parse(r.strip_prefix("refs/skillfs/kept/")?.as_bytes()))
        .filter(|r| r != own)
        .filter_map(|r| {
            let tip = kept::resolve(repo, &kept::kept_ref(&r))?;
            (bases
                .get(&r)
                .is_none_or(|b| b.commit != tip || !b.pending.is_empty()))
            .then_some((r, tip))
        })
        .collect()
}

/// Whether anything fetched waits to be merged (the daemon asks before it
/// starts a merge).
pub fn anything_to_merge(layout: &Layout) -> bool {
    let Ok(Some(dir)) = sync_dir(layout, false) else {
        return false;
    };
    let own = super::replica_id(layout, false)
        .ok()
        .flatten()
        .unwrap_or_default();
    let bases = load_bases(&dir).unwrap_or_default();
    !waiting(&dir.join("repo.git"), &own, &bases).is_empty()
}

/// `t` with everything at and below `path` taken from `from`.
fn graft(t: &Tree, path: &[u8], from: &Tree) -> Tree {
    let mut out = Tree::new();
    for (p, e) in t.iter().filter(|(p, _)| !within(p, path)) {
        out.insert(p, e.clone());
    }
    for (p, e) in from.subtree(path) {
        out.insert(p, e.clone());
    }
    out
}

/// `t`, except at and below each of `paths`, where it is `from`: in one
/// pass over each (a graft per path would copy the tree once per path,
/// and a store may keep many conflicts).
fn overlay(t: &Tree, paths: &[ByteString], from: &Tree) -> Tree {
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
fn base_tree(
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
        for (u, c) in &b.pending {
            let older = if c.is_empty() {
                Tree::new()
            } else {
                blobs.tree(c, &mut Vec::new())?
            };
            t = graft(&t, &u.0, &older);
        }
    }
    // Where they kept their side against this store and the two still
    // differ, their side is no change of theirs: each keeps its own until
    // one takes the other's.
    for p in kept {
        if ours.subtree(&p) != theirs.subtree(&p) {
            t = graft(&t, &p, theirs);
        }
    }
    Ok((t, from, base.is_some()))
}

/// What this replica merged of the others, for the base of a merge of
/// `replica`: the newest commit of each other replica merged here, part
/// of this replica's history though its branch shows it only once
/// exported (and a merge that changed nothing, never), and the paths
/// where that knowledge is not to be used: where a conflict kept this
/// tree's side against any replica, or a unit waits. Without the
/// commits, a replica merged after another in one sync was merged against
/// a base that did not know what the first had brought: a removal that
/// came through the first was undone by the older state of the second
/// (found by the three-replica test). At the paths, a merged commit does
/// not say what this tree holds: its side was not taken there, and a
/// base made of it would take this tree's side for no change against
/// the replica that made the other (found by review).
fn merged_elsewhere(
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

/// Merges `replica`'s commit `tip` into the live tree, and moves its base.
fn merge_one(
    (layout, root, dir): (&Layout, &Path, &crate::store::Dir),
    (replica, tip, own): (&str, &str, &str),
    bases: &mut BTreeMap<String, Base>,
    blobs: &mut GitBlobs,
) -> Result<Pulled, String> {
    let repo = dir.join("repo.git");
    let mut skipped = Vec::new();
    let theirs = blobs.tree(tip, &mut skipped)?;
    // Read again for each replica: the one before may have changed it.
    let store = Store::open(layout.clone()).map_err(|f| f.to_string())?;
    let (ours, since, meta) = ours(&store);
    let said = merged_by_them(&repo, tip, own, &super::branch_of(own));
    let old = bases.get(replica).cloned();
    // Texts a virtual base made (see `virtual_base`), read by the merge.
    let mut base_made = Vec::new();
    let (others, masked) = merged_elsewhere(&repo, bases, replica);
    let (mut base, base_commit, keep_pending) = base_tree(
        blobs,
        (&repo, own, &mut base_made),
        (old.as_ref(), tip, &[]),
        said.clone(),
        (&ours, &theirs),
    )?;
    // The same, knowing what was merged of the others, except where that
    // knowledge does not hold (see `merged_elsewhere`).
    if !others.is_empty() {
        let (wide, _, _) = base_tree(
            blobs,
            (&repo, own, &mut base_made),
            (old.as_ref(), tip, &others),
            said,
            (&ours, &theirs),
        )?;
        base = overlay(&wide, &masked, &base);
    }
    let old_pending = match (&old, keep_pending) {
        (Some(b), true) => b.pending.clone(),
        _ => Vec::new(),
    };
    let mut contents = Both {
        store: &store.blobs,
        git: blobs,
        made: base_made.into_iter().collect(),
    };
    let m = merge(&base, &ours, &theirs, &contents);
    contents.made.extend(m.new_blobs);
    let applied = apply(root, layout, (&ours, since), &m.tree, (&contents, &meta))
        .map_err(|f| f.to_string())?;
    // What was written is made durable (the journal and the directory)
    // before the base moves past it.
    std::fs::File::open(root)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let waits = |p: &[u8]| applied.busy.iter().any(|(u, _)| within(p, u));
    // A unit left for later keeps the base it was merged from this time
    // (an older one it already waited with, in or around it); one inside
    // another that waits goes with the outer one.
    let mut pending: Vec<(ByteString, String)> = Vec::new();
    for (u, _) in &applied.busy {
        if applied.busy.iter().any(|(o, _)| o != u && within(u, o)) {
            continue;
        }
        let from = old_pending
            .iter()
            .find(|(p, _)| within(u, &p.0) || within(&p.0, u))
            .map(|(_, c)| c.clone())
            .or_else(|| base_commit.clone())
            .unwrap_or_default();
        pending.push((ByteString(u.clone()), from));
    }
    // What could not be written here is a conflict: the other side's
    // change stays in its commit, listed.
    let mut decided: Vec<Conflict> = m
        .conflicts
        .iter()
        .filter(|c| !waits(&c.path))
        .cloned()
        .collect();
    decided.extend(applied.failed.iter().map(|(u, why)| Conflict {
        path: u.clone(),
        reason: Reason::Check(format!("could not be written here: {why}")),
        lost: Side::Theirs,
        entries: Vec::new(),
    }));
    super::conflicts::record(dir, replica, tip, &decided).map_err(|f| f.to_string())?;
    let id = crate::commands::read_records(layout)
        .map_err(|f| f.to_string())?
        .last()
        .map_or(since, |r| r.seq);
    let conflicted = !decided.is_empty() || old.as_ref().is_some_and(|b| b.conflicted);
    // Where this tree kept its side, as long as the two still differ.
    let mut kept: Vec<ByteString> = old
        .as_ref()
        .filter(|_| keep_pending)
        .map(|b| b.kept.clone())
        .unwrap_or_default();
    kept.extend(
        decided
            .iter()
            .filter(|c| c.lost == Side::Theirs)
            .map(|c| ByteString(c.path.clone())),
    );
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    kept.dedup_by(|a, b| a.0 == b.0);
    kept.retain(|p| m.tree.subtree(&p.0) != theirs.subtree(&p.0));
    bases.insert(
        replica.to_string(),
        Base {
            commit: tip.to_string(),
            id,
            conflicted,
            pending,
            kept,
        },
    );
    let text = serde_json::to_vec_pretty(&*bases).expect("plain values");
    dir.replace(MERGED, &text, &StoreIo::real())
        .map_err(|e| format!("{}: {e}", dir.join(MERGED).display()))?;
    // A parent of this replica's next commit, once nothing of it waits
    // and it changed something here. A merge that changed nothing (the
    // other side held only this tree's own states, or only conflicts)
    // is left out of the graph: it would cross the two histories (two
    // merge bases where one is right) for nothing to learn.
    if applied.busy.is_empty() && !applied.done.is_empty() {
        note_merge(dir, tip)?;
    }
    Ok(Pulled {
        replica: replica.to_string(),
        commit: tip.to_string(),
        applied,
        conflicts: decided,
        skipped,
        error: None,
    })
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
