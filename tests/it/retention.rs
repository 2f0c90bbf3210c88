//! `skillfs forget`: kept ids keep their exact trees (compared through
//! `.history/<id>` before and after, mounted and remounted), forgotten ids
//! leave `.history` and `log`, their bytes are freed, and a kill at any
//! point of a forget leaves a store that verifies and holds everything
//! the policy keeps; a rerun finishes the job.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Mount, Rng, assert_refused, describe, seed, skillfs};

/// One entry of a tree: kind, mode, mtime, and bytes or link target.
type Tree = BTreeMap<String, (char, u32, i64, Vec<u8>)>;

fn tree(dir: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let mtime = m.mtime() * 1_000_000_000 + m.mtime_nsec();
            let entry = if m.file_type().is_symlink() {
                (
                    'l',
                    0,
                    mtime,
                    fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else if m.is_dir() {
                stack.push(p.clone());
                ('d', m.mode() & 0o7777, mtime, Vec::new())
            } else {
                ('f', m.mode() & 0o7777, mtime, fs::read(&p).unwrap())
            };
            out.insert(rel, entry);
        }
    }
    out
}

/// Every id's tree, read through `.history/<id>`.
fn all_trees(m: &Mount) -> BTreeMap<u64, Tree> {
    let h = m.path(".history");
    let mut ids: Vec<u64> = fs::read_dir(&h)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    ids.sort_unstable();
    ids.into_iter()
        .map(|id| (id, tree(&h.join(id.to_string()))))
        .collect()
}

/// A history of small and large versions, a removal and a rename.
fn make_history(m: &Mount, rng: &mut Rng) {
    fs::create_dir_all(m.path("cat/foo")).unwrap();
    fs::create_dir_all(m.path("cat/bar")).unwrap();
    for round in 0..6 {
        for f in ["cat/foo/SKILL.md", "cat/bar/SKILL.md", "cat/foo/notes.md"] {
            let body = format!("{f} round {round} {}\n", rng.next()).repeat(1 + rng.below(50));
            fs::write(m.path(f), body).unwrap();
        }
        // Large contents: past the 128 KiB of a pack entry, in chunks.
        let big: Vec<u8> = (0..200_000u32)
            .map(|i| (i as u64 ^ rng.next()) as u8)
            .collect();
        fs::write(m.path("cat/foo/data.bin"), big).unwrap();
        if round == 2 {
            symlink("SKILL.md", m.path("cat/foo/link")).unwrap();
            fs::write(m.path("cat/gone.md"), "soon gone\n").unwrap();
        }
        if round == 3 {
            fs::remove_file(m.path("cat/gone.md")).unwrap();
            fs::rename(m.path("cat/bar"), m.path("cat/baz")).unwrap();
            fs::create_dir(m.path("cat/bar")).unwrap();
        }
    }
}

fn store_bytes(store: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![store.join("blobs")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.len();
            }
        }
    }
    total
}

/// The bytes of the distinct file contents that only forgotten trees show.
/// The contents only forgotten trees show.
fn dead_contents(before: &BTreeMap<u64, Tree>, kept: &[u64]) -> Vec<Vec<u8>> {
    let contents = |keep: bool| -> std::collections::HashSet<Vec<u8>> {
        before
            .iter()
            .filter(|(id, _)| kept.contains(id) == keep)
            .flat_map(|(_, t)| t.values().filter(|e| e.0 == 'f').map(|e| e.3.clone()))
            .collect()
    };
    let live = contents(true);
    contents(false)
        .into_iter()
        .filter(|c| !live.contains(c))
        .collect()
}

fn root_arg(m: &Mount) -> String {
    m.root().display().to_string()
}

fn forget(m: &Mount, policy: &[&str]) -> std::process::Output {
    let root = root_arg(m);
    let mut args = vec!["forget", "--root", &root];
    args.extend_from_slice(policy);
    skillfs(&args)
}

fn assert_verifies(m: &Mount) {
    let root = root_arg(m);
    let out = skillfs(&["verify", "--full", "--root", &root]);
    assert!(
        out.status.success(),
        "verify after forget:\n{}",
        describe(&out)
    );
}

/// The kept ids' trees equal `before`'s; every other id answers ENOENT.
fn assert_kept(m: &Mount, before: &BTreeMap<u64, Tree>, kept: &[u64]) {
    let now = all_trees(m);
    assert_eq!(
        now.keys()
            .copied()
            .filter(|id| before.contains_key(id))
            .collect::<Vec<_>>(),
        kept
    );
    for id in kept {
        assert_eq!(now[id], before[id], "the tree at kept id {id} changed");
    }
    for id in before.keys().filter(|id| !kept.contains(id)) {
        let e = fs::symlink_metadata(m.path(&format!(".history/{id}"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "forgotten id {id}");
    }
}

/// The ids a `--keep-last n` keeps of `before`: the newest n, and the id
/// just before each removal (`rm`, the rename of a directory is none).
fn kept_ids(m: &Mount, before: &BTreeMap<u64, Tree>, n: usize) -> Vec<u64> {
    let removals: Vec<u64> = m
        .log()
        .iter()
        .filter(|r| {
            matches!(
                r["op"].as_str(),
                Some("unlink" | "rmdir" | "park" | "scan-remove")
            )
        })
        .map(|r| r["seq"].as_u64().unwrap() - 1)
        .collect();
    let ids: Vec<u64> = before.keys().copied().collect();
    let mut kept: Vec<u64> = ids[ids.len().saturating_sub(n)..].to_vec();
    kept.extend(removals.iter().filter(|id| before.contains_key(id)));
    kept.sort_unstable();
    kept.dedup();
    kept
}

#[test]
fn kept_trees_stay_exact_and_forgotten_bytes_are_freed() {
    let mut m = Mount::new("forget-mounted");
    let mut rng = Rng(seed("SKILLFS_SEED"));
    make_history(&m, &mut rng);
    let before = all_trees(&m);
    let kept = kept_ids(&m, &before, 4);
    assert!(before.len() > 20, "{} ids", before.len());
    let size_before = store_bytes(&m.store());

    // A dry run changes nothing and says what would go.
    let dry = forget(&m, &["--keep-last", "4", "--dry-run"]);
    assert!(dry.status.success(), "{}", describe(&dry));
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains("would forget"),
        "{}",
        describe(&dry)
    );
    assert_eq!(all_trees(&m), before);
    assert_eq!(store_bytes(&m.store()), size_before);

    // Mounted: the daemon does it, the agent may keep writing.
    let out = forget(&m, &["--keep-last", "4"]);
    assert!(out.status.success(), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("forgot") && said.contains("freed"), "{said}");
    assert_kept(&m, &before, &kept);
    // Freed: at least every content that only forgotten trees showed.
    let dead = dead_contents(&before, &kept);
    // Random bytes, stored as they are (compressed entries and shared
    // chunks make the rest smaller in the store than in the tree).
    let only_forgotten: u64 = dead
        .iter()
        .filter(|c| c.len() > 128 * 1024)
        .map(|c| c.len() as u64)
        .sum();
    assert!(only_forgotten > 400_000, "{only_forgotten}");
    let size_after = store_bytes(&m.store());
    assert!(
        size_before - size_after >= only_forgotten,
        "the store went from {size_before} to {size_after} bytes; {only_forgotten} were only \
         in forgotten trees"
    );
    // And every content only forgotten trees showed is gone from it.
    let blobs = skillfs::store::blobs::BlobStore::open_path(
        &m.store().join("blobs"),
        skillfs::store::durable::StoreIo::real(),
    )
    .unwrap();
    for c in &dead {
        let id = skillfs::store::blobs::hash_bytes(c);
        assert!(
            !blobs.contains(&id),
            "{id} ({} bytes) is still stored",
            c.len()
        );
    }
    // `log` leaves them out; the forget is a change of its own.
    let logged: Vec<u64> = m.log().iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    for id in before.keys().filter(|id| !kept.contains(id)) {
        assert!(!logged.contains(id), "forgotten id {id} still in the log");
    }
    assert!(m.log().iter().any(|r| r["op"] == "forget"));
    assert_verifies(&m);
    // Writing goes on, then the whole thing survives a remount.
    fs::write(m.path("cat/foo/SKILL.md"), "after the forget\n").unwrap();
    m.umount();
    m.remount();
    assert_kept(&m, &before, &kept);
    assert_eq!(
        fs::read(m.path("cat/foo/SKILL.md")).unwrap(),
        b"after the forget\n"
    );
    assert_verifies(&m);
    // A second forget with the same policy forgets what became old since.
    let again = forget(&m, &["--keep-last", "4"]);
    assert!(again.status.success(), "{}", describe(&again));
    assert_verifies(&m);
}

#[test]
fn forget_unmounted_then_mount() {
    let mut m = Mount::new("forget-offline");
    let mut rng = Rng(seed("SKILLFS_SEED"));
    make_history(&m, &mut rng);
    let before = all_trees(&m);
    let kept = kept_ids(&m, &before, 3);
    m.umount();
    let out = forget(&m, &["--keep-last", "3"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("freed"),
        "{}",
        describe(&out)
    );
    m.remount();
    assert_kept(&m, &before, &kept);
    assert_verifies(&m);
}

#[test]
fn bad_policies_are_refused_and_change_nothing() {
    let mut m = Mount::new("forget-bad");
    fs::write(m.path("a.md"), "one\n").unwrap();
    fs::write(m.path("a.md"), "two\n").unwrap();
    let before = all_trees(&m);
    for (args, words) in [
        (&[][..], &["keeps nothing"][..]),
        (&["--keep-last", "0"][..], &["--keep-last 0"][..]),
        (&["--keep-within", "soon"][..], &["not an age"][..]),
    ] {
        let out = forget(&m, args);
        assert_refused(&out, 2, words);
    }
    assert_eq!(all_trees(&m), before);
    m.umount();
    // Not a store: nothing is made there.
    let nowhere = m.scratch.store().with_file_name("no-store-here");
    let out = skillfs(&[
        "forget",
        "--keep-last",
        "1",
        "--root",
        &root_arg(&m),
        "--store",
        nowhere.to_str().unwrap(),
    ]);
    assert_refused(&out, 4, &["does not exist"]);
    common::assert_enoent(&nowhere);
}

/// SIGKILL at random points of a forget, unmounted (the command) and
/// mounted (the daemon): every time, the store verifies and the trees the
/// policy keeps are exact; a rerun finishes the job.
#[test]
fn kills_at_random_points_lose_nothing_kept() {
    let mut m = Mount::new("forget-kill");
    let mut rng = Rng(seed("SKILLFS_SEED"));
    make_history(&m, &mut rng);
    // More to prune: many small versions, so a forget takes a while.
    for i in 0..300 {
        fs::write(
            m.path(&format!("cat/foo/n{}.md", i % 30)),
            format!("{i}\n").repeat(i + 1),
        )
        .unwrap();
    }
    let before = all_trees(&m);
    let kept = kept_ids(&m, &before, 5);
    m.umount();
    // How long a whole forget takes on a copy, to spread the kills over.
    let bin = env!("CARGO_BIN_EXE_skillfs");
    let root = root_arg(&m);
    let store = m.store().display().to_string();
    let run = || {
        Command::new(bin)
            .args([
                "forget",
                "--keep-last",
                "5",
                "--root",
                &root,
                "--store",
                &store,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    for round in 0..6 {
        let mut child = run();
        // 0 to 40 ms: the first runs land anywhere from the journal read
        // to the last unlink; later ones in what is left.
        std::thread::sleep(Duration::from_micros(rng.range(0, 40_000)));
        let _ = child.kill();
        let _ = child.wait();
        m.remount();
        assert_verifies(&m);
        let now = all_trees(&m);
        for id in &kept {
            assert_eq!(now[id], before[id], "round {round}: kept id {id} changed");
        }
        m.umount();
    }
    // Mounted: the daemon killed in the middle of its forget.
    m.remount();
    let root2 = root.clone();
    let asker = std::thread::spawn(move || {
        Command::new(bin)
            .args(["forget", "--keep-last", "5", "--root", &root2])
            .output()
            .unwrap()
    });
    std::thread::sleep(Duration::from_micros(rng.range(0, 30_000)));
    m.kill9();
    let _ = asker.join();
    m.remount();
    assert_verifies(&m);
    // A rerun finishes: everything but the kept ids is gone, kept exact.
    let out = forget(&m, &["--keep-last", "5"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_kept(&m, &before, &kept);
    assert_verifies(&m);
}

/// A policy in `config.json` is applied by the daemon on its schedule; a
/// policy there that keeps nothing refuses the mount, naming the file.
#[test]
fn the_daemon_applies_the_configured_policy() {
    let s = common::Scratch::new("forget-config");
    fs::create_dir_all(s.store()).unwrap();
    fs::write(
        s.store().join("config.json"),
        r#"{"retention": {"keep_last": 0}}"#,
    )
    .unwrap();
    let out = skillfs(&["mount", s.root().to_str().unwrap()]);
    assert_refused(&out, 7, &["config.json", "--keep-last 0"]);
    fs::write(
        s.store().join("config.json"),
        r#"{"retention": {"keep_last": 3, "every": "1s"}}"#,
    )
    .unwrap();
    let m = Mount::over(s, Vec::new());
    for i in 0..12 {
        fs::write(m.path("a.md"), format!("version {i}\n")).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ops: Vec<String> = m
            .log()
            .iter()
            .map(|r| r["op"].as_str().unwrap().to_string())
            .collect();
        if ops.iter().any(|o| o == "forget") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no forget in 30 s: {ops:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The three newest versions stay, exactly.
    let h = all_trees(&m);
    let mut versions: Vec<Vec<u8>> = h
        .values()
        .filter_map(|t| t.get("a.md"))
        .map(|e| e.3.clone())
        .collect();
    // The forget's own id shows the tree before it again.
    versions.dedup();
    assert!(
        versions.ends_with(&[
            b"version 9\n".to_vec(),
            b"version 10\n".to_vec(),
            b"version 11\n".to_vec()
        ]),
        "{versions:?}"
    );
    assert!(!versions.contains(&b"version 3\n".to_vec()), "{versions:?}");
    assert_verifies(&m);
}

/// A directory whose every change fell in forgotten ids still lists the
/// kept ids that show what they left (and `latest` names one), and a
/// listing the kernel cached before the forget is not served stale.
#[test]
fn a_directory_keeps_its_history_when_its_changes_are_forgotten() {
    let m = Mount::new("forget-scope");
    for d in ["a", "b", "c"] {
        fs::create_dir(m.path(d)).unwrap();
    }
    for i in 1..=3 {
        fs::write(m.path("a/f"), format!("a{i}\n")).unwrap();
        fs::write(m.path("c/f"), format!("c{i}\n")).unwrap();
    }
    for i in 1..=5 {
        fs::write(m.path("b/g"), format!("b{i}\n")).unwrap();
    }
    let listed = |d: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(m.path(&format!("{d}/.history")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let c_before = listed("c");
    assert!(!c_before.is_empty());
    let out = forget(&m, &["--keep-last", "3"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(fs::read(m.path("a/.history/latest/f")).unwrap(), b"a3\n");
    let a = listed("a");
    assert!(!a.is_empty(), "a/.history lists nothing");
    for id in &a {
        assert_eq!(
            fs::read(m.path(&format!("a/.history/{id}/f"))).unwrap(),
            b"a3\n",
            "{id}"
        );
    }
    let c = listed("c");
    assert_ne!(c, c_before, "c/.history served from the cache");
    for id in &c {
        assert!(
            m.path(&format!("c/.history/{id}")).exists(),
            "c/.history lists {id}, which is gone"
        );
    }
}
