//! Kernel notifications: telling the kernel to forget an inode's
//! attributes and pages, or a name, that changed behind its back (a sweep,
//! an unpark that moved hidden entries, a failed close).
//!
//! Owns: the calls into the invalidator the FUSE adapter installed
//! (`SkillFs::set_invalidator`). Invariant: called with no lock of the core
//! held that a request thread could need (a notification can wait on the
//! kernel, and the kernel on a request); `invalidations_delivered` waits a
//! bounded time for that reason.

use super::*;

impl SkillFs {
    pub(super) fn invalidate(&self, ino: Ino) {
        if let Some(f) = self.invalidator.get() {
            f(Invalidation::Inode(ino));
        }
    }

    pub(super) fn invalidate_entry(&self, parent: Ino, name: Vec<u8>) {
        if let Some(f) = self.invalidator.get() {
            f(Invalidation::Entry(parent, name));
        }
    }

    /// Waits until the invalidations sent so far have reached the kernel,
    /// so that the caller's reply is not followed by a read of what they
    /// drop. Bounded: a notification can wait on kernel locks the current
    /// request holds, and then it lands just after the reply instead.
    pub(super) fn invalidations_delivered(&self) {
        if let Some(f) = self.invalidator.get() {
            let (tx, rx) = std::sync::mpsc::channel();
            f(Invalidation::Barrier(tx));
            let _ = rx.recv_timeout(std::time::Duration::from_millis(200));
        }
    }
}
