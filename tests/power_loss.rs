//! Power loss at every sync point of the store, after redb's
//! `tests/crash_consistency.rs`: the store's durable operations go through a
//! test `SyncBackend` that keeps a *durable image* beside the live files (a
//! file's bytes as of its last `fsync`/`fdatasync`, a directory's entries as
//! of its last `fsync`, everything at a `syncfs`). A seeded schedule of
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

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use skillfs::ledger::Ledger;
use skillfs::relpath::RelPath;
use skillfs::store::Layout;
use skillfs::store::blobs::BlobStore;
use skillfs::store::durable::{StoreIo, SyncBackend};
use skillfs::store::journal::{self, Actor, Change, EntryState, Journal, Kind, Op};
use skillfs::store::packs::PACK_MAX;

/// splitmix64: small, seeded, good enough for schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[derive(Default)]
struct Image {
    /// Inode → its bytes as of its last sync.
    data: HashMap<u64, Vec<u8>>,
    /// Directory inode → its entries (name → inode, is a directory) as of
    /// its last sync.
    dirs: HashMap<u64, BTreeMap<OsString, (u64, bool)>>,
}

/// A disk that loses power at sync number `fail_at` (that sync and every
/// later one fail, and none of them reaches the image).
struct PowerLoss {
    root: PathBuf,
    image: Mutex<Image>,
    syncs: AtomicUsize,
    fail_at: usize,
    lost: AtomicBool,
    noop: bool,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn dir_entries(dir: &Path) -> io::Result<BTreeMap<OsString, (u64, bool)>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let md = fs::symlink_metadata(e.path())?;
        out.insert(e.file_name(), (md.ino(), md.is_dir()));
    }
    Ok(out)
}

impl PowerLoss {
    fn new(root: &Path, fail_at: usize, noop: bool) -> PowerLoss {
        PowerLoss {
            root: root.to_path_buf(),
            image: Mutex::new(Image::default()),
            syncs: AtomicUsize::new(0),
            fail_at,
            lost: AtomicBool::new(false),
            noop,
        }
    }

    fn point(&self, apply: impl FnOnce(&mut Image) -> io::Result<()>) -> io::Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(eio());
        }
        let n = self.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at {
            self.lost.store(true, Ordering::SeqCst);
            return Err(eio());
        }
        if self.noop {
            return Ok(());
        }
        apply(&mut self.image.lock())
    }

    fn snapshot_file(img: &mut Image, f: &File) -> io::Result<()> {
        let md = f.metadata()?;
        if md.is_dir() {
            let path = fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
            img.dirs.insert(md.ino(), dir_entries(&path)?);
        } else {
            // Through /proc: the store may have opened it write-only.
            img.data.insert(
                md.ino(),
                fs::read(format!("/proc/self/fd/{}", f.as_raw_fd()))?,
            );
        }
        Ok(())
    }

    fn snapshot_tree(img: &mut Image, dir: &Path) -> io::Result<()> {
        let entries = dir_entries(dir)?;
        img.dirs.insert(fs::metadata(dir)?.ino(), entries.clone());
        for (name, (ino, is_dir)) in entries {
            let p = dir.join(&name);
            if is_dir {
                PowerLoss::snapshot_tree(img, &p)?;
            } else {
                img.data.insert(ino, fs::read(&p)?);
            }
        }
        Ok(())
    }

    /// Writes what a power loss now would leave into `dst`.
    fn crash_into(&self, dst: &Path, rng: &mut Rng) -> io::Result<()> {
        let mut live_files: HashMap<u64, PathBuf> = HashMap::new();
        let mut live_dirs: HashMap<u64, PathBuf> = HashMap::new();
        let mut stack = vec![self.root.clone()];
        while let Some(d) = stack.pop() {
            live_dirs.insert(fs::metadata(&d)?.ino(), d.clone());
            for (name, (ino, is_dir)) in dir_entries(&d)? {
                if is_dir {
                    stack.push(d.join(name));
                } else {
                    live_files.insert(ino, d.join(name));
                }
            }
        }
        let img = self.image.lock();
        let root_ino = fs::metadata(&self.root)?.ino();
        let mut todo = vec![(root_ino, dst.to_path_buf())];
        while let Some((ino, at)) = todo.pop() {
            fs::create_dir_all(&at)?;
            // Entries never synced may have reached the disk anyway (a
            // journal commit for something else carried them).
            let live = live_dirs.get(&ino).map(|p| dir_entries(p)).transpose()?;
            let entries = match (img.dirs.get(&ino), live) {
                (_, Some(l)) if rng.below(2) == 0 => l,
                (Some(d), _) => d.clone(),
                (None, _) => BTreeMap::new(),
            };
            for (name, (child, is_dir)) in entries {
                let p = at.join(&name);
                if is_dir {
                    todo.push((child, p));
                    continue;
                }
                let synced = img.data.get(&child);
                let live = live_files.get(&child).map(fs::read).transpose()?;
                let bytes = match (synced, live) {
                    (Some(s), Some(l)) if l.starts_with(s) => {
                        let mut b = s.clone();
                        b.extend(mangle(&l[s.len()..], s.len(), rng));
                        b
                    }
                    (Some(s), _) => s.clone(),
                    (None, Some(l)) => mangle(&l, 0, rng),
                    (None, None) => Vec::new(),
                };
                fs::write(&p, bytes)?;
            }
        }
        Ok(())
    }
}

/// What a disk may have kept of bytes written but never synced (`b`,
/// found at offset `at` of its file).
fn mangle(b: &[u8], at: usize, rng: &mut Rng) -> Vec<u8> {
    const BLOCK: usize = 512;
    let mut out = b.to_vec();
    match rng.below(5) {
        0 => out.clear(),
        1 => {}
        2 => out.truncate(rng.below(b.len() as u64 + 1) as usize),
        // Size written, data not (delayed allocation, XFS).
        3 => out.fill(0),
        _ => {
            // Some blocks written, others not, in any order.
            let mut start = 0;
            while start < out.len() {
                let end = (start + BLOCK - (at + start) % BLOCK).min(out.len());
                if rng.below(2) == 0 {
                    out[start..end].fill(0);
                }
                start = end;
            }
            if rng.below(2) == 0 {
                out.truncate(rng.below(b.len() as u64 + 1) as usize);
            }
        }
    }
    out
}

impl SyncBackend for PowerLoss {
    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.point(|img| PowerLoss::snapshot_file(img, file))
    }
    fn sync_all(&self, file: &File) -> io::Result<()> {
        self.point(|img| PowerLoss::snapshot_file(img, file))
    }
    fn sync_dir(&self, _held: &File, dir: &Path) -> io::Result<()> {
        self.point(|img| {
            img.dirs.insert(fs::metadata(dir)?.ino(), dir_entries(dir)?);
            Ok(())
        })
    }
    fn syncfs(&self, _file: &File) -> io::Result<()> {
        let root = self.root.clone();
        self.point(|img| PowerLoss::snapshot_tree(img, &root))
    }
    fn write_out(&self, _file: &File) -> io::Result<()> {
        Ok(()) // not a durability point on its own
    }
}

/// A store opened as the daemon opens it (`daemon::prepare`).
struct Store {
    ledger: Ledger,
    blobs: BlobStore,
}

fn open_store(dir: &Path, io: &StoreIo) -> Result<Store, String> {
    let layout = Layout::new(dir.to_path_buf());
    let fds = layout.create().map_err(|e| e.to_string())?;
    let contents = journal::read_in(&fds.journal).map_err(|e| e.to_string())?;
    fds.clear_scratch().map_err(|e| e.to_string())?;
    let journal =
        Journal::open_in(&fds.journal, &contents, io.clone()).map_err(|e| e.to_string())?;
    Ok(Store {
        ledger: Ledger::new(journal, &contents.records),
        blobs: BlobStore::new(fds.blobs.clone(), fds.tmp.clone()).with_io(io.clone()),
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
