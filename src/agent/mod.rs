//! The agent's own history as Hermes Agent keeps it on disk, read and
//! checked, never written: its curator snapshots (`snapshots`:
//! `skills/.curator_backups/<utc-id>/skills.tar.gz` with `manifest.json`)
//! and its skill ledger (`ledger`: `skills/.curator_ledger.jsonl`, whose
//! entries name blobs in `$HERMES_HOME/.curator_backups/blobs/<sha256>`).
//! `crate::import` makes them the start of a new store's history; `skillfs
//! log` matches the live ledger to the versions it describes.
//!
//! Invariants: nothing here writes or follows a symlink out of what it was
//! given; a damaged or missing part is a [`Damage`] (one line naming the
//! file, and the line or member, and what is wrong), never a panic and
//! never a failed command; text from the agent's files that ends up in a
//! journal record or on a terminal goes through [`plain`].
//!
//! Locks: none; these read files.

pub mod ledger;
pub mod snapshots;

use std::fmt;

use crate::store::journal::{Origin, Source};

/// One part of the agent's history that cannot be taken: where, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The snapshot (`snapshot 2026-05-01T13-05-42Z`) or ledger line
    /// (`ledger line 7`).
    pub part: String,
    pub why: String,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.part, self.why)
    }
}

/// `text` as at most `max` characters with no control character: what the
/// agent's files say (an actor, an action, a reason) may be anything, and
/// it is written into records and printed on terminals.
pub fn plain(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect()
}

/// How `log` names where an imported record came from:
/// `ledger 3f2a9c01b2c4: curator patch arxiv` or `snapshot
/// 2026-05-01T13-05-42Z: pre-curator-run`.
pub fn describe(o: &Origin) -> String {
    match o.source {
        Source::Ledger => {
            ledger::describe(&o.id, o.actor.as_deref(), &o.action, o.skill.as_deref())
        }
        Source::Snapshot => format!("snapshot {}: {}", o.id, o.action),
    }
}
