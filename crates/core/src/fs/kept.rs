//! What the core keeps of files it no longer names: the files a change
//! took from the tree while the kernel still names their inode
//! (`StaleFiles`), the inodes seen with another name (`SharedInodes`),
//! and the references waiting for the janitor to close them (`HeldRefs`).
//!
//! Invariants, each kept by its type's methods: at most `MAX_STALE` stale
//! files are kept (past it, none is added: the kernel's late open of such
//! an inode answers `ESTALE` and the kernel looks the path up again); an
//! inode once seen shared is never forgotten while mounted (there is no
//! way to remove one), so the janitor never empties it for reuse; at most
//! `MAX_HELD` references are taken for the janitor, and past twice that
//! one is freed in the request.
//! Locks: each type's lock is a leaf, held only inside its methods.

use super::*;

/// At most this many replaced or removed files are kept for the kernel's
/// late opens; past it such an open answers `ESTALE` (the kernel then looks
/// the path up again).
const MAX_STALE: usize = 1024;

/// At most this many references from `hold` wait for the janitor.
const MAX_HELD: usize = 256;

/// The files that an unlink or a rename over them took from the tree
/// while the kernel still names their inode (an `O_PATH` reference each,
/// until the kernel forgets it): a path resolved just before the change
/// opens and stats the file it resolved to, as on ext4, instead of failing
/// (see `open`). Bounded by `MAX_STALE`.
pub(super) struct StaleFiles {
    files: Mutex<HashMap<Ino, File>>,
    max: usize,
}

impl Default for StaleFiles {
    fn default() -> StaleFiles {
        StaleFiles::with_max(MAX_STALE)
    }
}

impl StaleFiles {
    fn with_max(max: usize) -> StaleFiles {
        StaleFiles {
            files: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// Whether one more may be kept now.
    pub(super) fn has_room(&self) -> bool {
        self.files.lock().len() < self.max
    }

    /// Keeps a reference to `f` for `ino` if there is room; whether it did.
    pub(super) fn keep(&self, ino: Ino, f: &File) -> bool {
        let mut files = self.files.lock();
        if files.len() < self.max
            && let Ok(f) = f.try_clone()
        {
            files.insert(ino, f);
            return true;
        }
        false
    }

    /// The one kept for `ino`, no longer kept (the kernel forgot `ino`).
    pub(super) fn take(&self, ino: Ino) -> Option<File> {
        self.files.lock().remove(&ino)
    }

    /// The one kept for `ino`, opened again for reading; `None` if none is
    /// kept.
    pub(super) fn reopen(&self, ino: Ino) -> Option<std::io::Result<File>> {
        let files = self.files.lock();
        let kept = files.get(&ino)?;
        Some(File::open(format!("/proc/self/fd/{}", kept.as_raw_fd())))
    }

    /// The attributes of the one kept for `ino`, as it is now.
    pub(super) fn stat(&self, ino: Ino) -> Option<std::io::Result<libc::stat>> {
        self.files.lock().get(&ino).map(sys::fstat)
    }
}

/// Physical inodes (device, inode) seen with more than one name while
/// mounted (opened through a hard link made offline, or kept by
/// `keep_stale` while another name remained): one of them may be read
/// through another name long after a publish swaps it out, so the janitor
/// never empties one for reuse. Only ever grows.
#[derive(Default)]
pub(super) struct SharedInodes {
    seen: Mutex<HashSet<(u64, u64)>>,
}

impl SharedInodes {
    /// Remembers `f`'s inode as shared when it has more than `names` links.
    pub(super) fn note(&self, f: &File, names: u64) {
        if let Ok(st) = sys::fstat(f)
            && st.st_nlink > names
        {
            self.seen.lock().insert((st.st_dev, st.st_ino));
        }
    }

    /// Whether the inode (device, inode) was ever seen shared.
    pub(super) fn contains(&self, id: (u64, u64)) -> bool {
        self.seen.lock().contains(&id)
    }
}

/// A count of the references taken by `hold` that the janitor has yet to
/// close: each is a descriptor, so past a bound (a big rmtree outrunning
/// the janitor) files are freed in the request again.
pub(super) struct HeldRefs {
    waiting: AtomicUsize,
    max: usize,
}

impl Default for HeldRefs {
    fn default() -> HeldRefs {
        HeldRefs::with_max(MAX_HELD)
    }
}

impl HeldRefs {
    fn with_max(max: usize) -> HeldRefs {
        HeldRefs {
            waiting: AtomicUsize::new(0),
            max,
        }
    }

    /// Whether a new reference may be taken.
    pub(super) fn room_to_hold(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) < self.max
    }

    /// Hands `f` to the janitor with `send` (false if it could not: then
    /// `f` was dropped), unless the janitor is far behind: then `f` is
    /// dropped here, freeing its blocks in the request.
    pub(super) fn hand_over(&self, f: File, send: impl FnOnce(File) -> bool) {
        if self.waiting.load(Ordering::Relaxed) >= 2 * self.max {
            return;
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if !send(f) {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The janitor closed one.
    pub(super) fn closed(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn null() -> File {
        File::open("/dev/null").unwrap()
    }

    /// A fresh directory for one test, removed by the test.
    fn scratch(test: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("skillfs-core-kept-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    #[test]
    fn stale_files_are_bounded_and_taken_once() {
        let stale = StaleFiles::with_max(2);
        assert!(stale.has_room());
        assert!(stale.keep(1, &null()));
        assert!(stale.keep(2, &null()));
        // Full: the third is not kept (its late open answers ESTALE).
        assert!(!stale.has_room());
        assert!(!stale.keep(3, &null()));
        assert!(stale.reopen(3).is_none());
        assert!(stale.reopen(1).unwrap().is_ok());
        assert!(stale.stat(2).unwrap().is_ok());
        // Forgotten by the kernel: room again.
        assert!(stale.take(1).is_some());
        assert!(stale.take(1).is_none());
        assert!(stale.has_room());
        assert!(stale.keep(3, &null()));
    }

    #[test]
    fn the_default_bound_is_max_stale() {
        assert_eq!(StaleFiles::default().max, MAX_STALE);
        assert_eq!(HeldRefs::default().max, MAX_HELD);
    }

    #[test]
    fn an_inode_with_another_name_is_shared_for_good() {
        let dir = scratch("shared");
        let a = dir.join("a");
        std::fs::write(&a, b"x").unwrap();
        let shared = SharedInodes::default();
        let f = File::open(&a).unwrap();
        let st = sys::fstat(&f).unwrap();
        let id = (st.st_dev, st.st_ino);
        // One link, opened through it: not shared.
        shared.note(&f, 1);
        assert!(!shared.contains(id));
        // Another name made: shared, and stays so once that name is gone.
        std::fs::hard_link(&a, dir.join("b")).unwrap();
        shared.note(&f, 1);
        assert!(shared.contains(id));
        std::fs::remove_file(dir.join("b")).unwrap();
        shared.note(&f, 1);
        assert!(shared.contains(id));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_shared_inode_is_never_recycled() {
        use skillfs_store::dir::Dir;
        let dir = scratch("recycle");
        let store = Arc::new(Dir::open_path(&dir).unwrap());
        let spares = Spares::new(Arc::clone(&store), Arc::clone(&store));
        let shared = SharedInodes::default();
        for (name, is_shared) in [("plain", false), ("shared", true)] {
            std::fs::write(dir.join(name), b"bytes").unwrap();
            let old = File::open(dir.join(name)).unwrap();
            let st = sys::fstat(&old).unwrap();
            if is_shared {
                std::fs::hard_link(dir.join(name), dir.join("other")).unwrap();
                shared.note(&old, 1);
                std::fs::remove_file(dir.join("other")).unwrap();
            }
            let path = Named::new(&store, name.to_string());
            janitor::recycle_inode(&spares, &shared, Arc::new(old), path, true);
            let kept = std::fs::metadata(dir.join(name));
            if is_shared {
                // Removed, not emptied: its bytes stay for the other name.
                assert!(kept.is_err(), "a shared inode was kept for reuse");
                assert!(shared.contains((st.st_dev, st.st_ino)));
            } else {
                assert_eq!(kept.unwrap().len(), 0, "an unshared inode is emptied");
            }
        }
        spares.clear();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn held_references_are_bounded() {
        let held = HeldRefs::with_max(2);
        let mut janitor = Vec::new();
        for _ in 0..4 {
            held.hand_over(null(), |f| {
                janitor.push(f);
                true
            });
        }
        assert!(!held.room_to_hold());
        // Twice the bound waits: the next is freed here, never sent.
        held.hand_over(null(), |_| panic!("sent past twice the bound"));
        // A send that fails counts nothing.
        held.closed();
        held.hand_over(null(), |_| false);
        held.closed();
        held.closed();
        assert!(held.room_to_hold());
    }
}
