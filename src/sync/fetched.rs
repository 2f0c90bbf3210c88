//! Another replica's versions as this store keeps them (`kept`), for
//! `skillfs log --replica`: one line per version of its history, oldest
//! first, whether or not any of it was merged here, and the versions a
//! signed remote quarantined (kept aside, never merged), and those of
//! histories its branch no longer has (rewound or rewritten by someone
//! after this store fetched them). Read from the
//! store's `sync/repo.git`, mounted or not; each line names the commit
//! whose files `git --git-dir STORE/sync/repo.git show COMMIT:PATH`
//! prints.
//!
//! A replica's own versions are the first-parent line of its branch (the
//! other replicas' commits it merged are parents beside it, and are
//! theirs); a commit without a `skillfs-id` trailer (a seal of `--sign`)
//! is no version and is left out.
//!
//! Locks: none; git reads its repository without them (a sync running
//! meanwhile can only add to it).

use std::path::{Path, PathBuf};

use super::git::git_output;
use super::kept::{kept_ref, resolve};
use super::remotes::sync_dir;
use super::{git, replica};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::Layout;

/// One version of another replica.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Fetched {
    pub replica: String,
    /// Its change id on that replica (`skillfs-id`).
    pub id: u64,
    /// When it was made there (`skillfs-time`), ns since the epoch.
    pub time: i64,
    pub commit: String,
    /// The commit's author: the process that made the change there.
    pub author: String,
    /// What the change was (the commit's subject).
    pub subject: String,
    /// Kept aside by a signed remote's check, never merged here.
    pub quarantined: bool,
    /// On a history of the replica its branch no longer has (rewound or
    /// rewritten by someone, `refs/skillfs/rewound/`).
    pub rewound: bool,
}

/// The replica ids this store keeps a history of (fetched and kept, or
/// only quarantined).
fn kept_ids(repo: &Path) -> Result<Vec<String>, Failure> {
    let mut c = git(Some(repo));
    c.args([
        "for-each-ref",
        "--format=%(refname)",
        "refs/skillfs/kept/",
        "refs/skillfs/quarantine/",
    ]);
    let out = git_output(
        c,
        &format!("read the replicas kept in '{}'", repo.display()),
    )?;
    Ok(replica_ids(&out))
}

/// The replica ids named by the refs `refs` lists (`for-each-ref` lines
/// that start with the ref's name) under `refs/skillfs/kept/` or
/// `refs/skillfs/quarantine/`, sorted, each once.
pub(super) fn replica_ids(refs: &[u8]) -> Vec<String> {
    let mut ids: Vec<String> = String::from_utf8_lossy(refs)
        .lines()
        .filter_map(|l| l.split(' ').next())
        .filter_map(|r| {
            r.strip_prefix("refs/skillfs/kept/")
                .or_else(|| r.strip_prefix("refs/skillfs/quarantine/"))
        })
        .filter(|id| replica::valid(id))
        .map(str::to_string)
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The replica that `prefix` names (its id, or the start of one) among
/// those this store keeps, and the store's sync repository.
pub(super) fn pick(layout: &Layout, prefix: &str) -> Result<(PathBuf, String), Failure> {
    let none = |known: &[String]| {
        Failure::new(
            Exit::NotFound,
            format!(
                "this store keeps no replica '{prefix}' ({}): `skillfs sync` fetches them",
                if known.is_empty() {
                    "it keeps none yet".to_string()
                } else {
                    format!("it keeps {}", known.join(", "))
                }
            ),
        )
    };
    if prefix.is_empty() {
        return Err(Failure::new(
            Exit::Usage,
            "a replica is named by its id, or the start of one",
        ));
    }
    let Some(dir) = sync_dir(layout, false)? else {
        return Err(none(&[]));
    };
    let repo = dir.join("repo.git");
    if !repo.exists() {
        return Err(none(&[]));
    }
    let known = kept_ids(&repo)?;
    let matching: Vec<&String> = known
        .iter()
        .filter(|id| id.starts_with(&prefix.to_ascii_lowercase()))
        .collect();
    match matching.as_slice() {
        [] => Err(none(&known)),
        [one] => Ok((repo, one.to_string())),
        many => Err(Failure::new(
            Exit::Usage,
            format!(
                "'{prefix}' names {} replicas ({}): give more of the id",
                many.len(),
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// The versions of the replica that `prefix` names (its id, or the start
/// of one), at or below `path` if given, oldest first (by the time each
/// says; quarantined ones among them, marked).
pub fn fetched(
    layout: &Layout,
    prefix: &str,
    path: Option<&RelPath>,
) -> Result<Vec<Fetched>, Failure> {
    let (repo, replica) = pick(layout, prefix)?;
    let kept = resolve(&repo, &kept_ref(&replica));
    let quarantine = resolve(&repo, &format!("refs/skillfs/quarantine/{replica}"));
    let mut out = Vec::new();
    // Each history once: what an earlier ref listed is left out of the
    // next (a rewound tip shares the versions before the rewrite).
    let mut seen: Vec<String> = Vec::new();
    if let Some(k) = &kept {
        out.extend(versions(&repo, &replica, k, &seen, path)?);
        seen.push(k.clone());
    }
    for r in rewound(&repo, &replica)? {
        for mut v in versions(&repo, &replica, &r, &seen, path)? {
            v.rewound = true;
            out.push(v);
        }
        seen.push(r);
    }
    if let Some(q) = &quarantine {
        for mut v in versions(&repo, &replica, q, &seen, path)? {
            v.quarantined = true;
            out.push(v);
        }
    }
    // In the order they were made there (as the replica said), so that
    // `-n` keeps the newest whichever ref holds them.
    out.sort_by_key(|v| (v.time, v.id));
    Ok(out)
}

/// The tips of `replica`'s histories its branch no longer has
/// (`kept::keep`), in the order they were put aside.
fn rewound(repo: &Path, replica: &str) -> Result<Vec<String>, Failure> {
    let prefix = format!("refs/skillfs/rewound/{replica}/");
    let mut c = git(Some(repo));
    c.args(["for-each-ref", "--format=%(refname) %(objectname)", &prefix]);
    let out = git_output(
        c,
        &format!(
            "read replica {replica}'s rewound histories in '{}'",
            repo.display()
        ),
    )?;
    let mut tips: Vec<(u64, String)> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| {
            let (name, id) = l.split_once(' ')?;
            let n = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((n, id.to_string()))
        })
        .collect();
    tips.sort();
    Ok(tips.into_iter().map(|(_, id)| id).collect())
}

/// The versions on the first-parent line of `tip` that none of `seen`
/// reaches, oldest first.
fn versions(
    repo: &Path,
    replica: &str,
    tip: &str,
    seen: &[String],
    path: Option<&RelPath>,
) -> Result<Vec<Fetched>, Failure> {
    // Five fields a commit, each ended by a NUL (`-z` ends the last): no
    // field can hold one, so a hostile replica's subject or author cannot
    // shift the fields of this commit or make another.
    let format = "%H%x00%an%x00%(trailers:key=skillfs-id,valueonly,separator=%x2c)%x00\
                  %(trailers:key=skillfs-time,valueonly,separator=%x2c)%x00%s";
    let mut c = git(Some(repo));
    // Nothing of the user's config may add to the output (a signature
    // printed before a signed commit would shift the fields) or change
    // what is listed.
    c.args(["-c", "log.showSignature=false", "-c", "log.follow=false"])
        .args(["-c", "i18n.logOutputEncoding=UTF-8"])
        .args(["log", "-z", "--first-parent", "--reverse"])
        .arg(format!("--format={format}"));
    // What `tip` holds that none of `seen` does (all of it for another
    // history, nothing for an older tip).
    c.arg(tip).args(seen.iter().map(|s| format!("^{s}")));
    c.arg("--");
    if let Some(p) = path.filter(|p| !p.is_root()) {
        use std::os::unix::ffi::OsStrExt;
        // A pathspec taken as it is, with no glob or magic of git's.
        c.arg(std::ffi::OsStr::from_bytes(
            &[b":(literal)", p.as_bytes()].concat(),
        ));
    }
    let out = git_output(
        c,
        &format!("read replica {replica}'s history in '{}'", repo.display()),
    )?;
    let text = String::from_utf8_lossy(&out);
    let fields: Vec<&str> = text.split('\0').collect();
    Ok(fields
        .chunks_exact(5)
        .filter_map(|f| {
            let [commit, author, id, time, subject] = f else {
                return None;
            };
            let hex = |c: &str| {
                matches!(c.len(), 40 | 64)
                    && c.bytes()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            };
            if !hex(commit) {
                return None;
            }
            // (A trailer given twice: the first.)
            let first = |v: &str| v.split(',').next().unwrap_or("").trim().to_string();
            Some(Fetched {
                replica: replica.to_string(),
                id: first(id).parse().ok()?,
                time: first(time).parse().unwrap_or(0),
                commit: commit.to_string(),
                author: author.to_string(),
                subject: subject.to_string(),
                quarantined: false,
                rewound: false,
            })
        })
        .collect())
}
