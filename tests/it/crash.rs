//! Crash test (G2): a writer rewrites files in a loop while the daemon is
//! killed with SIGKILL at a random moment; then the mount is detached and
//! remounted. Each round checks what the previous crash left: every file
//! holds one complete version (its self-check passes), the store opens
//! cleanly, and every version whose fsync returned is in the journal with
//! its blob intact.
//!
//! Rounds: `SKILLFS_CRASH_ROUNDS` (default 50). Seed: `SKILLFS_CRASH_SEED`
//! (default: the time), printed so a failure can be replayed.

use crate::common;

use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, Rng, sha256_hex};

/// One complete version: empty (just created) or body + `END <sha(body)>`.
fn check_complete(path: &Path) {
    let data = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    if data.is_empty() {
        return;
    }
    let text = &data[..];
    let end = text
        .windows(4)
        .rposition(|w| w == b"END ")
        .unwrap_or_else(|| {
            panic!(
                "{} has no footer: torn ({} bytes)",
                path.display(),
                data.len()
            )
        });
    let body = &text[..end];
    let footer = std::str::from_utf8(&text[end + 4..]).expect("footer is text");
    assert_eq!(
        footer.trim_end(),
        sha256_hex(body),
        "{} is torn: body does not match its footer",
        path.display()
    );
    assert!(footer.ends_with('\n'), "{} is cut short", path.display());
}

#[test]
fn sigkill_the_daemon_at_random_moments() {
    let rounds: u64 = std::env::var("SKILLFS_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let seed = common::seed("SKILLFS_CRASH_SEED");
    eprintln!("crash test: {rounds} rounds");
    let mut rng = Rng(seed);
    let mut m = Mount::new("crash");
    let acklog = m.scratch.dir.join("acked.txt");
    fs::write(&acklog, b"").unwrap();
    let writer = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/crash_writer.py");
    let mut acked_total = 0usize;
    for round in 0..rounds {
        let mut child = Command::new("python3")
            .arg(writer)
            .arg(m.root())
            .arg(&acklog)
            .arg(round.to_string())
            .arg(rng.next().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Each round kills the daemon only after an fsync of its own was
        // acknowledged, at a random moment after that.
        let acks_before = fs::read_to_string(&acklog).unwrap().lines().count();
        let t = Instant::now();
        while fs::read_to_string(&acklog).unwrap().lines().count() == acks_before {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "round {round}: no fsync acknowledged in 20 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
        m.kill_daemon();
        let t = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("round {round}: writer hung after the daemon died");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(
            status.success(),
            "round {round}: writer failed (an errno other than the daemon's death?): {status:?}\n{err}"
        );
        m.detach();
        m.remount();

        // What the crash left: every file one complete version.
        for e in fs::read_dir(m.root()).unwrap() {
            check_complete(&e.unwrap().path());
        }
        // Every acknowledged fsync is in the journal, its blob intact.
        let log = m.log();
        let blobs: HashSet<String> = log
            .iter()
            .filter_map(|r| r["state"]["blob"].as_str().map(str::to_string))
            .collect();
        let acked = fs::read_to_string(&acklog).unwrap();
        let last_round = round + 1 == rounds;
        for (i, line) in acked.lines().enumerate() {
            let (file, sha) = line.split_once(' ').unwrap();
            assert!(
                blobs.contains(sha),
                "round {round}: fsync of {file} ({sha}) was acknowledged but is not in the journal"
            );
            // This round's blobs are read back now (earlier rounds' were in
            // theirs, and a store only appends); all of them at the end.
            if i >= acks_before || last_round {
                assert_eq!(sha256_hex(&m.blob(sha)), sha, "blob {sha} is damaged");
            }
        }
        let acked_now = acked.lines().count();
        assert!(
            acked_now > acks_before,
            "round {round} checked no fsync of its own"
        );
        acked_total = acked_now;
        // Ids stay gap-free across every crash.
        for (i, r) in log.iter().enumerate() {
            assert_eq!(r["seq"], (i + 1) as u64, "round {round}: gap in ids");
        }
    }
    eprintln!("crash test: {acked_total} acknowledged fsyncs checked over {rounds} rounds");
    assert!(acked_total > 0, "the writer never got an fsync through");
}
