//! The agent's skill ledger: `<skills>/.curator_ledger.jsonl`, one JSON
//! object a line, appended by the agent after every skill mutation:
//! `id`, `ts` (Python's `isoformat()`, UTC), `actor` (`curator`, `agent`,
//! `user`), `action`, `skill`, and `before`/`after`, lists of `{path,
//! sha256}` naming every file of what it touched before and after, each
//! content stored as `$HERMES_HOME/.curator_backups/blobs/<sha256>` (the
//! skills root's parent). Paths are absolute (`str()` of a path under
//! `$HERMES_HOME/skills`); a list names only what the entry touched (one
//! skill's files), so an entry changes only the paths it names: a path in
//! `after` has that content, a path only in `before` is gone.
//!
//! Invariants: a line that is not a JSON object with those fields is one
//! [`Damage`]; a blob is believed only after its bytes hash to its name;
//! text from the ledger that reaches records or terminals goes through
//! `plain`. The ledger is read, never written (in skillfs it is an
//! untracked file the agent appends to while mounted).
//!
//! [`annotations`] matches entries to the versions skillfs recorded
//! through the mount (see its doc): the ledger is read at `log` time, so
//! entries the agent appends later annotate later versions with no help
//! from the daemon.
//!
//! Locks: none.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Damage, plain};
use crate::relpath::{RelPath, hex};
use crate::store::journal::{Op, Record};

/// The ledger's name in the skills root.
pub const LEDGER: &str = ".curator_ledger.jsonl";
/// Where its blobs are, from the skills root's parent (`$HERMES_HOME`).
pub const BLOBS: &str = ".curator_backups/blobs";
/// The largest blob read (a skill's file; the agent keeps no larger).
const BLOB_MAX: u64 = 1 << 30;

/// One `{path, sha256}` of a `before` or `after` list.
#[derive(Deserialize, Clone, Debug)]
pub struct Item {
    pub path: String,
    pub sha256: String,
}

#[derive(Deserialize)]
struct Line {
    id: String,
    ts: String,
    #[serde(default)]
    actor: String,
    action: String,
    #[serde(default)]
    skill: String,
    #[serde(default)]
    before: Vec<Item>,
    #[serde(default)]
    after: Vec<Item>,
}

/// One entry of the ledger.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its line number (from 1).
    pub line: usize,
    pub id: String,
    pub ts: i64,
    pub actor: String,
    pub action: String,
    pub skill: String,
    pub before: Vec<Item>,
    pub after: Vec<Item>,
}

impl Entry {
    pub fn part(&self) -> String {
        format!("ledger entry {} (line {})", self.id, self.line)
    }

    /// How `log` names it: `ledger 3f2a9c01b2c4: curator patch arxiv`.
    pub fn describe(&self) -> String {
        describe(&self.id, Some(&self.actor), &self.action, Some(&self.skill))
    }
}

/// `ledger <id>: <actor> <action> <skill>` (the one wording, for imported
/// records and live matches alike).
pub fn describe(id: &str, actor: Option<&str>, action: &str, skill: Option<&str>) -> String {
    let words: Vec<&str> = [actor, Some(action), skill]
        .into_iter()
        .flatten()
        .filter(|w| !w.is_empty())
        .collect();
    format!("ledger {id}: {}", words.join(" "))
}

/// The entries of the ledger at `path`, in file order, and one damage for
/// each line that is not an entry. No ledger is no entry.
pub fn read(path: &Path) -> (Vec<Entry>, Vec<Damage>) {
    let (mut entries, mut damage) = (Vec::new(), Vec::new());
    let Ok(f) = crate::sys::openat(
        crate::sys::CWD,
        path.as_os_str().as_encoded_bytes(),
        libc::O_RDONLY | libc::O_NOFOLLOW,
        0,
    ) else {
        return (entries, damage);
    };
    let mut text = Vec::new();
    if let Err(e) = f.take(BLOB_MAX).read_to_end(&mut text) {
        damage.push(Damage {
            part: "ledger".into(),
            why: format!("could not read {}: {e}", path.display()),
        });
        return (entries, damage);
    }
    let complete = text.ends_with(b"\n");
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    for (i, raw) in lines.iter().enumerate() {
        let n = i + 1;
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if i + 1 == lines.len() && !complete {
            // Being appended right now (the agent writes a line at once):
            // not an entry yet, and no damage either.
            continue;
        }
        let bad = |why: String| Damage {
            part: format!("ledger line {n}"),
            why,
        };
        let parsed: Line = match serde_json::from_slice(raw) {
            Ok(l) => l,
            Err(e) => {
                damage.push(bad(format!("not a ledger entry ({e})")));
                continue;
            }
        };
        let Some(ts) = crate::time::parse_rfc3339(&parsed.ts) else {
            damage.push(bad(format!(
                "'ts' is not a time: '{}'",
                plain(&parsed.ts, 60)
            )));
            continue;
        };
        entries.push(Entry {
            line: n,
            id: plain(&parsed.id, 64),
            ts,
            actor: plain(&parsed.actor, 32),
            action: plain(&parsed.action, 64),
            skill: plain(&parsed.skill, 200),
            before: parsed.before,
            after: parsed.after,
        });
    }
    (entries, damage)
}

/// What the ledger of the skills root `root` is, and where its blobs are.
pub fn places(root: &Path) -> (PathBuf, PathBuf) {
    let home = root.parent().unwrap_or(Path::new("/"));
    (root.join(LEDGER), home.join(BLOBS))
}

/// An item's path relative to the skills root, whose absolute names are
/// `roots` (as given and canonical: the agent writes what `HERMES_HOME`
/// says). A relative path (an agent run with a relative `HERMES_HOME`)
/// counts from a directory no one recorded: it names nothing.
pub fn relative(item: &str, roots: &[PathBuf]) -> Option<RelPath> {
    let rest = roots
        .iter()
        .filter(|r| r.is_absolute())
        .find_map(|r| Path::new(item).strip_prefix(r).ok())?;
    RelPath::parse(rest.as_os_str().as_encoded_bytes()).filter(|r| !r.is_root())
}

/// Blob `sha256` of `blobs`, opened for reading (its name checked, no
/// symlink followed), at most `BLOB_MAX` bytes of it.
pub fn open_blob(blobs: &Path, sha256: &str) -> Result<std::io::Take<File>, String> {
    let named = sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !named {
        return Err(format!("'{}' is not a sha256", plain(sha256, 80)));
    }
    let path = blobs.join(sha256);
    crate::sys::openat(
        crate::sys::CWD,
        path.as_os_str().as_encoded_bytes(),
        libc::O_RDONLY | libc::O_NOFOLLOW,
        0,
    )
    .map(|f: File| f.take(BLOB_MAX))
    .map_err(|e| format!("blob {sha256} is missing or unreadable ({e})"))
}

/// The size of blob `sha256` of `blobs`, once its bytes, read as a
/// stream (never held whole), hash to its name.
pub fn check_blob(blobs: &Path, sha256: &str) -> Result<u64, String> {
    let mut f = open_blob(blobs, sha256)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                size += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("blob {sha256} is missing or unreadable ({e})")),
        }
    }
    let got = hex(hasher.finalize().as_slice());
    if got != sha256 {
        return Err(format!("blob {sha256} holds other bytes (sha256 {got})"));
    }
    Ok(size)
}

/// How long before its entry a version may have been made and still be
/// the one the entry describes (the agent hashes and appends right after
/// it writes), and how long after (two clocks of one machine).
const BEFORE_NS: i64 = 60_000_000_000;
const AFTER_NS: i64 = 2_000_000_000;

/// The entries of the live ledger that describe versions skillfs recorded
/// through the mount, by the id of the newest record each one matched.
///
/// An entry matches the record that gave one of its `after` paths that
/// content (same path, same sha256 as the record's blob; or a rename onto
/// that path) or removed one of its `before`-only paths (or a directory
/// above it), made at most a minute before the entry and two seconds
/// after. Entries already imported (an `origin` names them) and entries
/// whose `after` names no recorded path are left out.
pub fn annotations(
    records: &[Record],
    entries: &[Entry],
    roots: &[PathBuf],
) -> HashMap<u64, Vec<String>> {
    let imported: HashSet<&str> = records
        .iter()
        .filter_map(|r| r.origin.as_ref().map(|o| o.id.as_str()))
        .collect();
    let mut out: HashMap<u64, Vec<String>> = HashMap::new();
    for e in entries.iter().filter(|e| !imported.contains(e.id.as_str())) {
        let (lo, hi) = (
            e.ts.saturating_sub(BEFORE_NS),
            e.ts.saturating_add(AFTER_NS),
        );
        let first = records.partition_point(|r| r.ts < lo);
        let window = &records[first..records.partition_point(|r| r.ts <= hi).max(first)];
        let after: Vec<(RelPath, &str)> = e
            .after
            .iter()
            .filter_map(|i| Some((relative(&i.path, roots)?, i.sha256.as_str())))
            .collect();
        let gone: Vec<RelPath> = e
            .before
            .iter()
            .filter_map(|i| relative(&i.path, roots))
            .filter(|p| !after.iter().any(|(a, _)| a == p))
            .collect();
        let hit = window.iter().rev().find(|r| {
            if r.origin.is_some() {
                return false;
            }
            let wrote = after.iter().any(|(p, sha)| {
                (r.path == *p && r.state.as_ref().and_then(|s| s.blob.as_deref()) == Some(*sha))
                    || (matches!(r.op, Op::Rename) && r.to.as_ref() == Some(p))
            });
            let removed = matches!(r.op, Op::Unlink | Op::Rmdir | Op::Park | Op::Rename)
                && gone.iter().any(|p| p.starts_with(&r.path));
            wrote || removed
        });
        if let Some(r) = hit {
            out.entry(r.seq).or_default().push(e.describe());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_count_from_the_root_as_the_agent_named_it() {
        let roots = [PathBuf::from("/h/.hermes/skills")];
        let rel = |s: &str| relative(s, &roots).map(|p| p.to_string());
        assert_eq!(
            rel("/h/.hermes/skills/cat/foo/SKILL.md").as_deref(),
            Some("cat/foo/SKILL.md")
        );
        assert_eq!(rel("/elsewhere/skills/x"), None);
        assert_eq!(rel("/h/.hermes/skills"), None);
        assert_eq!(rel("/h/.hermes/skills/../x"), None);
        assert_eq!(rel("cat/x"), None);
        assert_eq!(rel("h/.hermes/skills/cat/x"), None);
    }

    #[test]
    fn a_line_that_is_not_an_entry_is_one_damage_and_a_cut_last_line_none() {
        let d = std::env::temp_dir().join(format!("skillfs-ledger-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let ok = r#"{"id":"a1","ts":"2026-05-01T13:05:42.5+00:00","actor":"agent","action":"patch","skill":"foo","before":[],"after":[]}"#;
        let text = format!(
            "{ok}\nnot json\n\n{{\"id\":\"b\",\"ts\":\"yesterday\",\"action\":\"x\"}}\n{{\"id\":"
        );
        std::fs::write(d.join(LEDGER), text).unwrap();
        let (entries, damage) = read(&d.join(LEDGER));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].describe(), "ledger a1: agent patch foo");
        let parts: Vec<&str> = damage.iter().map(|d| d.part.as_str()).collect();
        assert_eq!(parts, ["ledger line 2", "ledger line 4"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
