//! No lock is held across a device flush (issue "Trust", item 9), through a
//! real mount over a slow device: every flush of this test's daemon first
//! sleeps `SKILLFS_TEST_SYNC_DELAY_MS` (a debug build's stand-in for a disk
//! whose cache flush takes that long, see `store::durable`). While one
//! writer's `fsync` waits on it, the rest of the tree must go on: creates,
//! renames, unlinks, listings, `.history`. And what the `fsync` publishes
//! stays right when the file is renamed or written again meanwhile.
//!
//! One test binary of its own: the delay is set in the environment the
//! daemon inherits.

use crate::common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::Mount;

const DELAY: Duration = Duration::from_millis(600);

/// What must not wait on another file's flush takes less than this.
const QUICK: Duration = Duration::from_millis(300);

/// Mounts a tree made by `setup` on the slow device.
fn slow_mount(tag: &str, setup: impl FnOnce(&std::path::Path)) -> Mount {
    let delay = DELAY.as_millis().to_string();
    Mount::with_env(tag, &[("SKILLFS_TEST_SYNC_DELAY_MS", &delay)], setup)
}

/// Writes `data` to `rel` and runs `during` while a thread's `fsync` of
/// it waits on the device; what the `fsync` took.
fn while_flushing(m: &Mount, rel: &str, data: &'static str, during: impl FnOnce()) -> Duration {
    let path = m.path(rel);
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all(data.as_bytes()).unwrap();
        tx.send(()).unwrap();
        let t = Instant::now();
        f.sync_all().unwrap();
        t.elapsed()
    });
    rx.recv().unwrap();
    thread::sleep(Duration::from_millis(100)); // inside the flush by now
    during();
    h.join().unwrap()
}

fn quick<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    assert!(
        took < QUICK,
        "{what} took {took:?} while another file was flushed ({DELAY:?} a flush) or unparked: \
         a lock is held across it"
    );
    r
}

#[test]
fn the_tree_goes_on_while_a_file_is_flushed() {
    let m = slow_mount("slowflush", |root| {
        fs::create_dir_all(root.join("cat/foo")).unwrap();
        fs::write(root.join("cat/foo/SKILL.md"), "v1\n").unwrap();
    });

    // 1. Other files' namespace changes, listings and history while one
    //    file's fsync waits on the device.
    let took = while_flushing(&m, "cat/foo/SKILL.md", "v2\n", || {
        quick("create", || fs::write(m.path("cat/new.md"), "n\n").unwrap());
        quick("rename", || {
            fs::rename(m.path("cat/new.md"), m.path("cat/renamed.md")).unwrap()
        });
        quick("mkdir", || fs::create_dir(m.path("cat/bar")).unwrap());
        quick("listing", || fs::read_dir(m.path("cat")).unwrap().count());
        quick("history listing", || {
            fs::read_dir(m.path(".history")).unwrap().count()
        });
        quick("unlink", || {
            fs::remove_file(m.path("cat/renamed.md")).unwrap()
        });
    });
    // Else the delay did not apply and this test proved nothing.
    assert!(took >= DELAY, "the fsync took only {took:?}");
    assert_eq!(
        fs::read_to_string(m.path("cat/foo/SKILL.md")).unwrap(),
        "v2\n"
    );

    // 2. The file's directory renamed while its fsync flushes (the kernel
    //    itself keeps a rename of the file being fsynced waiting, as it
    //    holds the file's inode lock across a FUSE fsync): the version
    //    lands at the new path, and the journal says so in order.
    while_flushing(&m, "cat/foo/SKILL.md", "v3\n", || {
        quick("rename of the directory of the file being flushed", || {
            fs::rename(m.path("cat/foo"), m.path("cat/moved")).unwrap()
        })
    });
    common::assert_enoent(m.path("cat/foo"));
    assert_eq!(
        fs::read_to_string(m.path("cat/moved/SKILL.md")).unwrap(),
        "v3\n"
    );

    // 3. Another handle of the file closed while its fsync flushes: that
    //    close publishes the staged bytes first; the fsync still makes
    //    them durable, and records them once.
    while_flushing(&m, "cat/moved/SKILL.md", "v4\n", || {
        quick(
            "a close of another handle of the file being flushed",
            || {
                drop(
                    OpenOptions::new()
                        .write(true)
                        .open(m.path("cat/moved/SKILL.md"))
                        .unwrap(),
                )
            },
        )
    });
    assert_eq!(
        fs::read_to_string(m.path("cat/moved/SKILL.md")).unwrap(),
        "v4\n"
    );

    // What the journal holds agrees with the tree: each name's newest
    // state is its live content, and v3 was recorded (at either name).
    let log = m.log();
    let newest = |p: &str| {
        log.iter()
            .rev()
            .find(|r| r["path"] == p || r["to"] == p)
            .cloned()
            .unwrap_or_else(|| panic!("no record of {p}"))
    };
    let moved = newest("cat/moved/SKILL.md");
    let blob = moved["state"]["blob"].as_str().unwrap();
    assert_eq!(m.blob(blob), b"v4\n");
    let v4s = log
        .iter()
        .filter(|r| r["state"]["blob"].as_str() == Some(blob))
        .count();
    assert_eq!(v4s, 1, "v4 recorded {v4s} times");
    assert!(
        log.iter().any(|r| r["state"]["blob"]
            .as_str()
            .is_some_and(|b| m.blob(b) == b"v3\n")),
        "v3 was acknowledged by fsync but is in no record"
    );
    assert_eq!(newest("cat/foo")["to"], "cat/moved");
    assert_eq!(
        fs::read(m.path(".history/latest/cat/moved/SKILL.md")).unwrap(),
        b"v4\n"
    );
}

/// One big park at a time: two at once would not fit the 2 GiB image the
/// test command also runs this binary on.
static BIG_PARKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

const BIG: usize = 512 << 20;

/// A mount with the park `cat/foo.bak` holding `big.bin` (BIG bytes) and
/// `SKILL.md`.
fn big_park_mount(tag: &str) -> Mount {
    slow_mount(tag, |root| {
        // `*.bak` directories outside a skill are parks (moved out at mount).
        fs::create_dir_all(root.join("cat/foo.bak")).unwrap();
        let mut data = vec![0u8; BIG];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        fs::write(root.join("cat/foo.bak/big.bin"), &data).unwrap();
        fs::write(root.join("cat/foo.bak/SKILL.md"), "parked\n").unwrap();
    })
}

/// A hidden directory renamed into view is an unpark: every file in it is
/// stored and recorded. Their content is read before the rename takes the
/// namespace lock, so the rest of the tree does not wait on it.
#[test]
fn the_tree_goes_on_while_a_big_park_is_unparked() {
    let _one = BIG_PARKS.lock().unwrap_or_else(|e| e.into_inner());
    let m = big_park_mount("slowunpark");
    assert!(!fs::read_dir(m.path("cat")).unwrap().any(|_| true));
    let (from, to) = (m.path("cat/foo.bak"), m.path("cat/restored"));
    let renaming = thread::spawn(move || {
        let t = Instant::now();
        fs::rename(from, to).unwrap();
        t.elapsed()
    });
    thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    quick("create", || fs::write(m.path("other.md"), "o\n").unwrap());
    quick("rename", || {
        fs::rename(m.path("other.md"), m.path("other2.md")).unwrap()
    });
    let others = t.elapsed();
    let took = renaming.join().unwrap();
    // Else reading it was too quick to tell anything.
    assert!(took > QUICK, "the unpark took only {took:?}");
    assert!(
        others * 3 < took,
        "a create and a rename took {others:?} while an unpark took {took:?}: they waited on it"
    );
    let log = m.log();
    let big = log
        .iter()
        .rev()
        .find(|r| r["path"] == "cat/restored/big.bin")
        .expect("the unparked file is recorded");
    assert_eq!(big["op"], "unpark");
    assert_eq!(big["state"]["size"], BIG as u64);
    assert_eq!(
        fs::metadata(m.path(".history/latest/cat/restored/big.bin"))
            .unwrap()
            .len(),
        BIG as u64
    );
}

/// An unpark is planned before its rename takes the lock, and a change to
/// the subtree meanwhile must not be lost to the plan: a write into a file
/// of the park while the plan reads the big file is in the unpark's
/// record, not the content the plan would have read.
#[test]
fn a_park_written_while_its_unpark_is_planned_is_recorded_as_written() {
    let _one = BIG_PARKS.lock().unwrap_or_else(|e| e.into_inner());
    let m = big_park_mount("unparkrace");
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path("cat/foo.bak/SKILL.md"))
        .unwrap();
    let (from, to) = (m.path("cat/foo.bak"), m.path("cat/restored"));
    let renaming = thread::spawn(move || fs::rename(from, to).unwrap());
    thread::sleep(Duration::from_millis(100));
    f.write_all(b"written while planned\n").unwrap();
    drop(f);
    // Else the write came after the rename and this test proved nothing.
    assert!(
        !renaming.is_finished(),
        "the unpark was over before the write"
    );
    renaming.join().unwrap();
    let log = m.log();
    let rec = log
        .iter()
        .rev()
        .find(|r| r["path"] == "cat/restored/SKILL.md")
        .expect("the unparked file is recorded");
    assert_eq!(rec["op"], "unpark");
    assert_eq!(
        m.blob(rec["state"]["blob"].as_str().unwrap()),
        b"written while planned\n"
    );
    assert_eq!(
        fs::read(m.path(".history/latest/cat/restored/SKILL.md")).unwrap(),
        b"written while planned\n"
    );
}
