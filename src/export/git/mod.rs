//! `skillfs export --git DIR`: history as a git repository, one commit per
//! change (or per span of changes with `--squash`), made by piping a
//! `git fast-import` stream into git run on DIR: git is the engine people
//! already push and share with, and fast-import writes its objects itself.
//!
//! Invariants:
//! - the commits are on one branch, [`BRANCH`]; nothing else in the
//!   repository is touched, and a run updates it only when git has taken
//!   the whole stream (`feature done`: a stream cut short changes no ref);
//! - each commit's tree is the tree at its id, as git can hold it: files
//!   with their bytes and executable bit, symlinks with their targets (no
//!   empty directories, other mode bits, owners or times, and no entry
//!   named `.git`, which git will not check out);
//! - each commit ends with the trailers `skillfs-id: N` and
//!   `skillfs-time: NS` (the time of change N, in nanoseconds): the next run
//!   continues after N, and only if this store made change N at that very
//!   time; a branch that says otherwise holds another history and is
//!   refused;
//! - commits are deterministic: the author is the change's process (its
//!   name, and its uid as the address), the committer `skillfs`, both dated
//!   at the change, so two exports of one history are the same commits;
//! - each commit lists only what changed since the one before it
//!   (`HistoryIndex::changed_between`); a run's first commit whose parent's
//!   change is no longer in history (forgotten) lists its whole tree.
//!
//! One question a file: `repo`, the repository (made, read, undone);
//! `stream`, what each commit holds, written as fast-import reads it.
//!
//! Locks: none; git locks its refs itself.

mod repo;
#[doc(hidden)]
pub use repo::tip_of_commit;
mod stream;

pub use repo::git;

use std::collections::HashMap;
use std::io::{BufWriter, Read};
use std::path::Path;
use std::process::Stdio;

use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::store::journal::Record;
use repo::Repo;
use stream::{Stop, Stream};

/// The branch the history goes to.
pub const BRANCH: &str = "refs/heads/skillfs";
const ID_TRAILER: &str = "skillfs-id: ";
const TIME_TRAILER: &str = "skillfs-time: ";

/// What a run did.
pub struct Exported {
    /// Commits made, and the ids of the first and last change they hold.
    pub commits: usize,
    pub ids: Option<(u64, u64)>,
    /// Paths left out because git cannot hold them (`.git`).
    pub left_out: usize,
    /// Whether this run made the repository.
    pub created: bool,
}

/// Exports `store`'s history into the repository at `dir` (made if
/// missing): the changes after the branch's newest, one commit each, or
/// one per span of `squash_ns`.
pub fn export(
    store: &Store,
    records: &[Record],
    dir: &Path,
    squash_ns: Option<i64>,
) -> Result<Exported, Failure> {
    export_branch(store, records, dir, BRANCH, false, squash_ns, ("", &[]))
}

/// [`export`] onto `branch` (`refs/heads/...`); a `private` repository is
/// made without hooks and readable by its owner only (one in the store).
/// `extra`: trailer lines for every commit of the run, and the commits the
/// run's last commit merges (a sync's: see `sync::pull`).
pub fn export_branch(
    store: &Store,
    records: &[Record],
    dir: &Path,
    branch: &str,
    private: bool,
    squash_ns: Option<i64>,
    extra: (&str, &[String]),
) -> Result<Exported, Failure> {
    let repo = Repo::open(dir, branch, private)?;
    let result = export_into(&repo, store, records, dir, squash_ns, extra);
    if result.is_err() {
        repo.unmake();
    }
    result.map(|mut e| {
        e.created = repo.made.is_some();
        e
    })
}

fn export_into(
    repo: &Repo,
    store: &Store,
    records: &[Record],
    dir: &Path,
    squash_ns: Option<i64>,
    extra: (&str, &[String]),
) -> Result<Exported, Failure> {
    let index = &store.index;
    let last = index.last();
    let tip = repo.tip(dir)?;
    if let Some((id, t)) = tip {
        // Past the last change, or made at another time: not this history.
        // (A change forgotten since, whose time the index no longer knows,
        // cannot say; its number still places it.)
        let here = index.time_of(id);
        if id > last || here.is_some_and(|h| h != t) {
            let why = match here {
                Some(h) if id <= last => format!(
                    "this store made change {id} at {}",
                    crate::time::format_utc(h)
                ),
                _ => format!("this store's history ends at change {last}"),
            };
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "'{}' holds another history: its branch {} ends at change {id} made at \
                     {}, but {why}; export into another repository",
                    dir.display(),
                    repo.short(),
                    crate::time::format_utc(t)
                ),
            ));
        }
    }
    let start = tip.map_or(0, |(id, _)| id);
    let groups = groups(store, start, squash_ns);
    let mut done = Exported {
        commits: 0,
        ids: None,
        left_out: 0,
        created: false,
    };
    if groups.is_empty() {
        return Ok(done);
    }
    let mut child = git(Some(&repo.git_dir))
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Failure::new(
                Exit::Internal,
                format!("could not run git fast-import (needed for --git): {e}"),
            )
        })?;
    // Read meanwhile: git writing more than a pipe holds must not stall
    // the stream it reads from us.
    let mut stderr = child.stderr.take();
    let errors = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_end(&mut s);
        }
        s
    });
    let by_id: HashMap<u64, &Record> = records.iter().map(|r| (r.seq, r)).collect();
    let written = match child.stdin.take() {
        Some(stdin) => {
            let mut s = Stream::new(BufWriter::new(stdin), store, &repo.branch, extra);
            // A base that is still in history lets the first commit list
            // only what changed; else it lists its whole tree. Closed
            // without `done` after a failure: git changes no ref.
            let base = (start > 0 && super::exists(store, start)).then_some(start);
            let r = s.all(&groups, base, start > 0, &by_id);
            done.left_out = s.left_out();
            r
        }
        None => Err(Stop::Pipe(std::io::Error::other("no pipe to git"))),
    };
    let status = child.wait();
    let said = String::from_utf8_lossy(&errors.join().unwrap_or_default())
        .trim()
        .replace('\n', "; ");
    let why = match (written, status) {
        (Ok(()), Ok(s)) if s.success() => None,
        (Err(Stop::Store(f)), _) => return Err(f),
        // git's own words say more than the broken pipe it left us.
        (_, _) if !said.is_empty() => Some(said),
        (Err(Stop::Pipe(e)), _) => Some(e.to_string()),
        (Ok(()), Ok(s)) => Some(format!("git fast-import ended with {s}")),
        (Ok(()), Err(e)) => Some(e.to_string()),
    };
    if let Some(why) = why {
        return Err(Failure::new(
            Exit::Internal,
            format!(
                "could not export history into '{}': {why} (its branch {} is unchanged)",
                dir.display(),
                repo.short()
            ),
        ));
    }
    done.commits = groups.len();
    done.ids = Some((
        groups[0][0],
        *groups[groups.len() - 1].last().unwrap_or(&last),
    ));
    Ok(done)
}

/// The ids after `start` that are in history, one group per commit: each
/// alone, or with `squash_ns` those within that span of their group's
/// first change.
fn groups(store: &Store, start: u64, squash_ns: Option<i64>) -> Vec<Vec<u64>> {
    let mut out: Vec<Vec<u64>> = Vec::new();
    let time = |id| store.index.time_of(id).unwrap_or_default();
    for id in start + 1..=store.index.last() {
        if !super::exists(store, id) {
            continue;
        }
        match (out.last_mut(), squash_ns) {
            (Some(g), Some(span)) if time(id).saturating_sub(time(g[0])) <= span => g.push(id),
            _ => out.push(vec![id]),
        }
    }
    out
}
