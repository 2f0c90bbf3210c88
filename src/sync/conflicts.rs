//! The conflicts of the merges (`pull`), kept in `sync/conflicts.jsonl`
//! one line each (the replica and commit, the path, why, and which side's
//! change is not live), and settled by hand: `sync --take` writes the
//! other side through the mount, `sync --keep` keeps this one; either way
//! the record leaves the file, which is rewritten whole. A merge never
//! drops one (with three replicas, two can stay apart at a path where a
//! third took one side: docs/limits.md), so the list is what says so.
//!
//! Invariants: an append starts on a line of its own (a torn last line is
//! ended first); a rewrite is put in place durably.
//!
//! Locks: the caller's `sync/lock` for an append; `resolve` takes it.

use std::path::Path;

use skillfs_sync::merge::{Conflict, Side};
use skillfs_sync::tree::within;

use super::apply::{TheirSide, take_side};
use super::gittree::GitBlobs;
use super::pull::{MERGED, load_bases, reason};
use super::remotes::sync_dir;
use super::{kept, lock};
use crate::error::{Exit, Failure};
use crate::store::Layout;
use crate::store::durable::StoreIo;

const CONFLICTS: &str = "conflicts.jsonl";

/// Appends `conflicts` of `replica`'s `commit` to `sync/conflicts.jsonl`.
pub(super) fn record(
    dir: &crate::store::Dir,
    replica: &str,
    commit: &str,
    conflicts: &[Conflict],
) -> Result<(), Failure> {
    if conflicts.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    for c in conflicts {
        let line = serde_json::json!({
            "replica": replica,
            "commit": commit,
            "path": String::from_utf8_lossy(&c.path),
            "path_hex": crate::relpath::hex(&c.path),
            "why": reason(&c.reason),
            "live": match c.lost { Side::Theirs => "ours", Side::Ours => "theirs" },
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    super::origins::append_lines(dir, CONFLICTS, text)
        .map_err(|e| Failure::io(Exit::BadStore, "write", &dir.join(CONFLICTS), &e))
}

/// A conflict as `sync/conflicts.jsonl` holds it.
struct Recorded {
    replica: String,
    commit: String,
    path: Vec<u8>,
    why: String,
    /// "ours": this tree's side stayed live; "theirs": the other's.
    live: String,
}

/// The conflicts recorded in `dir`, each once (a sync killed after it
/// recorded them and before its base moved records them again).
fn read_conflicts(dir: &crate::store::Dir) -> Result<Vec<Recorded>, Failure> {
    let text = match std::fs::read_to_string(dir.join(CONFLICTS)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Failure::io(
                Exit::BadStore,
                "read",
                &dir.join(CONFLICTS),
                &e,
            ));
        }
    };
    let mut seen = std::collections::HashSet::new();
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let r = recorded(&v);
            seen.insert((r.replica.clone(), r.commit.clone(), r.path.clone()))
                .then_some(r)
        })
        .collect())
}

/// One line of `sync/conflicts.jsonl`, read.
fn recorded(v: &serde_json::Value) -> Recorded {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    let path = crate::relpath::unhex(&s("path_hex")).unwrap_or_else(|| s("path").into_bytes());
    Recorded {
        replica: s("replica"),
        commit: s("commit"),
        path,
        why: s("why"),
        live: s("live"),
    }
}

/// The conflicts recorded so far, one line each for a user.
pub fn conflicts(layout: &Layout) -> Result<Vec<String>, Failure> {
    let Some(dir) = sync_dir(layout, false)? else {
        return Ok(Vec::new());
    };
    let repo = dir.join("repo.git");
    Ok(read_conflicts(&dir)?
        .into_iter()
        .map(|c| {
            let path = String::from_utf8_lossy(&c.path);
            format!(
                "{path}: {} (replica {}, commit {}); the {} side is live; the other: git --git-dir '{}' show {}:{path}",
                c.why,
                c.replica,
                &c.commit[..12.min(c.commit.len())],
                if c.live == "ours" { "local" } else { "other" },
                repo.display(),
                c.commit,
            )
        })
        .collect())
}

/// What to do with a conflict (`skillfs sync --take` / `--keep`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Resolve {
    /// The other replica's side, as of its newest commit merged here,
    /// written through the mount.
    Take,
    /// This tree's side, as it is.
    Keep,
}

/// Resolves the conflicts recorded at `path` (with `replica`, where more
/// than one replica has one there): with [`Resolve::Take`] the other
/// side's entries at `path` and below are written into the mounted `root`
/// as one unit of a merge is (`apply_as`: staged, swapped in, a version
/// whose actor names `replica`, left alone while a writer has it open); then the
/// conflict is listed no more. Returns what it did, for the user.
///
/// Keeping this tree's side changes nothing in the tree and nothing the
/// other replica is told: it keeps its own side until it takes this one.
pub fn resolve(
    layout: &Layout,
    root: &Path,
    path: &[u8],
    replica: Option<&str>,
    how: Resolve,
) -> Result<String, Failure> {
    let shown = String::from_utf8_lossy(path).into_owned();
    let none = || {
        Failure::new(
            Exit::Usage,
            format!("no conflict at '{shown}' (skillfs sync --conflicts lists them)"),
        )
    };
    let Some(dir) = sync_dir(layout, false)? else {
        return Err(none());
    };
    let _lock = lock(&dir, layout)?;
    let here: Vec<Recorded> = read_conflicts(&dir)?
        .into_iter()
        .filter(|c| c.path == path && replica.is_none_or(|r| c.replica == r))
        .collect();
    let mut replicas: Vec<&str> = here.iter().map(|c| c.replica.as_str()).collect();
    replicas.sort_unstable();
    replicas.dedup();
    let replica = match replicas.as_slice() {
        [] => return Err(none()),
        [one] => one.to_string(),
        many => {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "conflicts with {} replicas at '{shown}': name one with --replica ({})",
                    many.len(),
                    many.join(", ")
                ),
            ));
        }
    };
    let mut bases = load_bases(&dir)?;
    if how == Resolve::Take {
        // The other side as of the newest commit of it merged here: the
        // base, unless the conflict was recorded at a newer one (a merge
        // that stopped between recording it and moving the base).
        let repo = dir.join("repo.git");
        let recorded = here.last().map(|c| c.commit.clone());
        let commit = match (bases.get(&replica).map(|b| b.commit.clone()), recorded) {
            (Some(b), Some(r)) if b != r && kept::is_ancestor(&repo, &b, &r).unwrap_or(false) => r,
            (Some(b), _) => b,
            (None, Some(r)) => r,
            (None, None) => return Err(none()),
        };
        let mut blobs = GitBlobs::open(dir.path(), &repo);
        let mut skipped = Vec::new();
        let theirs = blobs.tree(&commit, &mut skipped).map_err(|why| {
            Failure::new(
                Exit::BadStore,
                format!("cannot read replica {replica}'s commit {commit}: {why}"),
            )
        })?;
        let side = TheirSide {
            replica: &replica,
            repo: &repo,
            commit: &commit,
            tree: &theirs,
            blobs: &blobs,
        };
        take_side(root, layout, &dir, &side, path, "nothing was taken")?;
        // The two sides are the same now: nothing kept to publish.
        if let Some(b) = bases.get_mut(&replica) {
            b.kept.retain(|k| !within(&k.0, path));
            let text = serde_json::to_vec_pretty(&bases).expect("plain values");
            dir.replace(MERGED, &text, &StoreIo::real())
                .map_err(|e| Failure::io(Exit::BadStore, "write", &dir.join(MERGED), &e))?;
        }
    }
    drop_conflicts(&dir, |r| r.replica == replica && r.path == path)?;
    Ok(match how {
        Resolve::Take => format!(
            "took replica {replica}'s side of '{shown}' (a version: skillfs undo takes it back)"
        ),
        Resolve::Keep => format!(
            "kept this tree's side of '{shown}'; replica {replica} keeps its own until it takes this one"
        ),
    })
}

/// Removes the conflicts `gone` picks from `sync/conflicts.jsonl` (a
/// whole new file, put in place durably; none there, nothing to do).
fn drop_conflicts(
    dir: &crate::store::Dir,
    gone: impl Fn(&Recorded) -> bool,
) -> Result<(), Failure> {
    let file = dir.join(CONFLICTS);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Failure::io(Exit::BadStore, "read", &file, &e)),
    };
    let mut out = String::new();
    for line in text.lines() {
        if !serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| gone(&recorded(&v))) {
            out.push_str(line);
            out.push('\n');
        }
    }
    if out.len() == text.len() {
        return Ok(());
    }
    dir.replace(CONFLICTS, out.as_bytes(), &StoreIo::real())
        .map_err(|e| Failure::io(Exit::BadStore, "write", &file, &e))
}
