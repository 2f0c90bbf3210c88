//! Retention: which versions a policy keeps (`select`), and the rest
//! forgotten and their bytes reclaimed (`prune`), by the mounted daemon or
//! by the command line with the store unmounted (`run`).
//!
//! The vocabulary is restic's: `--keep-last N`, `--keep-within 30d`,
//! `--keep-hourly/daily/weekly/monthly N` (the newest id of each of the
//! last N hours, UTC days, ISO weeks, months that have one). A version is
//! a history id; the policy keeps the union of what each rule keeps, and
//! always keeps:
//! - the newest id (the live tree, the newest version of every path that
//!   exists), and every `forget` record (no change to the tree, never
//!   counted as a version: the same policy run twice forgets nothing the
//!   second time);
//! - the id just before every change that removed paths outright (unlink,
//!   rmdir, a removal found at mount, a park): the last version of a path
//!   that no longer exists is what versioning is for.
//!
//! Invariants:
//! - forgetting is one journal record (`forget`, with the forgotten ids
//!   as ranges), durable before a byte is reclaimed: a kill at any point
//!   leaves either nothing forgotten or the record, and a rerun of
//!   `forget` (or of the prune the daemon runs) reclaims what is left;
//! - the tree at a kept id is the fold of every record up to it, forgotten
//!   or not: a forgotten record's states stay in the index, and its blobs
//!   stay in the store for as long as a kept id still shows them
//!   (`prune::live_blobs`);
//! - ids are never renumbered: a forgotten id answers `ENOENT`, a kept one
//!   keeps its number and its tree.
//!
//! Locks: selecting reads the history index under the ledger's lock; the
//! prune's own rules are in `prune`.

// The daemon answers errors, never unwraps them (tests may; see clippy.toml).
#![deny(clippy::unwrap_used)]

pub mod prune;
pub mod run;

use serde::{Deserialize, Serialize};

use crate::history::HistoryIndex;

const HOUR_NS: i64 = 3_600_000_000_000;
const DAY_NS: i64 = 24 * HOUR_NS;

/// What to keep. Every rule is optional; at least one must be set. The
/// same struct is `forget`'s flags and `config.json`'s `retention`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Keep the N newest ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub keep_last: Option<u64>,
    /// Keep every id within this age of the newest (90m, 36h, 30d, 8w).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "AGE"))]
    pub keep_within: Option<String>,
    /// Keep the newest id of each of the last N hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub keep_hourly: Option<u64>,
    /// Keep the newest id of each of the last N days (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub keep_daily: Option<u64>,
    /// Keep the newest id of each of the last N ISO weeks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub keep_weekly: Option<u64>,
    /// Keep the newest id of each of the last N months.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub keep_monthly: Option<u64>,
    /// In `config.json` only: how often the mounted daemon applies the
    /// policy (an age; one day if not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(skip))]
    pub every: Option<String>,
}

impl Policy {
    /// Why this policy cannot be applied: it names no rule, a rule keeps
    /// nothing, or an age is not one.
    pub fn check(&self) -> Result<(), String> {
        let counts = [
            ("--keep-last", self.keep_last),
            ("--keep-hourly", self.keep_hourly),
            ("--keep-daily", self.keep_daily),
            ("--keep-weekly", self.keep_weekly),
            ("--keep-monthly", self.keep_monthly),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, n)| *n == Some(0)) {
            return Err(format!("{name} 0 keeps nothing; give a count of 1 or more"));
        }
        if let Some(w) = &self.keep_within {
            match skillfs_base::time::parse_age(w) {
                Some(ns) if ns > 0 => {}
                _ => {
                    return Err(format!(
                        "--keep-within '{w}' is not an age: give one like 90m, 36h, 30d, 8w"
                    ));
                }
            }
        }
        if let Some(e) = &self.every
            && skillfs_base::time::parse_age(e).is_none_or(|ns| ns < 1_000_000_000)
        {
            return Err(format!(
                "every '{e}' is not an age of a second or more: give one like 1h, 1d"
            ));
        }
        if counts.iter().all(|(_, n)| n.is_none()) && self.keep_within.is_none() {
            return Err(
                "a policy that keeps nothing: give at least one of --keep-last, \
                        --keep-within, --keep-hourly, --keep-daily, --keep-weekly, --keep-monthly"
                    .to_string(),
            );
        }
        Ok(())
    }

    /// How often the daemon applies it (`every`, else a day).
    pub fn interval(&self) -> std::time::Duration {
        let ns = self
            .every
            .as_deref()
            .and_then(skillfs_base::time::parse_age);
        std::time::Duration::from_nanos(ns.map_or(DAY_NS, |n| n.max(1_000_000_000)) as u64)
    }

    fn within_ns(&self) -> Option<i64> {
        self.keep_within
            .as_deref()
            .and_then(skillfs_base::time::parse_age)
    }
}

/// The ids the `forget` records of `records` took, as `log` hides them
/// ([`unforgotten`]): asked with `is_forgotten`.
pub fn forgotten(records: &[skillfs_store::journal::Record]) -> HistoryIndex {
    let mut h = HistoryIndex::new();
    for r in records.iter().filter(|r| !r.forgot.is_empty()) {
        h.forget(&r.forgot);
    }
    h
}

/// The records a reader of the journal shows: those of forgotten ids left
/// out (the `forget` records say which).
pub fn unforgotten(
    records: &[skillfs_store::journal::Record],
) -> Vec<skillfs_store::journal::Record> {
    let h = forgotten(records);
    if h.forgotten_count() == 0 {
        return records.to_vec();
    }
    records
        .iter()
        .filter(|r| !h.is_forgotten(r.seq))
        .cloned()
        .collect()
}

/// What a policy decides over a history.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// Ids kept, ascending (not counting ids forgotten before); not sent
    /// over the control socket (a count is, in the report).
    #[serde(skip)]
    pub keep: Vec<u64>,
    /// Ids to forget now, as inclusive ranges, ascending.
    pub forget: Vec<[u64; 2]>,
}

impl Selection {
    /// How many ids `forget` names. A selection read from elsewhere (the
    /// daemon's answer) may be anything: a reversed range counts none,
    /// and the count stops at `u64::MAX`.
    pub fn forget_count(&self) -> u64 {
        self.forget
            .iter()
            .map(|[a, b]| b.checked_sub(*a).map_or(0, |n| n.saturating_add(1)))
            .fold(0, u64::saturating_add)
    }

    /// Whether `forget` is what a selection is: ranges `[a, b]` with
    /// `1 <= a <= b`, ascending, none overlapping the one before.
    pub fn well_formed(&self) -> bool {
        let mut after = 0u64;
        self.forget.iter().all(|&[a, b]| {
            let ok = a > after && a <= b;
            after = b;
            ok
        })
    }
}

/// The bucket of a time for a calendar rule: its hour, UTC day, ISO week
/// (weeks start on Monday; day 0 of the epoch was a Thursday) or month.
fn bucket(ns: i64, unit: Unit) -> i64 {
    let day = ns.div_euclid(DAY_NS);
    match unit {
        Unit::Hour => ns.div_euclid(HOUR_NS),
        Unit::Day => day,
        Unit::Week => (day + 3).div_euclid(7),
        Unit::Month => {
            let (y, m, _) = skillfs_base::time::civil_from_days(day);
            y * 12 + i64::from(m)
        }
    }
}

#[derive(Clone, Copy)]
enum Unit {
    Hour,
    Day,
    Week,
    Month,
}

/// Applies `policy` (checked) to the ids of `h` not forgotten yet.
pub fn select(h: &HistoryIndex, policy: &Policy) -> Selection {
    let last = h.last();
    // A `forget` changed no tree: not a version a rule counts, and kept
    // (its record is how `log` tells what was forgotten).
    let ids: Vec<u64> = (1..=last)
        .filter(|&id| !h.is_forgotten(id) && !h.is_forget(id))
        .collect();
    let time = |id: u64| h.time_of(id).unwrap_or(0);
    let mut keep = vec![false; ids.len()];
    if let Some(n) = policy.keep_last {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        for k in keep.iter_mut().rev().take(n) {
            *k = true;
        }
    }
    if let (Some(w), Some(&newest)) = (policy.within_ns(), ids.last()) {
        let from = time(newest).saturating_sub(w);
        for (i, &id) in ids.iter().enumerate() {
            keep[i] |= time(id) >= from;
        }
    }
    let rules = [
        (policy.keep_hourly, Unit::Hour),
        (policy.keep_daily, Unit::Day),
        (policy.keep_weekly, Unit::Week),
        (policy.keep_monthly, Unit::Month),
    ];
    for (n, unit) in rules {
        let Some(mut left) = n else { continue };
        let mut seen: Option<i64> = None;
        // Newest first: the newest id of each bucket, until N buckets.
        for i in (0..ids.len()).rev() {
            if left == 0 {
                break;
            }
            let b = bucket(time(ids[i]), unit);
            if seen != Some(b) {
                seen = Some(b);
                keep[i] = true;
                left -= 1;
            }
        }
    }
    // Never let go of the newest tree, nor of the last version of a path
    // removed outright (the tree just before its removal).
    let mut always: Vec<u64> = h
        .removals()
        .iter()
        .filter_map(|r| r.checked_sub(1))
        .filter(|&id| id >= 1)
        .collect();
    // The newest id that is a version (a `forget` after it shows its tree).
    always.extend(ids.last());
    for id in always {
        if let Ok(i) = ids.binary_search(&id) {
            keep[i] = true;
        }
    }
    let mut sel = Selection::default();
    for (i, &id) in ids.iter().enumerate() {
        if keep[i] {
            sel.keep.push(id);
            continue;
        }
        match sel.forget.last_mut() {
            // Contiguous among the ids not forgotten yet: ids forgotten
            // before may sit between, and are forgotten already (a
            // `forget` between splits the range: it stays).
            Some(r) if (r[1] + 1..id).all(|x| h.is_forgotten(x)) => r[1] = id,
            _ => sel.forget.push([id, id]),
        }
    }
    sel
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Fold;
    use skillfs_base::relpath::RelPath;
    use skillfs_store::journal::{EntryState, Kind, Op, Record};

    /// A selection from the daemon's answer (fuzz/regressions/control/):
    /// a reversed range or a count past u64 panicked in forget_count.
    #[test]
    fn a_selection_read_from_elsewhere_counts_without_panic() {
        let sel = |forget: Vec<[u64; 2]>| Selection {
            keep: Vec::new(),
            forget,
        };
        assert_eq!(sel(vec![[4, 2], [5, 5]]).forget_count(), 1);
        assert_eq!(sel(vec![[0, u64::MAX], [1, 1]]).forget_count(), u64::MAX);
        assert!(sel(vec![[1, 2], [3, 3], [7, 9]]).well_formed());
        for bad in [
            vec![[4, 2]],
            vec![[0, 1]],
            vec![[1, 3], [3, 4]],
            vec![[5, 5], [1, 1]],
        ] {
            assert!(!sel(bad.clone()).well_formed(), "{bad:?}");
        }
    }

    const H: i64 = HOUR_NS;

    /// A history of writes to `f` at the given times (ns), then `extra`.
    fn history(times: &[i64], extra: &[Record]) -> HistoryIndex {
        let mut fold = Fold::replay(&[]);
        for (i, &t) in times.iter().enumerate() {
            fold.apply(&Record::sample(
                i as u64 + 1,
                t,
                Op::Write,
                "f",
                None,
                Some(EntryState::sample(Kind::File, &format!("{i:064}"))),
            ));
        }
        for r in extra {
            fold.apply(r);
        }
        fold.into_history()
    }

    fn keep(p: &Policy, h: &HistoryIndex) -> Vec<u64> {
        select(h, p).keep
    }

    #[test]
    fn checks_refuse_policies_that_keep_nothing() {
        assert!(Policy::default().check().is_err());
        let zero = Policy {
            keep_last: Some(0),
            ..Policy::default()
        };
        assert!(zero.check().unwrap_err().contains("--keep-last 0"));
        let bad = Policy {
            keep_within: Some("soon".into()),
            ..Policy::default()
        };
        assert!(bad.check().unwrap_err().contains("not an age"));
        let ok = Policy {
            keep_daily: Some(7),
            ..Policy::default()
        };
        assert!(ok.check().is_ok());
    }

    #[test]
    fn last_within_and_calendar_rules() {
        // Ids 1..=10, one an hour, from midnight UTC of day 20000.
        let t0 = 20_000 * DAY_NS;
        let times: Vec<i64> = (0..10).map(|i| t0 + i * H).collect();
        let h = history(&times, &[]);
        let last3 = Policy {
            keep_last: Some(3),
            ..Policy::default()
        };
        assert_eq!(keep(&last3, &h), [8, 9, 10]);
        let sel = select(&h, &last3);
        assert_eq!(sel.forget, [[1, 7]]);
        assert_eq!(sel.forget_count(), 7);
        let within = Policy {
            keep_within: Some("2h".into()),
            ..Policy::default()
        };
        assert_eq!(keep(&within, &h), [8, 9, 10]);
        let hourly = Policy {
            keep_hourly: Some(4),
            ..Policy::default()
        };
        assert_eq!(keep(&hourly, &h), [7, 8, 9, 10]);
        // Two per day over three days: the newest of each day.
        let days: Vec<i64> = (0..6)
            .map(|i| t0 + (i / 2) * DAY_NS + (i % 2) * H)
            .collect();
        let h = history(&days, &[]);
        let daily = Policy {
            keep_daily: Some(2),
            ..Policy::default()
        };
        assert_eq!(keep(&daily, &h), [4, 6]);
        let monthly = Policy {
            keep_monthly: Some(5),
            ..Policy::default()
        };
        assert_eq!(keep(&monthly, &h), [6], "one month: its newest id");
    }

    #[test]
    fn weeks_start_on_monday() {
        // Day 20000 since the epoch is a Friday (2024-10-04): Sunday
        // 2024-10-06 and Monday 2024-10-07 fall in different ISO weeks.
        let sun = 20_002 * DAY_NS;
        let mon = 20_003 * DAY_NS;
        assert_ne!(bucket(sun, Unit::Week), bucket(mon, Unit::Week));
        assert_eq!(bucket(20_000 * DAY_NS, Unit::Week), bucket(sun, Unit::Week));
        assert_eq!(
            bucket(mon, Unit::Month),
            bucket(20_000 * DAY_NS, Unit::Month)
        );
    }

    #[test]
    fn keeps_the_newest_and_the_tree_before_each_removal() {
        let unlink = Record::sample(6, 6, Op::Unlink, "f", None, None);
        let mut h = history(&[1, 2, 3, 4, 5], &[unlink]);
        let last1 = Policy {
            keep_last: Some(1),
            ..Policy::default()
        };
        // 6 is the newest; 5 holds the last version of the removed `f`.
        assert_eq!(keep(&last1, &h), [5, 6]);
        let sel = select(&h, &last1);
        assert_eq!(sel.forget, [[1, 4]]);
        // Once forgotten, ids stay out of later selections, and a range
        // may run across them.
        h.forget(&[[2, 3]]);
        let sel = select(&h, &last1);
        assert_eq!(sel.keep, [5, 6]);
        assert_eq!(sel.forget, [[1, 4]]);
        assert!(h.is_forgotten(2) && !h.is_forgotten(1) && !h.is_forgotten(4));
        let _ = RelPath::root();
    }
}
