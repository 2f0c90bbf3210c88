//! The core without a kernel: [`open_core`] takes the same mount-time steps
//! as `skillfs mount` (the checks on ROOT and the store, the store's layout
//! and lock, the journal replayed into the ledger, the scan of ROOT) and
//! hands back the [`SkillFs`] to drive through its handlers directly, as the
//! FUSE adapter would. For tests that apply thousands of operations a second
//! (`tests/it/reftest.rs`); the daemon mounts the very same core.
//! [`open_core_with`] opens it through another door to the disk (a test
//! `SyncBackend`: `tests/it/power_loss_core.rs`) and a chosen durability
//! order.
//!
//! Invariant: the store is locked for as long as the [`Core`] lives, so a
//! second `open_core` (or a mount) of the same store is refused until it is
//! closed or dropped.

use std::path::Path;

use crate::daemon::{DiskAccess, MountArgs, Prepared, prepare};
use crate::error::Failure;
use crate::fs::SkillFs;
use crate::hide::RuleArgs;

/// An opened core and the lock on its store.
pub struct Core {
    prepared: Prepared,
}

/// Opens the core over `root` with its store at `store` and the hide rules
/// of `rules` (the defaults when empty), as a mount would.
pub fn open_core(root: &Path, store: &Path, rules: RuleArgs) -> Result<Core, Failure> {
    open_core_with(root, store, rules, &DiskAccess::real())
}

/// [`open_core`] with every durable sync of the store, ROOT and the core
/// through `disk.io`, in the order `disk.durability` says.
pub fn open_core_with(
    root: &Path,
    store: &Path,
    rules: RuleArgs,
    disk: &DiskAccess,
) -> Result<Core, Failure> {
    let args = MountArgs {
        root: root.to_path_buf(),
        versioned: None,
        store: Some(store.to_path_buf()),
        foreground: true,
        threads: 1,
        allow_other: false,
        transport: crate::fuse::Transport::Classic,
        rules,
        wait: false,
    };
    Ok(Core {
        prepared: prepare(&args, disk)?,
    })
}

impl Core {
    pub fn fs(&self) -> &SkillFs {
        &self.prepared.fs
    }

    /// What an unmount does: publishes what writers left, makes it durable
    /// and stops the core's threads; then the store is unlocked.
    pub fn close(mut self) {
        self.prepared.finish();
    }
}
