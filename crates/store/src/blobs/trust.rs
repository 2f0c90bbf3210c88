//! How far this process trusts a blob: `known` tells a blob found whole
//! on its size (the durable mark) from one hashed or stored here, and from
//! one found damaged; a loose blob is hashed before it is served or
//! trusted, once per process (see the module doc of `blobs`).
//!
//! Locks: `known` is held only for a lookup or an insert.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{BlobStore, CHUNK, DURABLE_MTIME, raw_id};
use crate::packs::{Codec, PACK_MAX};
use skillfs_base::sys;

/// What this process knows of a blob in `known`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    /// Present with the right size and the durable mark (the mount's scan
    /// asks): enough to deduplicate onto, not to serve unhashed.
    OnSize,
    /// Stored by this process, or read whole and hashed by it.
    Hashed,
    /// Read whole and found not to match its name: never trusted, and
    /// replaced by the next store of the content.
    Damaged,
}

impl BlobStore {
    /// Present with the expected size. After a power loss a blob stored
    /// without `durable` can be an empty file under its final name; it must
    /// not be trusted as a copy of the content.
    pub fn has_intact(&self, id: &str, size: u64) -> bool {
        let Some(raw) = raw_id(id) else {
            return false;
        };
        // Every store and dedup asks here first: pinned before it looks, a
        // content a prune is about to remove is either kept or not found.
        self.pin(&raw);
        if size > PACK_MAX
            && let Some((_, Codec::Chunked)) = self.packs.stat(&raw)
        {
            // Never on `known` alone: its chunks are pinned and looked for
            // each time (see `chunked`).
            return self.chunked_intact(&raw, size);
        }
        match self.known.lock().get(&raw) {
            Some(Known::OnSize | Known::Hashed) => return true,
            Some(Known::Damaged) => return false,
            None => {}
        }
        if size <= PACK_MAX {
            // Small contents live in packs (a loose copy left by an older
            // version of skillfs is not looked for: at worst stored twice).
            // A pack hashes an entry at its first read by itself.
            let intact = self.packs.has_intact(&raw, size);
            if intact {
                self.known.lock().insert(raw, Known::Hashed);
            }
            intact
        } else {
            self.loose_intact(id, &raw, size)
        }
    }

    /// The size alone does not tell a loose blob from one a power loss
    /// left unwritten, unless it was marked after an fsync; an unmarked one
    /// is hashed, then synced and marked (so once, not at every mount).
    fn loose_intact(&self, id: &str, raw: &[u8; 32], size: u64) -> bool {
        let path = self.path(id);
        let Ok(f) = self.open_loose(id) else {
            return false;
        };
        if !f.metadata().is_ok_and(|m| m.len() == size) {
            return false;
        }
        if is_marked_durable(&f) {
            // Not `Hashed`: the mark says it was whole once, not that it
            // still is; the first read of it here hashes it.
            self.known.lock().entry(*raw).or_insert(Known::OnSize);
            return true;
        }
        if self.check_loose(id, raw, &f).is_err() {
            return false;
        }
        if self.io.sync_all(&f, &path).is_ok() {
            mark_durable(&f);
        }
        true
    }

    /// Checks a loose blob's content against its name, once per process.
    pub(super) fn check_loose(&self, id: &str, raw: &[u8; 32], f: &File) -> io::Result<()> {
        if self.hashed_here(raw) {
            return Ok(());
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0u64;
        loop {
            let n = f.read_at(&mut buf, off)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            off += n as u64;
        }
        self.judge(id, raw, hasher.finalize().as_slice())
    }

    /// Records that `raw`'s content was found damaged here.
    pub(super) fn mark_damaged(&self, raw: &[u8; 32]) {
        self.known.lock().insert(*raw, Known::Damaged);
    }

    /// Whether this process has hashed `raw`'s content (or stored it).
    pub(super) fn hashed_here(&self, raw: &[u8; 32]) -> bool {
        self.known.lock().get(raw) == Some(&Known::Hashed)
    }

    /// Records what a hash of `id`'s whole content found: `Hashed`, or
    /// `Damaged` and the error that says so.
    pub(super) fn judge(&self, id: &str, raw: &[u8; 32], sha: &[u8]) -> io::Result<()> {
        if sha != raw {
            self.known.lock().insert(*raw, Known::Damaged);
            return Err(damaged_blob(id, &self.path(id)));
        }
        self.known.lock().insert(*raw, Known::Hashed);
        Ok(())
    }
}

/// Marks a loose blob whose content was just fsynced (see [`DURABLE_MTIME`];
/// one left unmarked is only hashed again by a later daemon).
pub(super) fn mark_durable(f: &File) {
    let (s, ns) = DURABLE_MTIME;
    let _ = sys::futimens(f, sys::Time::Keep, sys::Time::At(s, ns));
}

fn is_marked_durable(f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    f.metadata()
        .is_ok_and(|m| (m.mtime(), m.mtime_nsec()) == DURABLE_MTIME)
}

/// A blob whose bytes do not match its name: damage, never "missing".
fn damaged_blob(id: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "blob {id} is damaged: the content of {} does not match its hash",
            path.display()
        ),
    )
}
