//! After a power cut, no live file is left empty or torn while history
//! holds it whole (issue 26, item 4).
//!
//! A file acknowledged (its version durable) and then rewritten without an
//! `fsync` can come back from a power cut as a file of the right name
//! holding nothing, or zeros where its blocks were never written (ext4's
//! delayed allocation; `auto_da_alloc` does not cover the exchange a
//! publish makes). The scan of the mount after an unclean shutdown meets
//! such a file as an offline edit. Recorded as one, the agent would load
//! an empty skill. So, before the mount, a file whose found bytes match no
//! recorded version and are **empty, all zeros, or the recorded version
//! with whole 4 KiB blocks zeroed** is put back as the newest recorded
//! version, when that version's content is intact:
//! - the recorded version is written beside the file under a name the
//!   hide rules hide (`.NAME.skillfs-repair.tmp`: a leftover is parked at
//!   the next mount, never versioned), given its mode, owner and mtime,
//!   synced, and renamed over the file, if the file is still the one read
//!   (same inode, size, mtime and ctime); the directory is synced;
//! - then the found bytes are recorded, as the version they are, and the
//!   repair after them, by the actor `skillfs-repair`, so `undo` takes it
//!   back. (Recorded after the rename: a crash in between leaves the file
//!   whole and loses only the found bytes, which are zeros or a part of
//!   the version put back.) A line in [`Settler::repairs`] says it (the
//!   mount prints it, the log keeps it);
//! - a put-back that fails is said in the log and the found bytes are
//!   recorded as they are: the mount goes on.
//!
//! Only after an unclean shutdown ([`Settler::repair_torn`], from the
//! store's `DIRTY` mark, see `skillfs_store::clean`): an edit made while
//! cleanly unmounted, even one that empties a file, is the user's. A
//! recorded version whose own content is not intact, or a file or version
//! larger than [`MAX_REPAIR`], is not put back.
//!
//! Locks: the caller's (the mount-time scan runs before any request).

use std::io::{self, Read, Write};
use std::os::fd::AsFd;

use super::{Settler, ctx, open_content};
use skillfs_base::relpath::RelPath;
use skillfs_base::sys::{self, Time};
use skillfs_store::journal::{Actor, Change, EntryState, Kind, Op};

/// The largest version put back (read whole into memory).
pub const MAX_REPAIR: u64 = 64 << 20;
const BLOCK: usize = 4096;

/// Whether `found` is `old` torn by a power cut: empty, all zeros, or
/// `old` with whole blocks zeroed (and no byte that is neither).
fn is_torn(found: &[u8], old: &[u8]) -> bool {
    if found == old || old.iter().all(|&b| b == 0) {
        return false;
    }
    if found.iter().all(|&b| b == 0) {
        return true;
    }
    if found.len() > old.len() {
        return false;
    }
    let mut zeroed = false;
    for (i, block) in found.chunks(BLOCK).enumerate() {
        let was = &old[i * BLOCK..(i * BLOCK + block.len()).min(old.len())];
        if block != was {
            if block.iter().any(|&b| b != 0) {
                return false;
            }
            zeroed = true;
        }
    }
    zeroed || found.len() < old.len() && found.len().is_multiple_of(BLOCK)
}

impl Settler<'_> {
    /// The recorded version `now` (a file just found changed at `path`)
    /// is a torn copy of, with its content and the stat of the file read,
    /// if the scan should put it back.
    pub(super) fn torn_version(
        &self,
        path: &RelPath,
        now: &EntryState,
    ) -> io::Result<Option<(EntryState, Vec<u8>, libc::stat)>> {
        if !self.repair_torn || now.kind != Kind::File || now.size > MAX_REPAIR {
            return Ok(None);
        }
        let Some(old) = self.ledger.catalog().get(path).cloned() else {
            return Ok(None);
        };
        let Some(blob) = old
            .blob
            .clone()
            .filter(|_| old.kind == Kind::File && old.size > 0)
        else {
            return Ok(None);
        };
        if old.size > MAX_REPAIR || !self.blobs.has_intact(&blob, old.size) {
            return Ok(None);
        }
        let f =
            open_content(self.areas.root_fd, path.as_bytes()).map_err(|e| ctx("open", path, e))?;
        let st = sys::fstat(&f).map_err(|e| ctx("stat", path, e))?;
        let mut found = Vec::new();
        f.take(MAX_REPAIR + 1)
            .read_to_end(&mut found)
            .map_err(|e| ctx("read", path, e))?;
        if found.len() as u64 > MAX_REPAIR {
            return Ok(None);
        }
        let was = self
            .blobs
            .read(&blob)
            .map_err(|e| ctx("read the version of", path, e))?;
        Ok(is_torn(&found, &was).then_some((old, was, st)))
    }

    /// Puts `bytes` (the recorded version `old`) back over the live
    /// `path`, found torn as `found` (its state) with the stat `seen`, as
    /// `cp -a` would restore it; then records the found bytes and the
    /// repair. A failure is said and leaves the file as found (recorded).
    pub(super) fn put_back(
        &mut self,
        path: &RelPath,
        found: EntryState,
        seen: &libc::stat,
        old: EntryState,
        bytes: &[u8],
    ) -> io::Result<()> {
        match self.write_back(path, seen, &old, bytes) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    "{path} changed while it was put back after a power cut: kept as it is now"
                );
                return Ok(());
            }
            Err(e) => {
                tracing::warn!("{path} looks torn by a power cut, but could not be put back: {e}");
                return self.record(Change::new(Op::Scan, path.clone(), Some(found)));
            }
        }
        self.record(Change::new(Op::Scan, path.clone(), Some(found)))?;
        self.repairs.push(format!(
            "{path} was found torn (empty or zero-filled) after an unclean shutdown: put back \
             its newest recorded version ({} bytes); the found bytes are kept as a version \
             before it (skillfs undo takes the repair back)",
            old.size
        ));
        let actor = Actor {
            comm: "skillfs-repair".to_string(),
            ..self.actor.clone()
        };
        self.ledger
            .record(Change::new(Op::Scan, path.clone(), Some(old)), actor)?;
        self.report.recorded += 1;
        self.report.repaired += 1;
        Ok(())
    }

    /// The version written beside `path` and renamed over it, if the file
    /// is still the one stat'ed as `seen`: whether it was.
    fn write_back(
        &self,
        path: &RelPath,
        seen: &libc::stat,
        old: &EntryState,
        bytes: &[u8],
    ) -> io::Result<bool> {
        let root = self.areas.root_fd;
        let parent = path.parent().unwrap_or_else(RelPath::root);
        let dir = if parent.is_root() {
            sys::openat(root, b".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
        } else {
            sys::openat(
                root,
                parent.as_bytes(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )
        }?;
        let name = path.file_name();
        let mut tmp = b".".to_vec();
        tmp.extend_from_slice(name);
        tmp.extend_from_slice(b".skillfs-repair.tmp");
        let _ = sys::unlinkat(dir.as_fd(), &tmp, false);
        let written = (|| {
            let mut f = sys::openat(
                dir.as_fd(),
                &tmp,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )?;
            f.write_all(bytes)?;
            if skillfs_base::process::geteuid() == 0 {
                sys::fchown(&f, old.uid, old.gid)?;
            }
            sys::fchmod(&f, old.mode)?;
            let ns = old.mtime_ns;
            let (secs, nanos) = (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
            sys::futimens(
                &f,
                Time::Keep,
                Time::At(
                    i64::try_from(secs).unwrap_or(i64::MAX),
                    i64::try_from(nanos).unwrap_or(0),
                ),
            )?;
            sys::fsync(&f)?;
            // Still the file read: a writer meanwhile keeps its bytes.
            let now = sys::lstatat(dir.as_fd(), name)?;
            let same = (
                now.st_dev,
                now.st_ino,
                now.st_size,
                now.st_mtime,
                now.st_mtime_nsec,
            ) == (
                seen.st_dev,
                seen.st_ino,
                seen.st_size,
                seen.st_mtime,
                seen.st_mtime_nsec,
            ) && (now.st_ctime, now.st_ctime_nsec)
                == (seen.st_ctime, seen.st_ctime_nsec);
            if !same {
                return Ok(false);
            }
            sys::renameat2(dir.as_fd(), &tmp, dir.as_fd(), name, 0)?;
            sys::fsync(&dir)?;
            Ok(true)
        })();
        if !matches!(written, Ok(true)) {
            let _ = sys::unlinkat(dir.as_fd(), &tmp, false);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::is_torn;

    #[test]
    fn torn_is_empty_zeros_or_whole_blocks_zeroed() {
        let old: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8 + 1).collect();
        assert!(is_torn(b"", &old));
        assert!(is_torn(&vec![0; old.len()], &old));
        assert!(is_torn(&[0; 10], &old), "zeros of another size");
        let mut holes = old.clone();
        holes[4096..8192].fill(0);
        assert!(is_torn(&holes, &old));
        assert!(is_torn(&old[..8192], &old), "cut at a block");
        // Not torn: the same bytes, an edit, a cut inside a block, and a
        // version that was zeros itself.
        assert!(!is_torn(&old, &old));
        let mut edit = old.clone();
        edit[5] = 0xff;
        assert!(!is_torn(&edit, &old));
        let mut partial = old.clone();
        partial[4096..4100].fill(0);
        assert!(!is_torn(&partial, &old), "zeros inside a block are data");
        assert!(!is_torn(&old[..5000], &old));
        assert!(!is_torn(b"", &[0, 0]));
    }
}
