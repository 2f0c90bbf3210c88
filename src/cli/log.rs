//! `skillfs log`: the journal's records, filtered (PATH, `--since`,
//! `--until`, `--actor`), grouped by operation, the newest `-n` of them,
//! paged and coloured on a terminal (`output`).
//!
//! An operation is what one process did in one go: consecutive records of
//! one process (pid, name and uid) each within [`GROUP_GAP_NS`] of the one
//! before (a `sed -i` is a create, a write and a rename; a `restore` or a
//! `copytree` one record per entry), or the records of one imported part
//! of the agent's history (one `origin`). `--all` and `--json` show every
//! record.
//!
//! The agent's own words go beside skillfs's: an imported record's
//! `origin` (its snapshot or ledger entry), and for versions made through
//! the mount the entries of the live ledger that describe them, matched
//! when the log is read (`agent::ledger::annotations`). `--json` prints
//! records as stored (an `origin` included, live matches not).
//!
//! Locks: none; it reads the journal once.

use std::collections::HashMap;

use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::journal::{self, Op, Record};

use super::output::{Out, Style};

/// Records of one process further apart than this are two operations.
pub const GROUP_GAP_NS: i64 = 2_000_000_000;

/// What to show.
#[derive(Default)]
pub struct Filter {
    pub path: Option<RelPath>,
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub actor: Option<String>,
    /// The author on another replica of each record a merge wrote, by
    /// record id (`sync::origins`, believed ones), for an `--actor` of
    /// the form `sync:<replica>/<author>`.
    pub authors: HashMap<u64, String>,
}

impl Filter {
    pub fn keeps(&self, r: &Record) -> bool {
        if let Some(f) = &self.path {
            let hit = r.path.starts_with(f) || r.to.as_ref().is_some_and(|t| t.starts_with(f));
            if !hit {
                return false;
            }
        }
        if self.since.is_some_and(|s| r.ts < s) || self.until.is_some_and(|u| r.ts > u) {
            return false;
        }
        match &self.actor {
            Some(a) => {
                r.actor.comm == *a
                    || r.actor.pid.to_string() == *a
                    || self.authors.get(&r.seq).is_some_and(|author| {
                        a.strip_prefix(r.actor.comm.as_str())
                            .and_then(|rest| rest.strip_prefix('/'))
                            == Some(author.as_str())
                    })
            }
            None => true,
        }
    }
}

/// `1h`, `30m`, `2d` ago (also `-1h`, `@-1h`), or a UTC time
/// (`2026-11-30T18:09:30Z`, taken to the end of its second if `end`).
pub fn parse_when(text: &str, now: i64, end: bool) -> Result<i64, Failure> {
    let t = text.trim().trim_start_matches('@');
    let age = t.strip_prefix('-').unwrap_or(t);
    if let Some(ago) = crate::time::parse_age(age) {
        return Ok(now.saturating_sub(ago));
    }
    crate::time::parse_utc(t)
        .map(|ns| if end { ns.saturating_add(999_999_999) } else { ns })
        .ok_or_else(|| {
            Failure::new(
                Exit::Usage,
                format!("'{text}' is not a time: give an age (30m, 1h, 2d) or a UTC time (2026-11-30T18:09:30Z)"),
            )
        })
}

/// The operations of `records`: runs of consecutive records of one process,
/// each within [`GROUP_GAP_NS`] of the one before.
pub fn group(records: &[Record]) -> Vec<&[Record]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=records.len() {
        let split = i == records.len() || {
            let (a, b) = (&records[i - 1], &records[i]);
            a.actor != b.actor
                || a.origin != b.origin
                || b.ts.saturating_sub(a.ts) > GROUP_GAP_NS
                || b.seq != a.seq + 1
        };
        if split {
            out.push(&records[start..i]);
            start = i;
        }
    }
    out
}

/// The paths an operation leaves changed: every path and rename target,
/// less the temporary names renamed away within it (a `sed -i`'s temp
/// file), in the order first touched.
pub fn touched(group: &[&Record]) -> Vec<RelPath> {
    let mut out: Vec<RelPath> = Vec::new();
    let moved_away = |p: &RelPath| {
        group
            .iter()
            .any(|r| r.op == Op::Rename && r.path == *p && r.to.as_ref() != Some(p))
            && group.iter().any(|r| r.path == *p && r.op == Op::Create)
    };
    for r in group {
        if matches!(r.op, Op::Sweep | Op::Orphan | Op::Lost | Op::Forget) {
            continue; // store-side paths, not the visible tree
        }
        for p in std::iter::once(&r.path).chain(r.to.as_ref()) {
            if !moved_away(p) && !out.contains(p) {
                out.push(p.clone());
            }
        }
    }
    out
}

fn op_style(op: Op) -> Style {
    match op {
        Op::Create | Op::Write | Op::Mkdir | Op::Symlink | Op::Scan | Op::Unpark | Op::Import => {
            Style::Green
        }
        Op::Unlink
        | Op::Rmdir
        | Op::ScanRemove
        | Op::ImportRemove
        | Op::Park
        | Op::Sweep
        | Op::Orphan
        | Op::Lost => Style::Red,
        Op::Rename | Op::Exchange => Style::Cyan,
        _ => Style::Yellow,
    }
}

fn actor(out: &Out, r: &Record) -> String {
    out.paint(
        Style::Dim,
        &format!("{}[{}] uid={}", r.actor.comm, r.actor.pid, r.actor.uid),
    )
}

/// One record: `id  time  operation  path[ -> to]  process[pid] uid=N`.
fn record_line(out: &Out, r: &Record) -> String {
    let to =
        r.to.as_ref()
            .map(|t| format!(" -> {t}"))
            .unwrap_or_default();
    format!(
        "{}  {}  {} {}{}  {}",
        out.paint(Style::Yellow, &format!("{:>9}", r.seq)),
        crate::time::format_utc(r.ts),
        out.paint(op_style(r.op), &format!("{:<11}", r.op.name())),
        r.path,
        to,
        actor(out, r)
    )
}

/// One operation of several records: `first-last  time  N changes  paths
/// (operations)  process[pid] uid=N`.
fn group_line(out: &Out, g: &[&Record]) -> String {
    let (first, last) = (g[0], g[g.len() - 1]);
    let mut ops: Vec<&str> = Vec::new();
    for r in g {
        if !ops.contains(&r.op.name()) {
            ops.push(r.op.name());
        }
    }
    let paths = touched(g);
    let what = match paths.as_slice() {
        [] => String::new(),
        [one] => one.to_string(),
        [one, rest @ ..] => format!("{one} (+{} more)", rest.len()),
    };
    format!(
        "{}  {}  {} {}  ({})  {}",
        out.paint(
            Style::Yellow,
            &format!("{:>9}", format!("{}-{}", first.seq, last.seq))
        ),
        crate::time::format_utc(last.ts),
        out.paint(
            Style::Cyan,
            &format!("{:<11}", format!("{} changes", g.len()))
        ),
        what,
        ops.join(", "),
        actor(out, last)
    )
}

/// How `log` shows what it keeps.
pub struct Show {
    pub json: bool,
    pub all: bool,
    pub count: Option<usize>,
    pub page: bool,
}

/// The agent's words for a record: what the live ledger says of it, by
/// record id (`agent::ledger::annotations`).
pub type Notes = HashMap<u64, Vec<String>>;

/// What the agent said of an operation: its imported part, else the live
/// ledger's entries matched to its records.
fn agent_words(out: &Out, g: &[&Record], notes: &Notes) -> String {
    let mut words: Vec<String> = Vec::new();
    for r in g {
        let said = r.origin.iter().map(crate::agent::describe);
        for w in said.chain(notes.get(&r.seq).into_iter().flatten().cloned()) {
            if !words.contains(&w) {
                words.push(w);
            }
        }
    }
    if words.is_empty() {
        return String::new();
    }
    format!("  {}", out.paint(Style::Cyan, &words.join("; ")))
}

pub fn print(
    records: &[Record],
    notes: &Notes,
    filter: &Filter,
    show: &Show,
) -> Result<(), Failure> {
    let records = &crate::retention::unforgotten(records)[..];
    // Grouped over the whole journal (an operation is what one process
    // did, whatever the filter), then filtered inside each operation.
    let groups: Vec<Vec<&Record>> = if show.json || show.all {
        records
            .iter()
            .filter(|r| filter.keeps(r))
            .map(|r| vec![r])
            .collect()
    } else {
        group(records)
            .into_iter()
            .map(|g| g.iter().filter(|r| filter.keeps(r)).collect::<Vec<_>>())
            .filter(|g| !g.is_empty())
            .collect()
    };
    let skip = show.count.map_or(0, |n| groups.len().saturating_sub(n));
    let mut out = Out::open(show.page && !show.json);
    for g in &groups[skip..] {
        let ok = if show.json {
            out.bytes(&journal::encode(g[0]))
        } else {
            let line = if g.len() == 1 {
                record_line(&out, g[0])
            } else {
                group_line(&out, g)
            };
            out.line(&format!("{line}{}", agent_words(&out, g, notes)))
        };
        if !ok {
            break; // the reader went away (`| head`, `q`)
        }
    }
    Ok(())
}

/// Another replica's words, with no control character for the terminal
/// (an escape sequence in a commit's subject would be the remote's) and
/// none that reorders or hides text.
fn plain(s: &str) -> String {
    // (Bidi embeddings and overrides, zero-width and invisible characters.)
    let hides = |c: char| {
        matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
            // Arabic letter mark, line and paragraph separators, fillers,
            // variation selectors, tags.
            || matches!(c, '\u{061C}' | '\u{2028}' | '\u{2029}' | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}')
            || matches!(c, '\u{FE00}'..='\u{FE0F}' | '\u{E0000}'..='\u{E007F}' | '\u{E0100}'..='\u{E01EF}')
    };
    s.chars()
        .map(|c| if c.is_control() || hides(c) { '?' } else { c })
        .collect()
}

/// Where a record a merge wrote came from, for beside its line: the
/// author on the other machine (plain), the replica and the commit.
pub fn origin_words(o: &crate::sync::Origin) -> String {
    let short = |s: &str, n: usize| s.chars().take(n).collect::<String>();
    // The replica's own words last, quoted: they cannot pose as the
    // replica or the commit.
    format!(
        "from replica {} (commit {}), author \"{}\"",
        plain(&short(&o.replica, 8)),
        plain(&short(&o.commit, 12)),
        plain(&short(&o.author, crate::sync::AUTHOR_MAX))
    )
}

/// `log --replica`: another replica's versions as this store keeps them
/// (`sync::fetched`), one line each, filtered as records are (the path is
/// git's: the version changed something at or below it; the actor is the
/// author's process name), the newest `-n`, oldest first.
pub fn print_fetched(
    list: &[crate::sync::Fetched],
    filter: &Filter,
    show: &Show,
) -> Result<(), Failure> {
    let kept: Vec<&crate::sync::Fetched> = list
        .iter()
        .filter(|v| {
            !(filter.since.is_some_and(|s| v.time < s) || filter.until.is_some_and(|u| v.time > u))
                && filter.actor.as_ref().is_none_or(|a| v.author == *a)
        })
        .collect();
    let skip = show.count.map_or(0, |n| kept.len().saturating_sub(n));
    let mut out = Out::open(show.page && !show.json);
    for v in &kept[skip..] {
        let ok = if show.json {
            let mut line = serde_json::to_vec(v).expect("plain values");
            line.push(b'\n');
            out.bytes(&line)
        } else {
            out.line(&format!(
                "{}  {}  {}  {}  commit {}{}",
                out.paint(
                    Style::Yellow,
                    &format!("{}:{}", &v.replica[..8.min(v.replica.len())], v.id)
                ),
                crate::time::format_utc(v.time),
                plain(&v.subject),
                out.paint(Style::Dim, &plain(&v.author)),
                &v.commit[..12.min(v.commit.len())],
                if v.quarantined {
                    "  (quarantined: never merged)"
                } else if v.rewound {
                    "  (rewound: no longer on its branch)"
                } else {
                    ""
                },
            ))
        };
        if !ok {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::Actor;

    #[test]
    fn a_replicas_words_reach_the_terminal_plain() {
        assert_eq!(plain("write a.md"), "write a.md");
        assert_eq!(plain("x\u{1b}]2;pwn\u{7}y"), "x?]2;pwn?y");
        assert_eq!(plain("ab\u{202E}dc\u{200B}"), "ab?dc?");
        assert_eq!(plain("caf\u{e9}"), "caf\u{e9}");
        assert_eq!(plain("a\u{2028}b\u{E0041}c\u{FE0F}"), "a?b?c?");
    }

    fn rec(seq: u64, ts_s: i64, op: Op, path: &str, to: Option<&str>, pid: u32) -> Record {
        let p = |s: &str| RelPath::parse(s.as_bytes()).unwrap();
        Record {
            seq,
            ts: ts_s * 1_000_000_000,
            op,
            path: p(path),
            to: to.map(p),
            noreplace: false,
            hidden: None,
            state: None,
            actor: Actor {
                uid: 0,
                pid,
                comm: "sed".into(),
            },
            forgot: Vec::new(),
            acked_through: None,
            origin: None,
        }
    }

    #[test]
    fn one_process_in_one_go_is_one_operation_and_its_temp_names_are_not_shown() {
        let rs = vec![
            rec(1, 100, Op::Create, "cat/foo/sedAb12", None, 7),
            rec(2, 100, Op::Write, "cat/foo/sedAb12", None, 7),
            rec(
                3,
                101,
                Op::Rename,
                "cat/foo/sedAb12",
                Some("cat/foo/SKILL.md"),
                7,
            ),
            // Another process, then the same one much later.
            rec(4, 101, Op::Write, "cat/bar/SKILL.md", None, 8),
            rec(5, 200, Op::Write, "cat/foo/SKILL.md", None, 7),
        ];
        let g = group(&rs);
        assert_eq!(g.iter().map(|g| g.len()).collect::<Vec<_>>(), [3, 1, 1]);
        let first: Vec<&Record> = g[0].iter().collect();
        assert_eq!(
            touched(&first),
            [RelPath::parse(b"cat/foo/SKILL.md").unwrap()]
        );
    }

    #[test]
    fn times_are_ages_or_utc() {
        let now = 10_000 * 1_000_000_000;
        assert_eq!(
            parse_when("1h", now, false).unwrap(),
            now - 3600 * 1_000_000_000
        );
        assert_eq!(
            parse_when("@-1h", now, false).unwrap(),
            now - 3600 * 1_000_000_000
        );
        assert_eq!(
            parse_when("1970-01-01T00:00:01Z", now, true).unwrap(),
            1_999_999_999
        );
        assert_eq!(
            parse_when("yesterday", now, false).unwrap_err().exit,
            Exit::Usage
        );
    }
}
