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
//! Invariants: packs are append-only and entries are never rewritten; each
//! daemon appends to a pack of its own, started after every pack that exists
//! (so a tail cut off by a crash is never written after); an entry counts
//! only when its whole content lies inside the file, and the first entry
//! that does not stops the scan of its pack (only a cut-off tail can be
//! incomplete); content is checked against its hash before it is served
//! when it was not written by this process (bytes that a power loss left
//! unwritten are an error, never a version).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

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
    file: Arc<File>,
    end: u64,
}

#[derive(Default)]
struct Index {
    entries: HashMap<RawId, Entry>,
    files: HashMap<u32, Arc<File>>,
    last: u32,
}

pub struct Packs {
    dir: PathBuf,
    index: Mutex<Option<Index>>,
    writer: Mutex<Option<Writer>>,
}

/// What an append left to make durable.
pub struct Appended {
    /// The pack file written.
    pub pack: PathBuf,
    /// A new pack: its directory entry must be made durable too.
    pub new_pack: bool,
}

impl Packs {
    pub fn new(dir: PathBuf) -> Packs {
        Packs {
            dir,
            index: Mutex::new(None),
            writer: Mutex::new(None),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, n: u32) -> PathBuf {
        self.dir.join(format!("{n:08}.pack"))
    }

    /// Runs `f` on the index, reading the packs first if not done yet.
    fn with_index<T>(&self, f: impl FnOnce(&mut Index) -> T) -> T {
        let mut guard = self.index.lock();
        let index = guard.get_or_insert_with(|| self.scan());
        f(index)
    }

    fn scan(&self) -> Index {
        let mut index = Index::default();
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return index;
        };
        let mut numbers: Vec<u32> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_str()?;
                name.strip_suffix(".pack")?.parse().ok()
            })
            .collect();
        numbers.sort_unstable();
        for n in numbers {
            index.last = index.last.max(n);
            let Ok(file) = File::open(self.path(n)) else {
                continue;
            };
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let mut off = 0u64;
            let mut head = [0u8; HEADER as usize];
            while off + HEADER <= size {
                if file.read_exact_at(&mut head, off).is_err() || &head[..4] != MAGIC {
                    break;
                }
                let mut id = [0u8; 32];
                id.copy_from_slice(&head[4..36]);
                let len = u64::from_le_bytes(head[36..44].try_into().expect("8 bytes"));
                let body = off + HEADER;
                if len > PACK_MAX || body + len > size {
                    break;
                }
                index.entries.entry(id).or_insert(Entry {
                    pack: n,
                    off: body,
                    len,
                    checked: false,
                });
                off = body + len;
            }
            if off < size {
                tracing::warn!(
                    "{}: {} bytes after offset {off} are not a whole entry (cut off by a crash?); ignored",
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

    pub fn contains(&self, id: &RawId) -> bool {
        self.with_index(|ix| ix.entries.contains_key(id))
    }

    /// The pack holding `id`, for a durability point.
    pub fn pack_of(&self, id: &RawId) -> Option<PathBuf> {
        let n = self.with_index(|ix| ix.entries.get(id).map(|e| e.pack))?;
        Some(self.path(n))
    }

    /// The content of `id`, checked against its hash.
    pub fn read(&self, id: &RawId) -> io::Result<Vec<u8>> {
        let (e, file) = self
            .with_index(|ix| {
                let e = *ix.entries.get(id)?;
                Some((e, Arc::clone(ix.files.get(&e.pack)?)))
            })
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let mut data = vec![0u8; e.len as usize];
        file.read_exact_at(&mut data, e.off)?;
        if !e.checked {
            if Sha256::digest(&data).as_slice() != id {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} at offset {}: content does not match its hash",
                        self.path(e.pack).display(),
                        e.off
                    ),
                ));
            }
            self.with_index(|ix| {
                if let Some(x) = ix.entries.get_mut(id) {
                    x.checked = true;
                }
            });
        }
        Ok(data)
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
        let wr = w.as_mut().expect("just started");
        let mut buf = Vec::with_capacity(HEADER as usize + data.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(id);
        buf.extend_from_slice(&(data.len() as u64).to_le_bytes());
        buf.extend_from_slice(data);
        if let Err(e) = wr.file.write_all_at(&buf, wr.end) {
            // Whatever part landed is cut off: the next entry goes after
            // the end the file has now, and a scan stops before it.
            if let Ok(m) = wr.file.metadata() {
                wr.end = wr.end.max(m.len());
            }
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
            crate::sys::fdatasync(&*wr.file)?;
            if new_pack {
                super::blobs::sync_dir(&self.dir)?;
            }
        }
        let (n, file) = (wr.n, Arc::clone(&wr.file));
        drop(w);
        self.with_index(|ix| {
            ix.files.entry(n).or_insert(file);
            ix.entries.entry(*id).or_insert(entry);
        });
        Ok(Appended {
            pack: self.path(n),
            new_pack: new_pack && !durable,
        })
    }

    fn start_pack(&self) -> io::Result<Writer> {
        fs::create_dir_all(&self.dir)?;
        let n = self.with_index(|ix| {
            ix.last += 1;
            ix.last
        });
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(self.path(n))?;
        Ok(Writer {
            n,
            file: Arc::new(file),
            end: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rewrites a (read-only) pack, as damage would.
    fn overwrite(path: &Path, raw: &[u8]) {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        fs::write(path, raw).unwrap();
    }

    fn id_of(data: &[u8]) -> RawId {
        Sha256::digest(data).into()
    }

    #[test]
    fn appends_survive_a_reopen_and_a_cut_off_tail_is_ignored() {
        let dir = std::env::temp_dir().join(format!("skillfs-packs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let packs = Packs::new(dir.clone());
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

        let again = Packs::new(dir.clone());
        assert!(again.has_intact(&id_of(&a), a.len() as u64));
        assert!(!again.has_intact(&id_of(&a), 1), "wrong size");
        assert_eq!(again.read(&id_of(&b)).unwrap(), b);
        assert!(!again.contains(&id_of(&c)), "cut off");
        // New entries go to a new pack, never after the cut-off tail.
        let appended = again.append(&id_of(&c), &c, false).unwrap();
        assert!(appended.new_pack);
        assert_eq!(appended.pack, again.path(2));
        assert_eq!(again.read(&id_of(&c)).unwrap(), c);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn damaged_content_is_an_error_not_a_version() {
        let dir = std::env::temp_dir().join(format!("skillfs-packs-bad-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let packs = Packs::new(dir.clone());
        let a = b"precious".to_vec();
        packs.append(&id_of(&a), &a, true).unwrap();
        let path = packs.path(1);
        let mut raw = fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 0xff;
        overwrite(&path, &raw);
        let again = Packs::new(dir.clone());
        assert!(!again.has_intact(&id_of(&a), a.len() as u64));
        let e = again.read(&id_of(&a)).unwrap_err();
        assert!(e.to_string().contains("does not match its hash"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
