//! `Spares`: empty files in `staging/`, made or emptied ahead of need.
//!
//! Every version needs fresh inodes: a staging file for the new content and
//! a blob file for its copy in the store. Allocating an inode is among the
//! dearest things a write does on ext4 (the allocator checks block groups
//! for recently freed inodes), and freeing the blocks of a replaced one can
//! take hundreds of microseconds. So neither happens on the request path: a
//! writer takes a ready file from this pool, and a background thread (the
//! janitor in `fs`) empties swapped-out inodes into it and tops it up when
//! it runs low.
//!
//! Invariants: a file in the pool is a regular file, empty, named only by
//! its path under `staging/` and held by nobody else; a file taken from the
//! pool belongs to the taker, who renames it away or removes it.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Kept at most (each is an inode, and costs nothing else).
pub const MAX: usize = 64;
/// Topped up to `MAX` once fewer than this are left.
pub const LOW: usize = 24;

pub struct Spares {
    dir: PathBuf,
    next: AtomicU64,
    files: Mutex<Vec<(PathBuf, File)>>,
    /// Called (by a taker) when the pool has run low.
    on_low: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Spares {
    pub fn new(dir: PathBuf) -> Spares {
        Spares {
            dir,
            next: AtomicU64::new(1),
            files: Mutex::new(Vec::new()),
            on_low: OnceLock::new(),
        }
    }

    /// Who refills the pool (set once).
    pub fn set_on_low(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_low.set(f);
    }

    /// A ready empty file, or a new one when none is ready.
    pub fn take(&self) -> io::Result<(PathBuf, File)> {
        let (spare, left) = {
            let mut files = self.files.lock();
            (files.pop(), files.len())
        };
        if left < LOW
            && let Some(f) = self.on_low.get()
        {
            f();
        }
        match spare {
            Some(s) => Ok(s),
            None => self.create(),
        }
    }

    /// Keeps an emptied file for a later taker; false (and the caller
    /// removes it) when enough are kept already.
    pub fn put(&self, path: PathBuf, file: File) -> bool {
        let mut files = self.files.lock();
        if files.len() >= MAX {
            return false;
        }
        files.push((path, file));
        true
    }

    pub fn wants_more(&self) -> bool {
        self.files.lock().len() < MAX
    }

    /// Makes new empty files until the pool is full.
    pub fn top_up(&self) -> io::Result<()> {
        while self.wants_more() {
            let (path, file) = self.create()?;
            if !self.put(path.clone(), file) {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(())
    }

    /// Removes every file of the pool (at unmount).
    pub fn clear(&self) {
        for (path, _) in self.files.lock().drain(..) {
            let _ = std::fs::remove_file(&path);
        }
    }

    fn create(&self) -> io::Result<(PathBuf, File)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{n}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok((path, file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn takes_ready_files_and_asks_for_more_when_low() {
        let dir = std::env::temp_dir().join(format!("skillfs-spares-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = Arc::new(Spares::new(dir.clone()));
        let asked = Arc::new(AtomicUsize::new(0));
        let a = Arc::clone(&asked);
        pool.set_on_low(Box::new(move || {
            a.fetch_add(1, Ordering::Relaxed);
        }));
        pool.top_up().unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), MAX);
        for _ in 0..MAX - LOW {
            let (p, _) = pool.take().unwrap();
            assert!(p.starts_with(&dir));
            std::fs::remove_file(p).unwrap();
        }
        assert_eq!(asked.load(Ordering::Relaxed), 0, "not low yet");
        let (p, f) = pool.take().unwrap();
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        assert!(pool.put(p, f), "room for a returned file");
        pool.top_up().unwrap();
        assert!(!pool.wants_more());
        let (p, f) = pool.create().unwrap();
        assert!(!pool.put(p.clone(), f), "full: the caller removes it");
        std::fs::remove_file(p).unwrap();
        pool.clear();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }
}
