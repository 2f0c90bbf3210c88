//! `FsError`: what a filesystem request answers (an errno, with what was
//! being done and the error underneath, logged once by errno). The core's
//! calls fail with it; the FUSE adapter turns it into the kernel's reply.
//! It knows no exit codes: a command's failure is the application's.
//!
//! Locks: none; these are values.

use std::fmt;
use std::io;

/// What a filesystem request answers: the errno the kernel gets, and, for
/// the log, what was being done and the error underneath. Logged once, by
/// the FUSE adapter as it replies, at the level `level` chooses.
pub struct FsError {
    errno: i32,
    /// What was being done ("publish cat/foo/SKILL.md"), where known.
    context: Option<Box<str>>,
    source: Option<io::Error>,
}

/// How loud an error is in the log: an answer the caller asked for is no
/// event; a full disk is the user's to hear of; anything else is ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Warn,
    Error,
}

impl FsError {
    pub const ENOENT: FsError = FsError::of(libc::ENOENT);
    pub const EEXIST: FsError = FsError::of(libc::EEXIST);
    pub const EINVAL: FsError = FsError::of(libc::EINVAL);
    pub const EIO: FsError = FsError::of(libc::EIO);
    pub const EPERM: FsError = FsError::of(libc::EPERM);
    pub const EROFS: FsError = FsError::of(libc::EROFS);
    pub const EBADF: FsError = FsError::of(libc::EBADF);
    pub const EISDIR: FsError = FsError::of(libc::EISDIR);
    pub const ENOTDIR: FsError = FsError::of(libc::ENOTDIR);
    pub const ENOTEMPTY: FsError = FsError::of(libc::ENOTEMPTY);
    pub const ENAMETOOLONG: FsError = FsError::of(libc::ENAMETOOLONG);
    pub const ENOSYS: FsError = FsError::of(libc::ENOSYS);
    /// An inode the kernel still names was replaced or removed: the VFS
    /// looks the path up again (`LOOKUP_REVAL`) instead of failing.
    pub const ESTALE: FsError = FsError::of(libc::ESTALE);

    /// The answer `errno`, with nothing more to say.
    pub const fn of(errno: i32) -> FsError {
        FsError {
            errno,
            context: None,
            source: None,
        }
    }

    /// Says what was being done (kept: the innermost context wins).
    pub fn context(mut self, what: impl fmt::Display) -> FsError {
        if self.context.is_none() {
            self.context = Some(what.to_string().into_boxed_str());
        }
        self
    }

    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// Whether the answer is `errno`.
    pub fn is(&self, errno: i32) -> bool {
        self.errno == errno
    }

    /// The one table of how loud each answer is.
    pub fn level(&self) -> Level {
        match self.errno {
            // What the caller asked about is not there, is there, is of
            // the other kind, or may not be done here: answers, not events.
            libc::ENOENT
            | libc::EEXIST
            | libc::ENOTDIR
            | libc::EISDIR
            | libc::ENOTEMPTY
            | libc::ENAMETOOLONG
            | libc::EINVAL
            | libc::EROFS
            | libc::EPERM
            | libc::EACCES
            | libc::EXDEV
            | libc::EBADF
            | libc::ENOSYS
            | libc::ENOTSUP
            | libc::ENODATA
            | libc::ETXTBSY
            // The kernel looks the path up again.
            | libc::ESTALE => Level::Debug,
            // The disk or quota is full, or descriptors ran out: the user
            // can act on it.
            libc::ENOSPC | libc::EDQUOT | libc::EMFILE | libc::ENFILE => Level::Warn,
            // A failed device, or a failure of ours.
            _ => Level::Error,
        }
    }

    /// Logs it once, as the answer to `op`, at its level.
    pub fn log(&self, op: &str) {
        match self.level() {
            Level::Debug => tracing::debug!("{op}: {self}"),
            Level::Warn => tracing::warn!("{op}: {self}"),
            Level::Error => tracing::error!("{op}: {self}"),
        }
    }
}

impl Clone for FsError {
    fn clone(&self) -> FsError {
        FsError {
            errno: self.errno,
            context: self.context.clone(),
            source: self
                .source
                .as_ref()
                .map(|e| io::Error::new(e.kind(), e.to_string())),
        }
    }
}

/// Two errors are the same answer when their errno is.
impl PartialEq for FsError {
    fn eq(&self, other: &FsError) -> bool {
        self.errno == other.errno
    }
}

impl Eq for FsError {}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = &self.context {
            write!(f, "{c}: ")?;
        }
        match &self.source {
            Some(e) => write!(f, "{e}"),
            None => write!(f, "{}", io::Error::from_raw_os_error(self.errno)),
        }
    }
}

impl fmt::Debug for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for FsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

impl From<io::Error> for FsError {
    /// The system's errno where it gave one; else the errno of its kind
    /// (an error our code made or wrapped with a message, see `errno_of`).
    fn from(e: io::Error) -> FsError {
        FsError {
            errno: e.raw_os_error().unwrap_or_else(|| errno_of(e.kind())),
            context: None,
            source: Some(e),
        }
    }
}

/// The one table of what an error without an errno answers the kernel, by
/// its kind: the errno a system call failing that way gives. Such errors
/// are made by our code (a message wrapped around a failed call keeps only
/// its kind); anything not named here is answered `EIO`, the one answer
/// every caller understands.
fn errno_of(kind: io::ErrorKind) -> i32 {
    use io::ErrorKind as K;
    match kind {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::InvalidInput => libc::EINVAL,
        K::NotADirectory => libc::ENOTDIR,
        K::IsADirectory => libc::EISDIR,
        K::DirectoryNotEmpty => libc::ENOTEMPTY,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::StorageFull => libc::ENOSPC,
        K::QuotaExceeded => libc::EDQUOT,
        K::FileTooLarge => libc::EFBIG,
        K::InvalidFilename => libc::ENAMETOOLONG,
        K::TooManyLinks => libc::EMLINK,
        K::CrossesDevices => libc::EXDEV,
        K::StaleNetworkFileHandle => libc::ESTALE,
        K::Unsupported => libc::ENOTSUP,
        K::OutOfMemory => libc::ENOMEM,
        K::Interrupted => libc::EINTR,
        K::WouldBlock => libc::EAGAIN,
        K::Deadlock => libc::EDEADLK,
        K::ResourceBusy => libc::EBUSY,
        K::ExecutableFileBusy => libc::ETXTBSY,
        _ => libc::EIO,
    }
}

/// `.context(...)` on a result, for what was being done when it failed.
pub trait Context<T> {
    fn context(self, what: impl fmt::Display) -> FsResult<T>;
}

impl<T, E: Into<FsError>> Context<T> for Result<T, E> {
    fn context(self, what: impl fmt::Display) -> FsResult<T> {
        self.map_err(|e| e.into().context(what))
    }
}

pub type FsResult<T> = Result<T, FsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fs_error_carries_its_errno_context_and_source_and_its_level() {
        let e: io::Result<()> = Err(io::Error::from_raw_os_error(libc::ENOSPC));
        let e = e
            .context("publish cat/foo/SKILL.md")
            .context("outer")
            .unwrap_err();
        assert_eq!(e.errno(), libc::ENOSPC);
        assert!(e.is(libc::ENOSPC) && e == FsError::of(libc::ENOSPC));
        // The innermost context is kept: it says what failed.
        let text = e.to_string();
        assert!(text.starts_with("publish cat/foo/SKILL.md: "), "{text}");
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(e.level(), Level::Warn);
        assert_eq!(e.clone().to_string(), text);
        // The answers a caller asked for are no event; a failed device is.
        assert_eq!(FsError::ENOENT.level(), Level::Debug);
        assert_eq!(FsError::ESTALE.level(), Level::Debug);
        assert_eq!(FsError::EIO.level(), Level::Error);
        assert_eq!(
            FsError::ENOENT.to_string(),
            io::Error::from_raw_os_error(libc::ENOENT).to_string()
        );
        // An io::Error without an errno answers by its kind, else EIO: a
        // full disk wrapped in a message is still ENOSPC.
        assert_eq!(FsError::from(io::Error::other("x")).errno(), libc::EIO);
        // A poisoned store's refusal of a durable sync is EIO too.
        let poisoned = io::Error::other(skillfs_store::durable::PoisonedError);
        assert_eq!(FsError::from(poisoned).errno(), libc::EIO);
        let wrapped = io::Error::new(io::ErrorKind::StorageFull, "could not store 'a': full");
        assert_eq!(FsError::from(wrapped).errno(), libc::ENOSPC);
        for errno in [
            libc::ENOENT,
            libc::EEXIST,
            libc::ENOSPC,
            libc::ENOTEMPTY,
            libc::EROFS,
        ] {
            let kind = io::Error::from_raw_os_error(errno).kind();
            assert_eq!(errno_of(kind), errno, "the table and std agree on {errno}");
        }
    }
}
