//! `skillfs export` through real mounts: tarballs at many ids untarred and
//! compared byte for byte with `.history/<id>`; a `--curator` snapshot
//! listed and restored by the real agent's own rollback; `--git` run twice
//! (incremental), `git fsck`ed, and every commit checked out and compared
//! with `.history/<id>`; and the refusals, which change nothing.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Mount, Scratch, agent_python, assert_refused, describe, names, set_mtime, skillfs};

/// An entry as a restore must reproduce it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ent {
    kind: char,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    /// A file's bytes, a symlink's target.
    data: Vec<u8>,
}

/// Every entry below `root` (not `root` itself), by path bytes.
fn tree(root: &Path) -> BTreeMap<Vec<u8>, Ent> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let (kind, data) = if ft.is_symlink() {
                (
                    'l',
                    fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec(),
                )
            } else if ft.is_dir() {
                stack.push(p.clone());
                ('d', Vec::new())
            } else {
                ('f', fs::read(&p).unwrap())
            };
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            out.insert(
                rel,
                Ent {
                    kind,
                    mode: md.mode() & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                    mtime: (md.mtime(), md.mtime_nsec()),
                    data,
                },
            );
        }
    }
    out
}

/// What git holds of a tree: files and symlinks (no directories, no
/// `.git` entries), each with its kind, executable bit and bytes.
fn git_view(t: &BTreeMap<Vec<u8>, Ent>) -> BTreeMap<Vec<u8>, (char, bool, Vec<u8>)> {
    t.iter()
        .filter(|(p, e)| {
            e.kind != 'd'
                && !p
                    .split(|b| *b == b'/')
                    .any(|c| c.eq_ignore_ascii_case(b".git"))
        })
        .map(|(p, e)| (p.clone(), (e.kind, e.mode & 0o100 != 0, e.data.clone())))
        .collect()
}

fn without_top(t: &BTreeMap<Vec<u8>, Ent>, name: &[u8]) -> BTreeMap<Vec<u8>, Ent> {
    t.iter()
        .filter(|(p, _)| p.split(|b| *b == b'/').next() != Some(name))
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", describe(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(cmd: &mut Command) -> String {
    ok(&cmd.output().expect("the command runs"))
}

fn last_id(m: &Mount) -> u64 {
    m.log().last().unwrap()["seq"].as_u64().unwrap()
}

fn history(m: &Mount, id: u64) -> PathBuf {
    m.root().join(".history").join(id.to_string())
}

/// `skillfs export ARGS --root ROOT`.
fn export(m: &Mount, args: &[&str]) -> Output {
    let root = m.root().display().to_string();
    let mut a = vec!["export"];
    a.extend_from_slice(args);
    a.extend(["--root", &root]);
    skillfs(&a)
}

/// A tree with what a tarball must carry exactly: nanosecond mtimes,
/// executable bits, symlinks (one with a target past 100 bytes), a name
/// past 100 bytes, one that is not UTF-8, `.hub`, a rename and removals.
fn changes(m: &Mount) {
    let r = m.root();
    fs::create_dir_all(r.join("cat/foo/scripts")).unwrap();
    fs::write(r.join("cat/foo/scripts/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(
        r.join("cat/foo/scripts/run.sh"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fs::write(r.join("cat/foo/SKILL.md"), "---\nname: foo\n---\nv2\n").unwrap();
    set_mtime(&r.join("cat/foo/SKILL.md"), 1_600_000_000, 123_456_789);
    symlink("scripts/run.sh", r.join("cat/foo/link")).unwrap();
    symlink(format!("../{}", "t".repeat(150)), r.join("cat/dangling")).unwrap();
    fs::write(r.join(format!("cat/{}.md", "n".repeat(120))), "long\n").unwrap();
    fs::write(r.join(OsStr::from_bytes(b"cat/caf\xe9.md")), "latin-1\n").unwrap();
    fs::create_dir_all(r.join(".hub/h")).unwrap();
    fs::write(r.join(".hub/h/SKILL.md"), "---\nname: h\n---\n").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    fs::write(r.join("big.bin"), &big).unwrap();
    fs::rename(r.join("cat/foo"), r.join("cat/bar")).unwrap();
    fs::write(r.join("cat/bar/SKILL.md"), "---\nname: bar\n---\nv3\n").unwrap();
    fs::remove_file(r.join("big.bin")).unwrap();
    fs::set_permissions(r.join("cat/bar/scripts"), fs::Permissions::from_mode(0o700)).unwrap();
    set_mtime(&r.join("cat/bar"), 1_650_000_000, 7);
}

/// Untars `tarball` into a new directory `into` with GNU tar.
fn untar(tarball: &Path, into: &Path) {
    let _ = fs::remove_dir_all(into);
    fs::create_dir_all(into).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(into)
        .arg("--numeric-owner"));
}

#[test]
fn tarballs_at_every_id_untar_to_the_history_tree_exactly() {
    let m = Mount::with_tree("export-tar", |r| {
        fs::create_dir_all(r.join("cat/foo")).unwrap();
        fs::write(r.join("cat/foo/SKILL.md"), "v1\n").unwrap();
    });
    changes(&m);
    let last = last_id(&m);
    let work = m.scratch.dir.join("work");
    fs::create_dir_all(&work).unwrap();
    let tarball = work.join("t.tar.gz");
    let (mut exact_times, mut long_links) = (false, false);
    for id in 1..=last {
        ok(&export(
            &m,
            &[
                &id.to_string(),
                "--all",
                "--force",
                "-o",
                tarball.to_str().unwrap(),
            ],
        ));
        let x = work.join("x");
        untar(&tarball, &x);
        let then = tree(&history(&m, id));
        assert_eq!(tree(&x), then, "the tree at change {id}");
        exact_times |= then
            .values()
            .any(|e| e.mtime == (1_600_000_000, 123_456_789));
        long_links |= then.values().any(|e| e.kind == 'l' && e.data.len() > 100);
    }
    assert!(
        exact_times && long_links,
        "the trees held what they must carry"
    );

    // The agent's layout: no .hub, names relative to the root with no
    // `./`, directories ending in `/`, parents before what they hold.
    let t = work.join("agent.tar.gz");
    ok(&export(&m, &["latest", "-o", t.to_str().unwrap()]));
    let x = work.join("agent");
    untar(&t, &x);
    assert_eq!(tree(&x), without_top(&tree(&history(&m, last)), b".hub"));
    let listed = Command::new("tar")
        .args(["--quoting-style=literal", "-tzf"])
        .arg(&t)
        .output()
        .unwrap();
    let members: Vec<&[u8]> = listed
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        members.contains(&&b"cat/"[..]) && members.contains(&&b"cat/bar/SKILL.md"[..]),
        "{members:?}"
    );
    for (i, n) in members.iter().enumerate() {
        assert!(!n.starts_with(b"./") && !n.starts_with(b"skills/"), "{n:?}");
        let trimmed = n.strip_suffix(b"/").unwrap_or(n);
        let is_dir = fs::symlink_metadata(history(&m, last).join(OsStr::from_bytes(trimmed)))
            .unwrap()
            .is_dir();
        assert_eq!(n.ends_with(b"/"), is_dir, "{n:?}");
        if let Some(slash) = trimmed.iter().rposition(|b| *b == b'/') {
            let parent = [&trimmed[..slash], b"/"].concat();
            assert!(
                members[..i].contains(&parent.as_slice()),
                "{n:?} before its parent"
            );
        }
    }

    // A subtree: its members still named from the root.
    let t = work.join("bar.tar.gz");
    ok(&export(
        &m,
        &[&last.to_string(), "cat/bar", "-o", t.to_str().unwrap()],
    ));
    let x = work.join("bar");
    untar(&t, &x);
    assert_eq!(names(&x), ["cat"]);
    assert_eq!(
        tree(&x.join("cat/bar")),
        tree(&history(&m, last).join("cat/bar"))
    );

    // `-o -` writes the same bytes: an export is a function of its id.
    let piped = export(&m, &["latest", "-o", "-"]);
    assert_eq!(
        ok_bytes(&piped),
        fs::read(work.join("agent.tar.gz")).unwrap()
    );
    // From inside the mount, PATH counts from the current directory.
    let out = Command::new(common::BIN)
        .args(["export", "latest", "bar", "-o"])
        .arg(work.join("cwd.tar.gz"))
        .current_dir(m.path("cat"))
        .env_remove("HERMES_HOME")
        .output()
        .unwrap();
    ok(&out);
    assert_eq!(
        fs::read(work.join("cwd.tar.gz")).unwrap(),
        fs::read(&t).unwrap()
    );
}

fn ok_bytes(out: &Output) -> Vec<u8> {
    assert!(out.status.success(), "{}", describe(out));
    out.stdout.clone()
}

const ROLLBACK: &str = r#"
import json, sys
from agent import curator_backup as c
print(json.dumps([r["id"] for r in c.list_backups()]))
ok, msg, _ = c.rollback(sys.argv[1])
print(json.dumps({"ok": ok, "msg": msg}))
"#;

#[test]
fn a_curator_snapshot_is_listed_and_restored_by_the_agents_own_rollback() {
    let Some(py) = agent_python() else { return };
    let s = Scratch::home("export-curator");
    let skill = s.root().join("cat/foo");
    fs::create_dir_all(skill.join("scripts")).unwrap();
    fs::write(
        skill.join("SKILL.md"),
        "---\nname: foo\ndescription: foo\n---\nv1\n",
    )
    .unwrap();
    fs::write(skill.join("scripts/run.sh"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(
        skill.join("scripts/run.sh"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let m = Mount::over(s, Vec::new());
    symlink("scripts/run.sh", m.path("cat/foo/link")).unwrap();
    fs::create_dir_all(m.path(".hub/h")).unwrap();
    fs::write(m.path(".hub/h/SKILL.md"), "hub v1\n").unwrap();
    let good = last_id(&m);
    let good_ts = m.log().last().unwrap()["ts"].as_i64().unwrap();
    // What the rollback must undo.
    fs::write(m.path("cat/foo/SKILL.md"), "---\nname: foo\n---\nbroken\n").unwrap();
    fs::remove_file(m.path("cat/foo/scripts/run.sh")).unwrap();
    fs::create_dir_all(m.path("cat/new")).unwrap();
    fs::write(m.path("cat/new/SKILL.md"), "new\n").unwrap();
    fs::write(m.path(".hub/h/SKILL.md"), "hub v2\n").unwrap();

    let records = m.log().len();
    let said = ok(&export(&m, &["--curator", &good.to_string()]));
    let id = skillfs::time::format_utc(good_ts).replace(':', "-");
    assert!(said.contains(&id), "{said}");
    let snap = m.path(".curator_backups").join(&id);
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(snap.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["id"], id.as_str());
    assert_eq!(manifest["archive"], "skills.tar.gz");
    assert_eq!(
        manifest["archive_bytes"].as_u64(),
        Some(fs::metadata(snap.join("skills.tar.gz")).unwrap().len())
    );
    assert_eq!(manifest["skill_files"], 1, "cat/foo; .hub is not counted");
    // Hidden like the agent's own snapshots, and no version of its own.
    assert!(!names(&m.root()).contains(&".curator_backups".to_string()));
    assert_eq!(m.log().len(), records, "the snapshot is in no history");
    // A second snapshot of the same second takes the agent's `-01`.
    let again = ok(&export(&m, &["--curator", &good.to_string()]));
    assert!(again.contains(&format!("{id}-01")), "{again}");

    let out = Command::new(&py)
        .args(["-c", ROLLBACK, &id])
        .current_dir(&m.scratch.dir)
        .env("HERMES_HOME", m.mount_point())
        .output()
        .expect("the agent's python runs");
    let text = ok(&out);
    let mut lines = text.lines();
    let listed: Vec<String> = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert!(
        listed.contains(&id) && listed.contains(&format!("{id}-01")),
        "{text}"
    );
    let done: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(done["ok"], true, "{text}");

    // The skills are as they were at `good`; the hub's are left alone,
    // as the agent's rollback leaves them.
    let now = without_top(&tree(&m.root()), b".hub");
    let then = without_top(&tree(&history(&m, good)), b".hub");
    let view = |t: &BTreeMap<Vec<u8>, Ent>| -> BTreeMap<Vec<u8>, (char, bool, Vec<u8>)> {
        t.iter()
            .map(|(p, e)| (p.clone(), (e.kind, e.mode & 0o100 != 0, e.data.clone())))
            .collect()
    };
    assert_eq!(view(&now), view(&then));
    assert_eq!(fs::read(m.path(".hub/h/SKILL.md")).unwrap(), b"hub v2\n");
    // The rollback itself was versioned: history holds the broken state.
    assert!(last_id(&m) > good);
}

/// The commits of the branch skillfs, oldest first, with their
/// `skillfs-id` trailer.
fn commits(git_dir: &Path) -> Vec<(String, u64)> {
    let text = run(Command::new("git").arg("--git-dir").arg(git_dir).args([
        "log",
        "--reverse",
        "--format=%H %(trailers:key=skillfs-id,valueonly,separator=)",
        "skillfs",
    ]));
    text.lines()
        .map(|l| {
            let (sha, id) = l.split_once(' ').unwrap();
            (sha.to_string(), id.trim().parse().unwrap())
        })
        .collect()
}

fn fsck(git_dir: &Path) {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["fsck", "--strict", "--no-dangling"])
        .output()
        .unwrap();
    assert!(out.status.success(), "git fsck: {}", describe(&out));
}

/// Checks out every commit and compares it with `.history/<id>`.
fn every_commit_is_its_history(m: &Mount, git_dir: &Path, ids: &[(String, u64)]) {
    let w = m.scratch.dir.join("checkout");
    let _ = fs::remove_dir_all(&w);
    run(Command::new("git")
        .arg("clone")
        .arg("-q")
        .arg(git_dir)
        .arg(&w));
    for (sha, id) in ids {
        run(Command::new("git")
            .arg("-C")
            .arg(&w)
            .args(["checkout", "-q", "-f", "--detach", sha]));
        let mut got = tree(&w);
        got.retain(|p, _| !p.starts_with(b".git/") && p != b".git");
        assert_eq!(
            git_view(&got),
            git_view(&tree(&history(m, *id))),
            "commit {sha} against .history/{id}"
        );
    }
    fs::remove_dir_all(&w).unwrap();
}

#[test]
fn git_export_appends_only_new_changes_and_every_commit_is_its_history() {
    let m = Mount::with_tree("export-git", |r| {
        fs::create_dir_all(r.join("cat/foo")).unwrap();
        fs::write(r.join("cat/foo/SKILL.md"), "v1\n").unwrap();
    });
    let r = m.root();
    changes(&m);
    // A file and a directory trading places, an empty directory, names
    // fast-import must quote, and a skill that is a git clone.
    fs::write(r.join("cat/x"), "a file\n").unwrap();
    fs::remove_file(r.join("cat/x")).unwrap();
    fs::create_dir(r.join("cat/x")).unwrap();
    fs::write(r.join("cat/x/f"), "now a directory\n").unwrap();
    fs::create_dir(r.join("cat/empty")).unwrap();
    fs::write(r.join("cat/new\nline"), "newline\n").unwrap();
    fs::write(r.join("\"quoted"), "quote\n").unwrap();
    fs::create_dir_all(r.join("cat/cloned/.git")).unwrap();
    fs::write(r.join("cat/cloned/.git/config"), "[core]\n").unwrap();
    fs::write(r.join("cat/cloned/SKILL.md"), "cloned\n").unwrap();
    let first = last_id(&m);
    let d = m.scratch.dir.join("history.git");
    let said = ok(&export(&m, &["--git", d.to_str().unwrap()]));
    assert!(said.contains(&format!("changes 1 to {first}")), "{said}");
    assert!(said.contains(".git left out"), "{said}");
    let c1 = commits(&d);
    assert_eq!(
        c1.iter().map(|c| c.1).collect::<Vec<_>>(),
        (1..=first).collect::<Vec<_>>()
    );
    fsck(&d);

    // More changes; the second run appends only those.
    fs::remove_dir_all(r.join("cat/x")).unwrap();
    fs::write(r.join("cat/x"), "a file again\n").unwrap();
    fs::set_permissions(
        r.join("cat/bar/scripts/run.sh"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    fs::write(r.join("cat/bar/SKILL.md"), "v4\n").unwrap();
    symlink("bar", r.join("cat/bar2")).unwrap();
    fs::remove_dir_all(r.join(".hub")).unwrap();
    let second = last_id(&m);
    let said = ok(&export(&m, &["--git", d.to_str().unwrap()]));
    assert!(
        said.contains(&format!("changes {} to {second}", first + 1)),
        "{said}"
    );
    let c2 = commits(&d);
    assert_eq!(&c2[..c1.len()], &c1[..], "the first run's commits are kept");
    assert_eq!(
        c2.iter().map(|c| c.1).collect::<Vec<_>>(),
        (1..=second).collect::<Vec<_>>()
    );
    fsck(&d);
    // Nothing new: nothing added.
    let said = ok(&export(&m, &["--git", d.to_str().unwrap()]));
    assert!(said.contains("up to date"), "{said}");
    assert_eq!(commits(&d), c2);
    every_commit_is_its_history(&m, &d, &c2);

    // Squashed: the changes within an hour of each other, one commit.
    let d2 = m.scratch.dir.join("squashed.git");
    ok(&export(
        &m,
        &["--git", d2.to_str().unwrap(), "--squash", "1h"],
    ));
    let c3 = commits(&d2);
    assert_eq!(c3.len(), 1, "{c3:?}");
    assert_eq!(c3[0].1, second);
    fsck(&d2);
    every_commit_is_its_history(&m, &d2, &c3);
    // The same history exports to the same commits.
    let d3 = m.scratch.dir.join("again.git");
    ok(&export(&m, &["--git", d3.to_str().unwrap()]));
    assert_eq!(commits(&d3), c2);
}

#[test]
fn refusals_name_the_reason_and_change_nothing() {
    let mut m = Mount::with_tree("export-refuse", |r| {
        fs::create_dir_all(r.join("cat/foo")).unwrap();
        fs::write(r.join("cat/foo/SKILL.md"), "v1\n").unwrap();
        fs::write(r.join("big.bin"), common::noise(300_000, 9)).unwrap();
    });
    let out_dir = m.scratch.dir.join("out");
    fs::create_dir_all(&out_dir).unwrap();
    let o = |name: &str| out_dir.join(name).display().to_string();

    // Not in history: exit 8.
    assert_refused(&export(&m, &["nope", "-o", &o("a.tgz")]), 8, &["nope"]);
    assert_refused(&export(&m, &["999", "-o", &o("a.tgz")]), 8, &["999"]);
    assert_refused(
        &export(&m, &["latest", "cat/nothing", "-o", &o("a.tgz")]),
        8,
        &["cat/nothing"],
    );
    // Into ROOT (even a hidden name there) or the store: exit 2.
    let inside = m.path("cat/x.tar.gz").display().to_string();
    assert_refused(
        &export(&m, &["latest", "-o", &inside]),
        2,
        &["inside", &inside],
    );
    let hidden = m.path(".curator_backups/x.tar.gz").display().to_string();
    assert_refused(&export(&m, &["latest", "-o", &hidden]), 2, &["inside"]);
    let in_store = m.store().join("x.tgz").display().to_string();
    assert_refused(&export(&m, &["latest", "-o", &in_store]), 2, &["the store"]);
    common::assert_enoent(m.path("cat/x.tar.gz"));
    common::assert_enoent(m.store().join("x.tgz"));
    let in_root_git = m.path("cat/h.git").display().to_string();
    assert_refused(&export(&m, &["--git", &in_root_git]), 2, &["inside"]);
    // An existing file: only with --force.
    fs::write(o("keep.tgz"), "mine").unwrap();
    assert_refused(
        &export(&m, &["latest", "-o", &o("keep.tgz")]),
        2,
        &["exists", "--force"],
    );
    assert_eq!(fs::read(o("keep.tgz")).unwrap(), b"mine");
    ok(&export(&m, &["latest", "-o", &o("keep.tgz"), "--force"]));
    assert_eq!(&fs::read(o("keep.tgz")).unwrap()[..2], b"\x1f\x8b");
    // No output named: a usage error.
    assert_eq!(export(&m, &["latest"]).status.code(), Some(2));
    // A directory that is neither empty nor a repository.
    fs::create_dir_all(out_dir.join("notrepo")).unwrap();
    fs::write(out_dir.join("notrepo/file"), "x").unwrap();
    assert_refused(&export(&m, &["--git", &o("notrepo")]), 2, &["neither"]);
    assert_eq!(names(&out_dir.join("notrepo")), ["file"]);

    // A repository holding another store's history.
    let other = Mount::with_tree("export-refuse-other", |r| {
        fs::write(r.join("other"), "other\n").unwrap();
    });
    let theirs = o("theirs.git");
    ok(&export(&other, &["--git", &theirs]));
    let before = commits(Path::new(&theirs));
    assert_refused(&export(&m, &["--git", &theirs]), 2, &["another history"]);
    assert_eq!(commits(Path::new(&theirs)), before);
    drop(other);

    // A failure midway (a blob damaged in the store) leaves nothing behind.
    common::damage_stored(&m.store(), &common::noise(300_000, 9), 150_000);
    let listed = names(&out_dir);
    assert_refused(
        &export(&m, &["latest", "-o", &o("partial.tgz")]),
        4,
        &["blob"],
    );
    assert_refused(&export(&m, &["--git", &o("partial.git")]), 4, &["blob"]);
    assert_eq!(
        names(&out_dir),
        listed,
        "no file, no temporary file, no repository"
    );

    // --curator writes through the mount only.
    m.umount();
    assert_refused(&export(&m, &["--curator", "latest"]), 3, &["not mounted"]);
    common::assert_enoent(m.path(".curator_backups"));
}

/// `--force` replaces a file, or a symlink itself, and nothing else: a
/// device, a FIFO, a socket, or a link to one is refused and left exactly
/// as it was (as root, `-o /dev/null --force` turned `/dev/null` into a
/// file). Nodes made in a scratch directory stand in for the system's.
#[test]
fn force_never_replaces_a_device_a_fifo_or_a_link_to_one() {
    use std::os::unix::fs::FileTypeExt;
    let m = Mount::with_tree("export-nodes", |r| {
        fs::write(r.join("SKILL.md"), "v1\n").unwrap();
    });
    let out_dir = m.scratch.dir.join("out");
    fs::create_dir_all(&out_dir).unwrap();
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let fifo = out_dir.join("fifo");
    assert_eq!(unsafe { libc::mkfifo(c(&fifo).as_ptr(), 0o644) }, 0);
    let mut nodes = vec![(fifo.clone(), "a FIFO")];
    // A character device 1:3, as /dev/null: root only.
    let null = out_dir.join("null");
    let dev = unsafe {
        libc::mknod(
            c(&null).as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    };
    if dev == 0 {
        nodes.push((null.clone(), "a character device"));
    } else {
        eprintln!(
            "no character device (not root): {}",
            std::io::Error::last_os_error()
        );
    }
    let sock = out_dir.join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    nodes.push((sock, "a socket"));
    let link = out_dir.join("stdout");
    symlink(&fifo, &link).unwrap();
    nodes.push((link, "a symlink to a FIFO"));

    for (node, what) in &nodes {
        let before = fs::symlink_metadata(node).unwrap();
        let o = node.display().to_string();
        for force in [false, true] {
            let mut args = vec!["latest", "-o", &o];
            if force {
                args.push("--force");
            }
            assert_refused(&export(&m, &args), 2, &[what, "--force replaces only"]);
            let after = fs::symlink_metadata(node).unwrap();
            assert_eq!(
                (after.ino(), after.mode(), after.rdev(), after.len()),
                (before.ino(), before.mode(), before.rdev(), before.len()),
                "{what} changed"
            );
            assert!(!after.file_type().is_file(), "{what} became a file");
        }
    }
    assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(names(&out_dir).len(), nodes.len(), "no temporary file left");

    // A symlink to a file is replaced itself, its target untouched.
    let target = out_dir.join("target");
    fs::write(&target, "mine").unwrap();
    let to_file = out_dir.join("to-file.tgz");
    symlink(&target, &to_file).unwrap();
    ok(&export(
        &m,
        &["latest", "-o", to_file.to_str().unwrap(), "--force"],
    ));
    assert!(fs::symlink_metadata(&to_file).unwrap().is_file());
    assert_eq!(fs::read(&target).unwrap(), b"mine");
}

/// The tarball is the owner's alone whatever the umask lets through: the
/// history may hold files that only their owner could read.
#[test]
fn an_export_file_is_made_private() {
    let m = Mount::with_tree("export-mode", |r| {
        fs::write(r.join("secret.md"), "mine\n").unwrap();
        fs::set_permissions(r.join("secret.md"), fs::Permissions::from_mode(0o600)).unwrap();
    });
    let root = m.root().display().to_string();
    for (mask, mode) in [(0o022, 0o600), (0o000, 0o600), (0o277, 0o400)] {
        let out = m.scratch.dir.join(format!("t{mask:o}.tgz"));
        let o = out.display().to_string();
        let got = common::skillfs_umask(&["export", "latest", "-o", &o, "--root", &root], mask);
        ok(&got);
        let m = fs::metadata(&out).unwrap().mode() & 0o7777;
        assert_eq!(m, mode, "umask {mask:o}: mode {m:o}");
    }
}
