//! Each change's place in time: the rule of [`HistoryIndex::add`] (a
//! change dated after the clock never carries a later change to its
//! date; a clock stepped back is flattened), applied as changes are added
//! and again over the changes after a clock set back.
//!
//! Locks: none (see `history`).

use super::HistoryIndex;

impl HistoryIndex {
    /// Places the next change, recorded at `ts`, at `now` (see `add`).
    pub(super) fn place(&mut self, ts: i64, now: i64) {
        let n = self.recorded.len();
        self.recorded.push(ts);
        let last = self.times.last().copied();
        let after = |t: Option<i64>| t.map_or(i64::MIN, |t| t.saturating_add(1));
        if ts > now {
            let t = if self.lead == n {
                self.lead += 1;
                now.max(after(last))
            } else {
                after(last)
            };
            self.times.push(t);
        } else if self.lead > 0 && self.lead == n {
            self.times.push(ts);
            self.settle(0, now);
        } else if last.is_none_or(|l| ts > l) {
            self.times.push(ts);
            self.trusted_max = self.trusted_max.max(ts);
        } else if self.trusted_max > now {
            // The clock went back below changes placed at their own time:
            // they (all after `ts`) are placed again.
            let from = self.times.partition_point(|&x| x <= ts);
            self.times.push(ts);
            self.settle(from, now);
        } else {
            self.times.push(after(last));
        }
    }

    /// Places changes `from..` again from their recorded times, as `add`
    /// says (from the first, if `from` is within the leading ones).
    fn settle(&mut self, from: usize, now: i64) {
        let n = self.recorded.len();
        let mut start = from;
        if from <= self.lead {
            let k = self.recorded.iter().position(|&r| r <= now).unwrap_or(n);
            self.lead = k;
            self.trusted_max = i64::MIN;
            for i in 0..k {
                let t = match self.recorded.get(k) {
                    Some(&r) => r.saturating_sub((k - i) as i64),
                    None => now.saturating_add(i as i64),
                };
                self.times[i] = t;
            }
            start = k;
        }
        let mut prev = start.checked_sub(1).map(|i| self.times[i]);
        if let Some(p) = prev {
            // Every change before `start` is placed no later than `p`.
            self.trusted_max = self.trusted_max.min(p);
        }
        for i in start..n {
            let r = self.recorded[i];
            let after = prev.map_or(i64::MIN, |p| p.saturating_add(1));
            let t = if r > now {
                after
            } else {
                self.trusted_max = self.trusted_max.max(r);
                r.max(after)
            };
            self.times[i] = t;
            prev = Some(t);
        }
    }

    /// Places every change again, at `now` (a decoded index).
    pub(super) fn settle_all(&mut self, now: i64) {
        self.times = self.recorded.clone();
        self.lead = self.recorded.len();
        self.settle(0, now);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Alias, ROOT_IDX};
    use super::*;

    /// The places of changes recorded at `ts`, each added at its `now`.
    fn placed(ts_now: &[(i64, i64)]) -> HistoryIndex {
        let mut h = HistoryIndex::new();
        for &(ts, now) in ts_now {
            h.place(ts, now);
        }
        h
    }

    #[test]
    fn a_change_dated_after_the_clock_carries_no_later_change_with_it() {
        const F: i64 = 7_258_118_400_000_000_000; // 2200-01-01
        let now = 1_000;
        // An imported part from the future, then changes made since: each
        // keeps its own time, the future one goes right after the one
        // before it, and a time alias names the newest change.
        let h = placed(&[
            (100, now),
            (200, now),
            (300, now),
            (F, now),
            (400, now),
            (500, now),
        ]);
        assert_eq!(h.times, [100, 200, 300, 301, 400, 500]);
        assert_eq!(h.recorded_time_of(4), Some(F), "recorded as it was");
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(now)), Some(6));
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(450)), Some(5));
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(350)), Some(4));
        // A clock stepped back: flattened after the change before, as ever.
        let h = placed(&[(100, now), (200, now), (50, now), (300, now)]);
        assert_eq!(h.times, [100, 200, 201, 300]);
        // Leading changes from the future: just before the first that is
        // not; with none, from the clock on (so `@now` names the newest).
        let h = placed(&[(F, now), (F + 1, now), (100, now), (200, now)]);
        assert_eq!(h.times, [98, 99, 100, 200]);
        let h = placed(&[(F, now)]);
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(now)), Some(1));
        // A live clock that ran ahead and is set back: the changes made
        // meanwhile were placed at their own time, and are placed again
        // after the change before them once a change shows the clock back.
        let h = placed(&[(100, 100), (F, F), (F + 10, F + 10), (200, 200), (300, 300)]);
        assert_eq!(h.times, [100, 101, 102, 200, 300]);
        assert_eq!(h.resolve(ROOT_IDX, Alias::At(250)), Some(4));
        // A fold of the same records at the same clock places them alike.
        let mut again = HistoryIndex::new();
        again.recorded = h.recorded.clone();
        again.settle_all(300);
        assert_eq!(again.times, h.times);
    }
}
