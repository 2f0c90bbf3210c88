//! What no version may suffer (issue "Trust"), through a real mount: other
//! hard links of a written file, a path opened while it is replaced, times
//! far from now, history noise, and a full disk. Each test fails on the
//! code before its fix (a57b291).

use crate::common;

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Mount, Scratch, SmallDisk, cpath as c, describe, sha256_hex};

fn last_id(m: &Mount) -> u64 {
    m.log().last().unwrap()["seq"].as_u64().unwrap()
}

/// Lets the janitor fill its pool of spare inodes after the mount: with the
/// pool full the swapped-out inode is considered for reuse at once.
fn settle_spares() {
    std::thread::sleep(Duration::from_secs(1));
}

/// Writes through the mount that make the janitor empty and reuse every
/// inode a publish swaps out (where it may), then waits for it.
fn churn(m: &Mount, n: usize) {
    for i in 0..n {
        fs::write(
            m.path(&format!("churn{i}.md")),
            format!("churn {i} {}", "x".repeat(i)),
        )
        .unwrap();
        fs::write(m.path(&format!("churn{i}.md")), format!("again {i}")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
}

#[test]
fn a_hard_link_outside_the_root_keeps_its_bytes() {
    let scratch = Scratch::new("hlout");
    let outside = scratch.root().parent().unwrap().join("outside");
    fs::create_dir_all(scratch.root().join("cat/foo")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    let live = scratch.root().join("cat/foo/index.js");
    fs::write(&live, "module.exports = 1;\n").unwrap();
    let copy = outside.join("store-copy.js");
    fs::hard_link(&live, &copy).unwrap();
    let ino = fs::metadata(&copy).unwrap().ino();
    let mut m = Mount::over(scratch, Vec::new());
    settle_spares();

    fs::write(m.path("cat/foo/index.js"), "edited through skillfs\n").unwrap();
    fs::write(m.path("cat/foo/index.js"), "edited again\n").unwrap();
    churn(&m, 12);
    assert_eq!(fs::read_to_string(&copy).unwrap(), "module.exports = 1;\n");
    assert_eq!(fs::metadata(&copy).unwrap().ino(), ino);
    assert_eq!(
        fs::read_to_string(m.path("cat/foo/index.js")).unwrap(),
        "edited again\n"
    );
    m.umount();
    assert_eq!(fs::read_to_string(&copy).unwrap(), "module.exports = 1;\n");
    assert_no_shared_inodes(&[&m.root(), &outside], &[]);
}

#[test]
fn a_hidden_file_with_another_link_is_not_written_in_place() {
    let scratch = Scratch::new("hlhid");
    let outside = scratch.root().parent().unwrap().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::create_dir_all(scratch.root().join("cat")).unwrap();
    let copy = outside.join("lock-copy");
    fs::write(&copy, "outside bytes").unwrap();
    let m = Mount::over(scratch, Vec::new());
    // Hidden (a temp file): parked in the store, where a link is made to it.
    fs::write(m.path("cat/.x.tmp"), "hidden v1").unwrap();
    let parked = find_named(&m.store().join("parked"), ".x.tmp").expect("parked temp file");
    fs::remove_file(&copy).unwrap();
    fs::hard_link(&parked, &copy).unwrap();
    let mut f = OpenOptions::new()
        .write(true)
        .open(m.path("cat/.x.tmp"))
        .unwrap();
    f.write_all(b"HIDDEN").unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(m.path("cat/.x.tmp")).unwrap(),
        "HIDDEN v1"
    );
    assert_eq!(fs::read_to_string(&copy).unwrap(), "hidden v1");
}

fn find_named(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    for e in fs::read_dir(dir).ok()? {
        let e = e.ok()?;
        if e.file_name() == name {
            return Some(e.path());
        }
        if e.file_type().ok()?.is_dir()
            && let Some(p) = find_named(&e.path(), name)
        {
            return Some(p);
        }
    }
    None
}

/// An in-root pair is split at the first write through the mount: the
/// written name has the new bytes, the other keeps the old ones (a copy on
/// write, never a change behind the other name's back).
#[test]
fn a_hard_linked_pair_inside_the_root_splits_on_write() {
    let m = Mount::with_tree("hlin", |root| {
        fs::write(root.join("a.md"), "shared v1").unwrap();
        fs::hard_link(root.join("a.md"), root.join("b.md")).unwrap();
    });
    assert_eq!(fs::metadata(m.path("a.md")).unwrap().nlink(), 2);
    settle_spares();
    fs::write(m.path("a.md"), "a v2").unwrap();
    churn(&m, 8);
    assert_eq!(fs::read_to_string(m.path("a.md")).unwrap(), "a v2");
    assert_eq!(fs::read_to_string(m.path("b.md")).unwrap(), "shared v1");
    assert_eq!(fs::metadata(m.path("b.md")).unwrap().nlink(), 1);
    let id = last_id(&m);
    assert_eq!(
        fs::read_to_string(m.path(&format!(".history/{id}/b.md"))).unwrap(),
        "shared v1"
    );
    let mut m = m;
    m.umount();
    assert_no_shared_inodes(&[&m.root()], &[]);
}

/// A hidden directory renamed into view on a full disk: its content
/// cannot be stored, so the rename is refused (ENOSPC) before anything
/// moves, instead of making visible what no version holds.
#[test]
fn an_unpark_on_a_full_disk_is_refused_before_anything_moves() {
    let Some(disk) = SmallDisk::new("unparkfull", 24) else {
        return;
    };
    let scratch = Scratch::at(&disk.mnt, "unparkfull");
    let m = Mount::over(scratch, Vec::new());
    let (seen, unseen) = (vec![7u8; 3 << 20], vec![8u8; 3 << 20]);
    // A content the store has (a version of a visible file)...
    fs::create_dir(m.path("cat")).unwrap();
    fs::write(m.path("cat/seen.bin"), &seen).unwrap();
    // ...and two parks, written in place (hidden: scratch, no version):
    // one of a content the store lacks, one of that content.
    fs::create_dir_all(m.path("cat/foo.bak")).unwrap();
    fs::write(m.path("cat/foo.bak/big.bin"), &unseen).unwrap();
    fs::write(m.path("cat/foo.bak/SKILL.md"), "parked").unwrap();
    fs::create_dir_all(m.path("cat/bar.bak")).unwrap();
    fs::write(m.path("cat/bar.bak/big.bin"), &seen).unwrap();
    fs::create_dir(m.path("cat/taken")).unwrap();
    fs::write(m.path("cat/taken/x"), "x").unwrap();
    disk.fill("filler");
    let err = fs::rename(m.path("cat/foo.bak"), m.path("cat/foo")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    common::assert_enoent(m.path("cat/foo"));
    assert_eq!(fs::read(m.path("cat/foo.bak/SKILL.md")).unwrap(), b"parked");
    assert!(
        !m.log().iter().any(|r| r["op"] == "unpark"),
        "an unpark was journaled for a rename that was refused"
    );
    // A rename that fails anyway answers its own errno, not the full disk's.
    let err = fs::rename(m.path("cat/foo.bak"), m.path("cat/taken")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY), "{err}");
    // A park whose content is stored already needs no room.
    fs::rename(m.path("cat/bar.bak"), m.path("cat/bar")).unwrap();
    assert_eq!(
        fs::read(m.path(".history/latest/cat/bar/big.bin")).unwrap(),
        seen
    );
    // Room again: the refused rename goes through and is recorded whole.
    disk.free("filler");
    fs::rename(m.path("cat/foo.bak"), m.path("cat/foo")).unwrap();
    assert_eq!(
        fs::read(m.path(".history/latest/cat/foo/big.bin")).unwrap(),
        unseen
    );
}

/// A rename from one name of a file to another name of the same file (two
/// links made while unmounted): the kernel, which sees two inodes, moves
/// its entry, so the source name goes, and a write through the new name
/// reaches the new name, never the old one's file (a review reproduced
/// writes to `b` landing in `a` when the rename was answered as a no-op).
#[test]
fn a_rename_between_two_links_of_one_file_moves_the_name() {
    let m = Mount::with_tree("hlren", |root| {
        fs::write(root.join("a.md"), "old").unwrap();
        fs::hard_link(root.join("a.md"), root.join("b.md")).unwrap();
    });
    // Both names known to the kernel first, as a loader's walk would.
    assert_eq!(fs::read_to_string(m.path("a.md")).unwrap(), "old");
    assert_eq!(fs::read_to_string(m.path("b.md")).unwrap(), "old");
    fs::rename(m.path("a.md"), m.path("b.md")).unwrap();
    common::assert_enoent(m.path("a.md"));
    fs::write(m.path("b.md"), "new").unwrap();
    assert_eq!(fs::read_to_string(m.path("b.md")).unwrap(), "new");
    common::assert_enoent(m.path("a.md"));
    let last = m.log().last().unwrap().clone();
    assert_eq!(
        (last["op"].as_str(), last["path"].as_str()),
        (Some("write"), Some("b.md"))
    );
    let mut m = m;
    m.umount();
    common::assert_enoent(m.root().join("a.md"));
    assert_eq!(fs::read_to_string(m.root().join("b.md")).unwrap(), "new");
}

/// No two live regular files under `dirs` share an inode, except the
/// `allowed` pairs of names.
fn assert_no_shared_inodes(dirs: &[&Path], allowed: &[(&str, &str)]) {
    let mut seen: HashMap<(u64, u64), std::path::PathBuf> = HashMap::new();
    let mut stack: Vec<std::path::PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                stack.push(p);
            } else if md.is_file()
                && let Some(other) = seen.insert((md.dev(), md.ino()), p.clone())
            {
                let pair = (other.file_name().unwrap(), p.file_name().unwrap());
                assert!(
                    allowed
                        .iter()
                        .any(|(a, b)| (pair.0 == *a && pair.1 == *b)
                            || (pair.0 == *b && pair.1 == *a)),
                    "{} and {} share an inode",
                    other.display(),
                    p.display()
                );
            }
        }
    }
}

/// The agent replaces `SKILL.md` by temp + rename while its loader reads
/// it: an open or stat by path gets the old or the new file, never ENOENT.
#[test]
fn opening_a_path_while_it_is_replaced_never_fails() {
    let m = Mount::new("race");
    let f = m.path("SKILL.md");
    fs::write(&f, "init").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let replacer = {
        let (stop, dir) = (Arc::clone(&stop), m.root());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let tmp = dir.join(format!(".SKILL.md.tmp.{n}"));
                fs::write(&tmp, format!("version {n}")).unwrap();
                fs::rename(&tmp, dir.join("SKILL.md")).unwrap();
                n += 1;
            }
            n
        })
    };
    let (mut opens, mut stats, mut writes) = (0u64, 0u64, 0u64);
    let mut errors: HashMap<(&str, i32), u64> = HashMap::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        match fs::File::open(&f) {
            Ok(_) => opens += 1,
            Err(e) => {
                *errors
                    .entry(("open", e.raw_os_error().unwrap_or(-1)))
                    .or_default() += 1
            }
        }
        match fs::metadata(&f) {
            Ok(_) => stats += 1,
            Err(e) => {
                *errors
                    .entry(("stat", e.raw_os_error().unwrap_or(-1)))
                    .or_default() += 1
            }
        }
        // A writer's truncating open of the same path.
        if opens % 8 == 0 {
            match OpenOptions::new().write(true).truncate(true).open(&f) {
                Ok(mut w) => {
                    w.write_all(b"plain write").unwrap();
                    writes += 1;
                }
                Err(e) => {
                    *errors
                        .entry(("trunc", e.raw_os_error().unwrap_or(-1)))
                        .or_default() += 1
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let renames = replacer.join().unwrap();
    eprintln!(
        "renames {renames}, opens {opens}, stats {stats}, writes {writes}, errors {errors:?}"
    );
    assert!(renames > 100 && opens > 100, "the race did not run");
    assert!(
        errors.is_empty(),
        "errno counts while replacing: {errors:?}"
    );
}

#[test]
fn times_ext4_stores_round_trip_exactly() {
    let m = Mount::new("times");
    // 2300-01-01 and 1901-12-14 (negative), past i64 nanoseconds both.
    let cases = [
        ("late.md", 10_413_792_000i64, 123_456_789i64),
        ("early.md", -2_147_483_000, 5),
    ];
    for (name, sec, nsec) in cases {
        let p = m.path(name);
        fs::write(&p, name).unwrap();
        let ts = libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        };
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, c(&p).as_ptr(), [ts, ts].as_ptr(), 0) };
        assert_eq!(r, 0);
        let md = fs::metadata(&p).unwrap();
        assert_eq!((md.mtime(), md.mtime_nsec()), (sec, nsec), "{name} live");
        let id = last_id(&m);
        let h = fs::metadata(m.path(&format!(".history/{id}/{name}"))).unwrap();
        assert_eq!(
            (h.mtime(), h.mtime_nsec()),
            (sec, nsec),
            "{name} in history"
        );
        let rec = m.log().into_iter().last().unwrap();
        let want = sec as i128 * 1_000_000_000 + nsec as i128;
        assert_eq!(
            rec["state"]["mtime_ns"].to_string(),
            want.to_string(),
            "{name} journal"
        );
    }
    // A `cp -a` out of history keeps them.
    let id = last_id(&m);
    let out = Command::new("cp")
        .arg("-a")
        .arg(m.path(&format!(".history/{id}/late.md")))
        .arg(m.path("restored.md"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        fs::metadata(m.path("restored.md")).unwrap().mtime(),
        10_413_792_000
    );
    // An alias past what the records hold names nothing; it never wraps
    // around to today's change.
    let far = m.path(".history/@2611-06-22T12:51:20Z");
    assert_eq!(
        fs::metadata(&far).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    // The daemon is still there.
    assert!(fs::metadata(m.path("late.md")).is_ok());
}

#[test]
fn a_shell_redirect_records_one_version() {
    let m = Mount::new("redirect");
    fs::write(m.path("a.md"), "first\n").unwrap();
    let before = m.log().len();
    let out = Command::new("bash")
        .arg("-c")
        .arg("echo second > a.md; echo third > a.md")
        .current_dir(m.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let writes: Vec<serde_json::Value> = m.log().into_iter().skip(before).collect();
    let sizes: Vec<u64> = writes
        .iter()
        .map(|r| r["state"]["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [7, 6], "records after two redirects: {writes:?}");
    assert_eq!(fs::read_to_string(m.path("a.md")).unwrap(), "third\n");
    // `: > f` (truncate, write nothing) is still an empty version.
    let out = Command::new("bash")
        .arg("-c")
        .arg(": > a.md")
        .current_dir(m.root())
        .output()
        .unwrap();
    assert!(out.status.success());
    // The release is asynchronous: the version lands a moment after `close`.
    let log = m.log_when(|l| l.last().is_some_and(|r| r["state"]["size"] == 0));
    assert_eq!(log.last().unwrap()["state"]["size"], 0);
}

#[test]
fn identical_bytes_rewritten_while_unmounted_record_nothing() {
    let mut m = Mount::new("samebytes");
    fs::write(m.path("b.md"), "same").unwrap();
    m.umount();
    let before = m.log().len();
    std::thread::sleep(Duration::from_millis(20));
    fs::write(m.root().join("b.md"), "same").unwrap();
    m.remount();
    assert_eq!(m.log().len(), before, "records: {:?}", m.log());
}

#[test]
fn touch_h_of_a_symlink_keeps_the_times_it_set() {
    let m = Mount::new("symtimes");
    symlink("target-that-is-not-there", m.path("link")).unwrap();
    let out = Command::new("touch")
        .args(["-h", "-d", "2020-01-01T00:00:00Z"])
        .arg(m.path("link"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let md = fs::symlink_metadata(m.path("link")).unwrap();
    assert_eq!(md.atime(), 1_577_836_800);
    assert_eq!(md.mtime(), 1_577_836_800);
}

/// The adversarial review's disk-full probe: the daemon (logging to its
/// store, on the full disk) stays up; a metadata change it cannot journal
/// fails with the errno and is undone; a write whose publish fails is not
/// served afterwards; nothing acknowledged is lost once space is back.
#[test]
fn a_full_disk_fails_calls_cleanly_and_never_kills_the_daemon() {
    let Some(disk) = SmallDisk::new("full", 24) else {
        return;
    };
    let scratch = Scratch::at(&disk.mnt, "full");
    let mut m = Mount::over(scratch, Vec::new());
    fs::create_dir(m.path("cat")).unwrap();
    for i in 0..20 {
        fs::write(m.path(&format!("cat/f{i}")), format!("v1 of {i}")).unwrap();
    }
    let kept = sha256_hex(b"v1 of 3");
    disk.fill("filler");
    // Metadata: journaled into the journal's reserve while it lasts, then
    // refused with ENOSPC (the record cannot be written), mode unchanged,
    // and the daemon answers the next call.
    let mut refused = 0;
    for n in 0..20_000 {
        let p = m.path(&format!("cat/f{}", n % 20));
        let before = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        let want = if before == 0o600 { 0o640 } else { 0o600 };
        match fs::set_permissions(&p, fs::Permissions::from_mode(want)) {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "chmod {n}: {e}");
                assert_eq!(
                    fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                    before
                );
                refused += 1;
                // Enough refusals (each logged) to overflow the log's last block.
                if refused == 200 {
                    break;
                }
            }
        }
    }
    assert!(refused > 0, "the journal never filled up");
    // A write that cannot be published: close fails, and the mount goes
    // back to the version it has.
    let p = m.path("cat/f5");
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let big = vec![b'z'; 4 << 20];
    let mut failed = w.write_all(&big).is_err();
    failed |= w.sync_all().is_err();
    let close = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(w)) };
    failed |= close != 0;
    assert!(failed, "4 MiB fitted on a full disk");
    std::thread::sleep(Duration::from_millis(200));
    let now = fs::read(&p).unwrap();
    assert!(
        journaled_blobs(&m).contains(&sha256_hex(&now)),
        "after a failed publish the mount serves {} bytes in no version",
        now.len()
    );
    // Names: each rename or mkdir is either refused or journaled, so the
    // newest snapshot lists what the live directory does.
    for i in 10..20 {
        let _ = fs::rename(m.path(&format!("cat/f{i}")), m.path(&format!("cat/g{i}")));
    }
    let _ = fs::create_dir(m.path("cat/newdir"));
    let live = common::names(&m.path("cat"));
    let latest = common::names(&m.path(".history/latest/cat"));
    assert_eq!(latest, live, ".history/latest disagrees with the live tree");
    // Room for the staged bytes but not for their blob as well: the write
    // succeeds, the publish fails. A reader holds the file open throughout,
    // so its open state outlives the writer's close: what that close failed
    // to publish must not stay readable.
    fs::remove_file(disk.mnt.join("filler")).unwrap();
    let (free, bsize) = free_blocks(&disk.mnt);
    let keep = 3u64 << 20;
    fs::write(
        disk.mnt.join("filler"),
        vec![0u8; (free * bsize).saturating_sub(keep) as usize],
    )
    .unwrap();
    let p = m.path("cat/f6");
    let reader = fs::File::open(&p).unwrap();
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    // (Bytes no compression or shared chunk makes smaller in the store.)
    w.write_all(&common::noise(2 << 20, 77)).unwrap();
    let mut failed = w.sync_all().is_err();
    let close = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(w)) };
    failed |= close != 0;
    assert!(failed, "2 MiB staged and 2 MiB of blob fitted in 3 MiB");
    std::thread::sleep(Duration::from_millis(200));
    let mut seen = Vec::new();
    std::io::Read::read_to_end(&mut &reader, &mut seen).unwrap();
    assert!(
        journaled_blobs(&m).contains(&sha256_hex(&seen)),
        "a reader is served {} bytes that are in no version",
        seen.len()
    );
    assert_eq!(
        seen,
        fs::read(&p).unwrap(),
        "the reader and a new open disagree"
    );
    drop(reader);
    fs::remove_file(disk.mnt.join("filler")).unwrap();
    disk.fill("filler");
    // Alive, and a file never touched is intact.
    assert_eq!(fs::read_to_string(m.path("cat/f3")).unwrap(), "v1 of 3");
    assert!(common::pid_alive(m.pid), "the daemon died on a full disk");
    fs::remove_file(disk.mnt.join("filler")).unwrap();
    fs::write(m.path("cat/after"), "space again").unwrap();
    m.umount();
    m.remount();
    assert_eq!(fs::read_to_string(m.path("cat/f3")).unwrap(), "v1 of 3");
    assert_eq!(
        fs::read_to_string(m.path("cat/after")).unwrap(),
        "space again"
    );
    assert!(m.log().iter().any(|r| r["state"]["blob"] == kept.as_str()));
    m.umount();
}

/// Runs `sh -c script` in `dir` as uid/gid 65534 (nobody); its exit code.
fn as_nobody(dir: &Path, script: &str) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir("/")
        .env("D", dir)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap()
}

/// Another user enters a `--allow-other` mount with exactly the rights the
/// modes give it (the kernel checks them: `default_permissions`), and what
/// it creates is its own; without the option it cannot enter at all.
#[test]
fn other_users_enter_an_allow_other_mount_as_the_modes_say() {
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: acting as another user needs root");
        return;
    }
    let scratch = Scratch::new("allowother");
    // The scratch directory's own parents must let nobody through.
    fs::set_permissions(&scratch.dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(scratch.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let mut m = Mount::over(scratch, vec!["--allow-other".into()]);
    fs::write(m.path("public.md"), "for everyone").unwrap();
    fs::set_permissions(m.path("public.md"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(m.path("private.md"), "root only").unwrap();
    fs::set_permissions(m.path("private.md"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(m.path("shared")).unwrap();
    fs::set_permissions(m.path("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    let root = m.root();
    let ok = |script: &str| {
        let out = as_nobody(&root, script);
        assert!(
            out.status.success(),
            "as nobody: {script}\n{}",
            describe(&out)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let refused = |script: &str| {
        let out = as_nobody(&root, script);
        assert!(!out.status.success(), "as nobody, allowed: {script}");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains("Permission denied"), "{script}: {err}");
    };
    assert_eq!(ok("cat \"$D/public.md\""), "for everyone");
    refused("cat \"$D/private.md\"");
    refused("echo x > \"$D/public.md\"");
    refused("touch \"$D/new.md\"");
    ok("echo mine > \"$D/shared/mine.md\"");
    let md = fs::metadata(m.path("shared/mine.md")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    assert!(ok("ls \"$D/shared\"").contains("mine.md"));
    // Versioned like any write, with its actor.
    let rec = m.log().into_iter().last().unwrap();
    assert_eq!(rec["path"], "shared/mine.md");
    assert_eq!(rec["actor"]["uid"], 65534);
    m.umount();
    // Without --allow-other, another user cannot enter.
    m.extra_args.clear();
    m.remount();
    let out = as_nobody(&m.root(), "ls \"$D\"");
    assert!(
        !out.status.success(),
        "nobody listed a mount without --allow-other"
    );
}

/// A skill's helper may make a FIFO or bind a unix socket in its folder:
/// made in place, listed with their type, working between processes,
/// never versioned, removed with the folder.
#[test]
fn fifos_and_sockets_are_made_in_place_and_never_versioned() {
    let mut m = Mount::new("special");
    fs::create_dir_all(m.path("cat/helper")).unwrap();
    let before = m.log().len();
    let script = r#"
import os, socket, sys, threading
d = sys.argv[1]
fifo = os.path.join(d, "cat/helper/pipe")
os.mkfifo(fifo, 0o600)
def feed():
    with open(fifo, "w") as w:
        w.write("through the fifo")
t = threading.Thread(target=feed); t.start()
with open(fifo) as r:
    assert r.read() == "through the fifo"
t.join()
path = os.path.join(d, "cat/helper/sock")
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path); srv.listen(1)
def serve():
    c, _ = srv.accept(); c.sendall(c.recv(100).upper()); c.close()
t = threading.Thread(target=serve); t.start()
cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
cli.connect(path); cli.sendall(b"ping"); assert cli.recv(100) == b"PING"
t.join(); cli.close(); srv.close()
import stat
names = sorted(os.listdir(os.path.join(d, "cat/helper")))
assert names == ["pipe", "sock"], names
# The listing's own types (d_type), as `find` reads them.
import subprocess
for t, want in (("p", "pipe"), ("s", "sock")):
    got = subprocess.run(["find", os.path.join(d, "cat/helper"), "-type", t, "-printf", "%f"],
                         capture_output=True, text=True, check=True).stdout
    assert got == want, (t, got)
assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISSOCK(os.lstat(path).st_mode)
os.rename(path, os.path.join(d, "cat/helper/sock2"))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(m.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let recs: Vec<serde_json::Value> = m.log().into_iter().skip(before).collect();
    assert!(
        recs.is_empty(),
        "FIFOs and sockets were journaled: {recs:?}"
    );
    // In place under ROOT, so an unmounted ROOT has them too (G6).
    m.umount();
    let ft = fs::symlink_metadata(m.root().join("cat/helper/pipe"))
        .unwrap()
        .file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&ft));
    m.remount();
    assert!(
        m.log().len() == before,
        "the remount versioned them: {:?}",
        m.log()
    );
    fs::remove_dir_all(m.path("cat/helper")).unwrap();
    common::assert_enoent(m.path("cat/helper"));
    // Devices stay out of a skills tree.
    let r = unsafe { libc::mknod(c(&m.path("cat/dev")).as_ptr(), libc::S_IFCHR | 0o600, 0) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
}

/// Review of the first fix: a reader of one name of a pair keeps the old
/// bytes even after that name is renamed over and the other is written
/// (the inode left with one link must not be emptied for reuse), and a
/// reused inode never carries another file's extended attributes.
#[test]
fn a_reader_of_a_linked_name_keeps_its_bytes_and_no_xattr_is_inherited() {
    let m = Mount::with_tree("hlreader", |root| {
        fs::write(root.join("a.md"), "SECRET-OLD-BYTES").unwrap();
        fs::hard_link(root.join("a.md"), root.join("b.md")).unwrap();
        fs::write(root.join("x.md"), "x v1").unwrap();
        let name = std::ffi::CString::new("user.owner_note").unwrap();
        let r = unsafe {
            libc::setxattr(
                c(&root.join("x.md")).as_ptr(),
                name.as_ptr(),
                b"alice".as_ptr().cast(),
                5,
                0,
            )
        };
        assert_eq!(r, 0, "user xattrs: {}", std::io::Error::last_os_error());
    });
    settle_spares();
    let reader = fs::File::open(m.path("b.md")).unwrap();
    fs::write(m.path("c.md"), "c").unwrap();
    fs::rename(m.path("c.md"), m.path("b.md")).unwrap();
    fs::write(m.path("a.md"), "a v2").unwrap();
    fs::write(m.path("x.md"), "x v2").unwrap();
    // Let the janitor consider x.md's old inode for the pool, then make
    // empty files: a create that opens nothing for writing (mknod) keeps
    // the spare it was made from as its inode.
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..4 {
        let p = m.path(&format!("empty{i}.md"));
        assert_eq!(
            unsafe { libc::mknod(c(&p).as_ptr(), libc::S_IFREG | 0o644, 0) },
            0
        );
    }
    churn(&m, 8);
    let mut buf = vec![0u8; 64];
    let n = std::os::unix::fs::FileExt::read_at(&reader, &mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"SECRET-OLD-BYTES");
    drop(reader);
    // Every file made since: no extended attribute from a reused inode.
    // Read underneath, unmounted (the mount answers ENOTSUP for xattrs).
    let mut m = m;
    m.umount();
    for e in fs::read_dir(m.root()).unwrap() {
        let p = e.unwrap().path();
        let n = unsafe { libc::listxattr(c(&p).as_ptr(), std::ptr::null_mut(), 0) };
        assert!(
            n >= 0,
            "listxattr {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        let extra = if p.ends_with("x.md") { 0 } else { n };
        assert_eq!(extra, 0, "{} carries extended attributes", p.display());
    }
}

/// chmod and utimes through one name of a pair change only that name
/// (it gets an inode of its own first), and a chmod leaves its mtime.
#[test]
fn metadata_changes_never_reach_another_link() {
    let scratch = Scratch::new("hlmeta");
    let outside = scratch.root().parent().unwrap().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::create_dir_all(scratch.root().join("cat")).unwrap();
    let live = scratch.root().join("cat/s.sh");
    fs::write(&live, "echo hi\n").unwrap();
    fs::set_permissions(&live, fs::Permissions::from_mode(0o644)).unwrap();
    let copy = outside.join("backup.sh");
    fs::hard_link(&live, &copy).unwrap();
    let before = fs::metadata(&copy).unwrap();
    let m = Mount::over(scratch, Vec::new());
    let p = m.path("cat/s.sh");
    let mtime = fs::metadata(&p).unwrap().mtime_nsec();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o755);
    assert_eq!(
        fs::metadata(&p).unwrap().mtime_nsec(),
        mtime,
        "chmod moved the mtime"
    );
    let out = Command::new("touch")
        .args(["-d", "2001-01-01T00:00:00Z"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(fs::metadata(&p).unwrap().mtime(), 978_307_200);
    let after = fs::metadata(&copy).unwrap();
    assert_eq!(after.mode(), before.mode(), "the other link's mode changed");
    assert_eq!(
        after.mtime(),
        before.mtime(),
        "the other link's times changed"
    );
    assert_eq!(fs::read_to_string(&copy).unwrap(), "echo hi\n");
    assert_eq!(fs::read_to_string(&p).unwrap(), "echo hi\n");
}

#[test]
fn a_fifo_and_a_socket_take_chmod_and_utimes() {
    let m = Mount::new("specialmeta");
    let fifo = m.path("pipe");
    assert_eq!(unsafe { libc::mkfifo(c(&fifo).as_ptr(), 0o644) }, 0);
    let before = m.log().len();
    fs::set_permissions(&fifo, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(&fifo).unwrap().mode() & 0o777, 0o600);
    let out = Command::new("touch")
        .args(["-d", "2001-01-01T00:00:00Z"])
        .arg(&fifo)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(m.log().len(), before, "a FIFO's metadata was journaled");
}

/// A chmod during an open write to a hard-linked file splits the link by
/// copying the live content, never by publishing the writer's half-written
/// bytes (which would be a torn version).
#[test]
fn a_split_for_chmod_leaves_a_writers_bytes_alone() {
    let scratch = Scratch::new("hlwriter");
    let outside = scratch.root().parent().unwrap().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::create_dir_all(scratch.root().join("cat")).unwrap();
    fs::write(scratch.root().join("cat/h"), "old\n").unwrap();
    fs::hard_link(scratch.root().join("cat/h"), outside.join("hlink")).unwrap();
    let m = Mount::over(scratch, Vec::new());
    let p = m.path("cat/h");
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    w.write_all(b"PARTIAL-").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
    w.write_all(b"rest\n").unwrap();
    drop(w);
    assert_eq!(fs::read_to_string(&p).unwrap(), "PARTIAL-rest\n");
    assert_eq!(fs::read_to_string(outside.join("hlink")).unwrap(), "old\n");
    // The release is asynchronous: wait for the whole file's version.
    let whole = sha256_hex(b"PARTIAL-rest\n");
    let log = m.log_when(|l| l.iter().any(|r| r["state"]["blob"] == whole.as_str()));
    let partial = sha256_hex(b"PARTIAL-");
    assert!(
        !log.iter().any(|r| r["state"]["blob"] == partial.as_str()),
        "the writer's half-written bytes became a version"
    );
}

/// With little room left (less than the journal's usual reserve), names
/// are still made while records fit.
#[test]
fn a_nearly_full_small_disk_still_takes_new_names() {
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: a tmpfs mount needs root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("skillfs-tmpfs-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    let _u = Unmount(dir.clone());
    // Leave about 600 KiB free.
    let st = nix_statvfs(&dir);
    let fill = (st.0 * st.1).saturating_sub(600 << 10);
    fs::write(dir.join("filler"), vec![0u8; fill as usize]).unwrap();
    let scratch = Scratch::at(&dir, "small");
    let mut m = Mount::over(scratch, Vec::new());
    fs::write(m.path("a.md"), "a").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    fs::rename(m.path("a.md"), m.path("d/b.md")).unwrap();
    assert_eq!(fs::read_to_string(m.path("d/b.md")).unwrap(), "a");
    m.umount();
}

/// The blobs the journal names.
fn journaled_blobs(m: &Mount) -> std::collections::HashSet<String> {
    m.log()
        .iter()
        .filter_map(|r| r["state"]["blob"].as_str().map(str::to_string))
        .collect()
}

/// Free blocks (root's: reserved ones included) and block size at `p`.
fn free_blocks(p: &Path) -> (u64, u64) {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c(p).as_ptr(), &mut st) }, 0);
    (st.f_bfree, st.f_frsize)
}

/// (free blocks, block size) of the filesystem at `p`.
fn nix_statvfs(p: &Path) -> (u64, u64) {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c(p).as_ptr(), &mut st) }, 0);
    (st.f_bavail, st.f_frsize)
}

/// `fchmod`/`futimens` through a handle on a name removed while open
/// change that open file only, not the inode another name still has.
#[test]
fn metadata_through_an_open_removed_name_stays_private() {
    let scratch = Scratch::new("hlopen");
    let outside = scratch.root().parent().unwrap().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(scratch.root().join("g"), "linked\n").unwrap();
    fs::set_permissions(scratch.root().join("g"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::hard_link(scratch.root().join("g"), outside.join("glink")).unwrap();
    let before = fs::metadata(outside.join("glink")).unwrap();
    let m = Mount::over(scratch, Vec::new());
    let f = fs::File::open(m.path("g")).unwrap();
    fs::remove_file(m.path("g")).unwrap();
    use std::os::fd::AsRawFd;
    assert_eq!(unsafe { libc::fchmod(f.as_raw_fd(), 0o600) }, 0);
    let ts = [libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    }; 2];
    assert_eq!(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) }, 0);
    let md = f.metadata().unwrap();
    assert_eq!((md.mode() & 0o777, md.mtime()), (0o600, 1));
    let mut s = String::new();
    std::io::Read::read_to_string(&mut &f, &mut s).unwrap();
    assert_eq!(s, "linked\n");
    let after = fs::metadata(outside.join("glink")).unwrap();
    assert_eq!(
        (after.mode(), after.mtime()),
        (before.mode(), before.mtime())
    );
}

/// A writer that joins a reader the kernel serves (as root, a file of
/// 1 MiB or more: FUSE passthrough) writes the live file in place. When its
/// close cannot version what it wrote (the disk is full), the close fails
/// and the file is put back to the version it had: the reader is served
/// no bytes that are in no version. (Served by the daemon, the writer's
/// staging copy is dropped instead: the same outcome.)
#[test]
fn a_direct_writer_that_cannot_be_versioned_is_put_back() {
    let Some(disk) = SmallDisk::new("full-direct", 24) else {
        return;
    };
    let scratch = Scratch::at(&disk.mnt, "full-direct");
    let mut m = Mount::over(scratch, Vec::new());
    fs::create_dir(m.path("cat")).unwrap();
    let before = common::noise(1 << 20, 5);
    fs::write(m.path("cat/big"), &before).unwrap();
    // A new daemon: no handle of the file is left, so the reader's open
    // is a direct one.
    m.umount();
    m.remount();
    let p = m.path("cat/big");
    let reader = fs::File::open(&p).unwrap();
    // Room for the bytes written in place, not for their blob as well.
    fs::write(disk.mnt.join("filler"), b"").unwrap();
    let (free, bsize) = free_blocks(&disk.mnt);
    let keep = 2u64 << 20;
    fs::write(
        disk.mnt.join("filler"),
        vec![0u8; (free * bsize).saturating_sub(keep) as usize],
    )
    .unwrap();
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let mut failed = w.write_all(&common::noise(2 << 20, 78)).is_err();
    failed |= w.sync_all().is_err();
    let close = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(w)) };
    failed |= close != 0;
    assert!(failed, "2 MiB in place and 2 MiB of blob fitted in 2 MiB");
    // (The release that puts it back follows the close.)
    let t = Instant::now();
    let mut seen = Vec::new();
    while t.elapsed() < Duration::from_secs(5) {
        seen.clear();
        std::io::Seek::seek(&mut &reader, std::io::SeekFrom::Start(0)).unwrap();
        std::io::Read::read_to_end(&mut &reader, &mut seen).unwrap();
        if seen == before {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        journaled_blobs(&m).contains(&sha256_hex(&seen)),
        "a reader is served {} bytes that are in no version",
        seen.len()
    );
    assert!(
        seen == before,
        "the file is not the version it had: {} bytes, {:?}",
        seen.len(),
        m.log()
            .iter()
            .filter(|r| r["path"] == "cat/big")
            .map(|r| (r["op"].clone(), r["state"]["size"].clone()))
            .collect::<Vec<_>>()
    );
    fs::remove_file(disk.mnt.join("filler")).unwrap();
}
