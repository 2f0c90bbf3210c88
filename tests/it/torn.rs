//! After a power cut, no live file is left empty or torn while history
//! holds it whole. What a power cut leaves (a file whose blocks were never
//! written: empty, zeros, whole blocks zeroed) is made by hand in the
//! plain directory after the daemon is SIGKILLed, which leaves the
//! journal past its checkpoint as a power cut does; the next mount must
//! put back the recorded version, keep the found bytes as a version before
//! it, and say so. After a clean unmount the same edit is the user's.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::{Mount, skillfs};

fn content(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ seed | 1).collect()
}

/// The state a record gives its path, and who made it.
fn last_two(m: &Mount, path: &str) -> Vec<(String, u64)> {
    let recs: Vec<_> = m
        .log()
        .into_iter()
        .filter(|r| r["path"] == path)
        .map(|r| {
            (
                r["actor"]["comm"].as_str().unwrap_or("").to_string(),
                r["state"]["size"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    recs[recs.len().saturating_sub(2)..].to_vec()
}

#[test]
fn files_torn_by_a_power_cut_are_put_back_and_what_was_found_is_kept() {
    let mut m = Mount::new("torn");
    fs::create_dir_all(m.path("cat/s/assets")).unwrap();
    let skill = content(5000, 3);
    let asset = content(3 * 4096 + 17, 7);
    let small = b"---\nname: s\n---\nsmall\n".to_vec();
    fs::write(m.path("cat/s/SKILL.md"), &skill).unwrap();
    fs::write(m.path("cat/s/assets/big.bin"), &asset).unwrap();
    fs::write(m.path("cat/s/notes.md"), &small).unwrap();
    fs::set_permissions(m.path("cat/s/notes.md"), fs::Permissions::from_mode(0o640)).unwrap();
    // The daemon dies with records past the checkpoint, as at a power cut;
    // then the disk shows what delayed allocation leaves.
    m.kill9();
    fs::write(m.path("cat/s/SKILL.md"), b"").unwrap();
    let mut holes = asset.clone();
    holes[4096..8192].fill(0);
    fs::write(m.path("cat/s/assets/big.bin"), &holes).unwrap();
    fs::write(m.path("cat/s/notes.md"), vec![0u8; small.len()]).unwrap();
    m.remount();
    assert_eq!(fs::read(m.path("cat/s/SKILL.md")).unwrap(), skill);
    assert_eq!(fs::read(m.path("cat/s/assets/big.bin")).unwrap(), asset);
    assert_eq!(fs::read(m.path("cat/s/notes.md")).unwrap(), small);
    let mode = fs::metadata(m.path("cat/s/notes.md"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640, "put back as it was recorded");
    // The found bytes are a version, the repair one after it.
    assert_eq!(
        last_two(&m, "cat/s/SKILL.md"),
        vec![
            ("skillfs".to_string(), 0),
            ("skillfs-repair".to_string(), 5000)
        ]
    );
    // `undo` takes a repair back: the found bytes again.
    let root = m.root().display().to_string();
    let out = skillfs(&["undo", "cat/s/notes.md", "--root", &root]);
    assert!(out.status.success(), "{}", common::describe(&out));
    assert_eq!(
        fs::read(m.path("cat/s/notes.md")).unwrap(),
        vec![0u8; small.len()]
    );
    let log = fs::read_to_string(m.store().join("daemon.log")).unwrap();
    assert!(
        log.contains("found torn") && log.contains("cat/s/SKILL.md"),
        "{log}"
    );
}

#[test]
fn after_a_clean_unmount_an_emptied_file_is_the_users_edit() {
    let mut m = Mount::new("torneditclean");
    fs::write(m.path("f.md"), b"words").unwrap();
    m.umount();
    fs::write(m.path("f.md"), b"").unwrap();
    // A command that takes the store's lock unmounted is no crash.
    let root = m.root().display().to_string();
    let out = skillfs(&["forget", "--keep-last", "100", "--root", &root]);
    assert!(out.status.success(), "{}", common::describe(&out));
    m.remount();
    assert_eq!(fs::read(m.path("f.md")).unwrap(), b"");
    assert!(
        last_two(&m, "f.md")
            .iter()
            .all(|(who, _)| who != "skillfs-repair"),
        "{:?}",
        last_two(&m, "f.md")
    );
}

#[test]
fn an_edit_after_an_unclean_stop_is_kept_when_it_is_not_torn() {
    let mut m = Mount::new("torneditdirty");
    fs::write(m.path("f.md"), content(9000, 1)).unwrap();
    m.kill9();
    // Real bytes, shorter, a cut inside a block: an edit, not a power cut.
    fs::write(m.path("f.md"), content(100, 9)).unwrap();
    m.remount();
    assert_eq!(fs::read(m.path("f.md")).unwrap(), content(100, 9));
}
