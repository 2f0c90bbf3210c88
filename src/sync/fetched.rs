//! Another replica's versions as this store keeps them (`kept`), for
//! `skillfs log --replica`: one line per version of its history, oldest
//! first, whether or not any of it was merged here, and the versions a
//! signed remote quarantined (kept aside, never merged). Read from the
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

use std::path::Path;

use super::kept::{kept_ref, resolve};
use super::remotes::sync_dir;
use super::{git, replica};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::Layout;

/// One version of another replica.
#[derive(Debug, serde::Serialize)]
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
}

/// The replica ids this store keeps a history of (fetched and kept, or
/// only quarantined).
fn kept_ids(repo: &Path) -> Vec<String> {
    let out = git(Some(repo))
        .args([
            "for-each-ref",
            "--format=%(refname)",
            "refs/skillfs/kept/",
            "refs/skillfs/quarantine/",
        ])
        .output();
    let mut ids: Vec<String> = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
        .filter_map(|r| r.rsplit('/').next())
        .filter(|id| replica::valid(id))
        .map(str::to_string)
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The versions of the replica that `prefix` names (its id, or the start
/// of one), at or below `path` if given, oldest first.
pub fn fetched(
    layout: &Layout,
    prefix: &str,
    path: Option<&RelPath>,
) -> Result<Vec<Fetched>, Failure> {
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
    let Some(dir) = sync_dir(layout, false)? else {
        return Err(none(&[]));
    };
    let repo = dir.join("repo.git");
    let known = kept_ids(&repo);
    let matching: Vec<&String> = known
        .iter()
        .filter(|id| !prefix.is_empty() && id.starts_with(&prefix.to_ascii_lowercase()))
        .collect();
    let replica = match matching.as_slice() {
        [] => return Err(none(&known)),
        [one] => one.to_string(),
        many => {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "'{prefix}' names {} replicas ({}): give more of the id",
                    many.len(),
                    many.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    };
    let kept = resolve(&repo, &kept_ref(&replica));
    let quarantine = resolve(&repo, &format!("refs/skillfs/quarantine/{replica}"));
    let mut out = Vec::new();
    if let Some(k) = &kept {
        out.extend(versions(&repo, &replica, k, None, path)?);
    }
    if let Some(q) = &quarantine {
        for mut v in versions(&repo, &replica, q, kept.as_deref(), path)? {
            v.quarantined = true;
            out.push(v);
        }
    }
    Ok(out)
}

/// The versions on the first-parent line of `tip` that `since` (when
/// given) does not reach, oldest first.
fn versions(
    repo: &Path,
    replica: &str,
    tip: &str,
    since: Option<&str>,
    path: Option<&RelPath>,
) -> Result<Vec<Fetched>, Failure> {
    // Fields apart by US, commits by RS: neither can be in a subject or
    // an author's name (git keeps them, but skillfs writes neither).
    let format = "%H%x1f%an%x1f%(trailers:key=skillfs-id,valueonly,separator=%x2c)%x1f\
                  %(trailers:key=skillfs-time,valueonly,separator=%x2c)%x1f%s%x1e";
    let mut c = git(Some(repo));
    c.args(["log", "--first-parent", "--reverse"])
        .arg(format!("--format={format}"));
    match since {
        // What `tip` holds that `s` does not (all of it for another
        // history, nothing for an older tip).
        Some(s) => c.arg(format!("{s}..{tip}")),
        None => c.arg(tip),
    };
    c.arg("--");
    if let Some(p) = path.filter(|p| !p.is_root()) {
        use std::os::unix::ffi::OsStrExt;
        // A pathspec taken as it is, with no glob or magic of git's.
        c.arg(std::ffi::OsStr::from_bytes(
            &[b":(literal)", p.as_bytes()].concat(),
        ));
    }
    let out = c
        .output()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git log: {e}")))?;
    if !out.status.success() {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "git could not read replica {replica}'s history in '{}': {}",
                repo.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split('\u{1e}')
        .filter_map(|c| {
            let f: Vec<&str> = c.trim_start_matches('\n').split('\u{1f}').collect();
            let [commit, author, id, time, subject] = f.as_slice() else {
                return None;
            };
            Some(Fetched {
                replica: replica.to_string(),
                id: id.trim().parse().ok()?,
                time: time.trim().parse().unwrap_or(0),
                commit: commit.to_string(),
                author: author.to_string(),
                subject: subject.to_string(),
                quarantined: false,
            })
        })
        .collect())
}
