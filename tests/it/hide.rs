//! Hide rules through a real mount (contract G3): hidden entries are absent
//! from listings, reachable by exact name, stored outside ROOT, carried by
//! renames, orphaned by removals, swept when old, and not versioned.

use crate::common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::{Mount, Scratch, describe, names, skillfs};

fn skill(root: &Path, rel: &str, name: &str) {
    fs::create_dir_all(root.join(rel)).unwrap();
    fs::write(
        root.join(rel).join("SKILL.md"),
        format!("---\nname: {name}\n---\n"),
    )
    .unwrap();
}

#[test]
fn hidden_names_are_unlisted_reachable_and_outside_root() {
    let mut m = Mount::new("hidden");
    skill(&m.root(), "cat/foo", "foo");
    fs::rename(m.path("cat/foo"), m.path("cat/foo.bak")).unwrap();
    fs::create_dir(m.path(".locks")).unwrap();
    fs::write(m.path(".locks/abc.lock"), "").unwrap();
    fs::write(m.path("cat/.SKILL.md.tmp.1a2b3c4d"), "temp").unwrap();
    fs::create_dir(m.path(".curator_backups")).unwrap();
    // Names that must stay visible, and look-alikes that are user data.
    fs::write(m.path(".usage.json"), "{}").unwrap();
    fs::create_dir(m.path(".archive")).unwrap();
    fs::write(m.path("yarn.lock"), "").unwrap();
    skill(&m.root(), "cat/py", "py");
    fs::create_dir(m.path("cat/py/python3.bak")).unwrap(); // inside a skill package
    fs::write(m.path("cat/notes.bak"), "a file, not a directory").unwrap();

    assert_eq!(
        names(&m.root()),
        [".archive", ".usage.json", "cat", "yarn.lock"]
    );
    assert_eq!(names(&m.path("cat")), ["notes.bak", "py"]);
    assert_eq!(names(&m.path("cat/py")), ["SKILL.md", "python3.bak"]);
    // Reachable by exact name.
    assert!(m.path("cat/foo.bak/SKILL.md").is_file());
    assert_eq!(names(&m.path(".locks")), ["abc.lock"]);
    assert_eq!(
        fs::read(m.path("cat/.SKILL.md.tmp.1a2b3c4d")).unwrap(),
        b"temp"
    );
    // Physically outside the root.
    m.umount();
    assert_eq!(
        names(&m.root()),
        [".archive", ".usage.json", "cat", "yarn.lock"]
    );
    assert_eq!(names(&m.path("cat")), ["notes.bak", "py"]);
    m.remount();
    assert!(
        m.path("cat/foo.bak/SKILL.md").is_file(),
        "parks survive a remount"
    );
}

#[test]
fn listing_inside_a_hidden_directory_is_unfiltered() {
    let m = Mount::new("unfiltered");
    skill(&m.root(), "cat/foo", "foo");
    fs::create_dir(m.path("cat/foo.bak")).unwrap();
    fs::create_dir(m.path(".curator_backups")).unwrap();
    fs::create_dir(m.path(".curator_backups/.rollback-staging-1")).unwrap();
    fs::write(m.path(".curator_backups/.rollback-staging-1/.x.tmp"), "t").unwrap();
    assert_eq!(names(&m.path(".curator_backups")), [".rollback-staging-1"]);
    assert_eq!(
        names(&m.path(".curator_backups/.rollback-staging-1")),
        [".x.tmp"]
    );
    // A visible directory with a hidden child, moved into a hidden one:
    // its listing there shows the hidden child too.
    fs::rename(
        m.path("cat"),
        m.path(".curator_backups/.rollback-staging-1/cat"),
    )
    .unwrap();
    assert_eq!(
        names(&m.path(".curator_backups/.rollback-staging-1/cat")),
        ["foo", "foo.bak"]
    );
    assert!(names(&m.root()).is_empty());
}

#[test]
fn renaming_a_directory_carries_its_hidden_children() {
    let m = Mount::new("carry");
    skill(&m.root(), "cat/foo", "foo");
    fs::create_dir(m.path("cat/foo.rollback-broken")).unwrap();
    fs::write(m.path("cat/foo.rollback-broken/keep.md"), "parked").unwrap();
    fs::rename(m.path("cat"), m.path("cat2")).unwrap();
    assert_eq!(
        fs::read(m.path("cat2/foo.rollback-broken/keep.md")).unwrap(),
        b"parked"
    );
    common::assert_enoent(m.path("cat/foo.rollback-broken"));
    assert_eq!(names(&m.path("cat2")), ["foo"]);
}

#[test]
fn removing_a_directory_whose_children_are_hidden_orphans_them() {
    let m = Mount::new("orphan");
    skill(&m.root(), "cat/foo", "foo");
    fs::create_dir(m.path("cat/foo/x.tmp.d")).unwrap(); // visible: a directory
    fs::write(m.path("cat/foo/.SKILL.md.tmp.abcdefgh"), "temp").unwrap();
    // shutil.rmtree lists (no temp file), removes what it sees, then rmdir.
    let out = Command::new("python3")
        .arg("-c")
        .arg("import shutil,sys; shutil.rmtree(sys.argv[1])")
        .arg(m.path("cat/foo"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    common::assert_enoent(m.path("cat/foo"));
    let orphans = names(&m.store().join("orphans"));
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    let inner = m
        .store()
        .join("orphans")
        .join(&orphans[0])
        .join(".SKILL.md.tmp.abcdefgh");
    assert_eq!(fs::read(inner).unwrap(), b"temp");
    assert!(
        m.log()
            .iter()
            .any(|r| r["op"] == "orphan" && r["hidden"] == "cat/foo")
    );
}

#[test]
fn parks_are_not_versioned_but_leaving_and_returning_is() {
    let m = Mount::new("parkver");
    skill(&m.root(), "cat/foo", "foo");
    let before = m.log().len();
    fs::rename(m.path("cat/foo"), m.path("cat/foo.bak")).unwrap();
    fs::write(m.path("cat/foo.bak/SKILL.md"), "edited while parked").unwrap();
    fs::write(m.path("cat/foo.bak/new.md"), "new while parked").unwrap();
    let log = m.log();
    let new: Vec<(&str, &str)> = log[before..]
        .iter()
        .map(|r| (r["op"].as_str().unwrap(), r["path"].as_str().unwrap()))
        .collect();
    assert_eq!(new, [("park", "cat/foo")], "only the park is versioned");
    assert_eq!(log[before]["hidden"], "cat/foo.bak");
    fs::rename(m.path("cat/foo.bak"), m.path("cat/foo")).unwrap();
    let log = m.log();
    let back: Vec<(&str, &str)> = log[before + 1..]
        .iter()
        .map(|r| (r["op"].as_str().unwrap(), r["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        back,
        [
            ("unpark", "cat/foo"),
            ("unpark", "cat/foo/SKILL.md"),
            ("unpark", "cat/foo/new.md")
        ]
    );
    let rec = &log[before + 2];
    assert_eq!(
        m.blob(rec["state"]["blob"].as_str().unwrap()),
        b"edited while parked"
    );
}

#[test]
fn parks_left_in_root_while_unmounted_are_moved_out_at_mount() {
    let mut m = Mount::new("offpark");
    skill(&m.root(), "cat/foo", "foo");
    m.umount();
    // The agent ran without skillfs and left a backup and a temp file.
    fs::rename(m.path("cat/foo"), m.path("cat/foo.bak")).unwrap();
    fs::write(m.path("cat/.SKILL.md.tmp.0000"), "t").unwrap();
    skill(&m.root(), "cat/foo", "foo");
    m.remount();
    assert_eq!(names(&m.path("cat")), ["foo"]);
    assert!(m.path("cat/foo.bak/SKILL.md").is_file());
    m.umount();
    assert_eq!(
        names(&m.path("cat")),
        ["foo"],
        "moved out of the root for good"
    );
}

#[test]
fn hidden_children_of_a_directory_removed_offline_are_orphaned_at_mount() {
    let mut m = Mount::new("offorphan");
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/.x.tmp"), "hidden").unwrap();
    m.umount();
    fs::remove_dir(m.path("d")).unwrap(); // empty underneath
    m.remount();
    let log = m.log();
    assert!(log.iter().any(|r| r["op"] == "orphan"), "{log:?}");
    assert!(
        names(&m.store().join("parked")).is_empty(),
        "the attached area was moved"
    );
    assert_eq!(names(&m.store().join("orphans")).len(), 1);
}

#[test]
fn old_parks_are_swept_and_journaled_but_kept_ones_stay() {
    let s = Scratch::new("sweep");
    let mut m = Mount::over(
        s,
        vec![
            "--park-max-age".into(),
            "5s".into(),
            "--allow-short-park-max-age".into(),
        ],
    );
    skill(&m.root(), "cat/foo", "foo");
    fs::rename(m.path("cat/foo"), m.path("cat/foo.bak")).unwrap();
    fs::create_dir(m.path(".curator_backups")).unwrap();
    fs::write(m.path(".curator_backups/snap.tar.gz"), "snapshot").unwrap();
    // A park's age counts from its last change, a rename included (ctime),
    // so an old skill parked a moment ago is young.
    let old = filetime_days_ago(30);
    set_mtime(&m.path("cat/foo.bak/SKILL.md"), old);
    std::thread::sleep(std::time::Duration::from_secs(6));
    fs::create_dir(m.path("cat/fresh.bak")).unwrap();
    m.umount();
    m.remount();
    common::assert_enoent(m.path("cat/foo.bak"));
    assert!(m.path("cat/fresh.bak").exists(), "fresh park swept");
    assert_eq!(
        fs::read(m.path(".curator_backups/snap.tar.gz")).unwrap(),
        b"snapshot"
    );
    assert!(
        m.log()
            .iter()
            .any(|r| r["op"] == "sweep" && r["path"] == "cat/foo.bak")
    );
}

#[test]
fn a_park_made_just_now_is_not_swept_however_old_its_content() {
    let s = Scratch::new("youngpark");
    let mut m = Mount::over(s, vec!["--park-max-age".into(), "1h".into()]);
    skill(&m.root(), "cat/foo", "foo");
    let old = filetime_days_ago(30);
    set_mtime(&m.path("cat/foo/SKILL.md"), old);
    set_mtime(&m.path("cat/foo"), old);
    fs::rename(m.path("cat/foo"), m.path("cat/foo.bak")).unwrap();
    m.umount();
    m.remount();
    assert!(
        m.path("cat/foo.bak/SKILL.md").exists(),
        "a fresh park was swept"
    );
}

#[test]
fn a_park_made_again_while_unmounted_is_merged_not_lost() {
    let mut m = Mount::new("merge");
    fs::create_dir(m.path(".curator_backups")).unwrap();
    fs::write(m.path(".curator_backups/old.tar.gz"), "old snapshot").unwrap();
    m.umount();
    // The agent ran unmounted and made the backups directory again.
    fs::create_dir(m.path(".curator_backups")).unwrap();
    fs::write(m.path(".curator_backups/new.tar.gz"), "new snapshot").unwrap();
    m.remount();
    assert_eq!(
        names(&m.path(".curator_backups")),
        ["new.tar.gz", "old.tar.gz"]
    );
    assert!(names(&m.store().join("orphans")).is_empty());
}

fn filetime_days_ago(days: i64) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    now - days * 86_400
}

fn set_mtime(p: &Path, secs: i64) {
    common::set_mtime(p, secs, 0);
    assert_eq!(fs::symlink_metadata(p).unwrap().mtime(), secs);
}

#[test]
fn rules_change_with_hide_show_and_the_config_file() {
    let s = Scratch::new("rules");
    fs::create_dir_all(s.store()).unwrap();
    fs::write(
        s.store().join("config.json"),
        r#"{"hide": ["*.orig:file"]}"#,
    )
    .unwrap();
    let mut m = Mount::over(s, vec!["--hide=/scratch:dir".into()]);
    fs::write(m.path("a.orig"), "x").unwrap();
    fs::create_dir(m.path("scratch")).unwrap();
    fs::create_dir(m.path("cat")).unwrap();
    fs::create_dir(m.path("cat/old.bak")).unwrap();
    assert_eq!(names(&m.root()), ["cat"]);
    assert!(names(&m.path("cat")).is_empty());
    let out = skillfs(&["status", "--root", m.root().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("*.orig:file") && text.contains("/scratch:dir") && text.contains("*.bak"),
        "{text}"
    );
    // Remounted without the `*.bak` rule: the park is given back, versioned.
    m.umount();
    m.extra_args = vec!["--show=*.bak".into()];
    m.remount();
    assert_eq!(names(&m.path("cat")), ["old.bak"]);
    assert!(
        m.log()
            .iter()
            .any(|r| r["op"] == "unpark" && r["path"] == "cat/old.bak")
    );
}

#[test]
fn bad_rules_and_config_are_refused_with_one_line() {
    let s = Scratch::new("badrules");
    let root = s.root();
    let r = root.to_str().unwrap();
    for (arg, why) in [
        ("--hide=*", "everything"),
        ("--hide=SKILL.md", "SKILL.md"),
        ("--hide=/", "root"),
        ("--hide=.usage.json", ".usage.json"),
        ("--show=nothing-like-this", "matches no rule"),
        ("--park-max-age=soon", "duration"),
    ] {
        let out = skillfs(&["mount", r, arg]);
        assert_eq!(out.status.code(), Some(7), "{arg}: {}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(why), "{arg}: {err}");
        common::assert_enoent(s.store());
    }
    fs::create_dir_all(s.store()).unwrap();
    fs::write(s.store().join("config.json"), "{ not json").unwrap();
    let out = skillfs(&["mount", r]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.json"));
    assert_eq!(
        fs::read_dir(s.store()).unwrap().count(),
        1,
        "only the config file"
    );
}

#[test]
fn rmdir_of_a_hidden_directory_that_lists_entries_is_enotempty() {
    let m = Mount::new("hiddenrmdir");
    fs::create_dir(m.path("cat")).unwrap();
    fs::create_dir(m.path("cat/foo.bak")).unwrap();
    fs::write(m.path("cat/foo.bak/.x.tmp"), "t").unwrap();
    fs::rename(m.path("cat"), m.path("cat.bak")).unwrap();
    // cat.bak is hidden now; its listing shows foo.bak (attached to it).
    assert_eq!(names(&m.path("cat.bak")), ["foo.bak"]);
    let e = fs::remove_dir(m.path("cat.bak")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    fs::remove_dir_all(m.path("cat.bak")).unwrap();
    common::assert_enoent(m.path("cat.bak"));
}

#[test]
fn old_parks_are_swept_while_mounted_and_the_kernel_forgets_them() {
    let s = Scratch::new("livesweep");
    let m = Mount::over(
        s,
        vec![
            "--park-max-age".into(),
            "2s".into(),
            "--allow-short-park-max-age".into(),
        ],
    );
    skill(&m.root(), "cat/foo", "foo");
    fs::rename(m.path("cat/foo"), m.path("cat/foo.bak")).unwrap();
    // Cached by the kernel: entry and attributes.
    assert!(m.path("cat/foo.bak/SKILL.md").is_file());
    let t = std::time::Instant::now();
    while m.path("cat/foo.bak").exists() && t.elapsed() < std::time::Duration::from_secs(15) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    common::assert_enoent(m.path("cat/foo.bak"));
    assert!(
        m.log()
            .iter()
            .any(|r| r["op"] == "sweep" && r["path"] == "cat/foo.bak")
    );
    fs::write(m.path("cat/after.md"), "still working").unwrap();
    assert_eq!(fs::read(m.path("cat/after.md")).unwrap(), b"still working");
}

#[test]
fn a_name_looked_up_before_its_park_exists_is_found_after() {
    // The daemon remembers which directories have no park, to skip looking
    // there; every way a park comes or goes must keep that true.
    let m = Mount::new("parkmemo");
    skill(&m.root(), "cat/foo", "foo");
    let tmp = m.path("cat/foo/.SKILL.md.tmp.1");
    assert!(fs::metadata(&tmp).is_err(), "no park yet");
    fs::write(&tmp, "staged").unwrap();
    assert_eq!(fs::read(&tmp).unwrap(), b"staged");
    fs::rename(&tmp, m.path("cat/foo/SKILL.md")).unwrap();
    assert!(fs::metadata(&tmp).is_err());
    fs::write(&tmp, "again").unwrap();
    assert_eq!(fs::read(&tmp).unwrap(), b"again");

    // The directory goes (its park is orphaned) and comes back new: a
    // hidden name in it must be found where it is made now.
    fs::remove_file(&tmp).unwrap();
    fs::rename(m.path("cat/foo"), m.path("cat/foo.bak")).unwrap();
    assert!(fs::metadata(m.path("cat/foo.bak")).is_ok());
    fs::remove_dir_all(m.path("cat/foo.bak")).unwrap();
    assert!(fs::metadata(m.path("cat/foo.bak")).is_err());
    fs::create_dir(m.path("cat/foo.bak")).unwrap();
    assert!(names(&m.path("cat")).is_empty(), "hidden again");
    fs::write(m.path("cat/foo.bak/x"), "x").unwrap();
    assert_eq!(fs::read(m.path("cat/foo.bak/x")).unwrap(), b"x");
    fs::remove_dir_all(m.path("cat/foo.bak")).unwrap();
    assert!(fs::metadata(m.path("cat/foo.bak")).is_err());
}

#[test]
fn hidden_files_are_written_in_place_and_versioned_once_visible() {
    use std::io::Write;
    let m = Mount::new("inplace");
    skill(&m.root(), "cat/foo", "foo");
    let before = m.log().len();
    // The agent's atomic write: a hidden temp file, then a rename.
    let tmp = m.path("cat/foo/.SKILL.md.tmp.9");
    let mut f = fs::File::create(&tmp).unwrap();
    f.write_all(b"part one, ").unwrap();
    // Another reader sees the bytes at once (the same inode).
    assert_eq!(fs::read(&tmp).unwrap(), b"part one, ");
    f.write_all(b"part two").unwrap();
    drop(f);
    assert_eq!(m.log().len(), before, "scratch is not versioned");
    fs::rename(&tmp, m.path("cat/foo/SKILL.md")).unwrap();
    assert_eq!(m.ops_for("cat/foo/SKILL.md").last().unwrap(), "unpark");
    assert_eq!(
        fs::read(m.path("cat/foo/SKILL.md")).unwrap(),
        b"part one, part two"
    );

    // Made visible while its writer still writes: versioned at the close.
    let mut f = fs::File::create(&tmp).unwrap();
    f.write_all(b"draft").unwrap();
    fs::rename(&tmp, m.path("cat/foo/notes.md")).unwrap();
    f.write_all(b", final").unwrap();
    drop(f);
    let recs: Vec<_> = m
        .log()
        .into_iter()
        .filter(|r| r["path"] == "cat/foo/notes.md" || r["to"] == "cat/foo/notes.md")
        .collect();
    let last = recs.last().unwrap();
    assert_eq!(
        m.blob(last["state"]["blob"].as_str().unwrap()),
        b"draft, final"
    );
    assert_eq!(
        fs::read(m.path("cat/foo/notes.md")).unwrap(),
        b"draft, final"
    );
}

#[test]
fn a_sweep_while_mounted_moves_nothing_between_visible_and_hidden() {
    // Hidden-ness is decided where a name is placed; while mounted, the
    // periodic sweep (every 2 s here) must leave every entry where it was
    // placed, even when the rules would now decide otherwise.
    let s = Scratch::new("nomove");
    let mut m = Mount::over(
        s,
        vec![
            "--park-max-age".into(),
            "8s".into(),
            "--allow-short-park-max-age".into(),
        ],
    );
    // Hidden when made (no SKILL.md above), visible by the rules once one
    // appears.
    fs::create_dir_all(m.path("cat/refs.bak")).unwrap();
    fs::write(m.path("cat/refs.bak/x.md"), "x").unwrap();
    fs::write(m.path("cat/SKILL.md"), "---\nname: cat\n---\n").unwrap();
    // Visible when made (inside a skill), hidden by the rules once its
    // SKILL.md is gone.
    skill(&m.root(), "dog", "dog");
    fs::create_dir(m.path("dog/old.bak")).unwrap();
    fs::write(m.path("dog/old.bak/y.md"), "y").unwrap();
    fs::remove_file(m.path("dog/SKILL.md")).unwrap();
    // Looked up and cached by the kernel before the sweeps.
    assert_eq!(names(&m.path("cat")), ["SKILL.md"]);
    assert_eq!(names(&m.path("dog")), ["old.bak"]);
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(fs::read(m.path("cat/refs.bak/x.md")).unwrap(), b"x");
    fs::write(m.path("cat/refs.bak/z.md"), "z").unwrap();
    assert_eq!(names(&m.path("cat")), ["SKILL.md"], "still hidden");
    assert_eq!(fs::read(m.path("dog/old.bak/y.md")).unwrap(), b"y");
    fs::write(m.path("dog/old.bak/w.md"), "w").unwrap();
    assert_eq!(names(&m.path("dog")), ["old.bak"], "still visible");
    // The next mount applies the rules as they read now.
    m.umount();
    m.remount();
    assert_eq!(names(&m.path("cat")), ["SKILL.md", "refs.bak"]);
    assert_eq!(names(&m.path("cat/refs.bak")), ["x.md", "z.md"]);
    assert!(names(&m.path("dog")).is_empty());
    assert_eq!(fs::read(m.path("dog/old.bak/w.md")).unwrap(), b"w");
}

/// `.*.tmp:file` hides files only: a directory or a symlink that leads to
/// no file may carry such a name, listed, while a file of that name lives
/// in the park (a symlink to a file is hidden like the file, see
/// `symlinks_are_judged_by_where_they_lead`). Exchanges
/// and renames between the two kinds put each entry where its own kind
/// belongs, and history follows.
#[test]
fn entries_of_another_kind_under_a_hidden_name_land_where_their_kind_belongs() {
    let m = Mount::new("kinds");
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/inside"), "in d").unwrap();
    fs::write(m.path(".x.tmp"), "hidden file").unwrap();
    assert_eq!(names(&m.root()), ["d"]);
    // A directory exchanged with the hidden file: the directory, now
    // called .x.tmp, is listed; the file, now called d, is too.
    common::renameat2(&m.path("d"), &m.path(".x.tmp"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(names(&m.root()), [".x.tmp", "d"]);
    assert_eq!(fs::read_to_string(m.path("d")).unwrap(), "hidden file");
    assert_eq!(fs::read_to_string(m.path(".x.tmp/inside")).unwrap(), "in d");
    // History has the directory under its new name and the file, made
    // visible, under the old one.
    let latest = m.path(".history/latest");
    assert_eq!(names(&latest), [".x.tmp", "d"]);
    assert_eq!(fs::read_to_string(latest.join("d")).unwrap(), "hidden file");
    // A file renamed over a visible symlink of a hidden name replaces it,
    // and goes to the park.
    fs::remove_dir_all(m.path(".x.tmp")).unwrap();
    std::os::unix::fs::symlink("nowhere", m.path(".y.tmp")).unwrap();
    assert_eq!(names(&m.root()), [".y.tmp", "d"]);
    fs::write(m.path("f"), "file").unwrap();
    fs::rename(m.path("f"), m.path(".y.tmp")).unwrap();
    assert_eq!(names(&m.root()), ["d"]);
    let st = fs::symlink_metadata(m.path(".y.tmp")).unwrap();
    assert!(st.is_file(), "the file replaced the symlink");
    assert_eq!(fs::read_to_string(m.path(".y.tmp")).unwrap(), "file");
    assert_eq!(names(&m.path(".history/latest")), ["d"]);
}

/// What the loader (`os.walk(followlinks=True)`) walks through a symlink:
/// every `SKILL.md` directory it reaches, relative to the root.
fn loader(root: &Path) -> Vec<String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import os,sys\n\
             r=sys.argv[1]\n\
             for d,dn,fn in os.walk(r, followlinks=True):\n\
             \x20   dn[:]=[x for x in dn if x not in ('.history',)]\n\
             \x20   if 'SKILL.md' in fn: print(os.path.relpath(d, r))\n",
        )
        .arg(root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let mut v: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// A symlink is judged by what it leads to (issue 13, item 6): named like
/// a park and leading to a directory, it is hidden as that directory would
/// be; leading to (or through) a hidden entry, it is hidden too; so the
/// loader, which follows links, reaches each skill once. Made while
/// mounted, renamed, or found at mount, alike.
#[test]
fn symlinks_are_judged_by_where_they_lead() {
    let mut m = Mount::with_tree("follow", |root| {
        skill(root, "cat/real", "real");
        fs::create_dir_all(root.join("cat/old")).unwrap();
        // Made while unmounted: found by the mount's scan.
        std::os::unix::fs::symlink("real", root.join("cat/offline.bak")).unwrap();
    });
    let root = m.root();
    let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, m.path(at)).unwrap();
    assert_eq!(
        names(&m.path("cat")),
        ["old", "real"],
        "the offline link is hidden"
    );
    link("real", "cat/real.bak"); // a park's name, leading to a directory
    skill(&root, "cat/gone.bak", "gone"); // a park: hidden
    link("gone.bak", "cat/shortcut"); // leading to a park
    link("../cat/gone.bak/SKILL.md", "cat/through"); // through a park
    link(&m.path("cat/real").display().to_string(), "cat/abs.bak"); // absolute, into the root
    link("real/SKILL.md", "cat/file.bak"); // a file: *.bak hides directories only
    link("missing", "cat/dangling.bak"); // leads nowhere: judged by its name
    link("loopb", "cat/loopa"); // a loop: judged by its name
    link("loopa", "cat/loopb");
    link("later.bak", "cat/dang"); // to a park's name not made yet
    link(".history", "cat/hist"); // the history tree
    link("../../skills/cat/gone.bak", "cat/up"); // out of the root and back in
    let abs = m.path("cat/gone.bak").display().to_string();
    let twisted = abs.replacen("/skills/", "//./skills/", 1);
    link(&twisted, "cat/abs2"); // another spelling of a path into the root
    link("real", "cat/plain"); // an ordinary link, listed
    let listed = |m: &Mount| {
        let mut v = names(&m.path("cat"));
        v.sort();
        v
    };
    let want = [
        "dangling.bak",
        "file.bak",
        "loopa",
        "loopb",
        "old",
        "plain",
        "real",
    ];
    assert_eq!(listed(&m), want);
    // Reachable by exact name, as every hidden entry.
    assert!(m.path("cat/real.bak/SKILL.md").exists());
    assert!(m.path("cat/shortcut/SKILL.md").exists());
    // Renamed to a park's name: hidden; back: listed.
    fs::rename(m.path("cat/plain"), m.path("cat/plain.bak")).unwrap();
    assert!(!names(&m.path("cat")).contains(&"plain.bak".to_string()));
    fs::rename(m.path("cat/plain.bak"), m.path("cat/plain")).unwrap();
    assert!(names(&m.path("cat")).contains(&"plain".to_string()));
    assert_eq!(loader(&root), ["cat/plain", "cat/real"]);
    m.umount();
    m.remount();
    assert_eq!(listed(&m), want, "the same after the mount's scan");
    assert_eq!(loader(&root), ["cat/plain", "cat/real"]);
}

/// A symlink to a directory outside the root is judged by that directory
/// (issue 26, item 5): named like a park, made so, renamed so, or found at
/// mount, it is not listed, is reachable by name, and the loader does not
/// walk it; one leading back into the mount is judged by its name.
#[test]
fn a_link_out_of_the_root_is_judged_by_where_it_leads() {
    let mut m = Mount::new("follow-out");
    let outside = m.scratch.dir.join("outside");
    skill(&outside, "ext", "ext");
    let ext = outside.join("ext");
    let via = outside.join("via"); // a link outside, to the directory
    std::os::unix::fs::symlink(&ext, &via).unwrap();
    let root = m.root();
    fs::create_dir_all(m.path("cat")).unwrap();
    let link = |target: &Path, at: &str| std::os::unix::fs::symlink(target, m.path(at)).unwrap();
    link(&ext, "cat/made.rollback-broken"); // made with a park's name
    link(&via, "cat/via.rollback-broken"); // through a link outside
    link(&ext, "cat/lnk"); // an ordinary link, listed...
    link(&outside.join("ext/SKILL.md"), "cat/file.rollback-broken"); // a file
    // Outside, back into the mount: judged by its name, never looked into.
    std::os::unix::fs::symlink(m.mount_point(), outside.join("back")).unwrap();
    link(&outside.join("back"), "cat/back.rollback-broken");
    let listed = |m: &Mount| {
        let mut v = names(&m.path("cat"));
        v.sort();
        v
    };
    assert_eq!(
        listed(&m),
        ["back.rollback-broken", "file.rollback-broken", "lnk"]
    );
    // ...and hidden once renamed to a park's name.
    fs::rename(m.path("cat/lnk"), m.path("cat/lnk.rollback-broken")).unwrap();
    assert_eq!(listed(&m), ["back.rollback-broken", "file.rollback-broken"]);
    // (The loader would walk the mount again through it.)
    fs::remove_file(m.path("cat/back.rollback-broken")).unwrap();
    let want = ["file.rollback-broken"];
    for name in ["made", "via", "lnk"] {
        let p = m.path(&format!("cat/{name}.rollback-broken/SKILL.md"));
        assert!(p.exists(), "{name}: reachable by name");
    }
    assert_eq!(loader(&root), Vec::<String>::new());
    m.umount();
    m.remount();
    assert_eq!(listed(&m), want, "the same after the mount's scan");
    assert_eq!(loader(&root), Vec::<String>::new());
}
