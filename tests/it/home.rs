//! A mount over the agent's home (`skillfs mount HOME --versioned skills`):
//! `skills/` versioned as ever, the rest of the home plain and written in
//! place, an entry renamed between the two as one rename (the agent's
//! batch rollback parks a skill in `HOME/.skill-rollback-asides`), SQLite
//! in WAL mode beside it, and a store of a skills-only mount carried over.

use crate::common;

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

/// A park out of the versioned root names its place as `../<path>` in
/// the journal: every reader takes that record and the ones after it, the
/// next mount's too (a reader that refused it took the rest of the journal
/// for a torn tail).
#[test]
fn a_park_into_the_home_is_read_back_by_every_reader() {
    let mut m = home_mount("park-read", |home| {
        fs::create_dir_all(home.join("skills/cat/s")).unwrap();
        fs::write(home.join("skills/cat/s/SKILL.md"), "skill").unwrap();
    });
    let home = m.mount_point();
    fs::rename(m.path("cat/s"), home.join("aside")).unwrap();
    fs::write(m.path("cat/after.md"), "after").unwrap();
    let expect = |m: &Mount| {
        let log = m.log();
        let park = log
            .iter()
            .find(|r| r["op"] == "park")
            .expect("the park is read");
        assert_eq!(park["path"], "cat/s");
        assert_eq!(park["hidden"], "../aside");
        assert!(
            log.iter()
                .any(|r| r["op"] == "write" && r["path"] == "cat/after.md"),
            "{log:?}"
        );
    };
    expect(&m);
    m.umount();
    let root = m.root().display().to_string();
    let out = skillfs(&["verify", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    m.remount();
    expect(&m);
    assert_eq!(
        fs::read(m.path(".history/latest/cat/after.md")).unwrap(),
        b"after"
    );
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
    common::assert_enoent(m.path("research/arxiv"));
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
        .arg(home.join("sqlite-home.db"))
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
    // The move is told on the terminal of the background mount.
    let home = s.mount_point();
    let h = home.to_str().unwrap();
    let out = skillfs(&["mount", h, "--versioned", "skills"]);
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("skillfs: warning: moved the store"), "{err}");
    mount(&["umount", h]);
    let m = Mount::over(s, Vec::new());
    common::assert_enoent(&old_store);
    common::assert_enoent(m.mount_point().join(".skillfs"));
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
    // `skills/` (a shell's completion) must not mount with skills/ served
    // as a plain directory, unversioned.
    for bad in ["a/b", "..", "/abs", "skills/", "."] {
        let out = skillfs(&["mount", h, "--versioned", bad]);
        assert_refused(&out, 2, &["--versioned", "one directory name"]);
    }
    fs::write(home.join("file"), "x").unwrap();
    let out = skillfs(&["mount", h, "--versioned", "file"]);
    assert_refused(&out, 3, &["file", "not a directory"]);
    std::os::unix::fs::symlink(&s.dir, home.join("link")).unwrap();
    let out = skillfs(&["mount", h, "--versioned", "link"]);
    assert_refused(&out, 3, &["link", "not a directory"]);
    common::assert_enoent(s.dir.join(".skillfs"));
    assert_eq!(fs::read(home.join("file")).unwrap(), b"x");
}

/// A command given the home instead of its skills directory works on the
/// skills directory: a restore never writes (or removes) in the home.
#[test]
fn commands_given_the_home_mean_its_skills() {
    let m = home_mount("home-root", |home| {
        fs::create_dir_all(home.join("sessions")).unwrap();
        fs::write(home.join("sessions/1.json"), "session").unwrap();
    });
    let home = m.mount_point();
    fs::create_dir_all(m.path("sessions")).unwrap();
    fs::write(m.path("sessions/SKILL.md"), "v1").unwrap();
    fs::write(m.path("sessions/SKILL.md"), "v2").unwrap();
    let h = home.to_str().unwrap();
    let by_home = skillfs(&["log", "--json", "--root", h]);
    assert!(by_home.status.success(), "{}", describe(&by_home));
    let by_skills = skillfs(&["log", "--json", "--root", m.root().to_str().unwrap()]);
    assert_eq!(by_home.stdout, by_skills.stdout);
    let v1 = m
        .log()
        .iter()
        .find(|r| r["path"] == "sessions/SKILL.md" && r["op"] == "write")
        .map(|r| r["seq"].as_u64().unwrap().to_string())
        .unwrap();
    let out = skillfs(&["restore", &v1, "sessions", "--root", h]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(fs::read(m.path("sessions/SKILL.md")).unwrap(), b"v1");
    assert_eq!(fs::read(home.join("sessions/1.json")).unwrap(), b"session");
    common::assert_enoent(home.join("sessions/SKILL.md"));
    let out = skillfs(&["status", "--root", h]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("root:      {}", m.root().display())),
        "{text}"
    );
}

/// `.history` is a plain name outside skills/: read, listed, made.
#[test]
fn history_is_a_plain_name_in_the_home() {
    let m = home_mount("home-history", |home| {
        fs::write(home.join(".history"), "shell history").unwrap();
    });
    let home = m.mount_point();
    assert_eq!(fs::read(home.join(".history")).unwrap(), b"shell history");
    assert!(common::names(&home).contains(&".history".to_string()));
    fs::create_dir(home.join("sessions")).unwrap();
    fs::write(home.join("sessions/.history"), "x").unwrap();
    assert_eq!(fs::read(home.join("sessions/.history")).unwrap(), b"x");
    fs::rename(home.join("sessions/.history"), home.join("sessions/h2")).unwrap();
    fs::remove_file(home.join(".history")).unwrap();
    // Inside skills/ it is still the history.
    assert!(fs::metadata(m.path(".history")).unwrap().is_dir());
    assert!(fs::write(m.path(".history"), "x").is_err());
}

/// A directory moved out of skills/ takes its hidden entries along (no
/// rule hides anything in the home), across a remount, and back in they
/// are hidden again.
#[test]
fn hidden_entries_come_along_out_of_skills() {
    let mut m = home_mount("home-hidden", |home| {
        fs::create_dir_all(home.join("skills/cat/s/old.bak")).unwrap();
        fs::write(home.join("skills/cat/s/SKILL.md"), "s").unwrap();
    });
    let home = m.mount_point();
    // Made while mounted: attached in the store, unlisted.
    fs::create_dir(m.path("cat/keep.bak")).unwrap();
    fs::write(m.path("cat/keep.bak/data"), "precious").unwrap();
    assert_eq!(common::names(&m.path("cat")), ["s"]);
    fs::rename(m.path("cat"), home.join("cat")).unwrap();
    let mut names = common::names(&home.join("cat"));
    names.sort();
    assert_eq!(names, ["keep.bak", "s"]);
    assert_eq!(
        fs::read(home.join("cat/keep.bak/data")).unwrap(),
        b"precious"
    );
    m.umount();
    assert_eq!(
        fs::read(home.join("cat/keep.bak/data")).unwrap(),
        b"precious"
    );
    m.remount();
    assert_eq!(
        fs::read(home.join("cat/keep.bak/data")).unwrap(),
        b"precious"
    );
    fs::rename(home.join("cat"), m.path("cat")).unwrap();
    assert_eq!(common::names(&m.path("cat")), ["s"]);
    assert_eq!(fs::read(m.path("cat/keep.bak/data")).unwrap(), b"precious");
    // rm -rf of a moved-out directory removes what it shows, nothing else.
    fs::rename(m.path("cat"), home.join("gone")).unwrap();
    fs::remove_dir_all(home.join("gone")).unwrap();
    common::assert_enoent(home.join("gone"));
}

/// Hard links in the home behave as in skills/: one made before the mount
/// is split at the first write of one name (the other may be versioned),
/// and none can be made through the mount.
#[test]
fn hard_links_in_the_home_are_split_not_shared() {
    let m = home_mount("home-links", |home| {
        fs::create_dir(home.join("data")).unwrap();
        fs::write(home.join("data/a"), "orig").unwrap();
        fs::hard_link(home.join("data/a"), home.join("data/b")).unwrap();
        fs::create_dir_all(home.join("skills/s")).unwrap();
        fs::write(home.join("skills/s/v.md"), "versioned").unwrap();
        fs::hard_link(home.join("skills/s/v.md"), home.join("alias.md")).unwrap();
    });
    let home = m.mount_point();
    fs::write(home.join("data/a"), "new").unwrap();
    assert_eq!(fs::read(home.join("data/b")).unwrap(), b"orig");
    // The home's name of a versioned file: its write never reaches it.
    fs::write(home.join("alias.md"), "changed in the home").unwrap();
    assert_eq!(fs::read(m.path("s/v.md")).unwrap(), b"versioned");
    for (from, to) in [("data/a", "data/c"), ("data/a", "skills/x")] {
        let err = fs::hard_link(home.join(from), home.join(to)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }
}

/// A file of the home opened directly (passthrough) and renamed into
/// skills/ while open: a truncate by path keeps its inode (no swap that the
/// kernel's backing file would miss), its writes land in it and in no other
/// file, what it held before is kept, and the history ends as the file.
#[test]
fn a_direct_writer_moved_into_skills_keeps_its_file() {
    use std::os::unix::fs::FileExt;
    let m = home_mount("home-direct", |home| {
        fs::create_dir_all(home.join("skills/s")).unwrap();
        for i in 0..20 {
            fs::write(home.join(format!("skills/s/f{i}.md")), format!("f{i}")).unwrap();
        }
        fs::write(home.join("notes.md"), "before").unwrap();
    });
    let home = m.mount_point();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(home.join("notes.md"))
        .unwrap();
    f.write_all_at(b"written directly", 0).unwrap();
    fs::rename(home.join("notes.md"), m.path("s/notes.md")).unwrap();
    f.write_all_at(b"precious", 0).unwrap();
    // Truncated by path by another process: what was there is kept.
    let t = fs::OpenOptions::new()
        .write(true)
        .open(m.path("s/notes.md"))
        .unwrap();
    t.set_len(0).unwrap();
    drop(t);
    for i in 0..20 {
        fs::write(m.path(&format!("s/f{i}.md")), format!("clean {i}")).unwrap();
    }
    f.write_all_at(b"after the truncate", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    for i in 0..20 {
        let got = fs::read_to_string(m.path(&format!("s/f{i}.md"))).unwrap();
        assert_eq!(got, format!("clean {i}"), "a write landed in another file");
    }
    assert_eq!(
        fs::read(m.path("s/notes.md")).unwrap(),
        b"after the truncate"
    );
    let latest = m.path(".history/latest/s/notes.md");
    assert_eq!(fs::read(latest).unwrap(), b"after the truncate");
    let kept = fs::read_dir(m.path(".history"))
        .unwrap()
        .filter_map(|e| fs::read(e.unwrap().path().join("s/notes.md")).ok())
        .any(|b| b.starts_with(b"precious"));
    assert!(kept, "the content before the truncate is in history");
}

/// Opens of a home file replaced (or removed) while a direct handle holds
/// it join that handle's kind: no EIO (the kernel refuses a mix).
#[test]
fn a_replaced_home_file_still_opens() {
    let m = home_mount("home-replaced", |home| {
        fs::write(home.join("u"), "data\n").unwrap();
        fs::write(home.join("u.new"), "new\n").unwrap();
    });
    let home = m.mount_point();
    let held = fs::File::open(home.join("u")).unwrap();
    fs::rename(home.join("u.new"), home.join("u")).unwrap();
    let again = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&held));
    assert_eq!(fs::read(&again).unwrap(), b"data\n");
    assert_eq!(fs::read(home.join("u")).unwrap(), b"new\n");
    fs::remove_file(home.join("u")).unwrap();
    assert_eq!(fs::read(&again).unwrap(), b"data\n");
}

/// A direct writer's bytes in skills/ are kept before an unlink or a
/// rename over the file takes them (G1).
#[test]
fn direct_writes_are_kept_before_an_unlink() {
    use std::os::unix::fs::FileExt;
    let m = home_mount("home-direct-unlink", |home| {
        fs::create_dir_all(home.join("skills/s")).unwrap();
        fs::write(home.join("n"), "v1").unwrap();
        fs::write(home.join("o"), "w1").unwrap();
    });
    let home = m.mount_point();
    for (name, gone) in [("n", "unlink"), ("o", "rename")] {
        let f = fs::OpenOptions::new()
            .write(true)
            .open(home.join(name))
            .unwrap();
        fs::rename(home.join(name), m.path(&format!("s/{name}"))).unwrap();
        f.write_all_at(format!("{name} v2-precious").as_bytes(), 0)
            .unwrap();
        if gone == "unlink" {
            fs::remove_file(m.path(&format!("s/{name}"))).unwrap();
        } else {
            fs::write(m.path("s/other"), "other").unwrap();
            fs::rename(m.path("s/other"), m.path(&format!("s/{name}"))).unwrap();
        }
        drop(f);
        let want = format!("{name} v2-precious");
        let kept = fs::read_dir(m.path(".history"))
            .unwrap()
            .filter_map(|e| fs::read(e.unwrap().path().join(format!("s/{name}"))).ok())
            .any(|b| b == want.as_bytes());
        assert!(kept, "{want} is in history after the {gone}");
    }
}

/// Mounted over the home or over skills/ alone, one store keeps all of
/// skills/'s history; two stores of one root are refused, not merged.
#[test]
fn the_home_and_the_skills_mount_share_one_store() {
    let s = Scratch::home("home-switch");
    let skills = s.root();
    let home_store = s.store();
    let mut m = Mount::over(s, Vec::new());
    fs::write(m.path("a.md"), "home 1").unwrap();
    m.umount();
    let ok = |out: std::process::Output| assert!(out.status.success(), "{}", describe(&out));
    ok(skillfs(&["mount", skills.to_str().unwrap()]));
    common::assert_enoent(m.mount_point().join(".skillfs"));
    fs::write(skills.join("a.md"), "alone 2").unwrap();
    ok(skillfs(&["umount", skills.to_str().unwrap()]));
    m.remount();
    let writes: Vec<_> = m
        .ops_for("a.md")
        .into_iter()
        .filter(|o| o == "write")
        .collect();
    assert_eq!(
        writes.len(),
        2,
        "both mounts' versions: {:?}",
        m.ops_for("a.md")
    );
    m.umount();
    // A second store of the same root (made by hand): refused, untouched.
    let other = m.mount_point().join(".skillfs/skills");
    fs::create_dir(m.mount_point().join(".skillfs")).unwrap();
    common::copy_dir(&home_store, &other);
    let out = skillfs(&[
        "mount",
        m.mount_point().to_str().unwrap(),
        "--versioned",
        "skills",
    ]);
    assert_refused(&out, 4, &["two stores"]);
    assert!(other.join("journal").is_dir() && home_store.join("journal").is_dir());
}

/// A home that is the root of its own filesystem has no place for a store
/// (on its filesystem, outside the mount): refused before anything is made.
#[test]
fn a_home_that_is_a_filesystem_root_is_refused() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root to mount a tmpfs");
        return;
    }
    let s = Scratch::home("home-fsroot");
    let home = s.mount_point();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&home)
        .status()
        .unwrap();
    assert!(st.success());
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            common::lazy_unmount(&self.0);
        }
    }
    let _u = Unmount(home.clone());
    let out = skillfs(&["mount", home.to_str().unwrap(), "--versioned", "skills"]);
    assert_refused(&out, 4, &["root of its own filesystem", "skills"]);
    common::assert_enoent(home.join("skills"));
    common::assert_enoent(s.dir.join(".skillfs"));
}

/// Every refusal comes before anything is made: a mount inside another's
/// tree does not create its versioned directory through that mount.
#[test]
fn a_refused_home_mount_makes_nothing() {
    let m = home_mount("home-nested", |_| {});
    fs::create_dir(m.path("cat")).unwrap();
    let ids = m.log().len();
    let inner = m.path("cat");
    let out = skillfs(&["mount", inner.to_str().unwrap(), "--versioned", "new"]);
    assert_refused(&out, 3, &["inside the skillfs mount"]);
    common::assert_enoent(m.path("cat/new"));
    assert_eq!(m.log().len(), ids, "nothing journaled");
}
