//! The home around the versioned root, for a mount over it
//! (`--versioned`): which locations are outside the versioned tree (plain,
//! written in place, no rule, no history), the versioned root's name held
//! like a mount point, and `.history` as a plain name out there.
//!
//! Locks: `tree` briefly (`writable`); the rest reads fixed state.

use super::*;

/// A mount over a home (`--versioned NAME`): the home's fd and the name
/// of the versioned root in it (see `tree`).
pub struct Home {
    pub fd: OwnedFd,
    pub versioned: Vec<u8>,
}

impl SkillFs {
    /// Whether `loc` is outside the versioned root, in the home around it:
    /// plain files, written in place, no rule, no history.
    pub(super) fn outside(&self, loc: &Location) -> bool {
        loc.area == Area::Home
    }

    /// Refuses changes under `.history` and to the name `.history` in the
    /// versioned tree (see `history_view::check_writable`); outside it the
    /// name is a plain one.
    pub(super) fn writable(&self, parent: Ino, name: &[u8], creating: bool) -> FsResult<()> {
        if name == HISTORY && self.tree.lock().is_outside(parent) {
            return Ok(());
        }
        check_writable(parent, name, creating)
    }

    /// The versioned root's own name in the home: it cannot be removed,
    /// renamed or replaced through the mount (`EBUSY`, as a mount point).
    pub(super) fn pinned(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        match &self.home {
            Some(h) if parent == ROOT_INO && name == h.versioned.as_slice() => {
                Err(FsError::of(libc::EBUSY))
            }
            _ => Ok(()),
        }
    }

    /// The versioned root's inode: [`ROOT_INO`], or its child in a home.
    pub fn versioned_root(&self) -> Ino {
        self.vroot
    }
}
