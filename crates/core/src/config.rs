//! The store's `config.json`: what a user sets for one store (rules added
//! to or removed from the hide and untracked defaults, the park age, a
//! retention policy the daemon applies on its own). Read once at mount,
//! and by the commands that report it.
//!
//! Invariants: a missing file is the empty config; an unknown field, a
//! file that does not parse or one larger than [`CONFIG_MAX_BYTES`] is
//! refused whole, never half applied.
//!
//! Locks: none; a config is a value.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const CONFIG_FILE: &str = "config.json";
/// Largest `config.json` read.
pub const CONFIG_MAX_BYTES: u64 = 1 << 20;

/// What the store's `config.json` may say.
#[derive(Serialize, Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Rules added to the defaults.
    #[serde(default)]
    pub hide: Vec<String>,
    /// Default rules removed, by their text or their pattern.
    #[serde(default)]
    pub show: Vec<String>,
    /// Parks untouched for longer than this are swept (`30m`, `12h`, `7d`).
    #[serde(default)]
    pub park_max_age: Option<String>,
    /// Untracked rules added to the defaults.
    #[serde(default)]
    pub untracked: Vec<String>,
    /// Default untracked rules removed (those files get versions again).
    #[serde(default)]
    pub tracked: Vec<String>,
    /// A retention policy the mounted daemon applies on its own, every
    /// `every` (as `skillfs forget` with the same rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<skillfs_model::retention::Policy>,
    /// A sync with every remote the mounted daemon runs on its own (as
    /// `skillfs sync`), every `every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncSchedule>,
}

/// `"sync": {"every": "30s"}`, and optionally `"timeout": "10m"`.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct SyncSchedule {
    /// An age (`30s`, `10m`, `1h`); at least [`SYNC_MIN_EVERY_SECS`].
    pub every: String,
    /// How long one git command of a scheduled sync (a push, a fetch) may
    /// run before it is stopped with everything it started; an age, at
    /// least [`SYNC_MIN_EVERY_SECS`]. Default [`SYNC_DEFAULT_TIMEOUT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// How long one git command of a scheduled sync runs at most, unless
/// `timeout` says otherwise: long enough for a first push of a large tree
/// over a slow link, short enough that a remote that hangs is given up.
pub const SYNC_DEFAULT_TIMEOUT: &str = "10m";

/// The shortest interval between two scheduled syncs: a sync is a git
/// push and fetch per remote.
pub const SYNC_MIN_EVERY_SECS: u64 = 1;

impl SyncSchedule {
    /// The interval, or why `every` is not one.
    pub fn interval(&self) -> Result<std::time::Duration, String> {
        age("every", &self.every)
    }

    /// The bound on one git command, or why `timeout` is not one.
    pub fn timeout(&self) -> Result<std::time::Duration, String> {
        age(
            "timeout",
            self.timeout.as_deref().unwrap_or(SYNC_DEFAULT_TIMEOUT),
        )
    }
}

/// `value` of the field `what` as an age of at least
/// [`SYNC_MIN_EVERY_SECS`].
fn age(what: &str, value: &str) -> Result<std::time::Duration, String> {
    let ns = skillfs_base::time::parse_age(value)
        .ok_or_else(|| format!("{what}: '{value}' is not an age (30s, 10m, 1h)"))?;
    let d = std::time::Duration::from_nanos(ns.max(0) as u64);
    if d.as_secs() < SYNC_MIN_EVERY_SECS {
        return Err(format!(
            "{what}: '{value}' is shorter than {SYNC_MIN_EVERY_SECS}s"
        ));
    }
    Ok(d)
}

/// Why `config.json` could not be used.
#[derive(Debug)]
pub enum ConfigError {
    /// It is there but is not a config: it does not parse, or it is too
    /// large or not a regular file. The user's to fix (exit 7).
    Invalid { path: PathBuf, reason: String },
    /// It could not be read: the store's fault (exit 4).
    Read { path: PathBuf, source: io::Error },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Invalid { path, reason } => {
                write!(f, "config file '{}' {reason}", path.display())
            }
            ConfigError::Read { path, source } => {
                write!(
                    f,
                    "could not read config file '{}': {source}",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Invalid { .. } => None,
            ConfigError::Read { source, .. } => Some(source),
        }
    }
}

impl Config {
    /// Reads `<store>/config.json`; a missing file is the empty config.
    pub fn load(store: &Path) -> Result<Config, ConfigError> {
        let path = store.join(CONFIG_FILE);
        match skillfs_store::fsutil::read_small(&path, CONFIG_MAX_BYTES) {
            Ok(Some(b)) => serde_json::from_slice(&b).map_err(|e| ConfigError::Invalid {
                path,
                reason: format!("does not parse: {e}"),
            }),
            Ok(None) => Ok(Config::default()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(ConfigError::Invalid {
                path,
                reason: format!("is {e}"),
            }),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }
}
