//! Where ROOT and its store are, and whether they may be mounted: ROOT made
//! absolute without touching it, the store directory, and the refusals of
//! a ROOT that is no directory, is mounted already, or nests with another
//! skillfs mount.
//!
//! Invariants: these checks only read; every one of them runs before
//! anything in ROOT or an existing store is changed (see `prepare`).
//!
//! Locks: none.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::mountinfo::{mount_at, mounts};
use crate::error::{Exit, Failure};
use crate::store::Layout;

/// `ROOT` made absolute without touching ROOT itself (a dead mount answers
/// every access to it with ENOTCONN): only its parent is resolved.
pub fn absolute_root(root: &Path) -> Result<PathBuf, Failure> {
    let abs = if root.is_absolute() {
        root.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| {
                Failure::new(
                    Exit::BadRoot,
                    format!("could not read the current directory: {e}"),
                )
            })?
            .join(root)
    };
    let mut cur = abs;
    // Follow a symlinked ROOT by reading the link (in its parent), never by
    // resolving ROOT itself.
    for _ in 0..40 {
        let Some(name) = cur.file_name().map(|n| n.to_os_string()) else {
            // `/` or a path ending in `..`: nothing of it can be our mount.
            return cur
                .canonicalize()
                .map_err(|e| Failure::io(Exit::BadRoot, "resolve ROOT", &cur, &e));
        };
        let parent = cur.parent().unwrap_or(Path::new("/"));
        let parent = parent
            .canonicalize()
            .map_err(|e| Failure::io(Exit::BadRoot, "resolve the parent of ROOT", parent, &e))?;
        let joined = parent.join(&name);
        match fs::symlink_metadata(&joined) {
            Ok(md) if md.file_type().is_symlink() => {
                let target = fs::read_link(&joined)
                    .map_err(|e| Failure::io(Exit::BadRoot, "read the link", &joined, &e))?;
                cur = parent.join(target);
            }
            _ => return Ok(joined),
        }
    }
    Err(Failure::new(
        Exit::BadRoot,
        format!(
            "ROOT '{}': too many levels of symbolic links",
            root.display()
        ),
    ))
}

/// The store of the versioned root `root` when nothing is mounted: its
/// own default one, else that of a mount over its parent (a home) if that
/// store versions `root`.
pub fn default_store_of(root: &Path) -> Result<PathBuf, Failure> {
    let own = store_dir(root, None)?;
    if crate::store::is_store(&own) {
        return Ok(own);
    }
    if let Some(home) = root.parent().and_then(Layout::default_dir)
        && crate::store::RootId::read(&Layout::new(home.clone())).is_some_and(|id| id.path == root)
    {
        return Ok(home);
    }
    Ok(own)
}

/// The store directory for `root` (not created), made absolute.
pub fn store_dir(root: &Path, store: Option<&Path>) -> Result<PathBuf, Failure> {
    match store {
        Some(s) => {
            if s.is_absolute() {
                Ok(s.to_path_buf())
            } else {
                Ok(std::env::current_dir()
                    .map_err(|e| {
                        Failure::new(
                            Exit::BadStore,
                            format!("could not read the current directory: {e}"),
                        )
                    })?
                    .join(s))
            }
        }
        None => Layout::default_dir(root).ok_or_else(|| {
            Failure::new(
                Exit::BadRoot,
                format!("ROOT '{}' has no parent to keep a store in", root.display()),
            )
        }),
    }
}

/// The deepest existing ancestor of `p` (canonical), and the rest of `p`.
pub(super) fn existing_ancestor(p: &Path) -> (PathBuf, PathBuf) {
    let mut cur = p.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = cur.canonicalize() {
            let mut tail = PathBuf::new();
            for r in rest.iter().rev() {
                tail.push(r);
            }
            return (c, tail);
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(n), Some(par)) => {
                rest.push(n);
                cur = par.to_path_buf();
            }
            _ => return (PathBuf::from("/"), PathBuf::new()),
        }
    }
}

pub(super) fn check_root(root: &Path) -> Result<(), Failure> {
    match fs::metadata(root) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => {
            return Err(Failure::new(
                Exit::BadRoot,
                format!("ROOT '{}' is not a directory", root.display()),
            ));
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(Failure::new(
                Exit::BadRoot,
                format!(
                    "ROOT '{}' is a dead mount of another store (its daemon died): run \
                     `skillfs umount {}` first",
                    root.display(),
                    root.display()
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Failure::new(
                Exit::BadRoot,
                format!("ROOT '{}' does not exist", root.display()),
            ));
        }
        Err(e) => return Err(Failure::io(Exit::BadRoot, "stat ROOT", root, &e)),
    }
    if let Some(m) = mount_at(root)
        && m.fstype.starts_with("fuse")
    {
        return Err(Failure::new(
            Exit::BadRoot,
            format!(
                "ROOT '{}' is already mounted ({}, from {})",
                root.display(),
                m.fstype,
                m.source.display()
            ),
        ));
    }
    Ok(())
}

/// Refuses nested mounts: ROOT inside a skillfs mount (its store would be
/// in the outer tree, and every write versioned twice), a skillfs mount
/// inside ROOT (the scan would read it through its daemon), and a store
/// inside a skillfs mount.
pub(super) fn check_nesting(root: &Path, store: &Path) -> Result<(), Failure> {
    for m in mounts() {
        if m.skillfs_store().is_none() || m.mount_point == root {
            continue;
        }
        let mp = &m.mount_point;
        let why = if root.starts_with(mp) {
            (
                Exit::BadRoot,
                format!(
                    "ROOT '{}' is inside the skillfs mount '{}': mount only the outer one",
                    root.display(),
                    mp.display()
                ),
            )
        } else if mp.starts_with(root) {
            (
                Exit::BadRoot,
                format!(
                    "ROOT '{}' holds the skillfs mount '{}': unmount that one first",
                    root.display(),
                    mp.display()
                ),
            )
        } else if store.starts_with(mp) {
            (
                Exit::BadStore,
                format!(
                    "store '{}' is inside the skillfs mount '{}': it would be versioned there",
                    store.display(),
                    mp.display()
                ),
            )
        } else {
            continue;
        };
        return Err(Failure::new(why.0, why.1));
    }
    Ok(())
}
