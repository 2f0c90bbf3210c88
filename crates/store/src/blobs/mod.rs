//! `BlobStore`: immutable file contents named by their SHA-256.
//!
//! A blob of at most [`PACK_MAX`] bytes is appended to a pack (see
//! `store::packs`); a larger one is a file of its own, `blobs/ab/<hex>`.
//!
//! Invariants: a blob file is complete before it has its final name (it is
//! written aside and renamed into `blobs/ab/<hex>`); a blob is never
//! modified or replaced by different bytes; blobs written without `durable`
//! stay pending until they are made durable, before any journal record
//! naming them is (the durability order; see `pending`).
//! Blob files are taken ready-made from the daemon's [`Spares`] where it has
//! them (an inode allocation off the request path). A loose blob this
//! process did not write is checked against its hash once before it is
//! trusted (deduplicated onto) or served: a power loss can leave a blob
//! that was never synced under its final name with the right size and the
//! wrong bytes. Once a loose blob's content has been fsynced (after it was
//! written, or checked) its mtime is set to [`DURABLE_MTIME`]: a blob so
//! marked is known whole on its size, so a mount need not read every large
//! version again; it is still hashed before it is served, once per process
//! (`known` tells a blob found on its size from one hashed or written
//! here). Every sync goes through [`StoreIo`] (see `store::durable`).
//!
//! How far a blob is trusted (`known`, the hash checks) is `trust`.
//!
//! A prune (`gc`) removes contents no kept version shows; it is made safe
//! against writers by `gate` and `pins`, as `gc` says.
//!
//! Locks (all leaves below the core's `ledger` and open-file locks):
//! `sync_lock` before `unsynced` (see `pending`); `fans` and `known` are
//! held only for a lookup or an insert; the packs' `writer` is taken before
//! their `index`.
//! File helpers shared with `packs` are in `store::fsutil`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};

use super::dir::{Dir, Named};
use super::durable::StoreIo;
use super::fsutil;
/// Where the core (`fs`) has always imported it from.
pub use super::fsutil::copy_range;
use super::packs::{PACK_MAX, Packs};
use super::spares::Spares;
use skillfs_base::relpath::hex;
use skillfs_base::sys;

mod gc;
mod pending;
mod trust;
pub use gc::Reclaimed;
pub use pending::Pending;
use trust::{Known, mark_durable};

/// Hex SHA-256 of a blob's bytes.
pub type BlobId = String;

const CHUNK: usize = 256 * 1024;
/// The mtime (seconds, nanoseconds) of a loose blob whose content was
/// fsynced before the mtime was set: the mark can only become durable
/// after the content has.
pub const DURABLE_MTIME: (i64, i64) = (1, 0x5eed);

pub struct BlobStore {
    /// `blobs/` and `tmp/`, held open: every blob file is made, renamed
    /// and opened from these fds (and the fan-out directories opened from
    /// `dir`), never by path (`store::dir`).
    dir: Arc<Dir>,
    tmp: Arc<Dir>,
    counter: AtomicU64,
    /// Blobs (and their fan-out directories) renamed into place but not yet
    /// fsynced.
    unsynced: Mutex<Vec<Pending>>,
    sync_lock: Mutex<()>,
    /// Fan-out directories known to exist (saves a mkdir per blob).
    fans: Mutex<[bool; 256]>,
    /// Blobs this process found present, and how far it checked them
    /// (saves a `stat` per version; nothing but a prune removes blobs while
    /// a store is open for writing).
    known: Mutex<HashMap<[u8; 32], Known>>,
    spares: Option<Arc<Spares>>,
    packs: Packs,
    io: StoreIo,
    /// Held (shared) by a writer from storing a content to appending the
    /// record that names it; a prune takes it alone to start (see `gc`).
    gate: RwLock<()>,
    /// While a prune runs: every content a writer found present or stored
    /// since it started, which it must not remove (see `gc`).
    pins: Mutex<Option<HashSet<[u8; 32]>>>,
}

/// The 32 bytes behind a hex id (None for anything else).
pub fn raw_id(id: &str) -> Option<[u8; 32]> {
    if id.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(id.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub fn hash_bytes(data: &[u8]) -> BlobId {
    hex(Sha256::digest(data).as_slice())
}

impl BlobStore {
    /// The blob store of the held directories `blobs/` and `tmp/`, made
    /// durable through `io`.
    pub fn new(dir: Arc<Dir>, tmp: Arc<Dir>, io: StoreIo) -> BlobStore {
        BlobStore {
            tmp,
            counter: AtomicU64::new(0),
            unsynced: Mutex::new(Vec::new()),
            sync_lock: Mutex::new(()),
            fans: Mutex::new([false; 256]),
            known: Mutex::new(HashMap::new()),
            spares: None,
            packs: Packs::new(Arc::clone(&dir), io.clone()),
            dir,
            io,
            gate: RwLock::new(()),
            pins: Mutex::new(None),
        }
    }

    /// [`BlobStore::new`] of the directories at these paths, each opened
    /// never through a symlink (the command line, tests).
    pub fn open_paths(dir: &Path, tmp: &Path, io: StoreIo) -> io::Result<BlobStore> {
        Ok(BlobStore::new(
            Arc::new(Dir::open_path(dir)?),
            Arc::new(Dir::open_path(tmp)?),
            io,
        ))
    }

    /// New blobs start as files taken from `spares`.
    pub fn with_spares(mut self, spares: Arc<Spares>) -> BlobStore {
        self.spares = Some(spares);
        self
    }

    /// Where the loose blob `id` is (for messages).
    pub fn path(&self, id: &str) -> PathBuf {
        self.dir.join(&id[..2]).join(id)
    }

    /// The fan-out directory of `id`, `blobs/ab/`, opened from `blobs/`.
    fn fan(&self, id: &str) -> io::Result<Dir> {
        self.dir.sub(&id[..2])
    }

    /// Opens the loose blob `id` for reading.
    fn open_loose(&self, id: &str) -> io::Result<File> {
        self.fan(id)?.read_file(id)
    }

    pub fn contains(&self, id: &str) -> bool {
        raw_id(id).is_some_and(|raw| {
            self.packs.contains(&raw) || self.fan(id).and_then(|f| f.lstat(id)).is_ok()
        })
    }

    pub fn read(&self, id: &str) -> io::Result<Vec<u8>> {
        let Some(raw) = raw_id(id) else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        if self.packs.contains(&raw) {
            return self.packs.read(&raw);
        }
        let mut data = Vec::new();
        self.open_loose(id)?.read_to_end(&mut data)?;
        if !self.hashed_here(&raw) {
            self.judge(id, &raw, Sha256::digest(&data).as_slice())?;
        }
        Ok(data)
    }

    /// The content of `id`, to be read at offsets; a loose blob is checked
    /// against its hash before it is served (once per process).
    pub fn open(&self, id: &str) -> io::Result<Opened> {
        match raw_id(id) {
            Some(raw) if self.packs.contains(&raw) => Ok(Opened::Bytes(self.packs.read(&raw)?)),
            Some(raw) => {
                let f = self.open_loose(id)?;
                self.check_loose(id, &raw, &f)?;
                Ok(Opened::File(f))
            }
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// Appends a small blob to the pack; unless `durable`, its pack (and a
    /// new pack's directory) becomes part of the next durability point.
    fn put_packed(&self, id: &str, data: &[u8], durable: bool) -> io::Result<()> {
        let raw = raw_id(id).expect("hex of a sha256");
        let appended = self.packs.append(&raw, data, durable)?;
        self.known.lock().insert(raw, Known::Hashed);
        if !durable {
            let mut pending = self.unsynced.lock();
            if appended.new_pack && !pending.contains(&Pending::PacksDir) {
                pending.push(Pending::PacksDir);
            }
            let pack = Pending::Pack(appended.pack);
            if !pending.contains(&pack) {
                pending.push(pack);
            }
        }
        Ok(())
    }

    /// Hashes the whole of `src` (read with `pread`, so the caller's offset is
    /// untouched) and stores it unless a blob with that hash exists.
    pub fn put_file(&self, src: &File, durable: bool) -> io::Result<(BlobId, u64)> {
        let mut hasher = Sha256::new();
        // Most files are a few KB: no need to clear 256 KB for each.
        let len = sys::fstat(src)?.st_size.max(0) as usize;
        let mut buf = vec![0u8; (len + 1).min(CHUNK)];
        if len as u64 <= PACK_MAX {
            // Small: one read, and the same bytes go to the pack.
            let mut got = 0;
            loop {
                if got == buf.len() {
                    buf.resize(buf.len() * 2, 0);
                }
                let n = src.read_at(&mut buf[got..], got as u64)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            if got as u64 <= PACK_MAX {
                buf.truncate(got);
                let id = hash_bytes(&buf);
                if !self.has_intact(&id, got as u64) {
                    self.put_packed(&id, &buf, durable)?;
                } else if durable {
                    self.mark_pending(&id);
                }
                if durable {
                    self.sync_pending()?;
                }
                return Ok((id, got as u64));
            }
        }
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

    /// Stores `data` (hash computed here).
    pub fn put_bytes(&self, data: &[u8], durable: bool) -> io::Result<BlobId> {
        let id = hash_bytes(data);
        if !self.has_intact(&id, data.len() as u64) {
            if data.len() as u64 <= PACK_MAX {
                self.put_packed(&id, data, durable)?;
            } else {
                self.write_new(&id, durable, |tmp| tmp.write_all_at(data, 0))?;
            }
        }
        Ok(id)
    }

    /// Streams a reader into the store; used for files found at mount time.
    pub fn put_reader(&self, mut r: impl Read) -> io::Result<(BlobId, u64)> {
        fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
            let mut got = 0;
            while got < buf.len() {
                match r.read(&mut buf[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            Ok(got)
        }
        // Small enough for a pack? Read one byte past the limit to know.
        let mut head = vec![0u8; PACK_MAX as usize + 1];
        let got = fill(&mut r, &mut head)?;
        if got as u64 <= PACK_MAX {
            head.truncate(got);
            return Ok((self.put_bytes(&head, false)?, got as u64));
        }
        let (tmp_name, tmp) = self.new_tmp()?;
        let mut installed = false;
        let result = (|| {
            let mut hasher = Sha256::new();
            // A full disk stops the copy, not the hash: a content stored
            // already needs no room (a park unparked on a full disk).
            let mut full: Option<io::Error> = None;
            let mut copy = |data: &[u8], off: u64| -> io::Result<()> {
                if full.is_none()
                    && let Err(e) = tmp.write_all_at(data, off)
                {
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                    ) {
                        return Err(e);
                    }
                    full = Some(e);
                }
                Ok(())
            };
            hasher.update(&head[..got]);
            copy(&head[..got], 0)?;
            let mut off = got as u64;
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = fill(&mut r, &mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                copy(&buf[..n], off)?;
                off += n as u64;
            }
            let id = hex(hasher.finalize().as_slice());
            if !self.has_intact(&id, off) {
                if let Some(e) = full {
                    return Err(e);
                }
                self.install(&tmp_name, &id, false)?;
                installed = true;
            }
            Ok((id, off))
        })();
        if !installed {
            let _ = tmp_name.remove();
        }
        result
    }

    fn tmp_name(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("blob.{}.{n}", std::process::id())
    }

    /// An empty file to fill, from the spares where there are any.
    fn new_tmp(&self) -> io::Result<(Named, File)> {
        let Some(spares) = &self.spares else {
            let name = self.tmp_name();
            let file = self.tmp.create_new(&name, fsutil::SEALED_MODE)?;
            return Ok((Named::new(&self.tmp, name), file));
        };
        let (path, file) = spares.take()?;
        let ready = (|| {
            // A recycled inode still has its last writer's owner and mode.
            let st = sys::fstat(&file)?;
            let euid = sys::geteuid();
            let egid = sys::getegid();
            if st.st_uid != euid || st.st_gid != egid {
                sys::fchown(&file, euid, egid)?;
            }
            sys::fchmod(&file, fsutil::SEALED_MODE)
        })();
        match ready {
            Ok(()) => Ok((path, file)),
            Err(e) => {
                let _ = path.remove();
                Err(e)
            }
        }
    }

    fn write_new(
        &self,
        id: &str,
        durable: bool,
        fill: impl FnOnce(&File) -> io::Result<()>,
    ) -> io::Result<()> {
        let (tmp_name, tmp) = self.new_tmp()?;
        let result = (|| {
            fill(&tmp)?;
            if durable {
                self.io.sync_all(&tmp, &tmp_name.path())?;
                mark_durable(&tmp);
            }
            self.install(&tmp_name, id, durable)
        })();
        if result.is_err() {
            let _ = tmp_name.remove();
        }
        result
    }

    /// Renames a complete temp file to its content address.
    fn install(&self, tmp: &Named, id: &str, durable: bool) -> io::Result<()> {
        let fan_name = &id[..2];
        let mut created_fan = false;
        let known = u8::from_str_radix(fan_name, 16).is_ok_and(|b| self.fans.lock()[b as usize]);
        if !known {
            created_fan = self.dir.make_sub(fan_name)?;
            if let Ok(b) = u8::from_str_radix(fan_name, 16) {
                self.fans.lock()[b as usize] = true;
            }
        }
        let fan = self.dir.sub(fan_name)?;
        if !durable {
            // Pending before it is visible: a durable writer that finds it
            // by name also finds it here, and syncs it first.
            let mut pending = self.unsynced.lock();
            if created_fan {
                pending.push(Pending::Fan(fan_name.to_string()));
            }
            pending.push(Pending::Loose(id.to_string()));
            drop(pending);
            crate::durable::test_delay("SKILLFS_TEST_INSTALL_DELAY_MS");
        }
        // Replaces only a damaged copy (callers checked `has_intact`); two
        // writers of the same content write the same bytes.
        tmp.dir.rename(&tmp.name, &fan, id, 0)?;
        if let Some(raw) = raw_id(id) {
            self.known.lock().insert(raw, Known::Hashed);
        }
        if durable {
            self.io.sync_dir(&fan)?;
            if created_fan {
                self.io.sync_dir(&self.dir)?;
            }
        }
        Ok(())
    }
}

/// A blob opened for reading at offsets.
pub enum Opened {
    File(File),
    /// A packed blob, read whole (it is small) and checked.
    Bytes(Vec<u8>),
}

impl Opened {
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        match self {
            Opened::File(f) => f.read_at(buf, off),
            Opened::Bytes(b) => {
                let start = (off as usize).min(b.len());
                let n = buf.len().min(b.len() - start);
                buf[..n].copy_from_slice(&b[start..start + n]);
                Ok(n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

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
        let bs = BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real()).unwrap();
        let a = bs.put_bytes(b"hello", false).unwrap();
        assert_eq!(
            a,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        let b = bs.put_bytes(b"hello", true).unwrap();
        assert_eq!(a, b);
        assert_eq!(bs.read(&a).unwrap(), b"hello");
        bs.sync_pending().unwrap();
        assert!(
            !bs.path(&a).exists(),
            "small: packed, not a file of its own"
        );
        let src = d.join("src");
        fs::write(&src, b"hello").unwrap();
        let (c, size) = bs.put_file(&File::open(&src).unwrap(), true).unwrap();
        assert_eq!((c, size), (a.clone(), 5));

        // Larger than a pack takes: a file named by its hash.
        let big = vec![b'x'; PACK_MAX as usize + 1];
        fs::write(&src, &big).unwrap();
        let (id, size) = bs.put_file(&File::open(&src).unwrap(), false).unwrap();
        assert_eq!((id.clone(), size), (hash_bytes(&big), big.len() as u64));
        assert_eq!(fs::read(bs.path(&id)).unwrap(), big);
        let (again, _) = bs.put_reader(&big[..]).unwrap();
        assert_eq!(again, id);
        let (small, _) = bs.put_reader(&b"hello"[..]).unwrap();
        assert_eq!(small, a);

        // A new store reads both kinds back.
        let fresh =
            BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real()).unwrap();
        assert_eq!(fresh.read(&a).unwrap(), b"hello");
        assert_eq!(fresh.read(&id).unwrap(), big);
        let mut buf = [0u8; 3];
        assert_eq!(fresh.open(&a).unwrap().read_at(&mut buf, 2).unwrap(), 3);
        assert_eq!(&buf, b"llo");
        assert!(fresh.has_intact(&a, 5) && fresh.has_intact(&id, big.len() as u64));
        assert_eq!(fs::read_dir(d.join("tmp")).unwrap().count(), 0);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_damaged_loose_blob_is_never_trusted_nor_served() {
        let d = tempdir("damaged-loose");
        let big: Vec<u8> = (0..PACK_MAX as usize + 5000)
            .map(|i| (i % 251) as u8)
            .collect();
        let id = BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real())
            .unwrap()
            .put_bytes(&big, false)
            .unwrap();
        // Right size, wrong bytes: what a power loss can leave of a blob
        // renamed into place but never synced.
        let path = BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real())
            .unwrap()
            .path(&id);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let mut bad = big.clone();
        bad[1000] ^= 1;
        fs::write(&path, &bad).unwrap();

        let fresh =
            BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real()).unwrap();
        for e in [
            match fresh.read(&id) {
                Ok(_) => panic!("read a damaged blob"),
                Err(e) => e,
            },
            fresh.open(&id).err().expect("served a damaged blob"),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(
                e.to_string().contains("damaged") && e.to_string().contains(&id),
                "{e}"
            );
        }
        assert!(
            !fresh.has_intact(&id, big.len() as u64),
            "deduplicated onto damage"
        );
        // Storing the content again repairs it.
        let src = d.join("src");
        fs::write(&src, &big).unwrap();
        let (again, _) = fresh.put_file(&File::open(&src).unwrap(), true).unwrap();
        assert_eq!(again, id);
        let third =
            BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real()).unwrap();
        assert_eq!(third.read(&id).unwrap(), big);
        assert!(third.has_intact(&id, big.len() as u64));
        // Synced, it is marked, so a later mount trusts its size without
        // reading it (serving it still hashes it).
        use std::os::unix::fs::MetadataExt;
        let md = fs::metadata(&path).unwrap();
        assert_eq!((md.mtime(), md.mtime_nsec()), DURABLE_MTIME);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_blob_trusted_on_its_size_is_still_hashed_before_it_is_served() {
        let d = tempdir("rotted-marked");
        let big: Vec<u8> = (0..PACK_MAX as usize + 5000)
            .map(|i| (i % 253) as u8)
            .collect();
        let bs = BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real()).unwrap();
        let id = bs.put_bytes(&big, true).unwrap();
        let path = bs.path(&id);
        // One bit rots; the durable mark (its mtime) stays.
        let mut bad = big.clone();
        bad[1000] ^= 1;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        fs::write(&path, &bad).unwrap();
        mark_durable(&File::open(&path).unwrap());

        // A mount's scan finds it on its size, as designed; serving it
        // hashes it all the same, and it is trusted no more after.
        let fresh =
            BlobStore::open_paths(&d.join("blobs"), &d.join("tmp"), StoreIo::real()).unwrap();
        assert!(fresh.has_intact(&id, big.len() as u64));
        let e = fresh.open(&id).err().expect("served a rotted blob");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(fresh.read(&id).is_err());
        assert!(
            !fresh.has_intact(&id, big.len() as u64),
            "deduplicated onto damage"
        );
        fs::remove_dir_all(&d).unwrap();
    }
}
