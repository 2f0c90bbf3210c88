//! Reading a journal directory at mount: its segments in order, every line
//! checked, and the first bad line judged torn tail or damage.
//!
//! Invariants:
//! - reading changes nothing: a torn tail is only measured here, and set
//!   aside and cut off by `Journal::open`;
//! - the first bad line (incomplete, failing its checksum, or out of
//!   sequence) decides: if a later intact record says it was durable
//!   (`acked_through` at or past it, or a record without the watermark), it
//!   is damage, reported with its file and line number, and nothing is
//!   changed; otherwise everything from it on was never made durable, only
//!   partly written when the machine died: it is a torn tail, set aside in
//!   `journal/torn-<seq>-<ns>` and cut off. A bad record that was made
//!   durable and then damaged, with no later record to vouch for it, cannot
//!   be told from a torn one: it is set aside (never deleted) with a warning.
//! - the journal is read once per mount ([`read_dir`], before anything is
//!   created); the read is used after the store's lock is taken only if
//!   [`Contents::is_current`] says no segment changed in between;
//! - segments are listed, checked and read from the held fd of `journal/`
//!   ([`read_in`]; [`read_dir`] opens it by path first), never through a
//!   symlink.
//!
//! Locks: none; it reads files only.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::encoding::decode;
use super::record::Record;
use crate::dir::Dir;
use crate::error::{ErrorKind, StoreError, StoreResult};

/// Everything read from a journal directory.
pub struct Contents {
    /// The records read, in order: every one, or those after `base_seq`
    /// (a read after a checkpoint, [`read_in_after`]).
    pub records: Vec<Record>,
    /// The records before these, folded in a checkpoint (0: none).
    pub base_seq: u64,
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
struct Seen(Vec<(String, u64, i64, i64, i64, i64, i64)>);

impl Seen {
    fn of(dir: &Dir, segs: &[String]) -> io::Result<Seen> {
        let mut out = Vec::with_capacity(segs.len());
        for s in segs {
            let m = dir.lstat(s)?;
            out.push((
                s.clone(),
                m.st_ino,
                m.st_size,
                m.st_mtime,
                m.st_mtime_nsec,
                m.st_ctime,
                m.st_ctime_nsec,
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
        Dir::open_path(dir).is_ok_and(|d| self.is_current_in(&d))
    }

    /// [`Contents::is_current`], of the journal held open as `dir`.
    pub fn is_current_in(&self, dir: &Dir) -> bool {
        list_segments(dir)
            .and_then(|segs| Seen::of(dir, &segs))
            .is_ok_and(|now| now == self.seen)
    }

    /// The id of the last record read (or folded in the checkpoint).
    pub fn last_seq(&self) -> u64 {
        self.records.last().map_or(self.base_seq, |r| r.seq)
    }

    /// The name of the segment appended to, in `journal/`.
    pub fn segment_name(&self) -> &str {
        self.segment
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
    }
}

pub(super) fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}.jsonl")
}

/// The segments' names in `dir`, in order.
pub fn list_segments(dir: &Dir) -> io::Result<Vec<String>> {
    let mut segs: Vec<String> = dir
        .list()?
        .into_iter()
        .filter_map(|e| String::from_utf8(e.name).ok())
        .filter(|n| n.ends_with(".jsonl") && n.len() > ".jsonl".len())
        .collect();
    segs.sort();
    Ok(segs)
}

/// One line of a segment: its byte range (newline excluded) and what it
/// decodes to.
pub(super) struct Line {
    pub(super) start: usize,
    pub(super) next: usize,
    pub(super) complete: bool,
    pub(super) parsed: Result<Record, String>,
}

/// Splits `data` into lines and decodes each. A large segment is cut at
/// line boundaries into one piece per core, decoded side by side (the CRC
/// and the JSON of a year's journal are most of a mount's start-up); the
/// lines come back in order, as one pass would give them.
pub(super) fn split_lines(data: &[u8]) -> Vec<Line> {
    const PIECE_MIN: usize = 1 << 20;
    let n = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(data.len() / PIECE_MIN)
        .max(1);
    if n == 1 {
        return split_piece(data, 0, data.len());
    }
    let mut cuts = vec![0usize];
    for k in 1..n {
        let from = (data.len() * k / n).max(*cuts.last().unwrap_or(&0));
        let cut = data[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(data.len(), |i| from + i + 1);
        cuts.push(cut);
    }
    cuts.push(data.len());
    std::thread::scope(|s| {
        let pieces: Vec<_> = cuts
            .windows(2)
            .map(|w| {
                let (lo, hi) = (w[0], w[1]);
                s.spawn(move || split_piece(data, lo, hi))
            })
            .collect();
        let mut out = Vec::new();
        for p in pieces {
            // A decode panics only on a bug; carry it to the caller.
            out.extend(p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        out
    })
}

/// The lines of `data[lo..hi]` (`lo` at a line's start), offsets into
/// `data`.
fn split_piece(data: &[u8], lo: usize, hi: usize) -> Vec<Line> {
    let mut out = Vec::new();
    let mut pos = lo;
    while pos < hi {
        let end = data[pos..hi]
            .iter()
            .position(|&b| b == b'\n')
            .map(|i| pos + i);
        let bytes = &data[pos..end.unwrap_or(hi)];
        let next = end.map_or(hi, |e| e + 1);
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

/// Reads and checks every record under `dir` (read-only), opened by path
/// (never through a symlink; see [`read_in`]).
pub fn read_dir(dir: &Path) -> StoreResult<Contents> {
    let held = Dir::open_path(dir)
        .map_err(|e| StoreError::io(ErrorKind::DamagedJournal, "list journal", dir, e))?;
    read_in(&held)
}

/// Reads and checks every record in the journal directory held open as
/// `dir` (read-only).
pub fn read_in(dir: &Dir) -> StoreResult<Contents> {
    read_from(dir, None).map(|c| c.expect("a read from the start always applies"))
}

/// Where a checkpoint says its records end: the first segment's name, the
/// length of the records it folded, the CRC-32 of those bytes, and the
/// last of their ids.
pub struct After<'a> {
    pub segment: &'a str,
    pub offset: u64,
    pub prefix_crc: u32,
    pub seq: u64,
}

/// [`read_in`] of only the records after `after`: `None` if it does not
/// apply (the segment is not the first, is shorter, or its first `offset`
/// bytes are not the ones the checkpoint folded: their CRC differs). The
/// records before it are then neither decoded nor in the contents
/// (`base_seq` says how many).
pub fn read_in_after(dir: &Dir, after: &After) -> StoreResult<Option<Contents>> {
    read_from(dir, Some(after))
}

/// A segment's bytes, read from the held `journal/`. Never blocks on a
/// FIFO put in its place (opened `O_NONBLOCK`, and only a regular file is
/// read), and a size no memory holds (a sparse file claiming 50 GiB) is an
/// error, not an abort.
pub(super) fn read_segment(dir: &Dir, name: &str) -> io::Result<Vec<u8>> {
    let mut f = dir.open(name, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    let md = f.metadata()?;
    if !md.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let too_big = || {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("{} bytes, more than this machine's memory holds", md.len()),
        )
    };
    if md.len() > skillfs_base::sys::phys_memory() {
        return Err(too_big());
    }
    // Sized once: a year's segment grown by doubling is copied and
    // faulted in several times over.
    let mut data = Vec::new();
    let len = usize::try_from(md.len()).map_err(|_| too_big())?;
    data.try_reserve_exact(len.saturating_add(1))
        .map_err(|_| too_big())?;
    f.read_to_end(&mut data)?;
    Ok(data)
}

fn read_from(dir: &Dir, after: Option<&After>) -> StoreResult<Option<Contents>> {
    let segs = list_segments(dir)
        .map_err(|e| StoreError::io(ErrorKind::DamagedJournal, "list journal", dir.path(), e))?;
    if after.is_some_and(|a| segs.first().map(String::as_str) != Some(a.segment)) {
        return Ok(None);
    }
    // Taken before the reads: a change made while reading shows as one.
    let seen = Seen::of(dir, &segs)
        .map_err(|e| StoreError::io(ErrorKind::DamagedJournal, "list journal", dir.path(), e))?;
    let mut records: Vec<Record> = Vec::new();
    let base_seq = after.map_or(0, |a| a.seq);
    let mut last = (dir.join(&segment_name(1)), 0u64, 0u64, 0usize);
    let nsegs = segs.len();
    for (si, name) in segs.iter().enumerate() {
        let seg = &dir.join(name);
        let data = read_segment(dir, name)
            .map_err(|e| StoreError::io(ErrorKind::DamagedJournal, "read journal", seg, e))?;
        let is_last_seg = si + 1 == nsegs;
        // A checkpoint's bytes are checked whole, not decoded.
        let start = match after {
            Some(a) if si == 0 => {
                let off = usize::try_from(a.offset).unwrap_or(usize::MAX);
                let whole = off <= data.len()
                    && (off == 0 || data[off - 1] == b'\n')
                    && super::encoding::crc32(&data[..off]) == a.prefix_crc;
                if !whole {
                    return Ok(None);
                }
                off
            }
            _ => 0,
        };
        let mut lines = split_lines(&data[start..]);
        for l in &mut lines {
            l.start += start;
            l.next += start;
        }
        // The records after a checkpoint must follow on from it: a whole
        // record with another id says the checkpoint is not this
        // journal's (its bytes matched by chance or by craft), and it is
        // not used; never a torn tail to cut off.
        if after.is_some()
            && si == 0
            && lines
                .first()
                .and_then(|l| l.parsed.as_ref().ok())
                .is_some_and(|r| r.seq != base_seq + 1)
        {
            return Ok(None);
        }
        // The line numbers of messages count the lines not decoded.
        let skipped = || data[..start].iter().filter(|&&b| b == b'\n').count();
        // Grown once: a year's records moved by doubling are copied and
        // faulted in several times over.
        records.reserve(lines.len());
        let mut valid_len = start;
        let mut torn_lines = 0usize;
        for i in 0..lines.len() {
            let expect = records.last().map_or(base_seq + 1, |r| r.seq + 1);
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
                let base = skipped();
                let why = match vouched {
                    Some(k) => format!(
                        "{why} (line {} says record {expect} was already durable)",
                        base + i + k + 1
                    ),
                    None => why,
                };
                return Err(damaged(seg, base + i + 1, &why));
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
    Ok(Some(Contents {
        records,
        base_seq,
        segment: last.0,
        valid_len: last.1,
        torn_bytes: last.2,
        torn_lines: last.3,
        seen,
    }))
}

fn damaged(seg: &Path, lineno: usize, why: &str) -> StoreError {
    StoreError::refused(
        ErrorKind::DamagedJournal,
        seg,
        format!(
            "journal '{}' is damaged at line {lineno}: {why}; refusing to continue \
             (nothing was changed); `skillfs verify` lists the damage, and `skillfs repair` \
             keeps every sound record and sets the damaged lines aside",
            seg.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Journal;
    use crate::journal::encoding::encode;
    use crate::journal::fixtures::{dir, rec, watermarked};
    use crate::journal::record::{Change, Op};
    use skillfs_base::relpath::RelPath;
    use std::fs;

    #[test]
    fn contents_read_before_the_lock_are_used_only_while_current() {
        let d = dir("current");
        let empty = read_dir(&d).unwrap();
        assert!(empty.is_current());
        let mut j = Journal::open_with(&empty, crate::durable::StoreIo::real()).unwrap();
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
}
