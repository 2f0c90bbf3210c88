//! The scan of the packs at open: every pack's entries read into the
//! index, a tail cut off by a crash ignored, and the entries after a
//! damaged stretch found again (only one whose content matches its hash
//! counts as the next entry). The invariants are `packs`'s.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{
    Entry, HEADER, Header, Index, Packs, RawId, format, legacy_pack_name, pack_name, pack_number,
};

impl Packs {
    /// Reads every pack's entries into an index. Runs under the index's
    /// lock: it names packs itself (never `path` or `open_pack`).
    pub(super) fn scan(&self) -> Index {
        let mut index = Index::default();
        let Some(Ok((dir, rd))) = self
            .packs_dir(false)
            .ok()
            .flatten()
            .map(|(d, _)| d.list().map(|l| (d, l)))
        else {
            return index;
        };
        let mut numbers: Vec<(u32, bool)> = rd
            .iter()
            .filter_map(|e| pack_number(std::str::from_utf8(&e.name).ok()?))
            .collect();
        // (A `.zpack` before a `.pack` of the same number.)
        numbers.sort_unstable();
        for (n, legacy) in numbers {
            let name = if legacy {
                legacy_pack_name(n)
            } else {
                pack_name(n)
            };
            let path = self.dir.join(&name);
            if legacy {
                // (A number both names have, a `.zpack` comes first; the
                // `.pack` was written by an earlier build after it.)
                if index.files.contains_key(&n) || dir.lstat(&pack_name(n)).is_ok() {
                    tracing::error!(
                        "{}: pack number {n} is also a .zpack; this older pack is not read \
                         (rename it to a free number to read it)",
                        path.display()
                    );
                    continue;
                }
                index.legacy.insert(n);
            }
            index.last = index.last.max(n);
            let Ok(file) = dir.read_file(&name) else {
                continue;
            };
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let mut off = 0u64;
            let mut probe = [0u8; format::PROBE];
            // Where a damaged stretch began, while looking for the entry
            // after it.
            let mut damaged_from: Option<u64> = None;
            while off + HEADER <= size {
                let got = file.read_at(&mut probe, off).unwrap_or(0);
                let entry = Header::parse(&probe[..got])
                    .filter(|h| off + HEADER + h.len <= size)
                    .map(|h| Entry::at(n, off, &h, false))
                    // Past damage only an entry whose content matches its
                    // hash is taken as the next one (a header-like run of
                    // bytes inside some content is not).
                    .filter(|e| {
                        let id = probe[4..36].try_into().expect("32 bytes");
                        damaged_from.is_none() || entry_matches(&file, &id, e)
                    });
                let Some(e) = entry else {
                    let from = *damaged_from.get_or_insert(off);
                    match find_magic(&file, off + 1, size) {
                        Some(next) => {
                            off = next;
                            continue;
                        }
                        None => {
                            off = from;
                            break;
                        }
                    }
                };
                if let Some(from) = damaged_from.take() {
                    tracing::error!(
                        "{}: {} bytes at offset {from} are not a valid entry (damaged); \
                         the entries after them were found again by scanning, and a \
                         content stored in the damaged bytes is lost from this pack",
                        path.display(),
                        off - from
                    );
                }
                let id: RawId = probe[4..36].try_into().expect("32 bytes");
                match index.entries.entry(id) {
                    std::collections::hash_map::Entry::Occupied(_) => {
                        index.spare_copies.entry(id).or_default().push(e)
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(e);
                    }
                }
                off = e.off + e.len;
            }
            if off < size {
                tracing::warn!(
                    "{}: {} bytes after offset {off} are not a whole entry and no entry \
                     follows them (cut off by a crash?); ignored",
                    path.display(),
                    size - off
                );
            }
            index.files.insert(n, Arc::new(file));
        }
        index
    }
}

/// Whether the entry `e` in `file` is whole (see `format::body_matches`).
pub(super) fn entry_matches(file: &File, id: &RawId, e: &Entry) -> bool {
    e.body(file)
        .is_ok_and(|body| format::body_matches(&e.header(id), &body))
}

/// The offset of the next entry's magic at or after `from` (and before
/// `size`).
pub fn find_magic(file: &File, from: u64, size: u64) -> Option<u64> {
    const STEP: usize = 1 << 20;
    let mut buf = vec![0u8; STEP + 4];
    let mut at = from;
    while at + 4 <= size {
        let want = ((size - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..want], at).ok()?;
        if let Some(i) = buf[..want].windows(4).position(format::is_magic) {
            return Some(at + i as u64);
        }
        // The last bytes again next time: a header may straddle.
        at += (want - 3) as u64;
    }
    None
}
