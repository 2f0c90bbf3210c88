//! Kernel notifications: telling the kernel to forget an inode's
//! attributes and pages, or a name, that changed behind its back (a sweep,
//! an unpark that moved hidden entries, a failed close), handing it the
//! pages of files just written (`pages`), and whether it takes backing
//! files (passthrough).
//!
//! Owns: `KernelNotices`, what the FUSE adapter installed
//! (`SkillFs::set_invalidator`, `set_passthrough`, `start_page_store`)
//! behind narrow calls. Invariant: a notification is sent with no lock of
//! the core held that a request thread could need (a notification can
//! wait on the kernel, and the kernel on a request);
//! `invalidations_delivered` waits a bounded time (`DELIVERY_WAIT`) for
//! that reason. Locks: none of its own but the page store's (see `pages`:
//! taken after an `OpenFile`).

use super::*;

/// How long `invalidations_delivered` waits for the kernel.
const DELIVERY_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// What the core tells the kernel, and what it knows the kernel takes.
pub(super) struct KernelNotices {
    /// Tells the kernel to drop what it cached of an inode or a name (set
    /// once, by the adapter; until then nothing is sent).
    invalidator: std::sync::OnceLock<Box<dyn Fn(Invalidation) + Send + Sync>>,
    /// The kernel takes backing files (FUSE passthrough): files outside
    /// the versioned root are opened that way (see `OpenReply::backing`).
    passthrough: std::sync::atomic::AtomicBool,
    /// Pushes the pages of files just written into the kernel's cache.
    pages: Arc<PageStore>,
}

impl Default for KernelNotices {
    fn default() -> KernelNotices {
        KernelNotices {
            invalidator: std::sync::OnceLock::new(),
            passthrough: std::sync::atomic::AtomicBool::new(false),
            pages: PageStore::new(),
        }
    }
}

impl KernelNotices {
    /// Sets how invalidations are sent (only the first call counts).
    pub(super) fn set_invalidator(&self, f: Box<dyn Fn(Invalidation) + Send + Sync>) {
        let _ = self.invalidator.set(f);
    }

    pub(super) fn send(&self, what: Invalidation) {
        if let Some(f) = self.invalidator.get() {
            f(what);
        }
    }

    /// Waits until the invalidations sent so far have reached the kernel,
    /// at most `DELIVERY_WAIT`.
    pub(super) fn delivered(&self) {
        if let Some(f) = self.invalidator.get() {
            let (tx, rx) = std::sync::mpsc::channel();
            f(Invalidation::Barrier(tx));
            let _ = rx.recv_timeout(DELIVERY_WAIT);
        }
    }

    pub(super) fn set_passthrough(&self, on: bool) {
        self.passthrough.store(on, Ordering::SeqCst);
    }

    pub(super) fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// The page store (its own locks; see `pages`).
    pub(super) fn pages(&self) -> &Arc<PageStore> {
        &self.pages
    }
}

impl SkillFs {
    pub(super) fn invalidate(&self, ino: Ino) {
        self.notices.send(Invalidation::Inode(ino));
    }

    pub(super) fn invalidate_entry(&self, parent: Ino, name: Vec<u8>) {
        self.notices.send(Invalidation::Entry(parent, name));
    }

    /// Waits until the invalidations sent so far have reached the kernel,
    /// so that the caller's reply is not followed by a read of what they
    /// drop. Bounded: a notification can wait on kernel locks the current
    /// request holds, and then it lands just after the reply instead.
    pub(super) fn invalidations_delivered(&self) {
        self.notices.delivered();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Notices whose invalidations go to the returned receiver.
    fn recorded() -> (KernelNotices, mpsc::Receiver<Invalidation>) {
        let n = KernelNotices::default();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        n.set_invalidator(Box::new(move |i| {
            let _ = tx.lock().send(i);
        }));
        (n, rx)
    }

    #[test]
    fn nothing_is_sent_before_an_invalidator_is_set() {
        let n = KernelNotices::default();
        n.send(Invalidation::Inode(2));
        // No kernel to wait for: at once.
        let t = std::time::Instant::now();
        n.delivered();
        assert!(t.elapsed() < DELIVERY_WAIT);
    }

    #[test]
    fn invalidations_reach_the_first_invalidator_set() {
        let (n, rx) = recorded();
        n.set_invalidator(Box::new(|_| panic!("a second invalidator was used")));
        n.send(Invalidation::Inode(7));
        n.send(Invalidation::Entry(1, b"a".to_vec()));
        assert!(matches!(rx.try_recv(), Ok(Invalidation::Inode(7))));
        assert!(matches!(rx.try_recv(), Ok(Invalidation::Entry(1, name)) if name == b"a"));
    }

    #[test]
    fn delivery_waits_for_the_barrier_and_no_longer_than_bounded() {
        // Answered: returns once answered.
        let n = KernelNotices::default();
        n.set_invalidator(Box::new(|i| {
            if let Invalidation::Barrier(done) = i {
                let _ = done.send(());
            }
        }));
        let t = std::time::Instant::now();
        n.delivered();
        assert!(t.elapsed() < DELIVERY_WAIT);
        // Never answered (a kernel waiting on this request): bounded.
        let (n, rx) = recorded();
        let t = std::time::Instant::now();
        n.delivered();
        assert!(t.elapsed() >= DELIVERY_WAIT);
        assert!(matches!(rx.try_recv(), Ok(Invalidation::Barrier(_))));
    }

    #[test]
    fn passthrough_is_off_until_the_kernel_takes_it() {
        let n = KernelNotices::default();
        assert!(!n.passthrough());
        n.set_passthrough(true);
        assert!(n.passthrough());
        n.set_passthrough(false);
        assert!(!n.passthrough());
    }
}
