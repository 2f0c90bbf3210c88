//! Mounting and unmounting: the checks before a mount, the background
//! daemon, its readiness report and its clean shutdown.
//!
//! One question a file:
//! - `mountinfo`: which mounts there are (`/proc/self/mountinfo`) and which
//!   of them are skillfs's;
//! - `checks`: where ROOT and its store are, and whether they may be
//!   mounted;
//! - `prepare`: a core ready to serve, its store locked, built by the same
//!   steps for a mount and for `open::open_core` (and, up to the import of
//!   the agent's own history, for `skillfs import`);
//! - `spawn`: `mount` in the background, and the daemon's readiness report
//!   to it;
//! - `run`: the daemon's life: the mount, the signal and sweep threads, the
//!   shutdown;
//! - `unmount`: `skillfs umount`, unmounting a quiet mount, detaching one;
//! - `holders`: who keeps a mount busy (for the message of a refusal);
//! - `lifecycle`: `skillfs mount` over a mount that is there already (a
//!   dead one recovered, an older daemon upgraded when quiet);
//! - `control`: the socket in the store by which a command asks the
//!   mounted daemon to do work on it (`forget`).
//!
//! Store errors become exit codes through `error::Failure`.
//!
//! Locks: the store's flock (`StoreLock`), held for the daemon's life; the
//! signal and sweep threads reach the core's locks only through `SkillFs`.

// A daemon that panics on a failed call takes the mount down with it: it
// answers the error instead (tests may unwrap; see clippy.toml).
#![deny(clippy::unwrap_used)]

mod checks;
pub mod control;
pub mod holders;
mod lifecycle;
mod mountinfo;
mod prepare;
mod run;
mod spawn;
mod unmount;

pub use checks::{absolute_root, default_store_of, store_dir};
pub use lifecycle::{Build, compare_build};
pub use mountinfo::{MountInfo, SOURCE_PREFIX, mount_at, mount_serving, mounts, versioned_root_of};
pub use prepare::{DiskAccess, MountArgs, import};
pub(crate) use prepare::{Prepared, prepare};
pub use run::mount;
pub use skillfs_base::mounts::lazy_unmount;
pub use unmount::{Quiet, busy_failure, umount, unmount_if_quiet};
