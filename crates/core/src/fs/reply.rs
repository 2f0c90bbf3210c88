//! What the core answers a request with: an entry and its attributes'
//! lifetime, the kernel cache notices it asks for, a listing's entries,
//! an open's reply, and the attributes a setattr asks to change. Plain
//! values; the FUSE adapter turns them into the kernel's.

use std::fs::File;
use std::sync::Arc;

use super::Ino;
use skillfs_base::sys::Time;
use skillfs_store::journal::Kind;

/// An inode and its attributes (`st_ino` is ours).
#[derive(Clone, Copy)]
pub struct Entry {
    pub ino: Ino,
    pub stat: libc::stat,
    pub ttl: Ttl,
}

/// What the kernel must forget.
pub enum Invalidation {
    /// An inode's attributes and cached content (a directory's listing).
    Inode(Ino),
    /// A name in a directory.
    Entry(Ino, Vec<u8>),
    /// Answered once every invalidation sent before it has been delivered.
    Barrier(std::sync::mpsc::Sender<()>),
}

/// How long the kernel may cache an entry and its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// Live tree: long; the kernel sees every change go through it.
    Live,
    /// History: never changes.
    Immutable,
    /// A `.history` listing: grows with every change.
    Volatile,
    /// An alias (`latest`, `@-10m`): the name must be resolved again each
    /// time, the version it names never changes.
    Alias,
}

/// What `setattr` asks to change.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
    /// Made through an open file handle (`ftruncate`, `fchmod`…), not by path.
    pub via_handle: bool,
}

/// One directory entry of a listing.
#[derive(Clone)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub kind: Kind,
    /// Our inode when the kernel knows the entry; otherwise the underlying
    /// inode number with the top bit set (never one of ours, never 0, which
    /// some C libraries treat as a deleted entry).
    pub ino: Ino,
    /// `S_IFIFO` or `S_IFSOCK` for such a node (`kind` then says `File`),
    /// else 0.
    pub special: u32,
}

/// Flags the kernel should apply to an open file.
#[derive(Clone, Debug, Default)]
pub struct OpenReply {
    pub fh: u64,
    /// Read-only open: closing it has nothing to publish.
    pub no_flush: bool,
    /// The content never changes (a version under `.history`).
    pub immutable: bool,
    /// Reads and writes go to this file in the kernel, never through the
    /// daemon (FUSE passthrough): a plain file outside the versioned root,
    /// or a read-only open of a large file inside it that nothing else has
    /// open (and every open of that inode until its direct handles are
    /// gone). One file per inode for as long as it has such handles (the kernel
    /// refuses two backing files for one inode).
    pub backing: Option<Arc<File>>,
}
