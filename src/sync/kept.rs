//! What this store fetched of the other replicas, kept for good: a ref per
//! replica that only ever moves forward, `refs/skillfs/kept/<replica>`,
//! and beside it every tip it could not move forward to or from,
//! `refs/skillfs/rewound/<replica>/<n>`. A remote whose branch of a
//! replica was rewound, force-pushed or deleted by someone else then
//! loses nothing this store once fetched: git's gc keeps what a ref
//! reaches. (The fetch itself mirrors each remote under
//! `refs/remotes/<remote>/`, forced, so that it never fails on a rewind.)
//!
//! Invariants: a kept ref moves only to a descendant of where it was; a
//! tip that is neither behind nor ahead of it is kept under `rewound/`
//! before the kept ref moves; nothing here deletes a ref. Every ref is
//! moved with its expected old value (`update-ref NEW OLD`).
//!
//! Locks: `sync/lock`, held by the caller.

use std::path::Path;

use super::git;

/// What keeping a fetched tip did.
#[derive(Debug, PartialEq, Eq)]
pub enum Kept {
    /// The replica's first tip this store keeps.
    New,
    /// Already kept, or behind what is kept (a remote that lags, or one
    /// rewound to an older commit): nothing moved, nothing lost.
    Held,
    /// The kept ref moved forward to it.
    Forward,
    /// Neither behind nor ahead of what was kept (the branch was
    /// rewritten): the old tip is kept under this ref, and the kept ref
    /// moved to the new one.
    Diverged(String),
}

/// The ref that keeps `replica`'s history.
pub fn kept_ref(replica: &str) -> String {
    format!("refs/skillfs/kept/{replica}")
}

/// The commit `r` names in `repo`, if it names one.
pub(super) fn resolve(repo: &Path, r: &str) -> Option<String> {
    let out = git(Some(repo))
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{r}^{{commit}}"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
}

/// Whether commit `a` is `b` or an ancestor of it.
pub(super) fn is_ancestor(repo: &Path, a: &str, b: &str) -> Result<bool, String> {
    let out = git(Some(repo))
        .args(["merge-base", "--is-ancestor", a, b])
        .output()
        .map_err(|e| format!("could not run git merge-base: {e}"))?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => Err(format!(
            "git merge-base --is-ancestor {a} {b}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Moves `r` from `old` (`None`: it must not exist) to `new`.
fn update(repo: &Path, r: &str, new: &str, old: Option<&str>) -> Result<(), String> {
    // The all-zero id says "must not exist yet" to update-ref.
    let zero = "0".repeat(new.len());
    let out = git(Some(repo))
        .args(["update-ref", "-m", "skillfs sync: keep", r, new])
        .arg(old.unwrap_or(&zero))
        .output()
        .map_err(|e| format!("could not run git update-ref: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "git update-ref {r}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether the tip `fetched` of `replica` is neither behind nor ahead of
/// what this store keeps of it (another history: `keep` would put the kept
/// one aside and take it).
pub fn diverges(repo: &Path, replica: &str, fetched: &str) -> bool {
    let (Some(new), Some(old)) = (resolve(repo, fetched), resolve(repo, &kept_ref(replica))) else {
        return false;
    };
    !(is_ancestor(repo, &new, &old).unwrap_or(false)
        || is_ancestor(repo, &old, &new).unwrap_or(false))
}

/// Keeps the tip `fetched` (a ref the fetch just wrote) of `replica`.
pub fn keep(repo: &Path, replica: &str, fetched: &str) -> Result<Kept, String> {
    let Some(new) = resolve(repo, fetched) else {
        return Err(format!("{fetched} names no commit"));
    };
    let kept = kept_ref(replica);
    let Some(old) = resolve(repo, &kept) else {
        update(repo, &kept, &new, None)?;
        return Ok(Kept::New);
    };
    if is_ancestor(repo, &new, &old)? {
        return Ok(Kept::Held);
    }
    if is_ancestor(repo, &old, &new)? {
        update(repo, &kept, &new, Some(&old))?;
        return Ok(Kept::Forward);
    }
    // Rewritten: the old tip first gets a ref of its own, the first free
    // number (none is ever deleted, so the count is the next one).
    let prefix = format!("refs/skillfs/rewound/{replica}/");
    let listed = git(Some(repo))
        .args(["for-each-ref", "--format=%(refname)", &prefix])
        .output()
        .map_err(|e| format!("could not run git for-each-ref: {e}"))?;
    let n = String::from_utf8_lossy(&listed.stdout).lines().count() + 1;
    let aside = format!("{prefix}{n}");
    update(repo, &aside, &old, None)?;
    update(repo, &kept, &new, Some(&old))?;
    Ok(Kept::Diverged(aside))
}

/// The commits kept of `replica` (its kept ref's history, and every
/// rewound tip's), counted once each.
pub fn commits(repo: &Path, replica: &str) -> u64 {
    let out = git(Some(repo))
        .args(["rev-list", "--count", &kept_ref(replica)])
        .arg(format!("--glob=refs/skillfs/rewound/{replica}/*"))
        .output();
    out.ok()
        .and_then(|o| super::parse_count(&o.stdout))
        .unwrap_or(0)
}
