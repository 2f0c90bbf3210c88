//! What a command says when its PATH is not in history: one line that
//! names the path as given and as resolved under ROOT (a relative PATH
//! counted from ROOT outside the mount surprises), and what to type
//! instead: a near name history has, the ids at which the path existed,
//! or the command for an id given where a path belongs (`skillfs log 29`).
//!
//! Exit codes: 8 for a path history does not have; 2 for an id given as
//! a path.
//!
//! Locks: none; it reads what the command already read.

use std::path::Path;

use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::journal::Record;

use super::locate::Target;
use super::log;

/// Ok if `rel` (the user's `given`) existed just after `id`; else the
/// failure that says so, with the ids at which it did exist, or a near
/// name history has.
pub fn present(
    t: &Target,
    store: &Store,
    given: &Path,
    rel: &RelPath,
    id: u64,
) -> Result<(), Failure> {
    if store.lookup(rel, id).is_ok() {
        return Ok(());
    }
    let shown = t.shown(given, rel);
    let seen: Vec<u64> = store
        .index
        .idx(rel)
        .map(|i| {
            let v = store.index.versions(i);
            v.iter()
                .filter(|(_, s)| s.is_some())
                .map(|(id, _)| *id)
                .collect()
        })
        .unwrap_or_default();
    Err(Failure::new(
        Exit::NotFound,
        match (seen.first(), seen.last()) {
            (Some(a), Some(b)) => format!(
                "{shown} did not exist just after change {id}; it has versions from change {a} \
                 to {b} (`skillfs log {}` lists them)",
                given.display()
            ),
            _ => never(
                &shown,
                rel,
                (1..store.index.path_count() as u32).map(|i| store.index.path(i)),
            ),
        },
    ))
}

/// Ok if some record is at or below `rel` (the user's `given`); else the
/// failure for `skillfs log PATH`: a near name history has, or for an id
/// given as a path, the commands that show a change.
pub fn logged(t: &Target, records: &[Record], given: &Path, rel: &RelPath) -> Result<(), Failure> {
    let filter = log::Filter {
        authors: Default::default(),
        path: Some(rel.clone()),
        ..log::Filter::default()
    };
    if rel.is_root() || records.iter().any(|r| filter.keeps(r)) {
        return Ok(());
    }
    let text = given.to_string_lossy();
    let one_name = given.components().count() == 1;
    if one_name && crate::history::parse_alias(&text, crate::time::now_ns()).is_some() {
        let what = match text.parse::<u64>() {
            Ok(n) if n > 1 => format!("`skillfs diff {} {n}` shows what change {n} did", n - 1),
            _ => format!("`skillfs diff {text}` shows what changed since then"),
        };
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "'{text}' is a change id, not a path (no change was ever recorded at '{}'): \
                 {what}, `skillfs show {text}:PATH` a path as it was then",
                t.root.join(rel.as_os_str()).display()
            ),
        ));
    }
    let paths = records
        .iter()
        .flat_map(|r| std::iter::once(&r.path).chain(&r.to));
    Err(Failure::new(
        Exit::NotFound,
        never(&t.shown(given, rel), rel, paths),
    ))
}

/// The message for a path no change ever recorded, with the nearest of
/// `paths` if one is near enough to be a typo.
fn never<'a>(shown: &str, rel: &RelPath, paths: impl Iterator<Item = &'a RelPath>) -> String {
    let want = rel.as_bytes();
    let most = (want.len() / 5).clamp(1, 3);
    let near = paths
        .filter(|p| !p.is_root() && p.as_bytes().len().abs_diff(want.len()) <= most)
        .map(|p| (distance(p.as_bytes(), want), p))
        .filter(|(d, _)| *d <= most)
        .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(b.1)));
    match near {
        Some((_, p)) => format!("no change was ever recorded at {shown}; did you mean '{p}'?"),
        None => format!("no change was ever recorded at {shown}; `skillfs log` lists every change"),
    }
}

/// Levenshtein distance between two byte strings.
fn distance(a: &[u8], b: &[u8]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, x) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            let sub = prev + usize::from(x != y);
            prev = row[j + 1];
            row[j + 1] = sub.min(prev + 1).min(row[j] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_near_and_another_name_is_not() {
        assert_eq!(distance(b"demo/SKIL.md", b"demo/SKILL.md"), 1);
        assert_eq!(distance(b"abc", b"abc"), 0);
        assert_eq!(distance(b"", b"ab"), 2);
        let p = |s: &str| RelPath::parse(s.as_bytes()).unwrap();
        let have = [p("demo"), p("demo/SKILL.md"), p("other/README.md")];
        let msg = never("'demo/SKIL.md'", &p("demo/SKIL.md"), have.iter());
        assert!(msg.ends_with("did you mean 'demo/SKILL.md'?"), "{msg}");
        let msg = never("'zzz/q'", &p("zzz/q"), have.iter());
        assert!(msg.contains("`skillfs log` lists every change"), "{msg}");
    }
}
