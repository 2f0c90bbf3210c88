//! What each commit holds, written as `git fast-import` reads it: the
//! blobs it needs (each content sent once per run), then the commit with
//! its author, message, trailers and the changes of its tree.
//!
//! Invariants: a commit's changes are its removals first, then what it
//! puts (a file and a directory may trade places in one commit); paths git
//! cannot check out (a `.git` component) are left out and counted.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use super::{ID_TRAILER, TIME_TRAILER};
use crate::commands::Store;
use crate::error::Failure;
use crate::history::PathIdx;
use crate::relpath::RelPath;
use crate::store::journal::{EntryState, Kind, Record};

/// Lines of a squashed commit's message that list its changes.
const LISTED: usize = 100;

/// What git holds of an entry: its kind, content or target, and
/// executable bit; nothing for a directory (git has none of its own).
#[derive(PartialEq)]
struct GitView<'a> {
    kind: Kind,
    blob: Option<&'a str>,
    target: Option<&'a [u8]>,
    exec: bool,
}

fn git_view(s: Option<&EntryState>) -> Option<GitView<'_>> {
    let s = s?;
    (s.kind != Kind::Dir).then(|| GitView {
        kind: s.kind,
        blob: s.blob.as_deref(),
        target: s.target.as_ref().map(|t| t.0.as_slice()),
        exec: s.mode & 0o100 != 0,
    })
}

/// A path git would refuse to check out: one with a `.git` component.
fn unholdable(p: &RelPath) -> bool {
    p.components().any(|c| c.eq_ignore_ascii_case(b".git"))
}

/// A path as fast-import reads it: as is, or C-quoted when it starts with
/// `"` or holds a newline.
fn quoted(p: &[u8]) -> Vec<u8> {
    if !p.contains(&b'\n') && p.first() != Some(&b'"') {
        return p.to_vec();
    }
    let mut out = vec![b'"'];
    for &c in p {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            c if c < 0x20 || c == 0x7f => out.extend_from_slice(format!("\\{c:03o}").as_bytes()),
            c => out.push(c),
        }
    }
    out.push(b'"');
    out
}

/// One line of a commit message naming a record's change.
fn describe(r: &Record) -> String {
    match &r.to {
        Some(to) => format!("{} {} -> {}", r.op.name(), r.path, to),
        None => format!("{} {}", r.op.name(), r.path),
    }
}

/// An author's name: the process name, without what an ident cannot hold.
fn ident_name(comm: &str) -> String {
    let n: String = comm
        .chars()
        .map(|c| {
            if c == '<' || c == '>' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if n.trim().is_empty() {
        "unknown".to_string()
    } else {
        n.trim().to_string()
    }
}

/// The fast-import stream being written.
pub struct Stream<'a, W: Write> {
    out: W,
    store: &'a Store,
    /// The mark of each blob already sent in this run.
    marks: HashMap<String, usize>,
    left_out: HashSet<PathIdx>,
    /// The branch the commits go on (`refs/heads/...`).
    branch: &'a str,
    /// Trailer lines every commit of this run ends with (a sync's
    /// `skillfs-merged:` lines), each ending in a newline.
    trailers: &'a str,
    /// Commits the last commit of this run merges (a sync's merges of
    /// other replicas): its parents after the first.
    merges: &'a [String],
}

/// Why the stream stopped: the store could not give a content (its own
/// failure), or git stopped reading.
pub enum Stop {
    Store(Failure),
    Pipe(std::io::Error),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Stop {
        Stop::Pipe(e)
    }
}

/// One change of a commit's tree.
enum Change {
    Delete(RelPath),
    Put(RelPath, EntryState),
}

impl<'a, W: Write> Stream<'a, W> {
    pub fn new(
        out: W,
        store: &'a Store,
        branch: &'a str,
        (trailers, merges): (&'a str, &'a [String]),
    ) -> Stream<'a, W> {
        Stream {
            out,
            store,
            marks: HashMap::new(),
            left_out: HashSet::new(),
            branch,
            trailers,
            merges,
        }
    }

    /// How many paths were left out (git cannot hold them).
    pub fn left_out(&self) -> usize {
        self.left_out.len()
    }

    /// The stream of every group's commit, `done` last; `base` is the
    /// change the branch holds now if git may build on its tree.
    pub fn all(
        &mut self,
        groups: &[Vec<u64>],
        mut base: Option<u64>,
        branch_exists: bool,
        records: &HashMap<u64, &Record>,
    ) -> Result<(), Stop> {
        self.out.write_all(b"feature done\n")?;
        for (n, g) in groups.iter().enumerate() {
            let b = *g.last().unwrap_or(&0);
            let changes = self.changes(base, b)?;
            self.commit(
                g,
                records,
                (n == 0 && branch_exists, n + 1 == groups.len()),
                base.is_none(),
                &changes,
            )?;
            base = Some(b);
        }
        self.out.write_all(b"done\n")?;
        self.out.flush().map_err(Stop::Pipe)
    }

    /// What changed from the tree at `base` to the tree at `b`: removals
    /// first (a directory and a file may trade places), then the files and
    /// symlinks put. With no base, every file and symlink at `b`.
    fn changes(&mut self, base: Option<u64>, b: u64) -> Result<Vec<Change>, Stop> {
        let index = &self.store.index;
        let Some(a) = base else {
            let all = crate::export::entries(self.store, b, &RelPath::root(), false)
                .map_err(Stop::Store)?;
            let mut out = Vec::new();
            for (p, s) in all {
                if unholdable(&p) {
                    if let Some(i) = index.idx(&p) {
                        self.left_out.insert(i);
                    }
                } else if s.kind != Kind::Dir {
                    out.push(Change::Put(p, s));
                }
            }
            return Ok(out);
        };
        let (mut dels, mut puts) = (Vec::new(), Vec::new());
        for i in index.changed_between(a, b) {
            let p = index.path(i);
            if unholdable(p) {
                self.left_out.insert(i);
                continue;
            }
            let (old, new) = (index.state_at(i, a), index.state_at(i, b));
            match new {
                None if old.is_some() => dels.push(Change::Delete(p.clone())),
                // A file or symlink become a directory: git drops the old
                // entry, then takes what the directory holds.
                Some(n) if n.kind == Kind::Dir && old.is_some_and(|o| o.kind != Kind::Dir) => {
                    dels.push(Change::Delete(p.clone()))
                }
                Some(n) if n.kind == Kind::Dir => {}
                Some(n) if git_view(old) != git_view(Some(n)) => {
                    puts.push(Change::Put(p.clone(), n.clone()))
                }
                _ => {}
            }
        }
        dels.extend(puts);
        Ok(dels)
    }

    /// The commit of group `g`, its blobs sent first.
    fn commit(
        &mut self,
        g: &[u64],
        records: &HashMap<u64, &Record>,
        (continue_branch, last_of_run): (bool, bool),
        whole_tree: bool,
        changes: &[Change],
    ) -> Result<(), Stop> {
        let mut marks = Vec::with_capacity(changes.len());
        for c in changes {
            marks.push(match c {
                Change::Put(_, s) if s.kind == Kind::File => Some(self.blob(s)?),
                _ => None,
            });
        }
        let (first, last) = (g[0], *g.last().unwrap_or(&g[0]));
        let time = self.store.index.time_of(last).unwrap_or_default();
        let secs = time.div_euclid(1_000_000_000).max(0);
        let actor = records.get(&last).map(|r| &r.actor);
        let (name, email) = match actor {
            Some(a) => (ident_name(&a.comm), format!("uid-{}", a.uid)),
            None => ("unknown".to_string(), "unknown".to_string()),
        };
        let by = |r: &Record| {
            // The process name as an ident holds it: no control character
            // can start a line of its own (a trailer) in the message.
            let comm = ident_name(&r.actor.comm);
            format!("by {comm}[{}] uid={}", r.actor.pid, r.actor.uid)
        };
        let mut msg = if g.len() == 1 {
            let (subject, by) = match records.get(&last) {
                Some(r) => (describe(r), by(r)),
                None => (
                    format!("change {last}"),
                    "(record not in the journal)".into(),
                ),
            };
            let when = crate::time::format_utc(time);
            format!("{subject}\n\nchange {last} {by} at {when}\n")
        } else {
            let subject = records.get(&first).map_or(String::new(), |r| describe(r));
            let mut m = format!(
                "changes {first}-{last}: {subject} (+{} more)\n\n",
                g.len() - 1
            );
            for &id in g.iter().take(LISTED) {
                let line = match records.get(&id) {
                    Some(r) => format!("{id} {} {}\n", describe(r), by(r)),
                    None => format!("{id} (record not in the journal)\n"),
                };
                m.push_str(&line);
            }
            if g.len() > LISTED {
                m.push_str(&format!("and {} more\n", g.len() - LISTED));
            }
            m
        };
        msg.push_str(&format!("\n{ID_TRAILER}{last}\n{TIME_TRAILER}{time}\n"));
        msg.push_str(self.trailers);
        let (o, branch) = (&mut self.out, self.branch);
        write!(
            o,
            "commit {branch}\nauthor {name} <{email}> {secs} +0000\n\
             committer skillfs <skillfs> {secs} +0000\ndata {}\n{msg}",
            msg.len()
        )?;
        if continue_branch {
            // The branch as the repository has it (fast-import reads a
            // branch's own name as the one it is making).
            writeln!(o, "from {branch}^0")?;
        }
        if last_of_run {
            for m in self.merges {
                writeln!(o, "merge {m}")?;
            }
        }
        if whole_tree {
            o.write_all(b"deleteall\n")?;
        }
        for (c, mark) in changes.iter().zip(marks) {
            match (c, mark) {
                (Change::Delete(p), _) => {
                    o.write_all(b"D ")?;
                    o.write_all(&quoted(p.as_bytes()))?;
                    o.write_all(b"\n")?;
                }
                (Change::Put(p, s), Some(mark)) => {
                    let mode = if s.mode & 0o100 != 0 {
                        "100755"
                    } else {
                        "100644"
                    };
                    write!(o, "M {mode} :{mark} ")?;
                    o.write_all(&quoted(p.as_bytes()))?;
                    o.write_all(b"\n")?;
                }
                (Change::Put(p, s), None) => {
                    let target = s.target.as_ref().map_or(&[][..], |t| t.0.as_slice());
                    o.write_all(b"M 120000 inline ")?;
                    o.write_all(&quoted(p.as_bytes()))?;
                    write!(o, "\ndata {}\n", target.len())?;
                    o.write_all(target)?;
                    o.write_all(b"\n")?;
                }
            }
        }
        o.write_all(b"\n").map_err(Stop::Pipe)
    }

    /// The mark of a file's content, sent once per run.
    fn blob(&mut self, s: &EntryState) -> Result<usize, Stop> {
        let key = s.blob.clone().unwrap_or_default();
        if let Some(&m) = self.marks.get(&key) {
            return Ok(m);
        }
        let data = self.store.content(s).map_err(Stop::Store)?;
        let mark = self.marks.len() + 1;
        write!(self.out, "blob\nmark :{mark}\ndata {}\n", data.len())?;
        self.out.write_all(&data)?;
        self.out.write_all(b"\n")?;
        self.marks.insert(key, mark);
        Ok(mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_only_when_fast_import_needs_it() {
        assert_eq!(quoted(b"cat/foo bar/SKILL.md"), b"cat/foo bar/SKILL.md");
        assert_eq!(quoted(b"a\nb"), b"\"a\\nb\"");
        assert_eq!(quoted(b"\"x\\y"), b"\"\\\"x\\\\y\"");
        assert_eq!(quoted(b"a\nb\x01"), b"\"a\\nb\\001\"");
    }

    #[test]
    fn author_names_hold_nothing_an_ident_cannot() {
        assert_eq!(ident_name("python3"), "python3");
        assert_eq!(ident_name("a<b>\n"), "a_b__");
        assert_eq!(ident_name(" "), "unknown");
    }

    #[test]
    fn dot_git_anywhere_is_left_out() {
        let p = |s: &str| RelPath::parse(s.as_bytes()).unwrap();
        assert!(unholdable(&p("cat/foo/.git/config")));
        assert!(unholdable(&p(".GIT")));
        assert!(!unholdable(&p("cat/.github/x")));
    }
}
