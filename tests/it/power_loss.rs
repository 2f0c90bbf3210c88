//! Power loss at every sync point of the store, after redb's
//! `tests/crash_consistency.rs`: the store's durable operations go through a
//! test `SyncBackend` that keeps a *durable image* beside the live files (a
//! file's bytes as of its last `fsync`/`fdatasync`, a directory's entries as
//! of its last `fsync`, everything at a `syncfs`; `tests/it/common/
//! power_loss.rs`, shared with `tests/it/power_loss_core.rs`). A seeded schedule of
//! store operations (small and large blobs, durable or not, records,
//! acknowledgements, a daemon SIGKILLed and reopened) runs once to count the
//! sync points, then again once per sync point with the power lost there.
//! The store is rebuilt from the durable image, with whatever was never
//! synced dropped, cut short, zeroed block by block or left whole (the
//! disk may have written any of it, in any order), and must:
//! - open (never refuse: nothing in it is damage);
//! - hold every acknowledged record, each naming a blob that is present and
//!   hashes right, and serve no unacknowledged record's blob wrongly;
//! - after storing every content again durably (deduplicating onto what the
//!   crash left) and another power loss, still do so.
//!
//! `SKILLFS_POWER_LOSS_NOOP_FSYNC=1` makes every sync a no-op; the test must
//! then fail (and `noop_fsync_is_caught` checks that it does).

use crate::common::power_loss as backend;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use backend::{PowerLoss, Rng, eio};
use sha2::{Digest, Sha256};
use skillfs::ledger::Ledger;
use skillfs::relpath::RelPath;
use skillfs::store::Layout;
use skillfs::store::blobs::BlobStore;
use skillfs::store::durable::StoreIo;
use skillfs::store::journal::{self, Actor, Change, EntryState, Journal, Kind, Op};
use skillfs::store::packs::PACK_MAX;

/// A store opened as the daemon opens it (`daemon::prepare`).
struct Store {
    ledger: Ledger,
    blobs: BlobStore,
}

fn open_store(dir: &Path, io: &StoreIo) -> Result<Store, String> {
    let layout = Layout::new(dir.to_path_buf());
    let fds = layout.create(io.clone()).map_err(|e| e.to_string())?;
    let contents = journal::read_in(&fds.journal).map_err(|e| e.to_string())?;
    fds.clear_scratch().map_err(|e| e.to_string())?;
    let journal =
        Journal::open_in(&fds.journal, &contents, io.clone()).map_err(|e| e.to_string())?;
    Ok(Store {
        ledger: Ledger::new(journal, &contents.records),
        blobs: BlobStore::new(fds.blobs.clone(), io.clone()),
    })
}

fn pool(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..5 {
        let n = 1 + rng.below(4000) as usize;
        out.push(rng.bytes(n));
    }
    for _ in 0..3 {
        let n = PACK_MAX as usize + 1 + rng.below(60_000) as usize;
        out.push(rng.bytes(n));
    }
    out
}

/// Stores `data` (through a file, as a publish does) and records it.
fn write(
    s: &mut Store,
    scratch: &Path,
    name: &str,
    data: &[u8],
    durable: bool,
) -> io::Result<(u64, String)> {
    fs::write(scratch, data)?;
    let (blob, size) = s.blobs.put_file(&File::open(scratch)?, durable)?;
    let state = EntryState {
        kind: Kind::File,
        blob: Some(blob.clone()),
        size,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime_ns: 0,
        target: None,
    };
    let path = RelPath::parse(name.as_bytes()).expect("a plain name");
    let rec = s
        .ledger
        .record(Change::new(Op::Write, path, Some(state)), Actor::daemon())?;
    if durable {
        s.ledger.sync(&s.blobs)?;
    }
    Ok((rec.seq, blob))
}

fn sha(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Opens the store at `dir` after a crash and checks it against what was
/// acknowledged: `expected[seq - 1]` is the blob record `seq` named.
fn check_after_crash(
    dir: &Path,
    io: &StoreIo,
    expected: &[String],
    acked: u64,
) -> Result<Store, String> {
    let s = open_store(dir, io).map_err(|e| format!("store refused to open: {e}"))?;
    let records: Vec<_> = {
        let contents = journal::read_dir(&dir.join("journal")).map_err(|e| e.to_string())?;
        contents.records
    };
    if (records.len() as u64) < acked {
        return Err(format!(
            "acknowledged {acked} records, {} survived",
            records.len()
        ));
    }
    for r in &records {
        let blob = r
            .state
            .as_ref()
            .and_then(|st| st.blob.clone())
            .unwrap_or_default();
        let i = r.seq as usize - 1;
        if r.seq <= acked && expected.get(i) != Some(&blob) {
            return Err(format!(
                "record {} names {blob}, not {:?}",
                r.seq,
                expected.get(i)
            ));
        }
        let read = s.blobs.read(&blob);
        let opened = s.blobs.open(&blob).and_then(|o| {
            let mut buf = vec![0u8; r.state.as_ref().map_or(0, |st| st.size) as usize];
            let n = o.read_at(&mut buf, 0)?;
            buf.truncate(n);
            Ok(buf)
        });
        for (how, got) in [("read", read), ("open", opened)] {
            match got {
                Ok(b) if sha(&b) == blob => {}
                Ok(_) => {
                    return Err(format!(
                        "record {} (acked {acked}): {how} served wrong bytes for {blob}",
                        r.seq
                    ));
                }
                Err(e) if r.seq <= acked => {
                    return Err(format!(
                        "acknowledged record {}: blob {blob} lost ({how}): {e}",
                        r.seq
                    ));
                }
                Err(_) => {} // never acknowledged: may be gone, never wrong
            }
        }
    }
    Ok(s)
}

struct Outcome {
    syncs: usize,
    failure: Option<String>,
}

/// One run of schedule `seed`, the power lost at sync `fail_at` (0:
/// never; the machine dies after the last step).
fn run(seed: u64, fail_at: usize, noop: bool, base: &Path) -> Outcome {
    let mut rng = Rng(seed);
    let contents = pool(&mut rng);
    let dir = base.join("store");
    let scratch = base.join("src");
    fs::create_dir_all(&dir).unwrap();
    let backend = Arc::new(PowerLoss::new(&dir, fail_at, noop));
    let io = StoreIo::with_backend(backend.clone());

    let mut expected: Vec<String> = Vec::new();
    let mut acked = 0u64;
    let steps = 24;
    let result = (|| -> io::Result<()> {
        let mut s = open_store(&dir, &io).map_err(|_| eio())?;
        for step in 0..steps {
            let c = &contents[rng.below(contents.len() as u64) as usize];
            match rng.below(10) {
                0..=4 => {
                    let (seq, blob) = write(&mut s, &scratch, &format!("f{step}"), c, false)?;
                    assert_eq!(seq as usize, expected.len() + 1);
                    expected.push(blob);
                }
                5..=6 => {
                    let (seq, blob) = write(&mut s, &scratch, &format!("f{step}"), c, true)?;
                    expected.push(blob);
                    acked = seq;
                }
                7..=8 => {
                    s.ledger.sync(&s.blobs)?;
                    acked = expected.len() as u64;
                }
                _ => {
                    // SIGKILL: the page cache survives, the process does not.
                    drop(s);
                    s = open_store(&dir, &io).map_err(|_| eio())?;
                    acked = expected.len() as u64;
                }
            }
        }
        Ok(())
    })();
    let syncs = backend.syncs.load(Ordering::SeqCst);
    if let Err(e) = result
        && !backend.lost.load(Ordering::SeqCst)
    {
        return Outcome {
            syncs,
            failure: Some(format!("failed without a power loss: {e}")),
        };
    }

    let mut crash_rng = Rng(seed ^ (fail_at as u64).wrapping_mul(0x1234_5678_9abc));
    let after = base.join("after");
    backend.crash_into(&after, &mut crash_rng).unwrap();
    let io2_backend = Arc::new(PowerLoss::new(&after, 0, noop));
    let io2 = StoreIo::with_backend(io2_backend.clone());
    let mut s = match check_after_crash(&after, &io2, &expected, acked) {
        Ok(s) => s,
        Err(e) => {
            return Outcome {
                syncs,
                failure: Some(e),
            };
        }
    };

    // Every content again, durably, over what the crash left; then the
    // power goes again.
    let mut expected2: Vec<String> = journal::read_dir(&after.join("journal"))
        .unwrap()
        .records
        .iter()
        .map(|r| {
            r.state
                .as_ref()
                .and_then(|st| st.blob.clone())
                .unwrap_or_default()
        })
        .collect();
    let mut acked2 = expected2.len() as u64;
    for (i, c) in contents.iter().enumerate() {
        match write(&mut s, &scratch, &format!("again{i}"), c, true) {
            Ok((seq, blob)) => {
                expected2.push(blob);
                acked2 = seq;
            }
            Err(e) => {
                return Outcome {
                    syncs,
                    failure: Some(format!("storing again after the crash failed: {e}")),
                };
            }
        }
    }
    drop(s);
    let again = base.join("again");
    io2_backend.crash_into(&again, &mut crash_rng).unwrap();
    let failure = check_after_crash(&again, &StoreIo::real(), &expected2, acked2)
        .err()
        .map(|e| format!("after storing again: {e}"));
    Outcome { syncs, failure }
}

fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("skillfs-power-loss-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

/// Every sync point of `seeds`; the failures found, one line each.
fn every_sync_point(seeds: std::ops::Range<u64>, noop: bool, tag: &str) -> Vec<String> {
    let base = scratch_dir(tag);
    let mut failures = Vec::new();
    let mut points = 0;
    for seed in seeds {
        let count = run(seed, 0, noop, &base.join("count"));
        let total = count.syncs;
        if let Some(f) = count.failure {
            failures.push(format!("seed {seed}, no power loss until the end: {f}"));
        }
        for k in 1..=total {
            let d = base.join(format!("{seed}-{k}"));
            let o = run(seed, k, noop, &d);
            points += 1;
            if let Some(f) = o.failure {
                failures.push(format!("seed {seed}, power lost at sync {k}/{total}: {f}"));
            }
            let _ = fs::remove_dir_all(&d);
        }
        let _ = fs::remove_dir_all(base.join("count"));
    }
    let _ = fs::remove_dir_all(&base);
    eprintln!("{points} sync points, {} failures", failures.len());
    failures
}

#[test]
fn power_loss_at_every_sync_point_loses_nothing_acknowledged() {
    let noop = std::env::var_os("SKILLFS_POWER_LOSS_NOOP_FSYNC").is_some_and(|v| v == "1");
    let failures = every_sync_point(0..6, noop, "all");
    assert!(
        failures.is_empty(),
        "{} failures, the first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The test above is only worth something if it notices syncs that do
/// nothing.
#[test]
fn noop_fsync_is_caught() {
    let failures = every_sync_point(0..2, true, "noop");
    assert!(
        !failures.is_empty(),
        "with every fsync a no-op, a power loss lost nothing?"
    );
}
