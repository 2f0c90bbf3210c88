//! `HistoryIndex`: every past state of the visible tree, by path and id,
//! built from the effects of the journal's records (`catalog::Fold` feeds
//! it, record by record) and kept in step with it.
//!
//! Invariants:
//! - ids are the journal's sequence numbers, 1..=`last()` with no gap;
//! - `versions[p]` is sorted by id, one entry per change of path `p` (its new
//!   state, or `None` when it stopped existing), so the state of any path at
//!   any id is one binary search, whatever the number of versions;
//! - `touched[d]` lists, in order, the ids of the changes at or below
//!   directory `d` (what `d/.history` lists);
//! - path indexes are never reused; index 0 is the root;
//! - each change keeps the time its record carries (`recorded_time_of`,
//!   what `log` shows) and has a place in time (`time_of`, what `@time`
//!   aliases, listings and retention go by): strictly increasing, and
//!   never carried forward from a change dated after the clock (the rule
//!   is [`HistoryIndex::add`]'s), so one bad clock cannot move every later
//!   change to its date.
//!
//! Locks: none of its own; the index is owned by the fold in the `Ledger`,
//! behind the core's `ledger` mutex (or by one offline command).
//!
//! Memory: per record, two times (16 bytes), one version entry per path it
//! changes (about 130 bytes with its state) plus one id (8 bytes) per
//! ancestor directory of each changed path; per distinct path ever seen, its name and two small vectors.

// The daemon answers errors, never unwraps them (tests may; see clippy.toml).
#![deny(clippy::unwrap_used)]

mod codec;
mod placing;

use std::borrow::Cow;
use std::collections::HashMap;

use skillfs_base::relpath::RelPath;
use skillfs_store::journal::EntryState;

pub type PathIdx = u32;
pub const ROOT_IDX: PathIdx = 0;

/// What one change did to one path of the visible tree: its new state, or
/// `None` when it stopped existing (made by `catalog::Catalog::apply`).
pub type Effect = (RelPath, Option<EntryState>);

#[derive(Default)]
pub struct HistoryIndex {
    paths: HashMap<RelPath, PathIdx, PathHasher>,
    names: Vec<RelPath>,
    /// `parents[i]`: the index of path `i`'s directory (the root's own).
    parents: Vec<PathIdx>,
    children: Vec<Vec<PathIdx>>,
    versions: Vec<Vec<(u64, Option<EntryState>)>>,
    touched: Vec<Vec<u64>>,
    /// `times[id - 1]`: change `id`'s place in time, strictly increasing,
    /// placed from `recorded` by the rule of [`HistoryIndex::add`].
    times: Vec<i64>,
    /// `recorded[id - 1]`: the time change `id`'s record carries (what
    /// `log` shows).
    recorded: Vec<i64>,
    /// How many of the first records are dated after the clock: they are
    /// placed just before the first one that is not (see `add`).
    lead: usize,
    /// No record placed at its own time is dated after this: while it is
    /// not after the clock, no record needs placing again.
    trusted_max: i64,
    /// Ids forgotten by `skillfs forget`: sorted, disjoint, inclusive
    /// ranges. A forgotten id is listed and resolved nowhere; the states
    /// it made stay in `versions`, since a kept id after it may show them.
    forgotten: Vec<(u64, u64)>,
    /// Ids of the changes that removed visible paths outright (unlink,
    /// rmdir, a removal found at mount, a park): the tree just before each
    /// holds a last version that retention never lets go.
    removals: Vec<u64>,
    /// Ids of the `forget` records: no change to the tree, never counted
    /// as versions by a policy, never forgotten.
    forgets: Vec<u64>,
}

/// FNV-1a over a path's bytes, not SipHash: hashing paths was most of
/// folding a long journal. Names made to collide only slow the folds of
/// the store of whoever can already write into its root.
#[derive(Default, Clone, Copy)]
pub struct PathHasher;

impl std::hash::BuildHasher for PathHasher {
    type Hasher = Fnv;
    fn build_hasher(&self) -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

pub struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A name that `.history` resolves by lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alias {
    Id(u64),
    Latest,
    /// Newest change at or before this time (ns since the epoch).
    At(i64),
}

/// Parses an id or alias: `42`, `latest`, `@2026-11-30T18:09:30Z`,
/// `@2026-11-30T18-09-30Z`, `@-10m` (`s`, `m`, `h`, `d`, `w`).
pub fn parse_alias(name: &str, now_ns: i64) -> Option<Alias> {
    if name == "latest" {
        return Some(Alias::Latest);
    }
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        return name.parse().ok().map(Alias::Id);
    }
    let t = name.strip_prefix('@')?;
    if let Some(rel) = t.strip_prefix('-') {
        let ago = skillfs_base::time::parse_age(rel)?;
        return now_ns.checked_sub(ago).map(Alias::At);
    }
    // A time past what the records can hold names nothing (ENOENT).
    skillfs_base::time::parse_utc(t)
        .and_then(|ns| ns.checked_add(999_999_999))
        .map(Alias::At)
}

impl HistoryIndex {
    pub fn new() -> HistoryIndex {
        let mut h = HistoryIndex {
            trusted_max: i64::MIN,
            ..HistoryIndex::default()
        };
        h.intern(&RelPath::root());
        h
    }

    pub fn last(&self) -> u64 {
        self.times.len() as u64
    }

    pub fn time_of(&self, id: u64) -> Option<i64> {
        self.times.get(id.checked_sub(1)? as usize).copied()
    }

    pub fn idx(&self, path: &RelPath) -> Option<PathIdx> {
        self.paths.get(path).copied()
    }

    pub fn path(&self, idx: PathIdx) -> &RelPath {
        &self.names[idx as usize]
    }

    /// Ids `ranges` (inclusive, any order) are forgotten from now on.
    pub fn forget(&mut self, ranges: &[[u64; 2]]) {
        let mut all: Vec<(u64, u64)> = self.forgotten.clone();
        all.extend(ranges.iter().filter(|r| r[0] <= r[1]).map(|r| (r[0], r[1])));
        all.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(all.len());
        for (a, b) in all {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.forgotten = merged;
    }

    pub fn is_forgotten(&self, id: u64) -> bool {
        let k = self.forgotten.partition_point(|r| r.1 < id);
        self.forgotten.get(k).is_some_and(|r| r.0 <= id)
    }

    /// The forgotten ids: sorted, disjoint, inclusive ranges.
    pub fn forgotten_ranges(&self) -> &[(u64, u64)] {
        &self.forgotten
    }

    /// How many ids are forgotten (at most `u64::MAX`: a `forget` record
    /// read from a journal may name any range, `[0, u64::MAX]` too).
    pub fn forgotten_count(&self) -> u64 {
        self.forgotten
            .iter()
            .map(|r| (r.1 - r.0).saturating_add(1))
            .fold(0, u64::saturating_add)
    }

    /// Change `seq` removed visible paths outright (see `removals`).
    pub fn note_removal(&mut self, seq: u64) {
        if self.removals.last() != Some(&seq) {
            self.removals.push(seq);
        }
    }

    pub fn removals(&self) -> &[u64] {
        &self.removals
    }

    /// Change `seq` is a `forget` (see `forgets`).
    pub fn note_forget(&mut self, seq: u64) {
        self.forgets.push(seq);
    }

    pub fn is_forget(&self, id: u64) -> bool {
        self.forgets.binary_search(&id).is_ok()
    }

    /// How many paths were ever seen (their indexes are `0..count`).
    pub fn path_count(&self) -> usize {
        self.names.len()
    }

    /// Every version of path `idx`, by id: its state from then on.
    pub fn versions(&self, idx: PathIdx) -> &[(u64, Option<EntryState>)] {
        &self.versions[idx as usize]
    }

    /// The index of `path`, added if it was never seen.
    pub fn intern(&mut self, path: &RelPath) -> PathIdx {
        if let Some(&i) = self.paths.get(path) {
            return i;
        }
        let parent = path.parent().map(|p| self.intern(&p));
        let i = self.names.len() as PathIdx;
        self.paths.insert(path.clone(), i);
        self.names.push(path.clone());
        self.parents.push(parent.unwrap_or(ROOT_IDX));
        self.children.push(Vec::new());
        self.versions.push(Vec::new());
        self.touched.push(Vec::new());
        if let Some(p) = parent {
            self.children[p as usize].push(i);
        }
        i
    }

    /// The time change `id`'s record carries, as recorded.
    pub fn recorded_time_of(&self, id: u64) -> Option<i64> {
        self.recorded.get(id.checked_sub(1)? as usize).copied()
    }

    /// Adds change `seq` (the next id) made at `ts`, with its effects.
    ///
    /// Its place in time (`time_of`, what `@time` aliases, listings'
    /// mtimes and retention go by) is strictly increasing, so aliases
    /// resolve by one binary search and a listing's mtime moves whenever it
    /// grows. The clock now is the truth:
    /// - a change dated after the clock (an imported part from the future,
    ///   a clock that ran ahead and was set back) is placed 1 ns after the
    ///   change before it, never at its own time: one bad clock must not
    ///   carry every later change to its future date;
    /// - any other change is placed at its own time, or 1 ns after the
    ///   change before it if that is later (a clock stepped back);
    /// - changes dated after the clock before any that is not are placed
    ///   just before the first that is not (or from the clock on, if none).
    ///
    /// The placing is done at the fold (at mount, by each command) and
    /// again, for the changes after it, when a change arrives dated before
    /// a change placed at its own time that is now after the clock (a
    /// clock set back while the daemon runs). A change whose date the clock
    /// has passed since it was placed keeps its place until the next fold.
    pub fn add(&mut self, seq: u64, ts: i64, effects: Vec<Effect>) {
        debug_assert_eq!(seq, self.last() + 1);
        self.place(ts, skillfs_base::time::now_ns());
        for (path, state) in effects {
            let i = self.intern(&path);
            self.versions[i as usize].push((seq, state));
            // Up to the root by index: a year's journal folds at mount,
            // and this runs for every ancestor of every change.
            let mut pi = i;
            loop {
                let t = &mut self.touched[pi as usize];
                if t.last() != Some(&seq) {
                    t.push(seq);
                }
                if pi == ROOT_IDX {
                    break;
                }
                pi = self.parents[pi as usize];
            }
        }
    }

    /// The state of `idx` just after change `id` (`None`: absent). The root
    /// always exists; its state is not recorded (`Ok(None)` is "exists").
    pub fn state_at(&self, idx: PathIdx, id: u64) -> Option<&EntryState> {
        let v = &self.versions[idx as usize];
        let n = v.partition_point(|(s, _)| *s <= id);
        if n == 0 {
            return None;
        }
        v[n - 1].1.as_ref()
    }

    pub fn exists_at(&self, idx: PathIdx, id: u64) -> bool {
        idx == ROOT_IDX || self.state_at(idx, id).is_some()
    }

    /// The entries of directory `idx` just after change `id`.
    pub fn children_at(&self, idx: PathIdx, id: u64) -> Vec<(PathIdx, &EntryState)> {
        let mut out: Vec<(PathIdx, &EntryState)> = self.children[idx as usize]
            .iter()
            .filter_map(|&c| self.state_at(c, id).map(|s| (c, s)))
            .collect();
        out.sort_by(|a, b| self.names[a.0 as usize].cmp(&self.names[b.0 as usize]));
        out
    }

    /// The paths with a recorded change after change `a` up to change `b`
    /// (`a < b`): every path whose state may differ between the two trees,
    /// parents before children. It descends only into directories changed
    /// at or below themselves in that span (`touched`), so it costs time in
    /// the size of the change, not of the tree (an incremental export).
    pub fn changed_between(&self, a: u64, b: u64) -> Vec<PathIdx> {
        let mut out = Vec::new();
        let mut stack = vec![ROOT_IDX];
        while let Some(d) = stack.pop() {
            for &c in &self.children[d as usize] {
                let t = &self.touched[c as usize];
                let k = t.partition_point(|&x| x <= a);
                if t.get(k).is_none_or(|&x| x > b) {
                    continue; // nothing at or below `c` changed in the span
                }
                let v = &self.versions[c as usize];
                let k = v.partition_point(|(s, _)| *s <= a);
                if v.get(k).is_some_and(|(s, _)| *s <= b) {
                    out.push(c);
                }
                stack.push(c);
            }
        }
        out
    }

    /// The child `name` of `idx`, if such a path was ever seen.
    pub fn child(&self, idx: PathIdx, name: &[u8]) -> Option<PathIdx> {
        self.idx(&self.names[idx as usize].join(name))
    }

    /// The ids `.history` lists in directory `idx` (all of them at the root,
    /// where forgotten ones are the caller's to pass over). Below it, a
    /// forgotten id that changed the directory stands for the first kept
    /// id after it, which shows what that change left.
    pub fn ids(&self, idx: PathIdx) -> IdList<'_> {
        if idx == ROOT_IDX {
            return IdList::All(self.last());
        }
        let touched = &self.touched[idx as usize];
        if self.forgotten.is_empty() {
            return IdList::Some(Cow::Borrowed(touched));
        }
        let mut shown: Vec<u64> = Vec::with_capacity(touched.len());
        for &t in touched {
            let Some(k) = self.kept_from(t) else { break };
            if shown.last() != Some(&k) {
                shown.push(k);
            }
        }
        IdList::Some(Cow::Owned(shown))
    }

    /// The first id at or after `id` that is not forgotten, if any.
    fn kept_from(&self, id: u64) -> Option<u64> {
        let k = self.forgotten.partition_point(|r| r.1 < id);
        let next = match self.forgotten.get(k) {
            Some(r) if r.0 <= id => r.1.saturating_add(1),
            _ => id,
        };
        (next <= self.last()).then_some(next)
    }

    /// When the newest `forget` was recorded: a listing's time must move
    /// when a forget takes ids out of it.
    pub fn last_forget_time(&self) -> Option<i64> {
        self.forgets.last().and_then(|&id| self.time_of(id))
    }

    /// The id an alias names in directory `idx`'s `.history`, if any: a
    /// forgotten id names nothing, and `latest` or a time name the newest
    /// kept id at or before it.
    pub fn resolve(&self, idx: PathIdx, alias: Alias) -> Option<u64> {
        let ids = self.ids(idx);
        let mut id = match alias {
            Alias::Id(id) => (1..=self.last()).contains(&id).then_some(id)?,
            Alias::Latest => ids.last()?,
            Alias::At(t) => {
                // The newest listed id whose time is at or before `t`.
                let upto = self.times.partition_point(|&x| x <= t) as u64;
                ids.last_at_or_before(upto)?
            }
        };
        while self.is_forgotten(id) {
            if matches!(alias, Alias::Id(_)) {
                return None;
            }
            id = ids.last_at_or_before(id.checked_sub(1)?)?;
        }
        self.exists_at(idx, id).then_some(id)
    }
}

/// The ids a `.history` directory lists.
pub enum IdList<'a> {
    All(u64),
    Some(Cow<'a, [u64]>),
}

impl IdList<'_> {
    pub fn len(&self) -> usize {
        match self {
            IdList::All(n) => *n as usize,
            IdList::Some(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<u64> {
        match self {
            IdList::All(n) => ((i as u64) < *n).then_some(i as u64 + 1),
            IdList::Some(v) => v.get(i).copied(),
        }
    }

    pub fn last(&self) -> Option<u64> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    fn last_at_or_before(&self, id: u64) -> Option<u64> {
        match self {
            IdList::All(n) => (id >= 1).then_some(id.min(*n)),
            IdList::Some(v) => {
                let k = v.partition_point(|&x| x <= id);
                k.checked_sub(1).map(|k| v[k])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Fold;
    use skillfs_store::journal::{Kind, Op, Record};

    fn st(kind: Kind, blob: &str) -> EntryState {
        EntryState::sample(kind, blob)
    }

    fn p(s: &str) -> RelPath {
        RelPath::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn states_listings_and_aliases() {
        let rec = Record::sample;
        let recs = vec![
            rec(1, 100, Op::Mkdir, "cat", None, Some(st(Kind::Dir, ""))),
            rec(2, 200, Op::Mkdir, "cat/foo", None, Some(st(Kind::Dir, ""))),
            rec(
                3,
                300,
                Op::Write,
                "cat/foo/SKILL.md",
                None,
                Some(st(Kind::File, "v1")),
            ),
            rec(
                4,
                400,
                Op::Write,
                "cat/foo/SKILL.md",
                None,
                Some(st(Kind::File, "v2")),
            ),
            rec(5, 500, Op::Rename, "cat/foo", Some("cat/bar"), None),
            rec(6, 600, Op::Write, "other", None, Some(st(Kind::File, "o"))),
            rec(7, 700, Op::Rmdir, "cat/bar", None, None),
        ];
        let h = Fold::replay(&recs).into_history();
        assert_eq!(h.last(), 7);
        let skill = h.idx(&p("cat/foo/SKILL.md")).unwrap();
        assert_eq!(h.state_at(skill, 2), None);
        assert_eq!(h.state_at(skill, 3).unwrap().blob.as_deref(), Some("v1"));
        assert_eq!(h.state_at(skill, 4).unwrap().blob.as_deref(), Some("v2"));
        assert_eq!(h.state_at(skill, 5), None, "renamed away");
        let moved = h.idx(&p("cat/bar/SKILL.md")).unwrap();
        assert_eq!(h.state_at(moved, 5).unwrap().blob.as_deref(), Some("v2"));
        assert_eq!(h.state_at(moved, 7), None);
        let cat = h.idx(&p("cat")).unwrap();
        let names = |id| -> Vec<String> {
            h.children_at(cat, id)
                .iter()
                .map(|(c, _)| h.path(*c).to_string())
                .collect()
        };
        assert_eq!(names(4), ["cat/foo"]);
        assert_eq!(names(5), ["cat/bar"]);
        assert!(names(7).is_empty());
        // cat/foo/.history lists the changes under it, the rename included.
        let foo = h.idx(&p("cat/foo")).unwrap();
        let ids: Vec<u64> = (0..h.ids(foo).len())
            .map(|i| h.ids(foo).get(i).unwrap())
            .collect();
        assert_eq!(ids, [2, 3, 4, 5]);
        assert_eq!(h.ids(ROOT_IDX).len(), 7);
        // Aliases: exact boundaries, and before the first change.
        assert_eq!(h.resolve(ROOT_IDX, Alias::Latest), Some(7));
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(400)), Some(4));
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(399)), Some(3));
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(99)), None);
        assert_eq!(h.resolve(ROOT_IDX, Alias::Id(8)), None);
        assert_eq!(h.resolve(ROOT_IDX, Alias::Id(0)), None);
        assert_eq!(
            h.resolve(foo, Alias::Latest),
            None,
            "cat/foo is gone after its last change"
        );
        assert_eq!(h.resolve(foo, Alias::At(450)), Some(4));
        assert_eq!(
            h.resolve(foo, Alias::Id(1)),
            None,
            "cat/foo did not exist yet"
        );
        // What changed in a span: every path with a version in it, and so
        // every path whose state differs between its two ends.
        let changed = |a, b| -> Vec<String> {
            let mut v: Vec<String> = h
                .changed_between(a, b)
                .iter()
                .map(|&i| h.path(i).to_string())
                .collect();
            v.sort();
            v
        };
        assert_eq!(changed(3, 4), ["cat/foo/SKILL.md"]);
        assert_eq!(
            changed(4, 6),
            [
                "cat/bar",
                "cat/bar/SKILL.md",
                "cat/foo",
                "cat/foo/SKILL.md",
                "other"
            ]
        );
        assert!(changed(7, 7).is_empty());
        let all = [
            "cat",
            "cat/foo",
            "cat/foo/SKILL.md",
            "cat/bar",
            "cat/bar/SKILL.md",
        ];
        for a in 0..7 {
            for b in a + 1..=7 {
                for name in all.iter().chain(&["other"]) {
                    let i = h.idx(&p(name)).unwrap();
                    if h.state_at(i, a) != h.state_at(i, b) {
                        assert!(changed(a, b).contains(&name.to_string()), "{name} {a}..{b}");
                    }
                }
            }
        }
    }

    #[test]
    fn alias_syntax() {
        let now = 1_000_000 * 1_000_000_000;
        assert_eq!(parse_alias("latest", now), Some(Alias::Latest));
        assert_eq!(parse_alias("42", now), Some(Alias::Id(42)));
        assert_eq!(
            parse_alias("@-10m", now),
            Some(Alias::At(now - 600 * 1_000_000_000))
        );
        assert_eq!(
            parse_alias("@2026-11-30T18-09-30Z", now),
            Some(Alias::At(1_796_062_170 * 1_000_000_000 + 999_999_999))
        );
        for bad in ["", "@", "@yesterday", "-1", "4x", "@-10", "@2026-11-30"] {
            assert_eq!(parse_alias(bad, now), None, "{bad}");
        }
    }
}
