//! The checkpoint: the history index as a clean unmount left it, so that
//! the next mount loads it instead of decoding and folding every record
//! again (a year's journal, a million records, is seconds of JSON).
//!
//! `journal/checkpoint` holds, after a magic and a version: the last id it
//! folded, the first segment's name, the length of the records it folded
//! (`offset`) and the CRC-32 of those bytes, the index (`history::codec`),
//! and a CRC-32 of everything before it.
//!
//! Invariants:
//! - a checkpoint is only ever a shortcut: at mount it is used only if
//!   its own CRC holds, the journal's first segment still begins with the
//!   very bytes it folded (their CRC is checked, every byte read) and the
//!   records after them follow on; otherwise the journal is read whole,
//!   as without one. So a damaged, stale or foreign checkpoint costs time,
//!   never history, and `repair`, `import` or an edit of the journal
//!   simply make it unused;
//! - it is written only at unmount, after the journal is synced: a new file
//!   synced, renamed over the old, the directory synced;
//! - the records it folded are never decoded at mount: damage to them is
//!   found by the prefix CRC (then the whole read reports it) and by
//!   `skillfs verify`, which reads every line;
//! - only a journal of [`MIN_RECORDS`] or more gets one (smaller ones fold
//!   in milliseconds), and only when records were added since the last.
//!
//! Locks: none; the daemon writes it at shutdown, under the ledger's lock.

use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use crate::catalog::Fold;
use crate::history::HistoryIndex;
use skillfs_store::Dir;
use skillfs_store::error::StoreResult;
use skillfs_store::journal::{self, After, Contents, crc32, crc32_extend};

pub const NAME: &str = "checkpoint";
/// `02`: the index holds each change's recorded time, not its place in
/// time (a `01` checkpoint of a store with a change dated in the future
/// holds every later change at that date: it is not used, the journal is
/// read whole).
const MAGIC: &[u8; 8] = b"SKCKPT02";
/// Journals shorter than this fold fast enough without one.
pub const MIN_RECORDS: u64 = 20_000;

/// A checkpoint as read.
pub struct Checkpoint {
    pub seq: u64,
    pub segment: String,
    pub offset: u64,
    pub prefix_crc: u32,
    pub index: HistoryIndex,
}

/// The checkpoint in the journal directory `dir`, if there is a sound one.
pub fn load(dir: &Dir, notes: &mut Vec<String>) -> Option<Checkpoint> {
    // Never blocks on a FIFO put in its place, and reads no more than a
    // checkpoint of the journal there could be: its index is smaller than
    // the records it folds (binary against JSON), so the segments' size
    // (and a margin) bounds it.
    let f = dir.open(NAME, libc::O_RDONLY | libc::O_NONBLOCK, 0).ok()?;
    let md = f.metadata().ok()?;
    let journal: u64 = journal::list_segments(dir)
        .ok()?
        .iter()
        .filter_map(|n| dir.lstat(n).ok())
        .map(|st| st.st_size.max(0) as u64)
        .sum();
    if !md.is_file() || md.len() > journal.saturating_add(1 << 20) {
        notes.push(format!(
            "journal/{NAME} is not a file of a checkpoint's size: the journal is read whole"
        ));
        return None;
    }
    let mut data = Vec::with_capacity(md.len() as usize);
    (&f).take(md.len()).read_to_end(&mut data).ok()?;
    let (body, crc) = data.split_at_checked(data.len().checked_sub(4)?)?;
    if crc32(body) != u32::from_le_bytes(crc.try_into().ok()?) {
        notes.push(format!(
            "journal/{NAME} fails its checksum: the journal is read whole"
        ));
        return None;
    }
    let Some(rest) = body.strip_prefix(MAGIC) else {
        notes.push(format!(
            "journal/{NAME} is of another version: the journal is read whole"
        ));
        return None;
    };
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    let seq = u64_at(rest, 0)?;
    let offset = u64_at(rest, 8)?;
    let prefix_crc = u32::from_le_bytes(rest.get(16..20)?.try_into().ok()?);
    let name_len = usize::from(u16::from_le_bytes(rest.get(20..22)?.try_into().ok()?));
    let segment = std::str::from_utf8(rest.get(22..22 + name_len)?)
        .ok()?
        .to_string();
    let index = HistoryIndex::decode(rest.get(22 + name_len..)?)?;
    (index.last() == seq).then_some(Checkpoint {
        seq,
        segment,
        offset,
        prefix_crc,
        index,
    })
}

/// [`MIN_RECORDS`], or `SKILLFS_CHECKPOINT_MIN` from the environment (the
/// tests' way to have small journals checkpointed).
pub fn min_records() -> u64 {
    std::env::var("SKILLFS_CHECKPOINT_MIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MIN_RECORDS)
}

/// Writes the checkpoint of `index` (which folded every record of the
/// segment `segment`'s first `len` bytes, read from `file`) into `dir`,
/// durably through `io`.
pub fn write(
    dir: &Dir,
    io: &skillfs_store::durable::StoreIo,
    index: &HistoryIndex,
    segment: &str,
    file: &std::fs::File,
    len: u64,
) -> io::Result<()> {
    // The CRC of what the index folded, read back from the segment.
    let mut crc = 0u32;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < len {
        let want = usize::try_from((len - off).min(buf.len() as u64)).unwrap_or(buf.len());
        let n = file.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the journal is shorter than its records",
            ));
        }
        crc = crc32_extend(crc, &buf[..n]);
        off += n as u64;
    }
    let name = segment.as_bytes();
    let name_len = u16::try_from(name.len()).map_err(io::Error::other)?;
    let mut out = Vec::with_capacity(64 + name.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&index.last().to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&name_len.to_le_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(&index.encode());
    let sum = crc32(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    // What an earlier write killed midway left (`Dir::replace`'s names).
    for e in dir.list().unwrap_or_default() {
        if let Ok(n) = std::str::from_utf8(&e.name)
            && n.starts_with(&format!(".{NAME}.new."))
        {
            let _ = dir.unlink(n);
        }
    }
    dir.replace(NAME, &out, io)
}

/// The journal of `dir` as a mount reads it: after its checkpoint where
/// one applies (with the index it holds), else whole; what happened to the
/// checkpoint is said in `notes` (for the daemon's log, which is not open
/// yet).
pub fn read_for_mount(
    dir: &Dir,
    notes: &mut Vec<String>,
) -> StoreResult<(Contents, Option<HistoryIndex>)> {
    if let Some(cp) = load(dir, notes) {
        let after = After {
            segment: &cp.segment,
            offset: cp.offset,
            prefix_crc: cp.prefix_crc,
            seq: cp.seq,
        };
        match journal::read_in_after(dir, &after)? {
            Some(contents) => {
                notes.push(format!(
                    "journal: records 1-{} from the checkpoint, {} read after it",
                    cp.seq,
                    contents.records.len()
                ));
                return Ok((contents, Some(cp.index)));
            }
            None => notes.push(format!(
                "journal/{NAME} does not match the journal (changed since): it is read whole"
            )),
        }
    }
    Ok((journal::read_in(dir)?, None))
}

/// The fold a mount starts from: the checkpoint's index with the records
/// after it, or every record.
pub fn fold(base: Option<HistoryIndex>, records: Vec<skillfs_store::journal::Record>) -> Fold {
    match base {
        Some(index) => {
            let mut fold = Fold::from_history(index);
            for r in records {
                fold.apply_owned(r);
            }
            fold
        }
        None => Fold::replay_owned(records),
    }
}
