//! An `fsync` is not failed by another file's version being stored at the
//! same moment. Builds that stored a large version's blob loose marked it
//! pending (to be synced by the next durability point) before renaming it
//! into place; an `fsync` of another file that synced the pending blobs in
//! between found no such file and answered `ENOENT`. fsx found it: three
//! at once on one mount, an `msync` failed within seconds. Large versions
//! are chunks in packs now; the test keeps the same race of closes and
//! fsyncs over them.
//!
//! One test binary of its own (it had an environment of its own).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::Mount;

#[test]
fn an_fsync_is_not_failed_by_another_files_version_being_stored() {
    let m = Mount::new("store-race");
    let root = m.root();
    let body = |tag: &str, n: u32| format!("{tag} {n:>9}\n").repeat(12800).into_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    // Closes: each stores a new version's blob (chunked: past the 128 KiB of a pack entry, 200 KiB), not durable.
    let closer = {
        let path = root.join("closed");
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                std::fs::write(&path, body("closed", n)).unwrap();
                n += 1;
            }
            n
        })
    };
    // Fsyncs of another file meanwhile: each syncs what is pending.
    let (mut fsyncs, mut failed) = (0, Vec::new());
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let mut f = std::fs::File::create(root.join("synced")).unwrap();
        std::io::Write::write_all(&mut f, &body("synced", fsyncs)).unwrap();
        if let Err(e) = f.sync_all() {
            failed.push(format!("fsync {fsyncs}: {e}"));
        }
        fsyncs += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let closes = closer.join().unwrap();
    eprintln!("{fsyncs} fsyncs, {closes} closes");
    assert!(
        failed.is_empty(),
        "{} of {fsyncs} fsyncs failed: {failed:?}",
        failed.len()
    );
    assert!(
        fsyncs >= 5 && closes >= 3,
        "too little ran: {fsyncs} fsyncs, {closes} closes"
    );
    // Every version is in the store, whole.
    drop(m);
}
