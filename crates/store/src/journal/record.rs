//! What a journal record says: the change (`Op`), the path or paths it
//! touched, the state after it (`EntryState`, enough to recreate the entry
//! exactly), who made it (`Actor`) and its durability watermark; and
//! `Change`, a record before it has a sequence number.
//!
//! Invariants: sequence numbers start at 1 and have no gaps. Each record
//! carries `acked_through`, the highest sequence number known durable when
//! it was appended (its durability watermark); records written before it
//! existed have none. How a record is written as a line is `encoding`'s.
//!
//! Locks: none; plain values.

use serde::{Deserialize, Serialize};

use crate::blobs::BlobId;
use skillfs_base::relpath::{ByteString, RelPath};

/// What a record did.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// A new empty file (`O_CREAT`).
    Create,
    /// New content published by a writer's close or fsync.
    Write,
    /// A size change by `truncate`/`ftruncate` outside a write handle.
    Truncate,
    Mkdir,
    Unlink,
    Rmdir,
    /// `path` moved to `to`, replacing what was there.
    Rename,
    /// `path` and `to` swapped (`RENAME_EXCHANGE`).
    Exchange,
    Symlink,
    Chmod,
    Chown,
    Utimes,
    /// Several attributes at once.
    Setattr,
    /// Found at mount: added or changed while unmounted (or the first
    /// baseline); or, while mounted, an entry the daemon met that the
    /// journal did not have as it was (put into ROOT behind the daemon),
    /// recorded whole before a change to it (`fs::meet`).
    Scan,
    /// Found missing at mount: removed while unmounted.
    ScanRemove,
    /// A visible entry renamed to a hidden name (`hidden`): it leaves the
    /// visible tree, so history keeps it as removed.
    Park,
    /// A hidden entry (`hidden`) renamed to a visible `path`; one record for
    /// it and one for each entry below it, each with its state.
    Unpark,
    /// Hidden entries whose visible directory was removed, moved to the
    /// orphan area (`path` is where, in the store).
    Orphan,
    /// An old park or orphan removed for good (`path` is what, in the store
    /// or by its hidden name).
    Sweep,
    /// Put by `skillfs repair` in the place of a record that was damaged:
    /// its id is kept, what it said is lost (the damaged line is set aside
    /// in the journal directory), and the next mount's scan records the
    /// live tree again.
    Lost,
    /// `skillfs forget`: the ids in `forgot` leave `.history` and `log`
    /// (their content is kept only where a kept id still shows it); no
    /// effect on the tree.
    Forget,
    /// The agent's own history, imported before the first mount's scan
    /// (the application's `import`): an entry as a curator snapshot or a ledger entry
    /// of the agent had it, at that time (`origin` says which).
    Import,
    /// The agent's own history: an entry the snapshot or ledger entry no
    /// longer has (removed with everything below it).
    ImportRemove,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Write => "write",
            Op::Truncate => "truncate",
            Op::Mkdir => "mkdir",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Rename => "rename",
            Op::Exchange => "exchange",
            Op::Symlink => "symlink",
            Op::Chmod => "chmod",
            Op::Chown => "chown",
            Op::Utimes => "utimes",
            Op::Setattr => "setattr",
            Op::Scan => "scan",
            Op::ScanRemove => "scan-remove",
            Op::Park => "park",
            Op::Unpark => "unpark",
            Op::Orphan => "orphan",
            Op::Sweep => "sweep",
            Op::Lost => "lost",
            Op::Forget => "forget",
            Op::Import => "import",
            Op::ImportRemove => "import-remove",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// The state of one path after a change: enough to recreate it exactly.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EntryState {
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<BlobId>,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// `i128`: ext4 stores times from 1901 to 2446, past `i64` nanoseconds.
    pub mtime_ns: i128,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ByteString>,
}

/// Who made a change, from the FUSE request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    pub uid: u32,
    pub pid: u32,
    pub comm: String,
}

impl Actor {
    /// The daemon itself (mount-time scan).
    pub fn daemon() -> Actor {
        Actor {
            uid: skillfs_base::process::geteuid(),
            pid: std::process::id(),
            comm: "skillfs".to_string(),
        }
    }
}

/// Where an imported record came from: one curator snapshot or one entry
/// of the agent's skill ledger (every record of that entry carries it, so
/// `log` shows them as one operation, with the agent's words).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub source: Source,
    /// The snapshot's id (`2026-05-01T13-05-42Z`) or the ledger entry's.
    pub id: String,
    /// The ledger entry's action (`patch`, `delete`, `consolidate`…), or
    /// the snapshot's reason from its `manifest.json` (`pre-curator-run`).
    pub action: String,
    /// The ledger entry's actor (`curator`, `agent`, `user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The ledger entry's skill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `skills/.curator_backups/<id>/skills.tar.gz`.
    Snapshot,
    /// An entry of `skills/.curator_ledger.jsonl`.
    Ledger,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    /// UTC, nanoseconds since the Unix epoch.
    pub ts: i64,
    pub op: Op,
    pub path: RelPath,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<RelPath>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub noreplace: bool,
    /// The hidden name involved in a park or unpark; in a mount over a
    /// home, `../<path>` when it lies outside the versioned root.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "skillfs_base::relpath::hidden_deserialize"
    )]
    pub hidden: Option<RelPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<EntryState>,
    pub actor: Actor,
    /// For `forget`: the ids forgotten, as inclusive ranges in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgot: Vec<[u64; 2]>,
    /// The highest sequence number known durable when this record was
    /// appended (`None`: written before the watermark existed, read as
    /// "everything before me was durable").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_through: Option<u64>,
    /// Imported records only: the agent's snapshot or ledger entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
}

/// Fixtures for the tests of the modules that fold records, here and in
/// the crates above (their dev-dependencies turn on `fixtures`).
#[cfg(any(test, feature = "fixtures"))]
impl Record {
    /// `op` on `path` (to `to`) by the daemon, as change `seq` at `ts`.
    pub fn sample(
        seq: u64,
        ts: i64,
        op: Op,
        path: &str,
        to: Option<&str>,
        state: Option<EntryState>,
    ) -> Record {
        let parse = |p: &str| RelPath::parse(p.as_bytes()).expect("a test path");
        Record {
            seq,
            ts,
            op,
            path: parse(path),
            to: to.map(parse),
            noreplace: false,
            hidden: None,
            state,
            actor: Actor::daemon(),
            forgot: Vec::new(),
            acked_through: None,
            origin: None,
        }
    }
}

#[cfg(any(test, feature = "fixtures"))]
impl EntryState {
    /// A `kind` owned by root, mode 0644, with content `blob` if a file.
    pub fn sample(kind: Kind, blob: &str) -> EntryState {
        EntryState {
            kind,
            blob: (kind == Kind::File).then(|| blob.to_string()),
            size: 0,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime_ns: 0,
            target: None,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A change before it has a sequence number.
#[derive(Clone, Debug)]
pub struct Change {
    pub op: Op,
    pub path: RelPath,
    pub to: Option<RelPath>,
    pub noreplace: bool,
    pub hidden: Option<RelPath>,
    pub state: Option<EntryState>,
    pub forgot: Vec<[u64; 2]>,
    pub origin: Option<Origin>,
}

impl Change {
    pub fn new(op: Op, path: RelPath, state: Option<EntryState>) -> Change {
        Change {
            op,
            path,
            to: None,
            noreplace: false,
            hidden: None,
            state,
            forgot: Vec::new(),
            origin: None,
        }
    }
}
