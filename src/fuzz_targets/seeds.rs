//! Valid inputs for every target, made by skillfs's own code (the
//! encoder, the pack writer, the checkpoint writer, serde), and the small
//! fixtures the targets read beside their input. `fuzz/seeds/` holds
//! them as files (`SKILLFS_WRITE_SEEDS=1 cargo test --test it -- fuzz_replay::`
//! writes them again); the replay test checks they are still accepted.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::scratch;
use crate::catalog::Fold;
use crate::daemon::control::{Request, Response};
use crate::history::HistoryIndex;
use crate::relpath::{ByteString, RelPath};
use crate::retention::Policy;
use crate::retention::run::Report;
use crate::store::Dir;
use crate::store::durable::StoreIo;
use crate::store::journal::{self, Actor, EntryState, Kind, Op, Record};
use crate::store::packs::Packs;

/// The id of the one snapshot `curator_snapshot` writes.
pub const SNAPSHOT_ID: &str = "2026-05-01T13-05-42Z";
/// The content of the one blob in the agent's blob directory that
/// `curator_ledger`'s entries may name.
pub const LEDGER_BLOB: &[u8] = b"---\nname: foo\ndescription: a skill\n---\nbody\n";

const T0: i64 = 1_777_640_742_000_000_000; // 2026-05-01T13:05:42Z

fn state(kind: Kind, blob: Option<&[u8]>, target: Option<&[u8]>) -> EntryState {
    EntryState {
        kind,
        blob: blob.map(|b| crate::relpath::hex(&Sha256::digest(b))),
        size: blob.map_or(0, |b| b.len() as u64),
        mode: if kind == Kind::Dir { 0o755 } else { 0o644 },
        uid: 1000,
        gid: 1000,
        mtime_ns: i128::from(T0),
        target: target.map(|t| ByteString(t.to_vec())),
    }
}

/// A few records of every common kind: directories, files written and
/// renamed, a symlink, an unlink, a forget.
pub fn sample_records() -> Vec<Record> {
    let p = |s: &str| RelPath::parse(s.as_bytes()).expect("a sample path");
    let rec = |seq: u64, op: Op, path: &str, st: Option<EntryState>| Record {
        seq,
        ts: T0 + seq as i64 * 3_600_000_000_000,
        op,
        path: p(path),
        to: None,
        noreplace: false,
        hidden: None,
        state: st,
        actor: Actor {
            uid: 1000,
            pid: 42,
            comm: "agent".into(),
        },
        forgot: Vec::new(),
        acked_through: Some(seq - 1),
        origin: None,
    };
    let mut out = vec![
        rec(1, Op::Mkdir, "cat", Some(state(Kind::Dir, None, None))),
        rec(2, Op::Mkdir, "cat/foo", Some(state(Kind::Dir, None, None))),
        rec(
            3,
            Op::Create,
            "cat/foo/SKILL.md",
            Some(state(Kind::File, Some(b"a\n"), None)),
        ),
        rec(
            4,
            Op::Write,
            "cat/foo/SKILL.md",
            Some(state(Kind::File, Some(b"b\n"), None)),
        ),
        rec(
            5,
            Op::Symlink,
            "cat/ln",
            Some(state(Kind::Symlink, None, Some(b"foo"))),
        ),
        rec(6, Op::Rename, "cat/foo", None),
        rec(7, Op::Unlink, "cat/ln", None),
        rec(8, Op::Forget, "", None),
    ];
    out[5].to = Some(p("cat/bar"));
    out[7].forgot = vec![[3, 3]];
    out
}

/// [`sample_records`] as a journal segment.
pub fn sample_journal() -> Vec<u8> {
    sample_records().iter().flat_map(journal::encode).collect()
}

/// The history [`sample_records`] fold to.
pub fn sample_history() -> HistoryIndex {
    Fold::replay(&sample_records()).into_history()
}

/// Every seed: its target, a name, its bytes.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add = |t: &'static str, name: &str, b: Vec<u8>| out.push((t, name.to_string(), b));
    for (i, r) in sample_records().iter().enumerate() {
        // The body without its checksum: the target adds it.
        add(
            "journal_line",
            &format!("record-{}", i + 1),
            serde_json::to_vec(r).unwrap(),
        );
    }
    let bodies: Vec<Vec<u8>> = sample_records()
        .iter()
        .map(|r| serde_json::to_vec(r).unwrap())
        .collect();
    add(
        "journal",
        "one-segment",
        [bodies.join(&b'\n'), b"\n".to_vec()].concat(),
    );
    add(
        "journal",
        "two-segments-torn-tail",
        [
            bodies[..4].join(&b'\n'),
            b"\n\x0c".to_vec(),
            bodies[4..].join(&b'\n'),
        ]
        .concat(),
    );
    add("pack", "three-blobs", sample_pack());
    add("checkpoint", "after-8-records", sample_checkpoint());
    for (name, req) in [
        ("status", Request::Status),
        (
            "forget",
            Request::Forget {
                policy: Policy {
                    keep_last: Some(3),
                    keep_within: Some("2d".into()),
                    keep_weekly: Some(2),
                    every: Some("1h".into()),
                    ..Policy::default()
                },
                dry_run: true,
            },
        ),
    ] {
        add(
            "control",
            &format!("request-{name}"),
            serde_json::to_vec(&req).unwrap(),
        );
    }
    let mut report = Report::default();
    report.selection.forget = vec![[1, 2], [5, 5]];
    report.kept = 6;
    report.dead_bytes = 4096;
    report.dry_run = true;
    add(
        "control",
        "answer-forgot",
        serde_json::to_vec(&Response::Forgot(report)).unwrap(),
    );
    add("curator_snapshot", "three-members", sample_tar());
    add("curator_ledger", "patch-and-delete", sample_ledger());
    add(
        "sync_git",
        "commit",
        b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor a <a@b> 1 +0000\n\
          committer a <a@b> 1 +0000\n\nwrite cat/foo/SKILL.md\n\n\
          skillfs-id: 4\nskillfs-time: 1777641000000000000\n"
            .to_vec(),
    );
    add(
        "sync_git",
        "porcelain",
        b"To /tmp/r.git\n!\trefs/heads/skillfs/0123:refs/heads/skillfs/0123\t[rejected] \
          (non-fast-forward)\nDone\n"
            .to_vec(),
    );
    add(
        "sync_git",
        "refs",
        b"refs/remotes/origin/0123\nrefs/remotes/origin/89abcdef0123456789abcdef01234567\n"
            .to_vec(),
    );
    add(
        "sync_git",
        "remotes",
        br#"{"remotes":[{"name":"origin","url":"/tmp/r.git","pushed":4,"replicas":[["89ab",3]]}]}"#
            .to_vec(),
    );
    add(
        "sync_git",
        "replica",
        b"0123456789abcdef0123456789abcdef\n".to_vec(),
    );
    out
}

fn sample_pack() -> Vec<u8> {
    let blobs = scratch("seed-pack");
    let packs = Packs::new(Arc::new(Dir::open_path(&blobs).unwrap()), StoreIo::real());
    for data in [&b"a\n"[..], b"b\n", LEDGER_BLOB] {
        packs
            .append(&Sha256::digest(data).into(), data, false)
            .unwrap();
    }
    std::fs::read(packs.path(crate::store::packs::FIRST_ZPACK)).unwrap()
}

fn sample_checkpoint() -> Vec<u8> {
    let dir = scratch("seed-checkpoint");
    let journal = sample_journal();
    let seg = format!("{:020}.jsonl", 1);
    std::fs::write(dir.join(&seg), &journal).unwrap();
    let held = Dir::open_path(&dir).unwrap();
    let file = std::fs::File::open(dir.join(&seg)).unwrap();
    crate::checkpoint::write(
        &held,
        &StoreIo::real(),
        &sample_history(),
        &seg,
        &file,
        journal.len() as u64,
    )
    .unwrap();
    let mut cp = std::fs::read(dir.join(crate::checkpoint::NAME)).unwrap();
    cp.truncate(cp.len() - 4); // the target adds the checksum
    cp
}

/// A tar stream as Python's `tarfile` writes a snapshot: PAX times, a
/// directory, a file, a symlink.
fn sample_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut put = |path: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>| {
        b.append_pax_extensions([("mtime", &b"1777640742.123456"[..])])
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_size(data.len() as u64);
        h.set_mtime(1_777_640_742);
        h.set_uid(1000);
        h.set_gid(1000);
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        b.append_data(&mut h, path, data).unwrap();
    };
    put("./cat/foo", tar::EntryType::Directory, b"", None);
    put(
        "./cat/foo/SKILL.md",
        tar::EntryType::Regular,
        LEDGER_BLOB,
        None,
    );
    put(
        "./cat/foo/ln",
        tar::EntryType::Symlink,
        b"",
        Some("SKILL.md"),
    );
    b.into_inner().unwrap()
}

fn sample_ledger() -> Vec<u8> {
    let sha = crate::relpath::hex(&Sha256::digest(LEDGER_BLOB));
    format!(
        "{{\"id\":\"e1\",\"ts\":\"2026-05-01T14:00:00Z\",\"actor\":\"curator\",\"action\":\"patch\",\
         \"skill\":\"foo\",\"after\":[{{\"path\":\"$ROOT/cat/foo/SKILL.md\",\"sha256\":\"{sha}\"}}]}}\n\
         {{\"id\":\"e2\",\"ts\":\"2026-05-01T15:00:00Z\",\"actor\":\"agent\",\"action\":\"delete\",\
         \"skill\":\"foo\",\"before\":[{{\"path\":\"$ROOT/cat/foo/SKILL.md\",\"sha256\":\"{sha}\"}}]}}\n"
    )
    .into_bytes()
}
