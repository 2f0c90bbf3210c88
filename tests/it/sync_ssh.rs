//! Skills across machines over a real `sshd`: three replicas (three
//! stores, three mounts) push to one bare repository served over SSH on
//! 127.0.0.1 with keys made for the test, and to a plain path remote;
//! each fetches the other two; a remote that stops answering fails a sync
//! with exit 10 and loses nothing: the next sync pushes what was missed.
//! (The merge itself is tests/it/sync_merge.rs's.)

use crate::common;

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, Scratch, assert_refused, describe};

/// An `sshd` of the test's own on 127.0.0.1, with its own host key and
/// one authorized client key; killed when dropped.
struct Sshd {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run");
    assert!(out.status.success(), "{cmd:?}: {}", describe(&out));
    out
}

impl Sshd {
    fn new(dir: &Path) -> Sshd {
        fs::create_dir_all(dir).unwrap();
        for key in ["host_key", "client_key"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key)));
        }
        fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).unwrap();
        // A free port: bound, then let go for sshd to take.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        fs::write(
            dir.join("sshd_config"),
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPidFile none\nStrictModes no\n\
                 UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\n",
                d = dir.display()
            ),
        )
        .unwrap();
        // (As root sshd wants /run/sshd, which scripts/test-machine.sh
        // makes where the ssh service did not.)
        let mut s = Sshd {
            child: None,
            port,
            dir: dir.to_path_buf(),
        };
        s.start();
        s
    }

    fn start(&mut self) {
        let log = fs::File::create(self.dir.join("sshd.log")).unwrap();
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(self.dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start /usr/sbin/sshd (scripts/test-machine.sh installs openssh-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd did not listen in 10 s: {}",
                fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self, repo: &Path) -> String {
        let user = String::from_utf8(run(Command::new("id").arg("-un")).stdout).unwrap();
        format!(
            "ssh://{}@127.0.0.1:{}{}",
            user.trim(),
            self.port,
            repo.display()
        )
    }

    /// The ssh a user would set for this server: the test's key, its host
    /// key not checked (made a moment ago).
    fn ssh_command(&self) -> String {
        format!(
            "ssh -i {}/client_key -o IdentitiesOnly=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR",
            self.dir.display()
        )
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = run(Command::new("git").arg("--git-dir").arg(dir).args(args));
    String::from_utf8(out.stdout).unwrap()
}

fn bare(path: &Path) -> PathBuf {
    run(Command::new("git")
        .args(["init", "--bare", "--quiet"])
        .arg(path));
    path.to_path_buf()
}

fn skillfs_ssh(sshd: &Sshd, args: &[&str]) -> Output {
    Command::new(common::BIN)
        .args(args)
        .env_remove("HERMES_HOME")
        .env("GIT_SSH_COMMAND", sshd.ssh_command())
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", describe(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The newest change id of `branch` in `remote`, from its trailers.
fn tip_id(remote: &Path, branch: &str) -> Option<u64> {
    git(
        remote,
        &[
            "log",
            "-1",
            "--format=%(trailers:key=skillfs-id,valueonly)",
            branch,
        ],
    )
    .trim()
    .parse()
    .ok()
}

fn newest_id(m: &Mount) -> u64 {
    m.log()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .max()
        .unwrap()
}

fn replica(m: &Mount) -> String {
    fs::read_to_string(m.store().join("REPLICA"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn three_replicas_push_and_fetch_over_a_real_sshd_and_a_path() {
    let top = Scratch::new("sync-ssh");
    let base = top.root().parent().unwrap().to_path_buf();
    let mut sshd = Sshd::new(&base.join("sshd"));
    let over_ssh = bare(&base.join("skills.git"));
    let on_path = bare(&base.join("path.git"));
    let url = sshd.url(&over_ssh);
    let mounts: Vec<Mount> = ["ssh-a", "ssh-b", "ssh-c"].map(Mount::new).into();
    // The newest change of each replica when it pushed (its merge of the
    // others comes after the push, and goes with its next one).
    let mut pushed = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let r = m.root().display().to_string();
        ok(&skillfs_ssh(
            &sshd,
            &["remote", "add", "origin", &url, "--root", &r],
        ));
        ok(&skillfs_ssh(
            &sshd,
            &[
                "remote",
                "add",
                "disk",
                on_path.to_str().unwrap(),
                "--root",
                &r,
            ],
        ));
        fs::create_dir_all(m.path("social/greet")).unwrap();
        fs::write(
            m.path("social/greet/SKILL.md"),
            format!("Say hi from {i}.\n"),
        )
        .unwrap();
        fs::write(m.path(&format!("own{i}.md")), "mine\n").unwrap();
        pushed.push(newest_id(m));
        ok(&skillfs_ssh(&sshd, &["sync", "--root", &r]));
    }
    // Each replica's ref on both remotes ends at its newest change then.
    for (m, at) in mounts.iter().zip(&pushed) {
        let branch = format!("refs/heads/skillfs/{}", replica(m));
        for remote in [&over_ssh, &on_path] {
            assert_eq!(tip_id(remote, &branch), Some(*at), "{branch}");
        }
    }
    // And each has what the ones before it pushed, merged in.
    assert_eq!(
        fs::read_to_string(mounts[2].path("own0.md")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        fs::read_to_string(mounts[2].path("own1.md")).unwrap(),
        "mine\n"
    );
    // The first replica, synced again, holds the other two.
    let a = mounts[0].root().display().to_string();
    let said = ok(&skillfs_ssh(&sshd, &["sync", "origin", "--root", &a]));
    assert!(said.contains("fetched 2 other replicas"), "{said}");
    let repo = mounts[0].store().join("sync/repo.git");
    let refs = git(&repo, &["for-each-ref", "--format=%(refname)"]);
    for m in &mounts[1..] {
        assert!(refs.contains(&replica(m)), "{refs}");
    }

    // The server stops answering: the sync fails with 10, names the
    // remote, and still pushes to the one it reaches.
    sshd.stop();
    fs::write(mounts[0].path("while-down.md"), "written while down\n").unwrap();
    let out = skillfs_ssh(&sshd, &["sync", "--root", &a]);
    assert_refused(&out, 10, &["origin"]);
    let branch = format!("refs/heads/skillfs/{}", replica(&mounts[0]));
    assert_eq!(tip_id(&on_path, &branch), Some(newest_id(&mounts[0])));
    assert_ne!(tip_id(&over_ssh, &branch), Some(newest_id(&mounts[0])));
    // Back: the next sync pushes what it missed.
    sshd.start();
    ok(&skillfs_ssh(&sshd, &["sync", "--root", &a]));
    assert_eq!(tip_id(&over_ssh, &branch), Some(newest_id(&mounts[0])));
    let out = skillfs_ssh(&sshd, &["verify", "--full", "--root", &a]);
    ok(&out);
}

/// A mount whose scheduled sync (every second, each git command bounded
/// by `timeout`) reaches its one remote through an ssh that never answers:
/// each run of it appends its pid to the returned file, then sleeps.
fn mount_with_a_hanging_ssh(tag: &str, timeout: &str) -> (Mount, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new(tag);
    fs::create_dir_all(s.store()).unwrap();
    fs::write(
        s.store().join("config.json"),
        format!(r#"{{"sync": {{"every": "1s", "timeout": "{timeout}"}}}}"#),
    )
    .unwrap();
    let dir = s.root().parent().unwrap().to_path_buf();
    let pids = dir.join("ssh-pids");
    let ssh = dir.join("hanging-ssh");
    fs::write(
        &ssh,
        format!(
            "#!/bin/sh\necho $$ >> '{}'\nexec sleep 600\n",
            pids.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&ssh, fs::Permissions::from_mode(0o755)).unwrap();
    let root = s.root().display().to_string();
    run(Command::new(common::BIN)
        .args(["mount", &root])
        .env("GIT_SSH_COMMAND", &ssh)
        .env_remove("HERMES_HOME"));
    let m = Mount::adopt(s);
    run(Command::new(common::BIN).args([
        "remote",
        "add",
        "origin",
        "ssh://127.0.0.1:9/nowhere.git",
        "--no-check",
        "--root",
        &root,
    ]));
    fs::write(m.path("greet.md"), "Say hi.\n").unwrap();
    (m, pids)
}

/// The pids the hanging ssh wrote, once it has run at least `n` times.
fn hanging_pids(pids: &Path, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: Vec<i32> = fs::read_to_string(pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "the scheduled sync never ran ssh"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
fn gone(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

fn until_gone(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !gone(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// A scheduled sync whose remote never answers is stopped at its
/// `timeout`, with everything its git started, said in `daemon.log`; the
/// next turn runs (the lock was let go), and the store is unharmed.
#[test]
fn a_scheduled_sync_that_hangs_is_stopped_at_its_timeout() {
    let (mut m, pids) = mount_with_a_hanging_ssh("synchang", "2s");
    let first = hanging_pids(&pids, 1)[0];
    assert!(
        until_gone(first, Duration::from_secs(20)),
        "the hanging ssh {first} outlived the sync's timeout"
    );
    // A later turn ran: the first one let go of sync/lock.
    hanging_pids(&pids, 2);
    let log = fs::read_to_string(m.store().join("daemon.log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("sync: git push with remote 'origin'")
                && l.contains("did not finish")
                && l.contains("longer than 2s")),
        "{log}"
    );
    m.umount();
    let root = m.root().display().to_string();
    run(Command::new(common::BIN).args(["verify", "--root", &root]));
}

/// A git of the scheduled sync that is still waiting on its remote when
/// the mount ends does not outlive the daemon.
#[test]
fn a_scheduled_sync_ends_with_its_mount() {
    let (mut m, pids) = mount_with_a_hanging_ssh("syncend", "10m");
    let hanging = hanging_pids(&pids, 1)[0];
    assert!(!gone(hanging));
    m.umount();
    assert!(
        until_gone(hanging, Duration::from_secs(10)),
        "the scheduled sync's ssh {hanging} outlived the unmount"
    );
}
