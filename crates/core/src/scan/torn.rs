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
//! - the found bytes are recorded first, as the version they are (the scan
//!   record), so nothing is lost and `undo` takes the repair back;
//! - the recorded version is written beside the file, given its mode,
//!   owner and mtime, synced, and renamed over it (the directory synced);
//! - the repair is a record of its own, by the actor `skillfs-repair`, and
//!   a line in [`Settler::repairs`] (the mount prints it, the log keeps it).
//!
//! Only after an unclean shutdown ([`Settler::repair_torn`]: the journal has
//! records the checkpoint of a clean unmount does not cover): an edit made
//! while cleanly unmounted, even one that empties a file, is the user's.
//! A recorded version whose own content is not intact, or larger than
//! [`MAX_REPAIR`], is not put back (a warning says so).
//!
//! Locks: the caller's (the mount-time scan runs before any request).

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;

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
    /// is a torn copy of, with its content, if the scan should put it back.
    pub(super) fn torn_version(
        &self,
        path: &RelPath,
        now: &EntryState,
    ) -> io::Result<Option<(EntryState, Vec<u8>)>> {
        if !self.repair_torn || now.kind != Kind::File {
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
            tracing::warn!(
                "{path} looks torn by a power cut, but its recorded version (blob {blob}) is \
                 not intact or too large to put back: kept as found"
            );
            return Ok(None);
        }
        // Larger than the version: torn only if all zeros, which the read
        // of the first bytes past it cannot rule out; read it whole.
        let mut found = Vec::new();
        open_content(self.areas.root_fd, path.as_bytes())
            .map_err(|e| ctx("open", path, e))?
            .take(MAX_REPAIR + 1)
            .read_to_end(&mut found)
            .map_err(|e| ctx("read", path, e))?;
        let was = self
            .blobs
            .read(&blob)
            .map_err(|e| ctx("read the version of", path, e))?;
        Ok(is_torn(&found, &was).then_some((old, was)))
    }

    /// Writes `bytes` (the recorded version `old`) over the live `path`,
    /// as `cp -a` would restore it, and records the repair.
    pub(super) fn put_back(
        &mut self,
        path: &RelPath,
        old: EntryState,
        bytes: &[u8],
    ) -> io::Result<()> {
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
        }
        .map_err(|e| ctx("open", &parent, e))?;
        let tmp = format!(
            ".skillfs-repair.{}.{}",
            std::process::id(),
            skillfs_base::time::now_ns()
        );
        let written = (|| {
            let mut f = sys::openat(
                dir.as_raw_fd(),
                tmp.as_bytes(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )?;
            f.write_all(bytes)?;
            if sys::geteuid() == 0 {
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
            sys::renameat2(
                dir.as_raw_fd(),
                tmp.as_bytes(),
                dir.as_raw_fd(),
                path.file_name(),
                0,
            )?;
            sys::fsync(&dir)
        })();
        if let Err(e) = written {
            let _ = sys::unlinkat(dir.as_raw_fd(), tmp.as_bytes(), false);
            return Err(ctx("put back", path, e));
        }
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
