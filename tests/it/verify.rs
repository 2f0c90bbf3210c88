//! `skillfs verify`: a sound store answers 0, each kind of damage one line
//! naming the file and what is wrong with exit 5, and nothing is changed.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use common::{Mount, describe, skillfs};

/// Every file of the store's journal and blobs with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.join("journal"), dir.join("blobs")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.clone(), fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

fn verify(m: &Mount, full: bool) -> std::process::Output {
    let root = m.root().display().to_string();
    let mut args = vec!["verify", "--root", &root];
    if full {
        args.push("--full");
    }
    skillfs(&args)
}

/// Flips a byte of the journal's third record, which later (synced)
/// records vouch was durable: damage, not a torn tail. The segment and its
/// bytes now.
fn damage_third_record(m: &Mount) -> (PathBuf, Vec<u8>) {
    let seg = fs::read_dir(m.store().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    let third = bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(1)
        .unwrap()
        .0
        + 5;
    bytes[third] ^= 0x20;
    fs::write(&seg, &bytes).unwrap();
    (seg, bytes)
}

/// A store with versions in a pack, one of them large (in chunks),
/// unmounted.
fn store_with_history(tag: &str) -> Mount {
    let mut m = Mount::new(tag);
    for i in 0..20 {
        fs::write(m.path(&format!("f{}.md", i % 4)), format!("version {i}")).unwrap();
    }
    fs::write(m.path("big.bin"), big()).unwrap();
    // A durable write: its record vouches for every record before it.
    let f = fs::File::create(m.path("synced.md")).unwrap();
    std::io::Write::write_all(&mut &f, b"synced").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(m.path("last.md"), "after the sync").unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.path("last.md"))
        .unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.umount();
    m
}

#[test]
fn a_sound_store_verifies_mounted_or_not() {
    let mut m = store_with_history("verify-sound");
    for full in [false, true] {
        let out = verify(&m, full);
        assert!(out.status.success(), "{}", describe(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("sound: "), "{text}");
        assert!(text.contains("0 loose blobs"), "{text}");
    }
    let before = snapshot(&m.store());
    assert!(verify(&m, true).status.success());
    assert!(snapshot(&m.store()) == before, "verify changes nothing");
    m.remount();
    fs::write(m.path("f1.md"), "while mounted").unwrap();
    let out = verify(&m, true);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("live tree compared"));
    m.umount();
    // Changed while unmounted: a note (the next mount records it), not a problem.
    fs::write(m.path("f2.md"), "offline").unwrap();
    let out = verify(&m, true);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("note: live f2.md: its content differs"),
        "{text}"
    );
}

#[test]
fn a_damaged_journal_record_is_named_by_file_and_line() {
    let m = store_with_history("verify-journal");
    let (seg, _) = damage_third_record(&m);
    let before = snapshot(&m.store());
    let out = verify(&m, false);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let name = seg.file_name().unwrap().to_string_lossy().into_owned();
    assert!(text.contains(&name) && text.contains("line 3"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("problem"));
    assert!(snapshot(&m.store()) == before, "verify changes nothing");
}

#[test]
fn missing_and_damaged_blobs_are_named() {
    let m = store_with_history("verify-blobs");
    let blobs = m.store().join("blobs");
    let id = skillfs::store::blobs::hash_bytes(&big());
    // A chunk of the large content damaged: found by --full only.
    let pack = common::damage_stored(&m.store(), &big(), 100_000);
    assert!(verify(&m, false).status.success());
    let out = verify(&m, true);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let pack_name = pack.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        text.contains(&format!("blobs/packs/{pack_name}"))
            && text.contains("does not match its hash")
            && text.contains(&id)
            && text.contains("its chunk"),
        "{text}"
    );
    // The packs gone: every record that names a content in them is
    // reported.
    fs::remove_dir_all(blobs.join("packs")).unwrap();
    let out = verify(&m, false);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("big.bin") && text.contains(&id) && text.contains("no pack"),
        "{text}"
    );
}

/// A stretch of a pack that is no valid entry, with entries of
/// acknowledged versions after it, is damage (a power cut cannot leave a
/// hole before bytes that were synced); `tests/it/power_loss_core.rs` checks
/// that one a power cut left, with nothing acknowledged after it, is not.
#[test]
fn a_hole_before_acknowledged_entries_is_damage() {
    let m = store_with_history("verify-hole");
    let packs = m.store().join("blobs/packs");
    let mut all: Vec<_> = fs::read_dir(&packs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    let first = &all[0];
    let mut raw = fs::read(first).unwrap();
    raw[..4].copy_from_slice(b"XXXX");
    fs::set_permissions(first, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    fs::write(first, &raw).unwrap();
    let out = verify(&m, false);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("at offset 0 are not a valid entry (damaged)") && !text.contains("power cut"),
        "{text}"
    );
}

/// The large content of `store_with_history`.
fn big() -> Vec<u8> {
    common::noise(300_000, 21)
}

/// A healthy store in use is sound: the tree moving on while `verify
/// --full` reads it is no problem.
#[test]
fn a_store_being_written_verifies_sound() {
    let m = Mount::new("verify-busy");
    fs::create_dir(m.path("cat")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (dir, stop) = (m.path("cat"), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                fs::write(dir.join(format!("small{}", i % 5)), i.to_string()).unwrap();
                fs::write(dir.join("mid"), vec![(i % 251) as u8; 300_000]).unwrap();
                if i.is_multiple_of(7) {
                    let _ = fs::remove_file(dir.join("small3"));
                }
                i += 1;
            }
        })
    };
    for _ in 0..3 {
        let out = verify(&m, true);
        assert!(out.status.success(), "{}", describe(&out));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().unwrap();
}

/// `skillfs repair` after damage: every sound record kept with its id, the
/// damaged one's id filled with a `lost` record, the segment set aside
/// whole, and the store mounts and verifies again. Refused while mounted;
/// a sound journal is left alone.
#[test]
fn repair_keeps_every_sound_record_and_sets_the_damage_aside() {
    let mut m = store_with_history("verify-repair");
    let root = m.root().display().to_string();
    let out = skillfs(&["repair", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to repair"));
    let before: Vec<serde_json::Value> = m.log();
    let (_, bytes) = damage_third_record(&m);
    // The mount refuses, naming the file, the line and the repair.
    let out = skillfs(&["mount", &root]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3") && err.contains("skillfs repair"),
        "{err}"
    );
    let out = skillfs(&["repair", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("now `lost`: 3"), "{text}");
    // The damaged segment is kept whole beside the journal.
    let aside = fs::read_dir(m.store().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("damaged-")
        })
        .expect("the segment set aside");
    assert_eq!(fs::read(aside).unwrap(), bytes);
    assert!(verify(&m, false).status.success());
    m.remount();
    let after = m.log();
    assert_eq!(after[2]["op"], "lost");
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        assert_eq!(b["seq"].as_u64(), Some(i as u64 + 1), "ids have no gap");
        if i != 2 {
            assert_eq!(a, b, "every sound record kept as it was");
        }
    }
    let out = skillfs(&["repair", "--root", &root]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    m.umount();
}
