//! The open files: each open inode's state (`OpenFile`) and the file
//! handles the kernel holds (`Handles`).
//!
//! Owns: the table of open inodes and the handle table, each behind its
//! own lock, and the rules that keep them in step: an inode's open state
//! lives exactly as long as it has a handle (`join_or_open` counts one in,
//! `leave` counts one out and drops the state, and its staging file, at
//! zero); a file handle number is never given twice in a mount.
//! What an open state holds, and what a write does with it, is `open`'s.
//! Locks: the table of open inodes, then an `OpenFile` (its methods take
//! them in that order and no other); the handle table is a leaf (no other
//! lock is taken while it is held).

use super::*;

/// A copy-on-write scratch file of an inode that has writers, or, for a
/// hidden file, the live file itself opened for writing (`in_place`).
pub(super) struct Staging {
    pub(super) file: Arc<File>,
    /// The scratch file's name in `staging/` (`None` when in place).
    pub(super) spare: Option<Named>,
    /// Holds bytes not yet published.
    pub(super) dirty: bool,
    /// Emptied by an `O_TRUNC` open and not written since: a flush does
    /// not publish it (see `flush`).
    pub(super) trunc_only: bool,
    pub(super) in_place: bool,
    /// Counts the changes of its bytes: a durable publish that let go of
    /// its locks to flush swaps it in only if none came meanwhile (see
    /// `publish_durable`).
    pub(super) edits: u64,
    /// Who changed its bytes last (a write's or a truncation's caller,
    /// with its process name read then): the actor of the version they
    /// make, rather than whoever's flush publishes them. A process forked
    /// between a write and its close holds the file too and flushes it at
    /// its `exec`, before the writer closes: that flush publishes the
    /// writer's bytes, not its own. (Writes the kernel makes itself, a
    /// passthrough handle's or a shared mapping's writeback, name no
    /// process: their version is the publisher's.)
    pub(super) writer: Option<Caller>,
}

impl Staging {
    /// Its bytes changed: owed a version.
    pub(super) fn mark_written(&mut self) {
        self.dirty = true;
        self.trunc_only = false;
        self.edits += 1;
    }

    /// [`Staging::mark_written`] by `caller` (not the kernel's own
    /// request, which names no process).
    pub(super) fn written_by(&mut self, caller: &Caller) {
        self.mark_written();
        // Named once per writer: its thread may end before the publish.
        if caller.pid != 0 && self.writer.is_none_or(|w| w.pid != caller.pid) {
            self.writer = Some(caller.named());
        }
    }

    /// The actor of the version its bytes make, when `publisher` publishes
    /// them (see `writer`).
    pub(super) fn author(&self, publisher: &Caller) -> Caller {
        self.writer.unwrap_or(*publisher)
    }
}

/// Per-inode state while at least one handle is open.
pub(super) struct OpenState {
    /// The live file as it was last published (kept open so readers and
    /// files unlinked while open keep working).
    pub(super) live: Arc<File>,
    pub(super) staging: Option<Staging>,
    pub(super) handles: u32,
    pub(super) writers: u32,
    /// Handles whose reads and writes the kernel makes itself, on
    /// `backing` (see `OpenReply::backing`), and how many may write. The
    /// kernel refuses to mix them with handles served through the daemon
    /// on one inode: while there are any, every open of the inode is one.
    pub(super) direct: u32,
    pub(super) direct_writers: u32,
    pub(super) backing: Option<Arc<File>>,
    /// The caller of each open handle an `execve` made (`__FMODE_EXEC`):
    /// the kernel keeps one as the executable of the processes it runs,
    /// refusing writes to the file, until the last of them ends (see
    /// `programs::runs_as_program`).
    pub(super) programs: Vec<u32>,
}

/// An open inode: its state behind its own lock.
pub(super) struct OpenFile {
    state: Mutex<OpenState>,
    /// Signalled when a direct handle goes (see `direct::wait_for_direct_readers`).
    pub(super) direct_left: parking_lot::Condvar,
}

impl OpenFile {
    fn new(live: File) -> OpenFile {
        OpenFile {
            state: Mutex::new(OpenState {
                live: Arc::new(live),
                staging: None,
                handles: 1,
                writers: 0,
                direct: 0,
                direct_writers: 0,
                backing: None,
                programs: Vec::new(),
            }),
            direct_left: parking_lot::Condvar::new(),
        }
    }

    /// Its state (after the table of open inodes, if that is held).
    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, OpenState> {
        self.state.lock()
    }
}

/// The open inodes, by inode number.
#[derive(Default)]
pub(super) struct OpenFiles {
    by_ino: Mutex<HashMap<Ino, Arc<OpenFile>>>,
}

impl OpenFiles {
    pub(super) fn get(&self, ino: Ino) -> Option<Arc<OpenFile>> {
        self.by_ino.lock().get(&ino).cloned()
    }

    /// The inodes open now (a snapshot: each may be gone when looked at).
    pub(super) fn inos(&self) -> Vec<Ino> {
        self.by_ino.lock().keys().copied().collect()
    }

    /// Counts one more handle into the open state of `ino`, made from the
    /// live file `open` gives if there is none. The table stays locked
    /// throughout, so a last `leave` cannot drop the state in between and
    /// two first opens cannot make two.
    pub(super) fn join_or_open(
        &self,
        ino: Ino,
        open: impl FnOnce() -> FsResult<File>,
    ) -> FsResult<Arc<OpenFile>> {
        let mut files = self.by_ino.lock();
        if let Some(of) = files.get(&ino) {
            of.lock().handles += 1;
            return Ok(Arc::clone(of));
        }
        let of = Arc::new(OpenFile::new(open()?));
        files.insert(ino, Arc::clone(&of));
        Ok(of)
    }

    /// Counts one more handle into the open state of `ino` if it has one
    /// (a file reachable only through its handles), under the table's lock.
    pub(super) fn join(&self, ino: Ino) -> Option<Arc<OpenFile>> {
        let files = self.by_ino.lock();
        let of = files.get(&ino).cloned()?;
        of.lock().handles += 1;
        Some(of)
    }

    /// Counts one handle (a writer if `writer`) out of the open state of
    /// `ino`; the last one drops the state and removes its staging file.
    pub(super) fn leave(&self, ino: Ino, writer: bool) {
        let mut files = self.by_ino.lock();
        let Some(of) = files.get(&ino).cloned() else {
            return;
        };
        let mut s = of.lock();
        s.handles = s.handles.saturating_sub(1);
        if writer {
            s.writers = s.writers.saturating_sub(1);
        }
        if s.direct == 0 {
            s.backing = None;
        }
        if s.handles == 0 {
            if let Some(spare) = s.staging.take().and_then(|stg| stg.spare) {
                let _ = spare.unlink();
            }
            drop(s);
            files.remove(&ino);
        }
    }
}

/// What a file handle is.
enum Handle {
    File(FileHandle),
    /// A file under `.history`: its blob, read-only.
    Blob {
        file: Arc<Opened>,
    },
}

/// A handle of a live file, as `Handles::file` answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FileHandle {
    pub(super) ino: Ino,
    pub(super) write: bool,
    pub(super) append: bool,
    /// Served by the kernel on the backing file (passthrough).
    pub(super) direct: bool,
    /// Opened by an `execve`, by this pid (see `OpenState::programs`).
    pub(super) program: Option<u32>,
}

/// The file handles given to the kernel. Numbers start at 1 and are never
/// given twice in a mount, so a late request on a released handle finds
/// nothing rather than another file.
pub(super) struct Handles {
    next: AtomicU64,
    table: Mutex<HashMap<u64, Handle>>,
}

impl Default for Handles {
    fn default() -> Handles {
        Handles {
            next: AtomicU64::new(1),
            table: Mutex::new(HashMap::new()),
        }
    }
}

impl Handles {
    fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.table.lock().insert(fh, h);
        fh
    }

    /// A new handle of the live file `h.ino`.
    pub(super) fn insert_file(&self, h: FileHandle) -> u64 {
        self.insert(Handle::File(h))
    }

    /// A new handle of a blob under `.history`.
    pub(super) fn insert_blob(&self, file: Arc<Opened>) -> u64 {
        self.insert(Handle::Blob { file })
    }

    /// The live file `fh` is a handle of (`None` for a blob's or none).
    pub(super) fn file(&self, fh: u64) -> Option<FileHandle> {
        match self.table.lock().get(&fh) {
            Some(Handle::File(h)) => Some(*h),
            _ => None,
        }
    }

    /// The blob `fh` is a handle of (`None` for a live file's or none).
    pub(super) fn blob(&self, fh: u64) -> Option<Arc<Opened>> {
        match self.table.lock().get(&fh) {
            Some(Handle::Blob { file }) => Some(Arc::clone(file)),
            _ => None,
        }
    }

    pub(super) fn is_blob(&self, fh: u64) -> bool {
        matches!(self.table.lock().get(&fh), Some(Handle::Blob { .. }))
    }

    /// Serves the live file's handle `fh` through the daemon from now on;
    /// returns it as it was (`None` if it is no such handle).
    pub(super) fn undirect(&self, fh: u64) -> Option<FileHandle> {
        match self.table.lock().get_mut(&fh) {
            Some(Handle::File(h)) => {
                let was = *h;
                h.direct = false;
                Some(was)
            }
            _ => None,
        }
    }

    /// Takes `fh` out: `Ok(None)` for a blob's handle, `EBADF` for none.
    pub(super) fn remove(&self, fh: u64) -> FsResult<Option<FileHandle>> {
        match self.table.lock().remove(&fh) {
            Some(Handle::File(h)) => Ok(Some(h)),
            Some(Handle::Blob { .. }) => Ok(None),
            None => Err(FsError::EBADF),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> File {
        File::open("/dev/null").unwrap()
    }

    fn file(ino: Ino, write: bool) -> FileHandle {
        FileHandle {
            ino,
            write,
            append: false,
            direct: false,
            program: None,
        }
    }

    #[test]
    fn handles_insert_get_remove() {
        let h = Handles::default();
        let a = h.insert_file(file(7, true));
        assert_eq!(h.file(a), Some(file(7, true)));
        assert!(!h.is_blob(a));
        assert!(h.blob(a).is_none());
        assert_eq!(h.remove(a).unwrap(), Some(file(7, true)));
        assert!(h.file(a).is_none());
        assert!(matches!(h.remove(a), Err(e) if e.errno() == libc::EBADF));
    }

    #[test]
    fn handle_numbers_are_never_given_twice() {
        let h = Handles::default();
        let mut seen = HashSet::new();
        for i in 0..100 {
            let fh = h.insert_file(file(i, false));
            assert!(fh >= 1);
            assert!(seen.insert(fh), "fh {fh} given twice");
            if i % 2 == 0 {
                h.remove(fh).unwrap();
            }
        }
        // A released number finds nothing, even after more opens.
        let first = *seen.iter().min().unwrap();
        assert!(h.file(first).is_none());
    }

    #[test]
    fn undirect_answers_the_handle_as_it_was() {
        let h = Handles::default();
        let fh = h.insert_file(FileHandle {
            direct: true,
            ..file(3, true)
        });
        assert!(h.undirect(fh).unwrap().direct);
        assert!(!h.file(fh).unwrap().direct);
        assert!(h.undirect(fh + 1).is_none());
    }

    #[test]
    fn open_state_lives_as_long_as_its_handles() {
        let files = OpenFiles::default();
        let a = files.join_or_open(5, || Ok(live())).unwrap();
        // A second open joins the same state, without opening again.
        let b = files
            .join_or_open(5, || panic!("opened a joined file again"))
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.lock().handles, 2);
        assert_eq!(files.inos(), vec![5]);
        let c = files.join(5).unwrap();
        assert_eq!(c.lock().handles, 3);
        files.leave(5, false);
        files.leave(5, false);
        assert!(files.get(5).is_some());
        files.leave(5, false);
        assert!(files.get(5).is_none());
        assert!(files.join(5).is_none());
        // Leaving a state that is gone is nothing.
        files.leave(5, true);
    }

    #[test]
    fn a_failed_first_open_leaves_no_state() {
        let files = OpenFiles::default();
        assert!(files.join_or_open(9, || Err(FsError::ENOENT)).is_err());
        assert!(files.get(9).is_none());
    }

    #[test]
    fn leaving_counts_writers_out_and_drops_backing_without_direct() {
        let files = OpenFiles::default();
        let of = files.join_or_open(1, || Ok(live())).unwrap();
        files.join(1).unwrap();
        {
            let mut s = of.lock();
            s.writers = 1;
            s.backing = Some(Arc::new(live()));
        }
        files.leave(1, true);
        let s = of.lock();
        assert_eq!((s.handles, s.writers), (1, 0));
        assert!(s.backing.is_none());
    }
}
