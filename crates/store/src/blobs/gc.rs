//! The prune: contents that no kept version shows are removed, loose
//! blobs unlinked and packs rewritten without them (`packs::rewrite`),
//! while writers go on storing.
//!
//! Invariants:
//! - a content is removed only if it is not in the live set *and* no
//!   writer found it present or stored it since the prune began (`pins`);
//!   a writer pins a content in `has_intact`, before it looks for it, and
//!   the prune checks the pins and removes under the same lock, so each
//!   such race ends with the content kept or stored again;
//! - the live set is taken with no writer between storing a content and
//!   appending its record (`gate`, taken alone for that instant): every
//!   content stored before is named by a record the live set sees, and
//!   every content stored after is pinned;
//! - everything pending a sync is synced first, so nothing left to sync
//!   names a pack that is rewritten;
//! - removing is the last step of each content and each pack: a kill
//!   leaves the store whole, with some dead bytes a rerun reclaims.
//!
//! Locks: `gate` (alone, briefly) before the caller's ledger lock, as a
//! writer takes it (shared) before the ledger; `pins` before `known` and
//! the packs' `index`; never `pins` while waiting on I/O but one unlink.

use std::collections::HashSet;
use std::io;

use parking_lot::RwLockReadGuard;

use super::{BlobStore, raw_id};

/// What a prune freed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reclaimed {
    pub loose_removed: u64,
    pub packs_rewritten: u64,
    pub entries_dropped: u64,
    pub bytes_freed: u64,
}

impl BlobStore {
    /// Held by a writer from storing a content until the record naming it
    /// is appended (or given up): a prune starts only between the two.
    pub fn writing(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read_recursive()
    }

    /// Pins `raw` if a prune is running (see the module doc).
    pub(super) fn pin(&self, raw: &[u8; 32]) {
        if let Some(p) = self.pins.lock().as_mut() {
            p.insert(*raw);
        }
    }

    /// Removes every content not in the set `live_of` returns; `live_of`
    /// is called once, with no writer between a store and its record (the
    /// caller takes its ledger lock inside it).
    pub fn prune(&self, live_of: impl FnOnce() -> HashSet<[u8; 32]>) -> io::Result<Reclaimed> {
        // Sealed first, then synced: no entry pending a sync is left in a
        // pack this prune may rewrite (one marked pending later, by a
        // durable writer's dedup, is synced in its new pack; see
        // `sync_pending`).
        self.packs.seal_writer();
        self.sync_pending()?;
        let live = {
            let _alone = self.gate.write();
            *self.pins.lock() = Some(HashSet::new());
            live_of()
        };
        // The chunks of every chunked content kept are kept with it.
        let result = self
            .with_chunks(live)
            .and_then(|live| self.prune_against(&live));
        *self.pins.lock() = None;
        result
    }

    fn prune_against(&self, live: &HashSet<[u8; 32]>) -> io::Result<Reclaimed> {
        let mut out = Reclaimed::default();
        for fan in 0..=255u8 {
            let name = format!("{fan:02x}");
            let Ok(dir) = self.dir.sub(&name) else {
                continue;
            };
            let mut removed = false;
            for e in dir.list()? {
                let Some(id) = std::str::from_utf8(&e.name).ok() else {
                    continue;
                };
                let Some(raw) = raw_id(id) else { continue };
                if live.contains(&raw) {
                    continue;
                }
                let pins = self.pins.lock();
                if pins.as_ref().is_some_and(|p| p.contains(&raw)) {
                    continue;
                }
                let size = dir.lstat(id).map_or(0, |st| st.st_size.max(0) as u64);
                match dir.unlink(id) {
                    Ok(()) => {
                        self.known.lock().remove(&raw);
                        out.loose_removed += 1;
                        out.bytes_freed += size;
                        removed = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            if removed {
                self.io.sync_dir(&dir)?;
            }
        }
        self.packs.clear_unfinished();
        for n in self.packs.sealed() {
            let Some(plan) = self.packs.plan(n, &|id| live.contains(id)) else {
                continue;
            };
            let rw = self.packs.write(plan)?;
            let pins = self.pins.lock();
            if rw
                .dead()
                .iter()
                .any(|id| pins.as_ref().is_some_and(|p| p.contains(id)))
            {
                // Found present and reused meanwhile: this pack stays as
                // it is until the next prune.
                drop(pins);
                self.packs.abandon(rw);
                continue;
            }
            self.packs.switch(&rw);
            {
                let mut known = self.known.lock();
                for id in rw.dead() {
                    known.remove(id);
                }
            }
            drop(pins);
            self.packs.remove_old(&rw)?;
            out.packs_rewritten += 1;
            out.entries_dropped += rw.dead().len() as u64;
            out.bytes_freed += rw.freed();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::fs;

    use super::super::{BlobStore, raw_id};
    use crate::durable::StoreIo;

    #[test]
    fn a_prune_keeps_the_chunks_of_what_it_keeps_and_only_those() {
        let d = std::env::temp_dir().join(format!("skillfs-gc-chunks-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("blobs")).unwrap();
        let mut x = 99u64;
        let one: Vec<u8> = (0..700_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut two = one.clone();
        two[350_000..350_010].fill(0);
        let bs = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
        let a = bs.put_bytes(&one, true).unwrap();
        let b = bs.put_bytes(&two, true).unwrap();
        let raw = |id: &str| raw_id(id).unwrap();
        let r = bs.prune(|| HashSet::from([raw(&b)])).unwrap();
        assert!(
            r.entries_dropped >= 2,
            "{r:?}: the list of a and its own chunk"
        );
        for store in [
            &bs,
            &BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap(),
        ] {
            assert_eq!(store.read(&b).unwrap(), two);
            assert!(store.read(&a).is_err());
        }
        // A reader of b that opened it before the prune reads on.
        let opened = bs.open(&b).unwrap();
        let r = bs.prune(HashSet::new).unwrap();
        assert!(
            r.entries_dropped >= 10,
            "{r:?}: the chunks and the list of b"
        );
        let mut buf = vec![0u8; 1000];
        assert_eq!(opened.read_at(&mut buf, 600_000).unwrap(), 1000);
        assert_eq!(buf, two[600_000..601_000]);
        let fresh = BlobStore::open_path(&d.join("blobs"), StoreIo::real()).unwrap();
        assert!(fresh.read(&b).is_err());
        assert!(
            fresh.packs.ids().is_empty(),
            "every chunk went with the last list"
        );
        fs::remove_dir_all(&d).unwrap();
    }
}
