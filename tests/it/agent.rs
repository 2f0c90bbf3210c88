//! The agent's own call sequences, replayed by Python against a real mount.

use crate::common;

use std::process::Command;

use common::{Mount, agent_python, describe};

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

/// The real agent's own code through a mount over its home: the bundled
/// skill sync (and an update of one), skill_manage, a curator snapshot and
/// rollback, its loader, and its session database in the home.
#[test]
fn the_real_agent_through_a_home_mount() {
    let Some(py) = agent_python() else { return };
    let s = common::Scratch::home("real-agent");
    let bundled = s.dir.join("bundled");
    for (dir, name) in [("research/arxiv", "arxiv"), ("productivity/todo", "todo")] {
        std::fs::create_dir_all(bundled.join(dir)).unwrap();
        std::fs::write(
            bundled.join(dir).join("SKILL.md"),
            format!("---\nname: {name}\ndescription: {name} skill\n---\n# {name}\n"),
        )
        .unwrap();
    }
    let mut m = Mount::over(s, Vec::new());
    let home = m.mount_point();
    let out = Command::new(&py)
        .arg(format!(
            "{}/tests/python/real_agent.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .current_dir(&m.scratch.dir)
        .env("HERMES_HOME", &home)
        .env("HERMES_BUNDLED_SKILLS", &bundled)
        .output()
        .expect("the agent's python runs");
    assert!(
        out.status.success(),
        "real_agent.py failed:\n{}",
        describe(&out)
    );
    // Its skills were versioned; its sessions and logs were not.
    let log = m.log();
    assert!(
        log.iter()
            .any(|r| r["path"] == "custom/my-notes/SKILL.md" && r["op"] != "scan")
    );
    assert!(
        log.iter()
            .all(|r| !r["path"].as_str().unwrap().contains("state.db"))
    );
    let history = std::fs::read_dir(m.path(".history")).unwrap().count();
    assert!(history > 10, "{history} entries in .history");
    m.umount();
    assert!(
        home.join("state.db").is_file(),
        "the sessions live in the home"
    );
    assert!(home.join("skills/research/arxiv/SKILL.md").is_file());
    common::assert_enoent(home.join("skills/custom/my-notes"));
}

/// The real agent's delete of a category's last skill takes the category
/// with it; `skillfs restore ID social/greet`, the path `log` shows, brings
/// back both (references/, scripts/, modes), and one `undo` takes both out.
#[test]
fn the_real_agents_delete_of_a_categorys_last_skill_is_restored_and_undone() {
    use std::os::unix::fs::PermissionsExt;
    let Some(py) = agent_python() else { return };
    let m = Mount::over(common::Scratch::home("agent-delete"), Vec::new());
    let agent = |phase: &str| {
        let out = Command::new(&py)
            .arg(format!(
                "{}/tests/python/agent_delete.py",
                env!("CARGO_MANIFEST_DIR")
            ))
            .arg(phase)
            .current_dir(&m.scratch.dir)
            .env("HERMES_HOME", m.mount_point())
            .output()
            .expect("the agent's python runs");
        assert!(out.status.success(), "{phase} failed:\n{}", describe(&out));
    };
    agent("create");
    let skill = m.path("social/greet");
    let mode = |p: &str| {
        std::fs::symlink_metadata(skill.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    std::fs::set_permissions(
        skill.join("scripts/run.sh"),
        PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(skill.join("references"), PermissionsExt::from_mode(0o700)).unwrap();
    let good = m.log().last().unwrap()["seq"].as_u64().unwrap().to_string();
    agent("delete");
    common::assert_enoent(m.path("social"));

    let home = m.mount_point().display().to_string();
    let out = common::skillfs(&["restore", &good, "social/greet", "--root", &home]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        std::fs::read(skill.join("scripts/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        std::fs::read(skill.join("references/a.md")).unwrap(),
        b"ref\n"
    );
    assert!(
        std::fs::read_to_string(skill.join("SKILL.md"))
            .unwrap()
            .contains("name: greet")
    );
    assert_eq!((mode("scripts/run.sh"), mode("references")), (0o755, 0o700));

    let out = common::skillfs(&["undo", "--root", &home]);
    assert!(out.status.success(), "{}", describe(&out));
    common::assert_enoent(m.path("social"));
}
