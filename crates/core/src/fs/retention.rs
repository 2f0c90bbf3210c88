//! `forget` while mounted: the daemon's ledger and blob store, its group
//! commit for the record's durability (`retention::run` says the order).

use std::io;

use super::SkillFs;
use skillfs_model::retention::Policy;
use skillfs_model::retention::run::{Report, forget};

impl SkillFs {
    /// Forgets by `policy` (checked) while the agent keeps writing; one at
    /// a time.
    pub fn forget_versions(&self, policy: &Policy, dry_run: bool) -> io::Result<Report> {
        let _one = self.versions.forgetting();
        forget(
            self.versions.ledger_lock(),
            &self.blobs,
            |seq| self.versions.sync_through(&self.blobs, seq),
            policy,
            dry_run,
        )
    }
}
