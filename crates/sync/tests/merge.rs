//! The merge on random histories: a base of skills, two replicas' edits
//! of it (lines changed, files added and deleted, skills added, deleted
//! and renamed, frontmatter broken, binary files), merged both ways. The
//! module doc of `merge` states what must hold; each property is checked
//! on every seed. `SKILLFS_MERGE_SEED=<n>` replays one, and
//! `SKILLFS_MERGE_ROUNDS=<n>` runs more.

use std::collections::{BTreeSet, HashMap};

use sha2::{Digest, Sha256};
use skillfs_sync::merge::{Contents, Merged, Reason, Side, Third, merge, merge_passing};
use skillfs_sync::tree::{Entry, Tree, within};

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Default)]
struct Blobs(HashMap<String, Vec<u8>>);

impl Blobs {
    fn put(&mut self, bytes: Vec<u8>) -> String {
        let h: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.0.insert(h.clone(), bytes);
        h
    }
}

impl Contents for Blobs {
    fn read(&self, blob: &str) -> Option<Vec<u8>> {
        self.0.get(blob).cloned()
    }
}

fn file(blobs: &mut Blobs, text: &str) -> Entry {
    Entry::File {
        blob: blobs.put(text.as_bytes().to_vec()),
        exec: false,
    }
}

fn skill_md(name: &str, lines: usize, rng: &mut Rng) -> String {
    let mut s = format!("---\nname: {name}\ndescription: d\n---\n# {name}\n");
    for i in 0..lines {
        s.push_str(&format!("line {i} {}\n", rng.below(3)));
    }
    s
}

fn base(blobs: &mut Blobs, rng: &mut Rng) -> Tree {
    let mut t = Tree::new();
    for s in 0..4 {
        let name = format!("s{s}");
        if s == 3 {
            t.insert(
                b"cat/s3/run.sh",
                Entry::File {
                    blob: blobs.put(b"echo\n".to_vec()),
                    exec: true,
                },
            );
        }
        t.insert(
            format!("cat/{name}/SKILL.md").as_bytes(),
            file(blobs, &skill_md(&name, 12, rng)),
        );
        if rng.below(2) == 0 {
            t.insert(
                format!("cat/{name}/references/r.md").as_bytes(),
                file(blobs, "ref\n"),
            );
        }
    }
    t.insert(b"DESCRIPTION.md", file(blobs, "top\n"));
    t
}

/// One replica's random edits of `t`.
fn edit(t: &Tree, blobs: &mut Blobs, rng: &mut Rng, who: &str) -> Tree {
    let mut t = t.clone();
    for _ in 0..1 + rng.below(4) {
        let files: Vec<Vec<u8>> = t
            .iter()
            .filter(|(_, e)| matches!(e, Entry::File { .. }))
            .map(|(p, _)| p.to_vec())
            .collect();
        let skills: Vec<Vec<u8>> = skillfs_sync::skill::roots(&t);
        match rng.below(9) {
            // A line of a text changed.
            0..=2 if !files.is_empty() => {
                let p = &files[rng.below(files.len())];
                let Some(Entry::File { blob, .. }) = t.get(p) else {
                    continue;
                };
                let Ok(text) = String::from_utf8(blobs.read(blob).unwrap()) else {
                    continue;
                };
                let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
                let i = rng.below(lines.len() + 1);
                if i < lines.len() && i > 4 {
                    lines[i] = format!("{who} {}", rng.next() % 100);
                } else {
                    lines.push(format!("{who} added {}", rng.next() % 100));
                }
                let e = file(blobs, &(lines.join("\n") + "\n"));
                t.insert(p, e);
            }
            // A file deleted.
            3 if !files.is_empty() => {
                let p = files[rng.below(files.len())].clone();
                t = without(&t, &p);
            }
            // A file added (sometimes binary).
            4 if !skills.is_empty() => {
                let s = &skills[rng.below(skills.len())];
                let mut p = s.clone();
                p.extend_from_slice(format!("/assets/{who}{}.bin", rng.below(3)).as_bytes());
                let bytes = if rng.below(2) == 0 {
                    vec![0, 1, 2, rng.next() as u8]
                } else {
                    format!("{who}\n").into_bytes()
                };
                t.insert(
                    &p,
                    Entry::File {
                        blob: blobs.put(bytes),
                        exec: false,
                    },
                );
            }
            // A skill deleted, or renamed (its directory moved).
            5 if !skills.is_empty() => {
                let s = skills[rng.below(skills.len())].clone();
                let moved: Vec<(Vec<u8>, Entry)> = t
                    .subtree(&s)
                    .into_iter()
                    .map(|(p, e)| (p.to_vec(), e.clone()))
                    .collect();
                t = without(&t, &s);
                if rng.below(2) == 0 {
                    let to = format!("cat2/{who}{}", rng.below(2)).into_bytes();
                    for (p, e) in moved {
                        let mut q = to.clone();
                        q.extend_from_slice(&p[s.len()..]);
                        t.insert(&q, e);
                    }
                }
            }
            // A new skill, its name sometimes one that exists.
            6 => {
                let name = format!("s{}", rng.below(6));
                t.insert(
                    format!("new/{who}{name}/SKILL.md").as_bytes(),
                    file(blobs, &skill_md(&name, 3, rng)),
                );
            }
            // An executable bit changed, alone.
            7 if !files.is_empty() && rng.below(2) == 0 => {
                let p = &files[rng.below(files.len())];
                if let Some(Entry::File { blob, exec }) = t.get(p).cloned() {
                    t.insert(p, Entry::File { blob, exec: !exec });
                }
            }
            // A skill inside a skill.
            7 if !skills.is_empty() && rng.below(2) == 0 => {
                let mut p = skills[rng.below(skills.len())].clone();
                p.extend_from_slice(format!("/inner/{who}/SKILL.md").as_bytes());
                t.insert(&p, file(blobs, &skill_md(&format!("in{who}"), 3, rng)));
            }
            // A frontmatter broken.
            _ if !skills.is_empty() => {
                let mut p = skills[rng.below(skills.len())].clone();
                p.extend_from_slice(b"/SKILL.md");
                let e = file(blobs, "no frontmatter now\n");
                t.insert(&p, e);
            }
            _ => {}
        }
    }
    t
}

fn without(t: &Tree, dir: &[u8]) -> Tree {
    let mut out = Tree::new();
    for (p, e) in t.iter().filter(|(p, _)| !within(p, dir)) {
        out.insert(p, e.clone());
    }
    out
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("SKILLFS_MERGE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("SKILLFS_MERGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    (1..=n).collect()
}

fn conflict_paths(m: &Merged) -> BTreeSet<Vec<u8>> {
    m.conflicts.iter().map(|c| c.path.clone()).collect()
}

/// Every entry `side` changed from `base` is in the result, merged into a
/// new text, or in a conflict that says `side` lost it.
fn nothing_lost(base: &Tree, side: &Tree, who: Side, m: &Merged, seed: u64) {
    let paths: BTreeSet<&[u8]> = base.iter().chain(side.iter()).map(|(p, _)| p).collect();
    for p in paths {
        let (b, s) = (base.get(p), side.get(p));
        if b == s {
            continue;
        }
        let kept = m.tree.get(p) == s;
        let merged = matches!(m.tree.get(p), Some(Entry::File { blob, .. })
            if m.new_blobs.iter().any(|(h, _)| h == blob));
        let lost = m.conflicts.iter().any(|c| {
            c.lost == who
                && within(p, &c.path)
                && c.entries.iter().find(|(q, _)| q == p).map(|(_, e)| e) == s
        });
        // A directory the side deleted, whose other side kept entries in
        // it, stays: the modify beats the delete.
        let dir_kept = s.is_none() && b == Some(&Entry::Dir) && m.tree.get(p) == Some(&Entry::Dir);
        assert!(
            kept || merged || lost || dir_kept,
            "seed {seed}: {:?}'s change at {} ({:?} -> {:?}) is lost: result {:?}",
            who,
            String::from_utf8_lossy(p),
            b,
            s,
            m.tree.get(p)
        );
    }
}

#[test]
fn a_merge_loses_nothing_and_both_replicas_agree_outside_their_conflicts() {
    let mut conflicts = 0;
    for seed in seeds() {
        let mut rng = Rng(seed);
        let mut blobs = Blobs::default();
        let b = base(&mut blobs, &mut rng);
        let o = edit(&b, &mut blobs, &mut rng, "a");
        let t = edit(&b, &mut blobs, &mut rng, "b");
        let ab = merge(&b, &o, &t, &blobs);
        let ba = merge(&b, &t, &o, &blobs);
        assert!(
            ab.tree.is_whole() && ba.tree.is_whole(),
            "seed {seed}: not whole"
        );
        nothing_lost(&b, &o, Side::Ours, &ab, seed);
        nothing_lost(&b, &t, Side::Theirs, &ab, seed);
        nothing_lost(&b, &t, Side::Ours, &ba, seed);
        nothing_lost(&b, &o, Side::Theirs, &ba, seed);
        // A third replica that passed every file on, either way round:
        // nothing lost, and a file both sides changed is the same in both
        // unless a check put a whole unit back.
        let (all, none) = (|_: &[u8]| true, |_: &[u8]| false);
        let third = Third {
            passed_on: &all,
            contested: &none,
        };
        let (tab, tba) = (
            merge_passing(&b, &o, &t, &blobs, &third),
            merge_passing(&b, &t, &o, &blobs, &third),
        );
        assert!(tab.tree.is_whole() && tba.tree.is_whole(), "seed {seed}");
        nothing_lost(&b, &o, Side::Ours, &tab, seed);
        nothing_lost(&b, &t, Side::Theirs, &tab, seed);
        nothing_lost(&b, &t, Side::Ours, &tba, seed);
        nothing_lost(&b, &o, Side::Theirs, &tba, seed);
        let picked = |m: &Merged| -> BTreeSet<Vec<u8>> {
            m.conflicts
                .iter()
                .filter(|c| matches!(c.reason, Reason::Overlap | Reason::Binary | Reason::Kind))
                .map(|c| c.path.clone())
                .collect()
        };
        for p in picked(&tab).intersection(&picked(&tba)) {
            assert_eq!(
                tab.tree.get(p),
                tba.tree.get(p),
                "seed {seed}: a third replica's pick at {} depends on the order",
                String::from_utf8_lossy(p)
            );
        }
        // Both replicas find the same conflicts, and agree elsewhere (but
        // for a name clash the merge made: each keeps its own skill live,
        // a documented limit).
        let clash = |m: &Merged| -> BTreeSet<Vec<u8>> {
            m.conflicts
                .iter()
                .filter(|c| matches!(&c.reason, Reason::Check(w) if w.starts_with("two skills")))
                .map(|c| c.path.clone())
                .collect()
        };
        let clashes: BTreeSet<Vec<u8>> = clash(&ab).union(&clash(&ba)).cloned().collect();
        let others = |m: &Merged| -> BTreeSet<Vec<u8>> {
            conflict_paths(m)
                .into_iter()
                .filter(|p| !clashes.iter().any(|c| within(p, c)))
                .collect()
        };
        assert_eq!(
            others(&ab),
            others(&ba),
            "seed {seed}: {:?} / {:?}",
            ab.conflicts
                .iter()
                .map(|c| (
                    String::from_utf8_lossy(&c.path).into_owned(),
                    c.reason.clone()
                ))
                .collect::<Vec<_>>(),
            ba.conflicts
                .iter()
                .map(|c| (
                    String::from_utf8_lossy(&c.path).into_owned(),
                    c.reason.clone()
                ))
                .collect::<Vec<_>>()
        );
        let all: BTreeSet<Vec<u8>> = conflict_paths(&ab)
            .union(&conflict_paths(&ba))
            .cloned()
            .collect();
        let outside = |m: &Merged| -> Vec<(Vec<u8>, Entry)> {
            m.tree
                .iter()
                .filter(|(p, _)| !all.iter().any(|c| within(p, c) || within(c, p)))
                .map(|(p, e)| (p.to_vec(), e.clone()))
                .collect()
        };
        assert_eq!(
            outside(&ab),
            outside(&ba),
            "seed {seed}: the replicas differ outside conflicts"
        );
        // No two skills share a name unless a side already had them so.
        for (m, ours) in [(&ab, &o), (&ba, &t)] {
            let names = |tree: &Tree| -> Vec<String> {
                let mut v: Vec<String> = skillfs_sync::skill::roots(tree)
                    .iter()
                    .map(|r| {
                        let mut p = r.clone();
                        p.extend_from_slice(b"/SKILL.md");
                        let text = match tree.get(&p) {
                            Some(Entry::File { blob, .. }) => m
                                .new_blobs
                                .iter()
                                .find(|(h, _)| h == blob)
                                .map(|(_, b)| b.clone())
                                .or_else(|| blobs.read(blob))
                                .and_then(|b| String::from_utf8(b).ok()),
                            _ => None,
                        };
                        skillfs_sync::skill::skill_name(r, text.as_deref())
                    })
                    .collect();
                v.sort();
                v
            };
            let count = |v: Vec<String>| {
                let mut n: HashMap<String, usize> = HashMap::new();
                v.into_iter().for_each(|s| *n.entry(s).or_default() += 1);
                n
            };
            let theirs = if std::ptr::eq(ours, &o) { &t } else { &o };
            let (nm, no, nt) = (
                count(names(&m.tree)),
                count(names(ours)),
                count(names(theirs)),
            );
            for (name, k) in nm {
                let had = |n: &HashMap<String, usize>| n.get(&name).copied().unwrap_or(0);
                assert!(
                    k <= had(&no).max(had(&nt)).max(1),
                    "seed {seed}: the merge made two skills named {name}"
                );
            }
        }
        conflicts += ab.conflicts.len();
    }
    // The histories are random enough to exercise the conflict paths.
    assert!(conflicts > 0 || seeds().len() < 100);
}

#[test]
fn a_side_that_changed_nothing_gives_the_other_exactly() {
    for seed in seeds().into_iter().take(500) {
        let mut rng = Rng(seed);
        let mut blobs = Blobs::default();
        let b = base(&mut blobs, &mut rng);
        let o = edit(&b, &mut blobs, &mut rng, "a");
        for (m, want) in [
            (merge(&b, &o, &b, &blobs), &o),
            (merge(&b, &b, &o, &blobs), &o),
            (merge(&b, &o, &o, &blobs), &o),
        ] {
            assert_eq!(&m.tree, want, "seed {seed}");
            assert!(
                m.conflicts.is_empty() && m.new_blobs.is_empty(),
                "seed {seed}"
            );
        }
    }
}

#[test]
fn the_cases_the_merge_decides() {
    let mut blobs = Blobs::default();
    let md = |blobs: &mut Blobs, body: &str| file(blobs, &format!("---\nname: x\n---\n{body}"));
    let mut b = Tree::new();
    b.insert(b"c/x/SKILL.md", md(&mut blobs, "1\n2\n3\n4\n5\n6\n"));
    b.insert(b"c/x/scripts/run.sh", file(&mut blobs, "echo\n"));
    // Lines apart: both kept, in a new text.
    let mut o = b.clone();
    o.insert(b"c/x/SKILL.md", md(&mut blobs, "ONE\n2\n3\n4\n5\n6\n"));
    let mut t = b.clone();
    t.insert(b"c/x/SKILL.md", md(&mut blobs, "1\n2\n3\n4\n5\nSIX\n"));
    let m = merge(&b, &o, &t, &blobs);
    assert!(m.conflicts.is_empty());
    let Some(Entry::File { blob, .. }) = m.tree.get(b"c/x/SKILL.md") else {
        panic!()
    };
    let merged = &m.new_blobs.iter().find(|(h, _)| h == blob).unwrap().1;
    assert_eq!(merged, b"---\nname: x\n---\nONE\n2\n3\n4\n5\nSIX\n");
    // The same line: ours stays, theirs is the conflict.
    let mut t2 = b.clone();
    t2.insert(b"c/x/SKILL.md", md(&mut blobs, "uno\n2\n3\n4\n5\n6\n"));
    let m = merge(&b, &o, &t2, &blobs);
    assert_eq!(m.tree.get(b"c/x/SKILL.md"), o.get(b"c/x/SKILL.md"));
    assert_eq!(m.conflicts.len(), 1);
    assert_eq!(
        (m.conflicts[0].reason.clone(), m.conflicts[0].lost),
        (Reason::Overlap, Side::Theirs)
    );
    assert_eq!(
        m.conflicts[0].entries[0].1,
        t2.get(b"c/x/SKILL.md").unwrap().clone()
    );
    // A delete against a modify: the modify stays, whichever side.
    let mut del = b.clone();
    del = {
        let mut d = Tree::new();
        for (p, e) in del.iter().filter(|(p, _)| *p != b"c/x/scripts/run.sh") {
            d.insert(p, e.clone());
        }
        d
    };
    del.insert(b"c/x/SKILL.md", md(&mut blobs, "1\n2\n3\n4\n5\n6\nmore\n"));
    let mut modi = b.clone();
    modi.insert(b"c/x/scripts/run.sh", file(&mut blobs, "echo changed\n"));
    for (ours, theirs, lost) in [(&del, &modi, Side::Ours), (&modi, &del, Side::Theirs)] {
        let m = merge(&b, ours, theirs, &blobs);
        assert_eq!(
            m.tree.get(b"c/x/scripts/run.sh"),
            modi.get(b"c/x/scripts/run.sh")
        );
        let c = m
            .conflicts
            .iter()
            .find(|c| c.path == b"c/x/scripts/run.sh")
            .unwrap();
        assert_eq!(
            (c.reason.clone(), c.lost, c.entries.len()),
            (Reason::DeleteModify, lost, 0)
        );
    }
}

/// A third replica that only passed a file on (it took one replica's
/// side and did not change it) keeps the side `prefer` names, whichever
/// of the two it holds: two third replicas that merged the two in
/// opposite orders end alike, each with the other side as its conflict.
/// One that changed the file itself keeps its own.
#[test]
fn a_third_replica_keeps_the_side_every_replica_would() {
    use skillfs_sync::merge::prefer;
    let mut blobs = Blobs::default();
    let md = |blobs: &mut Blobs, body: &str| file(blobs, &format!("---\nname: x\n---\n{body}"));
    let at = |t: &Tree| t.get(b"c/x/SKILL.md").cloned().unwrap();
    let mut b = Tree::new();
    b.insert(b"c/x/SKILL.md", md(&mut blobs, "1\n2\n"));
    let (mut a, mut c) = (b.clone(), b.clone());
    a.insert(b"c/x/SKILL.md", md(&mut blobs, "from a\n2\n"));
    c.insert(b"c/x/SKILL.md", md(&mut blobs, "from b\n2\n"));
    let winner = if prefer(&at(&a), &at(&c)) { &a } else { &c };
    let mut lives = Vec::new();
    for (ours, theirs) in [(&a, &c), (&c, &a)] {
        let third = Third {
            passed_on: &|p| p == b"c/x/SKILL.md",
            contested: &|_| false,
        };
        let m = merge_passing(&b, ours, theirs, &blobs, &third);
        assert_eq!(m.tree.get(b"c/x/SKILL.md"), Some(&at(winner)));
        assert_eq!(m.conflicts.len(), 1);
        let lost = &m.conflicts[0];
        assert_eq!(lost.reason, Reason::Overlap);
        let loser = if std::ptr::eq(winner, ours) {
            theirs
        } else {
            ours
        };
        let side = if std::ptr::eq(loser, ours) {
            Side::Ours
        } else {
            Side::Theirs
        };
        assert_eq!((lost.lost, &lost.entries[0].1), (side, &at(loser)));
        lives.push(m.tree);
    }
    assert_eq!(lives[0], lives[1]);
    // Contested (no base there): decided whole, even where a merge by
    // lines or by the executable bit alone would take one side silently.
    let mut none_base = Tree::new();
    none_base.insert(b"c/x", Entry::Dir);
    let empty = file(&mut blobs, "");
    let exec = |e: &Entry| match e {
        Entry::File { blob, .. } => Entry::File {
            blob: blob.clone(),
            exec: true,
        },
        e => e.clone(),
    };
    let y = at(&c);
    for (mine, other) in [(empty.clone(), y.clone()), (y.clone(), exec(&y))] {
        let (mut o, mut t) = (none_base.clone(), none_base.clone());
        o.insert(b"c/x/SKILL.md", mine.clone());
        t.insert(b"c/x/SKILL.md", other.clone());
        let third = Third {
            passed_on: &|_| true,
            contested: &|_| true,
        };
        let m = merge_passing(&none_base, &o, &t, &blobs, &third);
        let win = if prefer(&other, &mine) { &other } else { &mine };
        assert_eq!(m.tree.get(b"c/x/SKILL.md"), Some(win));
        assert_eq!(m.conflicts.len(), 1, "{:?}", m.conflicts);
    }
    // This tree's own change (nothing passed on): ours, as ever.
    for (ours, theirs) in [(&a, &c), (&c, &a)] {
        let none = |_: &[u8]| false;
        let third = Third {
            passed_on: &none,
            contested: &none,
        };
        let m = merge_passing(&b, ours, theirs, &blobs, &third);
        assert_eq!(m.tree.get(b"c/x/SKILL.md"), Some(&at(ours)));
        assert_eq!(m.conflicts[0].lost, Side::Theirs);
    }
}
