//! A three-way merge of text by lines, as `git merge-file` does it: the
//! changes each side made to the base are found (Myers' diff), and where
//! they touch the same lines of the base and differ, the merge fails for
//! that text (a conflict); elsewhere both are applied.
//!
//! Invariants: a side that changed nothing gives the other side, byte for
//! byte; two sides that made the same change give it once; changes that
//! touch, even without overlapping (an edit right after another), are a
//! conflict (conservative: a conflict loses nothing, it keeps one side and
//! records the other). No conflict markers are ever written into a result.
//!
//! Locks: none; a pure function.

use similar::{Algorithm, DiffOp, capture_diff_slices};

/// One side's change to the base: base lines `start..end` replaced by
/// `lines` of that side.
#[derive(Debug, Clone)]
struct Hunk<'a> {
    start: usize,
    end: usize,
    lines: &'a [&'a str],
}

fn hunks<'a>(base: &[&str], side: &'a [&'a str]) -> Vec<Hunk<'a>> {
    capture_diff_slices(Algorithm::Myers, base, side)
        .into_iter()
        .filter_map(|op| match op {
            DiffOp::Equal { .. } => None,
            DiffOp::Delete {
                old_index,
                old_len,
                new_index,
            } => Some(Hunk {
                start: old_index,
                end: old_index + old_len,
                lines: &side[new_index..new_index],
            }),
            DiffOp::Insert {
                old_index,
                new_index,
                new_len,
            } => Some(Hunk {
                start: old_index,
                end: old_index,
                lines: &side[new_index..new_index + new_len],
            }),
            DiffOp::Replace {
                old_index,
                old_len,
                new_index,
                new_len,
            } => Some(Hunk {
                start: old_index,
                end: old_index + old_len,
                lines: &side[new_index..new_index + new_len],
            }),
        })
        .collect()
}

/// `base[start..end]` as one side has it: its hunks in that range applied.
fn render(base: &[&str], start: usize, end: usize, hs: &[&Hunk<'_>], out: &mut String) {
    let mut at = start;
    for h in hs {
        base[at..h.start].iter().for_each(|l| out.push_str(l));
        h.lines.iter().for_each(|l| out.push_str(l));
        at = h.end;
    }
    base[at..end].iter().for_each(|l| out.push_str(l));
}

/// The lines of `s`, each with its line end (the last may have none).
fn lines(s: &str) -> Vec<&str> {
    s.split_inclusive('\n').collect()
}

/// Merges `ours` and `theirs`, two edits of `base`: the merged text, or
/// `None` when their changes touch the same lines and differ.
pub fn merge(base: &str, ours: &str, theirs: &str) -> Option<String> {
    if ours == theirs || theirs == base {
        return Some(ours.to_string());
    }
    if ours == base {
        return Some(theirs.to_string());
    }
    let (b, o, t) = (lines(base), lines(ours), lines(theirs));
    let (ho, ht) = (hunks(&b, &o), hunks(&b, &t));
    // Every hunk of both sides, by where it starts in the base; groups of
    // hunks that overlap or touch are resolved together.
    let mut all: Vec<(bool, &Hunk<'_>)> = ho
        .iter()
        .map(|h| (true, h))
        .chain(ht.iter().map(|h| (false, h)))
        .collect();
    all.sort_by_key(|(ours, h)| (h.start, h.end, !*ours));
    let mut out = String::with_capacity(ours.len().max(theirs.len()));
    let mut at = 0;
    let mut i = 0;
    while i < all.len() {
        let start = all[i].1.start;
        let mut end = all[i].1.end;
        let mut j = i + 1;
        while j < all.len() && all[j].1.start <= end {
            end = end.max(all[j].1.end);
            j += 1;
        }
        let group = &all[i..j];
        let mine: Vec<&Hunk<'_>> = group.iter().filter(|g| g.0).map(|g| g.1).collect();
        let other: Vec<&Hunk<'_>> = group.iter().filter(|g| !g.0).map(|g| g.1).collect();
        b[at..start].iter().for_each(|l| out.push_str(l));
        if other.is_empty() {
            render(&b, start, end, &mine, &mut out);
        } else if mine.is_empty() {
            render(&b, start, end, &other, &mut out);
        } else {
            let (mut a, mut c) = (String::new(), String::new());
            render(&b, start, end, &mine, &mut a);
            render(&b, start, end, &other, &mut c);
            if a != c {
                return None;
            }
            out.push_str(&a);
        }
        at = end;
        i = j;
    }
    b[at..].iter().for_each(|l| out.push_str(l));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::merge;

    #[test]
    fn a_side_that_changed_nothing_gives_the_other() {
        let b = "a\nb\nc\n";
        assert_eq!(merge(b, "a\nB\nc\n", b).as_deref(), Some("a\nB\nc\n"));
        assert_eq!(merge(b, b, "a\nb\nc\nd").as_deref(), Some("a\nb\nc\nd"));
        assert_eq!(merge(b, "x\n", "x\n").as_deref(), Some("x\n"));
    }

    #[test]
    fn changes_apart_are_both_applied() {
        let b = "1\n2\n3\n4\n5\n6\n7\n";
        let o = "one\n2\n3\n4\n5\n6\n7\n";
        let t = "1\n2\n3\n4\n5\n6\nseven\neight\n";
        assert_eq!(
            merge(b, o, t).as_deref(),
            Some("one\n2\n3\n4\n5\n6\nseven\neight\n")
        );
        // An insertion on one side, a deletion on the other, apart.
        let o = "0\n1\n2\n3\n4\n5\n6\n7\n";
        let t = "1\n2\n3\n4\n6\n7\n";
        assert_eq!(merge(b, o, t).as_deref(), Some("0\n1\n2\n3\n4\n6\n7\n"));
    }

    #[test]
    fn the_same_change_on_both_sides_is_made_once() {
        let b = "1\n2\n3\n4\n5\n";
        let o = "1\nTWO\n3\n4\nfive\n";
        let t = "1\nTWO\n3\n4\n5\n";
        assert_eq!(merge(b, o, t).as_deref(), Some(o));
    }

    #[test]
    fn changes_that_overlap_or_touch_are_a_conflict() {
        let b = "1\n2\n3\n";
        assert_eq!(merge(b, "1\nX\n3\n", "1\nY\n3\n"), None);
        // Adjacent lines: git merge-file conflicts too.
        assert_eq!(merge(b, "1\nX\n3\n", "1\n2\nY\n"), None);
        // Both insert at the same place, different lines.
        assert_eq!(merge(b, "1\n2\n3\nA\n", "1\n2\n3\nB\n"), None);
        // A file without a final newline, each side changing the end.
        assert_eq!(merge("a", "a b", "a c"), None);
    }
}
