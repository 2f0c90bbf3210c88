//! Which contents a history still shows, once ids are forgotten: the blob
//! of every version that some kept id shows.
//!
//! A version of a path (its state from id `a` until its next version at
//! `b`, or for good) is shown by every kept id in `a..b`; it is live if
//! there is one. A forgotten version between two kept ids that the next
//! version replaced before the next kept id is shown by none: its blob is
//! dead, unless another live version names the same content.
//!
//! Invariant: the newest id is never forgotten (`retention::select`), so
//! the newest version of every path that exists is live.
//!
//! Locks: none; the caller holds the ledger's lock around the index.

use std::collections::HashSet;

use crate::history::{HistoryIndex, PathIdx};

/// The contents (raw SHA-256) of every version some kept id shows.
pub fn live_blobs(h: &HistoryIndex) -> HashSet<[u8; 32]> {
    live_blobs_if(h, &[])
}

/// [`live_blobs`] as it would be with `extra` (inclusive ranges) forgotten
/// too: what a dry run compares.
pub fn live_blobs_if(h: &HistoryIndex, extra: &[[u64; 2]]) -> HashSet<[u8; 32]> {
    let mut gone: Vec<(u64, u64)> = h.forgotten_ranges().to_vec();
    gone.extend(extra.iter().map(|r| (r[0], r[1])));
    gone.sort_unstable();
    let last = h.last();
    let mut live = HashSet::new();
    for idx in 0..h.path_count() as PathIdx {
        let v = h.versions(idx);
        for (i, (from, state)) in v.iter().enumerate() {
            let Some(blob) = state.as_ref().and_then(|s| s.blob.as_deref()) else {
                continue;
            };
            // Shown by a kept id in from..=until (until: before the next
            // version).
            let until = v.get(i + 1).map_or(last, |(next, _)| next - 1);
            if shown(&gone, *from, until)
                && let Some(raw) = raw_of(blob)
            {
                live.insert(raw);
            }
        }
    }
    live
}

/// Whether some id in `from..=until` is outside the sorted ranges `gone`.
fn shown(gone: &[(u64, u64)], from: u64, until: u64) -> bool {
    // The ranges that may cover `from` start at or before it; covered
    // ranges may overlap (the extra ones are not merged in).
    let mut id = from;
    let mut k = gone.partition_point(|r| r.0 <= id);
    let mut reach = gone[..k].iter().map(|r| r.1).max();
    loop {
        match reach {
            Some(end) if end >= id => id = end.saturating_add(1),
            _ => return id <= until,
        }
        if id > until {
            return false;
        }
        // Ranges starting by the new `id` may carry it further.
        let start = k;
        k = gone.partition_point(|r| r.0 <= id);
        reach = gone[start..k].iter().map(|r| r.1).max();
    }
}

/// The raw SHA-256 of a hex blob id.
pub use skillfs_store::blobs::raw_id as raw_of;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Fold;
    use skillfs_store::journal::{EntryState, Kind, Op, Record};

    fn write(seq: u64, path: &str, blob: u8) -> Record {
        let hex = format!("{blob:02x}").repeat(32);
        Record::sample(
            seq,
            seq as i64,
            Op::Write,
            path,
            None,
            Some(EntryState::sample(Kind::File, &hex)),
        )
    }

    #[test]
    fn a_version_is_live_while_a_kept_id_shows_it() {
        // f: 1@1, 2@2, 3@4; g: 9@3. Forget 1..=3: f's 1 and 2 are
        // replaced before 4 (kept); g's 9 is still shown at 4.
        let recs = [
            write(1, "f", 1),
            write(2, "f", 2),
            write(3, "g", 9),
            write(4, "f", 3),
        ];
        let mut h = Fold::replay(&recs).into_history();
        let all = live_blobs(&h);
        assert_eq!(all.len(), 4);
        h.forget(&[[1, 3]]);
        let live = live_blobs(&h);
        let has = |b: u8| live.contains(&[b; 32]);
        assert!(!has(1) && !has(2), "replaced before the next kept id");
        assert!(has(9) && has(3));
        // Keeping 2 keeps what it shows: f's 2 and nothing else of f.
        let mut h = Fold::replay(&recs).into_history();
        h.forget(&[[1, 1], [3, 3]]);
        let live = live_blobs(&h);
        assert!(live.contains(&[2; 32]) && !live.contains(&[1; 32]));
        assert!(live.contains(&[9; 32]), "g's 9 is shown at 4");
    }
}
