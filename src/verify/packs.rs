//! `verify`'s reading of the packs: every entry through `packs::format`,
//! chunked contents checked against their chunks, and what only the
//! journal can judge (a hole a power cut may have left) kept for it.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::{Progress, Report, open_ro};
use crate::relpath::hex;
use crate::store::Layout;
use crate::store::journal::Record;
use crate::store::packs::format::{self, Codec, HEADER, Header, RawId};
use crate::store::packs::{find_magic, pack_number};

/// Where an entry that is a chunk's content is: the pack (an index into
/// the opened packs), its header and where its body starts.
type Located = (usize, Header, u64);

/// What the packs hold that only the journal can judge: a stretch that is
/// no valid entry is damage, unless a power cut explains it (see
/// `PackFindings::judge`).
#[derive(Default)]
pub(super) struct PackFindings {
    /// (what to say, the pack, where the stretch ends).
    holes: Vec<(String, usize, u64)>,
    /// Chunked contents with a chunk missing: (what to say, the content).
    incomplete: Vec<(String, RawId)>,
    /// Where each entry is: (the pack, its offset).
    at: std::collections::HashMap<RawId, Vec<(usize, u64)>>,
    /// The chunks each chunked content lists.
    lists: std::collections::HashMap<RawId, Vec<RawId>>,
}

impl PackFindings {
    /// A pack is synced whole before a record naming any of its entries
    /// is acknowledged, so a stretch that is no valid entry, with no
    /// content an acknowledged record names stored after it, can be bytes
    /// the disk never wrote before a power cut (unsynced blocks are
    /// written in any order): a note, not a problem. Likewise a chunked
    /// content with a chunk missing that no acknowledged record names.
    /// Without a journal every such finding is a problem.
    pub(super) fn judge(self, records: Option<&[Record]>, r: &mut Report) {
        let acked: Option<HashSet<RawId>> = records.map(|records| {
            // Records past the last watermark were not yet known durable
            // (a store without watermarks: every record counts).
            let mark = records.iter().filter_map(|rec| rec.acked_through).max();
            records
                .iter()
                .filter(|rec| mark.is_none_or(|m| rec.seq <= m))
                .filter_map(|rec| rec.state.as_ref()?.blob.as_deref())
                .filter_map(crate::retention::prune::raw_of)
                .flat_map(|b| {
                    let chunks = self.lists.get(&b).cloned().unwrap_or_default();
                    std::iter::once(b).chain(chunks)
                })
                .collect()
        });
        let unsynced = "; no acknowledged version is stored after them, so they can be \
                        bytes a power cut left unwritten (never synced), not damage";
        for (msg, pack, end) in self.holes {
            let real = acked.as_ref().is_none_or(|acked| {
                acked.iter().any(|b| {
                    self.at
                        .get(b)
                        .is_some_and(|v| v.iter().any(|&(p, off)| p == pack && off >= end))
                })
            });
            if real {
                r.problems.push(msg);
            } else {
                r.notes.push(format!("{msg}{unsynced}"));
            }
        }
        for (msg, id) in self.incomplete {
            if acked.as_ref().is_none_or(|acked| acked.contains(&id)) {
                r.problems.push(msg);
            } else {
                r.notes.push(format!(
                    "{msg}; no acknowledged version names it (a store cut short by a power \
                     cut)"
                ));
            }
        }
    }
}

pub(super) fn check_packs(
    layout: &Layout,
    full: bool,
    r: &mut Report,
    present: &mut HashSet<String>,
    progress: &mut Progress,
) -> PackFindings {
    let mut found = PackFindings::default();
    let dir = layout.blobs().join(crate::store::packs::PACKS);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return found;
    };
    let mut packs: Vec<(u32, bool, PathBuf)> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let (n, legacy) = pack_number(e.file_name().to_str()?)?;
            Some((n, legacy, e.path()))
        })
        .collect();
    // (A `.zpack` before a `.pack` of the same number; the daemon reads
    // only the first, and so does this.)
    packs.sort_by_key(|&(n, legacy, _)| (n, legacy));
    let mut seen = HashSet::new();
    packs.retain(|(n, _, path)| {
        let first = seen.insert(*n);
        if !first {
            r.problems.push(format!(
                "{}: pack number {n} is also a .zpack: this older pack is not read (rename it \
                 to a free number to read it)",
                path.display()
            ));
        }
        first
    });
    let mut files: Vec<(String, File)> = Vec::new();
    // Contents that can be chunks, and the chunked entries to check after.
    let mut located: std::collections::HashMap<RawId, Located> = Default::default();
    let mut chunked: Vec<(String, u64, Header, Vec<u8>)> = Vec::new();
    for (_, _, path) in packs {
        r.packs += 1;
        let name = format!(
            "blobs/packs/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        let file = match open_ro(&path) {
            Ok(f) => f,
            Err(e) => {
                r.problems.push(format!("{name}: cannot be read: {e}"));
                continue;
            }
        };
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut off = 0u64;
        let mut probe = [0u8; format::PROBE];
        while off + HEADER <= size {
            let got = file.read_at(&mut probe, off).unwrap_or(0);
            let header = Header::parse(&probe[..got]).filter(|h| off + HEADER + h.len <= size);
            let Some(h) = header else {
                // Damage, or a tail cut off by a crash: which, the next
                // entry (if any) tells.
                match next_entry(&file, off + 1, size) {
                    Some(next) => {
                        found.holes.push((
                            format!(
                                "{name}: {} bytes at offset {off} are not a valid entry \
                                 (damaged); a content stored there is lost from this pack",
                                next - off
                            ),
                            files.len(),
                            next,
                        ));
                        off = next;
                        continue;
                    }
                    None => {
                        r.notes.push(format!(
                            "{name}: {} bytes after offset {off} are not a whole entry (a crash \
                             while appending); ignored",
                            size - off
                        ));
                        off = size;
                        break;
                    }
                }
            };
            let id = hex(&h.id);
            let body = off + HEADER;
            let next = body + h.len;
            // A chunked entry's list is read whatever the mode: its chunks
            // are looked for below.
            if full || h.codec == Codec::Chunked {
                let mut data = vec![0u8; h.len as usize];
                let read = file.read_exact_at(&mut data, body).is_ok();
                r.bytes_read += h.len;
                found.at.entry(h.id).or_default().push((files.len(), off));
                if !read || !format::body_matches(&h, &data) {
                    r.problems.push(format!(
                        "{name}: the entry at offset {off} ({id}, {} bytes) does not match its \
                         hash",
                        h.size
                    ));
                    off = next;
                    continue;
                }
                if h.codec == Codec::Chunked {
                    chunked.push((name.clone(), off, h, data));
                    off = next;
                    continue;
                }
            }
            if !full {
                found.at.entry(h.id).or_default().push((files.len(), off));
            }
            located.entry(h.id).or_insert((files.len(), h, body));
            present.insert(id);
            r.pack_entries += 1;
            off = next;
            progress.show(&format!("{} pack entries", r.pack_entries), r.bytes_read);
        }
        if off < size {
            r.notes.push(format!(
                "{name}: {} bytes after offset {off} are not a whole entry; ignored",
                size - off
            ));
        }
        files.push((name, file));
    }
    // A chunked content is present when each of its chunks is; with
    // `--full`, its chunks together must also match its hash.
    for (name, off, h, body) in chunked {
        let id = hex(&h.id);
        let list = format::chunks(&h, &body).unwrap_or_default();
        found
            .lists
            .insert(h.id, list.iter().map(|&(c, _, _)| c).collect());
        let mut whole = Sha256::new();
        let mut problem = None;
        for (c, _, n) in &list {
            let Some(&(f, ch, at)) = located.get(c).filter(|l| l.1.size == *n as u64) else {
                problem = Some(format!("its chunk {} of {n} bytes is missing", hex(c)));
                break;
            };
            if full {
                let mut data = vec![0u8; ch.len as usize];
                match files[f]
                    .1
                    .read_exact_at(&mut data, at)
                    .map(|()| format::decode(&ch, &data))
                {
                    Ok(Ok(content)) => whole.update(&content),
                    _ => {
                        problem = Some(format!("its chunk {} cannot be read", hex(c)));
                        break;
                    }
                }
            }
        }
        if problem.is_none() && full && whole.finalize().as_slice() != h.id {
            problem = Some("its chunks do not make up its content".into());
        }
        match problem {
            Some(why) => found.incomplete.push((
                format!(
                    "{name}: the chunked entry at offset {off} ({id}, {} bytes): {why}",
                    h.size
                ),
                h.id,
            )),
            None => {
                present.insert(id);
                r.pack_entries += 1;
            }
        }
    }
    found
}

/// The offset of the next well-formed entry after `from`.
fn next_entry(file: &File, from: u64, size: u64) -> Option<u64> {
    let mut at = from;
    loop {
        let off = find_magic(file, at, size)?;
        let mut probe = [0u8; format::PROBE];
        let got = file.read_at(&mut probe, off).unwrap_or(0);
        if let Some(h) = Header::parse(&probe[..got]).filter(|h| off + HEADER + h.len <= size) {
            let mut data = vec![0u8; h.len as usize];
            if file.read_exact_at(&mut data, off + HEADER).is_ok()
                && format::body_matches(&h, &data)
            {
                return Some(off);
            }
        }
        at = off + 1;
    }
}
