//! Hands the kernel the pages of a file just written, so that the first
//! read after a write is served from its page cache.
//!
//! Why: the kernel marks a page it wrote through FUSE up to date only when
//! the write covered all of it, so the last, partial page of every file
//! written through the mount is read from the daemon again on its first
//! read. That READ costs a round trip, and, worse, makes the kernel forget
//! the cached access time, so the next `stat` of the file costs a GETATTR
//! too. When the last writer of a file closes it, a thread of its own
//! pushes those bytes with a store notification (`FUSE_NOTIFY_STORE`),
//! which marks the page up to date.
//!
//! Invariant: a store never leaves the kernel a page older than the file.
//! A store is queued only while the file has no writer, and carries a
//! token; every change of a file's content (a writer's open, a truncate)
//! first claims the file here, under the file's open-state lock
//! ([`PageStore::claim`]). A claim cancels a store not yet begun; a store
//! already being written to the kernel makes the claim wait until it lands,
//! so no write can reach the page cache before it.
//!
//! A store can wait on the page lock of a READ in flight, which needs a
//! free request thread. So a claim waits at most [`CLAIM_WAIT`]; one that
//! gives up (only if every request thread is waiting on stores) lets the
//! change go ahead and the store thread drops the file's pages once its
//! store has landed, so nothing older than that moment stays cached.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::Ino;
use skillfs_base::sys;

/// Files up to this size are stored whole (pages left partly written by
/// small writes included); from a larger one only its last page.
const WHOLE_MAX: u64 = 64 * 1024;
/// How long a change waits for a store being written to the kernel.
pub const CLAIM_WAIT: Duration = Duration::from_millis(500);

/// What the store thread asks of the kernel.
pub enum PageOp<'a> {
    /// Put these bytes at this offset into the inode's page cache.
    Store(Ino, u64, &'a [u8]),
    /// Drop the inode's cached pages and attributes.
    Forget(Ino),
}

/// Carries out a [`PageOp`] (the FUSE adapter's notifier).
pub type Kernel = Box<dyn Fn(PageOp) + Send>;

struct Slot {
    token: u64,
    /// Being written to the kernel: changes wait.
    storing: bool,
    /// A change went ahead while storing: forget the pages afterwards.
    overran: bool,
}

struct Job {
    ino: Ino,
    token: u64,
    file: Arc<File>,
}

/// The state shared by the request threads and the store thread.
pub struct PageStore {
    slots: Mutex<HashMap<Ino, Slot>>,
    landed: Condvar,
    next_token: Mutex<u64>,
    tx: Mutex<Option<Sender<Job>>>,
}

/// What a claim found.
pub enum Claim {
    /// No store can now reach the kernel before the change.
    Clear,
    /// A store is being written: wait with [`PageStore::wait`], then claim
    /// again (after re-taking the open-state lock).
    Busy,
}

impl PageStore {
    pub fn new() -> Arc<PageStore> {
        Arc::new(PageStore {
            slots: Mutex::new(HashMap::new()),
            landed: Condvar::new(),
            next_token: Mutex::new(0),
            tx: Mutex::new(None),
        })
    }

    /// Starts the store thread; until then nothing is queued.
    pub fn start(self: &Arc<Self>, kernel: Kernel) -> std::io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("pagestore".into())
            .spawn(move || me.run(rx, kernel))?;
        *self.tx.lock() = Some(tx);
        Ok(())
    }

    /// Stops queueing; the thread ends once the queue is empty.
    pub fn stop(&self) {
        self.tx.lock().take();
        // Nothing waits for a store that will not be made.
        self.slots.lock().retain(|_, s| s.storing);
    }

    /// Queues a store of `file`, the current content of `ino`. The caller
    /// holds the open-state lock and the file has no writer.
    pub fn queue(&self, ino: Ino, file: Arc<File>) {
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else { return };
        let token = {
            let mut t = self.next_token.lock();
            *t += 1;
            *t
        };
        let mut slots = self.slots.lock();
        if slots.get(&ino).is_some_and(|s| s.storing) {
            // Still writing an earlier one of the same content: enough.
            return;
        }
        slots.insert(
            ino,
            Slot {
                token,
                storing: false,
                overran: false,
            },
        );
        drop(slots);
        if tx.send(Job { ino, token, file }).is_err() {
            self.slots.lock().remove(&ino);
        }
    }

    /// Called, under the open-state lock, before `ino`'s content changes.
    pub fn claim(&self, ino: Ino) -> Claim {
        let mut slots = self.slots.lock();
        match slots.get(&ino) {
            None => Claim::Clear,
            Some(s) if s.storing && !s.overran => Claim::Busy,
            // Overran: the store thread forgets the pages when it lands.
            Some(s) if s.storing => Claim::Clear,
            Some(_) => {
                slots.remove(&ino);
                Claim::Clear
            }
        }
    }

    /// Waits (holding no lock) for the store of `ino`, or of any inode
    /// (`None`), to land, at most [`CLAIM_WAIT`].
    pub fn wait(&self, ino: Option<Ino>) {
        let busy = |slots: &HashMap<Ino, Slot>| match ino {
            Some(i) => slots.get(&i).is_some_and(|s| s.storing && !s.overran),
            None => slots.values().any(|s| s.storing && !s.overran),
        };
        let mut slots = self.slots.lock();
        let deadline = std::time::Instant::now() + CLAIM_WAIT;
        while busy(&slots) {
            if self.landed.wait_until(&mut slots, deadline).timed_out() {
                for (i, s) in slots.iter_mut() {
                    if s.storing && ino.is_none_or(|w| w == *i) {
                        s.overran = true;
                        tracing::warn!("inode {i}: a store into the page cache is slow");
                    }
                }
                break;
            }
        }
    }

    fn run(&self, rx: Receiver<Job>, kernel: Kernel) {
        for job in rx {
            {
                let mut slots = self.slots.lock();
                match slots.get_mut(&job.ino) {
                    Some(s) if s.token == job.token => s.storing = true,
                    _ => continue, // claimed by a change meanwhile
                }
            }
            if let Some((offset, data)) = tail(&job.file) {
                kernel(PageOp::Store(job.ino, offset, &data));
            }
            let overran = {
                let mut slots = self.slots.lock();
                let overran = slots.get(&job.ino).is_some_and(|s| s.overran);
                if slots.get(&job.ino).is_some_and(|s| s.token == job.token) {
                    slots.remove(&job.ino);
                }
                self.landed.notify_all();
                overran
            };
            if overran {
                kernel(PageOp::Forget(job.ino));
            }
        }
    }
}

/// The bytes of `file` worth storing: all of a small file, else its last
/// partial page; `None` when every page is whole or it cannot be read.
fn tail(file: &File) -> Option<(u64, Vec<u8>)> {
    let size = sys::fstat(file).ok()?.st_size as u64;
    let page = sys::page_size();
    let offset = if size <= WHOLE_MAX {
        0
    } else {
        size - size % page
    };
    if size == offset {
        return None;
    }
    let mut data = vec![0u8; (size - offset) as usize];
    let mut got = 0;
    while got < data.len() {
        match file.read_at(&mut data[got..], offset + got as u64) {
            Ok(0) => return None, // shrank: not the content this was queued for
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some((offset, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::mpsc;

    fn file_with(bytes: &[u8]) -> Arc<File> {
        let mut f = tempfile();
        f.write_all(bytes).unwrap();
        Arc::new(f)
    }

    fn tempfile() -> File {
        let dir = std::env::temp_dir();
        let path = dir.join(format!(
            "skillfs-pages-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn small_files_whole_large_ones_their_last_page() {
        assert_eq!(tail(&file_with(b"abc")).unwrap(), (0, b"abc".to_vec()));
        let big = vec![7u8; 100_000];
        let (off, data) = tail(&file_with(&big)).unwrap();
        assert_eq!(off, 100_000 - 100_000 % sys::page_size());
        assert_eq!(data.len() as u64, 100_000 % sys::page_size());
        assert!(tail(&file_with(&vec![1u8; 2 * 65_536])).is_none());
        assert!(tail(&file_with(b"")).is_none());
    }

    /// A store the kernel is slow to take holds a change back; a change
    /// claimed before the store begins cancels it.
    #[test]
    fn changes_wait_for_a_store_in_flight_and_cancel_a_queued_one() {
        let pages = PageStore::new();
        let (entered_tx, entered_rx) = mpsc::channel::<Ino>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<(Ino, Vec<u8>)>();
        let (go_rx, done_tx) = (Mutex::new(go_rx), Mutex::new(done_tx));
        pages
            .start(Box::new(move |op| {
                if let PageOp::Store(ino, _, data) = op {
                    entered_tx.send(ino).unwrap();
                    go_rx.lock().recv().unwrap();
                    done_tx.lock().send((ino, data.to_vec())).unwrap();
                }
            }))
            .unwrap();

        pages.queue(5, file_with(b"five"));
        assert_eq!(entered_rx.recv().unwrap(), 5);
        assert!(matches!(pages.claim(5), Claim::Busy));
        let waiter = {
            let pages = Arc::clone(&pages);
            std::thread::spawn(move || {
                pages.wait(Some(5));
                matches!(pages.claim(5), Claim::Clear)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the change waits for the store");
        go_tx.send(()).unwrap();
        assert_eq!(done_rx.recv().unwrap(), (5, b"five".to_vec()));
        assert!(waiter.join().unwrap());

        // Queued behind a slow store of 6, then claimed: never started.
        pages.queue(6, file_with(b"six"));
        pages.queue(7, file_with(b"seven"));
        assert_eq!(entered_rx.recv().unwrap(), 6);
        assert!(matches!(pages.claim(7), Claim::Clear));
        go_tx.send(()).unwrap();
        assert_eq!(done_rx.recv().unwrap().0, 6);
        assert!(
            entered_rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a claimed store never starts"
        );
    }
}
