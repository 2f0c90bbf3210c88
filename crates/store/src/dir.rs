//! The store's directories held open: [`Dir`], one directory by its file
//! descriptor; [`Named`], one entry of it; [`StoreFds`], every directory of
//! a store, opened once at mount.
//!
//! The store is reached by path only to be opened: a path is looked up
//! anew at each use, so whoever could swap one of its components (put a
//! symlink where `staging/` was, between the mount's audit and a write)
//! could redirect the daemon's writes. A held descriptor names the same
//! directory whatever happens to the path afterwards.
//!
//! Invariants:
//! - a [`Dir`] is opened `O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC`: the store
//!   directory from its parent, every subdirectory with `openat` from the
//!   directory that holds it (never by a path of more than one component);
//! - every open, create, rename, unlink and mkdir of a store entry made
//!   through a `Dir` names a single component (no `/`, not `.` or `..`:
//!   `EINVAL` otherwise), and every open adds `O_NOFOLLOW`: a symlink
//!   planted in the store is an error, never followed;
//! - a rename between the store and the live tree goes from the held fd
//!   of the store's directory to the live tree's held fd (`Named::
//!   exchange`, `Named::rename_out`), never through the working directory;
//! - what a `Dir` creates has the store's modes (`fsutil::DIR_MODE`,
//!   `fsutil::FILE_MODE` or what the caller passes), never the umask's;
//! - a `Dir` makes nothing durable by itself: `sync`, `replace` and
//!   `ensure_sub` sync through the `StoreIo` they are given, and
//!   [`StoreFds`] carries the one its store was opened with (`io`), for
//!   everything that holds the store's directories;
//! - the parked areas (`parked/<key>/…`, `orphans/<aside>/…`) hold the
//!   user's entries: like the live tree, they are reached from the held fd
//!   of `parked/` or `orphans/` by a path relative to it.
//!
//! `Layout`'s paths remain for messages (`Dir::path`, `Named::path`) and
//! for the command line, whose read-only commands open by path with
//! `O_NOFOLLOW` on the last component.
//!
//! Locks: none; a `Dir` is an fd and a path, shared by `Arc`.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::durable::StoreIo;
use super::error::{ErrorKind, StoreError, StoreResult};
use super::fsutil::{DIR_MODE, FILE_MODE};
use super::{BLOBS, JOURNAL, Layout, ORPHANS, PARKED, STAGING, TMP};
use skillfs_base::sys;

/// A directory of the store, held open (see the module's invariants).
#[derive(Debug)]
pub struct Dir {
    file: File,
    /// For messages only: never opened again.
    path: PathBuf,
}

/// `name` if it is one component, else `EINVAL`.
fn one(name: &str) -> io::Result<&[u8]> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        // Never built from outside input: a bug here, answered as one.
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(name.as_bytes())
}

fn open_dir_fd(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<File> {
    sys::openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

impl Dir {
    /// Opens the directory at `path`: its parent by path (the ancestors of
    /// a store are audited at mount, `fsutil::audit_parent`), then the
    /// directory itself from the parent's fd, never through a symlink.
    pub fn open_path(path: &Path) -> io::Result<Dir> {
        let (parent, name) = match (path.parent(), path.file_name()) {
            (Some(p), Some(n)) => (p, n),
            // `/` (or a path ending in `..`): nothing to name from a parent.
            _ => {
                let file = open_dir_fd(sys::CWD, path.as_os_str().as_bytes())?;
                return Ok(Dir {
                    file,
                    path: path.to_path_buf(),
                });
            }
        };
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        let up = sys::openat(
            sys::CWD,
            parent.as_os_str().as_bytes(),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )?;
        let file = open_dir_fd(up.as_fd(), name.as_bytes())?;
        Ok(Dir {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The subdirectory `name`, opened from this one.
    pub fn sub(&self, name: &str) -> io::Result<Dir> {
        let file = open_dir_fd(self.fd(), one(name)?)?;
        Ok(Dir {
            file,
            path: self.join(name),
        })
    }

    /// `mkdir name` with [`DIR_MODE`]; `Ok(false)` when it exists already.
    /// Nothing is synced (the caller decides the durability point).
    pub fn make_sub(&self, name: &str) -> io::Result<bool> {
        match sys::mkdirat(self.fd(), one(name)?, DIR_MODE) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The subdirectory `name`, made (0700, and this directory synced
    /// through `io` so that it survives a power cut) if missing.
    pub fn ensure_sub(&self, name: &str, io: &StoreIo) -> io::Result<Dir> {
        if self.make_sub(name)? {
            self.sync(io)?;
        }
        self.sub(name)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The directory as an open file (for `fsync`, `syncfs`).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where it was when opened (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in it (for messages).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// `openat(name, flags | O_NOFOLLOW | O_CLOEXEC, mode)`.
    pub fn open(&self, name: &str, flags: libc::c_int, mode: u32) -> io::Result<File> {
        sys::openat(self.fd(), one(name)?, flags | libc::O_NOFOLLOW, mode)
    }

    /// Opens `name` for reading.
    pub fn read_file(&self, name: &str) -> io::Result<File> {
        self.open(name, libc::O_RDONLY, 0)
    }

    /// A new file `name` with `mode`, open for reading and writing; fails
    /// if `name` exists.
    pub fn create_new(&self, name: &str, mode: u32) -> io::Result<File> {
        self.open(name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode)
    }

    /// Reads `name` whole, at most `cap` bytes; `Ok(None)` when it does not
    /// exist.
    pub fn read_small(&self, name: &str, cap: u64) -> io::Result<Option<Vec<u8>>> {
        let file = match self.read_file(name) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        super::fsutil::read_capped(file, cap).map(Some)
    }

    /// Replaces `name` with `data`: a new [`FILE_MODE`] file made beside
    /// it with `O_EXCL`, synced, renamed over it, then this directory
    /// synced (both through `io`). Whatever `name` was (a symlink included)
    /// is replaced, never written through.
    pub fn replace(&self, name: &str, data: &[u8], io: &StoreIo) -> io::Result<()> {
        one(name)?;
        self.sweep_replaced(name);
        let tmp = format!(
            ".{name}.new.{}.{}",
            std::process::id(),
            skillfs_base::time::now_ns()
        );
        let written = (|| {
            let mut f = self.open(
                &tmp,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                FILE_MODE,
            )?;
            f.write_all(data)?;
            io.sync_all(&f, &self.join(&tmp))?;
            self.rename(&tmp, self, name, 0)
        })();
        if written.is_err() {
            let _ = self.unlink(&tmp);
        }
        written?;
        self.sync(io)
    }

    /// Removes the new files of `name` that a [`Dir::replace`] by a
    /// process now gone left here (killed between making one and renaming
    /// it: `.NAME.new.PID.TIME`, nothing else after the prefix, so that
    /// another name's never matches). A live process's is its own to
    /// rename or remove, and so is one made in the last minute (a process
    /// of another PID namespace is not seen here; a replace takes
    /// milliseconds). Best effort: what cannot be listed or removed stays.
    fn sweep_replaced(&self, name: &str) {
        const YOUNG_NS: i64 = 60_000_000_000;
        let prefix = format!(".{name}.new.");
        let Ok(entries) = self.list() else {
            return;
        };
        let now = skillfs_base::time::now_ns();
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        for e in entries {
            let Some(rest) = e
                .name
                .strip_prefix(prefix.as_bytes())
                .and_then(|r| std::str::from_utf8(r).ok())
            else {
                continue;
            };
            let Some((pid, made)) = rest.split_once('.').filter(|(p, m)| digits(p) && digits(m))
            else {
                continue;
            };
            let (Ok(pid), Ok(made)) = (pid.parse::<u32>(), made.parse::<i64>()) else {
                continue;
            };
            if now.saturating_sub(made) > YOUNG_NS
                && !skillfs_base::process::process_exists(pid)
                && let Ok(n) = std::str::from_utf8(&e.name)
            {
                let _ = self.unlink(n);
            }
        }
    }

    /// Opens `name` for appending, created [`FILE_MODE`] if missing.
    pub fn open_append(&self, name: &str) -> io::Result<File> {
        self.open(
            name,
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT,
            FILE_MODE,
        )
    }

    /// `lstat` of `name`.
    pub fn lstat(&self, name: &str) -> io::Result<libc::stat> {
        sys::lstatat(self.fd(), one(name)?)
    }

    /// `renameat2(self, from, to, to_name, flags)`, both in the store.
    pub fn rename(&self, from: &str, to: &Dir, to_name: &str, flags: u32) -> io::Result<()> {
        sys::renameat2(self.fd(), one(from)?, to.fd(), one(to_name)?, flags)
    }

    /// Moves `rel` under the held directory `dir` (the live tree or a
    /// parked area) into this directory as `name`.
    pub fn rename_in(
        &self,
        dir: BorrowedFd<'_>,
        rel: &[u8],
        name: &str,
        flags: u32,
    ) -> io::Result<()> {
        sys::renameat2(dir, rel, self.fd(), one(name)?, flags)
    }

    pub fn unlink(&self, name: &str) -> io::Result<()> {
        sys::unlinkat(self.fd(), one(name)?, false)
    }

    pub fn rmdir(&self, name: &str) -> io::Result<()> {
        sys::unlinkat(self.fd(), one(name)?, true)
    }

    /// Removes `name` and everything below it (read-only directories
    /// included), from this directory's fd.
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        sys::remove_tree_at(self.fd(), one(name)?)
    }

    /// `fsync` of the directory through `io`: the entries it holds are
    /// durable.
    pub fn sync(&self, io: &StoreIo) -> io::Result<()> {
        io.sync_dir(self)
    }

    /// The names in it (without `.` and `..`).
    pub fn list(&self) -> io::Result<Vec<sys::RawDirEntry>> {
        sys::read_dir_at(self.fd(), b"")
    }
}

impl AsRawFd for Dir {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// One entry of a held store directory: a spare, a staging file, a blob's
/// temp file, a swept tree in `tmp/`.
#[derive(Clone, Debug)]
pub struct Named {
    pub dir: Arc<Dir>,
    pub name: String,
}

impl Named {
    pub fn new(dir: &Arc<Dir>, name: String) -> Named {
        Named {
            dir: Arc::clone(dir),
            name,
        }
    }

    /// Where it is (for messages).
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// Opens it (`O_NOFOLLOW` added).
    pub fn open(&self, flags: libc::c_int) -> io::Result<File> {
        self.dir.open(&self.name, flags, 0)
    }

    pub fn lstat(&self) -> io::Result<libc::stat> {
        self.dir.lstat(&self.name)
    }

    /// Removes it (a file).
    pub fn unlink(&self) -> io::Result<()> {
        self.dir.unlink(&self.name)
    }

    /// Removes it, a file or an (empty) directory.
    pub fn remove(&self) -> io::Result<()> {
        self.dir
            .unlink(&self.name)
            .or_else(|_| self.dir.rmdir(&self.name))
    }

    pub fn remove_tree(&self) -> io::Result<()> {
        self.dir.remove_tree(&self.name)
    }

    /// Renames it to `rel` under the held directory `dir` (the live tree,
    /// a parked area).
    pub fn rename_out(&self, dir: BorrowedFd<'_>, rel: &[u8], flags: u32) -> io::Result<()> {
        sys::renameat2(self.dir.fd(), one(&self.name)?, dir, rel, flags)
    }

    /// Swaps it with `rel` under `dir` (`RENAME_EXCHANGE`): what was at
    /// `rel` is then here.
    pub fn exchange(&self, dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<()> {
        self.rename_out(dir, rel, libc::RENAME_EXCHANGE)
    }
}

/// The directories of a store, held open from mount to unmount, and the
/// door through which they are made durable.
pub struct StoreFds {
    pub io: StoreIo,
    pub top: Arc<Dir>,
    pub journal: Arc<Dir>,
    pub blobs: Arc<Dir>,
    pub tmp: Arc<Dir>,
    pub staging: Arc<Dir>,
    pub parked: Arc<Dir>,
    pub orphans: Arc<Dir>,
}

impl StoreFds {
    /// Opens the store directory of `layout` (which must exist) from its
    /// parent, then makes (0700, idempotent) and opens each directory of
    /// the layout from it; what it makes is synced through `io`.
    pub fn open(layout: &Layout, io: StoreIo) -> StoreResult<StoreFds> {
        let top = Dir::open_path(&layout.dir).map_err(|e| {
            StoreError::io(ErrorKind::Store, "open store directory", &layout.dir, e)
        })?;
        let sub = |name: &str| {
            top.ensure_sub(name, &io).map(Arc::new).map_err(|e| {
                StoreError::io(ErrorKind::Store, "open store directory", &top.join(name), e)
            })
        };
        Ok(StoreFds {
            journal: sub(JOURNAL)?,
            blobs: sub(BLOBS)?,
            tmp: sub(TMP)?,
            staging: sub(STAGING)?,
            parked: sub(PARKED)?,
            orphans: sub(ORPHANS)?,
            top: Arc::new(top),
            io,
        })
    }

    /// Removes what crashed writers left in `staging/` and `tmp/`: neither
    /// holds anything the journal refers to.
    pub fn clear_scratch(&self) -> StoreResult<()> {
        for d in [&self.staging, &self.tmp] {
            let entries = d
                .list()
                .map_err(|e| StoreError::io(ErrorKind::Store, "list", d.path(), e))?;
            for ent in entries {
                let Ok(name) = std::str::from_utf8(&ent.name) else {
                    // Not a name the daemon makes: removed all the same.
                    let _ = sys::remove_tree_at(d.fd(), &ent.name);
                    continue;
                };
                // Spare directories are empty; a swept park left in `tmp/`
                // (its removal failed) is not.
                if d.unlink(name).is_err() {
                    let _ = d.remove_tree(name);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("skillfs-dir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("store/staging")).unwrap();
        std::fs::create_dir_all(d.join("attacker/staging")).unwrap();
        d
    }

    fn errno(r: io::Result<impl std::fmt::Debug>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    /// A replace killed before its rename left its new file: the next
    /// replace of that name removes it, and leaves a live process's alone.
    #[test]
    fn a_replace_removes_what_a_killed_one_left() {
        let d = scratch("replaced");
        let top = Dir::open_path(&d.join("store")).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let left = format!(".RULES.new.{gone}.1");
        let live = format!(".RULES.new.{}.2", std::process::id());
        let other = format!(".ROOT.new.{gone}.3");
        // Another name that starts like this one's new files.
        let longer = format!(".RULES.new.{gone}.new.{gone}.4");
        // A dead process's, made a moment ago (another PID namespace's
        // live replace looks so).
        let young = format!(".RULES.new.{gone}.{}", skillfs_base::time::now_ns());
        for n in [&left, &live, &other, &longer, &young] {
            std::fs::write(d.join("store").join(n), b"half").unwrap();
        }
        top.replace("RULES", b"rules", &StoreIo::real()).unwrap();
        let names: Vec<String> = top
            .list()
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .collect();
        assert!(!names.contains(&left), "{names:?}");
        assert!(names.contains(&live), "{names:?}");
        assert!(
            names.contains(&other),
            "another name's is not touched: {names:?}"
        );
        assert!(names.contains(&longer), "{names:?}");
        assert!(names.contains(&young), "{names:?}");
        assert_eq!(std::fs::read(d.join("store/RULES")).unwrap(), b"rules");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_held_directory_stays_itself_when_its_path_is_swapped() {
        let d = scratch("held");
        let top = Arc::new(Dir::open_path(&d.join("store")).unwrap());
        let staging = Arc::new(top.sub("staging").unwrap());
        // The store's path now leads to the attacker's directory.
        std::fs::rename(d.join("store"), d.join("store.real")).unwrap();
        symlink(d.join("attacker"), d.join("store")).unwrap();
        staging.create_new("f", FILE_MODE).unwrap();
        top.replace("RULES", b"rules", &StoreIo::real()).unwrap();
        Named::new(&staging, "f".into())
            .rename_out(top.fd(), b"moved", 0)
            .unwrap();
        assert!(top.ensure_sub("tmp", &StoreIo::real()).is_ok());
        assert_eq!(std::fs::read(d.join("store.real/RULES")).unwrap(), b"rules");
        assert!(d.join("store.real/moved").is_file() && d.join("store.real/tmp").is_dir());
        let attacker: Vec<_> = std::fs::read_dir(d.join("attacker"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            attacker,
            ["staging"],
            "nothing made in the attacker's directory"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_single_names_and_never_through_a_symlink() {
        let d = scratch("names");
        let top = Dir::open_path(&d.join("store")).unwrap();
        for bad in ["", ".", "..", "staging/x", "../attacker"] {
            assert_eq!(
                errno(top.create_new(bad, FILE_MODE)),
                Some(libc::EINVAL),
                "{bad:?}"
            );
            assert_eq!(errno(top.sub(bad)), Some(libc::EINVAL), "{bad:?}");
            assert_eq!(errno(top.unlink(bad)), Some(libc::EINVAL), "{bad:?}");
        }
        std::fs::write(d.join("attacker/secret"), "theirs").unwrap();
        symlink(d.join("attacker/secret"), d.join("store/LOCK")).unwrap();
        symlink(d.join("attacker"), d.join("store/blobs")).unwrap();
        assert_eq!(errno(top.read_file("LOCK")), Some(libc::ELOOP));
        assert_eq!(errno(top.open_append("LOCK")), Some(libc::ELOOP));
        assert_eq!(errno(top.read_small("LOCK", 100)), Some(libc::ELOOP));
        // A symlink where a directory is expected: ENOTDIR (O_DIRECTORY
        // with O_NOFOLLOW), never the attacker's directory.
        let refused = |e: Option<i32>| matches!(e, Some(libc::ENOTDIR | libc::ELOOP));
        assert!(refused(errno(top.sub("blobs"))));
        assert!(refused(errno(top.ensure_sub("blobs", &StoreIo::real()))));
        assert!(refused(errno(Dir::open_path(&d.join("store/blobs")))));
        // Replaced whole, never written through.
        top.replace("LOCK", b"1\n", &StoreIo::real()).unwrap();
        assert_eq!(std::fs::read(d.join("attacker/secret")).unwrap(), b"theirs");
        assert!(
            !std::fs::symlink_metadata(d.join("store/LOCK"))
                .unwrap()
                .is_symlink()
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
