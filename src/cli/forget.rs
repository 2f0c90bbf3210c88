//! `skillfs forget`: a retention policy applied to a store. Mounted, the
//! daemon does the work (asked over its control socket, so the agent keeps
//! writing meanwhile); unmounted, this process does it under the store's
//! lock, as a daemon would.
//!
//! Invariant: a refused policy, a store that is not one, or a mount whose
//! daemon does not answer changes nothing.

use std::sync::Arc;

use parking_lot::Mutex;

use super::locate::Target;
use crate::daemon::control::{self, Request, Response};
use crate::error::{Exit, Failure};
use crate::ledger::Ledger;
use crate::retention::Policy;
use crate::retention::run::{Report, forget as run_forget};
use crate::store::blobs::BlobStore;
use crate::store::durable::StoreIo;
use crate::store::journal::Journal;
use crate::store::{StoreFds, StoreLock};

pub fn forget(t: &Target, policy: Policy, dry_run: bool) -> Result<(), Failure> {
    policy.check().map_err(|m| Failure::new(Exit::Usage, m))?;
    let layout = &t.layout;
    if !layout.journal().is_dir() {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "no skillfs store at '{}' (it has no journal/)",
                layout.dir.display()
            ),
        ));
    }
    // A daemon holds the store's lock for its life: it is the one to ask.
    let report = if StoreLock::holder(layout).is_some() {
        by_daemon(t, policy, dry_run)?
    } else {
        offline(t, &policy, dry_run)?
    };
    print(&report);
    Ok(())
}

fn by_daemon(t: &Target, policy: Policy, dry_run: bool) -> Result<Report, Failure> {
    let asked = control::ask(
        &t.layout.dir,
        &Request::Forget { policy, dry_run },
        control::FORGET_WAIT,
    );
    match asked {
        Ok(Response::Forgot(r)) => Ok(r),
        Ok(Response::Refused(why)) => Err(Failure::new(Exit::Usage, why)),
        Ok(other) => Err(Failure::new(
            Exit::Internal,
            format!("the daemon answered a forget with {other:?}"),
        )),
        Err(e) => {
            // Why it did not answer decides what helps: a remount only
            // gives a socket to a daemon that never made one.
            let next = if StoreLock::holder(&t.layout).is_none() {
                "the daemon ended before it answered (it died, or the store was unmounted): \
                 `skillfs log` shows whether the forget was recorded; run it again if not"
            } else if e.kind() == std::io::ErrorKind::NotFound {
                "a daemon older than `forget` has none: remount it with this skillfs"
            } else if e.kind() == std::io::ErrorKind::TimedOut {
                "it may still be working: `skillfs log` shows the forget once it is recorded"
            } else {
                "`skillfs log` shows whether a forget was recorded"
            };
            Err(Failure::new(
                Exit::MountRefused,
                format!(
                    "the daemon serving the store '{}' did not answer on its control socket \
                     ({e}); {next}",
                    t.layout.dir.display()
                ),
            ))
        }
    }
}

/// The store unmounted: its lock taken, the journal read as a mount
/// reads it, the forget done here.
fn offline(t: &Target, policy: &Policy, dry_run: bool) -> Result<Report, Failure> {
    let layout = &t.layout;
    // The one real door of this command (see `store::durable`).
    let fds = StoreFds::open(layout, StoreIo::real())?;
    let _lock = StoreLock::acquire(&fds.top, layout)?;
    let (contents, base) = crate::checkpoint::read_for_mount(&fds.journal, &mut Vec::new())?;
    let store_err = |what: &str, e: std::io::Error| {
        Failure::new(
            Exit::BadStore,
            format!("could not {what} in '{}': {e}", layout.dir.display()),
        )
    };
    let j = Journal::open_in(&fds.journal, &contents, fds.io.clone())?;
    let ledger = Mutex::new(Ledger::from_records(j, base, contents.records));
    let blobs = BlobStore::new(Arc::clone(&fds.blobs), fds.io.clone());
    run_forget(
        &ledger,
        &blobs,
        |_| ledger.lock().sync(&blobs),
        policy,
        dry_run,
    )
    .map_err(|e| store_err("forget", e))
}

fn print(r: &Report) {
    for line in lines(r) {
        println!("{line}");
    }
}

/// What `forget` prints of a report (the daemon's answer, untrusted).
pub(crate) fn lines(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let ranges: Vec<String> = r
        .selection
        .forget
        .iter()
        .map(|[a, b]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    let n = r.selection.forget_count();
    let kept = r.kept;
    let before = if r.forgotten_before > 0 {
        format!("; {} forgotten before", r.forgotten_before)
    } else {
        String::new()
    };
    if r.dry_run {
        if n == 0 {
            out.push(format!(
                "would forget nothing: the policy keeps all {kept} ids{before}"
            ));
        } else {
            out.push(format!(
                "would forget {n} ids ({}), keep {kept}{before}; about {} of contents only they show",
                ranges.join(", "),
                super::status::human(r.dead_bytes)
            ));
        }
        return out;
    }
    out.push(match r.record {
        Some(seq) => format!(
            "forgot {n} ids ({}) in change {seq}, kept {kept}{before}",
            ranges.join(", ")
        ),
        None => format!("nothing new to forget: the policy keeps all {kept} ids{before}"),
    });
    let c = &r.reclaimed;
    out.push(format!(
        "freed {}: {} loose blobs removed, {} packs rewritten ({} entries dropped)",
        super::status::human(c.bytes_freed),
        c.loose_removed,
        c.packs_rewritten,
        c.entries_dropped
    ));
    out
}
