//! Targets for what a mount reads from the store: journal lines and
//! segments (then folded, as a mount folds them), packs, the checkpoint.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::seeds::sample_journal;
use super::{lines_with_crc, scratch, with_crc};
use crate::catalog::Fold;
use crate::history::HistoryIndex;
use crate::retention::{Policy, select};
use crate::store::Dir;
use crate::store::durable::StoreIo;
use crate::store::journal;
use crate::store::packs::Packs;

/// One journal line (without its newline), as is and with its checksum
/// made right; a record that decodes is encoded again and must decode to
/// itself.
pub fn journal_line(data: &[u8]) -> bool {
    let _ = journal::decode(data);
    let Ok(rec) = journal::decode(&with_crc(data)) else {
        return false;
    };
    let line = journal::encode(&rec);
    let again = journal::decode(&line[..line.len() - 1]);
    assert_eq!(
        again.as_ref(),
        Ok(&rec),
        "a record encoded again reads back"
    );
    true
}

/// A journal directory: `data` cut at form feeds into segments, each
/// line ending in `}` given its checksum; read as a mount reads it, the
/// forgotten records left out as the commands that read it do, and what
/// it reads folded into the catalog and history, a checkpoint of which
/// decodes to the same history.
pub fn journal(data: &[u8]) -> bool {
    let dir = scratch("journal");
    for (i, seg) in data.split(|&b| b == 0x0c).enumerate().take(8) {
        let name = format!("{:020}.jsonl", 1 + 10 * i as u64);
        std::fs::write(dir.join(name), lines_with_crc(seg)).expect("write a segment");
    }
    let Ok(contents) = journal::read_dir(&dir) else {
        return false;
    };
    let taken = !contents.records.is_empty();
    // What `log`, `export` and the other readers show of it.
    let _ = crate::retention::unforgotten(&contents.records);
    fold_checked(contents.records);
    taken
}

/// Folds `records` as a mount does, then checks the history's checkpoint
/// form and a forget over it.
fn fold_checked(records: Vec<journal::Record>) {
    let fold = Fold::replay_owned(records);
    let h = fold.history();
    let bytes = h.encode();
    let back = HistoryIndex::decode(&bytes).expect("a folded history decodes from its encoding");
    assert_eq!(back.encode(), bytes, "a history decoded encodes the same");
    let policy = Policy {
        keep_last: Some(2),
        ..Policy::default()
    };
    let _ = select(h, &policy).forget_count();
}

/// A pack file: scanned as a mount scans `blobs/packs/`, each entry it
/// indexes read back (its content hashes to its id, or it is an error),
/// then one more blob appended and read back.
pub fn pack(data: &[u8]) -> bool {
    let blobs = scratch("pack");
    std::fs::create_dir(blobs.join("packs")).expect("make packs/");
    std::fs::write(blobs.join("packs").join("00000001.pack"), data).expect("write a pack");
    let packs = Packs::new(
        Arc::new(Dir::open_path(&blobs).expect("open blobs/")),
        StoreIo::real(),
    );
    let ids = packs.ids();
    let mut whole = !ids.is_empty();
    for id in ids {
        match packs.read(&id) {
            Ok(content) => {
                assert_eq!(
                    Sha256::digest(&content).as_slice(),
                    id,
                    "a read is its hash"
                );
                assert!(packs.has_intact(&id, content.len() as u64));
            }
            Err(_) => whole = false,
        }
    }
    let extra = b"one more blob";
    let id: [u8; 32] = Sha256::digest(extra).into();
    packs
        .append(&id, extra, false)
        .expect("append to a new pack");
    assert_eq!(packs.read(&id).expect("read what was appended"), extra);
    whole
}

/// The checkpoint: `data` is its body (its checksum is added), beside a
/// journal of a few records; loaded as a mount loads it, and the history
/// it gives (when it matches the journal) folded on and forgotten over.
/// The body's history index is also decoded alone.
pub fn checkpoint(data: &[u8]) -> bool {
    if let Some(h) = HistoryIndex::decode(data) {
        let bytes = h.encode();
        let back = HistoryIndex::decode(&bytes).expect("an index decoded decodes again");
        assert_eq!(back.encode(), bytes);
    }
    let dir = scratch("checkpoint");
    std::fs::write(dir.join(format!("{:020}.jsonl", 1)), sample_journal()).expect("journal");
    let mut file = data.to_vec();
    file.extend_from_slice(&journal::crc32(data).to_le_bytes());
    std::fs::write(dir.join(crate::checkpoint::NAME), file).expect("write the checkpoint");
    let held = Dir::open_path(&dir).expect("open the journal");
    let Ok((contents, Some(index))) = crate::checkpoint::read_for_mount(&held, &mut Vec::new())
    else {
        return false;
    };
    let mut fold = Fold::from_history(index);
    for r in &contents.records {
        fold.apply(r);
    }
    let policy = Policy {
        keep_daily: Some(1),
        ..Policy::default()
    };
    let _ = select(fold.history(), &policy).forget_count();
    true
}
