//! `BlobStore`: immutable file contents named by their SHA-256.
//!
//! Invariants: a blob file is complete before it has its final name (it is
//! written under `tmp/` and renamed into `blobs/ab/<hex>`); a blob is never
//! modified or replaced by different bytes; blobs written without `durable`
//! are remembered until [`BlobStore::sync_pending`] makes them durable, which
//! must happen before any journal record naming them is made durable (the
//! durability order of DESIGN.md: blob, then journal record, then live file).

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::relpath::hex;
use crate::sys;

/// Hex SHA-256 of a blob's bytes.
pub type BlobId = String;

const CHUNK: usize = 256 * 1024;
/// Past this many pending blobs one `syncfs` beats one `fsync` each.
const MANY: usize = 64;

pub struct BlobStore {
    dir: PathBuf,
    tmp: PathBuf,
    counter: AtomicU64,
    /// Blobs (and their fan-out directories) renamed into place but not yet
    /// fsynced.
    unsynced: Mutex<Vec<PathBuf>>,
    sync_lock: Mutex<()>,
    /// Fan-out directories known to exist (saves a mkdir per blob).
    fans: Mutex<[bool; 256]>,
}

pub fn hash_bytes(data: &[u8]) -> BlobId {
    hex(Sha256::digest(data).as_slice())
}

impl BlobStore {
    pub fn new(dir: PathBuf, tmp: PathBuf) -> BlobStore {
        BlobStore {
            dir,
            tmp,
            counter: AtomicU64::new(0),
            unsynced: Mutex::new(Vec::new()),
            sync_lock: Mutex::new(()),
            fans: Mutex::new([false; 256]),
        }
    }

    pub fn path(&self, id: &str) -> PathBuf {
        self.dir.join(&id[..2]).join(id)
    }

    pub fn contains(&self, id: &str) -> bool {
        id.len() == 64 && self.path(id).exists()
    }

    /// Present with the expected size. After a power loss a blob stored
    /// without `durable` can be an empty file under its final name; it must
    /// not be trusted as a copy of the content.
    pub fn has_intact(&self, id: &str, size: u64) -> bool {
        id.len() == 64 && std::fs::metadata(self.path(id)).is_ok_and(|m| m.len() == size)
    }

    pub fn read(&self, id: &str) -> io::Result<Vec<u8>> {
        if id.len() != 64 {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        fs::read(self.path(id))
    }

    /// Hashes the whole of `src` (read with `pread`, so the caller's offset is
    /// untouched) and stores it unless a blob with that hash exists.
    pub fn put_file(&self, src: &File, durable: bool) -> io::Result<(BlobId, u64)> {
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0u64;
        loop {
            let n = src.read_at(&mut buf, off)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            off += n as u64;
        }
        let id = hex(hasher.finalize().as_slice());
        let size = off;
        if !self.has_intact(&id, size) {
            self.write_new(&id, durable, |tmp| copy_range(src, tmp, size))?;
        } else if durable {
            // Present, but maybe stored without a sync (by a plain close, or
            // by a daemon that died): sync it before relying on it.
            self.mark_pending(&id);
        }
        if durable {
            self.sync_pending()?;
        }
        Ok((id, size))
    }

    /// Makes `id` part of the next durability point, even though it was
    /// found already stored (deduplicated).
    pub fn mark_pending(&self, id: &str) {
        let p = self.path(id);
        let mut pending = self.unsynced.lock();
        if !pending.contains(&p) {
            pending.push(p);
        }
    }

    /// Stores `data` (hash computed here).
    pub fn put_bytes(&self, data: &[u8], durable: bool) -> io::Result<BlobId> {
        let id = hash_bytes(data);
        if !self.has_intact(&id, data.len() as u64) {
            self.write_new(&id, durable, |tmp| tmp.write_all_at(data, 0))?;
        }
        Ok(id)
    }

    /// Streams a reader into the store; used for files found at mount time.
    pub fn put_reader(&self, mut r: impl Read) -> io::Result<(BlobId, u64)> {
        let tmp_path = self.tmp_name();
        let tmp = create_tmp(&tmp_path)?;
        let result = (|| {
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; CHUNK];
            let mut off = 0u64;
            loop {
                let n = match r.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                hasher.update(&buf[..n]);
                tmp.write_all_at(&buf[..n], off)?;
                off += n as u64;
            }
            let id = hex(hasher.finalize().as_slice());
            if !self.has_intact(&id, off) {
                self.install(&tmp_path, &id, false)?;
            }
            Ok((id, off))
        })();
        let _ = fs::remove_file(&tmp_path);
        result
    }

    fn tmp_name(&self) -> PathBuf {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.tmp.join(format!("blob.{}.{n}", std::process::id()))
    }

    fn write_new(
        &self,
        id: &str,
        durable: bool,
        fill: impl FnOnce(&File) -> io::Result<()>,
    ) -> io::Result<()> {
        let tmp_path = self.tmp_name();
        let result = (|| {
            let tmp = create_tmp(&tmp_path)?;
            fill(&tmp)?;
            if durable {
                sys::fsync(&tmp)?;
            }
            self.install(&tmp_path, id, durable)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp_path);
        }
        result
    }

    /// Renames a complete temp file to its content address.
    fn install(&self, tmp_path: &Path, id: &str, durable: bool) -> io::Result<()> {
        let fan = self.dir.join(&id[..2]);
        let mut created_fan = false;
        let known = u8::from_str_radix(&id[..2], 16).is_ok_and(|b| self.fans.lock()[b as usize]);
        if !known {
            match fs::create_dir(&fan) {
                Ok(()) => created_fan = true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            if let Ok(b) = u8::from_str_radix(&id[..2], 16) {
                self.fans.lock()[b as usize] = true;
            }
        }
        let dest = fan.join(id);
        if !durable {
            // Pending before it is visible: a durable writer that finds it
            // by name also finds it here, and syncs it first.
            let mut pending = self.unsynced.lock();
            if created_fan {
                pending.push(fan.clone());
            }
            pending.push(dest.clone());
        }
        // Replaces only a damaged copy (callers checked `has_intact`); two
        // writers of the same content write the same bytes.
        fs::rename(tmp_path, &dest)?;
        if durable {
            sync_dir(&fan)?;
            if created_fan {
                sync_dir(&self.dir)?;
            }
        }
        Ok(())
    }

    /// Makes every blob stored without `durable` durable (file data, then the
    /// directory entries naming it).
    pub fn sync_pending(&self) -> io::Result<()> {
        // One sync at a time: a second caller must not return while the
        // first is still flushing blobs the second depends on.
        let _one = self.sync_lock.lock();
        let pending = std::mem::take(&mut *self.unsynced.lock());
        if pending.is_empty() {
            return Ok(());
        }
        if pending.len() > MANY {
            return self.sync_all(pending);
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        let result = (|| {
            for p in &pending {
                let f = File::open(p)?;
                sys::fsync(&f)?;
                if let Some(parent) = p.parent()
                    && !dirs.iter().any(|d| d == parent)
                {
                    dirs.push(parent.to_path_buf());
                }
            }
            for d in &dirs {
                sync_dir(d)?;
            }
            Ok(())
        })();
        if result.is_err() {
            // Keep them pending so a later sync retries.
            self.unsynced.lock().extend(pending);
        }
        result
    }
}

impl BlobStore {
    fn sync_all(&self, pending: Vec<PathBuf>) -> io::Result<()> {
        let r = File::open(&self.dir).and_then(|d| sys::syncfs(&d));
        if r.is_err() {
            self.unsynced.lock().extend(pending);
        }
        r
    }

    /// Writes out the data of every pending blob and waits for it, without
    /// the commit: the caller's one `fsync` afterwards makes them durable
    /// (on a filesystem with an ordered commit, see `sys::has_ordered_commit`).
    /// Until that succeeds they stay pending.
    pub fn write_out_pending(&self) -> io::Result<Vec<PathBuf>> {
        let _one = self.sync_lock.lock();
        let pending = std::mem::take(&mut *self.unsynced.lock());
        if pending.len() > MANY {
            self.sync_all(pending)?;
            return Ok(Vec::new());
        }
        for p in &pending {
            if p.is_dir() {
                continue; // a fan-out directory: metadata, in the commit
            }
            if let Err(e) = File::open(p).and_then(|f| sys::write_out(&f)) {
                self.unsynced.lock().extend(pending.iter().cloned());
                return Err(e);
            }
        }
        Ok(pending)
    }

    /// Puts back blobs whose commit failed.
    pub fn restore_pending(&self, pending: Vec<PathBuf>) {
        self.unsynced.lock().extend(pending);
    }
}

fn create_tmp(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let f = File::open(dir)?;
    sys::fsync(&f)
}

/// Copies `len` bytes of `src` from offset 0 into `dst` at offset 0, in the
/// kernel where it can (`copy_file_range`), else through a buffer.
pub fn copy_range(src: &File, dst: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut off_in: i64 = 0;
    let mut off_out: i64 = 0;
    while (off_in as u64) < len {
        let want = (len - off_in as u64).min(1 << 30) as usize;
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EXDEV)
                | Some(libc::ENOSYS)
                | Some(libc::EOPNOTSUPP)
                | Some(libc::EINVAL) => return copy_buffered(src, dst, off_in as u64, len),
                _ => return Err(e),
            }
        }
        if n == 0 {
            break; // source shrank under us; what we copied is what there is
        }
    }
    Ok(())
}

fn copy_buffered(src: &File, dst: &File, from: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut off = from;
    while off < len {
        let n = src.read_at(&mut buf, off)?;
        if n == 0 {
            break;
        }
        dst.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("skillfs-blobs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("blobs")).unwrap();
        fs::create_dir_all(d.join("tmp")).unwrap();
        d
    }

    #[test]
    fn dedups_and_names_by_sha256() {
        let d = tempdir("dedup");
        let bs = BlobStore::new(d.join("blobs"), d.join("tmp"));
        let a = bs.put_bytes(b"hello", false).unwrap();
        assert_eq!(
            a,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        let b = bs.put_bytes(b"hello", true).unwrap();
        assert_eq!(a, b);
        assert_eq!(bs.read(&a).unwrap(), b"hello");
        bs.sync_pending().unwrap();
        let f = File::open(bs.path(&a)).unwrap();
        let (c, size) = bs.put_file(&f, true).unwrap();
        assert_eq!((c, size), (a, 5));
        assert_eq!(fs::read_dir(d.join("tmp")).unwrap().count(), 0);
        fs::remove_dir_all(&d).unwrap();
    }
}
