//! Versioning through a real mount: copy-on-write versions, the journal's
//! records, offline edits, no lock-in and stable caches (G1, G2, G6, G7).

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Mount, sha256_hex, skillfs};

fn writes_of(m: &Mount, path: &str) -> Vec<String> {
    m.log()
        .into_iter()
        .filter(|r| r["path"] == path && r["state"]["blob"].is_string())
        .map(|r| r["state"]["blob"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_close_is_a_version_and_identical_content_is_not() {
    let m = Mount::new("versions");
    let p = m.path("SKILL.md");
    for v in ["one", "two", "three"] {
        fs::write(&p, v).unwrap();
    }
    let blobs = writes_of(&m, "SKILL.md");
    let contents: Vec<Vec<u8>> = blobs.iter().map(|b| m.blob(b)).collect();
    for v in ["one", "two", "three"] {
        assert!(
            contents.contains(&v.as_bytes().to_vec()),
            "{v} not in history"
        );
    }
    let n = m.log().len();
    fs::write(&p, "three").unwrap();
    assert_eq!(m.log().len(), n, "identical content recorded a version");
    // Opening for writing and closing without a write records nothing.
    drop(OpenOptions::new().write(true).open(&p).unwrap());
    assert_eq!(m.log().len(), n);
}

#[test]
fn overwritten_renamed_and_deleted_content_stays_in_history() {
    let m = Mount::new("history");
    fs::write(m.path("a"), "content of a").unwrap();
    fs::write(m.path("b"), "content of b").unwrap();
    fs::rename(m.path("b"), m.path("a")).unwrap();
    fs::remove_file(m.path("a")).unwrap();
    let log = m.log();
    let all: Vec<Vec<u8>> = log
        .iter()
        .filter_map(|r| r["state"]["blob"].as_str())
        .map(|b| m.blob(b))
        .collect();
    assert!(all.contains(&b"content of a".to_vec()));
    assert!(all.contains(&b"content of b".to_vec()));
    let ops: Vec<&str> = log.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(
        ops,
        ["create", "write", "create", "write", "rename", "unlink"]
    );
}

/// A process forked while a file is open for writing holds it too, and
/// its `exec` closes it (close-on-exec): that flush, before the writer's
/// own close, publishes the writer's bytes. Their actor is the writer,
/// not the process that happened to flush them.
#[test]
fn a_version_is_the_writers_even_when_a_forked_child_flushes_it() {
    let m = Mount::new("actor-fork");
    let p = m.path("w.md");
    let (written, forked) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("the-writer".into())
            .spawn_scoped(s, || {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&p)
                    .unwrap();
                f.write_all(b"the writer's bytes").unwrap();
                written.wait();
                forked.wait();
                drop(f);
            })
            .unwrap();
        std::thread::Builder::new()
            .name("the-forker".into())
            .spawn_scoped(s, || {
                written.wait();
                // The child holds the writer's file from its fork to its
                // exec, and flushes it there.
                let st = Command::new("true").status().unwrap();
                assert!(st.success());
                forked.wait();
            })
            .unwrap();
    });
    let log = m.log_when(|l| l.iter().any(|r| r["op"] == "write"));
    let w: Vec<_> = log.iter().filter(|r| r["op"] == "write").collect();
    assert_eq!(w.len(), 1, "{log:#?}");
    assert_eq!(w[0]["state"]["blob"], sha256_hex(b"the writer's bytes"));
    assert_eq!(w[0]["actor"]["comm"], "the-writer", "{:#?}", w[0]);
}

/// The writer's name is taken when it writes: a thread that wrote and
/// ended before the file was closed (its id gone from `/proc`) still
/// names the version.
#[test]
fn a_version_names_its_writer_after_the_writers_thread_ended() {
    let m = Mount::new("actor-gone");
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("w.md"))
        .unwrap();
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("gone-writer".into())
            .spawn_scoped(s, || (&f).write_all(b"written, then gone").unwrap())
            .unwrap();
    });
    // Longer than a process name is remembered by pid (a second).
    std::thread::sleep(Duration::from_millis(1100));
    drop(f);
    let log = m.log_when(|l| l.iter().any(|r| r["op"] == "write"));
    let w: Vec<_> = log.iter().filter(|r| r["op"] == "write").collect();
    assert_eq!(w.len(), 1, "{log:#?}");
    assert_eq!(w[0]["actor"]["comm"], "gone-writer", "{:#?}", w[0]);
}

#[test]
fn journal_records_have_gap_free_ids_actor_and_state() {
    let m = Mount::new("journal");
    let script = "import sys,pathlib; pathlib.Path(sys.argv[1]).write_text('from python')";
    let st = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(m.path("py.md"))
        .status()
        .unwrap();
    assert!(st.success());
    fs::create_dir(m.path("dir")).unwrap();
    let log = m.log();
    for (i, r) in log.iter().enumerate() {
        assert_eq!(r["seq"], (i + 1) as u64, "ids must be gap-free from 1");
        assert!(r["ts"].as_i64().unwrap() > 1_700_000_000_000_000_000);
        assert!(r["actor"]["pid"].as_u64().unwrap() > 0);
        assert_eq!(r["actor"]["uid"], unsafe { libc::geteuid() });
    }
    let w = log.iter().find(|r| r["op"] == "write").unwrap();
    assert_eq!(w["actor"]["comm"], "python3");
    assert_eq!(w["path"], "py.md");
    assert_eq!(w["state"]["size"], 11);
    assert_eq!(w["state"]["kind"], "file");
    assert_eq!(w["state"]["blob"], sha256_hex(b"from python"));
    let md = fs::metadata(m.path("py.md")).unwrap();
    assert_eq!(w["state"]["mode"], md.mode() & 0o7777);
    assert_eq!(
        w["state"]["mtime_ns"],
        md.mtime() * 1_000_000_000 + md.mtime_nsec()
    );
    let d = log.iter().find(|r| r["op"] == "mkdir").unwrap();
    assert_eq!(d["state"]["kind"], "dir");
    // The human form of the log names the same changes.
    let root = m.root().display().to_string();
    let out = skillfs(&["log", "--root", &root, "py.md"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("write") && text.contains("py.md") && text.contains("python3"),
        "{text}"
    );
    assert!(!text.contains("dir"), "path filter: {text}");
}

#[test]
fn non_utf8_names_round_trip_losslessly() {
    let m = Mount::new("bytes");
    let name = OsStr::from_bytes(b"caf\xe9-\xff.md");
    fs::write(m.root().join(name), b"latin-1 name").unwrap();
    let names: Vec<Vec<u8>> = fs::read_dir(m.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    assert_eq!(names, vec![b"caf\xe9-\xff.md".to_vec()]);
    let log = m.log();
    let hex: String = b"caf\xe9-\xff.md"
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        log.iter().any(|r| r["path"]["hex"] == hex.as_str()),
        "{log:?}"
    );
    let mut m = m;
    m.umount();
    assert_eq!(fs::read(m.root().join(name)).unwrap(), b"latin-1 name");
    m.remount();
    // The scan matches the recorded bytes: nothing new.
    assert_eq!(m.log().len(), log.len());
}

fn tree(root: &Path) -> BTreeMap<String, (Vec<u8>, u32, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let data = if md.is_file() {
                fs::read(&p).unwrap()
            } else if md.file_type().is_symlink() {
                fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec()
            } else {
                stack.push(p.clone());
                Vec::new()
            };
            let mtime = if md.is_dir() { 0 } else { md.mtime() };
            let mtime_ns = if md.is_dir() { 0 } else { md.mtime_nsec() };
            out.insert(rel, (data, md.mode(), mtime, mtime_ns));
        }
    }
    out
}

#[test]
fn baseline_offline_edits_and_no_lock_in() {
    let mut m = Mount::with_tree("offline", |root| {
        fs::create_dir_all(root.join("cat/foo/references")).unwrap();
        fs::write(root.join("cat/foo/SKILL.md"), "---\nname: foo\n---\n").unwrap();
        fs::write(root.join("cat/foo/references/r.md"), "ref").unwrap();
        fs::write(root.join("gone.md"), "will be removed offline").unwrap();
        std::os::unix::fs::symlink("cat/foo", root.join("link")).unwrap();
    });
    // The first mount records the whole tree as the baseline.
    let log = m.log();
    let scanned: Vec<&str> = log
        .iter()
        .filter(|r| r["op"] == "scan")
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        scanned,
        [
            "cat",
            "gone.md",
            "link",
            "cat/foo",
            "cat/foo/SKILL.md",
            "cat/foo/references",
            "cat/foo/references/r.md"
        ]
    );
    fs::write(m.path("cat/foo/SKILL.md"), "---\nname: foo\n---\nv2\n").unwrap();
    let seen_mounted = tree(&m.root());
    m.umount();
    // G6: after umount ROOT holds exactly the current files, with the same
    // bytes, modes and mtimes (G7) as seen through the mount.
    assert_eq!(tree(&m.root()), seen_mounted);
    let before = m.log().len();

    // Offline edits: change, add, remove.
    fs::write(m.path("cat/foo/references/r.md"), "ref edited offline").unwrap();
    fs::write(m.path("new.md"), "added offline").unwrap();
    fs::remove_file(m.path("gone.md")).unwrap();
    m.remount();
    let log = m.log();
    let new: Vec<(String, String)> = log[before..]
        .iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap().to_string(),
                r["path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("scan", "new.md"),
        ("scan", "cat/foo/references/r.md"),
        ("scan-remove", "gone.md"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(new, want);
    let blob = log[before..]
        .iter()
        .find(|r| r["path"] == "cat/foo/references/r.md")
        .unwrap()["state"]["blob"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(m.blob(&blob), b"ref edited offline");
}

fn rchar(pid: u32) -> u64 {
    let io = fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn remounting_an_unchanged_tree_reads_no_file() {
    let big = vec![7u8; 16 << 20];
    let mut m = Mount::with_tree("unchanged", |root| {
        fs::write(root.join("big.bin"), &big).unwrap();
        for i in 0..50 {
            fs::write(root.join(format!("f{i}.md")), format!("file {i}")).unwrap();
        }
    });
    assert!(rchar(m.pid) >= 16 << 20, "the baseline hashes the big file");
    m.umount();
    let n = m.log().len();
    m.remount();
    let read = rchar(m.pid);
    assert!(
        read < 4 << 20,
        "remount read {read} bytes; it must only stat"
    );
    assert_eq!(m.log().len(), n);
}

#[test]
fn sigterm_unmounts_cleanly_and_publishes() {
    let m = Mount::new("sigterm");
    fs::write(m.path("kept.md"), "kept").unwrap();
    unsafe { libc::kill(m.pid as i32, libc::SIGTERM) };
    let t = Instant::now();
    while common::is_mounted(&m.root()) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!common::is_mounted(&m.root()));
    while common::pid_alive(m.pid) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!common::pid_alive(m.pid), "daemon still alive");
    assert_eq!(fs::read(m.path("kept.md")).unwrap(), b"kept");
    assert_staging_holds_nothing(&m);
}

#[test]
fn a_writer_killed_mid_write_leaves_the_old_version() {
    let mut m = Mount::new("midwrite");
    fs::write(m.path("f.md"), "complete old version").unwrap();
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path("f.md"))
        .unwrap();
    f.write_all(b"half of a new vers").unwrap();
    // The daemon dies before the writer closes.
    m.kill9();
    drop(f);
    m.remount();
    assert_eq!(fs::read(m.path("f.md")).unwrap(), b"complete old version");
    assert_staging_holds_nothing(&m);
}

fn has_content(m: &Mount, bytes: &[u8]) -> bool {
    m.log()
        .iter()
        .filter_map(|r| r["state"]["blob"].as_str())
        .any(|b| m.blob(b) == bytes)
}

#[test]
fn staged_bytes_are_kept_when_the_file_is_deleted_replaced_or_truncated() {
    let m = Mount::new("staged");
    for (i, action) in ["unlink", "rename-over", "o_trunc", "truncate"]
        .iter()
        .enumerate()
    {
        let p = m.path(&format!("f{i}"));
        fs::write(&p, "published").unwrap();
        let staged = format!("staged by a writer that has not closed ({action})");
        let mut w = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        w.write_all(staged.as_bytes()).unwrap();
        // Another process sees those bytes, then changes the file.
        assert_eq!(fs::read(&p).unwrap(), staged.as_bytes());
        match *action {
            "unlink" => fs::remove_file(&p).unwrap(),
            "rename-over" => {
                fs::write(m.path("other"), "replacement").unwrap();
                fs::rename(m.path("other"), &p).unwrap();
            }
            "o_trunc" => drop(
                OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&p)
                    .unwrap(),
            ),
            _ => OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(3)
                .unwrap(),
        }
        assert!(
            has_content(&m, staged.as_bytes()),
            "{action}: staged bytes lost"
        );
        drop(w);
    }
}

#[test]
fn untracked_files_are_written_safely_but_keep_no_versions() {
    let m = Mount::new("untracked");
    fs::write(m.path(".usage.json"), "{\"a\": 1}").unwrap();
    fs::write(m.path(".usage.json"), "{\"a\": 2}").unwrap();
    fs::write(m.path(".curator_ledger.jsonl"), "{}\n").unwrap();
    fs::create_dir(m.path("cat")).unwrap();
    fs::write(m.path("cat/.usage.json"), "tracked: not at the root").unwrap();
    let log = m.log();
    assert!(
        !log.iter()
            .any(|r| r["path"] == ".usage.json" || r["path"] == ".curator_ledger.jsonl"),
        "{log:?}"
    );
    assert!(log.iter().any(|r| r["path"] == "cat/.usage.json"));
    assert_eq!(fs::read(m.path(".usage.json")).unwrap(), b"{\"a\": 2}");
    let names: Vec<String> = fs::read_dir(m.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.contains(&".usage.json".to_string()),
        "untracked is still listed"
    );
}

/// What a killed writer staged is gone: `staging/` holds only the empty
/// spare files and directories made by the new daemon.
fn assert_staging_holds_nothing(m: &Mount) {
    for e in fs::read_dir(m.store().join("staging")).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            assert_eq!(fs::read_dir(&p).unwrap().count(), 0, "{p:?} is not empty");
        } else {
            assert_eq!(fs::metadata(&p).unwrap().len(), 0, "{p:?} kept bytes");
        }
    }
}
