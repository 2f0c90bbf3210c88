//! Skills across machines, this store's side (issue 25; the merge itself
//! is `skillfs_sync`'s). Each store is a **replica** with a stable id, it
//! knows its **remotes** (any URL `git` takes), and `skillfs sync`
//! **pushes** every version as a commit on the one ref it owns,
//! `refs/heads/skillfs/<replica>`, **fetches** the other replicas' refs and
//! keeps what it fetched for good (`kept`), then **merges** each of them
//! into the live tree through the mount (`pull`, `gittree`, `apply`).
//!
//! Layout in the store (private like the rest of it):
//! ```text
//! REPLICA              this store's replica id (32 hex digits), made once
//! sync/remotes.json    the remotes, and what was last pushed to each
//! sync/repo.git/       a bare repository: this replica's branch, made by
//!                      the same fast-import as `export --git`, and the
//!                      fetched branches under refs/remotes/<remote>/
//!                      (as each remote has them now), and every
//!                      replica's history fetched, kept for good under
//!                      refs/skillfs/kept/ and refs/skillfs/rewound/
//!                      (see `kept`)
//! sync/lock            held (flock) by a running sync
//! sync/merged.json     the base of each replica's next merge (`pull`)
//! sync/conflicts.jsonl the conflicts of the merges so far (`pull`)
//! sync/origins.jsonl   where each change a merge wrote came from: replica,
//!                      commit, author (`origins`)
//! sync/signers-<remote> whose signatures a remote's commits need (`trust`)
//! sync/blobmap         git's blob ids to the store's (`gittree`)
//! ```
//!
//! Invariants:
//! - a push is never forced: git refuses one that is not a fast-forward
//!   of what the remote holds, and receive-pack compares and swaps the
//!   ref, so a refused push of our own ref means another store pushed it:
//!   two stores share a replica id (a store copied whole), which is said,
//!   never overwritten;
//! - only this replica's ref is pushed; nothing else on the remote is
//!   touched, and `forget` never rewrites what was pushed (the branch is
//!   append-only: each run continues after the change its newest commit
//!   holds);
//! - per-device files never travel: they are untracked (never versioned,
//!   see `hide::DEFAULT_UNTRACKED`), and so in no commit;
//! - where the agent's own Skill Sync is on, `sync` refuses: the two
//!   would feed each other.
//!
//! Locks: `sync/lock`, one sync at a time per store; a sync that takes it
//! waits until no git works in `repo.git` (`run::settle`), then a lock
//! file left there is a killed git's, and it removes it; git locks its
//! refs.

mod apply;
mod base;
mod child;
mod conflicts;
mod fetched;
mod fields;
mod git;
mod gittree;
mod kept;
mod origins;
mod pull;
mod remotes;
mod replica;
mod run;
mod third;
pub mod trust;
mod version;
mod view;

pub use apply::actor_of;
pub use child::{output as run_bounded, stop};
pub use conflicts::{Resolve, conflicts, resolve};
pub use fetched::{Fetched, fetched, unmerged};
pub use git::git;
pub use origins::{AUTHOR_MAX, Origin, origins};
pub use pull::{Pulled, anything_to_merge, pull};
pub use remotes::{Remote, Remotes, check_name, sync_dir as remotes_dir};
pub use replica::replica_id;
pub use run::{AgentHome, Options, SyncReport, agent_home, lock, sync};
pub use version::{
    TheirVersion, keeps_replica, parse_version, parse_version_path, restore_version, show_version,
    their_version,
};
pub use view::Versions;
#[doc(hidden)]
pub use {
    replica::parse as parse_replica,
    run::{parse_count, push_rejected, remote_refs},
};

/// The branch a replica pushes.
pub fn branch_of(replica: &str) -> String {
    format!("refs/heads/skillfs/{replica}")
}
