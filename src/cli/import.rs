//! `skillfs import`: the agent's own history into a store with none yet
//! (`crate::import`), or with `--dry-run` what that would take and skip.
//! Each part taken is a line on stdout; each part skipped, and each
//! snapshot member refused (its name leads out of the root), a line on
//! stderr; exit 5 when any part was skipped or member refused (the rest is
//! imported all the same), 4 when the store already holds history.
//!
//! Locks: the store's flock while importing (`daemon::import`).

use std::io::Write;
use std::path::PathBuf;

use crate::config::Config;
use crate::daemon::{self, MountArgs};
use crate::error::{Exit, Failure};
use crate::hide::HideRules;
use crate::import::Report;

pub fn import(args: &MountArgs, dry_run: bool) -> Result<(), Failure> {
    let report = if dry_run {
        let (root, store) = where_it_goes(args)?;
        let rules = HideRules::build(&Config::load(&store)?, &args.rules)?;
        crate::import::check(&root, &rules)
    } else {
        daemon::import(args)?
    };
    tell(&report, dry_run)
}

/// The versioned root and the store a mount of `args` would use (read
/// only: for the rules of a dry run).
fn where_it_goes(args: &MountArgs) -> Result<(PathBuf, PathBuf), Failure> {
    let top = daemon::absolute_root(&args.root)?;
    let root = match &args.versioned {
        Some(n) => top.join(n),
        None => top.clone(),
    };
    let store = match (&args.store, &args.versioned) {
        (None, None) => daemon::default_store_of(&root)?,
        (s, _) => daemon::store_dir(&top, s.as_deref())?,
    };
    if !root.is_dir() {
        return Err(Failure::new(
            Exit::BadRoot,
            format!("'{}' is not a directory", root.display()),
        ));
    }
    Ok((root, store))
}

fn tell(report: &Report, dry_run: bool) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    for t in &report.taken {
        let _ = writeln!(out, "{}{t}", if dry_run { "would import " } else { "" });
    }
    let mut err = std::io::stderr().lock();
    for d in &report.damage {
        let _ = writeln!(
            err,
            "skillfs: {} (skipped)",
            crate::error::one_line(d.to_string())
        );
    }
    for d in &report.refused {
        let _ = writeln!(
            err,
            "skillfs: {} (refused)",
            crate::error::one_line(d.to_string())
        );
    }
    let summary = if dry_run {
        format!(
            "{} part(s) of the agent's history would be imported, {} skipped, {} member(s) \
             refused",
            report.taken.len(),
            report.damage.len(),
            report.refused.len()
        )
    } else if report.taken.is_empty() && report.damage.is_empty() {
        "the agent kept no history to import (no curator snapshot, no ledger)".to_string()
    } else {
        report.summary()
    };
    if report.damage.is_empty() && report.refused.is_empty() {
        let _ = writeln!(out, "{summary}");
        Ok(())
    } else {
        Err(Failure::new(Exit::DamagedJournal, summary))
    }
}
