//! `Journal`: the append-only record of every change, one JSON object a line.
//!
//! Line format: a JSON object whose last member is `"crc":"xxxxxxxx"`, the
//! CRC-32 of the line with that member removed. Sequence numbers start at 1
//! and have no gaps. Each record carries `acked_through`, the highest
//! sequence number known durable when it was appended (its durability
//! watermark); records written before it existed have none.
//!
//! Invariants:
//! - a line is appended with a single `write`; a failed or short append is
//!   cut off again, so a later record never follows a partial one;
//! - a record is durable once [`Journal::sync`] returns; no record is made
//!   durable before every blob it names is: at open, before the first sync,
//!   one `syncfs` makes durable whatever a killed daemon left unsynced
//!   (records and the blobs and live files they name);
//! - at open, the first bad line (incomplete, failing its checksum, or out
//!   of sequence) decides: if a later intact record says it was durable
//!   (`acked_through` at or past it, or a record without the watermark), it
//!   is damage, reported with its file and line number, and nothing is
//!   changed; otherwise everything from it on was never made durable, only
//!   partly written when the machine died: it is a torn tail, set aside in
//!   `journal/torn-<seq>-<ns>` and cut off. A bad record that was made
//!   durable and then damaged, with no later record to vouch for it, cannot
//!   be told from a torn one: it is set aside (never deleted) with a warning.
//! - the journal is read once per mount ([`read_dir`], before anything is
//!   created); the read is used after the store's lock is taken only if
//!   [`Contents::is_current`] says no segment changed in between.
//!
//! Locks: none of its own; the one `Journal` of a mount is owned by the
//! `Ledger`, behind the core's `ledger` mutex, and `ledger::GroupCommit`
//! syncs its file outside that lock (`sync_target`, `mark_durable`).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::relpath::{ByteString, RelPath};
use crate::store::blobs::BlobId;
use crate::store::durable::StoreIo;
use crate::store::error::{ErrorKind, StoreError, StoreResult};
use crate::sys;

/// What a record did.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// A new empty file (`O_CREAT`).
    Create,
    /// New content published by a writer's close or fsync.
    Write,
    /// A size change by `truncate`/`ftruncate` outside a write handle.
    Truncate,
    Mkdir,
    Unlink,
    Rmdir,
    /// `path` moved to `to`, replacing what was there.
    Rename,
    /// `path` and `to` swapped (`RENAME_EXCHANGE`).
    Exchange,
    Symlink,
    Chmod,
    Chown,
    Utimes,
    /// Several attributes at once.
    Setattr,
    /// Found at mount: added or changed while unmounted (or the first
    /// baseline).
    Scan,
    /// Found missing at mount: removed while unmounted.
    ScanRemove,
    /// A visible entry renamed to a hidden name (`hidden`): it leaves the
    /// visible tree, so history keeps it as removed.
    Park,
    /// A hidden entry (`hidden`) renamed to a visible `path`; one record for
    /// it and one for each entry below it, each with its state.
    Unpark,
    /// Hidden entries whose visible directory was removed, moved to the
    /// orphan area (`path` is where, in the store).
    Orphan,
    /// An old park or orphan removed for good (`path` is what, in the store
    /// or by its hidden name).
    Sweep,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Write => "write",
            Op::Truncate => "truncate",
            Op::Mkdir => "mkdir",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Rename => "rename",
            Op::Exchange => "exchange",
            Op::Symlink => "symlink",
            Op::Chmod => "chmod",
            Op::Chown => "chown",
            Op::Utimes => "utimes",
            Op::Setattr => "setattr",
            Op::Scan => "scan",
            Op::ScanRemove => "scan-remove",
            Op::Park => "park",
            Op::Unpark => "unpark",
            Op::Orphan => "orphan",
            Op::Sweep => "sweep",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// The state of one path after a change: enough to recreate it exactly.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EntryState {
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<BlobId>,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// `i128`: ext4 stores times from 1901 to 2446, past `i64` nanoseconds.
    pub mtime_ns: i128,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ByteString>,
}

/// Who made a change, from the FUSE request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    pub uid: u32,
    pub pid: u32,
    pub comm: String,
}

impl Actor {
    /// The daemon itself (mount-time scan).
    pub fn daemon() -> Actor {
        Actor {
            uid: sys::geteuid(),
            pid: std::process::id(),
            comm: "skillfs".to_string(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    /// UTC, nanoseconds since the Unix epoch.
    pub ts: i64,
    pub op: Op,
    pub path: RelPath,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<RelPath>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub noreplace: bool,
    /// The hidden name involved in a park or unpark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<RelPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<EntryState>,
    pub actor: Actor,
    /// The highest sequence number known durable when this record was
    /// appended (`None`: written before the watermark existed, read as
    /// "everything before me was durable").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_through: Option<u64>,
}

/// Fixtures for the tests of the modules that fold records.
#[cfg(test)]
impl Record {
    /// `op` on `path` (to `to`) by the daemon, as change `seq` at `ts`.
    pub(crate) fn sample(
        seq: u64,
        ts: i64,
        op: Op,
        path: &str,
        to: Option<&str>,
        state: Option<EntryState>,
    ) -> Record {
        let parse = |p: &str| RelPath::parse(p.as_bytes()).expect("a test path");
        Record {
            seq,
            ts,
            op,
            path: parse(path),
            to: to.map(parse),
            noreplace: false,
            hidden: None,
            state,
            actor: Actor::daemon(),
            acked_through: None,
        }
    }
}

#[cfg(test)]
impl EntryState {
    /// A `kind` owned by root, mode 0644, with content `blob` if a file.
    pub(crate) fn sample(kind: Kind, blob: &str) -> EntryState {
        EntryState {
            kind,
            blob: (kind == Kind::File).then(|| blob.to_string()),
            size: 0,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime_ns: 0,
            target: None,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A change before it has a sequence number.
#[derive(Clone, Debug)]
pub struct Change {
    pub op: Op,
    pub path: RelPath,
    pub to: Option<RelPath>,
    pub noreplace: bool,
    pub hidden: Option<RelPath>,
    pub state: Option<EntryState>,
}

impl Change {
    pub fn new(op: Op, path: RelPath, state: Option<EntryState>) -> Change {
        Change {
            op,
            path,
            to: None,
            noreplace: false,
            hidden: None,
            state,
        }
    }
}

const CRC_SUFFIX_LEN: usize = r#","crc":"00000000"}"#.len();

/// Encodes a record as one line, checksum and newline included.
pub fn encode(rec: &Record) -> Vec<u8> {
    let mut body = serde_json::to_vec(rec).expect("records always serialize");
    let crc = crc32(&body);
    body.pop(); // the closing brace
    body.extend_from_slice(format!(r#","crc":"{crc:08x}"}}"#).as_bytes());
    body.push(b'\n');
    body
}

/// Decodes one line (without its newline).
pub fn decode(line: &[u8]) -> Result<Record, String> {
    if line.len() < CRC_SUFFIX_LEN + 2 {
        return Err("too short to be a record".into());
    }
    let (head, suffix) = line.split_at(line.len() - CRC_SUFFIX_LEN);
    if !suffix.starts_with(br#","crc":""#) || !suffix.ends_with(br#""}"#) {
        return Err("no checksum at the end of the line".into());
    }
    // Exactly as `encode` writes it: lowercase (an uppercase digit is a
    // changed byte, whatever it parses to).
    let hex = &suffix[8..16];
    if !hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err("checksum is not lowercase hex".into());
    }
    let want = std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("checksum is not hex")?;
    let mut body = head.to_vec();
    body.push(b'}');
    let got = crc32(&body);
    if got != want {
        return Err(format!(
            "checksum mismatch (stored {want:08x}, computed {got:08x})"
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("not a valid record: {e}"))
}

/// The reflected CRC-32 polynomial of IEEE 802.3 (zlib, PNG, gzip).
const CRC32_POLY: u32 = 0xEDB8_8320;

/// The CRC of every byte value, computed at compile time: one lookup per
/// byte instead of eight shift-and-xor steps.
const CRC32_TABLE: [u32; 256] = crc32_table();

const fn crc32_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ CRC32_POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// CRC-32 (IEEE 802.3) of `data`, table-driven; the same value the bitwise
/// form gives, so every journal ever written still verifies.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = (crc >> 8) ^ CRC32_TABLE[((crc ^ b as u32) & 0xff) as usize];
    }
    !crc
}

/// Everything read from a journal directory.
pub struct Contents {
    pub records: Vec<Record>,
    /// The segment appended to, and the length of its valid prefix.
    pub segment: PathBuf,
    pub valid_len: u64,
    /// Bytes after `valid_len` that are a torn tail (to be set aside).
    pub torn_bytes: u64,
    /// Complete lines (ending in a newline) in the torn tail: a complete
    /// bad line may have been a durable record damaged later.
    pub torn_lines: usize,
    /// The segments as they were just before they were read.
    seen: Seen,
}

/// Each segment's name, inode, size and modification and change times:
/// any append, cut or replacement changes at least one of them.
#[derive(Debug, PartialEq, Eq)]
struct Seen(Vec<(PathBuf, u64, u64, i64, i64, i64, i64)>);

impl Seen {
    fn of(segs: &[PathBuf]) -> io::Result<Seen> {
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::with_capacity(segs.len());
        for s in segs {
            let m = fs::symlink_metadata(s)?;
            out.push((
                s.clone(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            ));
        }
        Ok(Seen(out))
    }
}

impl Contents {
    /// Whether the journal is still as it was read (nothing appended, cut
    /// or replaced since), so that what was read before the store's lock
    /// was taken can be used once it is held. Changed (a daemon came and
    /// went in between) or unsure: read again.
    pub fn is_current(&self) -> bool {
        let dir = self.segment.parent().unwrap_or(Path::new("."));
        list_segments(dir)
            .and_then(|segs| Seen::of(&segs))
            .is_ok_and(|now| now == self.seen)
    }
}

fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}.jsonl")
}

fn list_segments(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut segs: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    segs.sort();
    Ok(segs)
}

/// One line of a segment: its byte range (newline excluded) and what it
/// decodes to.
struct Line {
    start: usize,
    next: usize,
    complete: bool,
    parsed: Result<Record, String>,
}

fn split_lines(data: &[u8]) -> Vec<Line> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < data.len() {
        let end = data[pos..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|i| pos + i);
        let bytes = &data[pos..end.unwrap_or(data.len())];
        let next = end.map_or(data.len(), |e| e + 1);
        let parsed = if end.is_none() {
            Err("the line is incomplete".to_string())
        } else {
            decode(bytes)
        };
        out.push(Line {
            start: pos,
            next,
            complete: end.is_some(),
            parsed,
        });
        pos = next;
    }
    out
}

/// Reads and checks every record under `dir` (read-only).
pub fn read_dir(dir: &Path) -> StoreResult<Contents> {
    let segs = list_segments(dir)
        .map_err(|e| StoreError::io(ErrorKind::DamagedJournal, "list journal", dir, e))?;
    // Taken before the reads: a change made while reading shows as one.
    let seen = Seen::of(&segs)
        .map_err(|e| StoreError::io(ErrorKind::DamagedJournal, "list journal", dir, e))?;
    let mut records: Vec<Record> = Vec::new();
    let mut last = (dir.join(segment_name(1)), 0u64, 0u64, 0usize);
    let nsegs = segs.len();
    for (si, seg) in segs.iter().enumerate() {
        let data = fs::read(seg)
            .map_err(|e| StoreError::io(ErrorKind::DamagedJournal, "read journal", seg, e))?;
        let is_last_seg = si + 1 == nsegs;
        let mut lines = split_lines(&data);
        let mut valid_len = 0usize;
        let mut torn_lines = 0usize;
        for i in 0..lines.len() {
            let expect = records.last().map_or(1, |r| r.seq + 1);
            if lines[i].parsed.as_ref().is_ok_and(|r| r.seq == expect) {
                let taken = std::mem::replace(&mut lines[i].parsed, Err(String::new()));
                records.extend(taken.ok());
                valid_len = lines[i].next;
                continue;
            }
            let line = &lines[i];
            let why = match &line.parsed {
                Ok(rec) => format!("sequence number {} where {expect} was expected", rec.seq),
                Err(why) => why.clone(),
            };
            // The first bad line: a torn tail unless a record from here on
            // says record `expect` had been made durable.
            let vouched = lines[i..].iter().position(|l| {
                l.parsed
                    .as_ref()
                    .is_ok_and(|r| r.acked_through.is_none_or(|a| a >= expect))
            });
            if !is_last_seg || vouched.is_some() {
                let why = match vouched {
                    Some(k) => format!(
                        "{why} (line {} says record {expect} was already durable)",
                        i + k + 1
                    ),
                    None => why,
                };
                return Err(damaged(seg, i + 1, &why));
            }
            torn_lines = lines[i..].iter().filter(|l| l.complete).count();
            debug_assert_eq!(line.start, valid_len);
            break;
        }
        last = (
            seg.clone(),
            valid_len as u64,
            (data.len() - valid_len) as u64,
            torn_lines,
        );
    }
    Ok(Contents {
        records,
        segment: last.0,
        valid_len: last.1,
        torn_bytes: last.2,
        torn_lines: last.3,
        seen,
    })
}

/// Copies the torn tail to `torn-<seq>-<ns>` beside the segment, durably,
/// before it is cut off: damaged data is set aside, never deleted.
fn set_aside_torn_tail(
    contents: &Contents,
    file: &File,
    dir: &Path,
    io: &StoreIo,
) -> StoreResult<()> {
    let seq = contents.records.last().map_or(0, |r| r.seq) + 1;
    let aside = dir.join(format!("torn-{seq}-{}", crate::time::now_ns()));
    let mut tail = vec![0u8; contents.torn_bytes as usize];
    file.read_exact_at(&mut tail, contents.valid_len)
        .map_err(|e| StoreError::io(ErrorKind::Store, "read journal", &contents.segment, e))?;
    let copy = crate::store::fsutil::options()
        .write(true)
        .create_new(true)
        .open(&aside)
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

fn damaged(seg: &Path, lineno: usize, why: &str) -> StoreError {
    StoreError::refused(
        ErrorKind::DamagedJournal,
        seg,
        format!(
            "journal '{}' is damaged at line {lineno}: {why}; refusing to continue \
             (nothing was changed)",
            seg.display()
        ),
    )
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
    /// Opens for appending after [`read_dir`]; sets a torn tail aside and
    /// cuts it off.
    pub fn open(contents: &Contents) -> StoreResult<Journal> {
        Journal::open_with(contents, StoreIo::real())
    }

    /// [`Journal::open`] making things durable through `io`.
    pub fn open_with(contents: &Contents, io: StoreIo) -> StoreResult<Journal> {
        let path = contents.segment.clone();
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let file = crate::store::fsutil::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io(ErrorKind::Store, "open journal", &path, e))?;
        // What a killed daemon left in the page cache (records, the blobs
        // they name, the live files it swapped in, the store's directories
        // and this segment's own entry) is made durable before any record
        // of ours is: one commit of the whole filesystem. The store is on
        // ROOT's filesystem, so this covers the live tree too.
        io.syncfs(&file, &path)
            .map_err(|e| StoreError::io(ErrorKind::Store, "sync the filesystem of", &path, e))?;
        if contents.torn_bytes > 0 {
            set_aside_torn_tail(contents, &file, &dir, &io)?;
            file.set_len(contents.valid_len)
                .and_then(|()| io.sync_all(&file, &path))
                .map_err(|e| StoreError::io(ErrorKind::Store, "truncate journal", &path, e))?;
        }
        let last = contents.records.last().map_or(0, |r| r.seq);
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
            match crate::sys::reserve(&*self.file, self.len, want) {
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
            acked_through: Some(self.durable_through),
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
    use super::*;

    fn rec(seq: u64) -> Record {
        Record {
            seq,
            ts: 1_796_062_170_000_000_000,
            op: Op::Write,
            path: RelPath::parse(b"cat/foo/SKILL.md").unwrap(),
            to: None,
            noreplace: false,
            hidden: None,
            state: Some(EntryState {
                kind: Kind::File,
                blob: Some("ab".repeat(32)),
                size: 5,
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime_ns: 5,
                target: None,
            }),
            actor: Actor {
                uid: 0,
                pid: 1,
                comm: "python3".into(),
            },
            acked_through: Some(seq.saturating_sub(1)),
        }
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("skillfs-journal-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// The bitwise CRC-32 the journal was first written with.
    fn crc32_bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = (crc >> 1) ^ (CRC32_POLY & (!(crc & 1)).wrapping_add(1));
            }
        }
        !crc
    }

    #[test]
    fn crc32_matches_reference() {
        // The check value of CRC-32/ISO-HDLC, and of the empty input.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        // Table entries known from zlib's table.
        assert_eq!(
            (CRC32_TABLE[0], CRC32_TABLE[1], CRC32_TABLE[255]),
            (0, 0x7707_3096, 0x2D02_EF8D)
        );
    }

    #[test]
    fn crc32_table_agrees_with_the_bitwise_form() {
        // Every single byte, every length up to 300 of a byte pattern, and
        // a whole encoded record (what existing journals carry).
        for b in 0..=255u8 {
            assert_eq!(crc32(&[b]), crc32_bitwise(&[b]), "byte {b}");
        }
        let data: Vec<u8> = (0..300u32).map(|i| (i * 31 + 7) as u8).collect();
        for n in 0..=data.len() {
            assert_eq!(crc32(&data[..n]), crc32_bitwise(&data[..n]), "length {n}");
        }
        let line = encode(&rec(7));
        assert_eq!(crc32(&line), crc32_bitwise(&line));
    }

    #[test]
    fn encode_decode_round_trip() {
        let r = rec(7);
        let line = encode(&r);
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(decode(&line[..line.len() - 1]).unwrap(), r);
        let mut bad = line.clone();
        bad[10] ^= 1;
        assert!(decode(&bad[..bad.len() - 1]).is_err());
    }

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
        let mut j = Journal::open(&c).unwrap();
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
    fn contents_read_before_the_lock_are_used_only_while_current() {
        let d = dir("current");
        let empty = read_dir(&d).unwrap();
        assert!(empty.is_current());
        let mut j = Journal::open(&empty).unwrap();
        // The segment was made: what was read of the empty journal is not
        // the journal any more.
        assert!(!empty.is_current());
        j.append(
            Change::new(Op::Unlink, RelPath::parse(b"x").unwrap(), None),
            rec(0).actor,
            1,
        )
        .unwrap();
        let c = read_dir(&d).unwrap();
        assert!(c.is_current());
        j.append(
            Change::new(Op::Unlink, RelPath::parse(b"y").unwrap(), None),
            rec(0).actor,
            1,
        )
        .unwrap();
        assert!(!c.is_current(), "an append is a change");
        fs::remove_dir_all(&d).unwrap();
    }

    /// Six records; syncs after 2 and after 4, so records 3-4 say 2 was
    /// durable and 5-6 say 4 was.
    fn watermarked() -> (Vec<u8>, Vec<(usize, usize)>) {
        let mut data = Vec::new();
        let mut lines = Vec::new();
        for (seq, acked) in [(1, 0), (2, 0), (3, 2), (4, 2), (5, 4), (6, 4)] {
            let mut r = rec(seq);
            r.acked_through = Some(acked);
            let start = data.len();
            data.extend(encode(&r));
            lines.push((start, data.len()));
        }
        (data, lines)
    }

    /// The recovery rule at every byte: a cut anywhere never refuses;
    /// zeroed or flipped bytes refuse exactly when a later intact record
    /// says the damaged one was durable, and otherwise keep every record
    /// before the damage.
    #[test]
    fn torn_tail_or_damage_at_every_byte() {
        let d = dir("every-byte");
        let seg = d.join(segment_name(1));
        let (good, lines) = watermarked();
        let acked = [0u64, 0, 2, 2, 4, 4];
        let line_of = |b: usize| lines.iter().position(|&(s, e)| s <= b && b < e).unwrap();
        let check = |data: &[u8], what: &str, lo: usize, hi: usize| {
            fs::write(&seg, data).unwrap();
            let got = read_dir(&d);
            assert_eq!(fs::read(&seg).unwrap(), data, "read_dir changed the file");
            if what == "cut" {
                let whole = lines.iter().filter(|&&(_, e)| e <= lo).count();
                let c = got.unwrap_or_else(|e| panic!("cut at {lo} refused: {e}"));
                assert_eq!(c.records.len(), whole, "cut at {lo}");
                assert_eq!(
                    c.valid_len as usize,
                    lines.get(whole).map_or(good.len(), |l| l.0)
                );
                return;
            }
            let f = line_of(lo);
            // A record is intact if neither it nor the newline before it
            // was touched.
            let intact = |k: usize| {
                let from = lines[k].0.saturating_sub(1);
                hi <= from || lo >= lines[k].1
            };
            let vouched = (f + 1..lines.len()).any(|k| intact(k) && acked[k] > f as u64);
            match got {
                Err(e) => {
                    assert!(
                        vouched,
                        "{what} at {lo}: refused an unacknowledged tail: {e}"
                    );
                    assert_eq!(e.kind(), ErrorKind::DamagedJournal);
                    assert!(e.to_string().contains(&format!("line {}", f + 1)), "{e}");
                }
                Ok(c) => {
                    assert!(
                        !vouched,
                        "{what} at {lo}: damage to a durable record passed"
                    );
                    assert!(f >= 4, "{what} at {lo}: record {} was acknowledged", f + 1);
                    assert_eq!(c.records.len(), f, "{what} at {lo}");
                    assert_eq!(
                        c.records,
                        (1..=f as u64)
                            .map(|s| {
                                let mut r = rec(s);
                                r.acked_through = Some(acked[s as usize - 1]);
                                r
                            })
                            .collect::<Vec<_>>()
                    );
                    assert_eq!(c.valid_len as usize + c.torn_bytes as usize, data.len());
                }
            }
        };
        for off in 0..good.len() {
            check(&good[..off], "cut", off, good.len());
            let mut flipped = good.clone();
            flipped[off] ^= 0x20;
            check(&flipped, "flip", off, off + 1);
            let mut zeroed = good.clone();
            let hi = (off + 16).min(good.len());
            zeroed[off..hi].fill(0);
            check(&zeroed, "zero-fill", off, hi);
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn records_without_a_watermark_vouch_for_everything_before() {
        // Written before `acked_through` existed: a bad line followed by
        // one of them is damage, as it always was; a bad last line is torn.
        let d = dir("old");
        let seg = d.join(segment_name(1));
        let old = |s| {
            let mut r = rec(s);
            r.acked_through = None;
            encode(&r)
        };
        let line = old(1);
        assert!(!String::from_utf8_lossy(&line).contains("acked_through"));
        let mut data = [old(1), old(2), old(3)].concat();
        fs::write(&seg, &data).unwrap();
        assert_eq!(read_dir(&d).unwrap().records.len(), 3);
        data[line.len() + 5] ^= 1;
        fs::write(&seg, &data).unwrap();
        assert!(read_dir(&d).is_err());
        let mut data = [old(1), old(2), old(3)].concat();
        let n = data.len();
        data[n - 5] ^= 1;
        fs::write(&seg, &data).unwrap();
        assert_eq!(read_dir(&d).unwrap().records.len(), 2);
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
        let mut j = Journal::open(&c).unwrap();
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
