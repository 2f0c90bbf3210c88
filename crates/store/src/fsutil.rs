//! How the store's own files and directories are made, copied and
//! checked: with explicit modes whatever the umask, and never through a
//! symlink. The daemon reaches the store through the held fds of its
//! directories (`store::dir`); what here takes a path serves the checks
//! before the store is opened (the audit, `read_small`), its creation
//! (`create_dir_all`) and the command line.
//!
//! Invariants (contract G8):
//! - every directory the store makes is [`DIR_MODE`] (0700) and every file
//!   [`FILE_MODE`] (0600); immutable content (loose blobs, packs) is
//!   [`SEALED_MODE`] (0400). The daemon runs with umask 0 (daemon.rs) so
//!   that request modes pass through exactly; nothing here may therefore
//!   leave a mode to the umask;
//! - a store file is opened with `O_NOFOLLOW`: a symlink planted in the
//!   store is an error, never a redirection of our writes. Files rewritten
//!   whole (`RULES`, `ROOT`) are replaced by a new file made with `O_EXCL`
//!   beside them and renamed over them, never truncated in place
//!   (`Dir::replace`);
//! - [`audit`] is the mount-time check of an existing store: anything owned
//!   by another user, or not a plain file or directory where the store
//!   expects one, refuses the mount; a mode that lets others in is listed
//!   for repair, applied only once every check of the mount has passed.
//!
//! Locks: none; every function here works on the paths and files it is
//! given.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::durable::StoreIo;
use super::error::{ErrorKind, StoreError, StoreResult};
use skillfs_base::sys;

/// Directories of the store.
pub const DIR_MODE: u32 = 0o700;
/// Files of the store.
pub const FILE_MODE: u32 = 0o600;
/// Immutable content: loose blobs and packs.
pub const SEALED_MODE: u32 = 0o400;

/// Options for opening a store file: [`FILE_MODE`] if it is created, never
/// through a symlink, not inherited by children.
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

/// `mkdir` with [`DIR_MODE`]; `Ok(false)` when it exists already. A new
/// directory's parent is synced through `io`, so the directory survives a
/// power cut.
pub fn create_dir(path: &Path, io: &StoreIo) -> io::Result<bool> {
    let made = make_dir(path)?;
    if made && let Some(parent) = path.parent() {
        sync_dir(parent, io)?;
    }
    Ok(made)
}

/// `mkdir` with [`DIR_MODE`]; `Ok(false)` when it exists already.
fn make_dir(path: &Path) -> io::Result<bool> {
    match fs::DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// [`create_dir`] of `path` and of every missing ancestor (each 0700).
pub fn create_dir_all(path: &Path, io: &StoreIo) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        create_dir_all(parent, io)?;
    }
    create_dir(path, io).map(|_| ())
}

/// fsync of a directory by path, through `io` (set-up before the store is
/// held open).
pub fn sync_dir(dir: &Path, io: &StoreIo) -> io::Result<()> {
    let f = sys::openat(
        sys::CWD,
        dir.as_os_str().as_bytes(),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )?;
    io.sync_all(&f, dir)
}

/// How much a buffered copy moves at a time.
const COPY_CHUNK: usize = 256 * 1024;

/// Copies `len` bytes of `src` from offset 0 into the empty file `dst` at
/// offset 0, in the kernel where it can (`copy_file_range`), else through
/// a buffer. Holes stay holes: only the data `SEEK_DATA` finds is copied
/// (`copy_file_range` of a hole writes zeros), and the copy gets the
/// source's size.
pub fn copy_range(src: &File, dst: &File, len: u64) -> io::Result<()> {
    let mut pos = 0;
    while pos < len {
        let data = match seek(src, pos, libc::SEEK_DATA) {
            Ok(d) => d,
            // Nothing but a hole from `pos` on (or the source shrank).
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            // A filesystem that cannot tell: all of it is data.
            Err(_) => pos,
        };
        if data >= len {
            break;
        }
        let hole = seek(src, data, libc::SEEK_HOLE).map_or(len, |h| h.min(len));
        if hole <= data || !copy_span(src, dst, data, hole)? {
            break;
        }
        pos = hole;
    }
    // The trailing hole; never past what the source still holds.
    let end = len.min(src.metadata()?.len());
    if dst.metadata()?.len() < end {
        dst.set_len(end)?;
    }
    Ok(())
}

fn seek(f: &File, at: u64, whence: libc::c_int) -> io::Result<u64> {
    // SAFETY: `f` is open for the call; lseek only moves its offset.
    let r = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// Copies `from..to` of `src` to the same offsets of `dst`; false when the
/// source ended first (it shrank under us: what was copied is what there
/// is).
fn copy_span(src: &File, dst: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut off_in = from as i64;
    let mut off_out = from as i64;
    while (off_in as u64) < to {
        let want = (to - off_in as u64).min(1 << 30) as usize;
        // SAFETY: both fds stay open for the call (borrowed `File`s), and
        // the offsets are `i64`s of this frame that the kernel updates in
        // place.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EXDEV)
                | Some(libc::ENOSYS)
                | Some(libc::EOPNOTSUPP)
                | Some(libc::EINVAL) => copy_buffered(src, dst, off_in as u64, to),
                _ => Err(e),
            };
        }
        if n == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

fn copy_buffered(src: &File, dst: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut off = from;
    while off < to {
        let want = (to - off).min(COPY_CHUNK as u64) as usize;
        let n = src.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Ok(false);
        }
        dst.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(true)
}

/// Reads a store file of at most `cap` bytes, not through a symlink;
/// `Ok(None)` when it does not exist. By path: for the checks before the
/// store is opened and for the command line (the daemon reads through
/// `Dir::read_small`).
pub fn read_small(path: &Path, cap: u64) -> io::Result<Option<Vec<u8>>> {
    match options().read(true).open(path) {
        Ok(f) => read_capped(f, cap).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads `file` whole, at most `cap` bytes (`InvalidData` past it).
pub(super) fn read_capped(file: File, cap: u64) -> io::Result<Vec<u8>> {
    let mut data = Vec::new();
    file.take(cap + 1).read_to_end(&mut data)?;
    if data.len() as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {cap} bytes"),
        ));
    }
    Ok(data)
}

/// Replaces the store file `path` with `data` (see `Dir::replace`: a new
/// file renamed over it, never written through), its directory opened
/// first, never through a symlink; made durable through `io`.
pub fn replace_file(path: &Path, data: &[u8], io: &StoreIo) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default();
    let name = name
        .to_str()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    super::dir::Dir::open_path(dir)?.replace(name, data, io)
}

/// One mode to put right at mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub path: PathBuf,
    pub from: u32,
    pub to: u32,
}

/// How deep [`audit`] looks into a directory of the store.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// Everything below (journal, blobs, …).
    All,
    /// The directory and its own entries, which must be directories
    /// (`parked/<key>`, `orphans/<aside>`); what those hold is the user's,
    /// with the user's modes.
    Areas,
    /// Only the directory: its content is scratch, removed at mount
    /// (`staging/`, `tmp/`; entries there may belong to the callers the
    /// daemon hands new files to).
    Itself,
}

fn refuse(path: &Path, why: String) -> StoreError {
    StoreError::refused(
        ErrorKind::Store,
        path,
        format!("store entry '{}' {why}: refusing the store", path.display()),
    )
}

/// Checks an existing store: the store directory and everything in it
/// (down to, but not into, the entries of `parked/` and `orphans/`) must be
/// a directory or a regular file, not a symlink, owned by `uid`. Returns the
/// modes that let others in (group or other bits), to be narrowed with
/// [`repair`]. Reads only.
pub fn audit(store: &Path, uid: u32) -> StoreResult<Vec<Repair>> {
    let mut repairs = Vec::new();
    if check_entry(store, true, uid, &mut repairs)?.is_none() {
        return Ok(repairs);
    }
    walk(store, Depth::All, uid, &mut repairs, true)?;
    Ok(repairs)
}

/// Checks the directory the store lives in (or will be made in: `anc`,
/// the deepest existing ancestor): any user who can write it without a
/// sticky bit could swap the whole store. (A group-writable one is let be:
/// with per-user groups, the usual setup under umask 002, the group is the
/// user.) The default `.skillfs/` is ours to make private (a store of an
/// older version left it 0777).
pub fn audit_parent(store: &Path, anc: &Path, uid: u32) -> StoreResult<Vec<Repair>> {
    let dir = match store.parent() {
        Some(p) if anc.starts_with(p) => p,
        _ => anc,
    };
    if let Some(up) = dir.parent() {
        audit_ancestors(store, up, uid)?;
    }
    let md =
        fs::symlink_metadata(dir).map_err(|e| StoreError::io(ErrorKind::Store, "stat", dir, e))?;
    let mode = md.mode() & 0o7777;
    if md.uid() != 0 && md.uid() != uid {
        return Err(StoreError::refused(
            ErrorKind::Store,
            dir,
            format!(
                "store '{}' is in '{}', which is owned by uid {}: its owner could replace \
                 the store",
                store.display(),
                dir.display(),
                md.uid()
            ),
        ));
    }
    let default_parent = dir.file_name().is_some_and(|n| n == ".skillfs");
    if default_parent && md.uid() == uid && md.is_dir() && mode != DIR_MODE {
        return Ok(vec![Repair {
            path: dir.to_path_buf(),
            from: mode,
            to: DIR_MODE,
        }]);
    }
    if mode & 0o002 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(StoreError::refused(
            ErrorKind::Store,
            dir,
            format!(
                "store '{}' is in '{}', which every user can write (mode {mode:o}, no sticky \
                 bit): anyone could replace the store",
                store.display(),
                dir.display()
            ),
        ));
    }
    Ok(Vec::new())
}

/// Every directory from `dir` up to `/` must be owned by root or by `uid`,
/// and not writable by every user without a sticky bit: the store is
/// reached by path, so whoever could rename one of them could put a
/// directory of theirs in its place (and have a root daemon write through
/// it).
fn audit_ancestors(store: &Path, dir: &Path, uid: u32) -> StoreResult<()> {
    for a in dir.ancestors() {
        if a.as_os_str().is_empty() {
            continue;
        }
        let md =
            fs::symlink_metadata(a).map_err(|e| StoreError::io(ErrorKind::Store, "stat", a, e))?;
        let mode = md.mode() & 0o7777;
        let why = if md.uid() != 0 && md.uid() != uid {
            format!("is owned by uid {}", md.uid())
        } else if mode & 0o002 != 0 && mode & libc::S_ISVTX == 0 {
            format!("every user can write it (mode {mode:o}, no sticky bit)")
        } else {
            continue;
        };
        return Err(StoreError::refused(
            ErrorKind::Store,
            a,
            format!(
                "store '{}' is below '{}', which {why}: its owner could replace the store",
                store.display(),
                a.display()
            ),
        ));
    }
    Ok(())
}

fn walk(
    dir: &Path,
    depth: Depth,
    uid: u32,
    repairs: &mut Vec<Repair>,
    top: bool,
) -> StoreResult<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io(ErrorKind::Store, "list", dir, e)),
    };
    for ent in entries {
        let ent = ent.map_err(|e| StoreError::io(ErrorKind::Store, "list", dir, e))?;
        let path = ent.path();
        // The daemon's control socket (`daemon::control`), left by one
        // that died: its own, rebound at the next mount.
        if top
            && ent.file_name().as_bytes() == crate::CONTROL.as_bytes()
            && fs::symlink_metadata(&path)
                .is_ok_and(|m| m.file_type().is_socket() && m.uid() == uid)
        {
            continue;
        }
        let Some(is_dir) = check_entry(&path, false, uid, repairs)? else {
            continue; // gone since listed
        };
        // A directory where the socket is bound: the daemon could not
        // unlink it, and would serve with no control channel, for good.
        if top && is_dir && ent.file_name().as_bytes() == crate::CONTROL.as_bytes() {
            return Err(refuse(
                &path,
                "is a directory where the daemon's control socket goes: remove it".into(),
            ));
        }
        if !is_dir {
            if depth == Depth::Areas {
                return Err(refuse(&path, "is not a directory".into()));
            }
            continue;
        }
        let name = ent.file_name();
        let below = match depth {
            Depth::All if top => match name.as_bytes() {
                b"parked" | b"orphans" => Depth::Areas,
                b"staging" | b"tmp" => Depth::Itself,
                _ => Depth::All,
            },
            Depth::All => Depth::All,
            Depth::Areas | Depth::Itself => Depth::Itself,
        };
        match below {
            Depth::Itself => {}
            d => walk(&path, d, uid, repairs, false)?,
        }
    }
    Ok(())
}

/// Checks one entry; whether it is a directory, `None` if it is gone (a
/// temp file of a daemon that was still finishing).
fn check_entry(
    path: &Path,
    must_be_dir: bool,
    uid: u32,
    repairs: &mut Vec<Repair>,
) -> StoreResult<Option<bool>> {
    let md = match fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io(ErrorKind::Store, "stat", path, e)),
    };
    let ft = md.file_type();
    if ft.is_symlink() {
        return Err(refuse(path, "is a symlink".into()));
    }
    if !ft.is_dir() && (must_be_dir || !ft.is_file()) {
        return Err(refuse(
            path,
            if must_be_dir {
                "is not a directory".into()
            } else {
                "is neither a file nor a directory".into()
            },
        ));
    }
    if md.uid() != uid {
        return Err(refuse(
            path,
            format!("is owned by uid {}, not by uid {uid} who mounts", md.uid()),
        ));
    }
    let mode = md.mode() & 0o7777;
    let want = if ft.is_dir() { DIR_MODE } else { mode & 0o700 };
    if mode & 0o7077 != 0 || (ft.is_dir() && mode != DIR_MODE) {
        repairs.push(Repair {
            path: path.to_path_buf(),
            from: mode,
            to: want,
        });
    }
    Ok(Some(ft.is_dir()))
}

/// Applies the repairs of [`audit`], parents first (once a directory is
/// 0700, no other user can swap what is below it), never through a
/// symlink. The caller logs them (once the daemon's log is open).
pub fn repair(repairs: &[Repair]) -> StoreResult<()> {
    for r in repairs {
        let fail =
            |e: io::Error| StoreError::io(ErrorKind::Store, "repair the mode of", &r.path, e);
        let f = sys::openat(
            sys::CWD,
            r.path.as_os_str().as_bytes(),
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )
        .map_err(fail)?;
        let st = sys::fstat(&f).map_err(fail)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(refuse(&r.path, "is a symlink".into()));
        }
        // fchmod does not take an O_PATH fd; its /proc name does, and
        // names exactly the inode checked above.
        let proc_path = format!("/proc/self/fd/{}", f.as_raw_fd());
        fs::set_permissions(
            &proc_path,
            std::os::unix::fs::PermissionsExt::from_mode(r.to),
        )
        .map_err(fail)?;
    }
    Ok(())
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "repaired the mode of {} from {:o} to {:o}: the store must be private",
            self.path.display(),
            self.from,
            self.to
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("skillfs-fsutil-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn modes_are_explicit_whatever_the_umask() {
        let d = scratch("modes");
        let old = skillfs_base::process::umask(0);
        create_dir_all(&d.join("a/b"), &StoreIo::real()).unwrap();
        let f = options()
            .write(true)
            .create(true)
            .open(d.join("a/f"))
            .unwrap();
        drop(f);
        replace_file(&d.join("a/r"), b"x", &StoreIo::real()).unwrap();
        skillfs_base::process::umask(old);
        for (p, want) in [("a", 0o700), ("a/b", 0o700), ("a/f", 0o600), ("a/r", 0o600)] {
            let m = fs::metadata(d.join(p)).unwrap().permissions().mode() & 0o7777;
            assert_eq!(m, want, "{p}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlinks_are_never_written_through() {
        let d = scratch("links");
        fs::write(d.join("outside"), "outside").unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("RULES")).unwrap();
        assert!(options().write(true).open(d.join("RULES")).is_err());
        let held = super::super::dir::Dir::open_path(&d).unwrap();
        assert!(held.open_append("RULES").is_err());
        assert!(held.read_small("RULES", 100).is_err());
        assert!(read_small(&d.join("RULES"), 100).is_err());
        replace_file(&d.join("RULES"), b"rules", &StoreIo::real()).unwrap();
        assert_eq!(fs::read(d.join("outside")).unwrap(), b"outside");
        assert!(!fs::symlink_metadata(d.join("RULES")).unwrap().is_symlink());
        std::os::unix::fs::symlink(d.join("outside"), d.join("LOCK")).unwrap();
        let e = audit(&d, skillfs_base::process::geteuid()).unwrap_err();
        assert!(e.to_string().contains("LOCK' is a symlink"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn audit_lists_open_modes_and_repair_narrows_them() {
        let d = scratch("audit");
        fs::create_dir_all(d.join("journal")).unwrap();
        fs::create_dir_all(d.join("parked/k/user")).unwrap();
        fs::write(d.join("journal/1.jsonl"), "").unwrap();
        fs::write(d.join("parked/k/user/x"), "").unwrap();
        for (p, m) in [
            ("", 0o777),
            ("journal", 0o755),
            ("journal/1.jsonl", 0o666),
            ("parked", 0o700),
            ("parked/k", 0o700),
            ("parked/k/user", 0o777),
            ("parked/k/user/x", 0o666),
        ] {
            fs::set_permissions(d.join(p), fs::Permissions::from_mode(m)).unwrap();
        }
        let r = audit(&d, skillfs_base::process::geteuid()).unwrap();
        let mut got: Vec<_> = r
            .iter()
            .map(|r| (r.path.strip_prefix(&d).unwrap().to_path_buf(), r.to))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (PathBuf::new(), 0o700),
                (PathBuf::from("journal"), 0o700),
                (PathBuf::from("journal/1.jsonl"), 0o600),
            ]
        );
        repair(&r).unwrap();
        assert!(
            audit(&d, skillfs_base::process::geteuid())
                .unwrap()
                .is_empty()
        );
        let m = fs::metadata(d.join("parked/k/user/x"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            m & 0o777,
            0o666,
            "the user's parked entries keep their modes"
        );
        fs::remove_dir_all(&d).unwrap();
    }
}
