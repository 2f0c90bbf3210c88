//! Entries the daemon meets that the journal does not have as they are:
//! put into ROOT behind the daemon (written while it restarted, or through
//! another route to the same directory, a bind mount say) or changed there.
//!
//! Owns: `meet`, called before any change to an entry is made or journaled
//! (an attribute change, a truncation, an open for writing, an unlink, a
//! rename from or over it, a name made in its directory). An entry the
//! catalog does not have as it is, is first recorded whole, as the
//! mount's scan records what it finds (op `scan`, by the daemon): a file
//! with its content stored, a symlink with its target, a directory the
//! catalog never had with everything below it. The change's own record
//! then follows, so no record names content the store lacks (before, a
//! `chmod` of such a file journaled a state with no content: `.history`
//! answered EIO for it and the next overwrite lost it), and what the
//! change replaces is kept.
//!
//! Invariants: parents are recorded before their children (ancestors are
//! met first); an entry the catalog has with the same kind, mode, owner,
//! size and mtime (a file: with its content) costs one `lstat` and one
//! catalog look-up, nothing more; a file is read with no lock held but the
//! namespace's (stored ahead, `scan::Prehashed`), and read again under the
//! ledger's lock only if it changed meanwhile; a file open for writing
//! through the mount is left to its writers (met at the first one's open).
//! A failure (a full disk, a file the daemon may not read) refuses the
//! change: it would lose content no version holds.
//!
//! Locks: called under `namespace` (shared or exclusive), with no
//! `OpenFile` state held; takes the blob store's `writing` gate, then
//! `ledger`, as a publish does.

use super::unpark::TICK_NS;
use super::*;

impl SkillFs {
    /// Records the entry at `loc` whole unless the journal has it as it is
    /// (see the module doc); if nothing is there, its directory.
    pub(super) fn meet(&self, loc: &Location) -> FsResult<()> {
        // (Untracked or not is decided below, by the kind found there.)
        match &loc.visible {
            Some(path) => self.meet_path(path),
            None => Ok(()),
        }
    }

    /// `meet` of the visible path `path`.
    pub(super) fn meet_path(&self, path: &RelPath) -> FsResult<()> {
        if path.is_root() {
            return Ok(());
        }
        let root = self.root_dir();
        let st = match sys::lstatat(root, path.as_bytes()) {
            Ok(st) => st,
            // A name about to be made: its directory must be recorded.
            Err(e) if enoent(&e) => return path.parent().map_or(Ok(()), |p| self.meet_path(&p)),
            Err(e) => return Err(e.into()),
        };
        let Some(kind) = kind_of(&st) else {
            return Ok(()); // a FIFO or socket: never versioned
        };
        if self.rules.is_untracked(path, kind) {
            return Ok(());
        }
        // (Only a file can be held for writing: asked for a file alone, an
        // ancestor's meet under a writer's `OpenState` takes no lock of the
        // open-file table, which is taken before an `OpenState`.)
        if self.is_known(path, &state_from_stat(&st, kind))
            || (kind == Kind::File && self.held_for_writing(path, &st))
        {
            return Ok(());
        }
        self.record_found(path, &st, kind)
    }

    /// Before a writer's staged bytes are swapped in at `loc`: the file
    /// there is recorded first if it is not the writers' own (`s.live`),
    /// put in its place behind the daemon while they wrote; the swap would
    /// otherwise recycle it unrecorded. Called with the file's `OpenState`
    /// held (so `held_for_writing` is not asked).
    pub(super) fn meet_under_writer(&self, s: &OpenState, loc: &Location) -> FsResult<()> {
        let Some(path) = &loc.visible else {
            return Ok(());
        };
        let st = match loc.lstat(self.area_dirs()) {
            Ok(st) => st,
            Err(e) if enoent(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if kind_of(&st) != Some(Kind::File) || same_file(&s.live, &st) {
            return Ok(());
        }
        if self.rules.is_untracked(path, Kind::File)
            || self.is_known(path, &state_from_stat(&st, Kind::File))
        {
            return Ok(());
        }
        self.record_found(path, &st, Kind::File)
    }

    /// Records `path` (`st`, its `lstat`, of kind `kind`) as the daemon
    /// found it, its ancestors first.
    fn record_found(&self, path: &RelPath, st: &libc::stat, kind: Kind) -> FsResult<()> {
        let root = self.root_dir();
        if let Some(parent) = path.parent() {
            self.meet_path(&parent)?;
            // Met with a directory the journal never had: recorded there.
            if self.is_known(path, &state_from_stat(st, kind)) {
                return Ok(());
            }
        }
        // From the content stored to its record: no prune starts between.
        let _writing = self.blobs.writing();
        // Read before the ledger is locked: every record would wait behind
        // a large file's read.
        let mut prehashed = Prehashed::new();
        if kind == Kind::File {
            let f = crate::scan::open_content(root, path.as_bytes())
                .context(format_args!("read {path}, found behind the daemon"))?;
            prehashed
                .add(&f, &self.blobs, TICK_NS)
                .context(format_args!("store {path}, found behind the daemon"))?;
        }
        let mut ledger = self.versions.ledger();
        // A directory the catalog never had: nothing below it is recorded
        // either (a walk under the lock, once per such directory).
        let whole = kind == Kind::Dir
            && ledger
                .catalog()
                .get(path)
                .is_none_or(|old| old.kind != Kind::Dir);
        let mut settler = Settler::new(
            self.areas(),
            &self.rules,
            &mut ledger,
            &self.blobs,
            Actor::daemon(),
        );
        // Where each entry is placed is the daemon's decision, made when it
        // is named; here it is only recorded as the daemon sees it.
        settler.relocate = false;
        settler.prehashed = prehashed;
        let recorded = if whole {
            settler.settle(path, Op::Scan, true, false, None)
        } else {
            settler.settle_entry(path, Op::Scan)
        };
        let n = settler.report.recorded;
        drop(ledger);
        recorded.context(format_args!("record {path}, found behind the daemon"))?;
        if n > 0 {
            tracing::info!("{path}: found behind the daemon, recorded ({n} records)");
        }
        Ok(())
    }

    /// Whether the catalog has `path` as `now` (from its `lstat`) shows it:
    /// same kind, mode, owner, and for a file or symlink size and mtime; a
    /// file with its content.
    fn is_known(&self, path: &RelPath, now: &EntryState) -> bool {
        let ledger = self.versions.ledger();
        ledger.catalog().get(path).is_some_and(|old| {
            crate::scan::unchanged(old, now) && (old.kind != Kind::File || old.blob.is_some())
        })
    }

    /// Whether the file at `path` (`st`, its `lstat`) is open for writing
    /// through the mount: it was met when its first writer opened it, and
    /// what it holds since is the writers' own (versions they publish, or,
    /// written directly, that `keep_direct` keeps). The journal may be
    /// ahead of it meanwhile: a durable publish records its version before
    /// it swaps it in, with no lock held between. Only the writers' own
    /// file is held: another put in its place behind the daemon while a
    /// writer is open (or while the kernel's asynchronous RELEASE of a
    /// closed one is on its way) is met like any other.
    fn held_for_writing(&self, path: &RelPath, st: &libc::stat) -> bool {
        let Some(ino) = self.tree.lock().find(path) else {
            return false;
        };
        let same =
            |f: &File| sys::fstat(f).is_ok_and(|o| (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino));
        self.open_file(ino).is_some_and(|of| {
            let s = of.lock();
            (s.writers > 0 || s.direct_writers > 0 || s.staging.is_some())
                && (same(&s.live)
                    || s.staging.as_ref().is_some_and(|stg| same(&stg.file))
                    || s.backing.as_ref().is_some_and(|b| same(b)))
        })
    }
}

/// Whether `f` is the file `st` (an `lstat`) describes.
fn same_file(f: &File, st: &libc::stat) -> bool {
    sys::fstat(f).is_ok_and(|o| (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino))
}
