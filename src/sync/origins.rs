//! Where the changes a merge, a `sync --take` or a `restore REPLICA:ID`
//! wrote came from: the replica, its commit and that commit's author (the
//! process that made the change on the other machine), kept in
//! `sync/origins.jsonl`, one line per unit written, naming the ids of
//! the records it made here. `log` shows them beside those records.
//!
//! The daemon names a change's actor by the thread that made it, so the
//! journal says `sync:<replica>` (`apply::actor_of`); a thread's name has
//! no room for the author, and the journal's format stays as it is.
//!
//! Invariants: a line is appended after the unit's records are in the
//! journal, under `sync/lock`; an append starts on a line of its own (a
//! torn last line is ended first). A line lost to a crash between the
//! two loses the author only: the actor still names the replica.
//!
//! Locks: the caller's `sync/lock` for an append; none to read.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};

use skillfs_sync::tree::within;

use super::apply::{Applied, own_thread};
use crate::store::Dir;
use crate::store::journal::Record;

const ORIGINS: &str = "origins.jsonl";

/// Appends `text` (whole lines) to `dir`'s `name`, durably, on a line of
/// its own.
pub(super) fn append_lines(dir: &Dir, name: &str, mut text: String) -> std::io::Result<()> {
    let path = dir.join(name);
    // A line a power cut left torn is ended first: the next record is a
    // line of its own, not glued to it.
    if let Ok(mut old) = std::fs::File::open(&path) {
        let mut last = [0u8; 1];
        if old.seek(SeekFrom::End(-1)).is_ok()
            && old.read_exact(&mut last).is_ok()
            && last[0] != b'\n'
        {
            text.insert(0, '\n');
        }
    }
    let mut f = dir.open_append(name)?;
    f.write_all(text.as_bytes()).and_then(|_| f.sync_all())
}

/// Where one unit's changes came from.
pub(super) struct From<'a> {
    pub commit: &'a str,
    pub author: String,
}

/// Records, for each unit `applied` wrote, the records of `records` (the
/// journal read after the apply) that this process's appliers made there
/// after change `since`, and where they came from (`origin_of` the unit).
pub(super) fn note<'a>(
    dir: &Dir,
    replica: &str,
    (records, since): (&[Record], u64),
    applied: &Applied,
    mut origin_of: impl FnMut(&[u8]) -> From<'a>,
) {
    let mine: Vec<&Record> = records
        .iter()
        .filter(|r| r.seq > since && own_thread(&r.actor))
        .collect();
    let mut text = String::new();
    for unit in &applied.done {
        let seqs: Vec<u64> = mine
            .iter()
            .filter(|r| {
                std::iter::once(&r.path)
                    .chain(r.to.as_ref())
                    .any(|p| within(p.as_bytes(), unit))
            })
            .map(|r| r.seq)
            .collect();
        if seqs.is_empty() {
            continue;
        }
        let from = origin_of(unit);
        let line = serde_json::json!({
            "seqs": seqs,
            "replica": replica,
            "commit": from.commit,
            "author": from.author,
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    if text.is_empty() {
        return;
    }
    // The changes are made and recorded: a failure here loses only the
    // author beside them, said in the daemon's way.
    if let Err(e) = append_lines(dir, ORIGINS, text) {
        tracing::warn!("sync: could not note where a merge's changes came from: {e}");
        eprintln!(
            "skillfs: could not write '{}': {e} (log shows these changes without their authors)",
            dir.join(ORIGINS).display()
        );
    }
}

/// Where a record came from, as `sync/origins.jsonl` says.
#[derive(Clone, Debug)]
pub struct Origin {
    pub replica: String,
    pub commit: String,
    pub author: String,
}

/// The origins of the records of `layout`'s store that a merge, a take
/// or a restore wrote, by record id (none when it never synced).
pub fn origins(layout: &crate::store::Layout) -> HashMap<u64, Origin> {
    let mut out = HashMap::new();
    let Ok(Some(dir)) = super::remotes::sync_dir(layout, false) else {
        return out;
    };
    let Ok(text) = std::fs::read_to_string(dir.join(ORIGINS)) else {
        return out;
    };
    for v in text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
        let o = Origin {
            replica: s("replica"),
            commit: s("commit"),
            author: s("author"),
        };
        for seq in v["seqs"].as_array().into_iter().flatten() {
            if let Some(seq) = seq.as_u64() {
                out.insert(seq, o.clone());
            }
        }
    }
    out
}

/// A commit's author and the paths it changed.
type Commit = (String, Vec<Vec<u8>>);

/// The authors of a replica's commits, newest first, with the paths
/// each changed: its own versions (the first-parent line of `tip`),
/// read with one `git log` when first asked.
pub(super) struct Authors<'a> {
    repo: &'a std::path::Path,
    tip: &'a str,
    since: Option<&'a str>,
    /// Since `since`; then all of them, for a unit none of those changed.
    read: [Option<Vec<Commit>>; 2],
}

impl<'a> Authors<'a> {
    pub(super) fn new(repo: &'a std::path::Path, tip: &'a str, since: Option<&'a str>) -> Self {
        Authors {
            repo,
            tip,
            since,
            read: [None, None],
        }
    }

    /// The author of the newest of those commits that changed something
    /// at or below `unit` since `since` (else at all; else none).
    pub(super) fn of(&mut self, unit: &[u8]) -> String {
        let (repo, tip) = (self.repo, self.tip);
        let ranges: &[usize] = if self.since.is_some() { &[0, 1] } else { &[1] };
        for &i in ranges {
            let since = if i == 0 { self.since } else { None };
            let commits = self.read[i].get_or_insert_with(|| commits(repo, tip, since));
            if let Some((a, _)) = commits
                .iter()
                .find(|(_, paths)| paths.iter().any(|p| within(p, unit)))
            {
                return a.clone();
            }
        }
        String::new()
    }
}

/// `tip`'s first-parent commits, newest first (none of `since`'s), each
/// with its author and the paths it changed.
fn commits(repo: &std::path::Path, tip: &str, since: Option<&str>) -> Vec<Commit> {
    let mut c = super::git(Some(repo));
    c.args(["-c", "log.showSignature=false", "log", "--first-parent"])
        .args(["--no-renames", "-z", "--name-only", "--format=%x01%an", tip]);
    if let Some(s) = since {
        c.arg(format!("^{s}"));
    }
    let Ok(out) = c.output() else {
        return Vec::new();
    };
    if !out.status.success() {
        return Vec::new();
    }
    // "\x01AUTHOR\0\nPATH\0PATH\0\x01AUTHOR\0…"
    let mut commits: Vec<Commit> = Vec::new();
    for field in out.stdout.split(|&b| b == 0) {
        if let Some(author) = field.strip_prefix(b"\x01") {
            commits.push((String::from_utf8_lossy(author).into_owned(), Vec::new()));
        } else if let Some((_, paths)) = commits.last_mut()
            && !field.is_empty()
        {
            paths.push(field.strip_prefix(b"\n").unwrap_or(field).to_vec());
        }
    }
    commits
}
