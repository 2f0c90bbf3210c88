//! The agent's backup, park and rollback sequences (issue: hide rules),
//! replayed by `tests/python/agent_sequences.py` against real mounts, with
//! the loader invariant checked after every step; then each again with the
//! daemon SIGKILLed after a random step and remounted.

use crate::common;

use std::process::Command;

use common::{Mount, describe};

const SCENARIOS: &[&str] = &[
    "bundled_update",
    "failed_update",
    "writer_killed_after_rename",
    "stale_bak",
    "single_patch",
    "batch_rollback",
    "batch_rollback_writer_killed",
    "curator",
    "archive",
];

fn run(scenario: &str, kill_at: Option<u64>) {
    let m = Mount::new(&format!("seq-{scenario}"));
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/agent_sequences.py"
    );
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(m.root()).arg(scenario);
    if let Some(k) = kill_at {
        cmd.arg("--kill-at").arg(k.to_string());
    }
    let out = cmd
        .env("SKILLFS_BIN", common::BIN)
        .env("SKILLFS_STORE", m.store())
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{scenario} (kill at {kill_at:?}) failed:\n{}",
        describe(&out)
    );
}

#[test]
fn agent_sequences_keep_every_skill_loadable_once() {
    for s in SCENARIOS {
        run(s, None);
    }
}

#[test]
fn agent_sequences_survive_a_daemon_sigkill_at_a_random_step() {
    let seed = common::seed("SKILLFS_SEQ_SEED");
    for (i, s) in SCENARIOS.iter().enumerate() {
        let k = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(i as u64 * 1442695040888963407)
            >> 33;
        run(s, Some(k));
    }
}
