//! Records and scratch directories the journal's tests share.

use std::fs;
use std::path::PathBuf;

use super::encoding::encode;
use super::record::{Actor, EntryState, Kind, Op, Record};
use skillfs_base::relpath::RelPath;

pub(super) fn rec(seq: u64) -> Record {
    Record {
        seq,
        ts: 1_796_062_170_000_000_000,
        op: Op::Write,
        path: RelPath::parse(b"cat/foo/SKILL.md").unwrap(),
        to: None,
        noreplace: false,
        hidden: None,
        state: Some(EntryState {
            kind: Kind::File,
            blob: Some("ab".repeat(32)),
            size: 5,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime_ns: 5,
            target: None,
        }),
        actor: Actor {
            uid: 0,
            pid: 1,
            comm: "python3".into(),
        },
        forgot: Vec::new(),
        acked_through: Some(seq.saturating_sub(1)),
        origin: None,
    }
}

pub(super) fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("skillfs-journal-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Six records; syncs after 2 and after 4, so records 3-4 say 2 was
/// durable and 5-6 say 4 was.
pub(super) fn watermarked() -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut data = Vec::new();
    let mut lines = Vec::new();
    for (seq, acked) in [(1, 0), (2, 0), (3, 2), (4, 2), (5, 4), (6, 4)] {
        let mut r = rec(seq);
        r.acked_through = Some(acked);
        let start = data.len();
        data.extend(encode(&r));
        lines.push((start, data.len()));
    }
    (data, lines)
}
