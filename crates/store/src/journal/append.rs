//! The open journal of a mounted daemon: it appends records, reserves room
//! for them ahead of its end, and makes them durable.
//!
//! Invariants:
//! - a line is appended with a single `write`; a failed or short append is
//!   cut off again, so a later record never follows a partial one;
//! - a record is durable once [`Journal::sync`] returns; no record is made
//!   durable before every blob it names is: at open, before the first sync,
//!   one `syncfs` makes durable whatever a killed daemon left unsynced
//!   (records and the blobs and live files they name);
//! - at open, a torn tail found by `read_dir` is copied aside, durably,
//!   before it is cut off: damaged data is set aside, never deleted;
//! - each record carries the watermark `acked_through`, the highest sequence
//!   number known durable when it was appended.
//!
//! Locks: none of its own; the one `Journal` of a mount is owned by the
//! `Ledger`, behind the core's `ledger` mutex, and `ledger::GroupCommit`
//! syncs its file outside that lock (`sync_target`, `mark_durable`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::encoding::encode;
use super::read::Contents;
use super::record::{Actor, Change, Record};
use crate::dir::Dir;
use crate::durable::StoreIo;
use crate::error::{ErrorKind, StoreError, StoreResult};
use crate::fsutil::FILE_MODE;

/// Copies the torn tail to `torn-<seq>-<ns>` beside the segment, durably,
/// before it is cut off: damaged data is set aside, never deleted.
fn set_aside_torn_tail(
    contents: &Contents,
    file: &File,
    dir: &Dir,
    io: &StoreIo,
) -> StoreResult<()> {
    let seq = contents.last_seq() + 1;
    let aside_name = format!("torn-{seq}-{}", skillfs_base::time::now_ns());
    let aside = dir.join(&aside_name);
    let mut tail = vec![0u8; contents.torn_bytes as usize];
    file.read_exact_at(&mut tail, contents.valid_len)
        .map_err(|e| StoreError::io(ErrorKind::Store, "read journal", &contents.segment, e))?;
    let copy = dir
        .open(
            &aside_name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            FILE_MODE,
        )
        .and_then(|f| {
            f.write_all_at(&tail, 0)?;
            io.sync_all(&f, &aside)
        })
        .and_then(|()| io.sync_dir(dir));
    copy.map_err(|e| StoreError::io(ErrorKind::Store, "set aside the torn tail in", &aside, e))?;
    if contents.torn_lines > 0 {
        tracing::warn!(
            "journal {}: record {seq} and what follows ({} bytes, {} complete lines) fail \
             their checks and no later record says they were durable: taken as cut off by \
             a power loss and set aside in {} (if they had been acknowledged, they were \
             damaged since)",
            contents.segment.display(),
            contents.torn_bytes,
            contents.torn_lines,
            aside.display()
        );
    } else {
        tracing::warn!(
            "journal {}: dropping {} bytes of an incomplete last record (set aside in {})",
            contents.segment.display(),
            contents.torn_bytes,
            aside.display()
        );
    }
    Ok(())
}

/// The append side of the journal, owned by the mounted daemon.
pub struct Journal {
    /// Shared with a group commit syncing it outside the ledger's lock
    /// (`sync_target`).
    file: Arc<File>,
    path: PathBuf,
    len: u64,
    next_seq: u64,
    unsynced: bool,
    /// The highest sequence number known durable (the watermark written
    /// into each record).
    durable_through: u64,
    io: StoreIo,
    /// Where the blocks reserved past the end (`ensure_room`) end.
    reserved_to: u64,
}

/// Blocks reserved ahead of the journal's end at a time: about 3,000
/// records, so that a change whose system call succeeded on a full disk
/// still gets its record (see `Journal::ensure_room`).
const RESERVE: u64 = 1 << 20;
/// Reserve again when less than this is left.
const RESERVE_LOW: u64 = 64 << 10;
/// Below this, with no more to be had, a change is refused (`ENOSPC`).
const RESERVE_FLOOR: u64 = 16 << 10;

impl Journal {
    /// Opens for appending after [`read_dir`], making things durable
    /// through `io`; sets a torn tail aside and cuts it off. The journal's
    /// directory is opened by path (never through a symlink).
    pub fn open_with(contents: &Contents, io: StoreIo) -> StoreResult<Journal> {
        let dir = contents.segment.parent().unwrap_or(Path::new("."));
        let held = Dir::open_path(dir)
            .map_err(|e| StoreError::io(ErrorKind::Store, "open journal", dir, e))?;
        Journal::open_in(&held, contents, io)
    }

    /// [`Journal::open_with`] in the journal directory held open as `dir`
    /// (the daemon's: the segment is opened from its fd).
    pub fn open_in(dir: &Dir, contents: &Contents, io: StoreIo) -> StoreResult<Journal> {
        let path = contents.segment.clone();
        let file = dir
            .open(
                contents.segment_name(),
                libc::O_RDWR | libc::O_CREAT,
                FILE_MODE,
            )
            .map_err(|e| StoreError::io(ErrorKind::Store, "open journal", &path, e))?;
        // What a killed daemon left in the page cache (records, the blobs
        // they name, the live files it swapped in, the store's directories
        // and this segment's own entry) is made durable before any record
        // of ours is: one commit of the whole filesystem. The store is on
        // ROOT's filesystem, so this covers the live tree too.
        io.syncfs(&file, &path)
            .map_err(|e| StoreError::io(ErrorKind::Store, "sync the filesystem of", &path, e))?;
        if contents.torn_bytes > 0 {
            set_aside_torn_tail(contents, &file, dir, &io)?;
            file.set_len(contents.valid_len)
                .and_then(|()| io.sync_all(&file, &path))
                .map_err(|e| StoreError::io(ErrorKind::Store, "truncate journal", &path, e))?;
        }
        let last = contents.last_seq();
        let mut journal = Journal {
            file: Arc::new(file),
            path,
            len: contents.valid_len,
            next_seq: last + 1,
            unsynced: false,
            durable_through: last,
            io,
            reserved_to: contents.valid_len,
        };
        // On a full disk the mount goes ahead; changes are then refused
        // until there is room (see `ensure_room`).
        let _ = journal.ensure_room();
        Ok(journal)
    }

    /// Makes sure the next records have blocks to land in, reserved ahead
    /// of the end: a namespace change asks before its system call, so that
    /// on a full disk it is refused (`ENOSPC`) rather than made with no
    /// record. Reserves another `RESERVE` when little is left; fails only
    /// when that fails and less than `RESERVE_FLOOR` remains.
    pub fn ensure_room(&mut self) -> io::Result<()> {
        let left = self.reserved_to.saturating_sub(self.len);
        if left >= RESERVE_LOW {
            return Ok(());
        }
        // As much as can be had, down to the floor: a disk with little
        // room left still takes the records that fit.
        let mut want = RESERVE;
        loop {
            match skillfs_base::sys::reserve(&*self.file, self.len, want) {
                Ok(()) => {
                    self.reserved_to = self.len + want;
                    return Ok(());
                }
                // A filesystem that cannot reserve: appends take their chance.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                    return Ok(());
                }
                Err(_) if want / 2 >= RESERVE_FLOOR => want /= 2,
                Err(_) if left >= RESERVE_FLOOR => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// What makes this journal's records (and the store's blobs) durable.
    pub fn io(&self) -> &StoreIo {
        &self.io
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends one record; on failure nothing of it remains in the file.
    pub fn append(&mut self, change: Change, actor: Actor, ts: i64) -> io::Result<Record> {
        let rec = Record {
            seq: self.next_seq,
            ts,
            op: change.op,
            path: change.path,
            to: change.to,
            noreplace: change.noreplace,
            hidden: change.hidden,
            state: change.state,
            actor,
            forgot: change.forgot,
            acked_through: Some(self.durable_through),
            origin: change.origin,
        };
        let line = encode(&rec);
        if let Err(e) = self.file.write_all_at(&line, self.len) {
            let _ = self.file.set_len(self.len);
            // The cut drops the blocks reserved past the end too.
            self.reserved_to = self.len;
            return Err(e);
        }
        self.len += line.len() as u64;
        self.next_seq += 1;
        self.unsynced = true;
        Ok(rec)
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> io::Result<()> {
        self.io.check()?;
        if self.unsynced {
            self.io.sync_data(&self.file, &self.path)?;
            self.unsynced = false;
            self.durable_through = self.next_seq - 1;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The segment appended to and the length of its records (for a
    /// checkpoint: what it covers).
    pub fn segment(&self) -> (&File, u64) {
        (&self.file, self.len)
    }

    /// Writes appended records out and waits, without the commit (see
    /// `BlobStore::write_out_pending`).
    pub fn write_out(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.io.write_out(&self.file, &self.path)?;
        }
        Ok(())
    }

    /// The records written out were committed by the caller's `fsync`.
    pub fn mark_synced(&mut self) {
        self.unsynced = false;
        self.durable_through = self.next_seq - 1;
    }

    /// What a sync made outside the ledger's lock needs (see
    /// `ledger::GroupCommit`): the file and the last sequence number
    /// appended, which an `fdatasync` of it started now makes durable.
    pub fn sync_target(&self) -> (Arc<File>, PathBuf, u64) {
        (Arc::clone(&self.file), self.path.clone(), self.next_seq - 1)
    }

    /// The highest sequence number known durable.
    pub fn durable_through(&self) -> u64 {
        self.durable_through
    }

    /// Records up to `seq` were made durable by a sync outside the lock.
    pub fn mark_durable(&mut self, seq: u64) {
        self.durable_through = self.durable_through.max(seq);
        if seq + 1 >= self.next_seq {
            self.unsynced = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::journal::encoding::encode;
    use crate::journal::fixtures::{dir, rec, watermarked};
    use crate::journal::read::{read_dir, segment_name};
    use crate::journal::record::{Change, Op};
    use skillfs_base::relpath::RelPath;

    #[test]
    fn torn_tail_dropped_middle_damage_reported() {
        let d = dir("torn");
        let seg = d.join(segment_name(1));
        let mut data = Vec::new();
        for s in 1..=3 {
            data.extend(encode(&rec(s)));
        }
        let good_len = data.len();
        data.extend_from_slice(&encode(&rec(4))[..20]);
        fs::write(&seg, &data).unwrap();
        let c = read_dir(&d).unwrap();
        assert_eq!(c.records.len(), 3);
        assert_eq!(c.valid_len as usize, good_len);
        let mut j = Journal::open_with(&c, StoreIo::real()).unwrap();
        assert_eq!(fs::metadata(&seg).unwrap().len() as usize, good_len);
        let r4 = j
            .append(
                Change::new(Op::Unlink, RelPath::parse(b"x").unwrap(), None),
                rec(0).actor,
                1,
            )
            .unwrap();
        assert_eq!(r4.seq, 4);
        j.sync().unwrap();
        assert_eq!(read_dir(&d).unwrap().records.len(), 4);

        // Damage in the middle: named by line, and the file is left alone.
        let mut data = fs::read(&seg).unwrap();
        let second_line_start = data.iter().position(|&b| b == b'\n').unwrap() + 1;
        data[second_line_start + 3] = b'#';
        fs::write(&seg, &data).unwrap();
        let err = read_dir(&d).err().expect("damage must be reported");
        assert_eq!(err.kind(), ErrorKind::DamagedJournal);
        assert!(err.to_string().contains("line 2"), "{err}");
        assert_eq!(fs::read(&seg).unwrap(), data);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_torn_tail_is_set_aside_before_it_is_cut() {
        let d = dir("aside");
        let seg = d.join(segment_name(1));
        let (good, lines) = watermarked();
        // Records 5 and 6 half written out of order: 5 zeroed, 6 whole.
        let mut data = good.clone();
        data[lines[4].0 + 10..lines[4].0 + 40].fill(0);
        fs::write(&seg, &data).unwrap();
        let c = read_dir(&d).unwrap();
        assert_eq!((c.records.len(), c.torn_lines), (4, 2));
        let mut j = Journal::open_with(&c, StoreIo::real()).unwrap();
        assert_eq!(fs::read(&seg).unwrap(), &good[..lines[4].0]);
        let aside: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("torn-5-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(fs::read(d.join(&aside[0])).unwrap(), &data[lines[4].0..]);
        // Appends carry the watermark: everything read at open is durable.
        let r = j
            .append(
                Change::new(Op::Unlink, RelPath::parse(b"x").unwrap(), None),
                rec(0).actor,
                1,
            )
            .unwrap();
        assert_eq!((r.seq, r.acked_through), (5, Some(4)));
        j.sync().unwrap();
        let r = j
            .append(
                Change::new(Op::Unlink, RelPath::parse(b"y").unwrap(), None),
                rec(0).actor,
                1,
            )
            .unwrap();
        assert_eq!((r.seq, r.acked_through), (6, Some(5)));
        assert_eq!(read_dir(&d).unwrap().records.len(), 6);
        fs::remove_dir_all(&d).unwrap();
    }
}
