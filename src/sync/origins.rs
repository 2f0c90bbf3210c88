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
//! Invariants: a line is appended after the unit's records are durable
//! in the journal (the caller synced ROOT), under `sync/lock`; an append
//! starts on a line of its own (a torn last line is ended first), and
//! the first append after a `forget` writes the file anew without the ids
//! it forgot (so the file grows with what history keeps). A line
//! lost to a crash between the two loses the author only: the actor
//! still names the replica. A line is believed only for a record whose
//! actor is that replica's applier (`log`): ids a journal cut back by a
//! repair gives out again are never another's. An author is cut to
//! [`AUTHOR_MAX`] characters (a replica's words, repeated per unit).
//!
//! Locks: the caller's `sync/lock` for an append; none to read.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom, Write};

use skillfs_sync::tree::{parent, within};

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

/// The most characters of an author kept (an honest one is a process
/// name, at most 15 bytes).
pub const AUTHOR_MAX: usize = 64;

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
    // Each record to the innermost unit it lies in (a skill inside a
    // directory that was a unit too): its path's nearest ancestor (or
    // itself) among the units, one set lookup per level.
    let units: HashSet<&[u8]> = applied.done.iter().map(Vec::as_slice).collect();
    let innermost = |p: &[u8]| -> Option<&[u8]> {
        let mut at = Some(p);
        while let Some(a) = at {
            if let Some(u) = units.get(a) {
                return Some(u);
            }
            at = parent(a);
        }
        None
    };
    let mut by_unit: HashMap<&[u8], Vec<u64>> = HashMap::new();
    for r in mine {
        if let Some(u) = std::iter::once(&r.path)
            .chain(r.to.as_ref())
            .filter_map(|p| innermost(p.as_bytes()))
            .max_by_key(|u| u.len())
        {
            by_unit.entry(u).or_default().push(r.seq);
        }
    }
    let mut text = String::new();
    for unit in &applied.done {
        let Some(seqs) = by_unit.remove(unit.as_slice()) else {
            continue;
        };
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
    if let Err(e) = write(dir, records, text) {
        tracing::warn!("sync: could not note where a merge's changes came from: {e}");
        eprintln!(
            "skillfs: could not write '{}': {e} (log shows these changes without their authors)",
            dir.join(ORIGINS).display()
        );
    }
}

/// Appends `text` to `sync/origins.jsonl`; first, when `records` (the
/// whole journal) holds a `forget` of ids the file still names (those
/// `log` hides), writes it anew without them (and without a line left
/// with none, or one a power cut tore). A file that cannot be written
/// anew (a disk too full for a copy) is appended to as before: a line
/// written twice says the same twice.
///
/// Its cost after any forget: the file is read and parsed at each note,
/// no more than the journal the caller has just read (one line per unit
/// written, against at least one record each).
fn write(dir: &Dir, records: &[Record], text: String) -> std::io::Result<()> {
    let gone = crate::retention::forgotten(records);
    if gone.forgotten_count() > 0 {
        let old = std::fs::read_to_string(dir.join(ORIGINS)).unwrap_or_default();
        if let Some(kept) = without(&old, |seq| gone.is_forgotten(seq)) {
            let io = crate::store::durable::StoreIo::real();
            match dir.replace(ORIGINS, (kept + &text).as_bytes(), &io) {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!("sync: could not write origins.jsonl anew: {e}"),
            }
        }
    }
    append_lines(dir, ORIGINS, text)
}

/// The lines of `text` without the ids `forgotten` says, nor a line left
/// with none or that does not parse; `None` when that is all of them,
/// unchanged.
fn without(text: &str, forgotten: impl Fn(u64) -> bool) -> Option<String> {
    let mut out = String::new();
    let mut changed = false;
    for line in text.lines() {
        let Ok(mut v) = serde_json::from_str::<serde_json::Value>(line) else {
            changed = true;
            continue;
        };
        let Some(seqs) = v["seqs"].as_array() else {
            changed = true;
            continue;
        };
        let left: Vec<serde_json::Value> = seqs
            .iter()
            .filter(|s| !s.as_u64().is_some_and(&forgotten))
            .cloned()
            .collect();
        if left.len() == seqs.len() {
            out.push_str(line);
        } else {
            changed = true;
            if left.is_empty() {
                continue;
            }
            v["seqs"] = serde_json::Value::Array(left);
            out.push_str(&v.to_string());
        }
        out.push('\n');
    }
    changed.then_some(out)
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
    /// Only the commits that changed something below this (one unit's).
    only: Option<&'a [u8]>,
    /// Since `since`; then all of them, for a unit none of those changed.
    read: [Option<Vec<Commit>>; 2],
}

impl<'a> Authors<'a> {
    pub(super) fn new(repo: &'a std::path::Path, tip: &'a str, since: Option<&'a str>) -> Self {
        Authors {
            repo,
            tip,
            since,
            only: None,
            read: [None, None],
        }
    }

    /// The author of one unit, `unit`: only its commits are read.
    pub(super) fn of_one(repo: &std::path::Path, tip: &str, unit: &[u8]) -> String {
        let mut a = Authors::new(repo, tip, None);
        a.only = Some(unit);
        a.of(unit)
    }

    /// The author of the newest of those commits that changed something
    /// at or below `unit` since `since` (else at all; else none).
    pub(super) fn of(&mut self, unit: &[u8]) -> String {
        let (repo, tip, only) = (self.repo, self.tip, self.only);
        let ranges: &[usize] = if self.since.is_some() { &[0, 1] } else { &[1] };
        for &i in ranges {
            let since = if i == 0 { self.since } else { None };
            let commits = self.read[i].get_or_insert_with(|| commits(repo, tip, since, only));
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
/// with its author and the paths it changed (below `only`, if given).
fn commits(
    repo: &std::path::Path,
    tip: &str,
    since: Option<&str>,
    only: Option<&[u8]>,
) -> Vec<Commit> {
    use std::os::unix::ffi::OsStrExt;
    let mut c = super::git(Some(repo));
    // Nothing of the user's config may change what is listed; `-m` lists
    // a merge commit's own changes (against its first parent) on every
    // git, and `--raw` puts a `:` field before each path, so that no
    // path can pass for an author or another path.
    c.args(["-c", "log.showSignature=false", "-c", "log.showRoot=true"])
        .args(["-c", "i18n.logOutputEncoding=UTF-8"])
        .args(["log", "--first-parent", "-m", "--no-renames", "-z"])
        .args(["--raw", "--no-abbrev", "--format=%x01%an", tip]);
    if let Some(s) = since {
        c.arg(format!("^{s}"));
    }
    if let Some(p) = only {
        c.arg("--")
            .arg(std::ffi::OsStr::from_bytes(&[b":(literal)", p].concat()));
    }
    // A history that cannot be read names no author (the actor still
    // names the replica).
    super::fields::git_fields(c, "read a replica's authors", |f| Ok(parse_log(f)))
        .unwrap_or_default()
}

/// The longest field of that log kept: a path (at most `PATH_MAX`), a
/// raw line or an author (cut to [`AUTHOR_MAX`] characters); longer ones
/// are cut, and a cut path names nothing.
const FIELD_MAX: usize = 8 << 10;

/// `git log -z --raw --format=%x01%an` output as commits:
/// "\x01AUTHOR\0\n:RAW\0PATH\0:RAW\0PATH\0\x01AUTHOR\0…". A path is
/// only what follows a `:` field, so no name can pass for an author. Read
/// as it comes (`fields`): a replica's author costs [`FIELD_MAX`] at most.
fn parse_log<R: std::io::BufRead>(fields: &mut super::fields::Fields<R>) -> Vec<Commit> {
    let mut commits: Vec<Commit> = Vec::new();
    let mut path_next = false;
    while let Ok(Some(field)) = fields.next(FIELD_MAX) {
        let bytes = &field.bytes;
        if path_next {
            if let Some((_, paths)) = commits.last_mut()
                && field.whole
            {
                paths.push(bytes.clone());
            }
            path_next = false;
        } else if bytes.starts_with(b":") || bytes.starts_with(b"\n:") {
            path_next = true;
        } else if let Some(author) = bytes.strip_prefix(b"\x01") {
            let author: String = String::from_utf8_lossy(author)
                .chars()
                .take(AUTHOR_MAX)
                .collect();
            commits.push((author, Vec::new()));
        }
    }
    commits
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forget's ids leave the lines that name them, and a line left
    /// with none goes; a line no forget touches stays as it was written.
    #[test]
    fn forgotten_ids_leave_the_origins() {
        let text = [
            r#"{"seqs":[3,4],"replica":"r","commit":"c1","author":"a"}"#,
            r#"{"seqs":[7,9,12],"replica":"r","commit":"c2","author":"b"}"#,
            r#"{"seqs":[20],"replica":"q","commit":"c3","author":"c"}"#,
            r#"{"seqs":[21"#,
            "",
        ]
        .join("\n");
        let gone = |ranges: &[[u64; 2]]| {
            let mut h = crate::history::HistoryIndex::new();
            h.forget(ranges);
            move |seq| h.is_forgotten(seq)
        };
        // Overlapping ranges of two forgets: 2-8 and 4-5.
        let got = without(&text, gone(&[[2, 8], [4, 5], [12, 12]])).unwrap();
        let lines: Vec<serde_json::Value> = got
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{got}");
        assert_eq!(lines[0]["seqs"], serde_json::json!([9]));
        assert_eq!(lines[0]["author"], "b");
        assert!(got.lines().nth(1) == text.lines().nth(2), "{got}");
        // Nothing of it forgotten: left as it is.
        let whole = text.lines().take(3).collect::<Vec<_>>().join("\n") + "\n";
        assert_eq!(without(&whole, gone(&[[30, 40], [1, 2]])), None);
        assert_eq!(
            without(&whole, gone(&[[20, 20]])).unwrap().lines().count(),
            2
        );
    }

    fn parse(out: &[u8]) -> Vec<Commit> {
        parse_log(&mut crate::sync::fields::Fields::new(out))
    }

    /// Names made to look like authors or other paths stay paths of the
    /// commit that changed them (found by review).
    #[test]
    fn no_path_passes_for_an_author() {
        let raw = ":000000 100644 0000 e25f A";
        let out = [
            "\x01Mallory".to_string(),
            format!("\n{raw}"),
            "\x01Alice".into(),
            raw.into(),
            "\x01a".into(),
            raw.into(),
            "\nskill".into(),
            "\x01Bob".into(),
            format!("\n{raw}"),
            "s2/f".into(),
            String::new(),
        ]
        .join("\0");
        let got = parse(out.as_bytes());
        let paths = |v: &[&str]| v.iter().map(|p| p.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(
            got,
            vec![
                (
                    "Mallory".to_string(),
                    paths(&["\x01Alice", "\x01a", "\nskill"])
                ),
                ("Bob".to_string(), paths(&["s2/f"])),
            ]
        );
        let long = format!("\x01{}\0", "x".repeat(1000));
        assert_eq!(parse(long.as_bytes())[0].0.len(), AUTHOR_MAX);
        // A path cut at the field's cap is no path.
        let long = format!("\x01A\0:raw\0{}\0:raw\0ok\0", "p".repeat(FIELD_MAX + 1));
        assert_eq!(parse(long.as_bytes()), vec![("A".into(), paths(&["ok"]))]);
    }
}
