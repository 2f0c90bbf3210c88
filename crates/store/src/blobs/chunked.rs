//! Large contents stored as content-defined chunks.
//!
//! A content larger than [`PACK_MAX`] is cut where its bytes say (FastCDC,
//! chunks of [`MIN`] to [`MAX`] bytes, [`AVG`] on average), each chunk is a
//! pack entry named by its own sha256 (compressed where that is smaller),
//! and the content is a chunked entry that lists them (`packs::format`).
//! A small change to a large file stores the chunks around the change and
//! a new list; every other chunk is shared with the versions before.
//! Loose blobs (`blobs/ab/<sha256>`) of earlier builds are still read, and
//! a content stored loose is deduplicated onto as before.
//!
//! Invariants:
//! - a chunked entry is appended only after every chunk it names is in the
//!   packs, and, with `durable`, every pack holding one of them is synced
//!   with it (a chunk found already stored is made part of the same
//!   durability point, `mark_pending`);
//! - a chunked content counts as present (`has_intact`) only while every
//!   chunk it names is in the packs; finding it pins its chunks with it,
//!   under the pins' lock, so a prune either sees them pinned or has
//!   removed one already, and then the content is stored again;
//! - a prune keeps the chunks of every chunked content it keeps (`live`
//!   expanded by `with_chunks`); a list it cannot read stops the prune
//!   before anything is removed;
//! - each chunk is checked against its hash when it is read, and the
//!   whole content against its name once per process before it is served
//!   at offsets (`open`), chunk by chunk, never whole in memory.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::{BlobId, BlobStore, Pending, raw_id};
use crate::packs::{Codec, PACK_MAX, Packs, RawId};
use skillfs_base::relpath::hex;

/// The bounds of a chunk: small enough that a change stores little, large
/// enough that a list stays short; the largest is the largest pack entry.
pub const MIN: u32 = 8 * 1024;
pub const AVG: u32 = 32 * 1024;
pub const MAX: u32 = PACK_MAX as u32;

/// Reads a file at offsets from its start, leaving its offset alone.
struct Pread<'a> {
    file: &'a File,
    at: u64,
}

impl Read for Pread<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

impl BlobStore {
    /// Stores the large content of `src` (whose hash is `id` and length
    /// `size`, as just read) as chunks.
    pub(super) fn put_file_chunked(
        &self,
        src: &File,
        id: &str,
        size: u64,
        durable: bool,
    ) -> io::Result<()> {
        let (got, got_size) = self.put_chunks(Pread { file: src, at: 0 }, durable)?;
        if got != id || got_size != size {
            // Changed under us between the hash and the chunking: what was
            // stored is a content of its own, not `id`.
            return Err(io::Error::other(format!(
                "the file changed while it was stored ({size} bytes hashed as {id}, then \
                 {got_size} bytes as {got})"
            )));
        }
        Ok(())
    }

    /// Cuts what `r` reads into chunks, stores each one not stored yet and
    /// then the list; returns the content's id and length.
    pub(super) fn put_chunks(&self, r: impl Read, durable: bool) -> io::Result<(BlobId, u64)> {
        let mut whole = Sha256::new();
        let mut list: Vec<(RawId, u32)> = Vec::new();
        let mut size = 0u64;
        // A full disk stops the storing, not the hash: a content stored
        // already needs no room (a park unparked on a full disk).
        let mut full: Option<io::Error> = None;
        for c in fastcdc::v2020::StreamCDC::new(r, MIN as usize, AVG as usize, MAX as usize) {
            let c = c.map_err(|e| match e {
                fastcdc::v2020::Error::IoError(e) => e,
                e => io::Error::other(e.to_string()),
            })?;
            whole.update(&c.data);
            let raw: RawId = Sha256::digest(&c.data).into();
            let chunk_id = hex(&raw);
            if !self.has_intact(&chunk_id, c.data.len() as u64) {
                if full.is_none()
                    && let Err(e) = self.put_packed(&chunk_id, &c.data, false)
                {
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                    ) {
                        return Err(e);
                    }
                    full = Some(e);
                }
            } else if durable {
                self.mark_pending(&chunk_id);
            }
            list.push((raw, c.data.len() as u32));
            size += c.data.len() as u64;
        }
        let id = hex(whole.finalize().as_slice());
        if size <= PACK_MAX {
            // (A reader that grew no longer than a pack entry: one entry.)
            return Err(io::Error::other("a content too small to chunk"));
        }
        if !self.has_intact(&id, size) {
            if let Some(e) = full {
                return Err(e);
            }
            let raw = raw_id(&id).expect("hex of a sha256");
            let appended = self.packs.append_chunked(&raw, size, &list, false)?;
            self.known.lock().insert(raw, super::trust::Known::Hashed);
            self.note_appended(appended);
        } else if durable {
            self.mark_pending(&id);
        }
        if durable {
            self.sync_pending()?;
        }
        Ok((id, size))
    }

    /// Whether the chunked content `raw` of `size` bytes is present: its
    /// chunks are pinned (with it) and each is in the packs; its list is
    /// read (and its whole content checked) once per process.
    pub(super) fn chunked_intact(&self, raw: &RawId, size: u64) -> bool {
        let Some(Ok(list)) = self.packs.chunks_of(raw) else {
            return false;
        };
        if let Some(p) = self.pins.lock().as_mut() {
            p.extend(list.iter().map(|(c, _, _)| *c));
        }
        let all_there = list.iter().all(|(c, _, n)| {
            self.packs
                .stat(c)
                .is_some_and(|(s, codec)| s == *n as u64 && codec != Codec::Chunked)
        });
        all_there
            && self.packs.stat(raw).is_some_and(|(s, _)| s == size)
            && (self.hashed_here(raw) || self.check_chunked(raw, &list).is_ok())
    }

    /// Hashes the chunked content `raw` chunk by chunk against its name.
    fn check_chunked(&self, raw: &RawId, list: &[(RawId, u64, u32)]) -> io::Result<()> {
        let mut whole = Sha256::new();
        for (c, _, n) in list {
            whole.update(self.packs.read_chunk(c, *n)?);
        }
        let id = hex(raw);
        self.judge(&id, raw, whole.finalize().as_slice())
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("blob {id} is damaged: its chunks do not make up its content"),
                )
            })
    }

    /// The chunked content `raw`, to be read at offsets (checked whole
    /// once per process first).
    pub(super) fn open_chunked(&self, raw: &RawId) -> Option<io::Result<super::Opened>> {
        let list = match self.packs.chunks_of(raw)? {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        if !self.hashed_here(raw)
            && let Err(e) = self.check_chunked(raw, &list)
        {
            return Some(Err(e));
        }
        Some(Ok(super::Opened::Chunks(Chunks {
            packs: Arc::clone(&self.packs),
            list,
            last: Mutex::new(None),
        })))
    }

    /// `live` and every chunk of a chunked content in it; an error if a
    /// list cannot be read (its chunks cannot be kept: nothing is pruned).
    pub(super) fn with_chunks(&self, mut live: HashSet<RawId>) -> io::Result<HashSet<RawId>> {
        let chunked: Vec<RawId> = live
            .iter()
            .filter(|id| {
                self.packs
                    .stat(id)
                    .is_some_and(|(_, c)| c == Codec::Chunked)
            })
            .copied()
            .collect();
        for id in chunked {
            match self.packs.chunks_of(&id) {
                Some(Ok(list)) => live.extend(list.into_iter().map(|(c, _, _)| c)),
                Some(Err(e)) => {
                    return Err(io::Error::new(e.kind(), format!("nothing was pruned: {e}")));
                }
                None => {}
            }
        }
        Ok(live)
    }

    /// The packs a durability point of the chunked content `raw` must
    /// sync besides its own: those of its chunks.
    pub(super) fn chunk_packs(&self, raw: &RawId) -> Vec<Pending> {
        let Some(Ok(list)) = self.packs.chunks_of(raw) else {
            return Vec::new();
        };
        let mut out: Vec<Pending> = Vec::new();
        for (c, _, _) in list {
            if let Some(n) = self.packs.pack_of(&c)
                && !out.contains(&Pending::Pack(n))
            {
                out.push(Pending::Pack(n));
            }
        }
        out
    }
}

/// A chunked content opened for reading at offsets: the chunk last read
/// is kept (reads come in order, a page or a few at a time).
pub struct Chunks {
    packs: Arc<Packs>,
    /// (id, offset, length) of each chunk, in order.
    list: Vec<(RawId, u64, u32)>,
    last: Mutex<Option<(usize, Arc<Vec<u8>>)>>,
}

impl Chunks {
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let at = off + done as u64;
            // The chunk that holds `at`: the last one starting at or before.
            let i = self.list.partition_point(|&(_, start, _)| start <= at);
            if i == 0 {
                break;
            }
            let i = i - 1;
            let (c, start, n) = self.list[i];
            if at >= start + n as u64 {
                break; // past the end
            }
            let data = {
                let mut last = self.last.lock();
                match &*last {
                    Some((j, d)) if *j == i => Arc::clone(d),
                    _ => {
                        let d = Arc::new(self.packs.read_chunk(&c, n)?);
                        *last = Some((i, Arc::clone(&d)));
                        d
                    }
                }
            };
            let from = (at - start) as usize;
            let k = (buf.len() - done).min(data.len() - from);
            buf[done..done + k].copy_from_slice(&data[from..from + k]);
            done += k;
        }
        Ok(done)
    }
}
