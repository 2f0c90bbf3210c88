//! The fold of the journal: what its records, applied in sequence order,
//! say the tree is now ([`Catalog`]) and was at every change
//! ([`HistoryIndex`]). [`Fold`] is the one place a record is applied to
//! both; the mounted daemon (`ledger::Ledger`) and the commands that read a
//! store offline (`commands::Store`) fold through it alike.
//!
//! Invariants: the catalog is exactly the fold of the records applied so
//! far ([`Catalog::apply`]), and the history index holds the effects of the
//! same records, so the two never disagree; records are applied in
//! sequence order, each once. Paths are kept in a `BTreeMap` in byte order,
//! so the descendants of a directory are one range and renaming or
//! removing a directory costs time in the size of that directory, not of
//! the tree.
//!
//! Locks: none here; a `Fold` is owned by one `Ledger`, behind its mutex,
//! or by one command.
//!
//! Depends on `history` (the index it feeds) and the journal's record
//! types; neither depends on this module.

// The daemon answers errors, never unwraps them (tests may; see clippy.toml).
#![deny(clippy::unwrap_used)]

use std::collections::BTreeMap;

use crate::history::{Effect, HistoryIndex};
use skillfs_base::relpath::RelPath;
use skillfs_store::journal::{EntryState, Kind, Op, Record};

/// The current state of every versioned path.
#[derive(Default)]
pub struct Catalog {
    entries: BTreeMap<RelPath, EntryState>,
}

impl Catalog {
    pub fn get(&self, path: &RelPath) -> Option<&EntryState> {
        self.entries.get(path)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&RelPath, &EntryState)> {
        self.entries.iter()
    }

    /// Every entry below `path`, in byte order.
    pub fn below(&self, path: &RelPath) -> impl Iterator<Item = (&RelPath, &EntryState)> {
        let (lo, hi) = path.descendants_range();
        self.entries.range(lo..hi)
    }

    fn descendants(&self, path: &RelPath) -> Vec<RelPath> {
        let (lo, hi) = path.descendants_range();
        self.entries.range(lo..hi).map(|(k, _)| k.clone()).collect()
    }

    fn remove_tree(&mut self, path: &RelPath) -> Vec<(RelPath, EntryState)> {
        let mut out = Vec::new();
        if let Some(s) = self.entries.remove(path) {
            out.push((path.clone(), s));
        }
        for d in self.descendants(path) {
            if let Some(s) = self.entries.remove(&d) {
                out.push((d, s));
            }
        }
        out
    }

    /// Applies one record and returns its effect on the visible tree: every
    /// path whose state changed, with its new state (`None`: gone), removals
    /// before additions.
    pub fn apply(&mut self, r: &Record) -> Vec<Effect> {
        let gone = |v: Vec<(RelPath, EntryState)>| v.into_iter().map(|(p, _)| (p, None));
        let mut effects: Vec<Effect> = Vec::new();
        // The root always exists and its own state is not versioned: a
        // chmod or utimes of it is no version, and a record that says it
        // went away (a scan of a catalog that once held it) removes
        // nothing. Kept in the catalog, the root was found "removed" by
        // the next mount's scan, which then emptied the whole tree.
        if r.path.is_root() && r.to.is_none() {
            return effects;
        }
        match r.op {
            Op::Unlink | Op::Rmdir | Op::ScanRemove | Op::ImportRemove | Op::Park => {
                effects.extend(gone(self.remove_tree(&r.path)));
            }
            // Store-side housekeeping of hidden entries: not in the visible tree.
            Op::Orphan | Op::Sweep | Op::Lost | Op::Forget => {}
            Op::Rename => {
                let Some(to) = &r.to else { return effects };
                let moved = self.remove_tree(&r.path);
                effects.extend(moved.iter().map(|(p, _)| (p.clone(), None)));
                effects.extend(gone(self.remove_tree(to)));
                for (p, s) in moved {
                    let np = p.rebase(&r.path, to);
                    self.entries.insert(np.clone(), s.clone());
                    effects.push((np, Some(s)));
                }
            }
            Op::Exchange => {
                let Some(to) = &r.to else { return effects };
                let a = self.remove_tree(&r.path);
                let b = self.remove_tree(to);
                effects.extend(a.iter().chain(b.iter()).map(|(p, _)| (p.clone(), None)));
                for (p, s) in a {
                    let np = p.rebase(&r.path, to);
                    self.entries.insert(np.clone(), s.clone());
                    effects.push((np, Some(s)));
                }
                for (p, s) in b {
                    let np = p.rebase(to, &r.path);
                    self.entries.insert(np.clone(), s.clone());
                    effects.push((np, Some(s)));
                }
            }
            _ => {
                if let Some(state) = &r.state {
                    effects.push((r.path.clone(), Some(state.clone())));
                    // Most records rewrite a file that exists: one search,
                    // in place (folding a year's journal is mostly this).
                    if let Some(old) = self.entries.get_mut(&r.path)
                        && old.kind != Kind::Dir
                    {
                        *old = state.clone();
                        return effects;
                    }
                    let mut gone = Vec::new();
                    if state.kind != Kind::Dir {
                        for d in self.descendants(&r.path) {
                            self.entries.remove(&d);
                            gone.push((d, None));
                        }
                    }
                    self.entries.insert(r.path.clone(), state.clone());
                    // Removals before additions, as everywhere.
                    gone.extend(effects);
                    effects = gone;
                }
            }
        }
        effects
    }
}

/// The catalog and the history index, folded from the same records.
pub struct Fold {
    catalog: Catalog,
    history: HistoryIndex,
}

impl Fold {
    /// The fold of `records` (a journal's, in sequence order).
    pub fn replay(records: &[Record]) -> Fold {
        let mut fold = Fold {
            catalog: Catalog::default(),
            history: HistoryIndex::new(),
        };
        for r in records {
            fold.apply(r);
        }
        fold
    }

    /// The fold whose history is `history` (loaded from a checkpoint): the
    /// catalog is every path's newest state, where it has one.
    pub fn from_history(history: HistoryIndex) -> Fold {
        let mut catalog = Catalog::default();
        for idx in 1..history.path_count() as crate::history::PathIdx {
            if let Some((_, Some(state))) = history.versions(idx).last() {
                catalog
                    .entries
                    .insert(history.path(idx).clone(), state.clone());
            }
        }
        Fold { catalog, history }
    }

    /// [`Fold::replay`] of records given away: the commonest record (a
    /// file that exists given a new state) moves its path and state in
    /// instead of copying them, which is most of folding a long journal.
    pub fn replay_owned(records: Vec<Record>) -> Fold {
        let mut fold = Fold {
            catalog: Catalog::default(),
            history: HistoryIndex::new(),
        };
        for r in records {
            fold.apply_owned(r);
        }
        fold
    }

    /// [`Fold::apply`] of a record given away.
    pub fn apply_owned(&mut self, r: Record) {
        let plain = !matches!(
            r.op,
            Op::Unlink
                | Op::Rmdir
                | Op::ScanRemove
                | Op::ImportRemove
                | Op::Park
                | Op::Orphan
                | Op::Sweep
                | Op::Lost
                | Op::Forget
                | Op::Rename
                | Op::Exchange
        );
        if plain && let Some(state) = &r.state {
            // The same as `Catalog::apply`'s last arm for a path that is a
            // file already: replaced in place, no descendants to remove.
            if let Some(old) = self.catalog.entries.get_mut(&r.path)
                && old.kind != Kind::Dir
            {
                *old = state.clone();
                let (seq, ts) = (r.seq, r.ts);
                self.history.add(seq, ts, vec![(r.path, r.state)]);
                return;
            }
        }
        self.apply(&r);
    }

    /// Applies the next record to both.
    pub fn apply(&mut self, r: &Record) {
        let effects = self.catalog.apply(r);
        let removed = matches!(
            r.op,
            Op::Unlink | Op::Rmdir | Op::ScanRemove | Op::Park | Op::ImportRemove
        ) && effects.iter().any(|(_, s)| s.is_none());
        self.history.add(r.seq, r.ts, effects);
        if removed {
            self.history.note_removal(r.seq);
        }
        if r.op == Op::Forget {
            // Only ids made before it: a record read from a journal may
            // name any (0, or past the last), and a history holding them
            // would make a checkpoint that does not decode.
            let before: Vec<[u64; 2]> = r
                .forgot
                .iter()
                .map(|&[a, b]| [a.max(1), b.min(r.seq.saturating_sub(1))])
                .filter(|&[a, b]| a <= b)
                .collect();
            self.history.forget(&before);
            self.history.note_forget(r.seq);
        }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn history(&self) -> &HistoryIndex {
        &self.history
    }

    pub fn history_mut(&mut self) -> &mut HistoryIndex {
        &mut self.history
    }

    pub fn into_history(self) -> HistoryIndex {
        self.history
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(c: &Catalog) -> Vec<String> {
        c.iter().map(|(p, _)| p.to_string()).collect()
    }

    #[test]
    fn owned_replay_is_the_same_fold() {
        let st = |kind, blob: &str| Some(EntryState::sample(kind, &blob.repeat(64)));
        let recs = vec![
            Record::sample(1, 1, Op::Mkdir, "a", None, st(Kind::Dir, "")),
            Record::sample(2, 2, Op::Create, "a/x", None, st(Kind::File, "1")),
            Record::sample(3, 3, Op::Write, "a/x", None, st(Kind::File, "2")),
            Record::sample(4, 4, Op::Write, "a/x", None, st(Kind::File, "2")),
            Record::sample(5, 5, Op::Rename, "a", Some("b"), None),
            Record::sample(6, 6, Op::Write, "b/x", None, st(Kind::File, "3")),
            Record::sample(7, 7, Op::Unlink, "b/x", None, None),
            Record::sample(8, 8, Op::Write, "b/x", None, st(Kind::File, "4")),
            Record::sample(9, 9, Op::Chmod, "b", None, st(Kind::Dir, "")),
        ];
        let a = Fold::replay(&recs);
        let b = Fold::replay_owned(recs.clone());
        assert_eq!(paths(&a.catalog), paths(&b.catalog));
        let (ha, hb) = (a.history(), b.history());
        assert_eq!(ha.path_count(), hb.path_count());
        for i in 0..ha.path_count() as crate::history::PathIdx {
            assert_eq!(ha.path(i), hb.path(i));
            assert_eq!(ha.versions(i), hb.versions(i));
            assert_eq!(ha.ids(i).len(), hb.ids(i).len());
        }
        assert_eq!(ha.removals(), hb.removals());
    }

    #[test]
    fn rename_moves_subtree_and_replaces_target() {
        let rec = |op, path, to| Record::sample(0, 0, op, path, to, None);
        let make = |op, path, kind| {
            Record::sample(0, 0, op, path, None, Some(EntryState::sample(kind, "")))
        };
        let mut c = Catalog::default();
        c.apply(&make(Op::Mkdir, "a", Kind::Dir));
        c.apply(&make(Op::Create, "a/x", Kind::File));
        c.apply(&make(Op::Mkdir, "a/s", Kind::Dir));
        c.apply(&make(Op::Create, "a/s/y", Kind::File));
        c.apply(&make(Op::Create, "ab", Kind::File));
        c.apply(&make(Op::Mkdir, "b", Kind::Dir));
        c.apply(&rec(Op::Rename, "a", Some("b")));
        assert_eq!(paths(&c), ["ab", "b", "b/s", "b/s/y", "b/x"]);
        c.apply(&rec(Op::Exchange, "ab", Some("b")));
        assert_eq!(paths(&c), ["ab", "ab/s", "ab/s/y", "ab/x", "b"]);
        c.apply(&rec(Op::Rmdir, "ab", None));
        assert_eq!(paths(&c), ["b"]);
    }
}
