//! `StoreError`: what the store's checks and set-up fail with (opening,
//! creating, locking, auditing the store, reading the journal): a kind, the
//! path involved and, where the system refused, its `io::Error`.
//!
//! The store knows nothing of the command line: the exit code a kind means
//! is decided in one place, `error::Failure`'s `From<StoreError>`. The
//! message is the one line a refused mount or command prints.
//!
//! Invariants: an error made by [`StoreError::io`] reads "could not {what}
//! '{path}': {source}" (gitoxide's style); one made by
//! [`StoreError::refused`] reads as its message, which names the path
//! itself. Locks: none.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// What went wrong, as a caller must react to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The store cannot serve: unreadable or unwritable, in use, badly
    /// placed, open to other users, or another root's.
    Store,
    /// The journal cannot be read, or its records are damaged.
    DamagedJournal,
    /// The tree the store versions (ROOT) could not be examined.
    Root,
}

#[derive(Debug)]
enum Message {
    /// "could not {0} '{path}': {source}".
    Doing(&'static str),
    /// A whole sentence (it names the path).
    Refused(String),
}

#[derive(Debug)]
pub struct StoreError {
    kind: ErrorKind,
    path: PathBuf,
    message: Message,
    source: Option<io::Error>,
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// The system refused `what` on `path`.
    pub fn io(kind: ErrorKind, what: &'static str, path: &Path, source: io::Error) -> StoreError {
        StoreError {
            kind,
            path: path.to_path_buf(),
            message: Message::Doing(what),
            source: Some(source),
        }
    }

    /// The store refuses `path`, for the reason `message` gives.
    pub fn refused(kind: ErrorKind, path: &Path, message: String) -> StoreError {
        StoreError {
            kind,
            path: path.to_path_buf(),
            message: Message::Refused(message),
            source: None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.message, &self.source) {
            (Message::Doing(what), Some(e)) => {
                write!(f, "could not {what} '{}': {e}", self.path.display())
            }
            (Message::Doing(what), None) => write!(f, "could not {what} '{}'", self.path.display()),
            (Message::Refused(m), _) => f.write_str(m),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
