//! `skillfs repair`: a damaged journal made readable again, losing no id
//! and deleting nothing.
//!
//! Every line that decodes (CRC sound) and comes in sequence is kept as it
//! is; every id a damaged line (or a run of them) held is filled with a
//! `lost` record, so the ids stay gap-free and every record after the
//! damage keeps its id; a sound line out of sequence (a duplicate) is left
//! out. Each segment that changes is first copied whole, byte for byte, to
//! `journal/damaged-<segment>-<ns>` and synced; then the new segment is
//! written beside it, synced, renamed over it, and the directory synced.
//! A crash at any point leaves the old segment or the new one, and the
//! copy.
//!
//! Invariants: run only on a store no daemon holds (the caller takes the
//! store's lock); a journal that reads as sound is not touched; bad lines
//! at the very end of the last segment with no sound record after them
//! are a torn tail, which the mount itself sets aside: they are set aside
//! here the same way (kept in the copy, not filled).
//! Locks: the caller's store lock.

use std::io::{self, Write};

use super::encoding::encode;
use super::read::{list_segments, read_segment, split_lines};
use super::record::{Actor, Op, Record};
use crate::dir::Dir;
use crate::durable::StoreIo;
use skillfs_base::relpath::RelPath;

/// What a repair did.
#[derive(Default, Debug)]
pub struct Repaired {
    /// The copies set aside, by name in `journal/`.
    pub set_aside: Vec<String>,
    /// The ids filled with a `lost` record.
    pub lost: Vec<u64>,
    /// Sound records left out as out of sequence (duplicates).
    pub dropped: usize,
    pub kept: usize,
}

/// Repairs the journal held open as `dir` (see the module doc), making
/// each step durable through `io`.
pub fn repair(dir: &Dir, io: &StoreIo) -> io::Result<Repaired> {
    let mut done = Repaired::default();
    let segs = list_segments(dir)?;
    let mut expect = 1u64;
    let mut last_ts = 0i64;
    for (si, name) in segs.iter().enumerate() {
        let data = read_segment(dir, name)?;
        let lines = split_lines(&data);
        let is_last = si + 1 == segs.len();
        let mut out: Vec<u8> = Vec::with_capacity(data.len());
        let mut changed = false;
        for (i, line) in lines.iter().enumerate() {
            match &line.parsed {
                Ok(r) if r.seq == expect => {
                    out.extend_from_slice(&data[line.start..line.next]);
                    expect += 1;
                    last_ts = r.ts;
                    done.kept += 1;
                }
                Ok(r) if r.seq > expect => {
                    // The ids between were held by damaged lines.
                    for seq in expect..r.seq {
                        out.extend(encode(&lost(seq, last_ts)));
                        done.lost.push(seq);
                    }
                    out.extend_from_slice(&data[line.start..line.next]);
                    expect = r.seq + 1;
                    last_ts = r.ts;
                    done.kept += 1;
                    changed = true;
                }
                Ok(_) => {
                    done.dropped += 1;
                    changed = true;
                }
                Err(_) => {
                    // Filled when the next sound record comes; a tail with
                    // none after it (in the last segment) is torn, not lost.
                    let sound_after = lines[i + 1..].iter().any(|l| l.parsed.is_ok());
                    if !sound_after && is_last {
                        changed = true;
                        break;
                    }
                    changed = true;
                }
            }
        }
        if !changed {
            continue;
        }
        let ns = skillfs_base::time::now_ns();
        let aside = format!("damaged-{name}-{ns}");
        let mut copy = dir.create_new(&aside, 0o600)?;
        copy.write_all(&data)?;
        io.sync_all(&copy, &dir.join(&aside))?;
        let tmp = format!(".repair-{name}-{ns}");
        let mut new = dir.create_new(&tmp, 0o600)?;
        new.write_all(&out)?;
        io.sync_all(&new, &dir.join(&tmp))?;
        dir.rename(&tmp, dir, name, 0)?;
        dir.sync(io)?;
        done.set_aside.push(aside);
    }
    Ok(done)
}

/// The record that keeps id `seq` of a damaged one.
fn lost(seq: u64, ts: i64) -> Record {
    Record {
        seq,
        ts,
        op: Op::Lost,
        path: RelPath::root(),
        to: None,
        noreplace: false,
        hidden: None,
        state: None,
        actor: Actor {
            uid: skillfs_base::process::geteuid(),
            pid: std::process::id(),
            comm: "skillfs-repair".to_string(),
        },
        forgot: Vec::new(),
        acked_through: Some(seq),
        origin: None,
    }
}
