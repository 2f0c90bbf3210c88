//! Several processes at once on one shared subtree (`tests/python/stress.py`,
//! a stress of our own: fsstress ships only in xfstests and LTP), then an
//! unmount, `verify --full`, a mount again and the tree read back whole.
//! `SKILLFS_STRESS_SECONDS` (default 6) and `SKILLFS_STRESS_PROCS` (default
//! 4) size it, `SKILLFS_STRESS_SEED` replays one.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{Mount, describe, skillfs};

fn stress_py(args: &[&str]) -> serde_json::Value {
    let script = format!("{}/tests/python/stress.py", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "stress.py {args:?} failed:\n{}",
        describe(&out)
    );
    serde_json::from_slice(&out.stdout).expect("stress.py prints JSON")
}

fn tree(dir: &Path) -> serde_json::Value {
    stress_py(&["tree", dir.to_str().unwrap()])["entries"].clone()
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

#[test]
fn processes_at_once_on_a_shared_tree_then_a_remount_reads_it_whole() {
    let seed = common::seed("SKILLFS_STRESS_SEED") % 1_000_000;
    let seconds = env_or("SKILLFS_STRESS_SECONDS", "6");
    let procs = env_or("SKILLFS_STRESS_PROCS", "4");
    let mut m = Mount::new("stress");
    let root = m.root();
    let report = stress_py(&[
        "run",
        root.to_str().unwrap(),
        "--procs",
        &procs,
        "--seconds",
        &seconds,
        "--seed",
        &seed.to_string(),
    ]);
    eprintln!("{report}");
    let done = &report["done"];
    assert!(
        report["ops"].as_u64().unwrap() > 200,
        "too few operations: {report}"
    );
    for kind in [
        "write",
        "atomic",
        "mmap_write",
        "rename",
        "unlink",
        "truncate",
    ] {
        assert!(
            done[kind].as_u64().unwrap_or(0) > 0,
            "no {kind} went through: {report}"
        );
    }

    let live = tree(&root);
    assert!(
        live.as_object().unwrap().len() > 10,
        "the tree is nearly empty: {live}"
    );
    assert_eq!(
        tree(&root.join(".history/latest")),
        live,
        ".history/latest is not the live tree"
    );
    m.umount();
    let out = skillfs(&["verify", "--full", "--root", root.to_str().unwrap()]);
    assert!(out.status.success(), "verify --full:\n{}", describe(&out));
    m.remount();
    assert_eq!(
        tree(&root),
        live,
        "the tree read after a remount is not the one left"
    );
    m.umount();
}
