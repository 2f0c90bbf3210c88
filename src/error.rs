//! Errors of the command line: `Failure` is what a command ends with (one
//! line and an exit code). Each layer below fails with its own type (the
//! store's `StoreError`, the core's `FsError`, `ConfigError` and
//! `RulesError`); the exit code each of them means is decided here, once.
//!
//! Exit codes (documented in docs/commands.md, "Exit codes"; one place for them):
//! 0 success, 1 unexpected internal failure, 2 usage error,
//! 3 bad ROOT (missing, not a directory, already mounted, not mounted),
//! 4 bad store (inside ROOT, another filesystem, unwritable, in use, or
//! holding history already for `import`), 5 damaged journal (or damaged
//! parts of the agent's history skipped by `import`), 6 the kernel refused
//! the mount, 7 bad hide rules or config file, 8 not in history (unknown
//! id or alias, path absent then), 9 busy (an unmount refused while
//! processes are inside the mount, or another sync running; nothing
//! changed), 10 a remote could not be reached or refused a push.
//!
//! Locks: none; these are values.

use std::fmt;
use std::io;

use crate::config::ConfigError;
use crate::hide::RulesError;
use crate::store::{ErrorKind, StoreError};

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
    /// An unmount refused: processes are inside the mount (`umount(8)`'s
    /// "target is busy"); nothing was changed.
    Busy = 9,
    /// A remote could not be reached, or refused what was sent.
    RemoteFailed = 10,
}

/// `message` with its control characters escaped: one line, which no
/// path, rule or config value in it can turn into another.
pub fn one_line(message: String) -> String {
    if !message.chars().any(char::is_control) {
        return message;
    }
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
}

/// `p` as one word a shell reads back as `p` (single-quoted when it holds
/// anything but plain characters), for a command a message suggests.
pub fn shell_word(p: &std::path::Path) -> String {
    let s = p.to_string_lossy();
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+~@%:,=".contains(&b));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
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
        Failure {
            exit,
            message: one_line(message.into()),
        }
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

impl From<ConfigError> for Failure {
    /// A config file that is not one is the user's to fix (7); one that
    /// cannot be read is the store's fault (4).
    fn from(e: ConfigError) -> Failure {
        let exit = match e {
            ConfigError::Invalid { .. } => Exit::BadRules,
            ConfigError::Read { .. } => Exit::BadStore,
        };
        Failure::new(exit, e.to_string())
    }
}

impl From<RulesError> for Failure {
    fn from(e: RulesError) -> Failure {
        Failure::new(Exit::BadRules, e.0)
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
