//! `Packs`: small blobs appended to pack files instead of one file each.
//!
//! A version of a few kilobytes costs far more as a file of its own than as
//! bytes: an inode allocated (ext4 searches block groups for recently freed
//! inodes), a directory entry, a rename. So a blob of at most [`PACK_MAX`]
//! bytes is appended to a pack, `blobs/packs/<n>.pack`:
//!
//! ```text
//! entry = "SKB1" | sha256 (32 bytes) | length (u64, little-endian) | content
//! ```
//!
//! Invariants: packs are append-only and entries are never rewritten in
//! place (a pack with forgotten entries is copied whole into a new pack and
//! then removed, `rewrite`); each
//! daemon appends to a pack of its own, started after every pack that exists
//! (so a tail cut off by a crash is never written after); an entry counts
//! only when its whole content lies inside the file; bytes that are not a
//! whole entry at the end of a pack are a tail cut off by a crash, while
//! a bad entry followed by good ones is damage: it is reported as such and
//! the entries after it are found again by scanning for the next header
//! whose content matches its hash (none is dropped silently); content is
//! checked against its hash before it is served when it was not written
//! by this process (bytes that a power loss left unwritten are an error,
//! never a version).
//!
//! Locks: `writer` (this process's pack and where it ends) is taken before
//! `index` (what every pack holds, and their open files), never the other
//! way; both are leaves below the blob store's own locks, and `opened` (the
//! held fd of `packs/`) is a leaf below them. Packs are made, opened and
//! listed only through the held fds of `blobs/` and `packs/` (`store::dir`).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::dir::Dir;
use super::durable::StoreIo;
use super::fsutil;

mod rewrite;
pub use rewrite::{Plan, Rewrite};

/// The directory of the packs, in `blobs/`.
pub const PACKS: &str = "packs";

/// Largest blob kept in a pack.
pub const PACK_MAX: u64 = 128 * 1024;
/// A pack past this size is closed and the next one started.
const PACK_ROTATE: u64 = 256 << 20;
const MAGIC: &[u8; 4] = b"SKB1";
const HEADER: u64 = 4 + 32 + 8;

pub type RawId = [u8; 32];

#[derive(Clone, Copy)]
struct Entry {
    pack: u32,
    off: u64,
    len: u64,
    /// Hash checked (or written by this process).
    checked: bool,
}

struct Writer {
    n: u32,
    /// `packs/`, held open.
    dir: Arc<Dir>,
    file: Arc<File>,
    end: u64,
    /// The pack's directory entry (and a new `packs/` directory's) is
    /// known to be durable.
    dir_synced: bool,
    /// `packs/` itself was made for this pack.
    made_dir: bool,
}

#[derive(Default)]
struct Index {
    entries: HashMap<RawId, Entry>,
    /// Further copies of a content found by the scan (a content stored
    /// again because its first copy was damaged): tried when the first
    /// does not match its hash.
    spare_copies: HashMap<RawId, Vec<Entry>>,
    files: HashMap<u32, Arc<File>>,
    last: u32,
}

pub struct Packs {
    /// `blobs/`, which holds `packs/`.
    blobs: Arc<Dir>,
    /// `packs/` once opened (from `blobs`); it is made by the first pack.
    opened: Mutex<Option<Arc<Dir>>>,
    /// Where `packs/` is (for messages).
    dir: PathBuf,
    index: Mutex<Option<Index>>,
    writer: Mutex<Option<Writer>>,
    io: StoreIo,
}

/// What an append left to make durable.
pub struct Appended {
    /// The number of the pack file written.
    pub pack: u32,
    /// The pack's directory entry is not known to be durable yet: it must
    /// be made durable too.
    pub new_pack: bool,
}

/// The name of pack `n` in `packs/`.
pub fn pack_name(n: u32) -> String {
    format!("{n:08}.pack")
}

impl Packs {
    /// The packs in `blobs/packs/`, reached from the held fd of `blobs`,
    /// made durable through `io`.
    pub fn new(blobs: Arc<Dir>, io: StoreIo) -> Packs {
        Packs {
            dir: blobs.join(PACKS),
            blobs,
            opened: Mutex::new(None),
            index: Mutex::new(None),
            writer: Mutex::new(None),
            io,
        }
    }

    /// Where pack `n` is (for messages).
    pub fn path(&self, n: u32) -> PathBuf {
        self.dir.join(pack_name(n))
    }

    /// `packs/`, opened from `blobs/` (made first with `create`); `None`
    /// when it does not exist and is not to be made. Whether it was made.
    fn packs_dir(&self, create: bool) -> io::Result<Option<(Arc<Dir>, bool)>> {
        let mut opened = self.opened.lock();
        if let Some(d) = opened.as_ref() {
            return Ok(Some((Arc::clone(d), false)));
        }
        let made = create && self.blobs.make_sub(PACKS)?;
        match self.blobs.sub(PACKS) {
            Ok(d) => {
                let d = Arc::new(d);
                *opened = Some(Arc::clone(&d));
                Ok(Some((d, made)))
            }
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `packs/` as opened (by a scan or a first pack), for a sync.
    pub fn opened_dir(&self) -> Option<Arc<Dir>> {
        self.opened.lock().clone()
    }

    /// Opens pack `n` for reading.
    pub fn open_pack(&self, n: u32) -> io::Result<File> {
        match self.packs_dir(false)? {
            Some((d, _)) => d.read_file(&pack_name(n)),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// Runs `f` on the index, reading the packs first if not done yet.
    fn with_index<T>(&self, f: impl FnOnce(&mut Index) -> T) -> T {
        let mut guard = self.index.lock();
        let index = guard.get_or_insert_with(|| self.scan());
        f(index)
    }

    fn scan(&self) -> Index {
        let mut index = Index::default();
        let Some(Ok(rd)) = self.packs_dir(false).ok().flatten().map(|(d, _)| d.list()) else {
            return index;
        };
        let mut numbers: Vec<u32> = rd
            .iter()
            .filter_map(|e| {
                let name = std::str::from_utf8(&e.name).ok()?;
                name.strip_suffix(".pack")?.parse().ok()
            })
            .collect();
        numbers.sort_unstable();
        for n in numbers {
            index.last = index.last.max(n);
            let Ok(file) = self.open_pack(n) else {
                continue;
            };
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let mut off = 0u64;
            let mut head = [0u8; HEADER as usize];
            // Where a damaged stretch began, while looking for the entry
            // after it.
            let mut damaged_from: Option<u64> = None;
            while off + HEADER <= size {
                let entry = file
                    .read_exact_at(&mut head, off)
                    .ok()
                    .filter(|()| &head[..4] == MAGIC)
                    .and_then(|()| {
                        let mut id = [0u8; 32];
                        id.copy_from_slice(&head[4..36]);
                        let len = u64::from_le_bytes(head[36..44].try_into().expect("8 bytes"));
                        let body = off + HEADER;
                        (len <= PACK_MAX && body + len <= size).then_some((id, body, len))
                    })
                    // Past damage only an entry whose content matches its
                    // hash is taken as the next one (a header-like run of
                    // bytes inside some content is not).
                    .filter(|&(id, body, len)| {
                        damaged_from.is_none() || content_matches(&file, &id, body, len)
                    });
                let Some((id, body, len)) = entry else {
                    let from = *damaged_from.get_or_insert(off);
                    match find_magic(&file, off + 1, size) {
                        Some(next) => {
                            off = next;
                            continue;
                        }
                        None => {
                            off = from;
                            break;
                        }
                    }
                };
                if let Some(from) = damaged_from.take() {
                    tracing::error!(
                        "{}: {} bytes at offset {from} are not a valid entry (damaged); \
                         the entries after them were found again by scanning, and a \
                         content stored in the damaged bytes is lost from this pack",
                        self.path(n).display(),
                        off - from
                    );
                }
                let e = Entry {
                    pack: n,
                    off: body,
                    len,
                    checked: false,
                };
                match index.entries.entry(id) {
                    std::collections::hash_map::Entry::Occupied(_) => {
                        index.spare_copies.entry(id).or_default().push(e)
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(e);
                    }
                }
                off = body + len;
            }
            if off < size {
                tracing::warn!(
                    "{}: {} bytes after offset {off} are not a whole entry and no entry \
                     follows them (cut off by a crash?); ignored",
                    self.path(n).display(),
                    size - off
                );
            }
            index.files.insert(n, Arc::new(file));
        }
        index
    }

    /// Holds `id` with `len` bytes whose content can be trusted.
    pub fn has_intact(&self, id: &RawId, len: u64) -> bool {
        let found = self.with_index(|ix| ix.entries.get(id).copied());
        match found {
            Some(e) if e.len == len => e.checked || self.read(id).is_ok(),
            _ => false,
        }
    }

    /// Every id the packs hold, as their scan indexed them (for the fuzz
    /// target's checks: each must read back as its hash, or fail).
    #[doc(hidden)]
    pub fn ids(&self) -> Vec<RawId> {
        self.with_index(|ix| ix.entries.keys().copied().collect())
    }

    pub fn contains(&self, id: &RawId) -> bool {
        self.with_index(|ix| ix.entries.contains_key(id))
    }

    /// The pack holding `id`, for a durability point.
    pub fn pack_of(&self, id: &RawId) -> Option<u32> {
        self.with_index(|ix| ix.entries.get(id).map(|e| e.pack))
    }

    /// The content of `id`, checked against its hash (a damaged copy is
    /// passed over for another one, which then becomes the one used).
    pub fn read(&self, id: &RawId) -> io::Result<Vec<u8>> {
        let (e, file) = self
            .with_index(|ix| {
                let e = *ix.entries.get(id)?;
                Some((e, Arc::clone(ix.files.get(&e.pack)?)))
            })
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let mut data = vec![0u8; e.len as usize];
        file.read_exact_at(&mut data, e.off)?;
        if e.checked || Sha256::digest(&data).as_slice() == id {
            self.with_index(|ix| {
                if let Some(x) = ix.entries.get_mut(id) {
                    x.checked = true;
                }
            });
            return Ok(data);
        }
        let damaged = io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "blob {} is damaged: {} at offset {}: content does not match its hash",
                skillfs_base::relpath::hex(id),
                self.path(e.pack).display(),
                e.off
            ),
        );
        let others = self.with_index(|ix| ix.spare_copies.remove(id).unwrap_or_default());
        for other in others {
            let Some(file) = self.with_index(|ix| ix.files.get(&other.pack).cloned()) else {
                continue;
            };
            let mut data = vec![0u8; other.len as usize];
            if file.read_exact_at(&mut data, other.off).is_ok()
                && Sha256::digest(&data).as_slice() == id
            {
                self.with_index(|ix| {
                    ix.entries.insert(
                        *id,
                        Entry {
                            checked: true,
                            ..other
                        },
                    )
                });
                return Ok(data);
            }
        }
        Err(damaged)
    }

    /// Appends `data` (whose hash is `id`) to this process's pack; with
    /// `durable`, it is on disk when this returns.
    pub fn append(&self, id: &RawId, data: &[u8], durable: bool) -> io::Result<Appended> {
        debug_assert!(data.len() as u64 <= PACK_MAX);
        let mut w = self.writer.lock();
        let mut new_pack = false;
        if w.as_ref().is_none_or(|w| w.end >= PACK_ROTATE) {
            *w = Some(self.start_pack()?);
            new_pack = true;
        }
        let dir_durable = w.as_ref().is_some_and(|w| w.dir_synced);
        let wr = w.as_mut().expect("just started");
        let mut buf = Vec::with_capacity(HEADER as usize + data.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(id);
        buf.extend_from_slice(&(data.len() as u64).to_le_bytes());
        buf.extend_from_slice(data);
        if let Err(e) = wr.file.write_all_at(&buf, wr.end) {
            // Whatever part landed is a cut-off entry, where a scan stops:
            // nothing may follow it, so the next append starts a new pack.
            *w = None;
            return Err(e);
        }
        let entry = Entry {
            pack: wr.n,
            off: wr.end + HEADER,
            len: data.len() as u64,
            checked: true,
        };
        wr.end += buf.len() as u64;
        if durable {
            self.io.sync_data(&wr.file, &self.path(wr.n))?;
            if !wr.dir_synced {
                self.io.sync_dir(&wr.dir)?;
                if wr.made_dir {
                    self.io.sync_dir(&self.blobs)?;
                }
                wr.dir_synced = true;
            }
        }
        let (n, file) = (wr.n, Arc::clone(&wr.file));
        drop(w);
        self.with_index(|ix| {
            ix.files.entry(n).or_insert(file);
            // A copy already indexed that failed its check (or was never
            // checked) gives way to this one, which is known good.
            match ix.entries.get(id) {
                Some(old) if old.checked => {}
                _ => {
                    ix.entries.insert(*id, entry);
                }
            }
        });
        Ok(Appended {
            pack: n,
            new_pack: !durable && (new_pack || !dir_durable),
        })
    }

    /// The directory entries of the pack being appended to were made
    /// durable together with `synced` (which holds it): later appends need
    /// not sync them again.
    pub fn mark_dir_synced(&self, synced: &[u32]) {
        if let Some(w) = self.writer.lock().as_mut()
            && synced.contains(&w.n)
        {
            w.dir_synced = true;
        }
    }

    fn start_pack(&self) -> io::Result<Writer> {
        let (dir, made_dir) = self.packs_dir(true)?.expect("made");
        let n = self.with_index(|ix| {
            ix.last += 1;
            ix.last
        });
        let file = dir.create_new(&pack_name(n), fsutil::SEALED_MODE)?;
        Ok(Writer {
            n,
            dir,
            file: Arc::new(file),
            end: 0,
            dir_synced: false,
            made_dir,
        })
    }
}

/// Whether `len` bytes at `body` hash to `id`.
fn content_matches(file: &File, id: &RawId, body: u64, len: u64) -> bool {
    let mut data = vec![0u8; len as usize];
    file.read_exact_at(&mut data, body).is_ok() && Sha256::digest(&data).as_slice() == id
}

/// The offset of the next `MAGIC` at or after `from` (and before `size`).
fn find_magic(file: &File, from: u64, size: u64) -> Option<u64> {
    const STEP: usize = 1 << 20;
    let mut buf = vec![0u8; STEP + MAGIC.len()];
    let mut at = from;
    while at + MAGIC.len() as u64 <= size {
        let want = ((size - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..want], at).ok()?;
        if let Some(i) = buf[..want].windows(MAGIC.len()).position(|w| w == MAGIC) {
            return Some(at + i as u64);
        }
        // The last bytes again next time: a header may straddle.
        at += (want - (MAGIC.len() - 1)) as u64;
    }
    None
}

#[cfg(test)]
mod tests {
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
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
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
        let path = packs.path(1);
        let mut raw = fs::read(&path).unwrap();
        raw.extend_from_slice(MAGIC);
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
        assert_eq!(appended.pack, 2);
        assert_eq!(again.read(&id_of(&c)).unwrap(), c);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_copy_gives_way_to_a_good_one_stored_again() {
        let dir = std::env::temp_dir().join(format!("skillfs-packs-again-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = b"stored twice".to_vec();
        packs_in(&dir).append(&id_of(&a), &a, true).unwrap();
        let path = packs_in(&dir).path(1);
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
        let path = packs.path(1);
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
        let path = packs.path(1);
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
}
