//! `forget` carried out on a ledger and a blob store held open: by the
//! mounted daemon (asked over the control channel, or on its schedule) or
//! by the command line under the store's lock when nothing is mounted.
//!
//! Order, and what a kill at each point leaves:
//! 1. the selection, under the ledger's lock (nothing written);
//! 2. one `forget` record appended and made durable (a kill before it is
//!    durable forgets nothing; after, the ids are forgotten);
//! 3. the prune (`BlobStore::prune`): dead contents removed one by one
//!    (a kill leaves dead bytes that the next `forget`, even one that
//!    forgets nothing new, reclaims).
//!
//! Locks: the ledger's, for the selection and the append, and inside the
//! prune's start for the live set; never across the prune's I/O.

use std::io;

use parking_lot::Mutex;

use super::prune::{live_blobs, live_blobs_if, raw_of};
use super::{Policy, Selection, select};
use crate::history::{HistoryIndex, PathIdx};
use crate::ledger::Ledger;
use skillfs_base::relpath::RelPath;
use skillfs_store::blobs::{BlobStore, Reclaimed};
use skillfs_store::journal::{Actor, Change, Op};

/// What a forget did (or, dry, would do).
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub selection: Selection,
    /// How many ids the policy keeps.
    pub kept: u64,
    /// Ids forgotten before this run.
    pub forgotten_before: u64,
    /// The `forget` record appended (none when nothing new is forgotten).
    pub record: Option<u64>,
    pub reclaimed: Reclaimed,
    /// Bytes of the contents that only forgotten ids showed (a dry run's
    /// estimate of what a prune frees; packs free their entries' bytes).
    pub dead_bytes: u64,
    pub dry_run: bool,
}

/// Forgets by `policy` (checked by the caller). `durable(seq)` makes
/// every record up to `seq` durable (the daemon's group commit, or the
/// command's own sync).
pub fn forget(
    ledger: &Mutex<Ledger>,
    blobs: &BlobStore,
    durable: impl FnOnce(u64) -> io::Result<()>,
    policy: &Policy,
    dry_run: bool,
) -> io::Result<Report> {
    let mut report = Report {
        dry_run,
        ..Report::default()
    };
    {
        let mut l = ledger.lock();
        let h = l.history();
        report.forgotten_before = h.forgotten_count();
        report.selection = select(h, policy);
        report.kept = report.selection.keep.len() as u64;
        report.dead_bytes = dead_bytes(h, &report.selection.forget);
        if dry_run {
            return Ok(report);
        }
        if !report.selection.forget.is_empty() {
            let mut change = Change::new(Op::Forget, RelPath::root(), None);
            change.forgot = report.selection.forget.clone();
            let rec = l.record(change, Actor::daemon())?;
            report.record = Some(rec.seq);
        }
    }
    if let Some(seq) = report.record {
        durable(seq)?;
    }
    report.reclaimed = blobs.prune(|| live_blobs(ledger.lock().history()))?;
    Ok(report)
}

/// The bytes of the distinct contents that forgetting `ranges` would
/// leave unshown (sizes as recorded).
fn dead_bytes(h: &HistoryIndex, ranges: &[[u64; 2]]) -> u64 {
    if ranges.is_empty() {
        return 0;
    }
    let before = live_blobs(h);
    let after = live_blobs_if(h, ranges);
    let mut counted = std::collections::HashSet::new();
    let mut total = 0;
    for idx in 0..h.path_count() as PathIdx {
        for (_, s) in h.versions(idx) {
            let Some((raw, size)) = s
                .as_ref()
                .and_then(|s| Some((raw_of(s.blob.as_deref()?)?, s.size)))
            else {
                continue;
            };
            if before.contains(&raw) && !after.contains(&raw) && counted.insert(raw) {
                total += size;
            }
        }
    }
    total
}
