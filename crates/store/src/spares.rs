//! `Spares`: empty files and directories in `staging/`, made or emptied
//! ahead of need.
//!
//! Every version needs fresh inodes: a staging file for the new content and
//! (for large contents) a blob file; every create or mkdir needs one, and so
//! does the park of the first hidden entry of a directory. Allocating an inode is among the
//! dearest things a write does on ext4 (the allocator checks block groups
//! for recently freed inodes), and freeing the blocks of a replaced one can
//! take hundreds of microseconds. So neither happens on the request path: a
//! writer takes a ready file from this pool, and a background thread (the
//! janitor in `fs`) empties swapped-out inodes into it and tops it up when
//! it runs low.
//!
//! New ones are made in a nursery directory (`tmp/`) and then renamed into
//! `staging/`: making an inode holds its directory's lock for as long as
//! the allocation takes, and requests that rename spares out of `staging/`
//! must not wait for that.
//!
//! Invariants: a file in the pool is a regular file, empty, named only by
//! its name in `staging/` and held by nobody else; spares are made,
//! renamed and removed only through the held fds of `tmp/` and `staging/`
//! (`store::dir`); a directory in the
//! pool is empty, mode 0700; what is taken from the pool belongs to the
//! taker, who renames it away or removes it.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::dir::{Dir, Named};
use super::fsutil;

/// Kept at most (each is an inode, and costs nothing else).
pub const MAX: usize = 64;
/// Topped up to `MAX` once fewer than this are left.
pub const LOW: usize = 24;

pub struct Spares {
    dir: Arc<Dir>,
    nursery: Arc<Dir>,
    next: AtomicU64,
    files: Mutex<Vec<(Named, File)>>,
    dirs: Mutex<Vec<Named>>,
    /// Called (by a taker) when the pool has run low.
    on_low: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Spares {
    /// A pool in `dir` (`staging/`), made in `nursery` (`tmp/`), both held
    /// open: spares are made, renamed and removed from these fds.
    pub fn new(dir: Arc<Dir>, nursery: Arc<Dir>) -> Spares {
        Spares {
            dir,
            nursery,
            next: AtomicU64::new(1),
            files: Mutex::new(Vec::new()),
            dirs: Mutex::new(Vec::new()),
            on_low: OnceLock::new(),
        }
    }

    /// Who refills the pool (set once).
    pub fn set_on_low(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_low.set(f);
    }

    /// A ready empty file, or a new one when none is ready.
    pub fn take(&self) -> io::Result<(Named, File)> {
        self.take_from(&self.files, || self.create())
    }

    /// A ready empty directory (mode 0700), or a new one.
    pub fn take_dir(&self) -> io::Result<Named> {
        self.take_from(&self.dirs, || self.create_dir())
    }

    fn take_from<T>(
        &self,
        pool: &Mutex<Vec<T>>,
        create: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let (spare, left) = {
            let mut pool = pool.lock();
            (pool.pop(), pool.len())
        };
        if left < LOW
            && let Some(f) = self.on_low.get()
        {
            f();
        }
        match spare {
            Some(s) => Ok(s),
            None => create(),
        }
    }

    /// Keeps an emptied file for a later taker; false (and the caller
    /// removes it) when enough are kept already.
    pub fn put(&self, spare: Named, file: File) -> bool {
        let mut files = self.files.lock();
        if files.len() >= MAX {
            return false;
        }
        files.push((spare, file));
        true
    }

    pub fn wants_more(&self) -> bool {
        self.files.lock().len() < MAX
    }

    /// Makes new empty files and directories until the pool is full.
    pub fn top_up(&self) -> io::Result<()> {
        while self.wants_more() {
            let (spare, file) = self.create()?;
            if !self.put(spare.clone(), file) {
                let _ = spare.remove();
            }
        }
        while self.dirs.lock().len() < MAX {
            let d = self.create_dir()?;
            self.dirs.lock().push(d);
        }
        Ok(())
    }

    /// Removes everything in the pool (at unmount).
    pub fn clear(&self) {
        for (spare, _) in self.files.lock().drain(..) {
            let _ = spare.dir.unlink(&spare.name);
        }
        for d in self.dirs.lock().drain(..) {
            let _ = d.dir.rmdir(&d.name);
        }
    }

    fn create_dir(&self) -> io::Result<Named> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let born = format!("spare.d{n}");
        let name = format!("d{n}");
        self.nursery.make_sub(&born).and_then(|made| {
            if made {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(libc::EEXIST))
            }
        })?;
        self.nursery
            .rename(&born, &self.dir, &name, 0)
            .inspect_err(|_| {
                let _ = self.nursery.rmdir(&born);
            })?;
        Ok(Named::new(&self.dir, name))
    }

    fn create(&self) -> io::Result<(Named, File)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let born = format!("spare.{n}");
        let name = format!("{n}");
        let file = self.nursery.create_new(&born, fsutil::FILE_MODE)?;
        self.nursery
            .rename(&born, &self.dir, &name, 0)
            .inspect_err(|_| {
                let _ = self.nursery.unlink(&born);
            })?;
        Ok((Named::new(&self.dir, name), file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn takes_ready_files_and_asks_for_more_when_low() {
        let top = std::env::temp_dir().join(format!("skillfs-spares-{}", std::process::id()));
        let dir = top.join("staging");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(top.join("tmp")).unwrap();
        let pool = Arc::new(Spares::new(
            Arc::new(Dir::open_path(&dir).unwrap()),
            Arc::new(Dir::open_path(&top.join("tmp")).unwrap()),
        ));
        let asked = Arc::new(AtomicUsize::new(0));
        let a = Arc::clone(&asked);
        pool.set_on_low(Box::new(move || {
            a.fetch_add(1, Ordering::Relaxed);
        }));
        pool.top_up().unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2 * MAX);
        let d = pool.take_dir().unwrap().path();
        assert!(d.is_dir() && std::fs::read_dir(&d).unwrap().next().is_none());
        std::fs::remove_dir(d).unwrap();
        for _ in 0..MAX - LOW {
            let (p, _) = pool.take().unwrap();
            assert!(p.path().starts_with(&dir));
            std::fs::remove_file(p.path()).unwrap();
        }
        assert_eq!(asked.load(Ordering::Relaxed), 0, "not low yet");
        let (p, f) = pool.take().unwrap();
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        assert!(pool.put(p, f), "room for a returned file");
        pool.top_up().unwrap();
        assert!(!pool.wants_more());
        let (p, f) = pool.create().unwrap();
        assert!(!pool.put(p.clone(), f), "full: the caller removes it");
        std::fs::remove_file(p.path()).unwrap();
        pool.clear();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(top.join("tmp")).unwrap().count(), 0);
        std::fs::remove_dir_all(&top).unwrap();
    }
}
