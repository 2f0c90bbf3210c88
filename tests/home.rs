//! A mount over the agent's home (`skillfs mount HOME --versioned skills`):
//! `skills/` versioned as ever, the rest of the home plain and written in
//! place, an entry renamed between the two as one rename (the agent's
//! batch rollback parks a skill in `HOME/.skill-rollback-asides`), SQLite
//! in WAL mode beside it, and a store of a skills-only mount carried over.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{Mount, Scratch, assert_refused, describe, skillfs};

fn home_mount(tag: &str, setup: impl FnOnce(&Path)) -> Mount {
    let s = Scratch::home(tag);
    setup(&s.mount_point());
    Mount::over(s, Vec::new())
}

fn python(script: &str, args: &[&Path], extra: &[&str]) -> std::process::Output {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    Command::new("python3")
        .arg(path)
        .args(args)
        .args(extra)
        .output()
        .expect("python3 runs")
}

/// Outside `skills/` the home is a plain directory: written in place (the
/// inode underneath is the one that was there), every name listed (no hide
/// rule), no `.history`, nothing journaled; inside, as ever.
#[test]
fn the_home_is_plain_and_skills_is_versioned() {
    let mut m = home_mount("plain", |home| {
        fs::write(home.join("config.yaml"), "model: a\n").unwrap();
    });
    let home = m.mount_point();
    let under = fs::metadata(home.join("config.yaml")).unwrap();
    fs::write(home.join("config.yaml"), "model: b\n").unwrap();
    let after = fs::metadata(home.join("config.yaml")).unwrap();
    assert_eq!(
        fs::read_to_string(home.join("config.yaml")).unwrap(),
        "model: b\n"
    );
    // Names every rule would hide inside skills/ are plain files here.
    for name in ["SKILL.md.bak", ".x.tmp"] {
        fs::write(home.join(name), name).unwrap();
    }
    for name in [
        "skill.bak",
        "notes.rollback-broken",
        ".skill-rollback-asides",
    ] {
        fs::create_dir(home.join(name)).unwrap();
    }
    fs::create_dir(home.join("logs")).unwrap();
    {
        use std::io::Write;
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(home.join("logs/agent.log"))
            .unwrap();
        for i in 0..100 {
            writeln!(log, "line {i}").unwrap();
        }
    }
    let mut names = common::names(&home);
    names.sort();
    assert_eq!(
        names,
        [
            ".skill-rollback-asides",
            ".x.tmp",
            "SKILL.md.bak",
            "config.yaml",
            "logs",
            "notes.rollback-broken",
            "skill.bak",
            "skills"
        ]
    );
    assert!(
        fs::metadata(home.join(".history")).is_err(),
        "no .history in the home"
    );
    assert!(fs::metadata(home.join("logs/.history")).is_err());
    // The mount's own device for both halves (the agent compares st_dev).
    let dev = fs::metadata(&home).unwrap().dev();
    assert_eq!(fs::metadata(m.root()).unwrap().dev(), dev);
    assert_eq!(fs::metadata(home.join("logs")).unwrap().dev(), dev);
    // skills/: versioned, with its rules.
    fs::create_dir_all(m.path("cat/a")).unwrap();
    fs::write(m.path("cat/a/SKILL.md"), "v1").unwrap();
    fs::create_dir(m.path("cat/a.bak")).unwrap();
    assert_eq!(common::names(&m.path("cat")), ["a"]);
    assert!(fs::metadata(m.path(".history")).is_ok());
    assert_eq!(m.ops_for("cat/a/SKILL.md"), ["create", "write"]);
    let logged: Vec<String> = m
        .log()
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_string())
        .collect();
    assert!(
        logged.iter().all(|p| p.starts_with("cat")),
        "only skills/ is journaled: {logged:?}"
    );
    // The store is outside everything the mount shows.
    assert!(!m.store().starts_with(&home), "{}", m.store().display());
    m.umount();
    assert_eq!(under.ino(), after.ino(), "the home is written in place");
    assert_eq!(
        fs::read_to_string(home.join("config.yaml")).unwrap(),
        "model: b\n"
    );
    assert_eq!(
        fs::read_to_string(home.join("logs/agent.log"))
            .unwrap()
            .lines()
            .count(),
        100
    );
    assert_eq!(fs::read(m.path("cat/a/SKILL.md")).unwrap(), b"v1");
}

/// The versioned directory is held like a mount point: it cannot be
/// removed, renamed or replaced through the mount.
#[test]
fn the_versioned_directory_stays_put() {
    let m = home_mount("pinned", |_| {});
    let home = m.mount_point();
    fs::create_dir(home.join("other")).unwrap();
    let busy = |r: std::io::Result<()>| {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EBUSY));
    };
    busy(fs::rename(m.root(), home.join("moved")));
    busy(fs::rename(home.join("other"), m.root()));
    busy(fs::remove_dir(m.root()));
    busy(common::renameat2(
        &home.join("other"),
        &m.root(),
        libc::RENAME_EXCHANGE,
    ));
    assert!(fs::metadata(m.path(".history")).is_ok());
}

/// Entries move between the home and skills/ by one rename each way: out
/// is a park (journaled; the content stays in history), in is an unpark
/// (every entry recorded).
#[test]
fn renames_across_the_boundary_are_parks_and_unparks() {
    let m = home_mount("across", |home| {
        fs::create_dir_all(home.join("skills/cat/s")).unwrap();
        fs::write(home.join("skills/cat/s/SKILL.md"), "skill").unwrap();
        fs::create_dir_all(home.join("incoming/t/refs")).unwrap();
        fs::write(home.join("incoming/t/SKILL.md"), "t").unwrap();
        fs::write(home.join("incoming/t/refs/r.md"), "r").unwrap();
    });
    let home = m.mount_point();
    let before = fs::metadata(m.path("cat/s/SKILL.md")).unwrap().ino();
    fs::rename(m.path("cat/s"), home.join("aside")).unwrap();
    assert_eq!(fs::read(home.join("aside/SKILL.md")).unwrap(), b"skill");
    assert_eq!(
        fs::metadata(home.join("aside/SKILL.md")).unwrap().ino(),
        before
    );
    assert_eq!(m.ops_for("cat/s").last().unwrap(), "park");
    // Written out there: in place, not versioned.
    fs::write(home.join("aside/SKILL.md"), "edited outside").unwrap();
    assert!(!m.ops_for("cat/s/SKILL.md").iter().any(|o| o == "write"));
    // And in again, with what it holds now.
    fs::rename(home.join("aside"), m.path("cat/s")).unwrap();
    fs::rename(home.join("incoming/t"), m.path("cat/t")).unwrap();
    assert_eq!(m.ops_for("cat/s").last().unwrap(), "unpark");
    assert_eq!(m.ops_for("cat/t/refs/r.md"), ["unpark"]);
    let latest = m.path(".history/latest/cat/s/SKILL.md");
    assert_eq!(fs::read(latest).unwrap(), b"edited outside");
    assert_eq!(
        fs::read(m.path(".history/latest/cat/t/refs/r.md")).unwrap(),
        b"r"
    );
    // A file alone, both ways.
    fs::write(home.join("note.md"), "n").unwrap();
    fs::rename(home.join("note.md"), m.path("cat/note.md")).unwrap();
    fs::rename(m.path("cat/note.md"), home.join("note2.md")).unwrap();
    assert_eq!(m.ops_for("cat/note.md"), ["unpark", "park"]);
}

fn rollback_home(home: &Path) {
    fs::create_dir_all(home.join("skills/research/arxiv")).unwrap();
    fs::create_dir_all(home.join("skills/research/other")).unwrap();
    fs::write(
        home.join("skills/research/arxiv/SKILL.md"),
        "---\nname: arxiv\n---\noriginal\n",
    )
    .unwrap();
    fs::write(home.join("skills/research/other/SKILL.md"), "other").unwrap();
}

/// The agent's batch rollback, whole: park by rename into
/// `.skill-rollback-asides` (found on the mount's own device), copy-back,
/// removal of the park; the loader sees each skill once after every step.
#[test]
fn the_agents_batch_rollback_parks_outside_skills() {
    let m = home_mount("rollback", rollback_home);
    let out = python("batch_rollback.py", &[&m.mount_point()], &["full"]);
    assert!(out.status.success(), "{}", describe(&out));
    let ops = m.ops_for("research/arxiv");
    assert!(ops.contains(&"park".to_string()), "{ops:?}");
}

/// Killed between the park and the copy-back: the loader sees nothing of
/// the skill, and it is recoverable both from the park and from
/// `.history` (its state before the batch, and the half-applied one).
#[test]
fn a_rollback_killed_after_the_park_is_recoverable() {
    let m = home_mount("rollback-kill", rollback_home);
    let home = m.mount_point();
    let script = format!(
        "{}/tests/python/batch_rollback.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut child = Command::new("python3")
        .arg(script)
        .arg(&home)
        .arg("park-and-wait")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("parked "), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();
    let aside = Path::new(line.trim().strip_prefix("parked ").unwrap()).to_path_buf();
    assert!(aside.starts_with(home.join(".skill-rollback-asides")));
    assert!(!m.path("research/arxiv").exists());
    // From history: the original, one change before the batch began.
    let log = m.log();
    let park = log
        .iter()
        .find(|r| r["op"] == "park" && r["path"] == "research/arxiv")
        .expect("the park is journaled");
    let park_id = park["seq"].as_u64().unwrap();
    let before_park = m.path(&format!(".history/{}/research/arxiv/SKILL.md", park_id - 1));
    assert!(
        fs::read_to_string(&before_park)
            .unwrap()
            .ends_with("half-applied batch\n")
    );
    let first_write = log
        .iter()
        .find(|r| r["path"] == "research/arxiv/SKILL.md" && r["op"] != "scan")
        .map(|r| r["seq"].as_u64().unwrap())
        .expect("the batch's write is journaled");
    let original = m.path(&format!(
        ".history/{}/research/arxiv/SKILL.md",
        first_write - 1
    ));
    assert_eq!(
        fs::read_to_string(original).unwrap(),
        "---\nname: arxiv\n---\noriginal\n"
    );
    // From the park: a plain copy puts it back, and the loader sees it once.
    let st = Command::new("cp")
        .arg("-a")
        .arg(&aside)
        .arg(m.path("research/arxiv"))
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        fs::read_to_string(m.path("research/arxiv/SKILL.md"))
            .unwrap()
            .ends_with("half-applied batch\n")
    );
    fs::remove_dir_all(&aside).unwrap();
}

/// SQLite through the home as on ext4: WAL with its shared mapping, POSIX
/// locks between two processes, a writer killed mid-transaction, the
/// database reopened intact.
#[test]
fn sqlite_in_the_home() {
    let mut m = home_mount("sqlite", |_| {});
    let home = m.mount_point();
    let out = python("sqlite_home.py", &[&home], &[]);
    assert!(out.status.success(), "{}", describe(&out));
    m.umount();
    let check = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
             print(c.execute('pragma integrity_check').fetchone()[0], \
             c.execute('select count(*) from t').fetchone()[0])",
        )
        .arg(home.join("state.db"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "ok 301");
}

/// A store kept by a skills-only mount moves to the home's default place
/// when the home is mounted (it would be inside the mount), every id kept.
#[test]
fn a_skills_only_store_is_carried_over() {
    let s = Scratch::home("carry");
    let skills = s.root();
    let old_store = s.mount_point().join(".skillfs").join("skills");
    fs::write(skills.join("a.md"), "one").unwrap();
    let mount = |args: &[&str]| {
        let out = skillfs(args);
        assert!(out.status.success(), "{}", describe(&out));
    };
    mount(&["mount", skills.to_str().unwrap()]);
    fs::write(skills.join("a.md"), "two").unwrap();
    let out = skillfs(&["log", "--json", "--root", skills.to_str().unwrap()]);
    let before = String::from_utf8(out.stdout).unwrap();
    mount(&["umount", skills.to_str().unwrap()]);
    assert!(old_store.join("journal").is_dir());
    let m = Mount::over(s, Vec::new());
    assert!(!old_store.exists(), "the old store is moved, not copied");
    assert!(!m.mount_point().join(".skillfs").exists());
    assert!(m.store().join("journal").is_dir());
    let after: Vec<String> = m.log().iter().map(|r| r.to_string()).collect();
    let before: Vec<serde_json::Value> = before
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        after[..before.len()],
        before.iter().map(|r| r.to_string()).collect::<Vec<_>>()[..],
        "every id kept"
    );
    let first = before[0]["seq"].as_u64().unwrap();
    let v1 = m.path(&format!(".history/{first}/a.md"));
    assert_eq!(fs::read(v1).unwrap(), b"one");
}

#[test]
fn bad_versioned_names_are_refused() {
    let s = Scratch::home("bad-versioned");
    let home = s.mount_point();
    let h = home.to_str().unwrap();
    for bad in ["a/b", "..", "/abs"] {
        let out = skillfs(&["mount", h, "--versioned", bad]);
        assert_refused(&out, 2, &["--versioned", "one directory name"]);
    }
    fs::write(home.join("file"), "x").unwrap();
    let out = skillfs(&["mount", h, "--versioned", "file"]);
    assert_refused(&out, 3, &["file", "not a directory"]);
    std::os::unix::fs::symlink(&s.dir, home.join("link")).unwrap();
    let out = skillfs(&["mount", h, "--versioned", "link"]);
    assert_refused(&out, 3, &["link", "not a directory"]);
    assert!(!s.dir.join(".skillfs").exists(), "no store may be created");
    assert_eq!(fs::read(home.join("file")).unwrap(), b"x");
}
