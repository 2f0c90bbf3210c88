//! The agent's own history made the start of a store's history: at the
//! first mount of a root (its journal holds no record yet), or by `skillfs
//! import` before it, every curator snapshot and skill-ledger entry the
//! agent kept (`crate::agent`) becomes journal records, oldest first, each
//! at its own time, before the mount's scan records the live tree.
//!
//! Each part is applied to the tree the parts before it left (`apply`): a
//! snapshot is the whole tree then, a ledger entry changes the files it
//! names. Its records are `import` (a new state) and `import-remove`, with
//! the part's time, an actor (`curator` for a snapshot, the ledger's actor
//! for an entry; pid 0, the owner of the files as uid) and `origin`, which
//! names the snapshot or entry. `.history/<id>` of its last record is the
//! tree as the agent had it then. Parts are merged by time; a snapshot
//! and an entry at the same instant, the snapshot first (the curator
//! snapshots before it changes anything). A part dated after the import's
//! own time is recorded at that time, and its line says so: a journal
//! holds no time from the future (see `HistoryIndex::add`).
//!
//! Why an imported record carries its annotation (`origin`) while a version
//! made through the mount is matched to the live ledger at `log` time
//! (`agent::ledger::annotations`): an imported record *is* that entry or
//! snapshot, and what names it must outlive the agent's files (the curator
//! prunes snapshots to the newest five, and a snapshot rollback puts an
//! old `.curator_ledger.jsonl` back); a version made through the mount is
//! recorded by the daemon before the agent appends its entry, so only a
//! reader that comes later can pair them, and reading the live ledger at
//! `log` time annotates every later version with no work on the write
//! path.
//!
//! Invariants:
//! - a part is imported whole or not at all: everything of it is read and
//!   checked (an archive whole, its gzip trailer included; every blob
//!   hashed against its name) before any of its records is appended; a
//!   damaged part is one [`Damage`] line and no record. A snapshot member
//!   that would lead out of the root (an absolute name, a `..`, a member
//!   below a symlink) is refused by name, one line each, and the snapshot
//!   is the tree of its other members, as GNU tar extracts the rest; a
//!   snapshot with no other member is damaged. Its contents are
//!   stored the normal way (`BlobStore`), durable before the records.
//! - the import is whole or absent, whatever kills it: its records go to a
//!   journal of their own in `tmp/import/`, made durable after the blobs
//!   they name (`Ledger::sync`), and become `journal/`'s first segment by
//!   one rename, `journal/` then synced. Before that rename, a kill or a
//!   power cut leaves only `tmp/` (emptied at the next mount, which imports
//!   again from the start); after it, the store holds the whole import,
//!   and the next mount's scan records the live tree against it.
//! - only into a journal with no record ([`may_import`]): imported times
//!   are older than any record made since, and ids and times must rise
//!   together (`.history/@time` resolves by the index's times).
//!
//! Locks: the store's flock, held by the caller (a mount being prepared,
//! or `skillfs import`), so nothing else appends meanwhile.

pub mod apply;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::agent::ledger::{self, Entry};
use crate::agent::snapshots::{self, Failed, Snapshot};
use crate::agent::{Damage, plain};
use crate::error::{Exit, Failure};
use crate::hide::HideRules;
use crate::ledger::Ledger;
use crate::relpath::RelPath;
use crate::store::StoreFds;
use crate::store::blobs::BlobStore;
use crate::store::journal::{self, Actor, Contents, EntryState, Journal, Origin, Source};
use apply::{Defaults, EntryPaths};

/// The scratch directory of an import under way, in the store's `tmp/`.
const SCRATCH: &str = "import";

/// Whether a journal may take the agent's history: it holds no record
/// (nor the torn start of one: a mount began recording there).
pub fn may_import(contents: &Contents) -> bool {
    contents.last_seq() == 0 && contents.torn_bytes == 0
}

/// What an import did (or, dry, would do).
#[derive(Default, Debug)]
pub struct Report {
    /// One line per part taken: what it was, and its ids.
    pub taken: Vec<String>,
    /// One line per part left out.
    pub damage: Vec<Damage>,
    /// One line per member refused in a part taken.
    pub refused: Vec<Damage>,
    /// Records appended.
    pub records: u64,
    /// One line per part dated after the import, recorded as of it.
    pub redated: Vec<String>,
}

impl Report {
    /// What the user hears of: one line per damaged part, then the
    /// summary (nothing when the agent kept no history).
    pub fn lines(&self) -> Vec<String> {
        if self.taken.is_empty() && self.damage.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<String> = self
            .damage
            .iter()
            .map(|d| format!("agent history: {d} (skipped)"))
            .collect();
        out.extend(
            self.refused
                .iter()
                .map(|d| format!("agent history: {d} (refused)")),
        );
        out.extend(self.redated.iter().map(|r| format!("agent history: {r}")));
        out.push(self.summary());
        out
    }

    /// One line for the user: what was imported, as which ids.
    pub fn summary(&self) -> String {
        let skipped = match self.damage.len() {
            0 => String::new(),
            n => format!("; {n} damaged part(s) skipped"),
        };
        let refused = match self.refused.len() {
            0 => String::new(),
            n => format!("; {n} member(s) refused"),
        };
        format!(
            "imported the agent's history: {} part(s) as {} record(s){}{skipped}",
            self.taken.len(),
            self.records,
            if self.records > 0 {
                format!(" (ids 1-{})", self.records)
            } else {
                String::new()
            },
        ) + &refused
    }
}

/// One part of the agent's history.
enum Part {
    Snapshot(Snapshot),
    Entry(Entry),
}

impl Part {
    /// Time, then snapshots before entries, then file order.
    fn key(&self) -> (i64, u8, usize) {
        match self {
            Part::Snapshot(s) => (s.ts, 0, 0),
            Part::Entry(e) => (e.ts, 1, e.line),
        }
    }
}

/// Everything the agent kept, in the order it happened.
struct Sources {
    parts: Vec<Part>,
    damage: Vec<Damage>,
    /// The skills root as given and canonical: the agent names files by
    /// `HERMES_HOME`, which may be either.
    roots: Vec<PathBuf>,
    blobs: PathBuf,
    owner: (u32, u32),
}

fn gather(root: &Path) -> Sources {
    let (snaps, mut damage) = snapshots::list(root);
    let (ledger_path, blobs) = ledger::places(root);
    let (entries, bad) = ledger::read(&ledger_path);
    damage.extend(bad);
    let mut parts: Vec<Part> = snaps.into_iter().map(Part::Snapshot).collect();
    parts.extend(entries.into_iter().map(Part::Entry));
    parts.sort_by_key(Part::key);
    let mut roots = vec![root.to_path_buf()];
    roots.extend(root.canonicalize().ok().filter(|c| c != root));
    let owner = std::fs::metadata(root).map_or((0, 0), |m| (m.uid(), m.gid()));
    Sources {
        parts,
        damage,
        roots,
        blobs,
        owner,
    }
}

/// A damaged part (`Ok(Err)`) or a store that failed (`Err`: the import
/// stops, nothing of it is kept).
type Checked<T> = io::Result<Result<T, String>>;

/// A part checked: what it says the tree became.
enum Plan {
    /// A snapshot's whole tree, and the members it refused.
    Tree(BTreeMap<RelPath, EntryState>, Vec<String>),
    /// A ledger entry's files.
    Entry(EntryPaths),
}

/// A snapshot read and checked whole, then (if `blobs`) read again to
/// store each file's content: its tree, files with their blobs, and one
/// line per member refused (damaged when no member is left).
fn snapshot(
    s: &Snapshot,
    rules: &HideRules,
    d: Defaults,
    blobs: Option<&BlobStore>,
) -> Checked<(BTreeMap<RelPath, EntryState>, Vec<String>)> {
    let file = match snapshots::open(s) {
        Ok(f) => f,
        Err(e) => return Ok(Err(format!("could not open {}: {e}", snapshots::ARCHIVE))),
    };
    let drain =
        &mut |_: &snapshots::Member, r: &mut dyn io::Read| io::copy(r, &mut io::sink()).map(drop);
    let read = match snapshots::read(&file, drain) {
        Ok(m) => m,
        Err(Failed::Damaged(why)) => return Ok(Err(why)),
        Err(Failed::Content(e)) => return Ok(Err(format!("could not read it: {e}"))),
    };
    let tree = apply::snapshot_tree(&read.members, rules, d);
    let mut refused = read.refused;
    let kept = read.members.len().saturating_sub(tree.refused.len());
    refused.extend(tree.refused);
    if kept == 0 && !refused.is_empty() {
        // Nothing but refused members: no tree of the agent's is left to
        // believe (an empty one would remove every skill).
        return Ok(Err(refused.join("; ")));
    }
    let mut states = tree.states;
    let Some(blobs) = blobs else {
        return Ok(Ok((states, refused)));
    };
    let wanted: BTreeSet<&RelPath> = tree.content.values().collect();
    let mut stored: BTreeMap<RelPath, (String, u64)> = BTreeMap::new();
    let store = &mut |m: &snapshots::Member, r: &mut dyn io::Read| {
        if !wanted.contains(&m.path) {
            return io::copy(r, &mut io::sink()).map(drop);
        }
        let (id, size) = blobs.put_reader(r)?;
        stored.insert(m.path.clone(), (id, size));
        Ok(())
    };
    match snapshots::read(&file, store) {
        Ok(_) => {} // refused the same way as on the first read
        Err(Failed::Damaged(why)) => return Ok(Err(format!("{why} (on a second read)"))),
        Err(Failed::Content(e)) => return Err(e),
    }
    for (path, from) in &tree.content {
        let (Some(st), Some((id, size))) = (states.get_mut(path), stored.get(from)) else {
            return Ok(Err(format!("member '{from}' changed between two reads")));
        };
        st.blob = Some(id.clone());
        st.size = *size;
    }
    Ok(Ok((states, refused)))
}

/// A ledger entry's paths made relative and every `after` blob checked,
/// then (if `blobs`) stored. Each distinct blob is read once to check it
/// and once to store it, as a stream: an entry that names one large blob
/// many times costs one read of it, and no more memory than a buffer.
fn entry(src: &Sources, e: &Entry, blobs: Option<&BlobStore>) -> Checked<EntryPaths> {
    let rel = |path: &str| {
        ledger::relative(path, &src.roots).ok_or_else(|| {
            format!(
                "'{}' is not a path inside the skills root",
                plain(path, 200)
            )
        })
    };
    let mut out = EntryPaths {
        after: Vec::new(),
        before: Vec::new(),
    };
    // Each distinct blob, in the order first named, with its size.
    let mut sizes: BTreeMap<&str, u64> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut named = Vec::new();
    for item in &e.after {
        let p = match rel(&item.path) {
            Ok(p) => p,
            Err(why) => return Ok(Err(why)),
        };
        let sha = item.sha256.as_str();
        if !sizes.contains_key(sha) {
            match ledger::check_blob(&src.blobs, sha) {
                Ok(size) => {
                    sizes.insert(sha, size);
                    order.push(sha);
                }
                Err(why) => return Ok(Err(format!("{why}, for '{p}'"))),
            }
        }
        named.push((p, sha));
    }
    for item in &e.before {
        match rel(&item.path) {
            Ok(p) => out.before.push(p),
            Err(why) => return Ok(Err(why)),
        }
    }
    if let Some(b) = blobs {
        for sha in order {
            let f = match ledger::open_blob(&src.blobs, sha) {
                Ok(f) => f,
                Err(why) => return Ok(Err(why)),
            };
            let (id, size) = b.put_reader(f)?;
            if id != sha || Some(&size) != sizes.get(sha) {
                return Ok(Err(format!("blob {sha} changed between two reads")));
            }
        }
    }
    for (p, sha) in named {
        out.after.push((p, sha.to_string(), sizes[sha]));
    }
    Ok(Ok(out))
}

/// Every part checked (and, with `into`, stored and recorded in order).
fn run(
    src: &Sources,
    rules: &HideRules,
    mut into: Option<(&mut Ledger, &BlobStore)>,
) -> io::Result<Report> {
    let mut report = Report {
        damage: src.damage.clone(),
        ..Report::default()
    };
    let now = crate::time::now_ns();
    for part in &src.parts {
        let (ts, what, origin, actor) = match part {
            Part::Snapshot(s) => (
                s.ts,
                format!("snapshot {} ({})", s.id, s.reason),
                Origin {
                    source: Source::Snapshot,
                    id: s.id.clone(),
                    action: s.reason.clone(),
                    actor: None,
                    skill: None,
                },
                Actor {
                    uid: s.uid,
                    pid: 0,
                    comm: "curator".into(),
                },
            ),
            Part::Entry(e) => (
                e.ts,
                e.part(),
                Origin {
                    source: Source::Ledger,
                    id: e.id.clone(),
                    action: e.action.clone(),
                    actor: Some(e.actor.clone()).filter(|a| !a.is_empty()),
                    skill: Some(e.skill.clone()).filter(|s| !s.is_empty()),
                },
                Actor {
                    uid: src.owner.0,
                    pid: 0,
                    comm: if e.actor.is_empty() {
                        "agent".into()
                    } else {
                        e.actor.clone()
                    },
                },
            ),
        };
        // A part dated after now is a clock's mistake: it is recorded as
        // of now, still after every part before it (see `HistoryIndex::add`
        // for why a future time must not reach the journal).
        let (ts, what, redated) = if ts > now {
            let when = crate::time::format_utc(ts);
            let why = format!("dated {when}, after now: recorded as of now");
            (
                now,
                format!("{what} ({why})"),
                Some(format!("{what}: {why}")),
            )
        } else {
            (ts, what, None)
        };
        let d = Defaults {
            uid: src.owner.0,
            gid: src.owner.1,
            ts,
        };
        let blobs = into.as_ref().map(|(_, b)| *b);
        let checked = match part {
            Part::Snapshot(s) => snapshot(s, rules, d, blobs)?.map(|(t, r)| Plan::Tree(t, r)),
            Part::Entry(e) => entry(src, e, blobs)?.map(Plan::Entry),
        };
        let checked = match checked {
            Ok(c) => c,
            Err(why) => {
                let part = match part {
                    Part::Snapshot(s) => format!("snapshot {}", s.id),
                    Part::Entry(e) => e.part(),
                };
                report.damage.push(Damage { part, why });
                continue;
            }
        };
        report.redated.extend(redated);
        if let (Part::Snapshot(s), Plan::Tree(_, refused)) = (part, &checked) {
            report.refused.extend(refused.iter().map(|why| Damage {
                part: format!("snapshot {}", s.id),
                why: why.clone(),
            }));
        }
        let Some((ledger, _)) = into.as_mut() else {
            report.taken.push(what);
            continue;
        };
        let changes = match &checked {
            Plan::Tree(tree, _) => apply::to_tree(ledger.catalog(), tree),
            Plan::Entry(paths) => apply::ledger_entry(ledger.catalog(), paths, rules, d),
        };
        let first = ledger.next_seq();
        for mut c in changes {
            c.origin = Some(origin.clone());
            ledger.record_at(c, actor.clone(), ts)?;
        }
        let last = ledger.last_seq();
        report.records = last;
        report.taken.push(match last + 1 - first {
            0 => format!("{what}: no change"),
            1 => format!("{what}: id {last}"),
            _ => format!("{what}: ids {first}-{last}"),
        });
    }
    Ok(report)
}

/// What an import of `root` would take and skip, storing nothing.
pub fn check(root: &Path, rules: &HideRules) -> Report {
    let src = gather(root);
    // Without a store nothing is written, so nothing can fail to be.
    run(&src, rules, None).unwrap_or_default()
}

/// Imports the agent's history of `root` into the store held open as
/// `fds`, whose journal holds no record ([`may_import`]; the caller holds
/// the store's lock). See the module's invariants for what a kill leaves.
pub fn into_new_store(
    root: &Path,
    rules: &HideRules,
    fds: &StoreFds,
    blobs: &BlobStore,
) -> Result<Report, Failure> {
    let src = gather(root);
    if src.parts.is_empty() {
        return Ok(Report {
            damage: src.damage,
            ..Report::default()
        });
    }
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Failure::new(
            Exit::BadStore,
            format!(
                "could not import the agent's history into '{}' ({what}: {e}); nothing of it \
                 was kept, and the next mount tries again",
                fds.top.path().display()
            ),
        )
    };
    // A scratch journal left by an import that was killed is gone with
    // the rest of `tmp/` (`StoreFds::clear_scratch`); this one is new.
    let _ = fds.tmp.remove_tree(SCRATCH);
    let scratch = fds
        .tmp
        .ensure_sub(SCRATCH, &fds.io)
        .map_err(|e| failed("make tmp/import", &e))?;
    let contents = journal::read_in(&scratch)?;
    let j = Journal::open_in(&scratch, &contents, fds.io.clone())?;
    let mut ledger = Ledger::new(j, &[]);
    let report = run(&src, rules, Some((&mut ledger, blobs))).map_err(|e| failed("store", &e))?;
    if ledger.last_seq() > 0 {
        // Blobs, then records, durable; then the one rename that makes
        // them the journal's, made durable in turn.
        ledger.sync(blobs).map_err(|e| failed("sync", &e))?;
        drop(ledger);
        let seg = contents.segment_name();
        scratch
            .rename(seg, &fds.journal, seg, 0)
            .and_then(|()| fds.journal.sync(&fds.io))
            .map_err(|e| failed("move the records into journal/", &e))?;
    }
    let _ = fds.tmp.remove_tree(SCRATCH);
    Ok(report)
}
