//! The `.history` view: a read-only virtual tree over the history index.
//!
//! Every visible directory answers the name `.history` by lookup (no listing
//! shows it): a *listing* node whose entries are the ids of the changes at or
//! below that directory (at the root: every id), and which also resolves the
//! aliases `latest`, `@<UTC time>` and `@-<age>` without listing them. An id
//! names a *snapshot* node: that directory as it was just after that change;
//! below it, every entry as it was then, with its exact bytes, size, mode,
//! owner and mtime.
//!
//! Invariants:
//! - virtual inode numbers encode their node (no table, nothing to forget):
//!   bit 63 set; bit 62 for a listing; bits 32..62 the path index; bits 0..32
//!   the id. Real inode numbers never reach bit 62. A node of another
//!   replica's version (`theirs`) has bit 62 set and non-zero low bits (a
//!   listing's are zero): bits 32..62 its path's number there, bits 0..32
//!   its version's plus one;
//! - snapshot nodes never change, so the kernel may cache them for as long
//!   as it likes; listings grow, so they are cached for a second, and an
//!   alias is resolved again at every lookup;
//! - nothing under `.history` can be changed: every mutating call answers
//!   `EROFS`.
//!
//! Owns: [`HistoryView`], which borrows what it reads from the core (the
//! ledger's history index, the blob store, the root's attributes) and has
//! no access to the live tree; the core hands it the node and turns what it
//! answers into replies and handles. Locks: `ledger`, briefly, per call.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{DirEntry, Entry, Ino, Ttl};
use crate::error::{FsError, FsResult};
use skillfs_base::relpath::RelPath;
use skillfs_base::sys;
use skillfs_model::history::{Alias, PathIdx, ROOT_IDX, parse_alias};
use skillfs_model::ledger::Ledger;
use skillfs_store::blobs::{BlobStore, Opened};
use skillfs_store::journal::{EntryState, Kind};

use super::theirs::{Node, Theirs};

pub const HISTORY: &[u8] = b".history";
const VIRT: u64 = 1 << 63;
const LISTING: u64 = 1 << 62;
const SEQ_MASK: u64 = (1 << 32) - 1;
const IDX_MASK: u64 = (1 << 30) - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VNode {
    Listing(PathIdx),
    Snap(PathIdx, u64),
    /// Another replica's version (`theirs`): a path's number and a
    /// version's, as `Theirs` interned them.
    Theirs(u32, u32),
}

pub fn decode(ino: Ino) -> Option<VNode> {
    if ino & VIRT == 0 {
        return None;
    }
    let idx = ((ino >> 32) & IDX_MASK) as PathIdx;
    Some(if ino & LISTING != 0 {
        match ino & SEQ_MASK {
            0 => VNode::Listing(idx),
            n => VNode::Theirs(idx, (n - 1) as u32),
        }
    } else {
        VNode::Snap(idx, ino & SEQ_MASK)
    })
}

pub fn encode(v: VNode) -> Ino {
    match v {
        VNode::Listing(idx) => VIRT | LISTING | ((idx as u64 & IDX_MASK) << 32),
        VNode::Snap(idx, id) => VIRT | ((idx as u64 & IDX_MASK) << 32) | (id & SEQ_MASK),
        VNode::Theirs(p, n) => {
            VIRT | LISTING | ((p as u64 & IDX_MASK) << 32) | ((n as u64 + 1) & SEQ_MASK)
        }
    }
}

pub fn is_virtual(ino: Ino) -> bool {
    ino & VIRT != 0
}

fn stat_from_state(s: &EntryState) -> libc::stat {
    let mut st = sys::empty_stat();
    st.st_mode = s.mode
        | match s.kind {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
        };
    st.st_nlink = if s.kind == Kind::Dir { 2 } else { 1 };
    st.st_uid = s.uid;
    st.st_gid = s.gid;
    st.st_size = match s.kind {
        Kind::Symlink => s.target.as_ref().map_or(0, |t| t.0.len()) as i64,
        _ => s.size as i64,
    };
    st.st_blocks = (st.st_size + 511) / 512;
    st.st_blksize = 4096;
    let (sec, nsec) = sys::split_ns(s.mtime_ns);
    st.st_mtime = sec;
    st.st_mtime_nsec = nsec;
    st.st_atime = sec;
    st.st_atime_nsec = nsec;
    st.st_ctime = sec;
    st.st_ctime_nsec = nsec;
    st
}

/// The `.history` tree, read from the history index.
pub struct HistoryView<'a> {
    pub ledger: &'a Mutex<Ledger>,
    pub blobs: &'a BlobStore,
    /// The root: a version's directories are owned like it, and a snapshot
    /// of the root has its mode.
    pub root: &'a OwnedFd,
    /// Other replicas' versions, by the names `REPLICA:ID`.
    pub theirs: &'a Theirs,
}

impl HistoryView<'_> {
    /// A read-only directory's attributes, owned like the root.
    fn virtual_dir_stat(&self, mtime_ns: i64) -> FsResult<libc::stat> {
        let root = sys::fstat(self.root)?;
        let mut st = stat_from_state(&EntryState {
            kind: Kind::Dir,
            blob: None,
            size: 0,
            mode: 0o555,
            uid: root.st_uid,
            gid: root.st_gid,
            mtime_ns: mtime_ns.into(),
            target: None,
        });
        st.st_size = 4096;
        Ok(st)
    }

    /// A node of another replica's version: a file as git keeps its mode
    /// (0644, or 0755 if executable), a directory 0755, everything owned
    /// like the root and as old as the version.
    fn their_stat(&self, p: u32, n: u32) -> FsResult<libc::stat> {
        let (node, time) = self.theirs.node(p, n)?;
        let root = sys::fstat(self.root)?;
        let (kind, mode, size, target) = match node {
            Node::Dir => (Kind::Dir, 0o755, 0, None),
            Node::Entry(e) => {
                let mode = match e.kind {
                    Kind::Symlink => 0o777,
                    _ if e.exec => 0o755,
                    _ => 0o644,
                };
                (
                    e.kind,
                    mode,
                    e.size,
                    e.target.map(skillfs_base::relpath::ByteString),
                )
            }
        };
        let mut st = stat_from_state(&EntryState {
            kind,
            blob: None,
            size,
            mode,
            uid: root.st_uid,
            gid: root.st_gid,
            mtime_ns: time.into(),
            target,
        });
        if kind == Kind::Dir {
            st.st_size = 4096;
        }
        Ok(st)
    }

    /// `.history` looked up in the visible directory at `path`.
    pub fn listing_of(&self, path: &RelPath) -> FsResult<Entry> {
        let idx = self.ledger.lock().history_mut().intern(path);
        self.attr(VNode::Listing(idx), Ttl::Volatile)
    }

    pub fn attr(&self, v: VNode, ttl: Ttl) -> FsResult<Entry> {
        let ledger = self.ledger.lock();
        let h = ledger.history();
        let stat = match v {
            VNode::Listing(scope) => {
                // Its mtime moves with its newest id, which is how the
                // kernel's listing cache learns it grew.
                let t = h
                    .ids(scope)
                    .last()
                    .and_then(|id| h.time_of(id))
                    .unwrap_or(0)
                    .max(h.last_forget_time().unwrap_or(0));
                drop(ledger);
                self.virtual_dir_stat(t)?
            }
            // Forgotten since the kernel learned of it.
            VNode::Snap(_, id) if h.is_forgotten(id) => return Err(FsError::ENOENT),
            VNode::Snap(idx, id) if idx == ROOT_IDX => {
                let t = h.time_of(id).ok_or(FsError::ENOENT)?;
                drop(ledger);
                let mut st = self.virtual_dir_stat(t)?;
                st.st_mode = libc::S_IFDIR | (sys::fstat(self.root)?.st_mode & 0o7777);
                st
            }
            VNode::Snap(idx, id) => stat_from_state(h.state_at(idx, id).ok_or(FsError::ENOENT)?),
            VNode::Theirs(p, n) => {
                drop(ledger);
                self.their_stat(p, n)?
            }
        };
        let ino = encode(v);
        let mut stat = stat;
        stat.st_ino = ino;
        Ok(Entry { ino, stat, ttl })
    }

    pub fn lookup(&self, v: VNode, name: &[u8]) -> FsResult<Entry> {
        match v {
            VNode::Listing(scope) if Theirs::may_name(name) => {
                let path = self.ledger.lock().history().path(scope).clone();
                let (p, n) = self.theirs.resolve(name, path.as_bytes())?;
                // Looked up again: a rewritten branch may give the name
                // another version (what is below one never changes).
                self.attr(VNode::Theirs(p, n), Ttl::Volatile)
            }
            VNode::Listing(scope) => {
                let text = std::str::from_utf8(name).map_err(|_| FsError::ENOENT)?;
                let alias =
                    parse_alias(text, skillfs_base::time::now_ns()).ok_or(FsError::ENOENT)?;
                let id = self
                    .ledger
                    .lock()
                    .history()
                    .resolve(scope, alias)
                    .ok_or(FsError::ENOENT)?;
                // An id's name is looked up again soon: `forget` may take
                // it away (what is below it never changes while it stays).
                let ttl = match alias {
                    Alias::Id(_) => Ttl::Volatile,
                    _ => Ttl::Alias,
                };
                self.attr(VNode::Snap(scope, id), ttl)
            }
            VNode::Snap(idx, id) => {
                let child = {
                    let ledger = self.ledger.lock();
                    let h = ledger.history();
                    let c = h.child(idx, name).ok_or(FsError::ENOENT)?;
                    h.state_at(c, id).ok_or(FsError::ENOENT)?;
                    c
                };
                self.attr(VNode::Snap(child, id), Ttl::Immutable)
            }
            VNode::Theirs(p, n) => {
                let c = self.theirs.child(p, n, name)?;
                // Owned like the root, which may change: asked again as a
                // listing's are (the entries below never change).
                self.attr(VNode::Theirs(c, n), Ttl::Volatile)
            }
        }
    }

    pub fn readlink(&self, v: VNode) -> FsResult<Vec<u8>> {
        if let VNode::Theirs(p, n) = v {
            return match self.theirs.node(p, n)? {
                (Node::Entry(e), _) => e.target.ok_or(FsError::EINVAL),
                _ => Err(FsError::EINVAL),
            };
        }
        let VNode::Snap(idx, id) = v else {
            return Err(FsError::EINVAL);
        };
        let ledger = self.ledger.lock();
        let s = ledger.history().state_at(idx, id).ok_or(FsError::ENOENT)?;
        match (&s.kind, &s.target) {
            (Kind::Symlink, Some(t)) => Ok(t.0.clone()),
            _ => Err(FsError::EINVAL),
        }
    }

    /// A version's content for reading (the core makes the handle).
    pub fn open(&self, v: VNode, flags: i32) -> FsResult<Arc<Opened>> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(FsError::EROFS);
        }
        if let VNode::Theirs(p, n) = v {
            let e = match self.theirs.node(p, n)? {
                (Node::Entry(e), _) if e.kind == Kind::File => e,
                _ => return Err(FsError::EISDIR),
            };
            return self.theirs.content(&e);
        }
        let VNode::Snap(idx, id) = v else {
            return Err(FsError::EISDIR);
        };
        let blob = {
            let ledger = self.ledger.lock();
            let s = ledger.history().state_at(idx, id).ok_or(FsError::ENOENT)?;
            if s.kind == Kind::Dir {
                return Err(FsError::EISDIR);
            }
            s.blob.clone().ok_or(FsError::EIO)?
        };
        // Whatever the store answered, the version is unreadable: EIO.
        self.blobs
            .open(&blob)
            .map(Arc::new)
            .map_err(|e| FsError::EIO.context(format_args!("open blob {blob} of a version: {e}")))
    }

    /// The entries of a virtual directory.
    pub fn listing(&self, ino: Ino, v: VNode) -> FsResult<Vec<DirEntry>> {
        let ledger = self.ledger.lock();
        let h = ledger.history();
        let mut entries = vec![
            DirEntry {
                name: b".".to_vec(),
                kind: Kind::Dir,
                ino,
                special: 0,
            },
            DirEntry {
                name: b"..".to_vec(),
                kind: Kind::Dir,
                ino,
                special: 0,
            },
        ];
        match v {
            VNode::Listing(scope) => {
                let ids = h.ids(scope);
                entries.reserve(ids.len());
                for i in 0..ids.len() {
                    let id = ids.get(i).expect("in range");
                    // The change that removed or renamed away the directory
                    // is one of its ids, but there is no directory to show;
                    // a forgotten id shows nothing.
                    if !h.exists_at(scope, id) || h.is_forgotten(id) {
                        continue;
                    }
                    entries.push(DirEntry {
                        name: id.to_string().into_bytes(),
                        kind: Kind::Dir,
                        ino: encode(VNode::Snap(scope, id)),
                        special: 0,
                    });
                }
            }
            VNode::Snap(idx, id) => {
                if idx != ROOT_IDX {
                    let s = h.state_at(idx, id).ok_or(FsError::ENOENT)?;
                    if s.kind != Kind::Dir {
                        return Err(FsError::ENOTDIR);
                    }
                }
                for (c, s) in h.children_at(idx, id) {
                    entries.push(DirEntry {
                        name: h.path(c).file_name().to_vec(),
                        kind: s.kind,
                        ino: encode(VNode::Snap(c, id)),
                        special: 0,
                    });
                }
            }
            VNode::Theirs(p, n) => {
                drop(ledger);
                if !matches!(self.theirs.node(p, n)?, (Node::Dir, _)) {
                    return Err(FsError::ENOTDIR);
                }
                let children = self.theirs.children(p, n)?;
                for (name, kind, c) in children {
                    entries.push(DirEntry {
                        name,
                        kind,
                        ino: encode(VNode::Theirs(c, n)),
                        special: 0,
                    });
                }
            }
        }
        Ok(entries)
    }
}

/// Refuses changes under `.history` and to the name `.history` itself:
/// `exists` answers for creating the name, `EROFS` for the rest.
pub fn check_writable(parent: Ino, name: &[u8], creating: bool) -> FsResult<()> {
    if is_virtual(parent) {
        return Err(FsError::EROFS);
    }
    if name == HISTORY {
        return Err(if creating {
            FsError::EEXIST
        } else {
            FsError::EROFS
        });
    }
    Ok(())
}
