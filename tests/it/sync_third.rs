//! The third replica's rule, on four mounts: replicas A and B edit one
//! line of a skill differently; C and D changed nothing there and meet
//! the two sides in opposite orders (each syncs with its own hub, which
//! A and B reach one at a time). Both end with the same side live, the
//! one every replica computes alike; A and B each keep their own; all
//! four list the conflict; and no later sync makes A or B take the other
//! side back as a plain change.

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

#[test]
fn two_third_replicas_keep_the_same_side_whatever_order_they_merged_in() {
    let a = Mount::new("thirdA");
    let b = Mount::new("thirdB");
    let c = Mount::new("thirdC");
    let d = Mount::new("thirdD");
    let dir = a.root().parent().unwrap().to_path_buf();
    let (one, two) = (dir.join("hub1.git"), dir.join("hub2.git"));
    for m in [&a, &b] {
        remote(m, "one", &one);
        remote(m, "two", &two);
    }
    remote(&c, "one", &one);
    remote(&d, "two", &two);
    let md = "k/s/SKILL.md";
    fs::create_dir_all(a.path("k/s")).unwrap();
    fs::write(a.path(md), skill("s", "1\n2\n3\n")).unwrap();
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
