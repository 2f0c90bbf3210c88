//! The mount scripts: idempotent mount and unmount over $HERMES_HOME
//! (versioning its skills/, the default) or over a skills directory alone.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Scratch, describe, is_mounted, lazy_unmount};

struct Detach(PathBuf);
impl Drop for Detach {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            lazy_unmount(&self.0);
        }
    }
}

/// The unit's `KEY=/bin/sh -c '…'` line run by `sh` as systemd would (in
/// the background: `--foreground` dropped), for `hermes_home`.
fn unit_line(unit: &str, key: &str, hermes_home: &Path) -> Output {
    let prefix = format!("{key}=/bin/sh -c '");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|l| l.strip_suffix('\''))
        .unwrap_or_else(|| panic!("the unit's {key} line"))
        .replace(" --foreground", "");
    Command::new("sh")
        .args(["-c", &line])
        .env("HERMES_HOME", hermes_home)
        .env("SKILLFS_BIN", common::BIN)
        .output()
        .unwrap()
}

fn script(name: &str, hermes_home: &Path) -> Output {
    script_args(name, hermes_home, &[])
}

fn script_args(name: &str, hermes_home: &Path, args: &[&str]) -> Output {
    Command::new(format!(
        "{}/mount-scripts/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .args(args)
    .env("HERMES_HOME", hermes_home)
    .env("SKILLFS_BIN", common::BIN)
    .output()
    .unwrap()
}

#[test]
fn mount_scripts_are_idempotent_and_respect_hermes_home() {
    let s = Scratch::new("scripts");
    let home = s.dir.join("hermes");
    let root = home.join("skills");
    let _guard = Detach(home.clone());
    // The home and its skills directory are created when missing.
    let out = script("skillfs-mount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(is_mounted(&home), "the home is the mount point by default");
    let out = script("skillfs-mount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("already mounted"));
    std::fs::write(root.join("x.md"), "x").unwrap();
    std::fs::write(home.join("config.yaml"), "c").unwrap();
    assert!(
        s.dir.join(".skillfs/hermes/journal").is_dir(),
        "default store beside the home, outside the mount"
    );
    let out = script("skillfs-umount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!is_mounted(&home));
    let out = script("skillfs-umount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not mounted"));
    assert_eq!(std::fs::read(root.join("x.md")).unwrap(), b"x");
    assert_eq!(std::fs::read(home.join("config.yaml")).unwrap(), b"c");
}

/// `--skills-only` mounts the skills directory alone (other agents keep
/// theirs in one directory); the default mount afterwards unmounts it and
/// mounts the home, the store carried over with every id.
#[test]
fn a_skills_only_mount_gives_way_to_the_home() {
    let s = Scratch::new("skillsonly");
    let home = s.dir.join("hermes");
    let root = home.join("skills");
    let _guard = Detach(root.clone());
    let _guard2 = Detach(home.clone());
    let out = script_args("skillfs-mount", &home, &["--skills-only"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(is_mounted(&root) && !is_mounted(&home));
    assert!(home.join(".skillfs/skills/journal").is_dir());
    std::fs::write(root.join("kept.md"), "v1").unwrap();
    std::fs::write(root.join("kept.md"), "v2").unwrap();
    let out = script("skillfs-mount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(is_mounted(&home) && !is_mounted(&root));
    common::assert_enoent(home.join(".skillfs"));
    let v1 = std::fs::read_dir(root.join(".history"))
        .unwrap()
        .map(|e| e.unwrap().path().join("kept.md"))
        .filter(|p| std::fs::read(p).is_ok_and(|b| b == b"v1"))
        .count();
    assert!(v1 >= 1, "the first version is still in .history");
    let out = script("skillfs-umount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!is_mounted(&home));
}

/// The daemon killed: the mount script (run again, as a login or a unit
/// would) detaches the dead mount and mounts again, without a person; so
/// does the systemd unit's ExecStartPre line, run here by `sh` as systemd
/// would (this machine runs no systemd).
#[test]
fn a_dead_mount_is_detached_and_mounted_again() {
    let s = Scratch::new("deadmount");
    let home = s.dir.join("hermes");
    let root = home.join("skills");
    let store = s.dir.join(".skillfs/hermes");
    let _guard = Detach(home.clone());
    let out = script("skillfs-mount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    std::fs::write(root.join("kept.md"), "kept").unwrap();
    for round in 0..2 {
        let pid = common::daemon_pid(&store).expect("the daemon's pid in LOCK");
        // SAFETY: kill takes plain integers; `pid` is the daemon this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        common::wait_unlocked(&store);
        // (A name never looked up: the kernel must ask the daemon.) The
        // kernel takes a few milliseconds after the daemon's files close to
        // abort the connection: meanwhile a call fails with ECONNABORTED,
        // or over io_uring ECANCELED (the ring's commands cancelled), and
        // from then on with ENOTCONN.
        let probe = root.join(format!("probe{round}"));
        let t = std::time::Instant::now();
        let errno = loop {
            let e = std::fs::write(&probe, "p").unwrap_err().raw_os_error();
            if e != Some(libc::ECONNABORTED) && e != Some(libc::ECANCELED)
                || t.elapsed() > std::time::Duration::from_secs(5)
            {
                break e;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(
            errno,
            Some(libc::ENOTCONN),
            "round {round}: the mount is dead"
        );
        if round == 0 {
            let out = script("skillfs-mount", &home);
            assert!(out.status.success(), "round 0: {}", describe(&out));
            assert!(String::from_utf8_lossy(&out.stderr).contains("dead mount"));
        } else {
            let unit = std::fs::read_to_string(format!(
                "{}/mount-scripts/skillfs.service",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            let out = unit_line(&unit, "ExecStartPre", &home);
            assert!(
                out.status.success(),
                "round 1, ExecStartPre: {}",
                describe(&out)
            );
            assert!(!is_mounted(&home), "ExecStartPre left the dead mount");
            let out = unit_line(&unit, "ExecStart", &home);
            assert!(
                out.status.success(),
                "round 1, ExecStart: {}",
                describe(&out)
            );
        }
        assert!(is_mounted(&home));
        assert_eq!(
            std::fs::read(root.join("kept.md")).unwrap(),
            b"kept",
            "round {round}"
        );
    }
    let out = script("skillfs-umount", &home);
    assert!(out.status.success(), "{}", describe(&out));
}

/// Under `Type=notify` the daemon says READY=1 once mounted (and its pid),
/// and STOPPING=1 when it unmounts, on `$NOTIFY_SOCKET`.
#[test]
fn the_daemon_tells_the_service_manager_when_it_is_ready() {
    let s = Scratch::new("notify");
    let root = s.root();
    let _guard = Detach(root.clone());
    let sock_path = s.dir.join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut child = Command::new(common::BIN)
        .arg("mount")
        .arg(&root)
        .arg("--foreground")
        .env("NOTIFY_SOCKET", &sock_path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1 within 30 s");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.contains("READY=1"), "{msg:?}");
    assert!(msg.contains(&format!("MAINPID={}", child.id())), "{msg:?}");
    // Ready means mounted: the mount answers.
    assert!(is_mounted(&root));
    std::fs::write(root.join("a.md"), "a").unwrap();
    let out = Command::new(common::BIN)
        .arg("umount")
        .arg(&root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let n = sock.recv(&mut buf).expect("STOPPING=1 within 30 s");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert!(child.wait().unwrap().success());
}

#[test]
fn setup_without_rust_says_how_to_get_it() {
    // A PATH with the shell's tools and no cargo.
    let out = Command::new("bash")
        .arg("scripts/setup-and-mount.sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent-home")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs Rust 1.") && err.contains("rustup") && err.contains("sh.rustup.rs"),
        "{err}"
    );
    assert!(!err.contains("command not found"), "{err}");
}

/// After an update (another build installed), the mount script run again
/// restarts the daemon on the new binary (the mount is quiet), and says
/// so; run again, or after the same build is installed again, it leaves
/// it alone.
#[test]
fn the_mount_script_restarts_a_daemon_of_an_older_binary() {
    let s = Scratch::new("restart");
    let home = s.dir.join("hermes");
    let bin_dir = s.dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let bin = bin_dir.join("skillfs");
    std::fs::copy(common::BIN, &bin).unwrap();
    let _guard = Detach(home.clone());
    let run = || {
        Command::new(format!(
            "{}/mount-scripts/skillfs-mount",
            env!("CARGO_MANIFEST_DIR")
        ))
        .env("HERMES_HOME", &home)
        .env("SKILLFS_BIN", &bin)
        .output()
        .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{}", describe(&out));
    let store = s.dir.join(".skillfs/hermes");
    let first = common::daemon_pid(&store).unwrap();
    std::fs::write(home.join("skills/kept.md"), "kept").unwrap();
    // The same build installed again (a new file, the same bytes): no
    // restart.
    std::fs::remove_file(&bin).unwrap();
    std::fs::copy(common::BIN, &bin).unwrap();
    let out = run();
    assert!(String::from_utf8_lossy(&out.stdout).contains("already mounted"));
    assert_eq!(common::daemon_pid(&store).unwrap(), first);
    // The update: another build at the installed path (one byte past the
    // ELF's end: it runs the same).
    std::fs::remove_file(&bin).unwrap();
    let mut bytes = std::fs::read(common::BIN).unwrap();
    bytes.push(0);
    std::fs::write(&bin, bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("older skillfs"),
        "{}",
        describe(&out)
    );
    let second = common::daemon_pid(&store).unwrap();
    assert_ne!(first, second, "a new daemon");
    assert!(is_mounted(&home));
    assert_eq!(std::fs::read(home.join("skills/kept.md")).unwrap(), b"kept");
    let out = run();
    assert!(String::from_utf8_lossy(&out.stdout).contains("already mounted"));
    assert_eq!(common::daemon_pid(&store).unwrap(), second);
    let out = Command::new(&bin)
        .arg("umount")
        .arg(&home)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
}

/// Runs `cmd`, killed if it outlives `limit` (a hung mount fails the test).
fn run_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} did not end within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// mount(8)'s helper, as `mount -t fuse.skillfs SOURCE DIR -o OPTS` runs it.
fn helper(source: &str, dir: &Path, opts: &[&str]) -> Output {
    run_within(
        Command::new(format!(
            "{}/mount-scripts/mount.fuse.skillfs",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(source)
        .arg(dir)
        .args(opts)
        .env("SKILLFS_BIN", common::BIN),
        std::time::Duration::from_secs(60),
    )
}

/// The plain unmount mount(8)'s users make: `umount DIR` as root, else
/// `fusermount3 -u DIR` (no `skillfs umount`).
fn plain_umount(dir: &Path) {
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        Command::new("umount")
    } else {
        let mut c = Command::new("fusermount3");
        c.arg("-u");
        c
    };
    let out = run_within(cmd.arg(dir), std::time::Duration::from_secs(30));
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn the_mount_helper_mounts_a_store_and_a_plain_umount_ends_it() {
    let s = Scratch::new("mount-helper");
    let dir = s.dir.join("test");
    let store = s.dir.join("store");
    std::fs::create_dir(&dir).unwrap();
    let _guard = Detach(dir.clone());
    let source = format!("skillfs:{}", store.display());
    // Over and over as xfstests' cycle mounts do: each mount right after a
    // plain unmount that returned before the daemon had finished.
    for round in 0..3 {
        let out = helper(&source, &dir, &["-o", "rw,nosuid,nodev"]);
        assert!(out.status.success(), "round {round}: {}", describe(&out));
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            mountinfo
                .lines()
                .any(|l| l.contains(&format!(" {} ", dir.display()))
                    && l.contains(&format!(" {source} "))),
            "the mount's source is the helper's SOURCE, as findmnt -S needs:\n{mountinfo}"
        );
        // Enough bytes that the daemon is still publishing when umount
        // returns. Written by a process of its own: a file this test's
        // process held open would be closed again (a version of what it
        // held so far) by the exec of a child another test forks meanwhile.
        let name = format!("f{round}");
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys; open(sys.argv[1], 'wb').write(bytes([int(sys.argv[2])]) * (24 << 20))",
            ])
            .arg(dir.join(&name))
            .arg(round.to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", describe(&out));
        plain_umount(&dir);
        assert!(!is_mounted(&dir));
    }
    common::wait_unlocked(&store);
    for round in 0..3u8 {
        let name = format!("f{round}");
        assert_eq!(
            std::fs::read(dir.join(&name)).unwrap(),
            vec![round; 24 << 20]
        );
    }
    let log = common::skillfs(&[
        "log",
        "--all",
        "--store",
        store.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    assert!(log.status.success(), "{}", describe(&log));
    let text = String::from_utf8_lossy(&log.stdout);
    let ops: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().skip(2).take(2).collect())
        .collect();
    let expected: Vec<Vec<String>> = (0..3)
        .flat_map(|r| {
            [
                vec!["create".into(), format!("f{r}")],
                vec!["write".into(), format!("f{r}")],
            ]
        })
        .collect();
    assert_eq!(
        ops, expected,
        "each file versioned through the mount, none found by a later scan:\n{text}"
    );
    // What skillfs cannot honour is refused, and nothing is mounted.
    for (source, opts) in [
        (source.as_str(), &["-o", "ro"][..]),
        (source.as_str(), &["-o", "remount"][..]),
        ("/dev/sda1", &[][..]),
        ("skillfs:relative/store", &[][..]),
    ] {
        let out = helper(source, &dir, opts);
        assert_eq!(
            out.status.code(),
            Some(32),
            "{source} {opts:?}: {}",
            describe(&out)
        );
        assert!(!is_mounted(&dir));
    }
}
