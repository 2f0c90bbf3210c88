//! Targets for what the application reads from others: the control
//! socket's request and answer, the agent's curator snapshots and ledger
//! (an import), and what git gives back to a sync or an export.

use super::scratch;
use super::seeds::{LEDGER_BLOB, SNAPSHOT_ID, sample_history};
use crate::daemon::control::{Response, parse_answer, parse_request};
use crate::hide::HideRules;
use crate::retention::select;

/// One control request as a daemon reads it from a peer (and, for a
/// forget, the policy checked and applied to a small history), and the
/// same bytes as an answer a client reads and prints.
pub fn control(data: &[u8]) -> bool {
    let request = parse_request(data);
    if let Ok(crate::daemon::control::Request::Forget { policy, .. }) = &request
        && policy.check().is_ok()
    {
        let _ = policy.interval();
        let _ = select(&sample_history(), policy).forget_count();
    }
    let answer = parse_answer(data);
    if let Ok(Response::Forgot(report)) = &answer {
        let _ = crate::cli::forget::lines(report);
    }
    request.is_ok() || answer.is_ok()
}

/// A curator snapshot's archive: `data` is a tar stream, gzipped here
/// (so the fuzzer's changes reach the tar reader), unless it is gzip
/// already (starts with gzip's magic); then the import's check of the
/// skills root that holds it.
pub fn curator_snapshot(data: &[u8]) -> bool {
    let root = scratch("snapshot").join("skills");
    let snap = root
        .join(crate::agent::snapshots::BACKUPS)
        .join(SNAPSHOT_ID);
    std::fs::create_dir_all(&snap).expect("make the snapshot's directory");
    let archive = if data.starts_with(&[0x1f, 0x8b]) {
        data.to_vec()
    } else {
        gzip(data)
    };
    let path = snap.join(crate::agent::snapshots::ARCHIVE);
    std::fs::write(&path, archive).expect("write the archive");
    std::fs::write(
        snap.join("manifest.json"),
        br#"{"reason":"pre-curator-run","created_at":"2026-05-01T13:05:42.5Z"}"#,
    )
    .expect("write the manifest");
    let file = std::fs::File::open(&path).expect("open the archive");
    let mut bounded = |_: &crate::agent::snapshots::Member, r: &mut dyn std::io::Read| {
        std::io::copy(&mut std::io::Read::take(r, 1 << 20), &mut std::io::sink()).map(drop)
    };
    let _ = crate::agent::snapshots::read(&file, &mut bounded);
    taken_whole(&crate::import::check(&root, &HideRules::defaults()))
}

/// Whether an import took every part and refused nothing (its lines are
/// made too, as a user sees them).
fn taken_whole(r: &crate::import::Report) -> bool {
    let _ = r.lines();
    !r.taken.is_empty() && r.damage.is_empty() && r.refused.is_empty()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

/// The agent's skill ledger: `data` is its text, `$ROOT` in it standing
/// for the skills root's path; one blob ([`LEDGER_BLOB`]) is in the
/// agent's blob directory for entries to name. Then the import's check.
pub fn curator_ledger(data: &[u8]) -> bool {
    let root = scratch("ledger").join("skills");
    let (ledger, blobs) = crate::agent::ledger::places(&root);
    std::fs::create_dir_all(&blobs).expect("make the blob directory");
    std::fs::create_dir_all(&root).expect("make the skills root");
    let sha = crate::relpath::hex(&<sha2::Sha256 as sha2::Digest>::digest(LEDGER_BLOB));
    std::fs::write(blobs.join(&sha), LEDGER_BLOB).expect("write a blob");
    let text = replace(data, b"$ROOT", root.as_os_str().as_encoded_bytes());
    std::fs::write(&ledger, text).expect("write the ledger");
    taken_whole(&crate::import::check(&root, &HideRules::defaults()))
}

fn replace(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut rest = data;
    while let Some(i) = rest.windows(from.len()).position(|w| w == from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// What git and the sync directory give a sync or an export: a commit
/// object's trailers (`cat-file commit`), `push --porcelain`'s verdict,
/// `for-each-ref`'s list of the replicas' refs, a count, `remotes.json`
/// (saved again, it reads back the same) and `REPLICA`. All read the
/// same bytes.
pub fn sync_git(data: &[u8]) -> bool {
    let mut taken = crate::export::git::tip_of_commit(data).is_some()
        | crate::sync::push_rejected(data, "refs/heads/skillfs/0123")
        | crate::sync::parse_count(data).is_some();
    let refs = crate::sync::remote_refs(data, "refs/remotes/origin/", "0123");
    taken |= refs.iter().any(|(id, r)| id != r);
    if let Some(id) = crate::sync::parse_replica(data) {
        assert_eq!(crate::sync::parse_replica(id.as_bytes()), Some(id));
        taken = true;
    }
    if let Ok(r) = crate::sync::Remotes::parse(data) {
        let text = serde_json::to_vec_pretty(&r).expect("remotes serialize");
        let back = crate::sync::Remotes::parse(&text).expect("remotes saved read back");
        assert_eq!(back.remotes, r.remotes);
        taken = true;
    }
    taken
}
