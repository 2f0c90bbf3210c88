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
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::{BlobId, BlobStore, Pending, raw_id};
use crate::packs::{Codec, Located, PACK_MAX, RawId};
use skillfs_base::relpath::hex;

/// The bounds of a chunk: small enough that a change stores little, large
/// enough that a list stays short (a list names a chunk in 36 bytes, a
/// chunk's entry has 44 of header: ~0.5% at the average). Measured with
/// `bench/store_size.py` (fsx, 8,000 operations on a 256 KiB file): 192 MiB
/// of store at 8/32/128 KiB, 146 MiB at 4/16/64 KiB.
pub const MIN: u32 = 4 * 1024;
pub const AVG: u32 = 16 * 1024;
pub const MAX: u32 = 64 * 1024;
/// Chunks held, by all the writers of a store together, until their
/// content's hash is known.
pub(super) const HELD: u64 = 128 << 20;
/// The most chunks a list names (`format::CHUNKED_MAX`): contents of
/// ~14 GiB at the average chunk size.
const MAX_CHUNKS: usize = ((crate::packs::format::CHUNKED_MAX - 12) / 36) as usize;

/// A writer's share of the bytes of chunks a store holds at once.
struct Budget<'a> {
    left: &'a AtomicU64,
    taken: u64,
}

impl Budget<'_> {
    /// Takes `n` bytes if the store has them left.
    fn take(&mut self, n: u64) -> bool {
        let ok = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(n))
            .is_ok();
        if ok {
            self.taken += n;
        }
        ok
    }

    fn give_back(&mut self) {
        self.left
            .fetch_add(std::mem::take(&mut self.taken), Ordering::AcqRel);
    }
}

impl Drop for Budget<'_> {
    fn drop(&mut self) {
        self.give_back();
    }
}

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
    /// Stores the large content of `src` as chunks, read once from its
    /// start (its offset is left alone).
    pub(super) fn put_file_chunked(&self, src: &File, durable: bool) -> io::Result<(BlobId, u64)> {
        self.put_chunks(Pread { file: src, at: 0 }, durable)
    }

    /// Cuts what `r` reads into chunks and stores each one not stored
    /// yet, then the list; returns the content's id and length. Up to
    /// [`HELD`] bytes of chunks are held until the whole content's hash is
    /// known, so that a content stored already costs one read and no
    /// append; past that, chunks are stored as they come (a content found
    /// stored after all leaves them dead, for a prune).
    pub(super) fn put_chunks(&self, r: impl Read, durable: bool) -> io::Result<(BlobId, u64)> {
        let mut whole = Sha256::new();
        let mut list: Vec<(RawId, u32)> = Vec::new();
        let mut held: Vec<(RawId, Vec<u8>)> = Vec::new();
        // What `held` takes of the store's budget, given back on every way
        // out (errors included).
        let mut budget = Budget {
            left: &self.held_left,
            taken: 0,
        };
        let mut size = 0u64;
        let mut streaming = false;
        // A full disk stops the storing, not the hash: a content stored
        // already needs no room (a park unparked on a full disk).
        let mut full: Option<io::Error> = None;
        for c in fastcdc::v2020::StreamCDC::new(r, MIN as usize, AVG as usize, MAX as usize) {
            let c = c.map_err(|e| match e {
                fastcdc::v2020::Error::IoError(e) => e,
                e => io::Error::other(e.to_string()),
            })?;
            if list.len() >= MAX_CHUNKS {
                return Err(io::Error::new(
                    io::ErrorKind::FileTooLarge,
                    format!(
                        "a content of more than {size} bytes cannot be stored (its list of \
                         chunks would pass {MAX_CHUNKS} chunks)"
                    ),
                ));
            }
            whole.update(&c.data);
            let raw: RawId = Sha256::digest(&c.data).into();
            list.push((raw, c.data.len() as u32));
            size += c.data.len() as u64;
            // (The first 256 KiB are held outside the budget: a content
            // that ends up no larger than a pack entry is stored whole.)
            if !streaming && (size <= 2 * PACK_MAX || budget.take(c.data.len() as u64)) {
                held.push((raw, c.data));
                continue;
            }
            if !streaming {
                // Past the budget: what was held is stored, and every
                // chunk after it as it comes.
                streaming = true;
                for (raw, data) in held.drain(..) {
                    self.store_chunk(&raw, &data, durable, &mut full)?;
                }
                budget.give_back();
            }
            self.store_chunk(&raw, &c.data, durable, &mut full)?;
        }
        let id = hex(whole.finalize().as_slice());
        if size <= PACK_MAX {
            // A file that shrank since its size was read: one entry, as a
            // small content is (all of it is held).
            let data: Vec<u8> = held.into_iter().flat_map(|(_, d)| d).collect();
            if data.len() as u64 != size {
                return Err(io::Error::other("a content read in part"));
            }
            if !self.has_intact(&id, size) {
                self.put_packed(&id, &data, durable)?;
            } else if durable {
                self.mark_pending(&id);
                self.sync_pending()?;
            }
            return Ok((id, size));
        }
        if !self.has_intact(&id, size) {
            for (raw, data) in held {
                self.store_chunk(&raw, &data, durable, &mut full)?;
            }
            if let Some(e) = full {
                return Err(e);
            }
            let raw = raw_id(&id).expect("hex of a sha256");
            self.packs
                .append_chunked(&raw, size, &list, false, &|a| self.note_appended(a))?;
            self.known.lock().insert(raw, super::trust::Known::Hashed);
        } else if durable {
            self.mark_pending(&id);
        }
        if durable {
            self.sync_pending()?;
        }
        Ok((id, size))
    }

    /// Stores one chunk unless it is stored (then, with `durable`, its
    /// pack joins the durability point); a full disk is kept in `full`
    /// and stops the storing of the chunks after it.
    fn store_chunk(
        &self,
        raw: &RawId,
        data: &[u8],
        durable: bool,
        full: &mut Option<io::Error>,
    ) -> io::Result<()> {
        let id = hex(raw);
        if self.has_intact(&id, data.len() as u64) {
            if durable {
                self.mark_pending(&id);
            }
            return Ok(());
        }
        if full.is_some() {
            return Ok(());
        }
        match self.put_packed(&id, data, false) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
                ) =>
            {
                *full = Some(e);
                Ok(())
            }
            r => r,
        }
    }

    /// Whether the chunked content `raw` of `size` bytes is present: its
    /// chunks are pinned (with it) and each is in the packs with its
    /// length and matches its hash, and it was not found damaged here.
    /// Each chunk is hashed once per process, as a small content is: a
    /// pack entry carries no mark that it was ever synced, so one a power
    /// cut left half written must not be deduplicated onto (the whole is
    /// hashed again before it is served, `open_chunked`).
    pub(super) fn chunked_intact(&self, raw: &RawId, size: u64) -> bool {
        let Some(Ok(list)) = self.packs.chunks_of(raw) else {
            return false;
        };
        if let Some(p) = self.pins.lock().as_mut() {
            p.extend(list.iter().map(|(c, _, _)| *c));
        }
        self.packs.stat(raw).is_some_and(|(s, _)| s == size)
            && self.known.lock().get(raw) != Some(&super::trust::Known::Damaged)
            && list
                .iter()
                .all(|&(c, _, n)| self.packs.has_intact_chunk(&c, n as u64))
    }

    /// Hashes the chunked content `raw` chunk by chunk against its name;
    /// a failure marks it damaged (never deduplicated onto again here).
    fn check_chunked(&self, raw: &RawId, list: &[(RawId, u64, u32)]) -> io::Result<()> {
        let id = hex(raw);
        let mut whole = Sha256::new();
        for (c, _, n) in list {
            match self.packs.read_chunk(c, *n) {
                Ok(data) => whole.update(data),
                Err(e) => {
                    self.mark_damaged(raw);
                    return Err(io::Error::new(
                        e.kind(),
                        format!("blob {id} is damaged: {e}"),
                    ));
                }
            }
        }
        self.judge(&id, raw, whole.finalize().as_slice())
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("blob {id} is damaged: its chunks do not make up its content"),
                )
            })
    }

    /// The whole chunked content `raw`, checked; `None` if `raw` is no
    /// chunked content of the packs. A failure marks it damaged.
    pub(super) fn read_chunked(&self, raw: &RawId) -> Option<io::Result<Vec<u8>>> {
        if self.packs.stat(raw)?.1 != Codec::Chunked {
            return None;
        }
        Some(self.packs.read(raw).inspect_err(|_| self.mark_damaged(raw)))
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
        let located = list
            .iter()
            .map(|&(c, start, n)| Ok((start, n, self.packs.locate_chunk(&c, n)?)))
            .collect::<io::Result<Vec<_>>>();
        Some(located.map(|list| {
            super::Opened::Chunks(Chunks {
                list,
                last: Mutex::new(None),
            })
        }))
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

/// A chunked content opened for reading at offsets: each chunk was found
/// at the open, in a pack file held open (a prune that rewrites the pack
/// meanwhile does not take it away), and the chunk last read is kept
/// (reads come in order, a page or a few at a time).
pub struct Chunks {
    /// (offset, length, where) of each chunk, in order.
    list: Vec<(u64, u32, Located)>,
    last: Mutex<Option<(usize, Arc<Vec<u8>>)>>,
}

impl Chunks {
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let at = off + done as u64;
            // The chunk that holds `at`: the last one starting at or before.
            let i = self.list.partition_point(|&(start, _, _)| start <= at);
            if i == 0 {
                break;
            }
            let i = i - 1;
            let (start, n, ref located) = self.list[i];
            if at >= start + n as u64 {
                break; // past the end
            }
            // (The lock is not held across the read: reads of one handle
            // run side by side.)
            let cached = match &*self.last.lock() {
                Some((j, d)) if *j == i => Some(Arc::clone(d)),
                _ => None,
            };
            let data = match cached {
                Some(d) => d,
                None => {
                    let d = Arc::new(located.read()?);
                    if d.len() != n as usize {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "a chunk of a blob has the wrong length",
                        ));
                    }
                    *self.last.lock() = Some((i, Arc::clone(&d)));
                    d
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
