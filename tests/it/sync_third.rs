//! The third replica's rule (`src/sync/third.rs`), on real mounts: a
//! replica that changed neither side of a conflict keeps the side every
//! replica would pick, whatever order it met the two in, and even when it
//! meets one only with its author's word that it kept it; the authors
//! keep their own; every replica lists the path; and a text merged by
//! lines with this tree's own edit is this tree's, never replaced.

use crate::common;

use std::fs;

use common::{Mount, describe, skillfs};

use crate::sync_merge::{conflict_paths, read, root_arg, skill, sync, verify_full};

/// `m` adds the bare repository `hub` (made if missing) as remote `name`.
fn remote(m: &Mount, name: &str, hub: &std::path::Path) {
    if !hub.exists() {
        common::bare_repo(hub);
    }
    let url = hub.to_str().unwrap();
    let out = skillfs(&["remote", "add", name, url, "--root", &root_arg(m)]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// `skillfs sync NAME` of `m`, which must succeed.
fn sync_with(m: &Mount, name: &str) {
    let out = skillfs(&["sync", name, "--root", &root_arg(m)]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// Replicas A, B, … (`N` of them), each with the remotes `wiring` gives
/// it by its index: remote NAME is the bare repository `NAME.git` in A's
/// scratch directory (gone with it), made at its first use.
fn replicas<const N: usize>(tag: &str, wiring: &[(usize, &str)]) -> [Mount; N] {
    let ms: [Mount; N] =
        std::array::from_fn(|i| Mount::new(&format!("{tag}{}", char::from(b'A' + i as u8))));
    let dir = ms[0].root().parent().unwrap().to_path_buf();
    for &(i, name) in wiring {
        remote(&ms[i], name, &dir.join(format!("{name}.git")));
    }
    ms
}

/// The skill every test starts from, written in `a`: its path.
fn first_text(a: &Mount) -> &'static str {
    let md = "k/s/SKILL.md";
    fs::create_dir_all(a.path("k/s")).unwrap();
    fs::write(a.path(md), skill("s", "1\n2\n3\n")).unwrap();
    md
}

/// Replicas A, B and C of one hub.
fn trio(tag: &str) -> [Mount; 3] {
    replicas(tag, &[(0, "hub"), (1, "hub"), (2, "hub")])
}

#[test]
fn two_third_replicas_keep_the_same_side_whatever_order_they_merged_in() {
    // A and B on both hubs, C on the first, D on the second.
    let wiring = [
        (0, "one"),
        (0, "two"),
        (1, "one"),
        (1, "two"),
        (2, "one"),
        (3, "two"),
    ];
    let [a, b, c, d] = replicas("third", &wiring);
    let md = first_text(&a);
    // Everyone has the first text.
    sync_with(&a, "one");
    sync_with(&a, "two");
    for m in [&b, &c, &d] {
        sync(m);
    }
    for m in [&b, &c, &d] {
        assert_eq!(read(m, md), skill("s", "1\n2\n3\n"));
    }
    let (by_a, by_b) = (skill("s", "1 by a\n2\n3\n"), skill("s", "1 by b\n2\n3\n"));
    fs::write(a.path(md), &by_a).unwrap();
    fs::write(b.path(md), &by_b).unwrap();
    // C meets A's side first, D meets B's first: each takes it whole.
    sync_with(&a, "one");
    sync(&c);
    assert_eq!(read(&c, md), by_a);
    sync_with(&b, "two");
    sync(&d);
    assert_eq!(read(&d, md), by_b);
    // Then each meets the other side.
    sync_with(&a, "two");
    sync_with(&b, "one");
    sync(&c);
    sync(&d);
    let live = read(&c, md);
    assert_eq!(read(&d, md), live, "C and D merged in opposite orders");
    assert!(live == by_a || live == by_b, "{live}");
    // A few more rounds of everyone with everything: no side flips.
    for _ in 0..3 {
        for m in [&a, &b] {
            sync_with(m, "one");
            sync_with(m, "two");
        }
        sync(&c);
        sync(&d);
        assert_eq!(read(&a, md), by_a);
        assert_eq!(read(&b, md), by_b);
        assert_eq!(read(&c, md), live);
        assert_eq!(read(&d, md), live);
    }
    // Every replica lists the path (A and B may list it twice: against
    // the other and against a third that passed the other's side on
    // before it met both; a merge never drops a conflict).
    for m in [&a, &b, &c, &d] {
        let mut paths = conflict_paths(m);
        paths.dedup();
        assert_eq!(paths, [md], "{}", m.root().display());
        verify_full(m);
    }
    // The side that is not live is in history, and `--take` on a third
    // replica brings it.
    let out = skillfs(&["sync", "--take", md, "--root", &root_arg(&c)]);
    assert!(out.status.success(), "{}", describe(&out));
    let other = if live == by_a { &by_b } else { &by_a };
    assert_eq!(read(&c, md), *other);
}

/// Two third replicas that each passed a different side on, and sync
/// with each other but never with the replica the other's side came
/// from: they end on the rule's side, not each on its own, even when
/// one meets the other's side only with that replica's word that it
/// kept it (found by review: that one kept its own and listed nothing).
/// A and B keep their own.
#[test]
fn two_third_replicas_that_meet_only_each_other_agree() {
    // A chain: A, hub one, C, hub three, D, hub two, B.
    let wiring = [
        (0, "one"),
        (2, "one"),
        (2, "three"),
        (3, "three"),
        (3, "two"),
        (1, "two"),
    ];
    let [a, b, c, d] = replicas("meet", &wiring);
    let md = first_text(&a);
    // The first text travels A, C, D, B.
    for (m, r) in [(&a, "one"), (&c, "one"), (&c, "three"), (&d, "three")] {
        sync_with(m, r);
    }
    sync_with(&d, "two");
    sync_with(&b, "two");
    assert_eq!(read(&b, md), skill("s", "1\n2\n3\n"));
    let (by_a, by_b) = (skill("s", "1 by a\n2\n3\n"), skill("s", "1 by b\n2\n3\n"));
    fs::write(a.path(md), &by_a).unwrap();
    fs::write(b.path(md), &by_b).unwrap();
    sync_with(&a, "one");
    sync_with(&c, "one");
    sync_with(&b, "two");
    sync_with(&d, "two");
    assert_eq!((read(&c, md), read(&d, md)), (by_a.clone(), by_b.clone()));
    // The one holding the rule's side meets the other's first, keeps its
    // own and says so in its next commit; the other then meets that side
    // only with that word (a merge base that makes it no change).
    let winner = crate::sync_merge::preferred(&by_a, &by_b).to_string();
    let (keeps, told) = if winner == by_a { (&c, &d) } else { (&d, &c) };
    sync_with(told, "three");
    sync_with(keeps, "three");
    // (A change of its own: a commit to carry the word.)
    fs::create_dir_all(keeps.path("k/other")).unwrap();
    fs::write(keeps.path("k/other/SKILL.md"), skill("other", "o\n")).unwrap();
    sync_with(keeps, "three");
    sync_with(told, "three");
    assert_eq!(
        read(told, md),
        winner,
        "told by word, still the rule's side"
    );
    for _ in 0..2 {
        sync_with(&c, "three");
        sync_with(&d, "three");
    }
    let live = read(&c, md);
    assert_eq!(read(&d, md), live);
    assert_eq!(live, winner);
    for _ in 0..3 {
        sync(&a);
        sync(&c);
        sync(&d);
        sync(&b);
    }
    assert_eq!(read(&a, md), by_a);
    assert_eq!(read(&b, md), by_b);
    assert_eq!((read(&c, md), read(&d, md)), (live.clone(), live));
    for m in [&c, &d] {
        let mut paths = conflict_paths(m);
        paths.dedup();
        assert_eq!(paths, [md], "{}", m.root().display());
    }
    for m in [&a, &b, &c, &d] {
        verify_full(m);
    }
}

/// A text merged by lines with this tree's own edit is this tree's, not a
/// side it passed on: a conflict with a third side keeps it live even
/// where the rule would pick the other (found by review: the whole file
/// was replaced, this tree's own line with it).
#[test]
fn a_text_merged_with_this_trees_own_lines_is_not_passed_on() {
    let [a, b, c] = trio("own");
    let md = first_text(&a);
    for m in [&a, &c, &b] {
        sync(m);
    }
    assert_eq!(read(&b, md), skill("s", "1\n2\n3\n"));
    fs::write(c.path(md), skill("s", "1\n2\n3 by c\n")).unwrap();
    fs::write(a.path(md), skill("s", "1 by a\n2\n3\n")).unwrap();
    sync(&c);
    sync(&a);
    sync(&c);
    let mine = skill("s", "1 by a\n2\n3 by c\n");
    assert_eq!(read(&c, md), mine, "merged by lines");
    // B's line 1, chosen so that the rule would pick B's whole text.
    let theirs = (0..)
        .map(|n| skill("s", &format!("1 by b{n}\n2\n3\n")))
        .find(|t| crate::sync_merge::preferred(t, &mine) == t)
        .unwrap();
    fs::write(b.path(md), &theirs).unwrap();
    sync(&b);
    for _ in 0..2 {
        sync(&c);
    }
    assert_eq!(read(&c, md), mine, "this tree's own line stays live");
    assert!(conflict_paths(&c).contains(&md.to_string()));
    verify_full(&c);
}

/// A file this tree wrote itself, which a merge later swapped in again
/// with its skill (the swap gives every file of the skill a version by
/// the merge), is still this tree's own: a conflict there keeps it live
/// even where the rule would pick the other side (found by review).
#[test]
fn a_file_swapped_in_again_with_its_skill_stays_this_trees_own() {
    let [a, b, c] = trio("swap");
    let (md, notes) = ("k/s/SKILL.md", "k/s/notes.md");
    fs::create_dir_all(a.path("k/s")).unwrap();
    fs::write(a.path(md), skill("s", "1\n")).unwrap();
    fs::write(a.path(notes), "n\n").unwrap();
    for m in [&a, &c, &b] {
        sync(m);
    }
    let mine = "notes by c\n".to_string();
    fs::write(c.path(notes), &mine).unwrap();
    sync(&c);
    sync(&a);
    assert_eq!(read(&a, notes), mine);
    fs::write(a.path(md), skill("s", "1 by a\n")).unwrap();
    sync(&a);
    sync(&c);
    assert_eq!(read(&c, md), skill("s", "1 by a\n"));
    // B's notes, chosen so that the rule would pick them.
    let theirs = (0..)
        .map(|n| format!("notes by b{n}\n"))
        .find(|t| crate::sync_merge::preferred(t, &mine) == t)
        .unwrap();
    fs::write(b.path(notes), &theirs).unwrap();
    sync(&b);
    for _ in 0..2 {
        sync(&c);
    }
    assert_eq!(read(&c, notes), mine, "this tree's own file stays live");
    verify_full(&c);
}

/// A text two replicas merged by lines, which one took whole from the
/// other and passed back, is an author's on both: each keeps it against
/// a third side even where the rule would pick that side (found by
/// review: each took it for the other's side, passed on).
#[test]
fn a_text_merged_by_two_and_passed_back_stays_theirs_on_both() {
    let [a, b, c] = trio("back");
    let md = "k/s/SKILL.md";
    fs::create_dir_all(a.path("k/s")).unwrap();
    fs::write(a.path(md), skill("s", "1\n2\n3\n4\n5\n")).unwrap();
    for m in [&a, &c, &b] {
        sync(m);
    }
    fs::write(c.path(md), skill("s", "1 by c\n2\n3\n4\n5\n")).unwrap();
    fs::write(a.path(md), skill("s", "1\n2\n3\n4\n5 by a\n")).unwrap();
    sync(&a);
    sync(&c);
    sync(&a);
    sync(&c);
    let both = skill("s", "1 by c\n2\n3\n4\n5 by a\n");
    assert_eq!((read(&a, md), read(&c, md)), (both.clone(), both.clone()));
    // B's line 1, chosen so that the rule would pick B's whole text.
    let theirs = (0..)
        .map(|n| skill("s", &format!("1 by b{n}\n2\n3\n4\n5\n")))
        .find(|t| crate::sync_merge::preferred(t, &both) == t)
        .unwrap();
    fs::write(b.path(md), &theirs).unwrap();
    sync(&b);
    for _ in 0..2 {
        sync(&a);
        sync(&c);
    }
    assert_eq!(read(&a, md), both, "a's own line stays live");
    assert_eq!(read(&c, md), both, "c's own line stays live");
    for m in [&a, &c] {
        verify_full(m);
    }
}
