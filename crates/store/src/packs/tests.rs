//! The packs' unit tests: reopen, cut-off tails, damage, legacy packs.

use super::*;
use std::fs;
use std::path::Path;

fn damage_last_byte(path: &Path) {
    let mut raw = fs::read(path).unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 0xff;
    overwrite(path, &raw);
}

/// Rewrites a (read-only) pack, as damage would.
fn overwrite(path: &Path, raw: &[u8]) {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    fs::write(path, raw).unwrap();
}

/// The packs of a `blobs/` directory at `dir` (made if missing).
fn packs_in(dir: &Path) -> Packs {
    fs::create_dir_all(dir).unwrap();
    Packs::new(Arc::new(Dir::open_path(dir).unwrap()), StoreIo::real())
}

fn id_of(data: &[u8]) -> RawId {
    Sha256::digest(data).into()
}

#[test]
fn appends_survive_a_reopen_and_a_cut_off_tail_is_ignored() {
    let dir = std::env::temp_dir().join(format!("skillfs-packs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let packs = packs_in(&dir);
    let a = b"first version".to_vec();
    let b = vec![7u8; 5000];
    packs.append(&id_of(&a), &a, false).unwrap();
    let appended = packs.append(&id_of(&b), &b, true).unwrap();
    assert!(!appended.new_pack, "a durable append syncs its directory");
    assert_eq!(packs.read(&id_of(&b)).unwrap(), b);

    // A crash cut the next entry short.
    let c = vec![9u8; 3000];
    let path = packs.path(FIRST_ZPACK);
    let mut raw = fs::read(&path).unwrap();
    raw.extend_from_slice(format::PLAIN);
    raw.extend_from_slice(&id_of(&c));
    raw.extend_from_slice(&3000u64.to_le_bytes());
    raw.extend_from_slice(&c[..100]);
    overwrite(&path, &raw);

    let again = packs_in(&dir);
    assert!(again.has_intact(&id_of(&a), a.len() as u64));
    assert!(!again.has_intact(&id_of(&a), 1), "wrong size");
    assert_eq!(again.read(&id_of(&b)).unwrap(), b);
    assert!(!again.contains(&id_of(&c)), "cut off");
    // New entries go to a new pack, never after the cut-off tail.
    let appended = again.append(&id_of(&c), &c, false).unwrap();
    assert!(appended.new_pack);
    assert_eq!(appended.pack, FIRST_ZPACK + 1);
    assert_eq!(again.read(&id_of(&c)).unwrap(), c);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_earlier_builds_pack_is_read_and_never_appended_to() {
    let dir = std::env::temp_dir().join(format!("skillfs-packs-legacy-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    // What a build before `.zpack` files wrote: plain entries in
    // `00000001.pack` and `00000002.pack`.
    let old = b"an old version".to_vec();
    let mut raw = format::PLAIN.to_vec();
    raw.extend_from_slice(&id_of(&old));
    raw.extend_from_slice(&(old.len() as u64).to_le_bytes());
    raw.extend_from_slice(&old);
    fs::create_dir_all(dir.join(PACKS)).unwrap();
    for n in [1, 2] {
        fs::write(dir.join(PACKS).join(legacy_pack_name(n)), &raw).unwrap();
    }
    let packs = packs_in(&dir);
    assert_eq!(packs.read(&id_of(&old)).unwrap(), old);
    let new = b"a new version".to_vec();
    let appended = packs.append(&id_of(&new), &new, true).unwrap();
    assert_eq!(
        appended.pack, FIRST_ZPACK,
        "numbered apart from an earlier build's"
    );
    assert!(dir.join(PACKS).join(pack_name(FIRST_ZPACK)).exists());
    assert_eq!(
        fs::read(dir.join(PACKS).join(legacy_pack_name(2))).unwrap(),
        raw
    );
    // Read again by the next process, both kinds.
    let again = packs_in(&dir);
    assert_eq!(again.read(&id_of(&old)).unwrap(), old);
    assert_eq!(again.read(&id_of(&new)).unwrap(), new);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_copy_gives_way_to_a_good_one_stored_again() {
    let dir = std::env::temp_dir().join(format!("skillfs-packs-again-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let a = b"stored twice".to_vec();
    packs_in(&dir).append(&id_of(&a), &a, true).unwrap();
    let path = packs_in(&dir).path(FIRST_ZPACK);
    damage_last_byte(&path);
    // The next daemon finds it damaged and stores it again.
    let again = packs_in(&dir);
    assert!(!again.has_intact(&id_of(&a), a.len() as u64));
    again.append(&id_of(&a), &a, true).unwrap();
    assert_eq!(again.read(&id_of(&a)).unwrap(), a);
    // And the one after reads the good copy, though the damaged one
    // comes first.
    let third = packs_in(&dir);
    assert_eq!(third.read(&id_of(&a)).unwrap(), a);
    assert!(third.has_intact(&id_of(&a), a.len() as u64));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_content_is_an_error_not_a_version() {
    let dir = std::env::temp_dir().join(format!("skillfs-packs-bad-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let packs = packs_in(&dir);
    let a = b"precious".to_vec();
    packs.append(&id_of(&a), &a, true).unwrap();
    let path = packs.path(FIRST_ZPACK);
    damage_last_byte(&path);
    let again = packs_in(&dir);
    assert!(!again.has_intact(&id_of(&a), a.len() as u64));
    let e = again.read(&id_of(&a)).unwrap_err();
    assert!(e.to_string().contains("does not match its hash"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_length_in_the_middle_loses_no_later_entry() {
    let dir = std::env::temp_dir().join(format!("skillfs-packs-len-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let packs = packs_in(&dir);
    let contents: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 100 + 50 * i as usize]).collect();
    let mut offsets = Vec::new();
    for c in &contents {
        offsets.push(packs.writer.lock().as_ref().map_or(0, |w| w.end));
        packs.append(&id_of(c), c, false).unwrap();
    }
    let path = packs.path(FIRST_ZPACK);
    let good = fs::read(&path).unwrap();
    for (bad_len, magic) in [(u64::MAX, false), (PACK_MAX, false), (10, false), (0, true)] {
        let mut raw = good.clone();
        let at = offsets[3] as usize;
        if magic {
            raw[at] = b'X';
        } else {
            raw[at + 36..at + 44].copy_from_slice(&bad_len.to_le_bytes());
        }
        overwrite(&path, &raw);
        let again = packs_in(&dir);
        for (i, c) in contents.iter().enumerate() {
            if i == 3 {
                assert!(!again.has_intact(&id_of(c), c.len() as u64));
            } else {
                assert_eq!(
                    again.read(&id_of(c)).unwrap(),
                    *c,
                    "entry {i}, length {bad_len}"
                );
            }
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}
