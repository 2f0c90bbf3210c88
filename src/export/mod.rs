//! `skillfs export`: history taken elsewhere, read from the store (mounted
//! or not) and never written back into it.
//!
//! One question a file:
//! - `tar`: the tree at an id as a gzip tar, laid out as the agent's
//!   curator snapshots are (`agent/curator_backup.py`);
//! - `curator`: such a tarball and its `manifest.json` as a snapshot
//!   directory in `<ROOT>/.curator_backups/`, written through the mount;
//! - `git`: every change as a commit, by a `git fast-import` stream.
//!
//! This file holds what they share: which ids exist, the entries of a tree
//! in the agent's order, where an output may go, and the output file that
//! appears whole or not at all.
//!
//! Invariants:
//! - whether an id exists and what the tree at it holds are asked of the
//!   history index alone ([`exists`], `HistoryIndex::state_at`,
//!   `children_at`, `changed_between`): retention that forgets ids changes
//!   them there, and export follows;
//! - nothing is written into ROOT or the store, except `--curator`, which
//!   writes its snapshot through the mount on purpose (`curator`);
//! - a failed export leaves nothing behind: files are written under a
//!   temporary name in their own directory and renamed into place last.
//!
//! Locks: none; the store is read once per command (`commands::Store`).

pub mod curator;
pub mod git;
pub mod tar;

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::history::{Alias, ROOT_IDX};
use crate::relpath::RelPath;
use crate::store::journal::{EntryState, Kind};
use crate::sys;

/// Top-level entries the agent never puts in a snapshot (its
/// `_EXCLUDE_TOP_LEVEL`): the snapshots themselves, and the hub's skills,
/// which the hub manages and a rollback must leave alone.
pub const AGENT_EXCLUDED: &[&[u8]] = &[b".curator_backups", b".hub"];

/// Whether change `id` is in history (and its tree can be exported).
pub fn exists(store: &Store, id: u64) -> bool {
    store.index.resolve(ROOT_IDX, Alias::Id(id)).is_some()
}

/// What a tree holds, by kind.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub files: usize,
    pub dirs: usize,
    pub symlinks: usize,
}

impl Counts {
    pub fn of(entries: &[(RelPath, EntryState)]) -> Counts {
        let mut c = Counts::default();
        for (_, s) in entries {
            match s.kind {
                Kind::File => c.files += 1,
                Kind::Dir => c.dirs += 1,
                Kind::Symlink => c.symlinks += 1,
            }
        }
        c
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "files {}, directories {}, symlinks {}",
            self.files, self.dirs, self.symlinks
        )
    }
}

/// The entries at and below `under` just after change `id`, in the order
/// the agent's snapshot writes them: depth first, each directory before
/// what it holds, names in byte order (Python's `sorted(os.listdir())`).
/// `under` itself comes first unless it is the root, which no snapshot
/// holds. With `agent_layout`, the top-level entries the agent leaves out
/// ([`AGENT_EXCLUDED`]) are left out of a whole-tree export.
pub fn entries(
    store: &Store,
    id: u64,
    under: &RelPath,
    agent_layout: bool,
) -> Result<Vec<(RelPath, EntryState)>, Failure> {
    let (idx, st) = store.lookup(under, id)?;
    let mut out = Vec::new();
    if let Some(s) = st {
        out.push((under.clone(), s.clone()));
        if s.kind != Kind::Dir {
            return Ok(out);
        }
    }
    let kids = |i| {
        let mut v = store.index.children_at(i, id);
        if i == ROOT_IDX && agent_layout {
            v.retain(|(c, _)| !AGENT_EXCLUDED.contains(&store.index.path(*c).file_name()));
        }
        v
    };
    // A stack of each directory's remaining children, newest last: the
    // walk needs no recursion however deep the tree.
    let mut stack = vec![kids(idx).into_iter().rev().collect::<Vec<_>>()];
    while let Some(top) = stack.last_mut() {
        let Some((c, s)) = top.pop() else {
            stack.pop();
            continue;
        };
        out.push((store.index.path(c).clone(), s.clone()));
        if s.kind == Kind::Dir {
            stack.push(kids(c).into_iter().rev().collect());
        }
    }
    Ok(out)
}

/// `p` with its symlinks resolved where it exists; a missing last part is
/// kept as given (an output about to be made).
fn resolved(p: &Path) -> Option<PathBuf> {
    match p.canonicalize() {
        Ok(c) => Some(c),
        Err(_) => Some(p.parent()?.canonicalize().ok()?.join(p.file_name()?)),
    }
}

/// Refuses an output at `out` inside ROOT or the store: an export written
/// into the versioned tree would be versioned itself (almost certainly a
/// mistake), and the store holds history, never exports. `what` names the
/// output in the message ("-o", "--git").
pub fn refuse_inside(out: &Path, root: &Path, store: &Path, what: &str) -> Result<(), Failure> {
    // ROOT is never resolved through itself (a dead mount answers
    // ENOTCONN): its parent is, and its name is kept.
    let root_real = root
        .parent()
        .and_then(|p| p.canonicalize().ok())
        .and_then(|p| Some(p.join(root.file_name()?)))
        .unwrap_or_else(|| root.to_path_buf());
    let out_real = resolved(out).unwrap_or_else(|| out.to_path_buf());
    let store_real = store.canonicalize().unwrap_or_else(|_| store.to_path_buf());
    for (inside, name) in [
        (&root_real, "the versioned directory"),
        (&store_real, "the store"),
    ] {
        if out_real.starts_with(inside) || out.starts_with(inside) {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "{what} '{}' is inside {name} '{}': an export is written outside it \
                     (to put a snapshot where the agent's rollback finds it, use --curator)",
                    out.display(),
                    inside.display()
                ),
            ));
        }
    }
    Ok(())
}

/// A file that appears at its path whole, or not at all: written under a
/// temporary name in the same directory, then renamed over (`replace`) or
/// into place. Dropped without [`Output::commit`], it removes itself.
pub struct Output {
    dir: File,
    tmp: Vec<u8>,
    name: Vec<u8>,
    file: File,
    pub path: PathBuf,
}

impl Output {
    /// Starts `path`; an existing `path` is refused unless `replace`.
    pub fn create(path: &Path, replace: bool) -> Result<Output, Failure> {
        let usage = |m: String| Failure::new(Exit::Usage, m);
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(usage(format!("'{}' names no file", path.display())));
        };
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        let dir = sys::openat(
            sys::CWD,
            parent.as_os_str().as_bytes(),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map_err(|e| Failure::io(Exit::Usage, "open the directory", parent, &e))?;
        let name = name.as_bytes().to_vec();

        check_target(dir.as_fd(), &name, path, replace)?;
        let mut tmp = b".".to_vec();
        tmp.extend_from_slice(&name);
        tmp.extend_from_slice(
            format!(
                ".skillfs-export-{}-{}.tmp",
                std::process::id(),
                crate::time::now_ns()
            )
            .as_bytes(),
        );
        // The owner's alone (a stricter umask narrows it further): the
        // history may hold files only their owner could read.
        let file = sys::openat(
            dir.as_fd(),
            &tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )
        .map_err(|e| Failure::io(Exit::Internal, "create a file in", parent, &e))?;
        Ok(Output {
            dir,
            tmp,
            name,
            file,
            path: path.to_path_buf(),
        })
    }

    /// The file being written.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Makes the content durable and puts it at its path.
    pub fn commit(mut self, replace: bool) -> Result<(), Failure> {
        let io = |what: &str, e: std::io::Error| Failure::io(Exit::Internal, what, &self.path, &e);
        sys::fsync(&self.file).map_err(|e| io("write", e))?;
        let d = self.dir.as_fd();
        // What took the name since `create` looked is judged again.
        check_target(d, &self.name, &self.path, replace)?;
        // No replace: the name must still be free (another writer may have
        // taken it since `create` looked).
        let flags = if replace { 0 } else { libc::RENAME_NOREPLACE };
        sys::renameat2(d, &self.tmp, d, &self.name, flags).map_err(|e| {
            if e.raw_os_error() == Some(libc::EEXIST) {
                Failure::new(
                    Exit::Usage,
                    format!(
                        "'{}' exists: give --force to replace it",
                        self.path.display()
                    ),
                )
            } else {
                io("rename into place", e)
            }
        })?;
        self.tmp.clear();
        let _ = sys::fsync(&self.dir);
        Ok(())
    }
}

/// What `-o` may land on: a free name or, with `replace`, a regular file
/// or a symlink (the link itself is replaced, its target never written)
/// that leads to a file or nowhere. Never a directory, a device, a FIFO or
/// a socket, nor a link to one: `-o /dev/null --force` as root would turn
/// the system's `/dev/null` into a file, `-o /dev/stdout` its link.
fn check_target(
    dir: BorrowedFd<'_>,
    name: &[u8],
    path: &Path,
    replace: bool,
) -> Result<(), Failure> {
    let usage = |m: String| Err(Failure::new(Exit::Usage, m));
    let Ok(st) = sys::lstatat(dir, name) else {
        return Ok(());
    };
    let fmt = st.st_mode & libc::S_IFMT;
    if fmt == libc::S_IFDIR {
        return usage(format!(
            "'{}' is a directory: -o takes a file name",
            path.display()
        ));
    }
    let leads = match fmt {
        libc::S_IFREG => None,
        libc::S_IFLNK => sys::statat(dir, name)
            .ok()
            .map(|t| t.st_mode & libc::S_IFMT)
            .filter(|&t| t != libc::S_IFREG)
            .map(|t| format!("a symlink to {}", kind(t))),
        _ => Some(kind(fmt).to_string()),
    };
    if let Some(what) = leads {
        return usage(format!(
            "'{}' is {what}: -o writes a regular file, and --force replaces only a file or a \
             symlink",
            path.display()
        ));
    }
    if !replace {
        return usage(format!(
            "'{}' exists: give --force to replace it",
            path.display()
        ));
    }
    Ok(())
}

fn kind(fmt: libc::mode_t) -> &'static str {
    match fmt {
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symlink",
        _ => "not a regular file",
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.tmp.is_empty() {
            let _ = sys::unlinkat(self.dir.as_fd(), &self.tmp, false);
        }
    }
}
