//! Bad input: each ends with one clear line naming the thing and the reason,
//! a documented exit code, and nothing changed.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Mount, Scratch, assert_refused, describe, skillfs};

/// Every file and directory under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    if !dir.exists() {
        return out;
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
                out.insert(p, Vec::new());
            } else {
                out.insert(p.clone(), fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

#[test]
fn missing_root() {
    let s = Scratch::new("missing");
    let root = s.dir.join("nope");
    let out = skillfs(&["mount", root.to_str().unwrap()]);
    assert_refused(&out, 3, &["nope", "does not exist"]);
    common::assert_enoent(s.dir.join(".skillfs"));
}

#[test]
fn root_is_a_regular_file() {
    let s = Scratch::new("regular");
    let f = s.dir.join("file");
    fs::write(&f, "x").unwrap();
    let out = skillfs(&["mount", f.to_str().unwrap()]);
    assert_refused(&out, 3, &["file", "not a directory"]);
    assert_eq!(fs::read(&f).unwrap(), b"x");
}

#[test]
fn already_mounted_root() {
    let m = Mount::new("twice");
    fs::write(m.path("a"), "a").unwrap();
    let out = skillfs(&["mount", m.root().to_str().unwrap()]);
    assert_refused(&out, 3, &["already mounted"]);
    // The first mount is untouched and still serves.
    assert_eq!(fs::read(m.path("a")).unwrap(), b"a");
    fs::write(m.path("b"), "b").unwrap();
}

#[test]
fn store_inside_root() {
    let s = Scratch::new("inside");
    fs::write(s.root().join("keep"), "k").unwrap();
    let before = snapshot(&s.dir);
    let store = s.root().join(".store");
    let out = skillfs(&[
        "mount",
        s.root().to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_refused(&out, 4, &[".store", "inside ROOT"]);
    assert_eq!(snapshot(&s.dir), before);
}

#[test]
fn store_on_another_filesystem() {
    let s = Scratch::new("otherfs");
    let shm = Path::new("/dev/shm");
    assert_ne!(
        fs::metadata(shm)
            .expect("/dev/shm is needed for this test")
            .dev(),
        fs::metadata(&s.dir).unwrap().dev(),
        "the temp dir must not be on /dev/shm's filesystem for this test"
    );
    let store = shm.join(format!("skillfs-otherfs-{}", std::process::id()));
    let out = skillfs(&[
        "mount",
        s.root().to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_refused(&out, 4, &["another filesystem", "rename"]);
    common::assert_enoent(&store);
}

#[test]
fn second_mount_of_the_same_store() {
    let m = Mount::new("samestore");
    let other = Scratch::new("samestore-b");
    let out = skillfs(&[
        "mount",
        other.root().to_str().unwrap(),
        "--store",
        m.store().to_str().unwrap(),
    ]);
    assert_refused(&out, 4, &["in use", "one mount per store"]);
    fs::write(m.path("still"), "works").unwrap();
}

#[test]
fn damaged_journal_refuses_and_changes_nothing() {
    let mut m = Mount::new("damaged");
    // Acknowledged (fsync), so each later record says the earlier ones were
    // durable: damage to them cannot be a torn tail.
    for i in 0..5 {
        let mut f = fs::File::create(m.path(&format!("f{i}"))).unwrap();
        std::io::Write::write_all(&mut f, format!("v{i}").as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    m.umount();
    let seg = fs::read_dir(m.store().join("journal"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut data = fs::read(&seg).unwrap();
    let third_line = data
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(1)
        .unwrap()
        .0
        + 1;
    data[third_line + 10] ^= 0x20;
    fs::write(&seg, &data).unwrap();
    // Offline edit that must not be recorded (or touched) by a refused mount.
    fs::write(m.path("f0"), "edited offline").unwrap();
    let before = snapshot(&m.scratch.dir);
    let out = skillfs(&["mount", m.root().to_str().unwrap()]);
    assert_refused(&out, 5, &["journal", "damaged at line 3"]);
    assert_eq!(snapshot(&m.scratch.dir), before);
    // Read-only commands refuse the same way.
    let out = skillfs(&["log", "--root", m.root().to_str().unwrap()]);
    assert_refused(&out, 5, &["line 3"]);
}

#[test]
fn damage_no_later_record_vouches_for_is_set_aside_not_refused() {
    // Plain closes: no record says another was durable, so a bad line
    // followed by good ones is what a power loss can leave (blocks written
    // out of order). The mount goes on; the cut bytes are kept aside.
    let mut m = Mount::new("unacked");
    for i in 0..5 {
        fs::write(m.path(&format!("f{i}")), format!("v{i}")).unwrap();
    }
    m.umount();
    let before = m.log();
    let n = before.len();
    let seg = fs::read_dir(m.store().join("journal"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut data = fs::read(&seg).unwrap();
    let lines: Vec<usize> = data
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1)
        .collect();
    let cut = lines[n - 4]; // the start of the third-last record
    data[cut + 10..cut + 30].fill(0);
    fs::write(&seg, &data).unwrap();
    m.remount();
    let after = m.log();
    assert_eq!(after[..n - 3], before[..n - 3]);
    // What the cut records said, the mount's scan finds again.
    assert!(
        after[n - 3..]
            .iter()
            .any(|r| r["op"] == "scan" && r["path"] == "f4"),
        "{after:?}"
    );
    assert_eq!(fs::read_to_string(m.path("f4")).unwrap(), "v4");
    let aside: Vec<_> = fs::read_dir(m.store().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("torn-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(fs::read(&aside[0]).unwrap(), &data[cut..]);
}

#[test]
fn torn_last_record_is_dropped_at_mount() {
    let mut m = Mount::new("torn");
    fs::write(m.path("a"), "a").unwrap();
    m.umount();
    let n = m.log().len();
    let seg = fs::read_dir(m.store().join("journal"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut f = fs::OpenOptions::new().append(true).open(&seg).unwrap();
    use std::io::Write;
    f.write_all(br#"{"seq":99,"ts":1,"op":"wri"#).unwrap();
    drop(f);
    m.remount();
    assert_eq!(m.log().len(), n);
    fs::write(m.path("b"), "b").unwrap();
    let log = m.log();
    assert_eq!(log.last().unwrap()["seq"], (n + 2) as u64);
}

#[test]
fn unwritable_store() {
    let s = Scratch::new("rostore");
    let ro = s.dir.join("ro");
    fs::create_dir(&ro).unwrap();
    let as_root = unsafe { libc::geteuid() } == 0;
    if as_root {
        // Root ignores modes: make the directory a read-only bind mount.
        let ok = Command::new("mount")
            .args(["--bind"])
            .arg(&ro)
            .arg(&ro)
            .status()
            .unwrap()
            .success()
            && Command::new("mount")
                .args(["-o", "remount,bind,ro"])
                .arg(&ro)
                .status()
                .unwrap()
                .success();
        assert!(ok, "could not make a read-only bind mount");
    } else {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    }
    let store = ro.join("store");
    let out = skillfs(&[
        "mount",
        s.root().to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    if as_root {
        let _ = Command::new("umount").arg(&ro).status();
    }
    assert_refused(&out, 4, &["ro", "store"]);
    common::assert_enoent(&store);
    assert!(!common::is_mounted(&s.root()));
}

#[test]
fn usage_errors_exit_2() {
    let out = skillfs(&["mount"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let out = skillfs(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn umount_of_something_not_mounted() {
    let s = Scratch::new("notmounted");
    let out = skillfs(&["umount", s.root().to_str().unwrap()]);
    assert_refused(&out, 3, &["not mounted"]);
}

#[test]
fn umount_after_daemon_death_detaches_the_stale_mount() {
    let mut m = Mount::new("stale");
    unsafe { libc::kill(m.pid as i32, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    // (`skillfs mount` over it recovers it instead: tests/it/lifecycle.rs.)
    let out = skillfs(&["umount", m.root().to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!common::is_mounted(&m.root()));
    m.remount();
}

/// A start-up warning reaches the terminal of a background mount as one
/// line, whatever the path in it holds: a newline cannot forge a verdict.
#[test]
fn a_warning_with_a_newline_in_its_path_stays_one_line() {
    let s = Scratch::new("warn-line");
    let store = s.dir.join("st\nerr 6 injected failure");
    let (r, st) = (s.root().display().to_string(), store.display().to_string());
    let ok = |out: std::process::Output| {
        assert!(out.status.success(), "{}", describe(&out));
        out
    };
    ok(skillfs(&["mount", &r, "--store", &st]));
    ok(skillfs(&["umount", &r]));
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&store, fs::Permissions::from_mode(0o755)).unwrap();
    let out = ok(skillfs(&["mount", &r, "--store", &st]));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("skillfs: warning: repaired the mode"),
        "{err}"
    );
    assert!(lines[0].contains("st\\nerr 6"), "{err}");
    ok(skillfs(&["umount", &r]));
}

/// A journal segment that is a FIFO, or a sparse file larger than the
/// machine's memory (another user's store, read by root): every command
/// that reads the journal fails with a line naming it, instead of blocking
/// forever or aborting on the allocation.
#[test]
fn a_fifo_or_a_huge_sparse_journal_segment_is_refused() {
    let mut m = Mount::new("seg-bad");
    fs::write(m.path("f.md"), "1\n").unwrap();
    fs::write(m.path("f.md"), "2\n").unwrap();
    m.umount();
    let root = m.root().display().to_string();
    let seg = m.store().join("journal/00000000000000000001.jsonl");
    let commands: [&[&str]; 5] = [
        &["log"],
        &["status"],
        &["verify"],
        &["show", "latest:f.md"],
        &["forget", "--keep-last", "1", "--dry-run"],
    ];
    let phys = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) as u64 * 4096 };
    for (what, words) in [("fifo", "not a regular file"), ("sparse", "memory")] {
        fs::remove_file(&seg).unwrap();
        if what == "fifo" {
            let c = std::ffi::CString::new(seg.as_os_str().as_encoded_bytes()).unwrap();
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        } else {
            let f = fs::File::create(&seg).unwrap();
            f.set_len(phys.saturating_mul(2).max(64 << 30)).unwrap();
        }
        for cmd in commands {
            let mut args = cmd.to_vec();
            args.extend(["--root", &root]);
            let out = common::within(&args, std::time::Duration::from_secs(20))
                .map(|(out, _)| out)
                .unwrap_or_else(|| panic!("{what}: {cmd:?} hangs"));
            // `verify` lists its problems on stdout, the others say it on stderr.
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                out.status.code(),
                Some(5),
                "{what} {cmd:?}: {}",
                describe(&out)
            );
            assert!(
                said.contains("00000000000000000001.jsonl") && said.contains(words),
                "{what} {cmd:?}: {}",
                describe(&out)
            );
        }
    }
    fs::remove_file(&seg).unwrap();
}
