//! The janitor thread: inodes swapped out of the live tree are emptied
//! into the spares for the next writer (or removed), spares are made when
//! they run low, and the last references to replaced or removed files are
//! closed off the request path (freeing blocks can take hundreds of
//! microseconds).
//!
//! Invariants: an inode another name may still point at (nlink above one,
//! seen `shared`, carrying an extended attribute, or on a filesystem that
//! does not order metadata) is never emptied for reuse. The references
//! waiting for it are bounded (`kept::HeldRefs`).
//! Locks: `janitor` (the inbox) is a leaf, and so are `kept`'s.

use super::*;

impl SkillFs {
    /// A reference to the file at `loc`, taken before a call that may drop
    /// its last name: while it is held, that call does not free the blocks.
    pub(super) fn hold(&self, loc: &Location) -> Option<File> {
        // Each held reference is a descriptor: past a bound (a big rmtree
        // outrunning the janitor) files are freed in the request again.
        if !self.held.room_to_hold() {
            return None;
        }
        sys::openat(
            self.at(loc),
            &loc.phys,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .ok()
    }

    /// Drops a reference from `hold` on the janitor thread: freeing the
    /// blocks of a replaced or removed file (hundreds of microseconds on
    /// ext4 with `discard`) happens off the request path, as XFS does with
    /// its background inode reclaim.
    pub(super) fn free_later(&self, held: Option<File>) {
        let Some(f) = held else { return };
        // (A janitor far behind, a big rmtree: freed here instead.)
        if let Some((tx, _)) = self.janitor.lock().as_ref() {
            self.held.hand_over(f, |f| tx.send(Chore::Close(f)).is_ok());
        }
    }

    /// The inode a publish swapped out now sits at `path` in `staging/`:
    /// keep it, emptied, for the next writer, unless a read still holds it
    /// (it keeps its bytes) or enough are kept already.
    pub(super) fn recycle(&self, old: Arc<File>, path: Named) {
        match self.janitor.lock().as_ref() {
            Some((tx, _)) => {
                let _ = tx.send(Chore::Recycle(old, path, self.durability.one_commit()));
            }
            None => {
                drop(old);
                let _ = path.unlink();
            }
        }
    }
}

/// The thread that empties swapped-out inodes into `spares`, unless a read
/// still holds one (it keeps its bytes) or enough are kept already, and
/// makes new ones when they run low.
pub(super) fn start_janitor(
    spares: Arc<Spares>,
    held: Arc<HeldRefs>,
    shared: Arc<SharedInodes>,
) -> Janitor {
    let (tx, rx) = std::sync::mpsc::channel::<Chore>();
    let handle = std::thread::spawn(move || {
        for chore in rx {
            match chore {
                Chore::Recycle(old, path, reuse) => {
                    recycle_inode(&spares, &shared, old, path, reuse)
                }
                Chore::TopUp => {
                    if let Err(e) = spares.top_up() {
                        tracing::warn!("could not make spare files: {e}");
                    }
                }
                Chore::Close(f) => {
                    drop(f);
                    held.closed();
                }
                Chore::Stop => break,
            }
        }
    });
    (tx, handle)
}

/// Empties the inode a publish swapped out (now only at `path`) into the
/// spares, or removes that name.
///
/// Never empties an inode that another name still points at: a hard link
/// made while unmounted (a `cp -al` backup, a package store outside the
/// root, the other name of a pair inside it) keeps its bytes. After the
/// exchange the staging name is one link, so any count above one is such a
/// name. `recycle` is false where the filesystem does not order metadata
/// (ext4 without a journal): there a truncate lost in a power cut could
/// bring an inode back with its old bytes after it was swapped in elsewhere.
pub(super) fn recycle_inode(
    spares: &Spares,
    shared: &SharedInodes,
    old: Arc<File>,
    path: Named,
    recycle: bool,
) {
    // A read in flight holds the old file: wait for it to finish.
    let mut waited = 0;
    while recycle && Arc::strong_count(&old) > 1 && waited < 100 {
        std::thread::sleep(std::time::Duration::from_millis(1));
        waited += 1;
    }
    let old_st = sys::fstat(&*old).ok();
    let identity = old_st.map(|st| (st.st_dev, st.st_ino));
    let only_link = old_st.is_some_and(|st| st.st_nlink == 1);
    // Never one another name may still be read through, nor one carrying
    // extended attributes (an ACL or a label would pass to the next file).
    let unshared = identity.is_some_and(|id| !shared.contains(id));
    let reusable = recycle
        && only_link
        && unshared
        && !sys::has_xattrs(&*old)
        && Arc::strong_count(&old) == 1
        && spares.wants_more();
    drop(old);
    let is_file = path
        .lstat()
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
    if reusable && is_file {
        // Empty only the very inode that was swapped out.
        let emptied = path.open(libc::O_RDWR).and_then(|f| {
            let st = sys::fstat(&f)?;
            if Some((st.st_dev, st.st_ino)) != identity || st.st_nlink != 1 {
                return Err(std::io::Error::other("not the swapped-out inode alone"));
            }
            sys::ftruncate(&f, 0).map(|()| f)
        });
        if let Ok(f) = emptied
            && spares.put(path.clone(), f)
        {
            return;
        }
    }
    let _ = path.unlink();
}

/// Renames a spare (made `ready` for its new place) to `rel` in `dirfd`,
/// never over an existing entry; on failure the spare is removed.
pub(super) fn put_spare(
    ready: std::io::Result<()>,
    spare: &Named,
    dirfd: BorrowedFd<'_>,
    rel: &[u8],
) -> std::io::Result<()> {
    let placed = ready.and_then(|()| spare.rename_out(dirfd, rel, libc::RENAME_NOREPLACE));
    if placed.is_err()
        && let Err(e) = spare.remove()
    {
        tracing::warn!("could not remove spare {}: {e}", spare.path().display());
    }
    placed
}
