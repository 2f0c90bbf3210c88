//! The remotes a store syncs with, in `sync/remotes.json`, and what was
//! last pushed to each. Written whole and atomically (`Dir::replace`).
//!
//! Locks: the caller holds `sync/lock` for every change.

use serde::{Deserialize, Serialize};

use crate::error::{Exit, Failure};
use crate::store::durable::StoreIo;
use crate::store::{Dir, Layout};

const FILE: &str = "remotes.json";
/// Largest `remotes.json` read.
const MAX_BYTES: u64 = 1 << 20;

/// One remote.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Remote {
    pub name: String,
    /// Anything `git` takes: a path, `file://`, `ssh://`, `https://`.
    pub url: String,
    /// When a sync with it last finished (ns since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<i64>,
    /// The newest change id its copy of this replica's branch holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed: Option<u64>,
    /// The other replicas seen there at the last sync, and their commits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<(String, u64)>,
    /// Why the last sync with it failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether this replica's newest commit is signed before it is pushed
    /// there (`remote add --sign`; see `trust`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sign: bool,
    /// Whether a replica's commit fetched from it is merged only when a
    /// key of `sync/signers-<name>` signed it (`remote add --signers`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub signers: bool,
}

/// Every remote of a store.
#[derive(Serialize, Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct Remotes {
    pub remotes: Vec<Remote>,
}

/// A remote's name: what a git ref and a shell word can both hold.
pub fn check_name(name: &str) -> Result<(), Failure> {
    // And what git takes in a ref name (git check-ref-format).
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && !name.ends_with('.')
        && !name.ends_with(".lock")
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Failure::new(
            Exit::Usage,
            format!(
                "'{name}' is not a remote name: use letters, digits, '.', '_' and '-' \
                 (at most 64, not starting with '.' or '-')"
            ),
        ))
    }
}

/// The store's `sync/` directory, made if `make`.
pub fn sync_dir(layout: &Layout, make: bool) -> Result<Option<Dir>, Failure> {
    let top = Dir::open_path(&layout.dir)
        .map_err(|e| Failure::io(Exit::BadStore, "open", &layout.dir, &e))?;
    let r = if make {
        top.ensure_sub("sync", &StoreIo::real()).map(Some)
    } else {
        match top.sub("sync") {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    };
    r.map_err(|e| Failure::io(Exit::BadStore, "open", &layout.dir.join("sync"), &e))
}

impl Remotes {
    pub fn load(dir: Option<&Dir>) -> Result<Remotes, Failure> {
        let Some(dir) = dir else {
            return Ok(Remotes::default());
        };
        let path = dir.join(FILE);
        match dir.read_small(FILE, MAX_BYTES) {
            Ok(None) => Ok(Remotes::default()),
            Ok(Some(b)) => Remotes::parse(&b).map_err(|e| {
                Failure::new(
                    Exit::BadStore,
                    format!("'{}' does not parse: {e}", path.display()),
                )
            }),
            Err(e) => Err(Failure::io(Exit::BadStore, "read", &path, &e)),
        }
    }

    /// The remotes `remotes.json`'s bytes name.
    pub fn parse(bytes: &[u8]) -> Result<Remotes, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    pub fn save(&self, dir: &Dir) -> Result<(), Failure> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| {
            Failure::new(Exit::Internal, format!("could not write the remotes: {e}"))
        })?;
        dir.replace(FILE, &text, &StoreIo::real())
            .map_err(|e| Failure::io(Exit::BadStore, "write", &dir.join(FILE), &e))
    }

    pub fn get(&self, name: &str) -> Option<&Remote> {
        self.remotes.iter().find(|r| r.name == name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut Remote> {
        self.remotes.iter_mut().find(|r| r.name == name)
    }
}
