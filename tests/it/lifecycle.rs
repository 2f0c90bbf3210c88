//! The mount's own life never steps outside "every write is a version":
//! a busy unmount changes nothing (exit 9, the holders named), a stopping
//! daemon keeps serving until its mount is quiet, `skillfs mount` recovers
//! a dead mount, an upgrade restarts the daemon only when its mount is
//! quiet (a running writer loses nothing), and a home remembers what it
//! versions. Mounts are made in the background, as a user makes them.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    BIN, Mount, Scratch, assert_refused, daemon_pid, describe, is_mounted, pid_alive, skillfs,
};

/// A process whose working directory is `dir` (what a shell `cd`ed into a
/// skill is), killed when dropped.
struct Holder(Child);

impl Holder {
    fn cwd(dir: &Path) -> Holder {
        Holder(
            Command::new("sleep")
                .arg("120")
                .current_dir(dir)
                .stdin(Stdio::null())
                .spawn()
                .expect("sleep runs"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The paths `log --json` names, with their ops.
fn logged(m: &Mount) -> Vec<(String, String)> {
    m.log()
        .into_iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap_or_default().to_string(),
                r["op"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_busy_unmount_changes_nothing_and_names_who_holds_it() {
    let mut m = Mount::new("busyumount");
    fs::create_dir_all(m.path("cat/s")).unwrap();
    fs::write(m.path("cat/s/SKILL.md"), "v1").unwrap();
    let shell = Holder::cwd(&m.path("cat/s"));
    let open = fs::File::open(m.path("cat/s/SKILL.md")).unwrap();
    let mp = m.mount_point().display().to_string();
    let out = skillfs(&["umount", &mp, "--timeout", "3"]);
    assert_refused(
        &out,
        9,
        &[
            "busy",
            &format!("pid {} (sleep: cwd)", shell.pid()),
            "--lazy",
        ],
    );
    assert!(
        stderr(&out).contains(&format!("pid {} (", std::process::id())),
        "the test's own open file is named too:\n{}",
        describe(&out)
    );
    // The daemon's descriptors of the directory underneath read as paths
    // inside the mount: it is never named.
    assert!(
        !stderr(&out).contains(&format!("pid {} (", m.pid)),
        "the daemon is named as a holder:\n{}",
        describe(&out)
    );
    // Still mounted, still the same daemon, and a write made now is a
    // version (the old unmount had detached it: the write went to the
    // plain directory, unversioned).
    assert!(is_mounted(&m.mount_point()));
    assert!(pid_alive(m.pid));
    fs::write(m.path("cat/s/after.md"), "written while busy").unwrap();
    assert!(
        logged(&m).contains(&("cat/s/after.md".to_string(), "write".to_string())),
        "{:?}",
        logged(&m)
    );
    // Once they are gone, the same command unmounts.
    drop(open);
    drop(shell);
    m.umount();
}

#[test]
fn a_lazy_unmount_detaches_at_once_and_says_what_it_opens() {
    let m = Mount::new("lazyumount");
    fs::create_dir_all(m.path("cat")).unwrap();
    let shell = Holder::cwd(&m.path("cat"));
    let mp = m.mount_point().display().to_string();
    let out = skillfs(&["umount", "--lazy", &mp]);
    assert!(out.status.success(), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("unversioned") && said.contains(&format!("pid {}", shell.pid())),
        "{said}"
    );
    assert!(!is_mounted(&m.mount_point()));
    // The daemon serves the holder until it leaves, then ends.
    assert!(pid_alive(m.pid));
    drop(shell);
    wait_until("the daemon ends", Duration::from_secs(10), || {
        !pid_alive(m.pid)
    });
}

#[test]
fn a_stopping_daemon_serves_until_its_mount_is_quiet() {
    let m = Mount::new("sigterm");
    fs::create_dir_all(m.path("cat")).unwrap();
    let shell = Holder::cwd(&m.path("cat"));
    unsafe { libc::kill(m.pid as i32, libc::SIGTERM) };
    // Well past the daemon's first try: still mounted, every write by
    // path still a version.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(is_mounted(&m.mount_point()), "a busy mount was detached");
    fs::write(m.path("cat/late.md"), "after SIGTERM").unwrap();
    assert!(logged(&m).contains(&("cat/late.md".to_string(), "write".to_string())));
    let log = fs::read_to_string(m.store().join("daemon.log")).unwrap();
    assert!(
        log.contains(&format!("pid {} (sleep: cwd)", shell.pid())),
        "the log names the holder:\n{log}"
    );
    drop(shell);
    wait_until(
        "the daemon unmounts once quiet",
        Duration::from_secs(10),
        || !is_mounted(&m.mount_point()) && !pid_alive(m.pid),
    );
}

/// `skillfs mount` over the dead mount of `m` (daemon killed, mount left
/// attached) recovers it with the same arguments a user gave first.
fn recover(m: &mut Mount, args: &[&str]) {
    fs::write(m.path("before.md"), "acknowledged").unwrap();
    m.kill_daemon();
    assert!(
        is_mounted(&m.mount_point()),
        "the dead mount stays attached"
    );
    // ENOTCONN (over io_uring first ECANCELED or ECONNABORTED: the
    // transport's documented sequence).
    let dead = fs::metadata(m.path("before.md")).map_err(|e| e.raw_os_error());
    assert!(
        matches!(
            dead,
            Err(Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED))
        ),
        "{dead:?}"
    );
    let mp = m.mount_point().display().to_string();
    let mut argv = vec!["mount", mp.as_str()];
    argv.extend_from_slice(args);
    let out = skillfs(&argv);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stderr(&out).contains("dead mount"), "{}", describe(&out));
    assert_eq!(
        stderr(&out).lines().count(),
        1,
        "one line: {}",
        describe(&out)
    );
    m.pid = daemon_pid(&m.store()).unwrap();
    assert!(pid_alive(m.pid));
    assert_eq!(
        fs::read_to_string(m.path("before.md")).unwrap(),
        "acknowledged"
    );
    fs::write(m.path("after.md"), "versioned again").unwrap();
    assert!(logged(m).contains(&("after.md".to_string(), "write".to_string())));
    let root = m.root().display().to_string();
    let out = skillfs(&["verify", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn mount_recovers_a_dead_mount_of_a_skills_directory() {
    let mut m = Mount::over(Scratch::at(&std::env::temp_dir(), "deadskills"), vec![]);
    let home = m.scratch.home;
    recover(
        &mut m,
        if home {
            &["--versioned", "skills"]
        } else {
            &[]
        },
    );
    m.umount();
}

#[test]
fn mount_recovers_a_dead_mount_of_a_home_without_being_told_what_it_versions() {
    let mut m = Mount::over(Scratch::home("deadhome"), vec![]);
    // No --versioned: the store remembers `skills`.
    recover(&mut m, &[]);
    m.umount();
}

#[test]
fn a_dead_mount_of_a_damaged_store_is_left_as_it_is() {
    let mut m = Mount::new("deaddamaged");
    // fsynced: later records vouch for the earlier ones, so a bad one is
    // damage, not a torn tail.
    for i in 0..5 {
        let mut f = fs::File::create(m.path(&format!("f{i}.md"))).unwrap();
        std::io::Write::write_all(&mut f, b"a").unwrap();
        f.sync_all().unwrap();
    }
    m.kill_daemon();
    let seg = fs::read_dir(m.store().join("journal"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .expect("a journal segment");
    let mut text = fs::read(&seg).unwrap();
    // The first record made garbage, many after it: a damaged journal
    // (not a torn tail).
    let at = 5;
    text[at] ^= 0x55;
    fs::write(&seg, &text).unwrap();
    let mp = m.mount_point().display().to_string();
    let out = skillfs(&["mount", &mp]);
    assert!(!out.status.success(), "{}", describe(&out));
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    assert!(is_mounted(&m.mount_point()), "the dead mount was detached");
    m.detach();
}

#[test]
fn a_home_remembers_what_it_versions() {
    let s = Scratch::home("remember");
    let home = s.mount_point();
    fs::write(home.join("config.yaml"), "model: x").unwrap();
    let mut m = Mount::over(s, vec![]);
    fs::create_dir_all(m.path("cat/s")).unwrap();
    fs::write(m.path("cat/s/SKILL.md"), "skill").unwrap();
    m.umount();
    let before = m.log().len();
    // Mounted again without --versioned: as before, nothing recorded removed.
    let h = home.display().to_string();
    let out = skillfs(&["mount", &h]);
    assert!(out.status.success(), "{}", describe(&out));
    m.pid = daemon_pid(&m.store()).unwrap();
    fs::write(home.join("config.yaml"), "model: y").unwrap();
    fs::write(m.path("cat/s/SKILL.md"), "skill v2").unwrap();
    let log = m.log();
    let new: Vec<_> = log[before..]
        .iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap_or("").to_string(),
                r["path"].clone(),
            )
        })
        .collect();
    assert!(
        new.iter().all(|(op, _)| !op.contains("remove")),
        "a skill recorded removed: {new:?}"
    );
    assert!(
        new.iter()
            .any(|(op, p)| op == "write" && p == "cat/s/SKILL.md"),
        "{new:?}"
    );
    assert!(
        !new.iter()
            .any(|(_, p)| p.as_str().is_some_and(|p| p.contains("config"))),
        "the home's own files are not versioned: {new:?}"
    );
    m.umount();
    // A wrong name is refused with what to type, never a file to delete.
    let out = skillfs(&["mount", &h, "--versioned", "other"]);
    assert_refused(&out, 4, &["--versioned skills"]);
    assert!(!stderr(&out).contains("remove"), "{}", describe(&out));
    assert!(!is_mounted(&home));
    common::assert_enoent(home.join("other"));
}

/// A copy of the binary that differs from it by one byte past its end (an
/// ELF runs the same with it): "a newer build".
fn another_build(dir: &Path, name: &str, tail: u8) -> PathBuf {
    let p = dir.join(name);
    let mut bytes = fs::read(BIN).unwrap();
    bytes.push(tail);
    fs::write(&p, bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env_remove("HERMES_HOME")
        .output()
        .unwrap()
}

#[test]
fn an_upgrade_restarts_the_daemon_only_when_quiet_and_a_writer_loses_nothing() {
    let s = Scratch::new("upgrade");
    let bins = s.dir.join("bin");
    fs::create_dir_all(&bins).unwrap();
    let old = another_build(&bins, "skillfs-old", 1);
    let new = another_build(&bins, "skillfs-new", 2);
    let root = s.root();
    let r = root.display().to_string();
    let out = run(&old, &["mount", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    // The harness's guard (deadline, cleanup) over the running mount.
    let mut m = Mount::adopt(s);
    let old_pid = m.pid;
    fs::create_dir_all(m.path("cat/s")).unwrap();

    // A writer throughout: one file held open and appended to (the mount
    // is busy while it is open), and files written whole by path.
    let stop = Arc::new(AtomicBool::new(false));
    let held_open = Arc::new(AtomicBool::new(true));
    let writer = {
        let (stop, held_open, root) = (Arc::clone(&stop), Arc::clone(&held_open), root.clone());
        std::thread::spawn(move || {
            let mut acknowledged: Vec<(String, String)> = Vec::new();
            let mut i = 0u32;
            let mut held = Some(fs::File::create(root.join("cat/s/held.md")).unwrap());
            while !stop.load(Ordering::SeqCst) {
                if !held_open.load(Ordering::SeqCst) {
                    held = None;
                }
                if let Some(f) = held.as_mut() {
                    use std::io::Write;
                    f.write_all(format!("line {i}\n").as_bytes()).unwrap();
                }
                let name = format!("cat/s/w{}.md", i % 7);
                let body = format!("version {i}");
                match fs::write(root.join(&name), &body) {
                    Ok(()) => acknowledged.push((name, body)),
                    Err(e) => panic!("a write failed during the upgrade: {e}"),
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            acknowledged
        })
    };
    std::thread::sleep(Duration::from_millis(300));

    // The new build over the busy mount: the older daemon keeps serving.
    let out = run(&new, &["mount", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        stderr(&out).contains("stays served by an older skillfs daemon"),
        "{}",
        describe(&out)
    );
    assert!(is_mounted(&root) && pid_alive(old_pid));
    assert_eq!(daemon_pid(&m.store()), Some(old_pid));
    let out = run(&new, &["status", "--root", &r]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("runs an older skillfs"),
        "{}",
        describe(&out)
    );

    // With --wait it takes over once the held file is closed.
    let waiter = {
        let (new, r) = (new.clone(), r.clone());
        std::thread::spawn(move || run(&new, &["mount", "--wait", &r]))
    };
    std::thread::sleep(Duration::from_millis(500));
    assert!(pid_alive(old_pid), "restarted while a file was open");
    held_open.store(false, Ordering::SeqCst);
    let out = waiter.join().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    wait_until("the new daemon serves", Duration::from_secs(20), || {
        daemon_pid(&m.store()).is_some_and(|p| p != old_pid && pid_alive(p))
    });
    m.pid = daemon_pid(&m.store()).unwrap();
    assert!(!pid_alive(old_pid));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let acknowledged = writer.join().unwrap();
    assert!(
        acknowledged.len() > 20,
        "the writer ran: {}",
        acknowledged.len()
    );
    let out = run(&new, &["status", "--root", &r]);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("older"),
        "{}",
        describe(&out)
    );
    // Every file's last acknowledged content is live and in history, and
    // what was written to the held file is in history whole.
    let mut last = std::collections::BTreeMap::new();
    for (name, body) in acknowledged {
        last.insert(name, body);
    }
    for (name, body) in &last {
        assert_eq!(&fs::read_to_string(root.join(name)).unwrap(), body);
        assert_eq!(
            &fs::read_to_string(root.join(".history/latest").join(name)).unwrap(),
            body,
            "{name} in history"
        );
    }
    let held = fs::read_to_string(root.join("cat/s/held.md")).unwrap();
    assert_eq!(
        fs::read_to_string(root.join(".history/latest/cat/s/held.md")).unwrap(),
        held
    );
    let out = skillfs(&["verify", "--full", "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    m.umount();
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// A bind mount of the mount, or a private copy of it in another mount
/// namespace, would keep the daemon serving after an unmount here while
/// writes by path here went to the plain directory: busy, nothing changed.
#[test]
fn a_mount_also_mounted_elsewhere_is_busy() {
    // A private mount namespace copies every mount there is, the other
    // tests' too, and `umount` rightly calls a mount with such a copy
    // busy: this test has the machine alone.
    let _ns = common::alone();
    if !is_root() {
        eprintln!("a bind mount and a mount namespace need root: not run");
        return;
    }
    let mut m = Mount::new("elsewhere");
    fs::create_dir_all(m.path("cat")).unwrap();
    let mp = m.mount_point().display().to_string();
    {
        let _bind = common::BindMount::new(&m.mount_point(), &m.scratch.dir.join("bind"));
        let out = skillfs(&["umount", &mp]);
        assert_refused(&out, 9, &["the bind mount at"]);
        assert!(is_mounted(&m.mount_point()));
    }
    // A private copy in another mount namespace (what a container or a
    // sandboxed service started now would hold).
    let mut ns = Holder(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sleep", "120"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare runs"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let out = skillfs(&["umount", &mp]);
    assert_refused(&out, 9, &["mount namespace of pid"]);
    assert!(is_mounted(&m.mount_point()));
    fs::write(m.path("cat/still.md"), "versioned").unwrap();
    assert!(logged(&m).contains(&("cat/still.md".to_string(), "write".to_string())));
    let _ = ns.0.kill();
    let _ = ns.0.wait();
    m.umount();
}

/// Only a lock taken proves a daemon dead: with the store's LOCK gone, a
/// live mount is neither detached nor served twice.
#[test]
fn a_live_mount_whose_lock_cannot_be_read_is_never_taken_for_dead() {
    let mut m = Mount::new("nolock");
    fs::write(m.path("a.md"), "a").unwrap();
    let held = fs::File::open(m.path("a.md")).unwrap();
    fs::remove_file(m.store().join("LOCK")).unwrap();
    let mp = m.mount_point().display().to_string();
    let out = skillfs(&["mount", &mp]);
    assert_refused(&out, 4, &["cannot tell whether a daemon serves", "LOCK"]);
    assert!(is_mounted(&m.mount_point()) && pid_alive(m.pid));
    // umount does not detach it as "dead": a quiet unmount, refused busy.
    let out = skillfs(&["umount", &mp]);
    assert_eq!(out.status.code(), Some(9), "{}", describe(&out));
    drop(held);
    let out = skillfs(&["umount", &mp]);
    assert!(out.status.success(), "{}", describe(&out));
    wait_until("the daemon ends", Duration::from_secs(10), || {
        !pid_alive(m.pid)
    });
    m.remount();
    m.umount();
}

/// A daemon told to stop after its mount was detached elsewhere stops
/// trying, and never unmounts what is mounted at ROOT since.
#[test]
fn a_stopping_daemon_never_unmounts_what_is_mounted_at_root_since() {
    if !is_root() {
        eprintln!("mounting a tmpfs needs root: not run");
        return;
    }
    let m = Mount::new("sigtermtmpfs");
    fs::create_dir_all(m.path("cat")).unwrap();
    let shell = Holder::cwd(&m.path("cat"));
    let mp = m.mount_point().display().to_string();
    let out = skillfs(&["umount", "--lazy", &mp]);
    assert!(out.status.success(), "{}", describe(&out));
    unsafe { libc::kill(m.pid as i32, libc::SIGTERM) };
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "other", &mp])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    std::thread::sleep(Duration::from_millis(2500));
    let tmpfs_there = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(&format!(" {mp} ")) && l.contains(" - tmpfs other "));
    let _ = Command::new("umount").arg(&mp).output();
    drop(shell);
    assert!(
        tmpfs_there,
        "the daemon unmounted the tmpfs mounted at ROOT since"
    );
    wait_until("the daemon ends", Duration::from_secs(10), || {
        !pid_alive(m.pid)
    });
}

/// A build not older than the running daemon's never restarts it: two
/// installed binaries do not swap the daemon back and forth.
#[test]
fn an_older_build_never_restarts_a_newer_daemon() {
    let s = Scratch::new("downgrade");
    let bins = s.dir.join("bin");
    fs::create_dir_all(&bins).unwrap();
    let old = another_build(&bins, "skillfs-old", 1);
    std::thread::sleep(Duration::from_millis(20));
    let new = another_build(&bins, "skillfs-new", 2);
    let r = s.root().display().to_string();
    let out = run(&new, &["mount", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    let mut m = Mount::adopt(s);
    let out = run(&old, &["mount", &r]);
    assert_refused(&out, 3, &["already mounted"]);
    assert_eq!(daemon_pid(&m.store()), Some(m.pid));
    let out = run(&old, &["status", "--root", &r]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("not older than this one"),
        "{}",
        describe(&out)
    );
    m.umount();
}
