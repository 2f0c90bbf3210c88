//! An unprivileged user who owns ROOT mounts, writes and unmounts (through
//! fusermount3). Run as root, the test drops to uid/gid 65534 with
//! `setpriv`; scripts/test.sh installs fuse3 and makes /dev/fuse usable by
//! users (mode 0666, as distributions configure it) first.

use crate::common;

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::PathBuf;
use std::process::{Command, Output};

use common::{Scratch, describe, is_mounted, lazy_unmount};

const NOBODY: u32 = 65534;

struct Detach(PathBuf);
impl Drop for Detach {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            lazy_unmount(&self.0);
        }
    }
}

fn as_user(args: &[&str]) -> Output {
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        c
    } else {
        Command::new("env")
    };
    cmd.args(args)
        .output()
        .expect("run as the unprivileged user")
}

/// A scratch directory whose ROOT (and `dirs` below it) the unprivileged
/// user owns (as root), and a copy of the binary in it the user can
/// surely execute (the build tree may sit in a directory only root can
/// enter).
fn users_scratch(tag: &str, dirs: &[&str]) -> (Scratch, PathBuf) {
    assert!(
        common_fusermount(),
        "fusermount3 is required for an unprivileged mount: run scripts/test.sh (it installs fuse3)"
    );
    let s = Scratch::new(tag);
    let root = s.root();
    let mut owned = vec![s.dir.clone(), root.clone()];
    for d in dirs {
        std::fs::create_dir_all(root.join(d)).unwrap();
        owned.push(root.join(d));
    }
    if unsafe { libc::geteuid() } == 0 {
        for d in &owned {
            chown(d, Some(NOBODY), Some(NOBODY)).unwrap();
        }
    }
    let bin = s.dir.join("skillfs");
    std::fs::copy(common::BIN, &bin).unwrap();
    (s, bin)
}

#[test]
fn an_unprivileged_owner_mounts_writes_and_unmounts() {
    let (s, bin) = users_scratch("unpriv", &[]);
    let root = s.root();
    let _guard = Detach(root.clone());
    let bin = bin.to_str().unwrap();
    let r = root.to_str().unwrap();
    let out = as_user(&[bin, "mount", r]);
    assert!(
        out.status.success(),
        "unprivileged mount failed:\n{}",
        describe(&out)
    );
    assert!(is_mounted(&root));
    let file = root.join("SKILL.md");
    let f = file.to_str().unwrap();
    let out = as_user(&[
        "sh",
        "-c",
        &format!("printf 'name: mine' > '{f}' && cat '{f}'"),
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(out.stdout, b"name: mine");
    let out = as_user(&[bin, "log", "--all", "--root", r]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("write       SKILL.md"),
        "{}",
        describe(&out)
    );
    let out = as_user(&[bin, "umount", r]);
    assert!(
        out.status.success(),
        "unprivileged umount failed:\n{}",
        describe(&out)
    );
    assert!(!is_mounted(&root));
    assert_eq!(std::fs::read(&file).unwrap(), b"name: mine");
}

fn common_fusermount() -> bool {
    Command::new("fusermount3").arg("-V").output().is_ok()
}

/// As a user (fusermount3): a busy unmount is refused and changes nothing,
/// and `skillfs mount` recovers the mount after its daemon is killed.
#[test]
fn an_unprivileged_owner_is_refused_a_busy_unmount_and_recovers_a_dead_mount() {
    let (s, bin) = users_scratch("unpriv-life", &[]);
    let root = s.root();
    let _guard = Detach(root.clone());
    let bin = bin.to_str().unwrap();
    let r = root.to_str().unwrap();
    let out = as_user(&[bin, "mount", r]);
    assert!(out.status.success(), "{}", describe(&out));
    // A shell of the user's inside the mount.
    let mut holder = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["sh", "-c", &format!("cd '{r}' && exec sleep 60")])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = as_user(&[bin, "umount", r]);
    assert_eq!(out.status.code(), Some(9), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("(sleep: cwd)"),
        "{}",
        describe(&out)
    );
    assert!(is_mounted(&root));
    let _ = holder.kill();
    let _ = holder.wait();
    // Killed: a dead mount, which the same `mount` recovers.
    let store = s.dir.join(".skillfs/skills");
    let pid = common::daemon_pid(&store).unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    common::wait_unlocked(&store);
    let out = as_user(&[bin, "mount", r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dead mount"));
    let out = as_user(&["sh", "-c", &format!("echo v > '{r}/after.md'")]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = as_user(&[bin, "log", "--all", "--root", r]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("after.md"),
        "{}",
        describe(&out)
    );
    let out = as_user(&[bin, "umount", r]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// A daemon of an unprivileged user meets a file of that user with no read
/// permission, written behind it (through a bind mount made before the
/// mount): the owner's `chmod` through the mount works, and the content
/// is versioned first (the daemon lends itself the read bit to read it).
#[test]
fn an_owners_unreadable_file_written_behind_is_versioned_by_its_chmod() {
    if unsafe { libc::geteuid() } != 0 {
        return; // the route behind the daemon is a bind mount: root's
    }
    let (s, bin) = users_scratch("unpriv-behind", &["cat"]);
    let root = s.root();
    let bin = bin.to_str().unwrap();
    let r = root.to_str().unwrap();
    let behind = common::BindMount::new(&root, &s.dir.join("alt"));
    let _guard = Detach(root.clone());
    let out = as_user(&[bin, "mount", r]);
    assert!(out.status.success(), "{}", describe(&out));
    let file = behind.path("cat/new.md");
    std::fs::write(&file, b"precious\n").unwrap();
    chown(&file, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = as_user(&["chmod", "644", &format!("{r}/cat/new.md")]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = as_user(&["cat", &format!("{r}/.history/latest/cat/new.md")]);
    assert_eq!(out.stdout, b"precious\n", "{}", describe(&out));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o644);
    let out = as_user(&[bin, "umount", r]);
    assert!(out.status.success(), "{}", describe(&out));
}
