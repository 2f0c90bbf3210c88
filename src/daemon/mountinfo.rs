//! Which mounts there are, read from `/proc/self/mountinfo`, and which of
//! them are skillfs's (their source names the store).
//!
//! Invariants: an unreadable mountinfo or a line it cannot parse is no
//! mount (nothing here fails); names come unescaped, byte for byte.
//!
//! Locks: none.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

pub use skillfs_base::mounts::{MountInfo, SOURCE_PREFIX, mount_at, mounts};

/// The mount serving the versioned root `root`: a mount over it, or over
/// its parent (a home), whose store versions `root` (a mount over a home
/// serves its versioned directory, not the home itself).
pub fn mount_serving(root: &Path) -> Option<MountInfo> {
    for at in [Some(root), root.parent()].into_iter().flatten() {
        let Some(m) = mount_at(at) else { continue };
        let Some(store) = m.skillfs_store() else {
            continue;
        };
        match crate::store::RootId::read(&crate::store::Layout::new(store)) {
            Some(id) if id.path == root => return Some(m),
            // A store from before its `ROOT` file: a mount over `root` itself.
            None if at == root => return Some(m),
            _ => {}
        }
    }
    None
}

/// The versioned directory a command given `root` means: `root` itself,
/// or, where `root` is a home mounted (or last mounted) with its one
/// versioned directory, that directory.
pub fn versioned_root_of(root: &Path) -> PathBuf {
    let store = mount_at(root)
        .and_then(|m| m.skillfs_store())
        .or_else(|| crate::store::Layout::default_dir(root).filter(|d| crate::store::is_store(d)));
    if let Some(s) = store
        && let Some(id) = crate::store::RootId::read(&crate::store::Layout::new(s))
        && id.path.parent() == Some(root)
    {
        return id.path;
    }
    root.to_path_buf()
}
