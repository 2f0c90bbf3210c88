//! Power loss at every sync point of the whole core: the core is opened
//! in-process (`skillfs::open::open_core_with`, no FUSE) over the disk that
//! loses power (`tests/it/common/power_loss.rs`), its durable image covering
//! ROOT and the store alike. A seeded schedule of whole operations goes
//! through the core's handlers, as `tests/it/reftest.rs` drives them:
//! create/write/fsync/close publishes (new files and replaced ones, small
//! and packed-size contents), closes without an fsync, renames, an unpark
//! (a hidden `*.bak` directory renamed to a visible name, then a file in it
//! published), a `forget`, and remounts (the unmount's checkpoint, `RULES`
//! and `syncfs`, the mount's `ROOT`, scan and sync). It runs once to count
//! the sync points, then once per sync point with the power lost there:
//! the core is dropped where it stands, ROOT and the store are rebuilt
//! from the durable image (what was never synced dropped, cut, zeroed or
//! left whole, as the store-level test does) at the same paths, and the
//! core is opened again (the mount's recovery). Then:
//! - the mount must succeed (nothing a power loss leaves is damage);
//! - a top-level file of ROOT whose last change was a publish whose
//!   `fsync` returned holds those bytes;
//! - every version acknowledged before the cut (a publish whose `fsync`
//!   returned) is in history: the record that named it survives, at its
//!   path, and its blob reads back with the exact bytes, unless a surviving
//!   `forget` record forgot its id;
//! - no record's blob reads back wrong (an unacknowledged one may be gone);
//! - `skillfs verify` finds no problem in the store once the core is
//!   closed again, but for unacknowledged records whose blob the disk did
//!   not keep (as the store-level test allows: gone, never wrong).
//!
//! Both durability orders run (`Durability::OneCommit` over a disk whose
//! one fsync commits every earlier metadata change, `StepByStep` over one
//! that commits only what is synced). `SKILLFS_POWER_LOSS_ROUNDS=<n>`
//! runs n seeds of each (default 3: about 250 sync points, seconds),
//! `SKILLFS_POWER_LOSS_SEED=<n>` replays one.
//! `SKILLFS_POWER_LOSS_NOOP_FSYNC=1` makes every sync a no-op, and the test
//! must then fail (`noop_fsync_is_caught` checks that it does).

use crate::common;
use crate::common::power_loss as backend;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend::{PowerLoss, Rng};
use common::sha256_hex;
use skillfs::daemon::DiskAccess;
use skillfs::fs::{Caller, Ino, ROOT_INO, SkillFs};
use skillfs::hide::RuleArgs;
use skillfs::open::{Core, open_core_with};
use skillfs::retention::Policy;
use skillfs::store::Layout;
use skillfs::store::blobs::BlobStore;
use skillfs::store::durable::{Durability, StoreIo};
use skillfs::store::journal;
use skillfs::store::packs::PACK_MAX;
use skillfs_core::error::FsResult;

/// A version a publish's fsync acknowledged: record `seq` names `blob` at
/// `path`.
#[derive(Clone, Debug)]
struct Acked {
    seq: u64,
    path: String,
    blob: String,
}

/// What a run acknowledged: versions, and what each top-level file of
/// ROOT must hold after the crash (`None`: not known, changed since its
/// last acknowledged version). Only top-level names: ROOT itself is never
/// lost, where a directory made since may be (no fsync promises the
/// entries of a file's ancestors).
#[derive(Default)]
struct Promised {
    versions: Vec<Acked>,
    files: std::collections::BTreeMap<String, Option<Vec<u8>>>,
}

impl Promised {
    fn unknown(&mut self, path: &str) {
        self.files.insert(path.to_string(), None);
    }

    fn fsynced(&mut self, path: &str, data: &[u8]) {
        if !path.contains('/') {
            self.files.insert(path.to_string(), Some(data.to_vec()));
        }
    }
}

/// What stands in for the kernel: handlers called in order, lookups never
/// forgotten (a kernel may keep them all).
struct Driver {
    core: Option<Core>,
    caller: Caller,
}

fn errno<T>(r: FsResult<T>) -> std::io::Result<T> {
    r.map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

impl Driver {
    fn fs(&self) -> &SkillFs {
        self.core.as_ref().expect("open").fs()
    }

    /// The directory `rel`, made where missing.
    fn dir(&self, rel: &str) -> std::io::Result<Ino> {
        let mut ino = ROOT_INO;
        for name in rel.split('/').filter(|n| !n.is_empty()) {
            ino = match self.fs().lookup(ino, name.as_bytes()) {
                Ok(e) => e.ino,
                Err(e) if e.errno() == libc::ENOENT => {
                    errno(self.fs().mkdir(ino, name.as_bytes(), 0o755, &self.caller))?.ino
                }
                Err(e) => return Err(std::io::Error::from_raw_os_error(e.errno())),
            };
        }
        Ok(ino)
    }

    fn split(rel: &str) -> (&str, &str) {
        rel.rsplit_once('/').unwrap_or(("", rel))
    }

    /// `open(O_WRONLY|O_CREAT|O_TRUNC)`, `write`, an `fsync` if asked,
    /// `close`: whether the fsync returned (the version acknowledged).
    fn put(&self, rel: &str, data: &[u8], fsync: bool) -> std::io::Result<()> {
        let (parent, name) = Driver::split(rel);
        let parent = self.dir(parent)?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        let fh = match self.fs().lookup(parent, name.as_bytes()) {
            Ok(e) => errno(self.fs().open(e.ino, flags & !libc::O_CREAT, &self.caller))?.fh,
            Err(_) => {
                errno(
                    self.fs()
                        .create(parent, name.as_bytes(), 0o644, flags, &self.caller),
                )?
                .1
                .fh
            }
        };
        let written = (|| {
            for (i, chunk) in data.chunks(64 << 10).enumerate() {
                errno(
                    self.fs()
                        .write(fh, (i * (64 << 10)) as u64, chunk, &self.caller),
                )?;
            }
            if fsync {
                errno(self.fs().fsync(fh, &self.caller))?;
            }
            Ok(())
        })();
        let flushed = errno(self.fs().flush(fh, &self.caller));
        let released = errno(self.fs().release(fh, &self.caller));
        written.and(flushed).and(released)
    }

    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        let (fp, fname) = Driver::split(from);
        let (tp, tname) = Driver::split(to);
        let (fp, tp) = (self.dir(fp)?, self.dir(tp)?);
        errno(
            self.fs()
                .rename(fp, fname.as_bytes(), tp, tname.as_bytes(), 0, &self.caller),
        )
    }
}

fn open(base: &Path, io: &StoreIo, durability: Durability) -> Result<Core, String> {
    let disk = DiskAccess {
        io: io.clone(),
        durability: Some(durability),
    };
    open_core_with(
        &base.join("root"),
        &base.join("store"),
        RuleArgs::default(),
        &disk,
    )
    .map_err(|f| f.message)
}

/// The record acknowledged by an fsync of `data` at `path`: the last one
/// naming that content there.
fn acked_record(store: &Path, path: &str, data: &[u8]) -> Result<Acked, String> {
    let blob = sha256_hex(data);
    let contents = journal::read_dir(&store.join("journal")).map_err(|e| e.to_string())?;
    let r = contents
        .records
        .iter()
        .rev()
        .find(|r| {
            r.path.as_bytes() == path.as_bytes()
                && r.state.as_ref().and_then(|s| s.blob.as_deref()) == Some(&blob)
        })
        .ok_or_else(|| format!("fsync of {path} returned, but no record names its content"))?;
    Ok(Acked {
        seq: r.seq,
        path: path.to_string(),
        blob,
    })
}

fn contents(rng: &mut Rng) -> Vec<u8> {
    let n = match rng.below(6) {
        0 => 0,
        1 => PACK_MAX as usize + 1 + rng.below(40_000) as usize,
        _ => 1 + rng.below(3000) as usize,
    };
    rng.bytes(n)
}

const FILES: &[&str] = &["f", "g", "a/f", "a/g", "b/f", "b/c/f"];

/// The schedule of `seed` on the core over `base`, until it ends or the
/// power is lost; what the fsyncs acknowledged, and the core as it stands
/// (if open).
fn schedule(
    seed: u64,
    base: &Path,
    io: &StoreIo,
    durability: Durability,
    lost: &dyn Fn() -> bool,
) -> Result<(Promised, Option<Core>), String> {
    let mut rng = Rng(seed);
    let mut acked = Promised::default();
    let caller = Caller {
        uid: unsafe { libc::geteuid() },
        gid: unsafe { libc::getegid() },
        pid: std::process::id(),
        comm: None,
    };
    let core = match open(base, io, durability) {
        Ok(core) => core,
        // The power went during the mount: nothing was acknowledged.
        Err(_) if lost() => return Ok((acked, None)),
        Err(e) => return Err(format!("first open: {e}")),
    };
    let mut d = Driver {
        core: Some(core),
        caller,
    };
    let store = base.join("store");
    // Visible files that exist, by path.
    let mut live: Vec<String> = Vec::new();
    let steps = 14;
    for step in 0..steps {
        let r: std::io::Result<()> = match rng.below(12) {
            0..=3 => {
                let path = FILES[rng.below(FILES.len() as u64) as usize].to_string();
                let data = contents(&mut rng);
                acked.unknown(&path);
                let r = d.put(&path, &data, true);
                if r.is_ok() {
                    acked.versions.push(acked_record(&store, &path, &data)?);
                    acked.fsynced(&path, &data);
                    if !live.contains(&path) {
                        live.push(path);
                    }
                }
                r
            }
            4..=5 => {
                let path = FILES[rng.below(FILES.len() as u64) as usize].to_string();
                let data = contents(&mut rng);
                acked.unknown(&path);
                let r = d.put(&path, &data, false);
                if r.is_ok() && !live.contains(&path) {
                    live.push(path);
                }
                r
            }
            6..=7 if !live.is_empty() => {
                let i = rng.below(live.len() as u64) as usize;
                let to = format!("r{step}");
                acked.unknown(&live[i]);
                acked.unknown(&to);
                let r = d.rename(&live[i], &to);
                if r.is_ok() {
                    live.remove(i);
                    live.push(to);
                }
                r
            }
            8 => {
                // An unpark: a hidden directory (`*.bak`) written in place,
                // renamed to a visible name, then a file in it published.
                let hidden = format!("p{step}.bak");
                let visible = format!("u{step}");
                let data = contents(&mut rng);
                let more = contents(&mut rng);
                let path = format!("{visible}/f");
                let r = d
                    .put(&format!("{hidden}/f"), &data, rng.below(2) == 0)
                    .and_then(|()| d.rename(&hidden, &visible))
                    .and_then(|()| d.put(&path, &more, true));
                if r.is_ok() {
                    acked.versions.push(acked_record(&store, &path, &more)?);
                    live.push(path);
                }
                r
            }
            9 => {
                let policy = Policy {
                    keep_last: Some(2 + rng.below(6)),
                    ..Policy::default()
                };
                d.fs().forget_versions(&policy, false).map(drop)
            }
            10 => {
                // An unmount and a mount.
                d.core.take().expect("open").close();
                match open(base, io, durability) {
                    Ok(core) => {
                        d.core = Some(core);
                        Ok(())
                    }
                    Err(e) if lost() => Err(std::io::Error::other(e)),
                    Err(e) => return Err(format!("remount: {e}")),
                }
            }
            _ => Ok(()),
        };
        if lost() {
            break;
        }
        if let Err(e) = r {
            return Err(format!("step {step} failed without a power loss: {e}"));
        }
    }
    Ok((acked, d.core))
}

/// The store at `base` after the crash and the mount that recovered it,
/// against what was acknowledged.
fn check(base: &Path, promised: &Promised) -> Result<(), String> {
    for (path, want) in &promised.files {
        let Some(want) = want else { continue };
        match fs::read(base.join("root").join(path)) {
            Ok(b) if b == *want => {}
            Ok(b) => {
                return Err(format!(
                    "live {path}: {} bytes, not the {} acknowledged",
                    b.len(),
                    want.len()
                ));
            }
            Err(e) => return Err(format!("live {path}, acknowledged: {e}")),
        }
    }
    let acked = &promised.versions;
    let store = base.join("store");
    let records = journal::read_dir(&store.join("journal"))
        .map_err(|e| format!("journal unreadable after the mount: {e}"))?
        .records;
    let forgotten = |seq: u64| {
        records
            .iter()
            .flat_map(|r| r.forgot.iter())
            .any(|[a, b]| (*a..=*b).contains(&seq))
    };
    let blobs =
        BlobStore::open_path(&store.join("blobs"), StoreIo::real()).map_err(|e| e.to_string())?;
    for a in acked {
        if forgotten(a.seq) {
            continue;
        }
        let Some(r) = records.iter().find(|r| r.seq == a.seq) else {
            return Err(format!("acknowledged record {} ({}) lost", a.seq, a.path));
        };
        let blob = r.state.as_ref().and_then(|s| s.blob.clone());
        if r.path.as_bytes() != a.path.as_bytes() || blob.as_deref() != Some(&a.blob) {
            return Err(format!(
                "record {} is {} {:?}, not the acknowledged {} {}",
                a.seq, r.path, blob, a.path, a.blob
            ));
        }
        match blobs.read(&a.blob) {
            Ok(b) if sha256_hex(&b) == a.blob => {}
            Ok(_) => return Err(format!("version {} of {}: wrong bytes", a.seq, a.path)),
            Err(e) => return Err(format!("version {} of {}: blob lost: {e}", a.seq, a.path)),
        }
    }
    for r in &records {
        let Some(blob) = r.state.as_ref().and_then(|s| s.blob.as_deref()) else {
            continue;
        };
        if let Ok(b) = blobs.read(blob)
            && sha256_hex(&b) != blob
        {
            return Err(format!("record {}: blob {blob} serves wrong bytes", r.seq));
        }
    }
    Ok(())
}

/// One run of `seed` with the power lost at sync `fail_at` (0: after the
/// last step); the sync points counted and the failure found.
fn run(
    seed: u64,
    fail_at: usize,
    noop: bool,
    durability: Durability,
    dir: &Path,
) -> (usize, Option<String>) {
    let live = dir.join("live");
    fs::create_dir_all(live.join("root")).unwrap();
    let disk = |root: &Path, fail_at: usize| {
        let d = PowerLoss::new(root, fail_at, noop);
        Arc::new(match durability {
            Durability::OneCommit => d.ordered(),
            Durability::StepByStep => d,
        })
    };
    let backend = disk(&live, fail_at);
    let io = StoreIo::with_backend(backend.clone());
    let lost = || backend.is_lost();
    let (acked, core) = match schedule(seed, &live, &io, durability, &lost) {
        Ok(a) => a,
        Err(e) => return (backend.syncs(), Some(e)),
    };
    let syncs = backend.syncs();
    backend.power_off();

    // ROOT and the store as the disk kept them, at the same paths (the
    // store names its root by path).
    let mut crash_rng = Rng(seed ^ (fail_at as u64).wrapping_mul(0x1234_5678_9abc));
    let rebuilt = dir.join("rebuilt");
    backend.crash_into(&rebuilt, &mut crash_rng).unwrap();
    // The core that lost its disk is closed only now, after the image was
    // taken (so its threads and descriptors do not pile up over hundreds
    // of runs): nothing it does reaches the image any more.
    if let Some(core) = core {
        core.close();
    }
    fs::rename(&live, dir.join("dead")).unwrap();
    fs::rename(&rebuilt, &live).unwrap();
    fs::create_dir_all(live.join("root")).unwrap();
    fs::create_dir_all(live.join("store")).unwrap();

    let io2 = StoreIo::with_backend(disk(&live, 0));
    let core = match open(&live, &io2, durability) {
        Ok(c) => c,
        Err(e) => return (syncs, Some(format!("mount refused after the crash: {e}"))),
    };
    let mut failure = check(&live, &acked).err();
    core.close();
    if failure.is_none() {
        let report = skillfs::verify::verify(
            &Layout::new(live.join("store")),
            &live.join("root"),
            false,
            false,
        );
        // A record the disk kept though never synced may name a blob it
        // did not keep: gone, never wrong (checked above), and no
        // acknowledged version's (checked above too).
        let problems: Vec<_> = report
            .problems
            .iter()
            .filter(|p| !p.contains("is in no pack and no loose file"))
            .cloned()
            .collect();
        if !problems.is_empty() {
            failure = Some(format!("verify: {}", problems.join("; ")));
        }
    }
    (syncs, failure)
}

/// Under `/dev/shm` where there is one: the durable image is the test's,
/// and a memory filesystem makes the hundreds of mounts fast.
fn scratch_dir(tag: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let parent = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let d = parent.join(format!(
        "skillfs-power-loss-core-{tag}-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&d);
    d
}

/// Every sync point of `seeds` in each durability order; the failures
/// found, one line each.
fn every_sync_point(seeds: std::ops::Range<u64>, noop: bool, tag: &str) -> Vec<String> {
    let base = scratch_dir(tag);
    let mut failures = Vec::new();
    let mut points = 0;
    for durability in [Durability::StepByStep, Durability::OneCommit] {
        for seed in seeds.clone() {
            let count = base.join("count");
            let (total, f) = run(seed, 0, noop, durability, &count);
            let _ = fs::remove_dir_all(&count);
            if let Some(f) = f {
                failures.push(format!(
                    "{durability:?} seed {seed}, no power loss until the end: {f}"
                ));
            }
            for k in 1..=total {
                let d = base.join(format!("{seed}-{k}"));
                let (_, f) = run(seed, k, noop, durability, &d);
                points += 1;
                if let Some(f) = f {
                    failures.push(format!(
                        "{durability:?} seed {seed}, power lost at sync {k}/{total}: {f}"
                    ));
                }
                let _ = fs::remove_dir_all(&d);
            }
        }
    }
    let _ = fs::remove_dir_all(&base);
    eprintln!("{points} sync points, {} failures", failures.len());
    failures
}

/// The seeds to run: `SKILLFS_POWER_LOSS_SEED=<n>` alone, else the first
/// `SKILLFS_POWER_LOSS_ROUNDS` (default 3).
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    match var("SKILLFS_POWER_LOSS_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..var("SKILLFS_POWER_LOSS_ROUNDS").unwrap_or(3),
    }
}

#[test]
fn power_loss_at_every_sync_point_of_the_core_loses_nothing_acknowledged() {
    let noop = std::env::var_os("SKILLFS_POWER_LOSS_NOOP_FSYNC").is_some_and(|v| v == "1");
    let failures = every_sync_point(seeds(), noop, "all");
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
    let failures = every_sync_point(0..1, true, "noop");
    assert!(
        !failures.is_empty(),
        "with every fsync a no-op, a power loss lost nothing?"
    );
}
