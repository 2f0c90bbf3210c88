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
//!                  newest change once it was (see `base`)
//! conflicts.jsonl  one line per conflict (see `conflicts`)
//! blobmap          git ids to sha256 (see `gittree`)
//! merges           the commits merged here, until a pushed commit of
//!                  this replica has them as parents
//! ```
//!
//! The base of each merge is `base`'s (see there).
//!
//! Invariants: a base moves only when every unit of its merge was applied
//! (a busy one is merged again at the next sync, where the applied units
//! are no longer a difference); a conflict keeps the local side live
//! (unless this tree only passed it on: `third`) and the other side
//! stays in the kept history, never a file in the tree.
//!
//! Locks: `sync/lock` for the whole merge; the writes go through the
//! mount.

use std::collections::BTreeMap;
use std::path::Path;

use skillfs_sync::merge::{Conflict, Reason, Side};
use skillfs_sync::tree::{Entry, Tree, within};

use crate::relpath::ByteString;

use super::apply::{Applied, Meta, apply_as};
use super::base::{KEPT_MAX, KEPT_TRAILER, base_tree, merged_by_them, merged_elsewhere, overlay};
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
pub(super) const MERGED_TRAILER: &str = "skillfs-merged";

/// The last commit of a replica merged here.
#[derive(serde::Serialize, serde::Deserialize, Clone)]
pub(super) struct Base {
    pub(super) commit: String,
    /// This store's newest change once the merge was applied.
    pub(super) id: u64,
    /// Units left for a later sync (busy, or failed), each with the commit
    /// its base stays at (empty: an empty tree).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) pending: Vec<(ByteString, String)>,
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
    let kept_by_them: Vec<Vec<u8>> = said.as_ref().map(|s| s.kept.clone()).unwrap_or_default();
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
    // The merge, with the third replica's rule where this tree only
    // passed a file on.
    let (m, passed) = super::third::merge(
        (&store, blobs),
        (replica, bases),
        (&base, &ours, &theirs),
        &base_made,
        &kept_by_them,
    );
    let mut contents = Both {
        store: &store.blobs,
        git: blobs,
        made: base_made.into_iter().collect(),
    };
    contents.made.extend(m.new_blobs);
    let applied = apply_as(
        replica,
        root,
        layout,
        (&ours, since),
        &m.tree,
        (&contents, &meta),
    )
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
    // A side another replica gave this tree and lost by the rule: that
    // replica's conflict, kept against it once the bases move (`third`).
    let failed = |p: &[u8]| applied.failed.iter().any(|(u, _)| within(p, u));
    let settled = super::third::settle(decided.clone(), &passed, bases, &failed);
    super::conflicts::record(dir, replica, tip, &settled.here).map_err(|f| f.to_string())?;
    for (r, (commit, lost)) in &settled.elsewhere {
        super::conflicts::record(dir, r, commit, lost).map_err(|f| f.to_string())?;
    }
    let records = crate::commands::read_records(layout).map_err(|f| f.to_string())?;
    let id = records.last().map_or(since, |r| r.seq);
    // Each unit's author: of the newest commit since the last merge of
    // this replica that changed it.
    let last = old.as_ref().map(|b| b.commit.as_str());
    let mut authors = super::origins::Authors::new(&repo, tip, last);
    super::origins::note(dir, replica, (&records, since), &applied, |unit| {
        super::origins::From {
            commit: tip,
            author: authors.of(unit),
        }
    });
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
    // Where they kept their side against this store and this merge kept
    // this tree's (their side taken for no change of theirs): kept here
    // too, though listed only there. Published, they keep theirs in turn
    // (else this tree's commit, a parent of their next merge of it, was
    // their base, and its side a change they took); masked, a merge of a
    // third replica's older state does not decide it (found by review).
    kept.extend(
        kept_by_them
            .into_iter()
            .filter(|p| !waits(p))
            .map(ByteString),
    );
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    kept.dedup_by(|a, b| a.0 == b.0);
    kept.retain(|p| m.tree.subtree(&p.0) != theirs.subtree(&p.0));
    bases.insert(
        replica.to_string(),
        Base {
            commit: tip.to_string(),
            id,
            pending,
            kept,
        },
    );
    for (r, p) in settled.kept {
        if let Some(b) = bases.get_mut(&r)
            && !b.kept.iter().any(|k| k.0 == p)
        {
            b.kept.push(ByteString(p));
            b.kept.sort_by(|a, b| a.0.cmp(&b.0));
        }
    }
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
