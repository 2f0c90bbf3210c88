//! The `.history/` tree through a real mount (contracts G1, G4) and the
//! commands that read history: show, diff, restore.

use crate::common;

use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use common::{Mount, cpath as c, describe, names, skillfs};

fn errno(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

fn last_id(m: &Mount) -> u64 {
    m.log().last().unwrap()["seq"].as_u64().unwrap()
}

#[test]
fn a_files_history_across_write_rename_truncate_delete_recreate() {
    let m = Mount::new("filehist");
    let p = m.path("f.md");
    fs::write(&p, "one").unwrap();
    let id_one = last_id(&m);
    fs::write(m.path("g.md"), "two").unwrap();
    fs::rename(m.path("g.md"), &p).unwrap();
    let id_two = last_id(&m);
    OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(1)
        .unwrap();
    let id_trunc = last_id(&m);
    fs::remove_file(&p).unwrap();
    let id_gone = last_id(&m);
    fs::write(&p, "three").unwrap();
    let h = |id: u64| m.path(&format!(".history/{id}/f.md"));
    assert_eq!(fs::read(h(id_one)).unwrap(), b"one");
    assert_eq!(fs::read(h(id_two)).unwrap(), b"two");
    assert_eq!(fs::read(h(id_trunc)).unwrap(), b"t");
    assert_eq!(
        fs::metadata(h(id_gone)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(fs::read(m.path(".history/latest/f.md")).unwrap(), b"three");
    // `ls .history` lists every id in order; `ls` of the root never shows it.
    let ids: Vec<u64> = fs::read_dir(m.path(".history"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (1..=last_id(&m)).collect::<Vec<_>>());
    assert_eq!(names(&m.root()), ["f.md"]);
}

#[test]
fn a_directorys_history_across_rename_and_removal() {
    let m = Mount::new("dirhist");
    fs::create_dir_all(m.path("cat/foo/references")).unwrap();
    fs::write(m.path("cat/foo/SKILL.md"), "name: foo").unwrap();
    fs::write(m.path("cat/foo/references/r.md"), "ref").unwrap();
    let before = last_id(&m);
    fs::rename(m.path("cat/foo"), m.path("cat/bar")).unwrap();
    let renamed = last_id(&m);
    fs::write(m.path("cat/other.md"), "x").unwrap();
    fs::remove_dir_all(m.path("cat/bar")).unwrap();
    assert_eq!(
        fs::read(m.path(&format!(".history/{before}/cat/foo/references/r.md"))).unwrap(),
        b"ref"
    );
    common::assert_enoent(m.path(&format!(".history/{renamed}/cat/foo")));
    assert_eq!(names(&m.path(&format!(".history/{renamed}/cat"))), ["bar"]);
    assert_eq!(
        names(&m.path(&format!(".history/{renamed}/cat/bar"))),
        ["SKILL.md", "references"]
    );
    // Every visible directory answers `.history` with the changes under it.
    let cat_ids: Vec<u64> = fs::read_dir(m.path("cat/.history"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    assert!(cat_ids.contains(&before) && cat_ids.contains(&renamed));
    assert_eq!(
        cat_ids.len(),
        (last_id(&m) as usize),
        "every change so far was under cat/"
    );
    fs::write(m.path("top.md"), "not under cat").unwrap();
    assert_eq!(
        fs::read_dir(m.path("cat/.history")).unwrap().count(),
        cat_ids.len()
    );
    // cat/.history/<id>/ is cat at that id.
    assert_eq!(names(&m.path(&format!("cat/.history/{before}"))), ["foo"]);
}

#[test]
fn aliases_resolve_by_lookup_at_exact_boundaries() {
    let m = Mount::new("alias");
    fs::write(m.path("a"), "first").unwrap();
    let first = m.log().last().unwrap().clone();
    // The next change lands in a later second.
    let t0 = first["ts"].as_i64().unwrap() / 1_000_000_000;
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        <= t0
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    fs::write(m.path("a"), "second").unwrap();
    let second = m.log().last().unwrap().clone();
    let utc = |ns: i64, sep: char| {
        let out = Command::new("date")
            .args(["-u", "-d", &format!("@{}", ns / 1_000_000_000)])
            .arg(format!("+%Y-%m-%dT%H{sep}%M{sep}%SZ"))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let at = |alias: String| fs::read(m.path(&format!(".history/{alias}/a")));
    let t1 = first["ts"].as_i64().unwrap();
    let t2 = second["ts"].as_i64().unwrap();
    assert_eq!(at(format!("@{}", utc(t1, ':'))).unwrap(), b"first");
    assert_eq!(at(format!("@{}", utc(t1, '-'))).unwrap(), b"first");
    assert_eq!(at(format!("@{}", utc(t2, ':'))).unwrap(), b"second");
    assert_eq!(
        at(format!("@{}", utc(t2 - 1_000_000_000, ':'))).unwrap(),
        b"first"
    );
    assert_eq!(at("latest".into()).unwrap(), b"second");
    assert_eq!(at("@-0s".into()).unwrap(), b"second");
    // Before the first change, unparsable, unknown or future ids: ENOENT.
    for bad in [
        format!("@{}", utc(t1 - 3_600_000_000_000, ':')),
        "@-1d".into(),
        "@yesterday".into(),
        "0".into(),
        format!("{}", second["seq"].as_u64().unwrap() + 1),
        "lates".into(),
    ] {
        assert_eq!(
            fs::metadata(m.path(&format!(".history/{bad}")))
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound,
            "{bad}"
        );
    }
    // Aliases are not listed.
    assert!(
        !names(&m.path(".history"))
            .iter()
            .any(|n| n.starts_with('@') || n == "latest")
    );
}

#[test]
fn every_change_under_history_answers_erofs() {
    let m = Mount::new("erofs");
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), "x").unwrap();
    let v = m.path(".history/latest");
    let f = v.join("d/f");
    let d = v.join("d");
    assert_eq!(errno(OpenOptions::new().write(true).open(&f)), libc::EROFS);
    assert_eq!(
        errno(OpenOptions::new().read(true).write(true).open(&f)),
        libc::EROFS
    );
    assert_eq!(errno(OpenOptions::new().append(true).open(&f)), libc::EROFS);
    assert_eq!(
        errno(OpenOptions::new().write(true).truncate(true).open(&f)),
        libc::EROFS
    );
    assert_eq!(errno(fs::write(d.join("new"), "x")), libc::EROFS);
    assert_eq!(errno(fs::create_dir(d.join("sub"))), libc::EROFS);
    assert_eq!(errno(fs::remove_file(&f)), libc::EROFS);
    assert_eq!(errno(fs::remove_dir(&d)), libc::EROFS);
    assert_eq!(errno(fs::rename(&f, d.join("g"))), libc::EROFS);
    assert_eq!(errno(fs::rename(&f, m.path("stolen"))), libc::EROFS);
    assert_eq!(errno(fs::rename(m.path("d/f"), d.join("in"))), libc::EROFS);
    assert_eq!(errno(symlink("x", d.join("l"))), libc::EROFS);
    assert_eq!(
        errno(fs::set_permissions(&f, fs::Permissions::from_mode(0o600))),
        libc::EROFS
    );
    assert_eq!(
        errno(std::os::unix::fs::chown(&f, Some(1), Some(1))),
        libc::EROFS
    );
    assert_eq!(unsafe { libc::truncate(c(&f).as_ptr(), 0) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EROFS)
    );
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c(&f).as_ptr(), std::ptr::null(), 0) },
        -1
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EROFS)
    );
    // The name `.history` itself.
    assert_eq!(errno(fs::create_dir(m.path(".history"))), libc::EEXIST);
    assert_eq!(errno(fs::remove_dir(m.path(".history"))), libc::EROFS);
    assert_eq!(
        errno(fs::rename(m.path(".history"), m.path("h"))),
        libc::EROFS
    );
    assert_eq!(
        errno(fs::rename(m.path("d"), m.path(".history"))),
        libc::EROFS
    );
    assert_eq!(fs::read(&f).unwrap(), b"x", "still readable");
}

#[test]
fn cp_a_restores_bytes_modes_mtimes_and_symlinks_exactly() {
    let mut m = Mount::new("cpa");
    let skill = m.path("cat/foo");
    fs::create_dir_all(skill.join("scripts")).unwrap();
    fs::write(skill.join("SKILL.md"), "---\nname: foo\n---\n").unwrap();
    let bin: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 256) as u8).collect();
    fs::write(skill.join("scripts/run.bin"), &bin).unwrap();
    fs::set_permissions(
        skill.join("scripts/run.bin"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    symlink("scripts/run.bin", skill.join("link")).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 5,
        },
        libc::timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 123_456_789,
        },
    ];
    let skill_md = c(&skill.join("SKILL.md"));
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, skill_md.as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let good = last_id(&m);
    // The agent breaks the skill, then deletes it.
    fs::write(skill.join("SKILL.md"), "broken").unwrap();
    fs::remove_dir_all(&skill).unwrap();
    // History survives an unmount and a daemon SIGKILL.
    m.umount();
    m.remount();
    m.kill9();
    m.remount();
    let out = Command::new("cp")
        .arg("-a")
        .arg(m.path(&format!("cat/.history/{good}/foo")))
        .arg(m.path("cat/"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        fs::read(skill.join("SKILL.md")).unwrap(),
        b"---\nname: foo\n---\n"
    );
    assert_eq!(fs::read(skill.join("scripts/run.bin")).unwrap(), bin);
    assert_eq!(
        fs::metadata(skill.join("scripts/run.bin")).unwrap().mode() & 0o7777,
        0o755
    );
    let md = fs::metadata(skill.join("SKILL.md")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));
    assert_eq!(
        fs::read_link(skill.join("link")).unwrap(),
        Path::new("scripts/run.bin")
    );
    // The restore is an ordinary, versioned write.
    let log = m.log();
    assert!(
        log.iter()
            .rev()
            .take(8)
            .any(|r| r["path"] == "cat/foo/SKILL.md" && r["op"] == "write")
    );
    // Restoring into an existing skill with `cp -a dir/.history/<id>/. dir/`.
    fs::write(skill.join("SKILL.md"), "edited again").unwrap();
    let out = Command::new("cp")
        .arg("-a")
        .arg(m.path(&format!("cat/foo/.history/{good}/.")))
        .arg(&skill)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        fs::read(skill.join("SKILL.md")).unwrap(),
        b"---\nname: foo\n---\n"
    );
}

#[test]
fn the_loader_walk_never_enters_history() {
    let m = Mount::new("walk");
    fs::create_dir_all(m.path("cat/foo")).unwrap();
    fs::write(m.path("cat/foo/SKILL.md"), "---\nname: foo\n---\n").unwrap();
    fs::write(m.path("cat/foo/SKILL.md"), "---\nname: foo\n---\nv2\n").unwrap();
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import os,sys\n\
             found=[os.path.join(d,'SKILL.md') for d,_,f in os.walk(sys.argv[1], followlinks=True) if 'SKILL.md' in f]\n\
             assert all('.history' not in p for p in found), found\n\
             print(len(found))",
        )
        .arg(m.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
}

#[test]
fn show_diff_and_restore_commands() {
    let m = Mount::new("cmds");
    let r = m.root().display().to_string();
    fs::create_dir_all(m.path("cat/foo")).unwrap();
    fs::write(m.path("cat/foo/SKILL.md"), "line1\nline2\n").unwrap();
    fs::write(m.path("cat/foo/data.bin"), [0u8, 1, 2, 255]).unwrap();
    let good = last_id(&m);
    fs::write(m.path("cat/foo/SKILL.md"), "line1\nchanged\n").unwrap();
    fs::write(m.path("cat/foo/data.bin"), [9u8, 0]).unwrap();
    fs::write(m.path("cat/foo/extra.md"), "added later").unwrap();

    let out = skillfs(&["show", &format!("{good}:cat/foo/SKILL.md"), "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(out.stdout, b"line1\nline2\n");
    let out = skillfs(&["diff", &good.to_string(), "cat/foo", "--root", &r]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("-line2\n+changed\n"), "{text}");
    assert!(
        text.contains("Binary files a/cat/foo/data.bin and b/cat/foo/data.bin differ"),
        "{text}"
    );
    assert!(text.contains("+++ b/cat/foo/extra.md"), "{text}");

    let out = skillfs(&["restore", &good.to_string(), "cat/foo", "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("restored cat/foo as of change {good}"))
    );
    assert_eq!(
        fs::read(m.path("cat/foo/SKILL.md")).unwrap(),
        b"line1\nline2\n"
    );
    assert_eq!(
        fs::read(m.path("cat/foo/data.bin")).unwrap(),
        [0u8, 1, 2, 255]
    );
    common::assert_enoent(m.path("cat/foo/extra.md"));
    assert_eq!(
        names(&m.path("cat")),
        ["foo"],
        "no staging name is left or listed"
    );
    // Nothing is lost by a restore: the replaced state is one id back.
    let out = skillfs(&["show", "latest:cat/foo/extra.md", "--root", &r]);
    assert_eq!(out.status.code(), Some(8), "{}", describe(&out));
    let log = m.log();
    let park = log
        .iter()
        .rposition(|r| r["op"] == "park" && r["path"] == "cat/foo")
        .unwrap();
    let before_restore = log[park - 1]["seq"].as_u64().unwrap();
    assert_eq!(
        fs::read(m.path(&format!(".history/{before_restore}/cat/foo/extra.md"))).unwrap(),
        b"added later"
    );
    // Bad input: one line, exit 8.
    for spec in [
        "9999:cat",
        "@yesterday:cat",
        "@1999-01-01T00:00:00Z:cat",
        &format!("{good}:nope"),
    ] {
        let out = skillfs(&["show", spec, "--root", &r]);
        assert_eq!(out.status.code(), Some(8), "{spec}: {}", describe(&out));
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    }
    let out = skillfs(&["status", "--root", &r]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("mounted (daemon pid") && text.contains(" changes, "),
        "{text}"
    );
}

#[test]
fn restore_keeps_what_it_replaces_hidden_instead_of_deleting_it() {
    let m = Mount::new("restorekeep");
    let r = m.root().display().to_string();
    fs::create_dir_all(m.path("cat/foo")).unwrap();
    fs::write(m.path("cat/foo/SKILL.md"), "v1").unwrap();
    let good = last_id(&m);
    fs::write(m.path("cat/foo/SKILL.md"), "v2").unwrap();
    // A temp file a killed writer left: hidden, so in no history.
    fs::write(m.path("cat/foo/.SKILL.md.tmp.deadbeef"), "unsaved work").unwrap();
    let out = skillfs(&["restore", &good.to_string(), "cat/foo", "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v1");
    assert_eq!(names(&m.path("cat")), ["foo"]);
    let kept = Command::new("grep")
        .args(["-rl", "unsaved work"])
        .arg(m.store().join("parked"))
        .output()
        .unwrap();
    assert!(
        !kept.stdout.is_empty(),
        "the replaced tree's hidden file was deleted"
    );
}

/// `mode & 0o7777` of `p`, not following a symlink.
fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// The agent's delete of a category's last skill removes the category
/// too (an rmtree of the skill, then an rmdir of the emptied category):
/// restoring the skill by the path `log` shows makes the category again,
/// as it was then, in the same one operation, which one `undo` takes out.
#[test]
fn restore_of_a_deleted_skill_makes_its_missing_category_and_undo_takes_it_all_out() {
    let m = Mount::new("restoreparents");
    let r = m.root().display().to_string();
    let skill = m.path("social/greet");
    fs::create_dir_all(skill.join("references")).unwrap();
    fs::create_dir_all(skill.join("scripts")).unwrap();
    fs::create_dir(skill.join("private")).unwrap();
    fs::write(skill.join("SKILL.md"), "---\nname: greet\n---\n").unwrap();
    fs::write(skill.join("references/a.md"), "ref\n").unwrap();
    fs::write(skill.join("scripts/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::write(skill.join("private/key"), "k").unwrap();
    fs::set_permissions(
        skill.join("scripts/run.sh"),
        PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    fs::set_permissions(skill.join("private"), PermissionsExt::from_mode(0o700)).unwrap();
    fs::set_permissions(m.path("social"), PermissionsExt::from_mode(0o750)).unwrap();
    std::os::unix::fs::lchown(m.path("social"), Some(4321), Some(4322)).unwrap();
    let good = last_id(&m);
    // The agent's delete: the skill, then its emptied category.
    fs::remove_dir_all(&skill).unwrap();
    fs::remove_dir(m.path("social")).unwrap();
    let before = last_id(&m);

    let out = skillfs(&["restore", &good.to_string(), "social/greet", "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("made its missing parent social"), "{text}");
    assert_eq!(names(&m.root()), ["social"]);
    assert_eq!(names(&m.path("social")), ["greet"]);
    assert_eq!(
        names(&skill),
        ["SKILL.md", "private", "references", "scripts"]
    );
    assert_eq!(fs::read(skill.join("references/a.md")).unwrap(), b"ref\n");
    assert_eq!(fs::read(skill.join("private/key")).unwrap(), b"k");
    assert_eq!(mode(&skill.join("scripts/run.sh")), 0o755);
    assert_eq!(mode(&skill.join("private")), 0o700);
    // The category as it was at that id: its mode and owner.
    assert_eq!(mode(&m.path("social")), 0o750);
    let meta = fs::metadata(m.path("social")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (4321, 4322));
    // One operation: every record of the restore by one process, the
    // category first.
    let log = m.log();
    let restore: Vec<_> = log
        .iter()
        .filter(|r| r["seq"].as_u64().unwrap() > before)
        .collect();
    assert_eq!(restore[0]["path"], "social", "{restore:?}");
    assert!(
        restore
            .iter()
            .all(|r| r["actor"]["pid"] == restore[0]["actor"]["pid"]),
        "{restore:?}"
    );

    // One undo takes the category out again, with everything in it.
    let out = skillfs(&["undo", "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        names(&m.root()).is_empty(),
        "the undo left {:?}",
        names(&m.root())
    );
    common::assert_enoent(m.path("social"));
}

/// A large blob (in chunks) is hashed before `.history` serves it: one
/// rotted bit in one of its chunks is `EIO`, and a `cp -a` out of it fails
/// instead of copying the damage (README: hashed, once per daemon before
/// it is served). The same damage to the live file's own content is
/// repaired by the mount, which hashes each chunk of what it finds stored
/// and stores the live file's bytes again.
#[test]
fn a_rotted_large_blob_is_not_served() {
    let mut m = Mount::new("rotted");
    let big = common::noise(200_000, 3);
    fs::write(m.path("big.bin"), &big).unwrap();
    let id = last_id(&m);
    let now = common::noise(200_000, 4);
    fs::write(m.path("big.bin"), &now).unwrap();
    let live_id = last_id(&m);
    m.umount();
    common::damage_stored(&m.store(), &big, 1000);
    common::damage_stored(&m.store(), &now, 1000);

    m.remount();
    assert_eq!(
        fs::read(m.path("big.bin")).unwrap(),
        now,
        "the live file is whole"
    );
    assert_eq!(
        fs::read(m.path(&format!(".history/{live_id}/big.bin"))).unwrap(),
        now,
        "stored again from the live file"
    );
    let old = m.path(&format!(".history/{id}/big.bin"));
    assert_eq!(errno(fs::read(&old)), libc::EIO);
    let copy = m.store().parent().unwrap().join("copy");
    let out = Command::new("cp")
        .arg("-a")
        .arg(&old)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(!out.status.success(), "cp -a copied the damage");
    let log = fs::read_to_string(m.store().join("daemon.log")).unwrap_or_default();
    assert!(log.contains("damaged"), "{log}");
}

/// `undo PATH` of a skill deleted by one process whose empty category was
/// removed by another afterwards: the removal of the empty category did
/// not touch the skill, so the undo is of the delete, and it makes the
/// category again (it used to "undo" the rmdir and restore nothing).
#[test]
fn undo_of_a_deleted_skill_after_its_category_went_separately_brings_both_back() {
    let m = Mount::new("undocat");
    fs::create_dir_all(m.path("social/greet/scripts")).unwrap();
    fs::write(m.path("social/greet/SKILL.md"), "hi\n").unwrap();
    fs::write(m.path("social/greet/scripts/run.sh"), "echo\n").unwrap();
    fs::set_permissions(
        m.path("social/greet/scripts/run.sh"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    // Two processes: the delete, then the category's removal.
    let root = m.root();
    let out = Command::new("rm")
        .arg("-r")
        .arg(root.join("social/greet"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let out = Command::new("rmdir")
        .arg(root.join("social"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let r = root.display().to_string();
    let out = skillfs(&["undo", "--root", &r, "social/greet"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 restored"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        fs::read_to_string(m.path("social/greet/SKILL.md")).unwrap(),
        "hi\n"
    );
    assert_eq!(mode(&m.path("social/greet/scripts/run.sh")), 0o755);
}
