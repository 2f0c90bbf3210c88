//! Skills across machines, merged: two replicas (two stores, two mounts)
//! and one bare repository. What one makes, edits or removes reaches the
//! other's live tree through its mount, as versions of its own; edits to
//! different lines of one file both land; edits that collide keep each
//! replica's own side live and list the other as a conflict, never as a
//! file; a skill being written is left for the next sync; `undo` takes a
//! merge back; `verify --full` passes on both.

use crate::common;

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use common::{Mount, describe, skillfs};

struct Pair {
    a: Mount,
    b: Mount,
}

pub(crate) fn root_arg(m: &Mount) -> String {
    m.root().display().to_string()
}

fn pair(tag: &str) -> Pair {
    let a = Mount::new(&format!("{tag}A"));
    let b = Mount::new(&format!("{tag}B"));
    hub(&a, &b);
    Pair { a, b }
}

/// A bare repository beside `a`'s root, the remote `hub` of both.
fn hub(a: &Mount, b: &Mount) -> PathBuf {
    let remote: PathBuf = a.root().parent().unwrap().join("hub.git");
    common::bare_repo(&remote);
    for m in [a, b] {
        let url = remote.to_str().unwrap();
        let out = skillfs(&["remote", "add", "hub", url, "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    remote
}

/// `skillfs sync` of `m`, which must succeed: what it printed.
pub(crate) fn sync(m: &Mount) -> (String, String) {
    let out = skillfs(&["sync", "--root", &root_arg(m)]);
    assert!(out.status.success(), "{}", describe(&out));
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

pub(crate) fn skill(name: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: a test skill\n---\n{body}")
}

pub(crate) fn read(m: &Mount, p: &str) -> String {
    fs::read_to_string(m.path(p)).unwrap()
}

/// Every name in `m`'s live tree, sorted.
fn listing(m: &Mount) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![m.root()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(m.root()).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `m`'s replica id.
pub(crate) fn replica_of(m: &Mount) -> String {
    fs::read_to_string(m.store().join("REPLICA"))
        .unwrap()
        .trim()
        .to_string()
}

/// `skillfs log --replica REPLICA` of `m` with `more` arguments, which
/// must succeed: what it printed.
fn fetched_log(m: &Mount, replica: &str, more: &[&str]) -> String {
    let mut args = vec!["log", "--no-pager", "--replica", replica, "--root"];
    let root = root_arg(m);
    args.push(&root);
    args.extend_from_slice(more);
    let out = skillfs(&args);
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Another replica's versions are in `log --replica` once fetched, before
/// anything is merged (unmounted, a sync fetches and merges nothing),
/// each with the commit whose files git shows; a path keeps those that
/// changed it; an unknown replica is said.
#[test]
fn another_replicas_versions_are_listed_before_any_merge() {
    let Pair { a, mut b } = pair("fetchedlog");
    fs::create_dir_all(a.path("cat/s")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "one\n")).unwrap();
    sync(&a);
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "two\n")).unwrap();
    sync(&a);
    fs::write(a.path("top.md"), "top\n").unwrap();
    sync(&a);
    b.umount();
    sync(&b);
    assert!(!b.root().join("cat").exists(), "nothing merged unmounted");
    let id = replica_of(&a);
    let listed = fetched_log(&b, &id[..6], &[]);
    let lines: Vec<&str> = listed.lines().collect();
    let a_ids: Vec<u64> = a.log().iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert!(!lines.is_empty(), "{listed}");
    for l in &lines {
        let (rid, n) = l
            .split_whitespace()
            .next()
            .unwrap()
            .split_once(':')
            .unwrap();
        assert_eq!(rid, &id[..8], "{l}");
        assert!(
            a_ids.contains(&n.parse().unwrap()),
            "{l}: one of a's ids {a_ids:?}"
        );
    }
    assert!(listed.contains("top.md"), "{listed}");
    // The plain log says they are there, and where to find them.
    let unmerged = |m: &Mount| {
        let out = skillfs(&["log", "--no-pager", "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert_eq!(
        unmerged(&b).trim(),
        format!(
            "replica {0}: {1} versions fetched and not merged here yet: skillfs log --replica {0}",
            &id[..8],
            lines.len()
        )
    );
    // JSON, oldest first; each commit holds that version's file.
    let json = fetched_log(&b, &id, &["--json", "cat/s/SKILL.md"]);
    let versions: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(versions.len() >= 2, "{json}");
    assert!(
        versions
            .iter()
            .all(|v| !v["subject"].as_str().unwrap().contains("top.md"))
    );
    let ids: Vec<u64> = versions.iter().map(|v| v["id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    // A diff with one of them hashes its files once, as a merge would,
    // and remembers them (no sync runs meanwhile).
    let blobmap = b.store().join("sync").join("blobmap");
    let mapped = || fs::read_to_string(&blobmap).map_or(0, |t| t.lines().count());
    let before = mapped();
    let name = format!("{}:{}", &id[..8], ids.last().unwrap());
    let out = skillfs(&["diff", &name, "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\n-two"),
        "{}",
        describe(&out)
    );
    assert!(
        mapped() > before,
        "sync/blobmap: {before} lines before, {} after",
        mapped()
    );
    let repo = b.store().join("sync").join("repo.git");
    let newest = versions.last().unwrap()["commit"].as_str().unwrap();
    assert_eq!(
        git_in(&repo, &["show", &format!("{newest}:cat/s/SKILL.md")], b""),
        skill("s", "two\n").trim_end()
    );
    assert_eq!(
        fetched_log(&b, &id, &["-n", "1", "cat/s/SKILL.md"])
            .lines()
            .count(),
        1
    );
    // A replica this store does not keep.
    let out = skillfs(&["log", "--replica", "0000", "--root", &root_arg(&b)]);
    common::assert_refused(&out, 8, &["keeps no replica '0000'", &id]);
    // The merge, once mounted, takes the newest.
    b.remount();
    sync(&b);
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "two\n"));
    assert_eq!(unmerged(&b), "", "all merged");
}

/// Another replica's versions are in `.history` by the names `log
/// --replica` gives them, before anything is merged: read-only, shown by
/// no listing, with what a merge would take of them (no link out of the
/// tree), restored by a plain `cp -a`, and seen from a directory's own
/// `.history` too.
#[test]
fn another_replicas_versions_are_in_history_for_a_plain_cp() {
    use std::os::unix::fs::PermissionsExt;
    let Pair { a, mut b } = pair("theirshistory");
    fs::create_dir_all(a.path("cat/s/references")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "one\n")).unwrap();
    fs::write(a.path("cat/s/references/r.md"), "r\n").unwrap();
    fs::write(a.path("cat/s/run.sh"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(a.path("cat/s/run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("SKILL.md", a.path("cat/s/link")).unwrap();
    std::os::unix::fs::symlink("../../../etc", a.path("cat/s/out")).unwrap();
    sync(&a);
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "two\n")).unwrap();
    sync(&a);
    b.umount();
    sync(&b);
    b.remount();
    common::assert_enoent(b.path("cat"));
    let id = replica_of(&a);
    let json = fetched_log(&b, &id, &["--json"]);
    let names: Vec<String> = json
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!("{}:{}", &id[..8], v["id"].as_u64().unwrap())
        })
        .collect();
    assert!(names.len() >= 2, "{json}");
    // The last change before "two" (everything made), and "two".
    let (first, last) = (&names[names.len() - 2], names.last().unwrap());
    let h = b.path(".history");
    let at = |name: &str, p: &str| h.join(name).join(p);
    assert_eq!(
        fs::read_to_string(at(first, "cat/s/SKILL.md")).unwrap(),
        skill("s", "one\n")
    );
    assert_eq!(
        fs::read_to_string(at(last, "cat/s/SKILL.md")).unwrap(),
        skill("s", "two\n")
    );
    let list = |p: PathBuf| {
        let mut v: Vec<String> = fs::read_dir(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(h.join(last)), ["cat"]);
    assert_eq!(
        list(at(last, "cat/s")),
        ["SKILL.md", "link", "references", "run.sh"],
        "no link out of the tree"
    );
    common::assert_enoent(at(last, "cat/s/out"));
    let mode = |p: PathBuf| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(at(last, "cat/s/run.sh")), 0o755);
    assert_eq!(mode(at(last, "cat/s/SKILL.md")), 0o644);
    assert_eq!(
        fs::read_link(at(last, "cat/s/link")).unwrap(),
        PathBuf::from("SKILL.md")
    );
    // Listed nowhere; read-only; unknown versions and replicas are absent.
    assert!(list(h.clone()).iter().all(|n| !n.contains(':')));
    let e = fs::write(at(last, "cat/s/SKILL.md"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = fs::create_dir(at(last, "cat/new")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    common::assert_enoent(h.join(format!("{}:999999", &id[..8])));
    common::assert_enoent(h.join("00000000:1"));
    common::assert_enoent(at(last, "cat/nothing"));
    // A plain `cp -a` restores the first version whole.
    let out = Command::new("cp")
        .arg("-a")
        .arg(at(first, "cat"))
        .arg(b.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "one\n"));
    assert_eq!(read(&b, "cat/s/references/r.md"), "r\n");
    assert_eq!(mode(b.path("cat/s/run.sh")), 0o755);
    assert_eq!(
        fs::read_link(b.path("cat/s/link")).unwrap(),
        PathBuf::from("SKILL.md")
    );
    // From the skill's own `.history`: that directory in the version.
    assert_eq!(
        fs::read_to_string(b.path("cat/s/.history").join(last).join("SKILL.md")).unwrap(),
        skill("s", "two\n")
    );
    common::assert_enoent(b.path("cat/s/.history").join(last).join("cat"));
    // What `cp` wrote is versions of this tree, as any write.
    assert!(
        b.log()
            .iter()
            .any(|r| r["path"].as_str() == Some("cat/s/SKILL.md")),
        "{:?}",
        b.log()
    );
    verify_full(&b);
}

/// `sync/origins.jsonl` holds no more than history does: the first merge
/// after a `forget` writes it anew without the ids forgotten, and the
/// changes still in history keep their authors.
#[test]
fn forgotten_changes_leave_the_origins() {
    let a = Mount::new("originsforgetA");
    let b = Mount::new("originsforgetB");
    hub(&a, &b);
    let origins = b.store().join("sync").join("origins.jsonl");
    let named = || -> Vec<u64> {
        fs::read_to_string(&origins)
            .unwrap()
            .lines()
            .flat_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let seqs: Vec<u64> = v["seqs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_u64().unwrap())
                    .collect();
                seqs
            })
            .collect()
    };
    let root = root_arg(&b);
    let in_log = || -> Vec<u64> {
        let out = skillfs(&["log", "--json", "--root", &root]);
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    for body in ["one\n", "two\n"] {
        fs::create_dir_all(a.path("cat/s")).unwrap();
        fs::write(a.path("cat/s/SKILL.md"), skill("s", body)).unwrap();
        sync(&a);
        sync(&b);
    }
    let before = named();
    assert!(before.len() >= 2, "{before:?}");
    let out = skillfs(&["forget", "--keep-last", "1", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    let kept = in_log();
    assert!(
        before.iter().any(|s| !kept.contains(s)),
        "nothing forgotten: {kept:?}"
    );
    // A forget alone leaves the file as it was; the next merge prunes it.
    assert_eq!(named(), before);
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "three\n")).unwrap();
    sync(&a);
    sync(&b);
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "three\n"));
    let after = named();
    let kept = in_log();
    assert!(
        after.iter().all(|s| kept.contains(s)),
        "{after:?} beyond {kept:?}"
    );
    assert!(
        after.iter().any(|s| !before.contains(s)),
        "the new merge's ids: {after:?}"
    );
    // What history still has keeps its origin.
    assert!(
        before
            .iter()
            .filter(|s| kept.contains(s))
            .all(|s| after.contains(s)),
        "{before:?} kept {kept:?}: {after:?}"
    );
    // The newest merge's change still says whose it was.
    let out = skillfs(&["log", "--no-pager", "cat/s/SKILL.md", "--root", &root]);
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        log.lines()
            .last()
            .is_some_and(|l| l.contains(", author \"")),
        "{log}"
    );
}

/// Another replica's version, as `log --replica` names it, is shown and
/// restored like this store's own: `show R:N:PATH` prints what that
/// replica had, `restore R:N PATH` puts it back through the mount as a
/// version whose actor names the replica (and `undo` takes it back), a
/// writer in the skill holds it off, and a path that version lacks is
/// said.
#[test]
fn another_replicas_version_is_shown_and_restored() {
    let a = Mount::new("fetchedrestoreA");
    let b = Mount::new("fetchedrestoreB");
    // An id that starts with digits only, which a change id of b's could
    // also be: still taken for the replica b keeps.
    fs::write(
        a.store().join("REPLICA"),
        "1234567890abcdef1234567890abcdef\n",
    )
    .unwrap();
    hub(&a, &b);
    fs::create_dir_all(a.path("cat/s/references")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "one\n")).unwrap();
    fs::write(a.path("cat/s/references/r.md"), "first\n").unwrap();
    fs::create_dir_all(a.path("cat/u")).unwrap();
    fs::write(a.path("cat/u/SKILL.md"), skill("u", "u1\n")).unwrap();
    let big: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(a.path("big.bin"), &big).unwrap();
    sync(&a);
    sync(&b);
    // a's newest version now, as b keeps it: the skill with "one".
    let id = replica_of(&a);
    let json = fetched_log(&b, &id, &["--json"]);
    let then: serde_json::Value = serde_json::from_str(json.lines().last().unwrap()).unwrap();
    let name = format!("{}:{}", &id[..8], then["id"].as_u64().unwrap());
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "two\n")).unwrap();
    fs::remove_file(a.path("cat/s/references/r.md")).unwrap();
    fs::write(a.path("cat/u/SKILL.md"), skill("u", "u2\n")).unwrap();
    sync(&a);
    sync(&b);
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "two\n"));
    common::assert_enoent(b.path("cat/s/references/r.md"));
    let root = root_arg(&b);
    // The merge's changes say whose they were on a.
    let newest: serde_json::Value =
        serde_json::from_str(fetched_log(&b, &id, &["--json"]).lines().last().unwrap()).unwrap();
    let author = newest["author"].as_str().unwrap().to_string();
    assert!(!author.is_empty());
    let words = format!("from replica {} (commit ", &id[..8]);
    let words_author = format!("), author \"{author}\"");
    let out = skillfs(&["log", "--no-pager", "cat/s/SKILL.md", "--root", &root]);
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        log.lines()
            .last()
            .is_some_and(|l| l.contains(&words) && l.contains(&words_author)),
        "{words}: {log}"
    );
    // `--actor sync:<replica>/<author>` keeps those records, no others.
    let by = format!("{}/{author}", from(&a));
    let out = skillfs(&["log", "--json", "--actor", &by, "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    let kept: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!kept.is_empty(), "{}", describe(&out));
    assert!(
        kept.iter().all(|r| r["actor"]["comm"] == from(&a)),
        "{kept:?}"
    );
    let out = skillfs(&[
        "log",
        "--json",
        "--actor",
        &format!("{}/nobody", from(&a)),
        "--root",
        &root,
    ]);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        describe(&out)
    );
    let show = |args: &[&str]| {
        let mut all = vec!["show"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--root", &root]);
        skillfs(&all)
    };
    let out = show(&[&format!("{name}:cat/s/SKILL.md")]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), skill("s", "one\n"));
    // The two-argument form; a directory lists its entries.
    let out = show(&[&name, "cat/s"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "SKILL.md\nreferences/\n"
    );
    // A reader that stops early (`| head`) is no error.
    let mut child = Command::new(env!("CARGO_BIN_EXE_skillfs"))
        .args(["show", &format!("{name}:big.bin"), "--root", &root])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 16];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut head).unwrap();
    assert_eq!(&head[..], &big[..16]);
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    // `diff` takes it as either side: against this tree's newest (the
    // default second side) or a's newest version, what a changed since,
    // with no mode noise (git keeps a file's executable bit only).
    let newest_name = format!("{}:{}", &id[..8], newest["id"].as_u64().unwrap());
    let diff = |args: &[&str]| {
        let mut all = vec!["diff"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--root", &root]);
        let out = skillfs(&all);
        assert!(out.status.success(), "{args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for args in [
        vec![name.as_str()],
        vec![name.as_str(), newest_name.as_str()],
    ] {
        let text = diff(&args);
        assert!(
            text.contains(&format!("--- a/cat/s/SKILL.md\t({name})"))
                && text.contains("-one\n")
                && text.contains("+two\n"),
            "{args:?}: {text}"
        );
        assert!(text.contains("-u1\n") && text.contains("+u2\n"), "{text}");
        assert!(
            text.contains("directory removed: cat/s/references")
                && text.contains("--- a/cat/s/references/r.md")
                && text.contains("-first\n"),
            "{text}"
        );
        assert!(
            !text.contains("big.bin") && !text.contains("mode of"),
            "{text}"
        );
    }
    // The other way round, at a path; a path in neither side is said.
    let text = diff(&["latest", &name, "cat/u"]);
    assert!(
        text.contains(&format!("+++ b/cat/u/SKILL.md\t({name})"))
            && text.contains("-u2\n")
            && text.contains("+u1\n")
            && !text.contains("cat/s"),
        "{text}"
    );
    let out = skillfs(&["diff", &name, "cat/nothere", "--root", &root]);
    common::assert_refused(&out, 8, &["'cat/nothere' exists at neither", &name]);
    let out = show(&[&format!("{name}:cat/nothere")]);
    common::assert_refused(&out, 8, &["'cat/nothere' is not in replica", &id]);
    let out = show(&[&format!("{}:999999:cat/s", &id[..8])]);
    common::assert_refused(&out, 8, &["has no version 999999"]);
    // A writer inside the skill holds the restore off; nothing changes.
    let before = b.log().len();
    {
        let _w = fs::OpenOptions::new()
            .append(true)
            .open(b.path("cat/s/SKILL.md"))
            .unwrap();
        let out = skillfs(&["restore", &name, "cat/s", "--root", &root]);
        common::assert_refused(&out, 9, &["in use", "nothing was restored"]);
    }
    assert_eq!(b.log().len(), before, "a refused restore writes nothing");
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "two\n"));
    // A restore of two skills, one held by a writer: the other is
    // written, and the message says which.
    {
        let _w = fs::OpenOptions::new()
            .append(true)
            .open(b.path("cat/u/SKILL.md"))
            .unwrap();
        let out = skillfs(&["restore", &name, "cat", "--root", &root]);
        common::assert_refused(&out, 9, &["'cat/u' is in use", "1 of its parts", "'cat/s'"]);
    }
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "one\n"));
    assert_eq!(read(&b, "cat/u/SKILL.md"), skill("u", "u2\n"));
    let out = skillfs(&["undo", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "two\n"));
    // One file inside a skill: the rest of the skill stays as it is.
    let out = skillfs(&["restore", &name, "cat/s/references/r.md", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&b, "cat/s/references/r.md"), "first\n");
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "two\n"));
    let out = skillfs(&["undo", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    common::assert_enoent(b.path("cat/s/references/r.md"));
    // The restore: the skill as a had it then, r.md back, named for a.
    let out = skillfs(&["restore", &name, "cat/s", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("skillfs undo takes it back"),
        "{}",
        describe(&out)
    );
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "one\n"));
    assert_eq!(read(&b, "cat/s/references/r.md"), "first\n");
    let newest = b.log().into_iter().last().unwrap();
    assert_eq!(newest["actor"]["comm"], from(&a), "{newest}");
    let out = skillfs(&["log", "--no-pager", "--root", &root]);
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let commit = then["commit"].as_str().unwrap();
    assert!(
        log.lines().last().is_some_and(|l| l.contains(&format!(
            "from replica {} (commit {}), author \"{}\"",
            &id[..8],
            &commit[..12],
            then["author"].as_str().unwrap(),
        ))),
        "{log}"
    );
    // Again: nothing to do.
    let out = skillfs(&["restore", &name, "cat/s", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("so already"));
    // Undone, the skill is as the merge left it.
    let out = skillfs(&["undo", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "two\n"));
    common::assert_enoent(b.path("cat/s/references/r.md"));
    verify_full(&b);
}

/// The actor of what a merge of `m`'s side writes elsewhere.
fn from(m: &Mount) -> String {
    let id = fs::read_to_string(m.store().join("REPLICA")).unwrap();
    format!("sync:{}", &id.trim()[..8])
}

pub(crate) fn verify_full(m: &Mount) {
    let out = skillfs(&["verify", "--full", "--root", &root_arg(m)]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// A skill made on one replica reaches the other, is edited there and
/// comes back; a removal travels too; each arrival is a version of the
/// receiving replica's own, and `undo` takes one back.
#[test]
fn a_skill_travels_both_ways_as_versions() {
    let Pair { a, b } = pair("mergeway");
    fs::create_dir_all(a.path("cat/s/references")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "one\n")).unwrap();
    fs::write(a.path("cat/s/references/r.md"), "ref\n").unwrap();
    fs::create_dir_all(a.path("cat/t")).unwrap();
    fs::write(a.path("cat/t/SKILL.md"), skill("t", "tee\n")).unwrap();
    sync(&a);
    let (said, _) = sync(&b);
    assert!(said.contains("merged replica"), "{said}");
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "one\n"));
    assert_eq!(read(&b, "cat/s/references/r.md"), "ref\n");
    assert_eq!(read(&b, "cat/t/SKILL.md"), skill("t", "tee\n"));
    assert!(
        b.log()
            .iter()
            .any(|r| r["path"] == "cat/s" || r["to"] == "cat/s"),
        "the arrival is in b's history"
    );
    // Each change of the merge says where it came from (b had nothing
    // under cat/ before).
    let arrival: Vec<serde_json::Value> = b
        .log()
        .into_iter()
        .filter(|r| {
            ["path", "to"].iter().any(|k| {
                r[k].as_str()
                    .is_some_and(|p| p == "cat" || p.starts_with("cat/"))
            })
        })
        .collect();
    assert!(!arrival.is_empty());
    for r in &arrival {
        assert_eq!(r["actor"]["comm"], from(&a), "{r}");
    }
    // Edited on b, back to a, where an untracked file in the skill (an
    // editor's backup: in no version) stays through the swap.
    fs::write(a.path("cat/s/draft~"), "mine").unwrap();
    fs::write(b.path("cat/s/SKILL.md"), skill("s", "one, edited on b\n")).unwrap();
    sync(&b);
    sync(&a);
    assert_eq!(read(&a, "cat/s/SKILL.md"), skill("s", "one, edited on b\n"));
    assert_eq!(read(&a, "cat/s/draft~"), "mine");
    fs::remove_file(a.path("cat/s/draft~")).unwrap();
    // Removed on a, gone on b.
    fs::remove_dir_all(a.path("cat/t")).unwrap();
    sync(&a);
    sync(&b);
    common::assert_enoent(b.path("cat/t"));
    // Once more: nothing new, nothing changes.
    let before = b.log().len();
    sync(&b);
    assert_eq!(
        b.log().len(),
        before,
        "a sync with nothing new writes nothing"
    );
    // The removal was the newest operation on b: undo brings it back.
    let out = skillfs(&["undo", "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&b, "cat/t/SKILL.md"), skill("t", "tee\n"));
    assert_eq!(
        listing(&a).len() + 2,
        listing(&b).len(),
        "{:?}",
        listing(&b)
    );
    verify_full(&a);
    verify_full(&b);
}

/// Both replicas edit one file: different lines are merged on both;
/// the same line keeps each replica's own side and lists the other's as
/// a conflict on both, with no conflict file in either tree.
#[test]
fn edits_on_both_sides_merge_by_line_and_collisions_stay_conflicts() {
    let Pair { a, b } = pair("mergeline");
    fs::create_dir_all(a.path("cat/s")).unwrap();
    let text = |l1: &str, l5: &str| skill("s", &format!("{l1}\n2\n3\n4\n{l5}\n"));
    fs::write(a.path("cat/s/SKILL.md"), text("1", "5")).unwrap();
    sync(&a);
    sync(&b);
    sync(&a);
    fs::write(a.path("cat/s/SKILL.md"), text("1 from a", "5")).unwrap();
    fs::write(b.path("cat/s/SKILL.md"), text("1", "5 from b")).unwrap();
    sync(&a);
    sync(&b);
    sync(&a);
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("1 from a", "5 from b"));
    assert_eq!(read(&a, "cat/s/SKILL.md"), text("1 from a", "5 from b"));
    // The same line, both ways.
    fs::write(a.path("cat/s/SKILL.md"), text("one by a", "5 from b")).unwrap();
    fs::write(b.path("cat/s/SKILL.md"), text("one by b", "5 from b")).unwrap();
    sync(&a);
    let (said, _) = sync(&b);
    assert!(said.contains("1 conflict"), "{said}");
    sync(&a);
    assert_eq!(read(&a, "cat/s/SKILL.md"), text("one by a", "5 from b"));
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by b", "5 from b"));
    for m in [&a, &b] {
        let out = skillfs(&["status", "--root", &root_arg(m)]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("conflicts") && text.contains("1 (this tree"),
            "{text}"
        );
        let out = skillfs(&["sync", "--conflicts", "--root", &root_arg(m)]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("cat/s/SKILL.md") && text.contains("same lines"),
            "{}",
            describe(&out)
        );
        assert_eq!(
            listing(m),
            ["cat", "cat/s", "cat/s/SKILL.md"],
            "no conflict file in the tree"
        );
        verify_full(m);
    }
    // More rounds: each keeps its own side, nothing flips.
    for _ in 0..3 {
        sync(&a);
        sync(&b);
    }
    assert_eq!(read(&a, "cat/s/SKILL.md"), text("one by a", "5 from b"));
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by b", "5 from b"));
    // b takes a's side by hand: the conflict is over, and a's next edit
    // of that file reaches b.
    fs::write(b.path("cat/s/SKILL.md"), text("one by a", "5 from b")).unwrap();
    for _ in 0..2 {
        sync(&b);
        sync(&a);
    }
    fs::write(a.path("cat/s/SKILL.md"), text("one by a", "five")).unwrap();
    sync(&a);
    sync(&b);
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by a", "five"));
}

/// A conflict is settled by command: `--take` writes the other side
/// through the mount (a version `undo` takes back), `--keep` keeps this
/// side; either way it is listed no more. Bad input is refused with its
/// exit code.
#[test]
fn a_conflict_is_taken_or_kept_by_command_and_then_listed_no_more() {
    let Pair { a, b } = pair("mergetake");
    fs::create_dir_all(a.path("cat/s")).unwrap();
    let text = |l1: &str| skill("s", &format!("{l1}\n2\n3\n"));
    fs::write(a.path("cat/s/SKILL.md"), text("1")).unwrap();
    sync(&a);
    sync(&b);
    sync(&a);
    fs::write(a.path("cat/s/SKILL.md"), text("one by a")).unwrap();
    fs::write(b.path("cat/s/SKILL.md"), text("one by b")).unwrap();
    sync(&a);
    sync(&b);
    sync(&a);
    let listed = |m: &Mount| {
        let out = skillfs(&["sync", "--conflicts", "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for m in [&a, &b] {
        assert!(listed(m).contains("cat/s/SKILL.md"), "{}", listed(m));
    }
    // Nothing there, and --take with --keep: refused, nothing touched.
    let out = skillfs(&["sync", "--take", "cat/none.md", "--root", &root_arg(&b)]);
    common::assert_refused(&out, 2, &["no conflict at 'cat/none.md'"]);
    let out = skillfs(&[
        "sync",
        "--take",
        "cat/s/SKILL.md",
        "--keep",
        "cat/s/SKILL.md",
        "--root",
        &root_arg(&b),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by b"));
    // As if b's merge had stopped after it recorded the conflict and
    // before its base moved: the base an older commit of a's, without a's
    // change. The take takes the recorded commit's side, not the base's.
    let merged = b.store().join("sync").join("merged.json");
    let mut bases: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&merged).unwrap()).unwrap();
    let recorded: serde_json::Value = serde_json::from_str(
        fs::read_to_string(b.store().join("sync").join("conflicts.jsonl"))
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    let commit = recorded["commit"].as_str().unwrap();
    let older = git_in(
        &b.store().join("sync").join("repo.git"),
        &["rev-parse", &format!("{commit}^")],
        b"",
    );
    let replica = recorded["replica"].as_str().unwrap();
    bases[replica]["commit"] = serde_json::Value::String(older);
    fs::write(&merged, serde_json::to_vec_pretty(&bases).unwrap()).unwrap();
    // b takes a's side.
    let before = b.log().len();
    let out = skillfs(&["sync", "--take", "cat/s/SKILL.md", "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    let took = b.log().split_off(before);
    assert!(!took.is_empty());
    for r in &took {
        assert_eq!(
            r["actor"]["comm"],
            from(&a),
            "the take says whose side: {r}"
        );
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("took replica"));
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by a"));
    assert_eq!(listed(&b), "", "b lists it no more");
    let status = skillfs(&["status", "--root", &root_arg(&b)]);
    assert!(
        !String::from_utf8_lossy(&status.stdout).contains("conflicts"),
        "{}",
        describe(&status)
    );
    assert_eq!(
        listing(&b),
        ["cat", "cat/s", "cat/s/SKILL.md"],
        "no staging left in the tree"
    );
    verify_full(&b);
    // The take is a version: undo gives b's side back, and a second undo
    // the take again (undo of an undo), so the take is what stays.
    let out = skillfs(&["undo", "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by b"));
    let out = skillfs(&["undo", "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by a"));
    // Both hold a's side now; a's record stays until a settles it (a merge
    // never drops one), and a's next edit reaches b.
    sync(&b);
    sync(&a);
    assert!(listed(&a).contains("cat/s/SKILL.md"), "{}", listed(&a));
    let out = skillfs(&["sync", "--keep", "cat/s/SKILL.md", "--root", &root_arg(&a)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(listed(&a), "");
    fs::write(a.path("cat/s/SKILL.md"), text("one by a, again")).unwrap();
    sync(&a);
    sync(&b);
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("one by a, again"));
    // A second collision, kept by b: listed no more, b's side stays. A
    // line a power cut tore at the end of b's list first: the next record
    // is a line of its own, not glued to it.
    {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(b.store().join("sync").join("conflicts.jsonl"))
            .unwrap();
        f.write_all(br#"{"commit":"0123"#).unwrap();
    }
    fs::write(a.path("cat/s/SKILL.md"), text("two by a")).unwrap();
    fs::write(b.path("cat/s/SKILL.md"), text("two by b")).unwrap();
    sync(&a);
    sync(&b);
    assert!(listed(&b).contains("cat/s/SKILL.md"), "{}", listed(&b));
    let out = skillfs(&["sync", "--keep", "cat/s/SKILL.md", "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(listed(&b), "");
    assert_eq!(read(&b, "cat/s/SKILL.md"), text("two by b"));
    verify_full(&b);
}

/// `ssh-keygen` makes a key at `path`; the git config that signs with it.
fn signing_key(path: &std::path::Path) -> PathBuf {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "test", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen runs");
    assert!(out.status.success(), "{}", describe(&out));
    let config = path.with_extension("gitconfig");
    fs::write(
        &config,
        format!(
            "[user]\n\tsigningkey = {}.pub\n[gpg]\n\tformat = ssh\n",
            path.display()
        ),
    )
    .unwrap();
    config
}

/// `skillfs sync` of `m` with `git_config` as the user's git config.
fn sync_as(m: &Mount, git_config: &std::path::Path) -> std::process::Output {
    Command::new(common::BIN)
        .args(["sync", "--root", &root_arg(m)])
        .env("GIT_CONFIG_GLOBAL", git_config)
        .output()
        .unwrap()
}

/// A remote added with `--signers` merges only what a key of the file
/// signed: a replica that pushes with `--sign` arrives; one that pushes
/// unsigned, or signed with a key not in the file, is quarantined (kept
/// aside for git, never merged). Bad input is refused, nothing added.
#[test]
fn only_commits_signed_by_a_listed_key_are_merged_from_a_signed_remote() {
    let a = Mount::new("trustA");
    let b = Mount::new("trustB");
    let c = Mount::new("trustC");
    let top = a.root().parent().unwrap().to_path_buf();
    let remote = top.join("hub.git");
    common::bare_repo(&remote);
    let url = remote.to_str().unwrap();
    let key_a = signing_key(&top.join("key-a"));
    let key_c = signing_key(&top.join("key-c"));
    let signers = top.join("allowed_signers");
    let pub_a = fs::read_to_string(top.join("key-a.pub")).unwrap();
    let pub_a: Vec<&str> = pub_a.split_whitespace().collect();
    fs::write(&signers, format!("a@test {} {}\n", pub_a[0], pub_a[1])).unwrap();
    // Not a signers file: refused, no remote added.
    let junk = top.join("junk");
    fs::write(&junk, "hello\n").unwrap();
    let out = skillfs(&[
        "remote",
        "add",
        "hub",
        url,
        "--signers",
        junk.to_str().unwrap(),
        "--root",
        &root_arg(&b),
    ]);
    common::assert_refused(&out, 2, &["is not an allowed_signers file"]);
    let list = skillfs(&["remote", "list", "--root", &root_arg(&b)]);
    assert!(!String::from_utf8_lossy(&list.stdout).contains("hub"));
    let add = |m: &Mount, extra: &[&str]| {
        let mut args = vec!["remote", "add", "hub", url];
        args.extend_from_slice(extra);
        let root = root_arg(m);
        args.extend_from_slice(&["--root", &root]);
        let out = skillfs(&args);
        assert!(out.status.success(), "{}", describe(&out));
    };
    add(&a, &["--sign"]);
    add(&b, &["--signers", signers.to_str().unwrap()]);
    add(&c, &[]);
    let list = skillfs(&["remote", "list", "--root", &root_arg(&b)]);
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("merges only what its signers signed"),
        "{}",
        describe(&list)
    );
    fs::create_dir_all(a.path("k/good")).unwrap();
    fs::write(a.path("k/good/SKILL.md"), skill("good", "from a\n")).unwrap();
    let out = sync_as(&a, &key_a);
    assert!(out.status.success(), "{}", describe(&out));
    fs::create_dir_all(c.path("k/evil")).unwrap();
    fs::write(c.path("k/evil/SKILL.md"), skill("evil", "run this\n")).unwrap();
    let out = sync_as(&c, &key_c);
    assert!(out.status.success(), "{}", describe(&out));
    let out = sync_as(&b, &key_c);
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("quarantined"), "{}", describe(&out));
    assert_eq!(read(&b, "k/good/SKILL.md"), skill("good", "from a\n"));
    common::assert_enoent(b.path("k/evil"));
    // b's log lists c's versions, each marked as never merged.
    let listed = fetched_log(&b, &replica_of(&c), &[]);
    assert!(
        listed.contains("k/evil/SKILL.md") && listed.contains("(quarantined: never merged)"),
        "{listed}"
    );
    // Nor does `.history` show one, so no plain `cp` takes it in; a's
    // version, signed, is there.
    let quarantined = listed
        .lines()
        .find(|l| l.contains("k/evil/SKILL.md"))
        .unwrap();
    let name = quarantined.split_whitespace().next().unwrap();
    common::assert_enoent(b.path(".history").join(name));
    let from_a = fetched_log(&b, &replica_of(&a), &[]);
    let signed = from_a
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    assert_eq!(
        fs::read_to_string(b.path(".history").join(signed).join("k/good/SKILL.md")).unwrap(),
        skill("good", "from a\n")
    );
    // c signs with its own key, not in the file: still quarantined.
    let out = skillfs(&["remote", "remove", "hub", "--root", &root_arg(&c)]);
    assert!(out.status.success(), "{}", describe(&out));
    add(&c, &["--sign"]);
    fs::write(c.path("k/evil/SKILL.md"), skill("evil", "run this now\n")).unwrap();
    let out = sync_as(&c, &key_c);
    assert!(out.status.success(), "{}", describe(&out));
    let out = sync_as(&b, &key_c);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("quarantined"));
    common::assert_enoent(b.path("k/evil"));
    // a's next edit, signed, arrives; a without its key cannot push.
    fs::write(a.path("k/good/SKILL.md"), skill("good", "from a, again\n")).unwrap();
    let out = sync_as(&a, &key_a);
    assert!(out.status.success(), "{}", describe(&out));
    let out = sync_as(&b, &key_c);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        read(&b, "k/good/SKILL.md"),
        skill("good", "from a, again\n")
    );
    // What a listed key signed that is no seal of the replica whose
    // branch it is on: quarantined, each.
    let replica_a = fs::read_to_string(a.store().join("REPLICA")).unwrap();
    let a_tip = git_in(
        &remote,
        &[
            "rev-parse",
            &format!("refs/heads/skillfs/{}", replica_a.trim()),
        ],
        b"",
    );
    let blob = git_in(
        &remote,
        &["hash-object", "-w", "--stdin"],
        skill("evil", "x\n").as_bytes(),
    );
    let t1 = git_in(
        &remote,
        &["mktree"],
        format!("100644 blob {blob}\tSKILL.md\n").as_bytes(),
    );
    let t2 = git_in(
        &remote,
        &["mktree"],
        format!("040000 tree {t1}\tevil2\n").as_bytes(),
    );
    let t3 = git_in(
        &remote,
        &["mktree"],
        format!("040000 tree {t2}\tk\n").as_bytes(),
    );
    let signed_by_a = Command::new("git")
        .arg("--git-dir")
        .arg(&remote)
        .args([
            "commit-tree",
            "-S",
            "-m",
            "a commit a signed elsewhere",
            &t3,
        ])
        .env("GIT_CONFIG_GLOBAL", &key_a)
        .env("GIT_AUTHOR_NAME", "a")
        .env("GIT_AUTHOR_EMAIL", "a@test")
        .env("GIT_COMMITTER_NAME", "a")
        .env("GIT_COMMITTER_EMAIL", "a@test")
        .output()
        .unwrap();
    assert!(signed_by_a.status.success(), "{}", describe(&signed_by_a));
    let signed_by_a = String::from_utf8_lossy(&signed_by_a.stdout)
        .trim()
        .to_string();
    // The same seal made a new commit id: an unsigned header added.
    let text = git_in(&remote, &["cat-file", "commit", &a_tip], b"");
    let malleated = text.replacen("\ngpgsig ", "\ngpgsig-sha256 x\ngpgsig ", 1);
    let malleated = git_in(
        &remote,
        &["hash-object", "-t", "commit", "-w", "--stdin"],
        format!("{malleated}\n").as_bytes(),
    );
    for (id, commit, why) in [
        (
            "1111111111111111111111111111111a",
            signed_by_a.as_str(),
            "not a skillfs seal",
        ),
        (
            "1111111111111111111111111111111b",
            a_tip.as_str(),
            "not a skillfs seal",
        ),
        (
            replica_a.trim(),
            malleated.as_str(),
            "more than one signature",
        ),
    ] {
        git_in(
            &remote,
            &["update-ref", &format!("refs/heads/skillfs/{id}"), commit],
            b"",
        );
        let out = sync_as(&b, &key_c);
        assert!(out.status.success(), "{}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("quarantined") && err.contains(why),
            "{id}: {err}"
        );
        common::assert_enoent(b.path("k/evil2"));
    }
    git_in(
        &remote,
        &[
            "update-ref",
            &format!("refs/heads/skillfs/{}", replica_a.trim()),
            &a_tip,
        ],
        b"",
    );
    fs::write(a.path("k/good/SKILL.md"), skill("good", "unsigned\n")).unwrap();
    let none = top.join("no-signing.gitconfig");
    fs::write(&none, "").unwrap();
    let out = sync_as(&a, &none);
    common::assert_refused(&out, 2, &["could not sign"]);
    for m in [&a, &b] {
        verify_full(m);
    }
}

/// A skill with a file open for writing is not swapped under its writer:
/// it is merged at the next sync, after the close.
#[test]
fn a_skill_being_written_waits_for_the_next_sync() {
    let Pair { a, b } = pair("mergebusy");
    fs::create_dir_all(a.path("cat/s")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "v1\n")).unwrap();
    sync(&a);
    sync(&b);
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "v2\n")).unwrap();
    sync(&a);
    // Held open for writing by another process, as an editor would.
    let mut writer = hold_open(b.path("cat/s/notes.md"));
    let (_, err) = sync(&b);
    assert!(err.contains("open for writing"), "{err}");
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "v1\n"));
    drop(writer.stdin.take());
    writer.wait().unwrap();
    sync(&b);
    assert_eq!(read(&b, "cat/s/SKILL.md"), skill("s", "v2\n"));
    // b's own file, made while it waited, is kept by the merge.
    assert!(b.path("cat/s/notes.md").exists());
}

/// Runs git in `repo` with `input` on stdin: its trimmed output.
fn git_in(repo: &std::path::Path, args: &[&str], input: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("git")
        .arg("--git-dir")
        .arg(repo)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A replica's branch made by hand on the remote, as a hostile one could
/// push it: a link out of the tree and a `.history` of its own are left
/// out of the merge and said; the rest of the skill arrives.
#[test]
fn a_link_out_of_the_tree_and_a_history_are_not_taken_from_a_replica() {
    let Pair { a, b } = pair("mergehostile");
    let hub = a.root().parent().unwrap().join("hub.git");
    let skill_md = git_in(
        &hub,
        &["hash-object", "-w", "--stdin"],
        skill("evil", "x\n").as_bytes(),
    );
    let link = git_in(
        &hub,
        &["hash-object", "-w", "--stdin"],
        b"../../../../etc/passwd",
    );
    let dir = git_in(
        &hub,
        &["mktree"],
        format!("100644 blob {skill_md}\tSKILL.md\n120000 blob {link}\tpw\n").as_bytes(),
    );
    let hist = git_in(
        &hub,
        &["mktree"],
        format!("100644 blob {skill_md}\tx\n").as_bytes(),
    );
    // Two links that each climb a little and, chained, reach /etc (found
    // by review): no link with a `..` is taken. And a `.history` deeper in.
    let up = git_in(
        &hub,
        &["hash-object", "-w", "--stdin"],
        b"../../../../../..",
    );
    let chained = git_in(
        &hub,
        &["hash-object", "-w", "--stdin"],
        b"m/../../../../../../../etc/passwd",
    );
    let e = git_in(
        &hub,
        &["mktree"],
        format!("120000 blob {up}\tm\n120000 blob {chained}\tl\n").as_bytes(),
    );
    let d = git_in(
        &hub,
        &["mktree"],
        format!("040000 tree {e}\te\n").as_bytes(),
    );
    let deep = git_in(
        &hub,
        &["mktree"],
        format!("040000 tree {d}\td\n040000 tree {hist}\t.history\n").as_bytes(),
    );
    let root = git_in(
        &hub,
        &["mktree"],
        format!(
            "040000 tree {dir}\tevil\n040000 tree {hist}\t.history\n040000 tree {deep}\tdeep\n"
        )
        .as_bytes(),
    );
    let commit = git_in(&hub, &["commit-tree", &root, "-m", "hostile"], b"");
    git_in(
        &hub,
        &[
            "update-ref",
            "refs/heads/skillfs/0123456789abcdef0123456789abcdef",
            &commit,
        ],
        b"",
    );
    let (_, err) = sync(&b);
    assert!(err.contains("a link out of the tree"), "{err}");
    assert!(err.contains(".history"), "{err}");
    assert_eq!(read(&b, "evil/SKILL.md"), skill("evil", "x\n"));
    common::assert_enoent(b.path("evil/pw"));
    common::assert_enoent(b.path(".history/x"));
    common::assert_enoent(b.path("deep/d/e/l"));
    common::assert_enoent(b.path("deep/d/e/m"));
    common::assert_enoent(b.path("deep/.history/x"));
    // What was left out does not hold the merge back: the next sync has
    // nothing to do.
    let (said, _) = sync(&b);
    assert!(!said.contains("merged replica"), "{said}");
    // A version whose words would drive the terminal, and try to pass
    // for two: `log --replica` prints one line, plain.
    let words = "hostile\u{1b}]2;pwned\u{7}\u{1e}0123\u{1f}x\u{1f}9\u{1f}0\u{1f}forged\u{202e}";
    let next = git_in(
        &hub,
        &[
            "commit-tree",
            &root,
            "-p",
            &commit,
            "-m",
            words,
            "-m",
            "skillfs-id: 7\nskillfs-time: 5",
        ],
        b"",
    );
    git_in(
        &hub,
        &[
            "update-ref",
            "refs/heads/skillfs/0123456789abcdef0123456789abcdef",
            &next,
        ],
        b"",
    );
    sync(&b);
    let listed = fetched_log(&b, "0123456789", &[]);
    assert_eq!(listed.lines().count(), 1, "{listed:?}");
    assert!(listed.starts_with("01234567:7  "), "{listed:?}");
    assert!(
        !listed
            .chars()
            .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
        "{listed:?}"
    );
    let json = fetched_log(&b, "0123456789", &["--json"]);
    assert_eq!(json.lines().count(), 1, "{json}");
    verify_full(&b);
}

/// With a schedule in `config.json`, the mounted daemon fetches and
/// merges on its own: a skill pushed by the other replica appears in the
/// live tree without a command.
#[test]
fn the_schedule_merges_what_it_fetches() {
    let s = common::Scratch::new("mergesched");
    fs::create_dir_all(s.store()).unwrap();
    fs::write(
        s.store().join("config.json"),
        r#"{"sync": {"every": "1s"}}"#,
    )
    .unwrap();
    let b = Mount::over(s, Vec::new());
    let a = Mount::new("mergeschedA");
    hub(&a, &b);
    fs::create_dir_all(a.path("cat/s")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "scheduled\n")).unwrap();
    sync(&a);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The tree first, then the merge's own report in the log.
    loop {
        let log = fs::read_to_string(b.store().join("daemon.log")).unwrap();
        let live = fs::read_to_string(b.path("cat/s/SKILL.md")).ok();
        if live == Some(skill("s", "scheduled\n")) && log.contains("merged replica") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not merged in 30 s: {live:?}\n{log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A skill whose `SKILL.md` the other replica removed is a plain
/// directory there: it arrives as that (found by review: it was counted
/// done and nothing changed). Modes the receiving replica gave its files
/// stay (a secret made 0600 stays 0600).
#[test]
fn a_skill_that_stops_being_one_arrives_and_modes_stay() {
    use std::os::unix::fs::PermissionsExt;
    let Pair { a, b } = pair("mergeplain");
    fs::create_dir_all(a.path("cat/s")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "v1\n")).unwrap();
    fs::write(a.path("cat/s/notes.md"), "notes v1\n").unwrap();
    fs::create_dir_all(a.path("cat/t")).unwrap();
    fs::write(a.path("cat/t/SKILL.md"), skill("t", "v1\n")).unwrap();
    fs::write(a.path("cat/t/secret.md"), "key\n").unwrap();
    sync(&a);
    sync(&b);
    fs::set_permissions(b.path("cat/t/secret.md"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(a.path("cat/s/SKILL.md")).unwrap();
    fs::write(a.path("cat/s/notes.md"), "notes v2\n").unwrap();
    fs::write(a.path("cat/t/SKILL.md"), skill("t", "v2\n")).unwrap();
    sync(&a);
    sync(&b);
    common::assert_enoent(b.path("cat/s/SKILL.md"));
    assert_eq!(read(&b, "cat/s/notes.md"), "notes v2\n");
    assert_eq!(read(&b, "cat/t/SKILL.md"), skill("t", "v2\n"));
    let mode = fs::metadata(b.path("cat/t/secret.md"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    verify_full(&b);
}

/// Holds `path` open for writing from a process of its own until the
/// returned child's stdin is closed.
fn hold_open(path: PathBuf) -> std::process::Child {
    let child = Command::new("sh")
        .args(["-c", "exec 3>>\"$1\"; read line", "sh"])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}

/// A unit left for later keeps its own base while the rest moves on: a
/// skill removed here after the rest of a merge landed stays removed
/// (found by review: the whole base stayed behind, and the next merge
/// brought the skill back).
#[test]
fn a_skill_left_for_later_does_not_hold_the_others_back() {
    let Pair { a, b } = pair("mergepending");
    for s in ["s1", "s2"] {
        fs::create_dir_all(a.path(&format!("k/{s}"))).unwrap();
        fs::write(a.path(&format!("k/{s}/SKILL.md")), skill(s, "v1\n")).unwrap();
    }
    sync(&a);
    sync(&b);
    for s in ["s1", "s2"] {
        fs::write(a.path(&format!("k/{s}/SKILL.md")), skill(s, "v2\n")).unwrap();
    }
    sync(&a);
    let mut writer = hold_open(b.path("k/s2/f.md"));
    let (_, err) = sync(&b);
    assert!(err.contains("open for writing"), "{err}");
    assert_eq!(read(&b, "k/s1/SKILL.md"), skill("s1", "v2\n"));
    fs::remove_dir_all(b.path("k/s1")).unwrap();
    sync(&b);
    common::assert_enoent(b.path("k/s1"));
    drop(writer.stdin.take());
    writer.wait().unwrap();
    sync(&b);
    assert_eq!(read(&b, "k/s2/SKILL.md"), skill("s2", "v2\n"));
    common::assert_enoent(b.path("k/s1"));
    verify_full(&b);
}

/// A skill removed here after the other replica merged it stays removed,
/// and nothing flips back and forth in later rounds; an edit of a line
/// the other replica took from here is no conflict with itself (found by
/// review: the base was the other's last commit merged here, older than
/// what it had merged of this tree).
#[test]
fn a_removal_after_the_other_merged_stays_and_nothing_flips() {
    let Pair { a, b } = pair("mergeflip");
    fs::create_dir_all(a.path("k/s1")).unwrap();
    fs::write(a.path("k/s1/SKILL.md"), skill("s1", "1\n2\n3\n")).unwrap();
    sync(&a);
    fs::create_dir_all(b.path("k/big")).unwrap();
    fs::write(b.path("k/big/SKILL.md"), skill("big", "b\n")).unwrap();
    sync(&b);
    sync(&a);
    sync(&a);
    assert_eq!(read(&a, "k/big/SKILL.md"), skill("big", "b\n"));
    fs::remove_dir_all(b.path("k/big")).unwrap();
    for round in 0..4 {
        sync(&b);
        common::assert_enoent(b.path("k/big"));
        sync(&a);
        if round > 0 {
            common::assert_enoent(a.path("k/big"));
        }
    }
    // b edits a line, a takes it, b edits it again: no conflict.
    fs::write(b.path("k/s1/SKILL.md"), skill("s1", "1 by b\n2\n3\n")).unwrap();
    sync(&b);
    sync(&a);
    sync(&a);
    assert_eq!(read(&a, "k/s1/SKILL.md"), skill("s1", "1 by b\n2\n3\n"));
    fs::write(
        b.path("k/s1/SKILL.md"),
        skill("s1", "1 by b, again\n2\n3\n"),
    )
    .unwrap();
    let (said, _) = sync(&b);
    assert!(!said.contains("conflict"), "{said}");
    sync(&a);
    assert_eq!(
        read(&a, "k/s1/SKILL.md"),
        skill("s1", "1 by b, again\n2\n3\n")
    );
    for m in [&a, &b] {
        let out = skillfs(&["sync", "--conflicts", "--root", &root_arg(m)]);
        assert!(out.stdout.is_empty(), "{}", describe(&out));
        verify_full(m);
    }
}

/// An entry that changes kind: a link that becomes a file arrives 0644
/// (not the link's mode), a file outside every skill that becomes a
/// directory arrives as one, and nothing stays waiting (found by review).
#[test]
fn an_entry_that_changes_kind_arrives() {
    use std::os::unix::fs::PermissionsExt;
    let Pair { a, b } = pair("mergekind");
    fs::create_dir_all(a.path("cat/s")).unwrap();
    fs::write(a.path("cat/s/SKILL.md"), skill("s", "v1\n")).unwrap();
    std::os::unix::fs::symlink("SKILL.md", a.path("cat/s/link")).unwrap();
    fs::write(a.path("notes"), "a file\n").unwrap();
    sync(&a);
    sync(&b);
    assert_eq!(
        fs::read_link(b.path("cat/s/link")).unwrap().to_str(),
        Some("SKILL.md")
    );
    fs::remove_file(a.path("cat/s/link")).unwrap();
    fs::write(a.path("cat/s/link"), "now a file\n").unwrap();
    fs::remove_file(a.path("notes")).unwrap();
    fs::create_dir(a.path("notes")).unwrap();
    fs::write(a.path("notes/x.md"), "inside\n").unwrap();
    sync(&a);
    let (said, err) = sync(&b);
    assert!(!said.contains("left for the next sync"), "{said}\n{err}");
    assert_eq!(read(&b, "cat/s/link"), "now a file\n");
    let mode = fs::symlink_metadata(b.path("cat/s/link"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644, "{mode:o}");
    assert_eq!(read(&b, "notes/x.md"), "inside\n");
    let (said, _) = sync(&b);
    assert!(!said.contains("merged replica"), "nothing waits: {said}");
    verify_full(&b);
}

/// Every file of `m`'s live tree with its bytes (links as their target).
fn contents(m: &Mount) -> std::collections::BTreeMap<String, Vec<u8>> {
    listing(m)
        .into_iter()
        .filter_map(|p| {
            let full = m.path(&p);
            let md = fs::symlink_metadata(&full).ok()?;
            if md.is_dir() {
                return None;
            }
            let bytes = if md.file_type().is_symlink() {
                fs::read_link(&full)
                    .ok()?
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                fs::read(&full).ok()?
            };
            Some((p, bytes))
        })
        .collect()
}

/// The paths `m` lists as conflicts.
pub(crate) fn conflict_paths(m: &Mount) -> Vec<String> {
    let out = skillfs(&["sync", "--conflicts", "--root", &root_arg(m)]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(p, _)| p.to_string()))
        .collect()
}

/// Three replicas, random creates, edits (of different lines and of the
/// same), removals and syncs, some syncs killed part way: once every
/// replica has synced a few times more, the live trees are equal except
/// under the paths listed as conflicts, no tree holds a conflict file,
/// and `verify --full` passes everywhere.
#[test]
fn three_replicas_converge_through_random_edits_and_killed_syncs() {
    // Seed 4 brought a removal back before merges were parents.
    let seeds: Vec<u64> = match std::env::var("SKILLFS_SYNC_SEED") {
        Ok(s) => vec![s.parse().expect("SKILLFS_SYNC_SEED is a number")],
        Err(_) => vec![7, 4],
    };
    for seed in seeds {
        three_replicas_with(seed);
    }
}

fn three_replicas_with(seed: u64) {
    let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    let ms: Vec<Mount> = ["rand0", "rand1", "rand2"]
        .map(|t| Mount::new(&format!("{t}-{seed}")))
        .into();
    let remote: PathBuf = ms[0].root().parent().unwrap().join("hub.git");
    common::bare_repo(&remote);
    for m in &ms {
        let url = remote.to_str().unwrap();
        let out = skillfs(&["remote", "add", "hub", url, "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    let lines = |tag: &str| -> String { (0..8).map(|l| format!("{tag} line {l}\n")).collect() };
    let steps: u64 = std::env::var("SKILLFS_SYNC_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    for step in 0..steps {
        let m = &ms[next(3) as usize];
        let s = format!("k/s{}", next(5));
        let md = m.path(&format!("{s}/SKILL.md"));
        match next(6) {
            0 => {
                fs::create_dir_all(m.path(&s)).unwrap();
                fs::write(
                    &md,
                    skill(&s.replace('/', "-"), &lines(&format!("step{step}"))),
                )
                .unwrap();
            }
            1 | 2 => {
                // One line of it, replaced.
                if let Ok(text) = fs::read_to_string(&md) {
                    let mut ls: Vec<String> = text.lines().map(str::to_string).collect();
                    let i = 4 + next(ls.len().saturating_sub(4).max(1) as u64) as usize;
                    if i < ls.len() {
                        ls[i] = format!("edited at step {step}");
                    }
                    fs::write(&md, ls.join("\n") + "\n").unwrap();
                }
            }
            3 => {
                let _ = fs::remove_dir_all(m.path(&s));
            }
            4 => {
                sync(m);
            }
            _ => {
                // A sync killed part way, with the git it runs (as Ctrl-C
                // or a service stop does: the whole process group).
                use std::os::unix::process::CommandExt;
                let mut child = Command::new(common::BIN)
                    .args(["sync", "--root", &root_arg(m)])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .process_group(0)
                    .spawn()
                    .unwrap();
                std::thread::sleep(std::time::Duration::from_millis(next(400)));
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
            }
        }
    }
    // Quiet: every replica syncs a few times more.
    let quiet: usize = std::env::var("SKILLFS_SYNC_QUIET")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    for _ in 0..quiet {
        for m in &ms {
            // A sync killed while it held the lock left nothing held: the
            // flock went with the process.
            sync(m);
        }
    }
    let conflicts: Vec<String> = ms.iter().flat_map(conflict_paths).collect();
    let outside = |p: &String| {
        !conflicts
            .iter()
            .any(|c| p == c || p.starts_with(&format!("{c}/")))
    };
    let trees: Vec<_> = ms
        .iter()
        .map(|m| {
            contents(m)
                .into_iter()
                .filter(|(p, _)| outside(p))
                .collect::<std::collections::BTreeMap<_, _>>()
        })
        .collect();
    // The paths where two trees differ, with what each holds there.
    let differ = |x: usize, y: usize| -> Vec<String> {
        let keys: std::collections::BTreeSet<_> = trees[x].keys().chain(trees[y].keys()).collect();
        keys.into_iter()
            .filter(|k| trees[x].get(*k) != trees[y].get(*k))
            .map(|k| {
                let show = |t: &std::collections::BTreeMap<String, Vec<u8>>| {
                    t.get(k).map(|b| String::from_utf8_lossy(b).into_owned())
                };
                format!("{k}: {x}={:?} {y}={:?}", show(&trees[x]), show(&trees[y]))
            })
            .collect()
    };
    for (x, y) in [(0, 1), (1, 2)] {
        let d = differ(x, y);
        assert!(d.is_empty(), "seed {seed}; conflicts {conflicts:?}; {d:#?}");
    }
    for m in &ms {
        for p in listing(m) {
            assert!(!p.contains("conflict"), "a conflict file: {p}");
        }
        verify_full(m);
    }
}

/// Three mounts whose remote `hub` is beside the first; with `ids`, each
/// replica's id is its digit 32 times (a sync merges the others in the
/// order of their ids).
fn three(tags: [&str; 3], ids: Option<[&str; 3]>) -> [Mount; 3] {
    let ms = tags.map(Mount::new);
    let remote = hub(&ms[0], &ms[1]);
    let url = remote.to_str().unwrap();
    let out = skillfs(&["remote", "add", "hub", url, "--root", &root_arg(&ms[2])]);
    assert!(out.status.success(), "{}", describe(&out));
    for (m, id) in ms.iter().zip(ids.into_iter().flatten()) {
        fs::write(m.store().join("REPLICA"), format!("{}\n", id.repeat(32))).unwrap();
    }
    ms
}

/// `m` lists no conflict, and `verify --full` passes.
fn settled(m: &Mount) {
    let out = skillfs(&["sync", "--conflicts", "--root", &root_arg(m)]);
    assert!(out.stdout.is_empty(), "{}", describe(&out));
    verify_full(m);
}

/// A removal one replica learned through another is not undone by a
/// third that still holds the older state: a and c hold a's skill, a
/// removes it, and b, which never held it, merges both in one sync. The
/// merge of c once took the skill for c's addition, because the base
/// came from b's pushed branch alone, which did not know yet what b had
/// just merged of a (found by the three-replica test under load): b then
/// kept the skill, the others did not, and no replica listed it.
#[test]
fn a_removal_learned_through_one_replica_is_not_undone_by_another() {
    let [a, b, c] = three(["mergethirdA", "mergethirdB", "mergethirdC"], None);
    fs::create_dir_all(b.path("k/b")).unwrap();
    fs::write(b.path("k/b/SKILL.md"), skill("b", "b\n")).unwrap();
    sync(&b);
    fs::create_dir_all(a.path("k/s")).unwrap();
    fs::write(a.path("k/s/SKILL.md"), skill("s", "1\n2\n")).unwrap();
    sync(&a);
    // c takes it, and pushes its merge.
    sync(&c);
    sync(&c);
    assert_eq!(read(&c, "k/s/SKILL.md"), skill("s", "1\n2\n"));
    fs::remove_dir_all(a.path("k/s")).unwrap();
    sync(&a);
    // b merges a's removal and c's older state in one sync.
    sync(&b);
    common::assert_enoent(b.path("k/s"));
    for _ in 0..3 {
        for m in [&a, &b, &c] {
            sync(m);
        }
    }
    for m in [&a, &b, &c] {
        common::assert_enoent(m.path("k/s"));
        assert_eq!(read(m, "k/b/SKILL.md"), skill("b", "b\n"));
        settled(m);
    }
}

/// `k/p/SKILL.md` with `line` as its second line.
fn p_text(line: &str) -> String {
    skill("p", &format!("1\n{line}\n3\n"))
}

/// `k/p` made on `maker` and synced in `order` until all three hold it.
fn p_everywhere(maker: &Mount, order: &[&Mount]) {
    fs::create_dir_all(maker.path("k/p")).unwrap();
    fs::write(maker.path("k/p/SKILL.md"), p_text("2")).unwrap();
    for _ in 0..2 {
        for m in order {
            sync(m);
        }
    }
    for m in order {
        assert_eq!(read(m, "k/p/SKILL.md"), p_text("2"));
    }
}

/// x edits p's line; c takes it, makes `q` and pushes both; then b edits
/// the same line and syncs twice (merging what it can reach of the two,
/// and pushing that).
fn both_edit_p([x, b, c]: [&Mount; 3]) {
    fs::write(x.path("k/p/SKILL.md"), p_text("2 by x")).unwrap();
    sync(x);
    sync(c);
    fs::create_dir_all(c.path("k/q")).unwrap();
    fs::write(c.path("k/q/SKILL.md"), skill("q", "q\n")).unwrap();
    sync(c);
    assert_eq!(read(c, "k/p/SKILL.md"), p_text("2 by x"));
    fs::write(b.path("k/p/SKILL.md"), p_text("2 by b")).unwrap();
    sync(b);
    sync(b);
}

/// Of two texts, the one a third replica keeps live when it meets both
/// in a conflict (`skillfs_sync::merge::prefer`, on the texts' hashes).
pub(crate) fn preferred<'a>(one: &'a str, other: &'a str) -> &'a str {
    use sha2::Digest;
    let entry = |t: &str| skillfs_sync::tree::Entry::File {
        blob: sha2::Sha256::digest(t.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        exec: false,
    };
    if skillfs_sync::merge::prefer(&entry(one), &entry(other)) {
        one
    } else {
        other
    }
}

/// The line of `p_text` a third replica keeps of x's and b's.
fn third_pick() -> &'static str {
    let x = p_text("2 by x");
    if preferred(&x, &p_text("2 by b")) == x {
        "2 by x"
    } else {
        "2 by b"
    }
}

/// x and b each keep their own line, c holds `c_holds`'s, and c's skill
/// `q` is everywhere.
fn kept_apart([x, b, c]: [&Mount; 3], text: impl Fn(&str) -> String, c_holds: &str) {
    assert_eq!(read(x, "k/p/SKILL.md"), text("2 by x"), "x keeps its own");
    assert_eq!(read(c, "k/p/SKILL.md"), text(c_holds));
    assert_eq!(read(b, "k/p/SKILL.md"), text("2 by b"), "b keeps its own");
    for m in [x, b, c] {
        assert_eq!(read(m, "k/q/SKILL.md"), skill("q", "q\n"));
    }
}

/// A side kept against one replica is kept against the replica that made
/// the other side too: x edits a line, c takes it and pushes its merge
/// of x, b edits the same line and merges c (a conflict: b keeps its
/// side) and then x in one sync. Knowing c's merge of x, the base of x's
/// merge at that line is x's own edit, so b listed no conflict with x and
/// told x nothing, and x then took b's side for a change of b's, silently
/// (found by review). Each replica's ids are set so that c is merged
/// before x.
#[test]
fn a_side_kept_against_one_replica_is_kept_against_its_author_too() {
    let [x, b, c] = three(
        ["mergekeptX", "mergekeptB", "mergekeptC"],
        Some(["f", "8", "1"]),
    );
    let text = p_text;
    p_everywhere(&x, &[&x, &b, &c]);
    both_edit_p([&x, &b, &c]);
    for _ in 0..2 {
        for m in [&x, &c, &b] {
            sync(m);
        }
    }
    // b's side reaches c with b's word that it kept it (b merged c
    // first); c only passed x's on, so the two meet as a conflict there
    // and the rule picks, as on any third replica.
    kept_apart([&x, &b, &c], text, third_pick());
    let listed = |m: &Mount| {
        let out = skillfs(&["sync", "--conflicts", "--root", &root_arg(m)]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(listed(&b).contains("k/p/SKILL.md"), "{}", listed(&b));
    for m in [&x, &b, &c] {
        verify_full(m);
    }
}

/// The removal of the test before, learned from a replica one of whose
/// skills waits (open for writing here): what was merged of that replica
/// still counts outside the skill that waits (found by review: the
/// replica was left out whole, and the removal undone). Ids are set so
/// that a is merged before c.
#[test]
fn a_removal_learned_from_a_replica_with_a_skill_waiting_is_not_undone() {
    let [a, b, c] = three(
        ["mergewaitA", "mergewaitB", "mergewaitC"],
        Some(["1", "8", "f"]),
    );
    fs::create_dir_all(b.path("k/t")).unwrap();
    fs::write(b.path("k/t/SKILL.md"), skill("t", "1\n")).unwrap();
    for _ in 0..2 {
        for m in [&b, &a, &c] {
            sync(m);
        }
    }
    fs::create_dir_all(a.path("k/s")).unwrap();
    fs::write(a.path("k/s/SKILL.md"), skill("s", "s\n")).unwrap();
    sync(&a);
    sync(&c);
    sync(&c);
    assert_eq!(read(&c, "k/s/SKILL.md"), skill("s", "s\n"));
    fs::remove_dir_all(a.path("k/s")).unwrap();
    fs::write(a.path("k/t/SKILL.md"), skill("t", "1 by a\n")).unwrap();
    sync(&a);
    let mut writer = hold_open(b.path("k/t/notes.md"));
    let (_, err) = sync(&b);
    assert!(err.contains("open for writing"), "{err}");
    common::assert_enoent(b.path("k/s"));
    drop(writer.stdin.take());
    writer.wait().unwrap();
    for _ in 0..3 {
        for m in [&a, &b, &c] {
            sync(m);
        }
    }
    for m in [&a, &b, &c] {
        common::assert_enoent(m.path("k/s"));
        assert_eq!(read(m, "k/t/SKILL.md"), skill("t", "1 by a\n"));
        settled(m);
    }
}

/// A side kept because the other replica said it kept its own (its
/// `skillfs-kept:` trailer) is recorded as kept here too: b and c edit
/// one line; c merges b (a conflict, listed on c) and exports that; b
/// merges c, keeping its side by c's trailer, and exports. b's commit
/// (with c's as a parent) once named nothing kept, so c's next merge of
/// it had c's own side as the base and took b's, silently, though c still
/// listed the conflict as its side live (found by review).
#[test]
fn a_side_kept_by_the_other_replicas_word_stays_kept_on_both() {
    let Pair { a: b, b: c } = pair("mergeword");
    p_everywhere(&c, &[&c, &b]);
    fs::write(b.path("k/p/SKILL.md"), p_text("2 by b")).unwrap();
    fs::create_dir_all(b.path("k/t")).unwrap();
    fs::write(b.path("k/t/SKILL.md"), skill("t", "t\n")).unwrap();
    sync(&b);
    fs::write(c.path("k/p/SKILL.md"), p_text("2 by c")).unwrap();
    fs::create_dir_all(c.path("k/q")).unwrap();
    fs::write(c.path("k/q/SKILL.md"), skill("q", "q\n")).unwrap();
    sync(&c);
    sync(&c);
    sync(&b);
    sync(&b);
    for _ in 0..3 {
        sync(&c);
        sync(&b);
    }
    assert_eq!(
        read(&b, "k/p/SKILL.md"),
        p_text("2 by b"),
        "b keeps its own"
    );
    assert_eq!(
        read(&c, "k/p/SKILL.md"),
        p_text("2 by c"),
        "c keeps its own"
    );
    for m in [&b, &c] {
        assert_eq!(read(m, "k/t/SKILL.md"), skill("t", "t\n"));
        assert_eq!(read(m, "k/q/SKILL.md"), skill("q", "q\n"));
        verify_full(m);
    }
    let out = skillfs(&["sync", "--conflicts", "--root", &root_arg(&c)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("k/p/SKILL.md"),
        "{}",
        describe(&out)
    );
}

/// The case before with a third replica: x and c share a remote that b
/// reaches x through only later. c keeps x's side against b (listed on
/// c); b keeps its own by c's word and, in the same sync, first merges
/// x. Unless that side counts as kept on b (masked), x's merge base is
/// x's own edit, so b tells x nothing, and x took b's side (found by
/// review).
#[test]
fn a_side_kept_by_word_is_kept_against_a_third_in_the_same_sync() {
    let [x, b, c] = three(
        ["mergewordX", "mergewordB", "mergewordC"],
        Some(["f", "8", "1"]),
    );
    let out = skillfs(&["remote", "remove", "hub", "--root", &root_arg(&x)]);
    assert!(out.status.success(), "{}", describe(&out));
    let xhub = x.root().parent().unwrap().join("xhub.git");
    common::bare_repo(&xhub);
    for m in [&x, &c] {
        let url = xhub.to_str().unwrap();
        let out = skillfs(&["remote", "add", "xhub", url, "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    p_everywhere(&b, &[&b, &c, &x]);
    fs::write(x.path("k/p/SKILL.md"), p_text("2 by x")).unwrap();
    sync(&x);
    sync(&c);
    fs::write(b.path("k/p/SKILL.md"), p_text("2 by b")).unwrap();
    fs::create_dir_all(b.path("k/t")).unwrap();
    fs::write(b.path("k/t/SKILL.md"), skill("t", "t\n")).unwrap();
    sync(&b);
    fs::create_dir_all(c.path("k/q")).unwrap();
    fs::write(c.path("k/q/SKILL.md"), skill("q", "q\n")).unwrap();
    sync(&c);
    sync(&c);
    assert_eq!(read(&c, "k/t/SKILL.md"), skill("t", "t\n"));
    let url = x.root().parent().unwrap().join("hub.git");
    let url = url.to_str().unwrap().to_string();
    let out = skillfs(&["remote", "add", "hub", &url, "--root", &root_arg(&x)]);
    assert!(out.status.success(), "{}", describe(&out));
    sync(&x);
    sync(&b);
    for _ in 0..2 {
        for m in [&b, &x, &c] {
            sync(m);
        }
    }
    // c met both sides, having only passed x's on: the rule's pick.
    kept_apart([&x, &b, &c], p_text, third_pick());
    for m in [&x, &b, &c] {
        verify_full(m);
    }
}

/// One replica edits a file again and again while both sync in turn: the
/// merges recorded as parents made two merge bases (a criss-cross), and
/// a base made of the two by a merge against nothing hid an edit, which
/// never arrived (found by measuring). Every edit arrives, no conflict.
#[test]
fn edits_keep_arriving_through_criss_cross_merges() {
    let Pair { a, b } = pair("mergecross");
    for i in 0..20 {
        let s = format!("s{i}");
        fs::create_dir_all(a.path(&format!("k/{s}"))).unwrap();
        fs::write(a.path(&format!("k/{s}/SKILL.md")), skill(&s, "v0\n")).unwrap();
    }
    sync(&a);
    sync(&b);
    let md = "k/s7/SKILL.md";
    let mut text = skill("s7", "v0\n");
    for round in 0..6 {
        text.push_str(&format!("edit {round}\n"));
        fs::write(a.path(md), &text).unwrap();
        sync(&a);
        sync(&b);
        assert_eq!(read(&b, md), text, "round {round}");
    }
    let (said, _) = sync(&b);
    assert!(!said.contains("conflict"), "{said}");
    verify_full(&b);
}

/// A listing of another replica's version fails rather than comes out
/// short: when the version's tree, forgotten from memory by lookups of
/// other versions between two entries of one reply, cannot be read again
/// (the store's repository gone meanwhile), `readdirplus` says so instead
/// of leaving the rest out, which a `cp -a` would take for the whole
/// directory. In-process (the core without a kernel), so that the other
/// lookups come in the middle of one reply.
#[test]
fn a_listing_of_another_replicas_version_fails_rather_than_comes_short() {
    use skillfs::fs::{DirectoryEntry, DirectoryReplier, Ino, ROOT_INO, SkillFs};

    /// Keeps the names given; if `armed`, after the first that is not `.`
    /// or `..` looks up every other version (their trees put the listed
    /// one's out of memory) and takes the repository away.
    struct Evicting<'a> {
        fs: &'a SkillFs,
        history: Ino,
        others: &'a [String],
        repo: PathBuf,
        armed: bool,
        got: Vec<String>,
    }
    impl DirectoryReplier for Evicting<'_> {
        fn add(&mut self, e: DirectoryEntry<'_>) -> bool {
            let name = String::from_utf8(e.name.to_vec()).unwrap();
            let dot = name == "." || name == "..";
            self.got.push(name);
            if self.armed && !dot {
                self.armed = false;
                for o in self.others {
                    self.fs.lookup(self.history, o.as_bytes()).unwrap();
                }
                fs::rename(&self.repo, self.repo.with_extension("away")).unwrap();
            }
            false
        }
    }

    let Pair { a, mut b } = pair("theirslisting");
    fs::create_dir_all(a.path("cat/s")).unwrap();
    fs::write(a.path("cat/s/a.md"), "a\n").unwrap();
    fs::write(a.path("cat/s/b.md"), "b\n").unwrap();
    for i in 0..20 {
        fs::write(a.path("cat/s/SKILL.md"), skill("s", &format!("{i}\n"))).unwrap();
    }
    sync(&a);
    b.umount();
    sync(&b);
    let id = replica_of(&a);
    let names: Vec<String> = fetched_log(&b, &id, &["--json"])
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!("{}:{}", &id[..8], v["id"].as_u64().unwrap())
        })
        .collect();
    // More versions than the core keeps trees of (16).
    assert!(names.len() > 20, "{names:?}");
    let (last, others) = names.split_last().unwrap();
    // B's guard goes first: the core opened here names this process in
    // the store's LOCK, which the guard would take for B's daemon (waited
    // for at its drop, killed past its deadline). Its directory stays.
    let scratch = std::mem::replace(&mut b.scratch, common::Scratch::new("theirslistingspare"));
    drop(b);
    let core =
        skillfs::open::open_core(&scratch.root(), &scratch.store(), Default::default()).unwrap();
    let sfs = core.fs();
    let history = sfs.lookup(ROOT_INO, b".history").unwrap().ino;
    let mut at = sfs.lookup(history, last.as_bytes()).unwrap().ino;
    for name in ["cat", "s"] {
        at = sfs.lookup(at, name.as_bytes()).unwrap().ino;
    }
    let repo = scratch.store().join("sync").join("repo.git");
    let mut reply = Evicting {
        fs: sfs,
        history,
        others,
        repo: repo.clone(),
        armed: true,
        got: Vec::new(),
    };
    let e = sfs.readdirplus(at, 0, &mut reply).unwrap_err();
    assert!(e.is(libc::EIO), "{e:?} after {:?}", reply.got);
    assert_eq!(reply.got.len(), 3, "{:?}", reply.got);
    // With its repository back, the listing is whole.
    fs::rename(repo.with_extension("away"), &repo).unwrap();
    reply.got.clear();
    sfs.readdirplus(at, 0, &mut reply).unwrap();
    reply.got.sort();
    assert_eq!(reply.got, [".", "..", "SKILL.md", "a.md", "b.md"]);
    core.close();
}
