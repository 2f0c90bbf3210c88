//! The disk that loses power, shared by `tests/it/power_loss.rs` (the store
//! alone) and `tests/it/power_loss_core.rs` (the whole core): a test
//! `SyncBackend` that keeps a *durable image* beside the live files (a
//! file's bytes as of its last `fsync`/`fdatasync`, a directory's entries
//! as of its last `fsync`, everything at a `syncfs`), fails every sync from
//! number `fail_at` on, and writes what a power loss would leave
//! (`PowerLoss::crash_into`): whatever was never synced dropped, cut
//! short, zeroed block by block or left whole.
//!
//! With `ordered` it stands for a filesystem whose one `fsync` commits
//! every earlier metadata change (ext4 with its journal, XFS:
//! `Durability::OneCommit`): any sync also makes every directory's entries
//! durable, and the data of every file written out (`write_out`) since.
//! It does not model which transaction a file is in: a sync of a file
//! changed long ago commits all the same.
//!
//! `common::power_loss`: only these two tests use it.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use skillfs::store::durable::SyncBackend;

/// splitmix64: small, seeded, good enough for schedules.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
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
    /// `ordered`: inode → its bytes as written out, made durable by the
    /// next commit.
    written: HashMap<u64, Vec<u8>>,
}

/// A disk that loses power at sync number `fail_at` (that sync and every
/// later one fail, and none of them reaches the image).
pub struct PowerLoss {
    root: PathBuf,
    image: Mutex<Image>,
    pub syncs: AtomicUsize,
    fail_at: usize,
    pub lost: AtomicBool,
    noop: bool,
    ordered: bool,
}

pub fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// `Ok(None)` for what is gone meanwhile (a thread of the core at work on
/// its scratch files in `staging/`, `tmp/`).
fn unless_gone<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn dir_entries(dir: &Path) -> io::Result<BTreeMap<OsString, (u64, bool)>> {
    let mut out = BTreeMap::new();
    let list = match fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in list {
        let e = e?;
        // Gone meanwhile (a thread of a dropped core still at work on its
        // scratch files): not there.
        let md = match fs::symlink_metadata(e.path()) {
            Ok(md) => md,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        out.insert(e.file_name(), (md.ino(), md.is_dir()));
    }
    Ok(out)
}

impl PowerLoss {
    /// A disk under `root` (everything the durable image covers) that
    /// loses power at sync `fail_at` (0: never).
    pub fn new(root: &Path, fail_at: usize, noop: bool) -> PowerLoss {
        PowerLoss {
            root: root.to_path_buf(),
            image: Mutex::new(Image::default()),
            syncs: AtomicUsize::new(0),
            fail_at,
            lost: AtomicBool::new(false),
            noop,
            ordered: false,
        }
    }

    /// One fsync commits every earlier metadata change (see the module).
    pub fn ordered(mut self) -> PowerLoss {
        self.ordered = true;
        self
    }

    pub fn syncs(&self) -> usize {
        self.syncs.load(Ordering::SeqCst)
    }

    /// The power goes now (if it has not yet): every later sync fails.
    pub fn power_off(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
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
        let mut img = self.image.lock();
        if self.ordered {
            // The commit: every directory as it is, and what was written
            // out.
            let written = std::mem::take(&mut img.written);
            img.data.extend(written);
            PowerLoss::snapshot_dirs(&mut img, &self.root)?;
        }
        apply(&mut img)
    }

    fn snapshot_dirs(img: &mut Image, dir: &Path) -> io::Result<()> {
        let entries = dir_entries(dir)?;
        let Some(md) = unless_gone(fs::metadata(dir))? else {
            return Ok(());
        };
        img.dirs.insert(md.ino(), entries.clone());
        for (name, (_, is_dir)) in entries {
            if is_dir {
                PowerLoss::snapshot_dirs(img, &dir.join(&name))?;
            }
        }
        Ok(())
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
        let Some(md) = unless_gone(fs::metadata(dir))? else {
            return Ok(());
        };
        img.dirs.insert(md.ino(), entries.clone());
        for (name, (ino, is_dir)) in entries {
            let p = dir.join(&name);
            if is_dir {
                PowerLoss::snapshot_tree(img, &p)?;
            } else {
                if let Some(b) = unless_gone(fs::read(&p))? {
                    img.data.insert(ino, b);
                }
            }
        }
        Ok(())
    }

    /// Writes what a power loss now would leave into `dst`.
    pub fn crash_into(&self, dst: &Path, rng: &mut Rng) -> io::Result<()> {
        let mut live_files: HashMap<u64, PathBuf> = HashMap::new();
        let mut live_dirs: HashMap<u64, PathBuf> = HashMap::new();
        let mut stack = vec![self.root.clone()];
        while let Some(d) = stack.pop() {
            let Some(md) = unless_gone(fs::metadata(&d))? else {
                continue;
            };
            live_dirs.insert(md.ino(), d.clone());
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
                let live = match live_files.get(&child).map(fs::read) {
                    Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => None,
                    other => other.transpose()?,
                };
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
pub fn mangle(b: &[u8], at: usize, rng: &mut Rng) -> Vec<u8> {
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
    fn write_out(&self, file: &File) -> io::Result<()> {
        // Not a durability point on its own (not counted, never fails):
        // with an ordered commit, the next commit makes it durable.
        if self.ordered && !self.noop && !self.lost.load(Ordering::SeqCst) {
            let md = file.metadata()?;
            let bytes = fs::read(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
            self.image.lock().written.insert(md.ino(), bytes);
        }
        Ok(())
    }
}
