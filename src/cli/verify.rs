//! `skillfs verify`'s report: problems and notes on stdout, one line each,
//! then the summary; exit 5 if there is any problem (see `crate::verify`).
//! And `skillfs repair`, what a damaged journal needs then
//! (`store::journal::repair`).

use std::io::Write;

use super::locate::Target;
use crate::error::{Exit, Failure};

pub fn verify(t: &Target, full: bool) -> Result<(), Failure> {
    let (root, layout) = (&t.root, &t.layout);
    has_journal(layout)?;
    let r = crate::verify::verify(layout, root, full, t.mount.is_some());
    let mut out = std::io::stdout().lock();
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    for p in &r.problems {
        let _ = writeln!(out, "{p}");
    }
    let ids = r
        .ids
        .map_or("none".to_string(), |(a, b)| format!("{a}-{b}"));
    let mib = r.bytes_read as f64 / (1 << 20) as f64;
    let secs = r.elapsed.as_secs_f64().max(1e-6);
    let what = format!(
        "{} records (ids {ids}), {} packs ({} entries), {} loose blobs{}; {mib:.1} MiB read in \
         {secs:.2} s ({:.0} MiB/s)",
        r.records,
        r.packs,
        r.pack_entries,
        r.loose,
        if full { ", live tree compared" } else { "" },
        mib / secs
    );
    if r.problems.is_empty() {
        let _ = writeln!(out, "sound: {what}");
        return Ok(());
    }
    Err(Failure::new(
        Exit::DamagedJournal,
        format!(
            "{} problem(s) in store '{}': {what}",
            r.problems.len(),
            layout.dir.display()
        ),
    ))
}

/// `skillfs repair`: the journal of an unmounted store made readable.
pub fn repair(t: &Target) -> Result<(), Failure> {
    let layout = &t.layout;
    has_journal(layout)?;
    if let Some(m) = &t.mount {
        return Err(Failure::new(
            Exit::BadRoot,
            format!(
                "'{}' is mounted: unmount it (skillfs umount '{}') before a repair",
                m.mount_point.display(),
                m.mount_point.display()
            ),
        ));
    }
    crate::store::StoreLock::refuse_if_held(layout)?;
    if crate::store::journal::read_dir(&layout.journal()).is_ok() {
        println!(
            "the journal of '{}' is sound: nothing to repair",
            layout.dir.display()
        );
        return Ok(());
    }
    let dir = crate::store::Dir::open_path(&layout.journal())
        .map_err(|e| Failure::io(Exit::BadStore, "open", &layout.journal(), &e))?;
    let done = crate::store::journal::repair(&dir, &crate::store::durable::StoreIo::real())
        .map_err(|e| Failure::io(Exit::BadStore, "repair", &layout.journal(), &e))?;
    let ids: Vec<String> = done.lost.iter().map(u64::to_string).collect();
    println!(
        "repaired the journal of '{}': {} records kept; ids held by damaged lines, now `lost`: \
         {}; {} out-of-sequence records left out; set aside, whole: {}; the next mount records \
         the live tree again",
        layout.dir.display(),
        done.kept,
        if ids.is_empty() {
            "none".to_string()
        } else {
            ids.join(", ")
        },
        done.dropped,
        done.set_aside
            .iter()
            .map(|n| format!("journal/{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// A store is there: it has a journal.
fn has_journal(layout: &crate::store::Layout) -> Result<(), Failure> {
    if layout.journal().is_dir() {
        return Ok(());
    }
    Err(Failure::new(
        Exit::BadStore,
        format!(
            "no skillfs store at '{}' (it has no journal/)",
            layout.dir.display()
        ),
    ))
}
