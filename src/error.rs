//! Errors: `FsError` is what a filesystem request answers (an errno);
//! `Failure` is what a command ends with (one line and an exit code). The
//! store fails with its own `store::StoreError`; the exit code each of its
//! kinds means is decided here, once (`From<StoreError> for Failure`).
//!
//! Exit codes (documented in the README; one place for them):
//! 0 success, 1 unexpected internal failure, 2 usage error,
//! 3 bad ROOT (missing, not a directory, already mounted, not mounted),
//! 4 bad store (inside ROOT, another filesystem, unwritable, in use),
//! 5 damaged journal, 6 the kernel refused the mount, 7 bad hide rules or
//! config file, 8 not in history (unknown id or alias, path absent then).
//!
//! Locks: none; these are values.

use std::fmt;
use std::io;

use crate::store::{ErrorKind, StoreError};

/// An errno answered to the kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FsError(pub i32);

impl FsError {
    pub const ENOENT: FsError = FsError(libc::ENOENT);
    pub const EEXIST: FsError = FsError(libc::EEXIST);
    pub const EINVAL: FsError = FsError(libc::EINVAL);
    pub const EIO: FsError = FsError(libc::EIO);
    pub const EPERM: FsError = FsError(libc::EPERM);
    pub const EROFS: FsError = FsError(libc::EROFS);
    pub const EBADF: FsError = FsError(libc::EBADF);
    pub const EISDIR: FsError = FsError(libc::EISDIR);
    pub const ENOTDIR: FsError = FsError(libc::ENOTDIR);
    pub const ENOTEMPTY: FsError = FsError(libc::ENOTEMPTY);
    pub const ENAMETOOLONG: FsError = FsError(libc::ENAMETOOLONG);
    pub const ENOSYS: FsError = FsError(libc::ENOSYS);
    /// An inode the kernel still names was replaced or removed: the VFS
    /// looks the path up again (`LOOKUP_REVAL`) instead of failing.
    pub const ESTALE: FsError = FsError(libc::ESTALE);

    pub fn errno(self) -> i32 {
        self.0
    }
}

impl fmt::Debug for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.0))
    }
}

impl From<io::Error> for FsError {
    /// An I/O error without an errno (it should not happen on the paths we
    /// use) is answered as `EIO`, the one answer every caller understands.
    fn from(e: io::Error) -> FsError {
        FsError(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

pub type FsResult<T> = Result<T, FsError>;

/// Exit codes of the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Internal = 1,
    Usage = 2,
    BadRoot = 3,
    BadStore = 4,
    DamagedJournal = 5,
    MountRefused = 6,
    BadRules = 7,
    NotFound = 8,
}

/// The one line a failed command prints, and its exit code.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    /// Control characters in `message` (from a path, a rule or a config
    /// value) are escaped, so the failure stays one line and cannot forge
    /// another.
    pub fn new(exit: Exit, message: impl Into<String>) -> Failure {
        let message = message.into();
        let message = if message.chars().any(char::is_control) {
            message
                .chars()
                .flat_map(|c| {
                    let esc: Vec<char> = if c.is_control() {
                        c.escape_default().collect()
                    } else {
                        vec![c]
                    };
                    esc
                })
                .collect()
        } else {
            message
        };
        Failure { exit, message }
    }

    /// "could not {what} '{path}': {err}" in the style of gitoxide.
    pub fn io(exit: Exit, what: &str, path: &std::path::Path, err: &io::Error) -> Failure {
        Failure::new(
            exit,
            format!("could not {what} '{}': {err}", path.display()),
        )
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<StoreError> for Failure {
    /// The one mapping of store errors to exit codes: a damaged (or
    /// unreadable) journal is 5, a store that cannot serve is 4, and ROOT
    /// that could not be examined while checking the store is 3.
    fn from(e: StoreError) -> Failure {
        let exit = match e.kind() {
            ErrorKind::Store => Exit::BadStore,
            ErrorKind::DamagedJournal => Exit::DamagedJournal,
            ErrorKind::Root => Exit::BadRoot,
        };
        Failure::new(exit, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn store_errors_keep_their_message_and_map_to_one_exit_each() {
        let e = StoreError::io(
            ErrorKind::DamagedJournal,
            "read journal",
            Path::new("j/1.jsonl"),
            io::Error::from_raw_os_error(libc::EIO),
        );
        let f = Failure::from(e);
        assert_eq!(f.exit, Exit::DamagedJournal);
        assert!(
            f.message
                .starts_with("could not read journal 'j/1.jsonl': "),
            "{f}"
        );
        let e = StoreError::refused(ErrorKind::Store, Path::new("s"), "in\nuse".into());
        let f = Failure::from(e);
        assert_eq!((f.exit, f.message.as_str()), (Exit::BadStore, "in\\nuse"));
        let e = StoreError::refused(ErrorKind::Root, Path::new("r"), "gone".into());
        assert_eq!(Failure::from(e).exit, Exit::BadRoot);
    }
}
