//! `Packs`: small blobs appended to pack files instead of one file each.
//!
//! A version of a few kilobytes costs far more as a file of its own than as
//! bytes: an inode allocated (ext4 searches block groups for recently freed
//! inodes), a directory entry, a rename. So a blob of at most [`PACK_MAX`]
//! bytes is appended to a pack, `blobs/packs/<n>.pack`:
//!
//! An entry is a header (magic, sha256, body length) and a body: the
//! content, plain or LZ4-compressed, or the list of chunks a large content
//! is made of; the bytes are `format`'s. Packs written by this format are
//! `<n>.zpack`; the `<n>.pack` files of earlier builds (plain entries only)
//! are read as they are and never appended to, so that a build from before
//! compressed entries, which knows only `.pack` files, never meets (or
//! rewrites without) an entry it cannot read.
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

use std::collections::{HashMap, HashSet};
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
use skillfs_base::sys;

pub mod format;
mod rewrite;
mod scan;
pub use format::{Codec, HEADER, Header, PACK_MAX, RawId};
pub use rewrite::{Plan, Rewrite};
use scan::entry_matches;
pub use scan::find_magic;

/// The directory of the packs, in `blobs/`.
pub const PACKS: &str = "packs";

/// A pack past this size is closed and the next one started.
const PACK_ROTATE: u64 = 256 << 20;

#[derive(Clone, Copy)]
struct Entry {
    pack: u32,
    /// Where the body starts.
    off: u64,
    /// The body's length.
    len: u64,
    /// The content's length.
    size: u64,
    codec: Codec,
    /// Hash checked (or written by this process).
    checked: bool,
}

impl Entry {
    fn at(pack: u32, entry_off: u64, h: &Header, checked: bool) -> Entry {
        Entry {
            pack,
            off: entry_off + HEADER,
            len: h.len,
            size: h.size,
            codec: h.codec,
            checked,
        }
    }

    fn header(&self, id: &RawId) -> Header {
        Header {
            codec: self.codec,
            id: *id,
            len: self.len,
            size: self.size,
        }
    }

    fn body(&self, file: &File) -> io::Result<Vec<u8>> {
        let mut body = vec![0u8; self.len as usize];
        file.read_exact_at(&mut body, self.off)?;
        Ok(body)
    }
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
    /// Packs of earlier builds, named `<n>.pack`.
    legacy: HashSet<u32>,
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

/// A chunk found in the packs, read from the file it was found in.
pub struct Located {
    id: RawId,
    entry: Entry,
    file: Arc<File>,
}

impl Located {
    /// The chunk's content, checked against its hash.
    pub fn read(&self) -> io::Result<Vec<u8>> {
        let data = format::decode(&self.entry.header(&self.id), &self.entry.body(&self.file)?)?;
        if self.entry.checked || Sha256::digest(&data).as_slice() == self.id {
            return Ok(data);
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a chunk of a blob ({}) is damaged: content does not match its hash",
                skillfs_base::relpath::hex(&self.id)
            ),
        ))
    }
}

/// The number the first pack of this format gets: far above any number
/// an earlier build gives its `.pack` files (the highest it sees plus
/// one), so that a build run on the store before this one and this one
/// again never name two packs alike.
pub const FIRST_ZPACK: u32 = 10_000_000;

/// The name of pack `n` in `packs/`, as this build writes it.
pub fn pack_name(n: u32) -> String {
    format!("{n:08}.zpack")
}

/// The name of pack `n` as builds before compressed entries wrote it.
pub fn legacy_pack_name(n: u32) -> String {
    format!("{n:08}.pack")
}

/// The number of a pack file named `name`, and whether it is a legacy one.
pub fn pack_number(name: &str) -> Option<(u32, bool)> {
    let (digits, legacy) = match name.strip_suffix(".zpack") {
        Some(d) => (d, false),
        None => (name.strip_suffix(".pack")?, true),
    };
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, legacy))
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
        self.dir.join(self.name_of(n))
    }

    /// The file name of pack `n`.
    fn name_of(&self, n: u32) -> String {
        if self.with_index(|ix| ix.legacy.contains(&n)) {
            legacy_pack_name(n)
        } else {
            pack_name(n)
        }
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
            Some((d, _)) => d.read_file(&self.name_of(n)),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// Runs `f` on the index, reading the packs first if not done yet.
    fn with_index<T>(&self, f: impl FnOnce(&mut Index) -> T) -> T {
        let mut guard = self.index.lock();
        let index = guard.get_or_insert_with(|| self.scan());
        f(index)
    }

    /// Holds `id` with `len` bytes whose content can be trusted.
    pub fn has_intact(&self, id: &RawId, len: u64) -> bool {
        self.intact_where(id, len, |_| true)
    }

    /// Holds `id` as one content entry (no chunk list) of `len` bytes
    /// that can be trusted: a sound chunk of a chunked content.
    pub fn has_intact_chunk(&self, id: &RawId, len: u64) -> bool {
        self.intact_where(id, len, |c| c != Codec::Chunked)
    }

    /// Holds `id` with `len` bytes, of a kind `kind` accepts, whose content
    /// can be trusted (one index lookup; the first read checks its hash).
    fn intact_where(&self, id: &RawId, len: u64, kind: impl Fn(Codec) -> bool) -> bool {
        let found = self.with_index(|ix| ix.entries.get(id).copied());
        match found {
            Some(e) if e.size == len && kind(e.codec) => e.checked || self.read(id).is_ok(),
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

    /// The content's length and kind of entry, if the packs hold `id`.
    pub fn stat(&self, id: &RawId) -> Option<(u64, Codec)> {
        self.with_index(|ix| ix.entries.get(id).map(|e| (e.size, e.codec)))
    }

    /// The chunks (id, offset, length) the chunked entry `id` names, in
    /// order; `None` if `id` is no chunked entry here.
    pub fn chunks_of(&self, id: &RawId) -> Option<io::Result<Vec<(RawId, u64, u32)>>> {
        let (e, file) = self.with_index(|ix| {
            let e = *ix.entries.get(id)?;
            Some((e, Arc::clone(ix.files.get(&e.pack)?)))
        })?;
        if e.codec != Codec::Chunked {
            return None;
        }
        let list = |e: &Entry, file: &File| {
            e.body(file)
                .and_then(|body| format::chunks(&e.header(id), &body))
        };
        let err = match list(&e, &file) {
            Ok(l) => return Some(Ok(l)),
            Err(err) => err,
        };
        // Another copy of the list, sound, takes the damaged one's place.
        let spares = self.with_index(|ix| {
            ix.spare_copies
                .get(id)
                .into_iter()
                .flatten()
                .filter_map(|o| Some((*o, Arc::clone(ix.files.get(&o.pack)?))))
                .collect::<Vec<_>>()
        });
        for (other, f) in spares {
            if let Ok(l) = list(&other, &f) {
                // It takes the damaged one's place only if the index still
                // names that one and still reads the other's pack (a prune
                // may have switched either meanwhile).
                self.with_index(|ix| {
                    let same = ix
                        .entries
                        .get(id)
                        .is_some_and(|x| x.pack == e.pack && x.off == e.off);
                    if same && ix.files.contains_key(&other.pack) {
                        ix.entries.insert(*id, other);
                        if let Some(v) = ix.spare_copies.get_mut(id) {
                            v.retain(|x| !(x.pack == other.pack && x.off == other.off));
                        }
                        ix.spare_copies.retain(|_, v| !v.is_empty());
                    }
                });
                return Some(Ok(l));
            }
        }
        Some(Err(io::Error::new(
            err.kind(),
            format!(
                "blob {} is damaged: {} at offset {}: {err}",
                skillfs_base::relpath::hex(id),
                self.path(e.pack).display(),
                e.off
            ),
        )))
    }

    /// Where the chunk `id` of `len` bytes is, to be read later even if a
    /// prune rewrites its pack meanwhile (the open file stays readable).
    pub fn locate_chunk(&self, id: &RawId, len: u32) -> io::Result<Located> {
        self.with_index(|ix| {
            let e = *ix.entries.get(id)?;
            (e.codec != Codec::Chunked && e.size == len as u64)
                .then(|| Some((e, Arc::clone(ix.files.get(&e.pack)?))))?
        })
        .map(|(entry, file)| Located {
            id: *id,
            entry,
            file,
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a chunk of a blob ({}, {len} bytes) is missing from the packs",
                    skillfs_base::relpath::hex(id)
                ),
            )
        })
    }

    /// The content of a chunk (a plain or compressed entry), checked.
    pub fn read_chunk(&self, id: &RawId, len: u32) -> io::Result<Vec<u8>> {
        self.locate_chunk(id, len)?;
        self.read(id)
    }

    /// The content of the entry `e` of `id` in `file` (unchecked).
    fn content(&self, id: &RawId, e: &Entry, file: &File) -> io::Result<Vec<u8>> {
        let body = e.body(file)?;
        let h = e.header(id);
        if e.codec != Codec::Chunked {
            return format::decode(&h, &body);
        }
        let list = format::chunks(&h, &body)?;
        let mut out = Vec::with_capacity(e.size as usize);
        for (c, _, n) in list {
            out.extend_from_slice(&self.read_chunk(&c, n)?);
        }
        Ok(out)
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
        let content = self.content(id, &e, &file);
        let why = match &content {
            Ok(data) if e.checked || Sha256::digest(data).as_slice() == id => {
                self.with_index(|ix| {
                    if let Some(x) = ix.entries.get_mut(id) {
                        x.checked = true;
                    }
                });
                return content;
            }
            Ok(_) => "content does not match its hash".to_string(),
            Err(err) => err.to_string(),
        };
        let damaged = io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "blob {} is damaged: {} at offset {}: {why}",
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
            if let Ok(data) = self.content(id, &other, &file)
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
        self.append_entry(id, format::encode(id, data), durable, &|_| {})
    }

    /// [`Packs::append`], with `before_visible` told what it wrote before
    /// the entry is in the index (where another writer can find it and
    /// deduplicate onto it): the blob store makes the pack pending there,
    /// so that a record of that other writer is never made durable before
    /// the pack is.
    pub fn append_noting(
        &self,
        id: &RawId,
        data: &[u8],
        durable: bool,
        before_visible: &dyn Fn(&Appended),
    ) -> io::Result<Appended> {
        self.append_entry(id, format::encode(id, data), durable, before_visible)
    }

    /// Appends the chunked entry naming `id` (`size` bytes) by `chunks`,
    /// each of which the packs hold already.
    pub fn append_chunked(
        &self,
        id: &RawId,
        size: u64,
        chunks: &[(RawId, u32)],
        durable: bool,
        before_visible: &dyn Fn(&Appended),
    ) -> io::Result<Appended> {
        let buf = format::encode_chunked(id, size, chunks);
        self.append_entry(id, buf, durable, before_visible)
    }

    fn append_entry(
        &self,
        id: &RawId,
        buf: Vec<u8>,
        durable: bool,
        before_visible: &dyn Fn(&Appended),
    ) -> io::Result<Appended> {
        let h = Header::parse(&buf[..format::PROBE.min(buf.len())]).expect("well formed");
        let mut w = self.writer.lock();
        let mut new_pack = false;
        if w.as_ref().is_none_or(|w| w.end >= PACK_ROTATE) {
            *w = Some(self.start_pack()?);
            new_pack = true;
        }
        let dir_durable = w.as_ref().is_some_and(|w| w.dir_synced);
        let wr = w.as_mut().expect("just started");
        if let Err(e) = wr.file.write_all_at(&buf, wr.end) {
            // Whatever part landed is a cut-off entry, where a scan stops:
            // it is cut away, or, if that fails too, nothing may follow it
            // and the next append starts a new pack. (Not a new pack for
            // every failed append: a full disk would leave one per try.)
            if sys::ftruncate(&*wr.file, wr.end).is_err() {
                *w = None;
            }
            return Err(e);
        }
        let entry = Entry::at(wr.n, wr.end, &h, true);
        wr.end += buf.len() as u64;
        if durable {
            self.io
                .sync_data(&wr.file, &self.dir.join(pack_name(wr.n)))?;
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
        let appended = Appended {
            pack: n,
            new_pack: !durable && (new_pack || !dir_durable),
        };
        before_visible(&appended);
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
        Ok(appended)
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

    /// The number of the next pack this process makes.
    fn next_number(&self) -> u32 {
        self.with_index(|ix| {
            ix.last = (ix.last + 1).max(FIRST_ZPACK);
            ix.last
        })
    }

    fn start_pack(&self) -> io::Result<Writer> {
        let (dir, made_dir) = self.packs_dir(true)?.expect("made");
        let n = self.next_number();
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

#[cfg(test)]
mod tests;
