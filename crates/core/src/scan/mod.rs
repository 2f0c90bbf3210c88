//! Settling a visible subtree with the journal and the hide rules: the
//! mount-time scan (offline edits, the first baseline, parks left in the
//! root while unmounted, orphaned and old parks), and the recording of a
//! subtree that becomes visible again (unpark).
//!
//! Invariants:
//! - a file whose size, mtime, mode and owner match the catalog is not read
//!   (remounting an unchanged tree costs one `lstat` per entry);
//! - parents are recorded before their children; a removed directory is
//!   recorded once, at its top;
//! - after settling, no entry a rule hides is left in a visible directory:
//!   it is moved (one rename, same filesystem) to the attached area of its
//!   directory, `parked/<key of the directory>/<name>`;
//! - hidden entries whose directory no longer exists are moved whole to
//!   `orphans/<key>.<time>` and swept, like parks, after the park age.
//!
//! The mount-time scan runs before the mount, through the root fd.
//!
//! Locks: the caller's: the mount-time scan runs before any request; an
//! unpark's settle runs under the rename's exclusive namespace lock with
//! `ledger` held (see `fs::unpark`).

mod parks;
mod torn;
pub use parks::{delete_trash, move_to_trash, old_orphans, tend_parked};

use skillfs_store::{Dir, Named};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

use crate::hide::HideRules;
use skillfs_base::relpath::{ByteString, RelPath};
use skillfs_base::sys;
use skillfs_model::ledger::Ledger;
use skillfs_store::blobs::BlobStore;
use skillfs_store::journal::{Actor, Change, EntryState, Kind, Op};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanReport {
    pub entries: u64,
    pub hashed: u64,
    pub recorded: u64,
    pub removed: u64,
    pub parked: u64,
    pub unparked: u64,
    pub orphaned: u64,
    pub swept: u64,
    /// Files found torn by a power cut and put back (see `torn`).
    pub repaired: u64,
}

pub fn kind_of(st: &libc::stat) -> Option<Kind> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Some(Kind::File),
        libc::S_IFDIR => Some(Kind::Dir),
        libc::S_IFLNK => Some(Kind::Symlink),
        _ => None,
    }
}

/// The state of an entry from its `lstat`, without content.
pub fn state_from_stat(st: &libc::stat, kind: Kind) -> EntryState {
    EntryState {
        kind,
        blob: None,
        size: if kind == Kind::Dir {
            0
        } else {
            st.st_size as u64
        },
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime_ns: sys::mtime_ns(st),
        target: None,
    }
}

/// True when `now` (from lstat) shows no change against `old` (recorded).
pub fn unchanged(old: &EntryState, now: &EntryState) -> bool {
    if old.kind != now.kind || old.mode != now.mode || old.uid != now.uid || old.gid != now.gid {
        return false;
    }
    match now.kind {
        // A directory's own content is its entries, settled one by one.
        Kind::Dir => true,
        Kind::File | Kind::Symlink => old.size == now.size && old.mtime_ns == now.mtime_ns,
    }
}

fn ctx(what: &str, p: &RelPath, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("could not {what} '{p}': {e}"))
}

fn join_bytes(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut v = a.to_vec();
    if !v.is_empty() {
        v.push(b'/');
    }
    v.extend_from_slice(b);
    v
}

/// The store areas for hidden entries, borrowed from whoever holds them
/// open.
#[derive(Clone, Copy)]
pub struct Areas<'a> {
    pub root_fd: BorrowedFd<'a>,
    pub parked_fd: BorrowedFd<'a>,
    pub orphans_fd: BorrowedFd<'a>,
}

impl Areas<'_> {
    /// Moves the attached area `parked/<key>` (if any) to the orphan area
    /// and journals it. Returns whether there was one.
    pub fn orphan_key(
        &self,
        key: &str,
        logical: &RelPath,
        ledger: &mut Ledger,
        actor: &Actor,
    ) -> io::Result<bool> {
        match sys::lstatat(self.parked_fd, key.as_bytes()) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(e),
        }
        let dest = format!("{key}.{}", skillfs_base::time::now_ns());
        sys::renameat2(
            self.parked_fd,
            key.as_bytes(),
            self.orphans_fd,
            dest.as_bytes(),
            0,
        )?;
        let mut c = Change::new(
            Op::Orphan,
            RelPath::parse(format!("orphans/{dest}").as_bytes()).unwrap_or_default(),
            None,
        );
        c.hidden = Some(logical.clone());
        ledger.record(c, actor.clone())?;
        Ok(true)
    }
}

/// Walks visible subtrees, hiding what the rules hide and recording what
/// differs from the catalog.
pub struct Settler<'a> {
    pub areas: Areas<'a>,
    pub rules: &'a HideRules,
    pub ledger: &'a mut Ledger,
    pub blobs: &'a BlobStore,
    pub actor: Actor,
    pub report: ScanReport,
    /// Visible paths of the entries moved to an attached area.
    pub moved_to_hidden: Vec<RelPath>,
    /// Keys of every visible directory walked, with its path and whether it
    /// is inside a skill package.
    pub keys: HashMap<String, (RelPath, bool)>,
    /// Visible paths walked (for the removals of the full scan).
    seen: HashSet<RelPath>,
    /// Content stored ahead of the settle (see `Prehashed`).
    pub prehashed: Prehashed,
    /// Attached entries swept: their directory and name.
    pub swept_entries: Vec<(RelPath, Vec<u8>)>,
    /// Move entries between the visible tree and the parks when the hide
    /// rules now say otherwise (at mount). A sweep while mounted does not:
    /// there hidden-ness is decided where a name is placed, and the kernel
    /// and the daemon's inode table know each entry where it was placed.
    pub relocate: bool,
    /// The last shutdown was unclean: a file found empty or zero-filled
    /// where history holds it whole is put back (see `torn`).
    pub repair_torn: bool,
    /// One line per file put back after a power cut, for the mount to say.
    pub repairs: Vec<String>,
}

impl<'a> Settler<'a> {
    pub fn new(
        areas: Areas<'a>,
        rules: &'a HideRules,
        ledger: &'a mut Ledger,
        blobs: &'a BlobStore,
        actor: Actor,
    ) -> Self {
        Settler {
            areas,
            rules,
            ledger,
            blobs,
            actor,
            report: ScanReport::default(),
            moved_to_hidden: Vec::new(),
            keys: HashMap::new(),
            seen: HashSet::new(),
            swept_entries: Vec::new(),
            prehashed: Prehashed::new(),
            relocate: true,
            repair_torn: false,
            repairs: Vec::new(),
        }
    }

    pub fn record(&mut self, c: Change) -> io::Result<()> {
        self.ledger.record(c, self.actor.clone())?;
        self.report.recorded += 1;
        Ok(())
    }

    /// The state of a visible entry, reading its content unless the catalog
    /// already has this exact state. `None` when unchanged.
    fn changed_state(
        &mut self,
        path: &RelPath,
        st: &libc::stat,
        kind: Kind,
    ) -> io::Result<Option<EntryState>> {
        let root = self.areas.root_fd;
        let mut now = state_from_stat(st, kind);
        if !self.differs(path, &now, false) {
            return Ok(None);
        }
        match kind {
            Kind::File => match self.prehashed.blob_of(st, self.blobs) {
                Some(id) => {
                    now.blob = Some(id);
                    now.size = st.st_size as u64;
                }
                None => {
                    let f =
                        open_content(root, path.as_bytes()).map_err(|e| ctx("open", path, e))?;
                    let (id, size) = self
                        .blobs
                        .put_reader(&f)
                        .map_err(|e| ctx("store", path, e))?;
                    self.report.hashed += 1;
                    now.blob = Some(id);
                    now.size = size;
                }
            },
            Kind::Symlink => {
                let t = sys::readlinkat(root, path.as_bytes())
                    .map_err(|e| ctx("read link", path, e))?;
                now.target = Some(ByteString(t));
            }
            Kind::Dir => {}
        }
        Ok(self.differs(path, &now, true).then_some(now))
    }

    /// Whether `now` (from a stat, with its content if `content` says it
    /// was read) is a new version of `path` against the catalog. Not when
    /// nothing that counts changed and the recorded content is intact; nor,
    /// once the content is known, when the same content, mode and owner
    /// come under a new mtime (rewritten with identical bytes while
    /// unmounted): the catalog keeps the old mtime, so the next mount reads
    /// it again.
    pub fn differs(&self, path: &RelPath, now: &EntryState, content: bool) -> bool {
        let Some(old) = self.ledger.catalog().get(path) else {
            return true;
        };
        // A file recorded with no content (by a daemon that journaled a
        // chmod of a file written behind it, before it met such files
        // whole) is read again, so its content is versioned at last.
        let intact = || match old.blob.as_deref() {
            Some(b) => self.blobs.has_intact(b, old.size),
            None => old.kind != Kind::File,
        };
        if unchanged(old, now) && intact() {
            return false;
        }
        !content
            || (EntryState {
                mtime_ns: now.mtime_ns,
                ..old.clone()
            }) != *now
    }

    /// Moves the visible entry `dir/name` to the attached area of `dir`.
    /// Whether the rules hide `name` of `kind` in visible `dir` (found in
    /// the root; a symlink judged by where it leads, see `follow`).
    fn hides(&self, dir: &RelPath, name: &[u8], kind: Kind, in_pkg: bool) -> bool {
        let path = dir.join(name);
        let target = (kind == Kind::Symlink)
            .then(|| sys::readlinkat(self.areas.root_fd, path.as_bytes()).ok())
            .flatten();
        let mut hidden = |k: Kind| self.rules.is_hidden(name, k, dir.is_root(), &mut || in_pkg);
        let (root, parked) = (self.areas.root_fd, self.areas.parked_fd);
        crate::follow::hides(
            root,
            parked,
            self.rules,
            dir,
            name,
            kind,
            target.as_deref(),
            &mut hidden,
        )
    }

    pub fn hide(&mut self, dir: &RelPath, name: &[u8]) -> io::Result<()> {
        let path = dir.join(name);
        let key =
            sys::dir_key(self.areas.root_fd, dir.as_bytes()).map_err(|e| ctx("stat", dir, e))?;
        sys::ensure_dir_at(self.areas.parked_fd, key.as_bytes(), 0o700)?;
        let target = join_bytes(key.as_bytes(), name);
        if let Ok(existing) = sys::lstatat(self.areas.parked_fd, &target) {
            let src_st = sys::lstatat(self.areas.root_fd, path.as_bytes())?;
            let both_dirs =
                kind_of(&existing) == Some(Kind::Dir) && kind_of(&src_st) == Some(Kind::Dir);
            if both_dirs {
                // The same park made again while unmounted (a second
                // `.curator_backups`): merge its entries into the one kept.
                self.merge_into_park(&path, &target)?;
                self.report.parked += 1;
                self.moved_to_hidden.push(path);
                return Ok(());
            }
            // An older park of the same name: keep it, as an orphan.
            let aside = format!("{key}.{}", skillfs_base::time::now_ns());
            sys::ensure_dir_at(self.areas.orphans_fd, aside.as_bytes(), 0o700)?;
            sys::renameat2(
                self.areas.parked_fd,
                &target,
                self.areas.orphans_fd,
                &join_bytes(aside.as_bytes(), name),
                0,
            )?;
            let mut c = Change::new(
                Op::Orphan,
                RelPath::parse(format!("orphans/{aside}").as_bytes()).unwrap_or_default(),
                None,
            );
            c.hidden = Some(path.clone());
            self.record(c)?;
            self.report.orphaned += 1;
        }
        sys::renameat2(
            self.areas.root_fd,
            path.as_bytes(),
            self.areas.parked_fd,
            &target,
            0,
        )
        .map_err(|e| ctx("park", &path, e))?;
        if self.ledger.catalog().get(&path).is_some() {
            let mut c = Change::new(Op::Park, path.clone(), None);
            c.hidden = Some(path.clone());
            self.record(c)?;
        }
        self.report.parked += 1;
        self.moved_to_hidden.push(path);
        Ok(())
    }

    /// Moves the entries of the visible directory `path` into the existing
    /// park `target` (under `parked/`), then removes the emptied directory.
    /// A name taken in both goes to the orphans instead.
    fn merge_into_park(&mut self, path: &RelPath, target: &[u8]) -> io::Result<()> {
        let root = self.areas.root_fd;
        for e in sys::read_dir_at(root, path.as_bytes())? {
            let from = path.join(&e.name);
            let to = join_bytes(target, &e.name);
            let moved = sys::renameat2(
                root,
                from.as_bytes(),
                self.areas.parked_fd,
                &to,
                libc::RENAME_NOREPLACE,
            );
            if let Err(err) = moved {
                if err.raw_os_error() != Some(libc::EEXIST) {
                    return Err(err);
                }
                let aside = format!("merge.{}", skillfs_base::time::now_ns());
                sys::ensure_dir_at(self.areas.orphans_fd, aside.as_bytes(), 0o700)?;
                let dest = join_bytes(aside.as_bytes(), &e.name);
                sys::renameat2(root, from.as_bytes(), self.areas.orphans_fd, &dest, 0)?;
                let store_path = RelPath::parse(format!("orphans/{aside}").as_bytes());
                let mut c = Change::new(Op::Orphan, store_path.unwrap_or_default(), None);
                c.hidden = Some(from);
                self.record(c)?;
                self.report.orphaned += 1;
            }
        }
        sys::unlinkat(root, path.as_bytes(), true)?;
        if self.ledger.catalog().get(path).is_some() {
            let mut c = Change::new(Op::Park, path.clone(), None);
            c.hidden = Some(path.clone());
            self.record(c)?;
        }
        Ok(())
    }

    /// Settles the visible subtree at `top`. `record_top`: record `top`
    /// itself (an unparked entry) with `op`; the root never is. `in_pkg`:
    /// an ancestor of `top` holds a `SKILL.md`.
    pub fn settle(
        &mut self,
        top: &RelPath,
        op: Op,
        record_top: bool,
        in_pkg: bool,
        hidden_from: Option<RelPath>,
    ) -> io::Result<()> {
        let root = self.areas.root_fd;
        let top_st = sys::lstatat(root, top.as_bytes()).map_err(|e| ctx("stat", top, e))?;
        let top_kind = kind_of(&top_st);
        if record_top && let Some(kind) = top_kind {
            self.seen.insert(top.clone());
            if let Some(state) = self.changed_state(top, &top_st, kind)? {
                let mut c = Change::new(op, top.clone(), Some(state));
                c.hidden = hidden_from;
                self.record(c)?;
            }
        }
        if top_kind != Some(Kind::Dir) {
            return Ok(());
        }
        let mut stack = vec![(top.clone(), in_pkg)];
        while let Some((dir, above_pkg)) = stack.pop() {
            let mut names =
                sys::read_dir_at(root, dir.as_bytes()).map_err(|e| ctx("list", &dir, e))?;
            names.sort_by(|a, b| a.name.cmp(&b.name));
            let in_pkg = above_pkg || names.iter().any(|n| n.name == b"SKILL.md");
            if let Ok(key) = sys::dir_key(root, dir.as_bytes()) {
                self.keys.insert(key, (dir.clone(), in_pkg));
            }
            let mut subdirs = Vec::new();
            for ent in names {
                let path = dir.join(&ent.name);
                let st = match sys::lstatat(root, path.as_bytes()) {
                    Ok(st) => st,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => return Err(ctx("stat", &path, e)),
                };
                let Some(kind) = kind_of(&st) else {
                    tracing::warn!("not versioned (not a file, directory or symlink): {path}");
                    continue;
                };
                if self.relocate && self.hides(&dir, &ent.name, kind, in_pkg) {
                    self.hide(&dir, &ent.name)?;
                    continue;
                }
                if self.rules.is_untracked(&path, kind) {
                    continue; // visible, but no versions are kept
                }
                self.report.entries += 1;
                self.seen.insert(path.clone());
                if let Some(state) = self.changed_state(&path, &st, kind)? {
                    let torn = match op {
                        Op::Scan => self.torn_version(&path, &state).unwrap_or_else(|e| {
                            tracing::warn!("{path}: could not judge it after a power cut: {e}");
                            None
                        }),
                        _ => None,
                    };
                    match torn {
                        Some((old, bytes, seen)) => {
                            self.put_back(&path, state, &seen, old, &bytes)?;
                        }
                        None => self.record(Change::new(op, path.clone(), Some(state)))?,
                    }
                }
                if kind == Kind::Dir {
                    subdirs.push((path, in_pkg));
                }
            }
            // Depth-first in name order: push in reverse so the first pops first.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    /// Records the entry at `path` alone (a directory without its entries)
    /// with `op`, its content read, if it differs from the catalog; nothing
    /// if it is gone or is no file, directory or symlink.
    pub fn settle_entry(&mut self, path: &RelPath, op: Op) -> io::Result<()> {
        let st = match sys::lstatat(self.areas.root_fd, path.as_bytes()) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(ctx("stat", path, e)),
        };
        let Some(kind) = kind_of(&st) else {
            return Ok(());
        };
        if let Some(state) = self.changed_state(path, &st, kind)? {
            self.record(Change::new(op, path.clone(), Some(state)))?;
        }
        Ok(())
    }

    /// After settling the whole root: records what the catalog has that the
    /// tree no longer does.
    pub fn record_removals(&mut self) -> io::Result<()> {
        let gone: Vec<RelPath> = self
            .ledger
            .catalog()
            .iter()
            .map(|(p, _)| p)
            .filter(|p| !self.seen.contains(*p))
            .filter(|p| {
                p.parent()
                    .is_none_or(|par| par.is_root() || self.seen.contains(&par))
            })
            .cloned()
            .collect();
        for p in gone {
            self.record(Change::new(Op::ScanRemove, p, None))?;
            self.report.removed += 1;
        }
        Ok(())
    }
}

/// Opens the regular file `rel` (under `dirfd`) to read its content: never
/// through a symlink, never blocking on a FIFO put in its place. A file of
/// the daemon's own user without read permission (`chmod 000`, written
/// behind the daemon) is read with the owner's read bit lent for the open:
/// set and put back through a descriptor of the inode checked, never by a
/// path a symlink could redirect.
pub fn open_content(dirfd: BorrowedFd<'_>, rel: &[u8]) -> io::Result<std::fs::File> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let denied = match sys::openat(dirfd, rel, flags, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => e,
        r => return r,
    };
    let pinned = sys::openat(dirfd, rel, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
    let st = sys::fstat(&pinned)?;
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != me {
        return Err(denied);
    }
    let inode = format!("/proc/self/fd/{}", pinned.as_raw_fd());
    let mode = st.st_mode & 0o7777;
    let set = |m: u32| std::fs::set_permissions(&inode, std::fs::Permissions::from_mode(m));
    set(mode | 0o400)?;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&inode);
    let restored = set(mode);
    let f = opened?;
    restored?;
    Ok(f)
}

/// Content stored ahead of a settle, outside the namespace lock (see
/// `SkillFs::prehash`): by (device, inode), the size, mtime and ctime it was
/// read under, and its blob. A file whose three are still the same has not
/// changed since (every write moves mtime and ctime, and no one can set
/// ctime back); one changed in the clock tick of its read is never here
/// (a write in the same tick keeps its times).
#[derive(Default)]
pub struct Prehashed(HashMap<(u64, u64), (i64, i128, i128, String)>);

impl Prehashed {
    pub fn new() -> Prehashed {
        Prehashed::default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Stores the content of `f`, read now: its blob, if its times did not
    /// move across the read. It is kept for a later settle (`blob_of`) only
    /// if its times were also older than `tick_ns` when it was read: a
    /// write within the same clock tick keeps them, so a settle could not
    /// tell it from what was read.
    pub fn add(
        &mut self,
        f: &std::fs::File,
        blobs: &BlobStore,
        tick_ns: i128,
    ) -> io::Result<Option<String>> {
        let before = sys::fstat(f)?;
        let times = |st: &libc::stat| (st.st_size, sys::mtime_ns(st), ctime_ns(st));
        let now = skillfs_base::time::now_ns() as i128;
        let (_, mtime, ctime) = times(&before);
        let racy = mtime.max(ctime) > now - tick_ns;
        let (id, _) = blobs.put_reader(f)?;
        let after = sys::fstat(f)?;
        if times(&after) != times(&before) {
            return Ok(None);
        }
        if !racy {
            let (size, mtime, ctime) = times(&after);
            self.0.insert(
                (after.st_dev, after.st_ino),
                (size, mtime, ctime, id.clone()),
            );
        }
        Ok(Some(id))
    }

    /// The blob of the file `st` describes, if stored ahead and unchanged.
    fn blob_of(&self, st: &libc::stat, blobs: &BlobStore) -> Option<String> {
        let (size, mtime, ctime, id) = self.0.get(&(st.st_dev, st.st_ino))?;
        (*size == st.st_size
            && *mtime == sys::mtime_ns(st)
            && *ctime == ctime_ns(st)
            && blobs.has_intact(id, *size as u64))
        .then(|| id.clone())
    }
}

fn ctime_ns(st: &libc::stat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}
