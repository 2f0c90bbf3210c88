//! Directory listings and `fsyncdir`.
//!
//! Owns: a visible directory's listing (its physical entries: it never
//! shows a hidden one) and a hidden directory's (whole), the listing kept
//! for a directory between `readdir` calls (`listings`), the offsets (a
//! cookie per name, stable across listings: a read resumes after the last
//! name it returned), the lookup references `readdirplus` hands the
//! kernel, and `fsyncdir`. The adapter only copies entries into the kernel's buffer
//! (`DirectoryReplier`).
//! Locks: `namespace` shared while a listing is read or a directory opened
//! for its fsync, never across the flush; `listings` is a leaf.

use super::*;

impl SkillFs {
    /// The entries of directory `ino` as they are now, `.` and `..` first.
    pub(super) fn listing(&self, ino: Ino) -> FsResult<Vec<DirEntry>> {
        if let Some(v) = decode(ino) {
            return self.history().listing(ino, v);
        }
        let _ns = self.namespace.read();
        let loc = self.loc(ino)?;
        let mut raw = sys::read_dir_at(self.at(&loc), &loc.phys)?;
        let mut attached_names: Vec<Vec<u8>> = Vec::new();
        if loc.is_hidden() && !self.outside(&loc) {
            // Reached by path inside a hidden tree: the listing is whole,
            // its own hidden children included.
            let key = self.key_of(ino, &loc)?;
            match sys::read_dir_at(self.parked_dir(), key.as_bytes()) {
                Ok(extra) => {
                    attached_names = extra.iter().map(|e| e.name.clone()).collect();
                    raw.extend(extra);
                }
                Err(e) if enoent(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let parent = self.tree.lock().parent_of(ino);
        let mut entries = Vec::with_capacity(raw.len() + 2);
        entries.push(DirEntry {
            name: b".".to_vec(),
            kind: Kind::Dir,
            ino,
            special: 0,
        });
        entries.push(DirEntry {
            name: b"..".to_vec(),
            kind: Kind::Dir,
            ino: parent,
            special: 0,
        });
        let tree = self.tree.lock();
        for e in raw {
            let (kind, special) = match e.d_type {
                libc::DT_DIR => (Kind::Dir, 0),
                libc::DT_REG => (Kind::File, 0),
                libc::DT_LNK => (Kind::Symlink, 0),
                libc::DT_FIFO => (Kind::File, libc::S_IFIFO),
                libc::DT_SOCK => (Kind::File, libc::S_IFSOCK),
                libc::DT_UNKNOWN if !attached_names.contains(&e.name) => {
                    match loc.child(&e.name).lstat(self.area_dirs()) {
                        Ok(st) => match node_kind(&st) {
                            Some(k) => (k, special_of(&st)),
                            None => continue,
                        },
                        Err(_) => continue,
                    }
                }
                // Device nodes are not kept in a skills tree.
                _ => continue,
            };
            let ino = tree.child(ino, &e.name).unwrap_or(e.d_ino | 1 << 63);
            entries.push(DirEntry {
                name: e.name,
                kind,
                ino,
                special,
            });
        }
        drop(tree);
        Ok(entries)
    }

    /// The listing of `ino` for a read from `offset` on, and the index to
    /// continue at. An offset is the cookie of the last entry read (see
    /// `cookie`): stable for a name, so a read resumes after it whatever
    /// changed in the directory since, or was taken from another listing
    /// (as ext4's hash cookies do; an entry added or removed meanwhile may
    /// or may not be seen, as POSIX allows). A listing is taken at offset 0
    /// and kept for the directory until read to its end (then dropped here), so a pass need not
    /// list the directory again for each call.
    pub(super) fn readdir_at(&self, ino: Ino, offset: u64) -> FsResult<(Listing, usize)> {
        let kept = (offset > 0)
            .then(|| self.listings.lock().get(&ino).cloned())
            .flatten();
        let entries = match kept {
            Some(e) => e,
            None => {
                // A `.history` listing keeps its ids in order: their cookie
                // is the id itself.
                let ids = matches!(decode(ino), Some(VNode::Listing(_)));
                let e = Arc::new(by_cookie(self.listing(ino)?, ids));
                let mut listings = self.listings.lock();
                if listings.len() > 1024 {
                    listings.clear(); // abandoned passes; a later read lists again
                }
                listings.insert(ino, Arc::clone(&e));
                e
            }
        };
        let start = entries.partition_point(|(c, _)| *c <= offset);
        if start >= entries.len() {
            // Read to its end: the next pass lists again.
            self.listings.lock().remove(&ino);
        }
        Ok((entries, start))
    }

    /// `readdir`: the entries of `ino` from `offset` on, into `reply` until
    /// it is full.
    pub fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        reply: &mut impl DirectoryReplier,
    ) -> FsResult<()> {
        let (entries, start) = self.readdir_at(ino, offset)?;
        for (cookie, e) in entries.iter().skip(start) {
            let full = reply.add(DirectoryEntry {
                ino: e.ino,
                offset: *cookie,
                name: &e.name,
                mode_type: mode_type(e),
                entry: None,
            });
            if full {
                break;
            }
        }
        Ok(())
    }

    /// `readdirplus`: as `readdir`, each entry with its attributes. The
    /// kernel takes a lookup reference on every entry it is given but `.`
    /// and `..`, so each is looked up here, and one the reply had no room
    /// for is forgotten again. An entry gone since the listing was taken is
    /// left out.
    pub fn readdirplus(
        &self,
        ino: Ino,
        offset: u64,
        reply: &mut impl DirectoryReplier,
    ) -> FsResult<()> {
        let (entries, start) = self.readdir_at(ino, offset)?;
        for (cookie, e) in entries.iter().skip(start) {
            let dot = e.name == b"." || e.name == b"..";
            let found = if dot {
                self.getattr(e.ino)
            } else {
                self.lookup(ino, &e.name)
            };
            let entry = match found {
                Ok(entry) => entry,
                // Another replica's version that cannot be read now (its
                // tree being read by another request: `EAGAIN`) is said,
                // never listed short: a `cp -a` would copy less, silently.
                Err(e) if is_virtual(ino) && !e.is(libc::ENOENT) => return Err(e),
                Err(_) => continue,
            };
            let full = reply.add(DirectoryEntry {
                ino: entry.ino,
                offset: *cookie,
                name: &e.name,
                mode_type: entry.stat.st_mode & libc::S_IFMT,
                entry: Some(&entry),
            });
            if full {
                if !dot {
                    self.forget(entry.ino, 1);
                }
                break;
            }
        }
        Ok(())
    }

    pub fn fsyncdir(&self, ino: Ino) -> FsResult<()> {
        if is_virtual(ino) {
            return Ok(());
        }
        // Opened under the namespace lock, flushed after it.
        let dir = {
            let _ns = self.namespace.read();
            match self.loc(ino) {
                Ok(loc) => Some((File::from(sys::open_dir(self.at(&loc), &loc.phys)?), loc)),
                // A directory removed while open has nothing left to make
                // durable but the record of its removal, synced below.
                Err(e) if e.is(libc::ENOENT) || e.is(libc::ESTALE) => None,
                Err(e) => return Err(e),
            }
        };
        self.sync_records()?;
        if let Some((dir, loc)) = dir {
            self.live_fsync(&dir, &loc)?;
        }
        Ok(())
    }
}

/// One entry of a listing, as the adapter hands it to the kernel.
pub struct DirectoryEntry<'a> {
    pub ino: Ino,
    /// Where the next read of the listing continues.
    pub offset: u64,
    pub name: &'a [u8],
    /// The file type bits of `st_mode` (`S_IFREG`, `S_IFDIR`...).
    pub mode_type: u32,
    /// For `readdirplus`: the entry and its attributes.
    pub entry: Option<&'a Entry>,
}

/// Where a listing goes: the kernel's reply buffer, through the adapter
/// (after mountpoint-s3's `DirectoryReplier`).
pub trait DirectoryReplier {
    /// Adds `entry`; true if the buffer is full and it was not taken.
    fn add(&mut self, entry: DirectoryEntry<'_>) -> bool;
}

/// The file type bits of a listed entry.
fn mode_type(e: &DirEntry) -> u32 {
    match (e.special, e.kind) {
        (0, Kind::File) => libc::S_IFREG,
        (0, Kind::Dir) => libc::S_IFDIR,
        (0, Kind::Symlink) => libc::S_IFLNK,
        (t, _) => t,
    }
}

/// A listing ordered by cookie.
pub(super) type Listing = Arc<Vec<(u64, DirEntry)>>;

/// The readdir offset that follows `name`: 1 and 2 for `.` and `..`; for
/// an id of a `.history` listing (`ids`), 2 past the id, so they stay in
/// order; for any other name a hash of it in 3..2^62, the same in every
/// listing of the daemon's life.
fn cookie(name: &[u8], ids: bool) -> u64 {
    match name {
        b"." => 1,
        b".." => 2,
        _ => {
            if ids
                && let Some(id) = std::str::from_utf8(name)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok())
            {
                return id + 2;
            }
            // SipHash with keys drawn once per daemon: the same for a
            // name all its life, and no name chosen to collide with
            // another (a collision is told apart in `by_cookie`, but not
            // the same way in every listing).
            use std::hash::BuildHasher;
            static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
                std::sync::OnceLock::new();
            3 + KEYS.get_or_init(Default::default).hash_one(name) % ((1 << 62) - 3)
        }
    }
}

/// `entries` ordered by cookie; two names with one hash (never seen in
/// practice) are told apart by the next free cookie, in name order.
fn by_cookie(entries: Vec<DirEntry>, ids: bool) -> Vec<(u64, DirEntry)> {
    let mut v: Vec<(u64, DirEntry)> = entries
        .into_iter()
        .map(|e| (cookie(&e.name, ids), e))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    for i in 1..v.len() {
        if v[i].0 <= v[i - 1].0 {
            v[i].0 = v[i - 1].0 + 1;
        }
    }
    v
}
