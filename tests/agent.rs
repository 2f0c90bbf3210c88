//! The agent's own call sequences, replayed by Python against a real mount.

mod common;

use std::process::Command;

use common::{Mount, describe};

fn run_python(m: &Mount, script: &str) {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .arg(m.root())
        .env("SKILLFS_BIN", common::BIN)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{script} failed:\n{}", describe(&out));
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn agent_file_calls_through_the_mount() {
    let mut m = Mount::new("agent");
    run_python(&m, "agent_io.py");
    // What the agent wrote is plain files after unmounting.
    m.umount();
    let skill = std::fs::read_to_string(m.path("cat/alpha/SKILL.md")).unwrap();
    assert!(skill.contains("patched"), "{skill}");
}
