//! A pack rewritten without its dead entries (`skillfs forget`'s prune):
//! its live entries copied into a new pack, the index switched to the
//! copies, then the old pack removed.
//!
//! Invariants:
//! - the new pack is written as `<n>.zpack.new` and renamed to `<n>.zpack`
//!   only once synced, its directory entry synced before the old pack is
//!   unlinked: at every instant each live content has a whole copy under
//!   a pack's name (a kill between leaves two copies, and the next scan
//!   takes the first as the one and the other as a spare);
//! - an entry whose content has another copy in another pack is not copied
//!   again (so a rerun after a kill converges instead of piling copies up);
//! - a content is copied only after it matched its hash: a damaged entry
//!   is read from a spare copy, and if none is sound the old pack is kept;
//!   a sound entry is copied as it is stored (compressed or not; a
//!   chunked one once its list of chunks is whole, as each chunk is an
//!   entry of its own that the caller keeps live with it);
//! - the pack being appended to is never rewritten (a prune seals it
//!   first, so its entries are rewritten too);
//! - the switch of the index is the caller's to guard (the blob store
//!   makes it atomic with its dedup check, so that a content found present
//!   and reused meanwhile is never dropped).
//!
//! Locks: `writer`, then `index`, each briefly; copying holds neither.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{Codec, Entry, Header, Packs, RawId, format, pack_name};
use crate::fsutil;

/// What to do with one pack.
pub struct Plan {
    pub pack: u32,
    /// Live entries with no other copy: copied.
    copy: Vec<(RawId, Entry)>,
    /// Live entries with a copy in another pack: pointed there.
    elsewhere: Vec<(RawId, Entry)>,
    /// Dead entries: dropped.
    pub dead: Vec<RawId>,
    /// The pack's size, for what a rewrite frees.
    pub size: u64,
}

/// A plan carried out up to the switch: the new pack is in place (or none
/// was needed).
pub struct Rewrite {
    plan: Plan,
    new: Option<NewPack>,
}

/// The pack a rewrite wrote: its number, file, entries and size.
struct NewPack {
    n: u32,
    file: Arc<std::fs::File>,
    placed: Vec<(RawId, Entry)>,
    size: u64,
}

impl Rewrite {
    /// Bytes the switch frees: the old pack less its replacement.
    pub fn freed(&self) -> u64 {
        self.plan
            .size
            .saturating_sub(self.new.as_ref().map_or(0, |n| n.size))
    }

    pub fn dead(&self) -> &[RawId] {
        &self.plan.dead
    }
}

impl Packs {
    /// Ends the pack being appended to (the next append starts another),
    /// so that a prune may rewrite it too.
    pub fn seal_writer(&self) {
        *self.writer.lock() = None;
    }

    /// Whether pack `n` is one the index reads (not removed by a rewrite).
    pub fn holds(&self, n: u32) -> bool {
        self.with_index(|ix| ix.files.contains_key(&n))
    }

    /// Every pack but the one being appended to.
    pub fn sealed(&self) -> Vec<u32> {
        let writing = self.writer.lock().as_ref().map(|w| w.n);
        let mut v: Vec<u32> = self.with_index(|ix| {
            ix.files
                .keys()
                .copied()
                .filter(|&n| Some(n) != writing)
                .collect()
        });
        v.sort_unstable();
        v
    }

    /// What a rewrite of pack `n` would do, by `live`; `None` if every
    /// entry is live (nothing to gain).
    pub fn plan(&self, n: u32, live: &dyn Fn(&RawId) -> bool) -> Option<Plan> {
        let size = self
            .with_index(|ix| ix.files.get(&n).and_then(|f| f.metadata().ok()))?
            .len();
        self.with_index(|ix| {
            let mut plan = Plan {
                pack: n,
                copy: Vec::new(),
                elsewhere: Vec::new(),
                dead: Vec::new(),
                size,
            };
            let mut seen = HashSet::new();
            let spares = ix
                .spare_copies
                .iter()
                .flat_map(|(id, v)| v.iter().map(move |e| (*id, *e)));
            let here: Vec<(RawId, Entry)> = ix
                .entries
                .iter()
                .map(|(id, e)| (*id, *e))
                .chain(spares)
                .filter(|(_, e)| e.pack == n)
                .collect();
            for (id, e) in here {
                if !seen.insert(id) {
                    continue;
                }
                if !live(&id) {
                    plan.dead.push(id);
                    continue;
                }
                let other = ix
                    .entries
                    .get(&id)
                    .into_iter()
                    .chain(ix.spare_copies.get(&id).into_iter().flatten())
                    .find(|o| o.pack != n)
                    .copied();
                match other {
                    Some(o) => plan.elsewhere.push((id, o)),
                    None => plan.copy.push((id, e)),
                }
            }
            let dup = ix.spare_copies.values().flatten().any(|e| e.pack == n);
            (!plan.dead.is_empty() || !plan.elsewhere.is_empty() || dup).then_some(plan)
        })
    }

    /// Writes the new pack of `plan` (none if nothing is copied) and makes
    /// it durable under its final name. Nothing is switched yet.
    pub fn write(&self, mut plan: Plan) -> io::Result<Rewrite> {
        // Another copy is relied on only once it is seen sound.
        let mut sound = Vec::with_capacity(plan.elsewhere.len());
        for (id, o) in std::mem::take(&mut plan.elsewhere) {
            let file = self.with_index(|ix| ix.files.get(&o.pack).cloned());
            let mine = self.with_index(|ix| {
                ix.entries
                    .get(&id)
                    .into_iter()
                    .chain(ix.spare_copies.get(&id).into_iter().flatten())
                    .find(|e| e.pack == plan.pack)
                    .copied()
            });
            match (file, mine) {
                (Some(f), _) if super::entry_matches(&f, &id, &o) => {
                    sound.push((id, Entry { checked: true, ..o }))
                }
                (_, Some(e)) => plan.copy.push((id, e)),
                (_, None) => {}
            }
        }
        plan.elsewhere = sound;
        if plan.copy.is_empty() {
            return Ok(Rewrite { plan, new: None });
        }
        let (dir, _) = self.packs_dir(true)?.expect("made");
        let old = self
            .with_index(|ix| ix.files.get(&plan.pack).cloned())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let n = self.next_number();
        let tmp = format!("{}.new", pack_name(n));
        let file = dir.create_new(&tmp, fsutil::SEALED_MODE)?;
        let result = (|| {
            let mut end = 0u64;
            let mut placed = Vec::with_capacity(plan.copy.len());
            for (id, e) in &plan.copy {
                let body = e.body(&old)?;
                let buf = if format::body_matches(&e.header(id), &body) {
                    let mut buf = format::encode_header(&e.header(id));
                    buf.extend_from_slice(&body);
                    buf
                } else if e.codec == Codec::Chunked {
                    // No spare copy of a list of chunks is looked for: the
                    // old pack is kept.
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a chunked entry's list of chunks is damaged",
                    ));
                } else {
                    // The index's copy is damaged: the checked read finds a
                    // sound one, or the pack is left as it is.
                    format::encode(id, &self.read(id)?)
                };
                file.write_all_at(&buf, end)?;
                let h = Header::parse(&buf[..format::PROBE.min(buf.len())]).expect("well formed");
                placed.push((*id, Entry::at(n, end, &h, true)));
                end += buf.len() as u64;
            }
            self.io.sync_data(&file, &dir.join(&tmp))?;
            dir.rename(&tmp, &dir, &pack_name(n), libc::RENAME_NOREPLACE)?;
            self.io.sync_dir(&dir)?;
            Ok((placed, end))
        })();
        match result {
            Ok((placed, end)) => Ok(Rewrite {
                plan,
                new: Some(NewPack {
                    n,
                    file: Arc::new(file),
                    placed,
                    size: end,
                }),
            }),
            Err(e) => {
                let _ = dir.unlink(&tmp);
                let _ = dir.unlink(&pack_name(n));
                Err(e)
            }
        }
    }

    /// Points the index at the new copies and forgets the old pack and its
    /// dead entries (the caller has checked that none is in use).
    pub fn switch(&self, rw: &Rewrite) {
        let old = rw.plan.pack;
        self.with_index(|ix| {
            if let Some(NewPack {
                n, file, placed, ..
            }) = &rw.new
            {
                ix.files.insert(*n, Arc::clone(file));
                for (id, e) in placed {
                    ix.entries.insert(*id, *e);
                }
            }
            for (id, other) in &rw.plan.elsewhere {
                if ix.entries.get(id).is_some_and(|e| e.pack == old) {
                    ix.entries.insert(*id, *other);
                }
            }
            for id in &rw.plan.dead {
                if ix.entries.get(id).is_some_and(|e| e.pack == old) {
                    ix.entries.remove(id);
                }
            }
            for v in ix.spare_copies.values_mut() {
                v.retain(|e| e.pack != old);
            }
            ix.spare_copies.retain(|_, v| !v.is_empty());
            // A dead entry's spare in another pack would be found again by
            // the next scan; here it is simply not used.
            for id in &rw.plan.dead {
                if !ix.entries.contains_key(id) {
                    ix.spare_copies.remove(id);
                }
            }
            ix.files.remove(&old);
        });
    }

    /// Removes the old pack of a switched rewrite (its file stays open for
    /// reads already under way), durably.
    pub fn remove_old(&self, rw: &Rewrite) -> io::Result<()> {
        let (dir, _) = self.packs_dir(true)?.expect("made");
        dir.unlink(&self.name_of(rw.plan.pack))?;
        self.io.sync_dir(&dir)
    }

    /// Abandons a rewrite not switched: its new pack is removed (it only
    /// held copies).
    pub fn abandon(&self, rw: Rewrite) {
        if let Some(NewPack { n, .. }) = rw.new
            && let Ok(Some((dir, _))) = self.packs_dir(false)
        {
            let _ = dir.unlink(&pack_name(n));
            self.with_index(|ix| {
                ix.files.remove(&n);
            });
        }
    }

    /// Removes `<n>.zpack.new` (and earlier builds' `<n>.pack.new`) files a
    /// killed rewrite left (only a rewrite
    /// makes them, and one runs at a time: under the store's lock).
    pub fn clear_unfinished(&self) {
        let Ok(Some((dir, _))) = self.packs_dir(false) else {
            return;
        };
        for e in dir.list().unwrap_or_default() {
            if let Ok(name) = std::str::from_utf8(&e.name)
                && (name.ends_with(".zpack.new") || name.ends_with(".pack.new"))
            {
                let _ = dir.unlink(name);
            }
        }
    }
}
