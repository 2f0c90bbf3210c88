//! `Journal`: the append-only record of every change, one JSON object a line.
//!
//! Line format: a JSON object whose last member is `"crc":"xxxxxxxx"`, the
//! CRC-32 of the line with that member removed. Sequence numbers start at 1
//! and have no gaps.
//!
//! Invariants:
//! - a line is appended with a single `write`; a failed or short append is
//!   cut off again, so a later record never follows a partial one;
//! - at open, a final line that is incomplete or fails its checksum was never
//!   acknowledged (it was being written when the process or machine died) and
//!   is dropped; a bad line anywhere else is damage, reported with its file
//!   and line number, and nothing is changed;
//! - a record is durable once [`Journal::sync`] returns.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Exit, Failure};
use crate::relpath::{ByteString, RelPath};
use crate::store::blobs::BlobId;
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
    let want = std::str::from_utf8(&suffix[8..16])
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

/// CRC-32 (IEEE 802.3), bitwise; records are short and this is not hot
/// next to the fsyncs around it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (!(crc & 1)).wrapping_add(1));
        }
    }
    !crc
}

/// Everything read from a journal directory.
pub struct Contents {
    pub records: Vec<Record>,
    /// The segment appended to, and the length of its valid prefix.
    pub segment: PathBuf,
    pub valid_len: u64,
    /// Bytes after `valid_len` that were dropped as a torn tail.
    pub torn_bytes: u64,
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

/// Reads and checks every record under `dir` (read-only).
pub fn read_dir(dir: &Path) -> Result<Contents, Failure> {
    let segs = list_segments(dir)
        .map_err(|e| Failure::io(Exit::DamagedJournal, "list journal", dir, &e))?;
    let mut records: Vec<Record> = Vec::new();
    let mut last = (dir.join(segment_name(1)), 0u64, 0u64);
    let nsegs = segs.len();
    for (si, seg) in segs.iter().enumerate() {
        let data = fs::read(seg)
            .map_err(|e| Failure::io(Exit::DamagedJournal, "read journal", seg, &e))?;
        let is_last_seg = si + 1 == nsegs;
        let mut pos = 0usize;
        let mut lineno = 0usize;
        let mut valid_len = 0usize;
        while pos < data.len() {
            lineno += 1;
            let end = data[pos..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| pos + i);
            let line = &data[pos..end.unwrap_or(data.len())];
            let next = end.map_or(data.len(), |e| e + 1);
            let at_tail = next >= data.len();
            let parsed = if end.is_none() {
                Err("the line is incomplete".to_string())
            } else {
                decode(line)
            };
            match parsed {
                Ok(rec) => {
                    let expect = records.last().map_or(1, |r| r.seq + 1);
                    if rec.seq != expect {
                        return Err(damaged(
                            seg,
                            lineno,
                            &format!("sequence number {} where {expect} was expected", rec.seq),
                        ));
                    }
                    records.push(rec);
                    valid_len = next;
                }
                Err(_) if at_tail && is_last_seg => break, // torn tail: never acknowledged
                Err(why) => return Err(damaged(seg, lineno, &why)),
            }
            pos = next;
        }
        last = (
            seg.clone(),
            valid_len as u64,
            (data.len() - valid_len) as u64,
        );
    }
    Ok(Contents {
        records,
        segment: last.0,
        valid_len: last.1,
        torn_bytes: last.2,
    })
}

fn damaged(seg: &Path, lineno: usize, why: &str) -> Failure {
    Failure::new(
        Exit::DamagedJournal,
        format!(
            "journal '{}' is damaged at line {lineno}: {why}; refusing to continue \
             (nothing was changed)",
            seg.display()
        ),
    )
}

/// The append side of the journal, owned by the mounted daemon.
pub struct Journal {
    file: File,
    path: PathBuf,
    len: u64,
    next_seq: u64,
    unsynced: bool,
}

impl Journal {
    /// Opens for appending after [`read_dir`]; cuts off a torn tail.
    pub fn open(contents: &Contents) -> Result<Journal, Failure> {
        let path = contents.segment.clone();
        let file = crate::store::fsutil::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Failure::io(Exit::BadStore, "open journal", &path, &e))?;
        if contents.torn_bytes > 0 {
            tracing::warn!(
                "dropping {} bytes of an incomplete last record in {}",
                contents.torn_bytes,
                path.display()
            );
            file.set_len(contents.valid_len)
                .and_then(|()| sys::fsync(&file))
                .map_err(|e| Failure::io(Exit::BadStore, "truncate journal", &path, &e))?;
        }
        Ok(Journal {
            file,
            path,
            len: contents.valid_len,
            next_seq: contents.records.last().map_or(1, |r| r.seq + 1),
            unsynced: false,
        })
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
        };
        let line = encode(&rec);
        if let Err(e) = self.file.write_all_at(&line, self.len) {
            let _ = self.file.set_len(self.len);
            return Err(e);
        }
        self.len += line.len() as u64;
        self.next_seq += 1;
        self.unsynced = true;
        Ok(rec)
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            sys::fdatasync(&self.file)?;
            self.unsynced = false;
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
            sys::write_out(&self.file)?;
        }
        Ok(())
    }

    /// The records written out were committed by the caller's `fsync`.
    pub fn mark_synced(&mut self) {
        self.unsynced = false;
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
        }
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("skillfs-journal-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn crc32_matches_reference() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
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
        assert_eq!(err.exit, Exit::DamagedJournal);
        assert!(err.message.contains("line 2"), "{}", err.message);
        assert_eq!(fs::read(&seg).unwrap(), data);
        fs::remove_dir_all(&d).unwrap();
    }
}
