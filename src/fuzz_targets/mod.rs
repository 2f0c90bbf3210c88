//! The bodies of the fuzz targets (`fuzz/`, run by `scripts/fuzz.sh`):
//! one function per parser of bytes skillfs did not write itself in this
//! process, taking those bytes. The libFuzzer targets call them, and
//! `tests/it/fuzz_replay.rs` feeds them every kept crash input
//! (`fuzz/regressions/<target>/`) and every seed (`fuzz/seeds/<target>/`)
//! under plain `cargo test`, so a crash once fixed stays fixed without a
//! fuzzer. The merge of fetched trees is `skillfs_sync::fuzz_targets`.
//!
//! Invariant: a target returns for every input; a panic, a hang or an
//! allocation without bound is a bug in skillfs (or a check below that
//! found one: each `assert!` is a property the code promises).
//!
//! Files a target needs are written under
//! `$TMPDIR/skillfs-fuzz-<pid>-<thread>/`,
//! made again for each input.
//!
//! Locks: none.

mod app;
mod seeds;
mod store;

use std::path::PathBuf;

pub use app::{control, curator_ledger, curator_snapshot, sync_git};
pub use seeds::seeds;
pub use store::{checkpoint, journal, journal_line, pack};

/// A target's body: whether it took its input whole.
pub type Target = fn(&[u8]) -> bool;

/// Every target, by the name of its directory under `fuzz/seeds/` and
/// `fuzz/regressions/` (and of its binary in `fuzz/fuzz_targets/`).
/// Each returns whether the input was taken whole (it reached the last
/// step: the seeds must be).
pub const TARGETS: &[(&str, Target)] = &[
    ("journal_line", journal_line),
    ("journal", journal),
    ("pack", pack),
    ("checkpoint", checkpoint),
    ("control", control),
    ("curator_snapshot", curator_snapshot),
    ("curator_ledger", curator_ledger),
    ("sync_git", sync_git),
];

/// An empty directory of this process's own for `what`, made again.
fn scratch(what: &str) -> PathBuf {
    // One per thread: the replay tests run side by side in one process.
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let dir = std::env::temp_dir()
        .join(format!("skillfs-fuzz-{}-{thread}", std::process::id()))
        .join(what);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make a scratch directory");
    dir
}

/// `body` (one JSON object, no checksum) as the journal line `encode`
/// writes: its CRC-32 member added last. Lets a fuzzer's changes to a
/// record reach the JSON decoder, not only the checksum test.
fn with_crc(body: &[u8]) -> Vec<u8> {
    let Some(head) = body.strip_suffix(b"}") else {
        return body.to_vec();
    };
    let crc = crate::store::journal::crc32(body);
    let mut out = head.to_vec();
    out.extend_from_slice(format!(r#","crc":"{crc:08x}"}}"#).as_bytes());
    out
}

/// `data`'s lines, each that ends in `}` given its checksum.
fn lines_with_crc(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + data.len() / 4);
    let mut parts = data.split(|&b| b == b'\n').peekable();
    while let Some(line) = parts.next() {
        out.extend_from_slice(&with_crc(line));
        if parts.peek().is_some() {
            out.push(b'\n');
        }
    }
    out
}
