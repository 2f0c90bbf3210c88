//! Direct handles: opens the kernel serves itself on a backing file (FUSE
//! passthrough), when the daemon runs as root.
//!
//! Owns: which opens are direct (`open_direct`: outside the versioned
//! root, a read-only open of a file of `DIRECT_READ_MIN` or more with no
//! other handle, and every open of an inode that has direct handles), the
//! writer's wait for direct readers, and what a direct writer's bytes
//! become (versioned at flush, `fsync` and close; put back when that
//! fails).
//! Invariants: the kernel takes no mix of direct and daemon-served handles
//! on one inode, so while `OpenState::direct` is above zero every open of
//! the inode is direct, and a period of them starts only with no other
//! handle; a backing file's inode is never reused for another file (a
//! mapping of it outlives its handle). A writer joining direct handles in
//! the versioned root writes the live file in place: the one exception to
//! copy-on-write (docs/limits.md).
//! Locks: namespace, then an `OpenFile`, then the ledger; the wait holds
//! none.

use super::programs::{busy_program, program_alive, truncates_unguarded};
use super::*;

impl SkillFs {
    /// Keeps, as a version, what direct writers of the open file `s` at
    /// `loc` wrote, before a change that would lose it (a truncate, an
    /// unlink, a rename over it) where it is in the versioned tree.
    pub(super) fn keep_direct(
        &self,
        s: &OpenState,
        loc: &Location,
        caller: &Caller,
    ) -> FsResult<()> {
        if s.direct_writers == 0 {
            return Ok(());
        }
        if let (Some(path), Some(file)) = (self.versioned(loc, Kind::File), &s.backing) {
            self.store_and_record(file, &path, Op::Write, false, caller)
                .context(format_args!("version {} written directly", loc.logical))?;
        }
        Ok(())
    }

    /// Joins the open `of` as a direct handle (passthrough) and returns its
    /// backing file, when the kernel takes them and the file is outside
    /// the versioned root, or is opened only for reading inside it with no
    /// other handle, or already has direct handles (the kernel refuses to
    /// mix the two kinds on one inode, either way). `None` when it is
    /// served through the daemon (its other handles are).
    ///
    /// A writer that joins direct handles inside the versioned root writes
    /// the live file in place, as one moved in while open does (see
    /// `wait_for_direct_readers`, which makes that rare); what it wrote is
    /// versioned at its flush, `fsync` and close (`record_direct`).
    pub(super) fn open_direct(
        &self,
        ino: Ino,
        of: &OpenFile,
        loc: Option<&Location>,
        flags: i32,
        write: bool,
        caller: &Caller,
    ) -> TryResult<Option<Arc<File>>> {
        let mut s = if write {
            // A store of pages not yet sent would land after this writer's
            // bytes, on the FUSE inode's cache (see `pages`).
            self.lock_to_change(ino, of)?
        } else {
            of.lock()
        };
        // (Turned off after a refusal: an inode that still has direct
        // handles keeps joining them, as the kernel takes no mix.)
        if !self.notices.passthrough() && s.direct == 0 {
            return Ok(None);
        }
        let others = s.handles - 1;
        let st = || sys::fstat(&*s.live).ok();
        // Outside the root: read and written in place, like any file.
        // Inside: a reader of a large file, whose reads need no daemon
        // until a writer comes. A small one is better served by the
        // daemon: its pages stay cached across opens (no READ at all once
        // read), where a direct open costs a backing file registered with
        // the kernel and makes the next `stat` ask for the access time its
        // read moved. (A file the tree no longer has is never made direct.)
        let may_start = loc.is_some_and(|l| {
            self.outside(l)
                || (!write && st().is_some_and(|st| st.st_size as u64 >= DIRECT_READ_MIN))
        });
        // A file with another hard link is served by the daemon, which
        // splits it at its first write (the other name may be versioned).
        let single = || st().is_some_and(|st| st.st_nlink <= 1);
        if !(s.direct > 0 || (may_start && others == 0 && s.staging.is_none() && single())) {
            return Ok(None);
        }
        let backing = match &s.backing {
            Some(b) => Arc::clone(b),
            None => {
                // Opened for writing whatever this open asks: a later
                // writer of the inode must share it.
                let again = format!("/proc/self/fd/{}", s.live.as_raw_fd());
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&again)
                    .or_else(|_| File::open(&again))?;
                // The daemon's own reads of it (versions of what direct
                // writers wrote) leave the access time alone. (The kernel
                // reads through a file of its own, with the caller's flags.)
                sys::set_noatime(&f);
                // The kernel maps this inode itself for an `mmap` of a
                // direct handle, and such a mapping outlives the handle's
                // release: never emptied for reuse once swapped out.
                self.note_if_shared(&f, 0);
                let b = Arc::new(f);
                s.backing = Some(Arc::clone(&b));
                b
            }
        };
        if flags & libc::O_TRUNC != 0 {
            // Decided again where the file is emptied: an exec may have
            // opened it since `open` looked (see `open`).
            if truncates_unguarded(flags) && program_alive(&s.programs) {
                return Err(busy_program(ino).into());
            }
            // What direct writers wrote is kept before it goes (G1).
            if let Some(l) = loc {
                self.keep_direct(&s, l, caller)?;
            }
            sys::ftruncate(&*backing, 0)?;
        }
        s.direct += 1;
        if write {
            s.direct_writers += 1;
        }
        Ok(Some(backing))
    }

    /// Waits, at most `DIRECT_READERS_WAIT`, for the direct readers of a
    /// file of the versioned root to close before a writer opens it. The
    /// kernel takes no mix of direct and daemon-served handles on one
    /// inode, so a writer that comes while they are open joins them and
    /// writes the live file in place; one that comes after gets a staging
    /// copy, swapped in whole at its close. The readers the agent makes
    /// (an open, a read, a close) are gone long before the wait ends.
    /// Takes no lock while it waits. `true`: it joined the open state as a
    /// handle of its own, for the caller to let go of once its open is
    /// done, so that no reader starts a new period of direct handles
    /// between the end of the wait and the writer's open.
    pub(super) fn wait_for_direct_readers(&self, ino: Ino) -> bool {
        let only_readers = |s: &OpenState| s.direct > 0 && s.direct_writers == 0;
        if !self
            .open_file(ino)
            .is_some_and(|of| only_readers(&of.lock()))
        {
            return false;
        }
        {
            // Outside the root, and for a hidden file, a writer joins
            // them: in place is how such a file is written anyway.
            let _ns = self.namespace.read();
            if !self
                .loc(ino)
                .is_ok_and(|l| !self.outside(&l) && !l.is_hidden())
            {
                return false;
            }
        }
        let Some(of) = self.open_files.join(ino) else {
            return false;
        };
        let deadline = std::time::Instant::now() + DIRECT_READERS_WAIT;
        let mut s = of.lock();
        while only_readers(&s) {
            if of.direct_left.wait_until(&mut s, deadline).timed_out() {
                break;
            }
        }
        true
    }

    /// A direct handle the kernel could not be given a backing file for
    /// (passthrough refused after all): served through the daemon from
    /// now on, like every later open.
    pub fn undirect(&self, fh: u64) {
        self.set_passthrough(false);
        // (The handle table is let go of first: it is a leaf.)
        let Some(h) = self.handles.undirect(fh) else {
            return;
        };
        if let Some(of) = self.open_file(h.ino) {
            let mut s = of.lock();
            s.direct = s.direct.saturating_sub(1);
            if h.write {
                s.direct_writers = s.direct_writers.saturating_sub(1);
                s.writers += 1;
            }
            of.direct_left.notify_all();
        }
    }

    /// The close of a direct handle: a writer's content is versioned if the
    /// file is in the versioned tree now (moved in while open; outside it,
    /// nothing is kept).
    pub(super) fn release_direct(&self, ino: Ino, write: bool, caller: &Caller) -> FsResult<()> {
        let Some(of) = self.open_file(ino) else {
            return Ok(());
        };
        // A writer's bytes are recorded (or put back) while it still
        // counts as direct: until then no writer served by the daemon can
        // start, swap the live file out and have it reused under the read.
        let mut result = Ok(());
        if write {
            result = self.record_direct(ino, &of, false, caller).map(|_| ());
            if result.is_err() {
                self.put_back_direct(ino, &of);
            } else {
                let mut s = of.lock();
                s.direct_writers = s.direct_writers.saturating_sub(1);
            }
        }
        let mut s = of.lock();
        s.direct = s.direct.saturating_sub(1);
        of.direct_left.notify_all();
        result
    }

    /// A direct writer of a versioned file closed, and what it wrote in
    /// place could not be versioned (a full disk). It is counted out, and
    /// if it was the last one the live file goes back to the version the
    /// file has, in the same hold of the file's lock (no writer joins in
    /// between), as a staging copy that could not be published is dropped
    /// (see `release`): no reader is served bytes that are in no version.
    /// The close itself fails.
    fn put_back_direct(&self, ino: Ino, of: &OpenFile) {
        let put_back = (|| -> FsResult<bool> {
            let _ns = self.namespace.read();
            let loc = self.loc(ino);
            let mut s = of.lock();
            s.direct_writers = s.direct_writers.saturating_sub(1);
            let (Ok(loc), Some(file), 0) = (loc, s.backing.clone(), s.direct_writers) else {
                return Ok(false);
            };
            self.put_back_version(&file, &loc)
        })();
        match put_back {
            Ok(false) => {}
            Ok(true) => self.invalidate(ino),
            Err(e) => {
                tracing::error!(ino, "a file written in place is only partly put back: {e}");
                self.invalidate(ino);
            }
        }
    }

    /// Writes the version the catalog has of the versioned file at `loc`
    /// into `file` (the live file, which the kernel reads directly), over
    /// what is there and then cut to its size: the version's bytes reuse the
    /// room the unversioned ones took, so a full disk can still take them
    /// back. Readers may see the two mixed until it returns. `false`: no
    /// version to go back to.
    pub(super) fn put_back_version(&self, file: &File, loc: &Location) -> FsResult<bool> {
        let Some(path) = self.versioned(loc, Kind::File) else {
            return Ok(false);
        };
        let state = self.versions.ledger().catalog().get(&path).cloned();
        let Some(state) = state else {
            return Ok(false);
        };
        let Some(blob) = &state.blob else {
            return Ok(false);
        };
        let content = self.blobs.open(blob)?;
        let mut buf = vec![0u8; 1 << 16];
        let mut at = 0u64;
        loop {
            let n = content.read_at(&mut buf, at)?;
            if n == 0 {
                break;
            }
            file.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        sys::ftruncate(file, at)?;
        let ns = state.mtime_ns;
        let secs = ns.div_euclid(1_000_000_000) as i64;
        let mtime = Time::At(secs, ns.rem_euclid(1_000_000_000) as i64);
        sys::futimens(file, Time::Keep, mtime)?;
        Ok(true)
    }

    /// Versions what direct writers wrote to `of`'s file if it is in the
    /// versioned tree now (unless the catalog has that content already).
    /// Returns the journal position to make durable.
    pub(super) fn record_direct(
        &self,
        ino: Ino,
        of: &OpenFile,
        durable: bool,
        caller: &Caller,
    ) -> FsResult<Option<u64>> {
        let _ns = self.namespace.read();
        let (Ok(loc), Some(file)) = (self.loc(ino), of.lock().backing.clone()) else {
            return Ok(None);
        };
        let Some(path) = self.versioned(&loc, Kind::File) else {
            return Ok(None);
        };
        let (_, want) = self
            .store_and_record(&file, &path, Op::Write, durable, caller)
            .context(format_args!("version {} written directly", loc.logical))?;
        Ok(Some(want))
    }
}

/// The size from which a read-only open of a file of the versioned root is
/// direct (FUSE passthrough, see `open_direct`): where the reads' round
/// trips and a second copy of the pages in the FUSE inode's cache cost more
/// than the backing file's registration and the access-time GETATTR.
pub const DIRECT_READ_MIN: u64 = 1 << 20;

/// How long a writer of a file in the versioned root waits for its direct
/// readers to close (see `wait_for_direct_readers`).
/// Long enough for a closed reader's RELEASE to arrive under load; short
/// enough that a program holding the file open (a pager) costs each write
/// little.
const DIRECT_READERS_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
