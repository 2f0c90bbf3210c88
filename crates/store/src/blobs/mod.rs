//! `BlobStore`: immutable file contents named by their SHA-256.
//!
//! A blob of at most [`PACK_MAX`] bytes is an entry of a pack (see
//! `store::packs`), compressed where that is smaller; a larger one is a
//! list of content-defined chunks, each an entry of a pack (see `chunked`).
//! Builds before chunks kept a larger blob as a file of its own,
//! `blobs/ab/<hex>` (a loose blob): those are still read, deduplicated
//! onto and pruned, never written.
//!
//! Invariants: a blob is never modified or replaced by different bytes;
//! blobs written without `durable` stay pending until they are made
//! durable, before any journal record naming them is (the durability
//! order; see `pending`). A loose blob this process did not write is
//! checked against its hash once before it is trusted (deduplicated onto)
//! or served: a power loss can leave a blob that was never synced under
//! its final name with the right size and the wrong bytes. A loose blob
//! whose content was fsynced has its mtime set to [`DURABLE_MTIME`]: a
//! blob so marked is known whole on its size, so a mount need not read
//! every large version again; it is still hashed before it is served, once
//! per process (`known` tells a blob found on its size from one hashed or
//! written here). Every sync goes through [`StoreIo`] (see
//! `store::durable`).
//!
//! How far a blob is trusted (`known`, the hash checks) is `trust`.
//!
//! A prune (`gc`) removes contents no kept version shows; it is made safe
//! against writers by `gate` and `pins`, as `gc` says.
//!
//! Locks (all leaves below the core's `ledger` and open-file locks):
//! `sync_lock` before `unsynced` (see `pending`); `known` and `pins` are
//! held only for a lookup or an insert; the packs' `writer` is taken before
//! their `index`.
//! File helpers shared with `packs` are in `store::fsutil`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};

use super::dir::Dir;
use super::durable::StoreIo;
/// Where the core (`fs`) has always imported it from.
pub use super::fsutil::copy_range;
use super::packs::{PACK_MAX, Packs};
use skillfs_base::relpath::hex;
use skillfs_base::sys;

mod chunked;
mod gc;
mod pending;
mod trust;
pub use chunked::Chunks;
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
    /// `blobs/`, held open: every pack and loose blob is reached from it
    /// (and the fan-out directories opened from it), never by path
    /// (`store::dir`).
    dir: Arc<Dir>,
    /// Packs (and loose blobs of a daemon before this one) written but not
    /// yet fsynced.
    unsynced: Mutex<Vec<Pending>>,
    sync_lock: Mutex<()>,
    /// Blobs this process found present, and how far it checked them
    /// (saves a `stat` per version; nothing but a prune removes blobs while
    /// a store is open for writing).
    known: Mutex<HashMap<[u8; 32], Known>>,
    packs: Arc<Packs>,
    io: StoreIo,
    /// Held (shared) by a writer from storing a content to appending the
    /// record that names it; a prune takes it alone to start (see `gc`).
    gate: RwLock<()>,
    /// While a prune runs: every content a writer found present or stored
    /// since it started, which it must not remove (see `gc`).
    pins: Mutex<Option<HashSet<[u8; 32]>>>,
    /// Bytes of chunks the writers may still hold until their content's
    /// hash is known (see `chunked`).
    held_left: std::sync::atomic::AtomicU64,
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
    /// The blob store of the held directory `blobs/`, made durable
    /// through `io`.
    pub fn new(dir: Arc<Dir>, io: StoreIo) -> BlobStore {
        BlobStore {
            unsynced: Mutex::new(Vec::new()),
            sync_lock: Mutex::new(()),
            known: Mutex::new(HashMap::new()),
            packs: Arc::new(Packs::new(Arc::clone(&dir), io.clone())),
            dir,
            io,
            gate: RwLock::new(()),
            pins: Mutex::new(None),
            held_left: std::sync::atomic::AtomicU64::new(chunked::HELD),
        }
    }

    /// [`BlobStore::new`] of the directory at this path, opened never
    /// through a symlink (the command line, tests).
    pub fn open_path(dir: &Path, io: StoreIo) -> io::Result<BlobStore> {
        Ok(BlobStore::new(Arc::new(Dir::open_path(dir)?), io))
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
        if let Some(r) = self.read_chunked(&raw) {
            return r;
        }
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
            Some(raw) if self.packs.contains(&raw) => match self.open_chunked(&raw) {
                Some(r) => r,
                None => Ok(Opened::Bytes(self.packs.read(&raw)?)),
            },
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
        self.packs.append_noting(&raw, data, durable, &|a| {
            if !durable {
                self.note_appended(a);
            }
        })?;
        self.known.lock().insert(raw, Known::Hashed);
        Ok(())
    }

    /// Makes the pack an append (not durable) wrote part of the next
    /// durability point.
    fn note_appended(&self, appended: &crate::packs::Appended) {
        let mut pending = self.unsynced.lock();
        if appended.new_pack && !pending.contains(&Pending::PacksDir) {
            pending.push(Pending::PacksDir);
        }
        let pack = Pending::Pack(appended.pack);
        if !pending.contains(&pack) {
            pending.push(pack);
        }
    }

    /// Hashes the whole of `src` (read with `pread`, so the caller's offset is
    /// untouched) and stores it unless a blob with that hash exists.
    pub fn put_file(&self, src: &File, durable: bool) -> io::Result<(BlobId, u64)> {
        let len = sys::fstat(src)?.st_size.max(0) as usize;
        if len as u64 <= PACK_MAX {
            // Most files are a few KB: no need to clear 256 KB for each.
            let mut buf = vec![0u8; len + 1];
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
        // Large: cut into chunks as it is read (the whole content's hash
        // comes with the last chunk).
        self.put_file_chunked(src, durable)
    }

    /// Stores `data` (hash computed here).
    pub fn put_bytes(&self, data: &[u8], durable: bool) -> io::Result<BlobId> {
        let id = hash_bytes(data);
        if !self.has_intact(&id, data.len() as u64) {
            if data.len() as u64 <= PACK_MAX {
                self.put_packed(&id, data, durable)?;
            } else {
                self.put_chunks(data, durable)?;
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
        head.truncate(got);
        self.put_chunks(io::Cursor::new(head).chain(r), false)
    }
}

/// A blob opened for reading at offsets.
pub enum Opened {
    /// A loose blob (stored by an earlier build).
    File(File),
    /// A packed blob, read whole (it is small) and checked.
    Bytes(Vec<u8>),
    /// A chunked blob, read a chunk at a time.
    Chunks(Chunks),
}

impl Opened {
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        match self {
            Opened::File(f) => f.read_at(buf, off),
            Opened::Chunks(c) => c.read_at(buf, off),
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

    const MAX_CHUNK: u64 = chunked::MAX as u64;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("skillfs-blobs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("blobs")).unwrap();
        fs::create_dir_all(d.join("tmp")).unwrap();
        d
    }

    /// A loose blob as builds before chunks stored a large content: the
    /// bytes `stored` under the name of `content`.
    fn plant_loose(blobs: &Path, content: &[u8], stored: &[u8]) -> (BlobId, PathBuf) {
        let id = hash_bytes(content);
        let fan = blobs.join(&id[..2]);
        fs::create_dir_all(&fan).unwrap();
        let path = fan.join(&id);
        fs::write(&path, stored).unwrap();
        (id, path)
    }

    use crate::fixtures::noise;

    fn pack_bytes(blobs: &Path) -> u64 {
        fs::read_dir(blobs.join("packs"))
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.metadata().unwrap().len())
                    .sum()
            })
            .unwrap_or(0)
    }

    #[test]
    fn an_earlier_builds_loose_blob_is_read_and_deduplicated_onto() {
        let d = tempdir("legacy-loose");
        let big = noise(PACK_MAX as usize * 3, 7);
        let (id, _) = plant_loose(&d.join("blobs"), &big, &big);
        let bs = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
        assert_eq!(bs.read(&id).unwrap(), big);
        let mut buf = vec![0u8; 10];
        assert_eq!(bs.open(&id).unwrap().read_at(&mut buf, 5).unwrap(), 10);
        assert_eq!(buf, big[5..15]);
        assert!(bs.has_intact(&id, big.len() as u64));
        // The same content again is not stored a second time: a file's
        // whole content is hashed before it is chunked (a stream's chunks
        // are stored as they come, and its list is not).
        let src = d.join("src");
        fs::write(&src, &big).unwrap();
        let (again, _) = bs.put_file(&File::open(&src).unwrap(), true).unwrap();
        assert_eq!(again, id);
        assert_eq!(pack_bytes(&d.join("blobs")), 0);
        let (again, _) = bs.put_reader(&big[..]).unwrap();
        assert_eq!(again, id);
        assert!(!bs.packs.contains(&raw_id(&id).unwrap()));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_small_change_to_a_large_content_stores_about_the_change() {
        let d = tempdir("chunks");
        let blobs = d.join("blobs");
        let bs = BlobStore::open_path(&blobs, StoreIo::real()).unwrap();
        let one = noise(2 << 20, 11);
        let a = bs.put_bytes(&one, true).unwrap();
        let first = pack_bytes(&blobs);
        // (Headers and the list of chunks: ~100 bytes per 16 KiB.)
        assert!(first < one.len() as u64 + 16384, "{first} bytes for 2 MiB");
        // 100 bytes changed in the middle, and 50 inserted near the start.
        let mut two = one.clone();
        two[1 << 20..(1 << 20) + 100].fill(0xAA);
        two.splice(1000..1000, [0x55u8; 50]);
        let src = d.join("src");
        fs::write(&src, &two).unwrap();
        let (b, _) = bs.put_file(&File::open(&src).unwrap(), true).unwrap();
        let grown = pack_bytes(&blobs) - first;
        assert!(
            grown < 4 * MAX_CHUNK,
            "{grown} bytes stored for a change of 150 bytes"
        );
        // Both read back whole and at offsets across chunk boundaries, in
        // this process and the next.
        for store in [bs, BlobStore::open_path(&blobs, StoreIo::real()).unwrap()] {
            assert_eq!(store.read(&a).unwrap(), one);
            assert_eq!(store.read(&b).unwrap(), two);
            let opened = store.open(&b).unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 40_000];
            loop {
                let n = opened.read_at(&mut buf, got.len() as u64).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, two);
            assert!(store.has_intact(&b, two.len() as u64));
            assert!(!store.has_intact(&b, two.len() as u64 - 1));
        }
        // Compressible contents are stored compressed.
        let text = b"- step: read the skill, then act on it\n".repeat(20_000);
        let before = pack_bytes(&blobs);
        bs_put(&blobs, &text);
        assert!(pack_bytes(&blobs) - before < text.len() as u64 / 5);
        fs::remove_dir_all(&d).unwrap();
    }

    fn bs_put(blobs: &Path, data: &[u8]) -> BlobId {
        let bs = BlobStore::open_path(blobs, StoreIo::real()).unwrap();
        let id = bs.put_bytes(data, true).unwrap();
        assert_eq!(bs.read(&id).unwrap(), data);
        id
    }

    #[test]
    fn a_damaged_chunk_is_an_error_and_storing_again_repairs_it() {
        let d = tempdir("bad-chunk");
        let blobs = d.join("blobs");
        let big = noise(600_000, 5);
        let id = bs_put(&blobs, &big);
        // One byte of the first pack's middle flips.
        let pack = fs::read_dir(blobs.join("packs"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut raw = fs::read(&pack).unwrap();
        let mid = raw.len() / 2;
        raw[mid] ^= 0x40;
        fs::set_permissions(&pack, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        fs::write(&pack, &raw).unwrap();
        let fresh = BlobStore::open_path(&blobs, StoreIo::real()).unwrap();
        // Not deduplicated onto, before anything read it (a pack entry
        // carries no mark that it was synced: a power cut can leave one
        // like this).
        assert!(
            !fresh.has_intact(&id, big.len() as u64),
            "deduplicated onto damage"
        );
        let e = fresh.read(&id).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(fresh.open(&id).is_err(), "served a damaged content");
        assert!(
            !fresh.has_intact(&id, big.len() as u64),
            "deduplicated onto damage"
        );
        fresh.put_reader(&big[..]).unwrap();
        fresh.sync_pending().unwrap();
        let third = BlobStore::open_path(&blobs, StoreIo::real()).unwrap();
        assert_eq!(third.read(&id).unwrap(), big);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn dedups_and_names_by_sha256() {
        let d = tempdir("dedup");
        let bs = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
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

        // Larger than a pack takes: chunks in the packs, no file of its own.
        let big = vec![b'x'; PACK_MAX as usize + 1];
        fs::write(&src, &big).unwrap();
        let (id, size) = bs.put_file(&File::open(&src).unwrap(), false).unwrap();
        assert_eq!((id.clone(), size), (hash_bytes(&big), big.len() as u64));
        assert!(!bs.path(&id).exists());
        assert_eq!(bs.read(&id).unwrap(), big);
        let (again, _) = bs.put_reader(&big[..]).unwrap();
        assert_eq!(again, id);
        let (small, _) = bs.put_reader(&b"hello"[..]).unwrap();
        assert_eq!(small, a);

        // A new store reads both kinds back.
        let fresh = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
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
        // Right size, wrong bytes: what a power loss can leave of a loose
        // blob (an earlier build's) renamed into place but never synced.
        let mut bad = big.clone();
        bad[1000] ^= 1;
        let (id, _) = plant_loose(&d.join("blobs"), &big, &bad);

        let fresh = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
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
        // Storing the content again repairs it: as chunks, which are read
        // before any loose copy.
        let src = d.join("src");
        fs::write(&src, &big).unwrap();
        let (again, _) = fresh.put_file(&File::open(&src).unwrap(), true).unwrap();
        assert_eq!(again, id);
        let third = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
        assert_eq!(third.read(&id).unwrap(), big);
        assert!(third.has_intact(&id, big.len() as u64));
        let mut buf = vec![0u8; 3000];
        assert_eq!(
            third.open(&id).unwrap().read_at(&mut buf, 500).unwrap(),
            3000
        );
        assert_eq!(buf, big[500..3500]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_blob_trusted_on_its_size_is_still_hashed_before_it_is_served() {
        let d = tempdir("rotted-marked");
        let big: Vec<u8> = (0..PACK_MAX as usize + 5000)
            .map(|i| (i % 253) as u8)
            .collect();
        // A loose blob of an earlier build; one bit rots, the durable mark
        // (its mtime) stays.
        let mut bad = big.clone();
        bad[1000] ^= 1;
        let (id, path) = plant_loose(&d.join("blobs"), &big, &bad);
        mark_durable(&File::open(&path).unwrap());

        // A mount's scan finds it on its size, as designed; serving it
        // hashes it all the same, and it is trusted no more after.
        let fresh = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
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
