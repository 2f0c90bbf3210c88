//! Skills across machines, as built so far: `skillfs remote` and
//! `skillfs sync` against real git repositories (a bare repository on a
//! path as the remote), through real mounts. Every version is a commit on
//! the replica's own ref, a second sync only adds commits (a fast-forward),
//! two stores that share a replica id are refused without anything being
//! overwritten, the other replicas' refs are fetched, per-device files are
//! in no commit, and bad input is refused with its exit code.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{Mount, Scratch, assert_refused, describe, skillfs};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", describe(&out));
    String::from_utf8(out.stdout).unwrap()
}

fn bare(s: &Scratch) -> std::path::PathBuf {
    bare_at(s.root().parent().unwrap().join("remote.git"))
}

/// A bare repository made at `remote`.
fn bare_at(remote: std::path::PathBuf) -> std::path::PathBuf {
    common::bare_repo(&remote);
    remote
}

/// `skillfs remote add NAME URL --root ROOT`, which must succeed.
fn add_remote(root: &str, name: &str, url: &str) {
    let out = skillfs(&["remote", "add", name, url, "--root", root]);
    assert!(out.status.success(), "{}", describe(&out));
}

fn root_arg(m: &Mount) -> String {
    m.root().display().to_string()
}

fn replica(m: &Mount) -> String {
    fs::read_to_string(m.store().join("REPLICA"))
        .unwrap()
        .trim()
        .to_string()
}

/// The change ids `git log` shows on `branch`, newest first.
fn ids(remote: &Path, branch: &str) -> Vec<u64> {
    git(
        remote,
        &[
            "log",
            "--format=%(trailers:key=skillfs-id,valueonly)",
            branch,
        ],
    )
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(|l| l.trim().parse().unwrap())
    .collect()
}

fn last_id(m: &Mount) -> u64 {
    m.log()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .max()
        .unwrap()
}

#[test]
fn every_version_is_a_commit_on_the_replicas_own_ref_and_a_sync_only_adds() {
    let m = Mount::new("syncpush");
    let remote = bare(&m.scratch);
    fs::create_dir_all(m.path("cat/a")).unwrap();
    fs::write(m.path("cat/a/SKILL.md"), "---\nname: a\n---\none\n").unwrap();
    fs::write(m.path("cat/a/SKILL.md"), "---\nname: a\n---\ntwo\n").unwrap();
    // Per-device: never versioned, so in no commit.
    fs::write(m.path(".sync_state"), "head").unwrap();
    fs::write(m.path(".sync_device_id"), "host-abc123").unwrap();
    let out = skillfs(&[
        "remote",
        "add",
        "origin",
        remote.to_str().unwrap(),
        "--root",
        &root_arg(&m),
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = skillfs(&["sync", "--root", &root_arg(&m)]);
    assert!(out.status.success(), "{}", describe(&out));
    let id = replica(&m);
    assert_eq!(id.len(), 32);
    let branch = format!("refs/heads/skillfs/{id}");
    // The one ref this replica owns, and nothing else.
    assert_eq!(
        git(&remote, &["for-each-ref", "--format=%(refname)"]).trim(),
        branch
    );
    let first = ids(&remote, &branch);
    assert_eq!(
        first[0],
        last_id(&m),
        "the newest commit holds the newest change"
    );
    assert_eq!(first.len() as u64, last_id(&m), "one commit per change");
    let tree = git(&remote, &["ls-tree", "-r", "--name-only", &branch]);
    assert!(tree.contains("cat/a/SKILL.md"), "{tree}");
    assert!(
        !tree.contains(".sync_state") && !tree.contains(".sync_device_id"),
        "{tree}"
    );
    let old_tip = git(&remote, &["rev-parse", &branch]);

    fs::write(m.path("cat/a/SKILL.md"), "---\nname: a\n---\nthree\n").unwrap();
    let out = skillfs(&["sync", "origin", "--root", &root_arg(&m)]);
    assert!(out.status.success(), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("pushed changes"), "{said}");
    let now = ids(&remote, &branch);
    assert_eq!(now[0], last_id(&m));
    assert_eq!(
        &now[now.len() - first.len()..],
        &first[..],
        "the old commits kept"
    );
    let ff = Command::new("git")
        .arg("--git-dir")
        .arg(&remote)
        .args(["merge-base", "--is-ancestor", old_tip.trim(), &branch])
        .status()
        .unwrap();
    assert!(ff.success(), "the new tip descends from the old one");
    // Up to date: nothing new.
    let out = skillfs(&["sync", "--root", &root_arg(&m)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("up to date"),
        "{}",
        describe(&out)
    );
    // The store stays private (the audit at mount would repair it else).
    let mut stack = vec![m.store().join("sync")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            assert_eq!(
                md.permissions().mode() & 0o077,
                0,
                "{} is not private",
                p.display()
            );
            if md.is_dir() {
                stack.push(p);
            }
        }
    }
    let list = skillfs(&["remote", "list", "--root", &root_arg(&m)]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        text.starts_with("origin\t") && text.contains("synced"),
        "{text}"
    );
}

/// Two mounts, each with a file, and the bare repository both have as
/// their remote `hub`.
fn two_replicas(tag: &str) -> (Mount, Mount, std::path::PathBuf) {
    let a = Mount::new(&format!("{tag}A"));
    let b = Mount::new(&format!("{tag}B"));
    let remote = bare(&a.scratch);
    fs::write(a.path("x.md"), "from a").unwrap();
    fs::write(b.path("y.md"), "from b").unwrap();
    for m in [&a, &b] {
        let url = remote.to_str().unwrap();
        let out = skillfs(&["remote", "add", "hub", url, "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    (a, b, remote)
}

#[test]
fn two_stores_that_share_a_replica_id_are_refused_and_nothing_is_overwritten() {
    let (a, b, remote) = two_replicas("syncshare");
    let out = skillfs(&["sync", "--root", &root_arg(&a)]);
    assert!(out.status.success(), "{}", describe(&out));
    let id = replica(&a);
    let branch = format!("refs/heads/skillfs/{id}");
    let tip = git(&remote, &["rev-parse", &branch]);
    // b, a copy of a's store as far as its id goes.
    fs::write(b.store().join("REPLICA"), format!("{id}\n")).unwrap();
    let out = skillfs(&["sync", "--root", &root_arg(&b)]);
    assert_refused(
        &out,
        4,
        &["share the replica id", &id, "Nothing was overwritten"],
    );
    assert_eq!(
        git(&remote, &["rev-parse", &branch]),
        tip,
        "a's branch is a's"
    );
    let list = skillfs(&["remote", "list", "--root", &root_arg(&b)]);
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("failed"),
        "{}",
        describe(&list)
    );
}

#[test]
fn each_replica_fetches_the_others_refs() {
    let (a, b, remote) = two_replicas("syncsee");
    for m in [&a, &b] {
        let out = skillfs(&["sync", "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    let out = skillfs(&["sync", "--root", &root_arg(&a)]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("fetched 1 other replica"), "{said}");
    assert_ne!(replica(&a), replica(&b), "two stores, two replicas");
    let refs = git(&remote, &["for-each-ref", "--format=%(refname)"]);
    assert_eq!(refs.lines().count(), 2, "{refs}");
}

/// A git killed by SIGKILL (a whole process group stopped: a script's
/// Ctrl-C, the schedule's deadline) cannot remove its lock files; the
/// next sync, holding `sync/lock` when no process of the killed one is
/// left, removes them and fetches (it failed with "cannot lock ref").
#[test]
fn the_lock_files_of_a_killed_git_do_not_stop_the_next_sync() {
    let (a, b, remote) = two_replicas("syncstale");
    for m in [&a, &b] {
        let out = skillfs(&["sync", "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    fs::write(a.path("x.md"), "from a, again").unwrap();
    let out = skillfs(&["sync", "--root", &root_arg(&a)]);
    assert!(out.status.success(), "{}", describe(&out));
    let repo = b.store().join("sync").join("repo.git");
    let stale = [
        repo.join("refs/remotes/hub")
            .join(format!("{}.lock", replica(&a))),
        repo.join("packed-refs.lock"),
    ];
    for p in &stale {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, "").unwrap();
    }
    let out = skillfs(&["sync", "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    for p in &stale {
        common::assert_enoent(p);
    }
    let branch = format!("refs/heads/skillfs/{}", replica(&a));
    assert_eq!(
        git(
            &repo,
            &["rev-parse", &format!("refs/remotes/hub/{}", replica(&a))]
        ),
        git(&remote, &["rev-parse", &branch]),
        "b fetched a's newest commit"
    );
}

/// A push to a remote on a path runs git's receive-pack on this host, in
/// the sync's process group: a sync killed whole kills it holding the
/// lock of the replica's own ref there, and every later push failed with
/// "cannot lock ref" (found by the three-replica test, seed 33). The next
/// sync removes that lock when no process works in the remote; another
/// ref's lock there is not its own and stays.
#[test]
fn a_killed_push_to_a_path_remote_does_not_stop_the_next() {
    let (a, b, remote) = two_replicas("syncremotelock");
    for m in [&a, &b] {
        let out = skillfs(&["sync", "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    fs::write(a.path("x.md"), "from a, again").unwrap();
    let own = remote.join(format!("refs/heads/skillfs/{}.lock", replica(&a)));
    let other = remote.join(format!("refs/heads/skillfs/{}.lock", replica(&b)));
    for p in [&own, &other] {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, "").unwrap();
    }
    let out = skillfs(&["sync", "--root", &root_arg(&a)]);
    assert!(out.status.success(), "{}", describe(&out));
    common::assert_enoent(&own);
    assert!(other.exists(), "b's lock is b's");
    let branch = format!("refs/heads/skillfs/{}", replica(&a));
    assert_eq!(
        git(&remote, &["rev-parse", &branch]),
        git(&a.store().join("sync/repo.git"), &["rev-parse", &branch]),
        "a's newest commit was pushed"
    );
}

/// A sync killed inside its first `git init` left a `repo.git` holding
/// only a `config`, which every later sync refused as "neither a git
/// repository nor empty" (found by the three-replica test, seed 13). The
/// repository is now made beside and renamed into place, and one a build
/// before left half made, with nothing in it, is made again.
#[test]
fn a_sync_killed_in_its_first_git_init_does_not_stop_the_next() {
    let (a, _b, remote) = two_replicas("syncinit");
    let sync = a.store().join("sync");
    fs::create_dir_all(sync.join("repo.git")).unwrap();
    fs::write(
        sync.join("repo.git/config"),
        "[core]\n\trepositoryformatversion = 0\n",
    )
    .unwrap();
    fs::create_dir_all(sync.join(".repo.git.new/objects")).unwrap();
    let out = skillfs(&["sync", "--root", &root_arg(&a)]);
    assert!(out.status.success(), "{}", describe(&out));
    common::assert_enoent(sync.join(".repo.git.new"));
    let branch = format!("refs/heads/skillfs/{}", replica(&a));
    assert_eq!(
        git(&remote, &["rev-parse", &branch]),
        git(&sync.join("repo.git"), &["rev-parse", &branch]),
    );
}

/// `skillfs sync` killed alone (its pid, not its process group): the git
/// it was running ends with it (its parent-death signal), even while what
/// that git started lives on, and the next sync runs at once.
#[test]
fn the_git_of_a_sync_killed_alone_ends_with_it() {
    let (a, _b, _remote) = two_replicas("syncorphan");
    let root = root_arg(&a);
    let out = skillfs(&[
        "remote",
        "add",
        "slow",
        "ssh://skillfs.invalid/x.git",
        "--no-check",
        "--root",
        &root,
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let marker = a.scratch.root().parent().unwrap().join("ssh-started");
    // The "ssh" git runs: it says it started, then outlives git's SIGTERM.
    let ssh = format!("touch '{}'; trap '' TERM; sleep 8; false", marker.display());
    let mut child = Command::new(common::BIN)
        .args(["sync", "slow", "--root", &root])
        .env("GIT_SSH_COMMAND", &ssh)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !marker.exists() {
        assert!(std::time::Instant::now() < deadline, "ssh never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let repo = a.store().join("sync").join("repo.git");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while let Some(pid) = git_in(&repo) {
        assert!(
            std::time::Instant::now() < deadline,
            "git {pid} outlived its sync"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = skillfs(&["sync", "hub", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// A process whose command line names `repo`, if one runs.
fn git_in(repo: &Path) -> Option<u32> {
    let needle = repo.to_str().unwrap();
    fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = fs::read(e.path().join("cmdline")).ok()?;
        cmd.split(|&b| b == 0)
            .any(|a| a == needle.as_bytes())
            .then_some(pid)
    })
}

/// A git at work in the store's repository (a user's, by hand; one of
/// a killed sync still ending) holds the next sync off (exit 9), and the
/// lock files there are not taken for stale; once it ended, they are.
#[test]
fn a_git_at_work_in_the_store_holds_the_sync_off_and_keeps_its_locks() {
    let (a, _b, _remote) = two_replicas("syncbusygit");
    let root = root_arg(&a);
    let out = skillfs(&["sync", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    let repo = a.store().join("sync").join("repo.git");
    let mut held = Command::new("git")
        .arg("--git-dir")
        .arg(&repo)
        .args(["cat-file", "--batch"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lock = repo.join("packed-refs.lock");
    fs::write(&lock, "").unwrap();
    let out = skillfs(&["sync", "--root", &root]);
    assert_refused(&out, 9, &["a git (pid", "works in"]);
    assert!(lock.exists(), "a live git's lock was removed");
    drop(held.stdin.take());
    held.wait().unwrap();
    let out = skillfs(&["sync", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    common::assert_enoent(&lock);
}

/// Whether `repo` holds the object `id`.
fn holds(repo: &Path, id: &str) -> bool {
    Command::new("git")
        .arg("--git-dir")
        .arg(repo)
        .args(["cat-file", "-e", id])
        .status()
        .unwrap()
        .success()
}

/// A remote whose branch of a replica is rewound, then rewritten, then
/// deleted by someone else: what this store fetched of it stays (kept
/// refs, through a gc), and the rewrite is said.
#[test]
fn what_was_fetched_of_a_replica_survives_its_remote_being_rewritten() {
    let (a, b, remote) = two_replicas("synckeep");
    fs::write(a.path("x.md"), "from a, again").unwrap();
    for m in [&a, &b] {
        let out = skillfs(&["sync", "--root", &root_arg(m)]);
        assert!(out.status.success(), "{}", describe(&out));
    }
    let branch = format!("refs/heads/skillfs/{}", replica(&a));
    let tip = git(&remote, &["rev-parse", &branch]).trim().to_string();
    let first = git(&remote, &["rev-list", "--max-parents=0", &branch])
        .trim()
        .to_string();
    assert_ne!(tip, first);
    let repo = b.store().join("sync/repo.git");
    let kept = format!("refs/skillfs/kept/{}", replica(&a));
    let sync_b = || {
        let out = skillfs(&["sync", "--root", &root_arg(&b)]);
        assert!(out.status.success(), "{}", describe(&out));
        out
    };
    let gc = || {
        git(&repo, &["reflog", "expire", "--expire=now", "--all"]);
        git(&repo, &["gc", "--prune=now", "--quiet"]);
    };
    // Rewound to its first commit: nothing moves back.
    git(&remote, &["update-ref", &branch, &first]);
    sync_b();
    gc();
    assert_eq!(git(&repo, &["rev-parse", &kept]).trim(), tip);
    assert!(holds(&repo, &tip));
    // Rewritten: another commit on the first one. Both histories kept.
    let tree = git(&remote, &["rev-parse", &format!("{first}^{{tree}}")]);
    let other = git(
        &remote,
        &["commit-tree", tree.trim(), "-p", &first, "-m", "rewritten"],
    )
    .trim()
    .to_string();
    git(&remote, &["update-ref", &branch, &other]);
    let out = sync_b();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("another history of replica"), "{said}");
    gc();
    assert_eq!(git(&repo, &["rev-parse", &kept]).trim(), other);
    assert!(holds(&repo, &tip), "the history fetched before is kept");
    let aside = format!("refs/skillfs/rewound/{}/1", replica(&a));
    assert_eq!(git(&repo, &["rev-parse", &aside]).trim(), tip);
    // The put-aside history's versions are listed, marked, and shown.
    let out = skillfs(&[
        "log",
        "--json",
        "--replica",
        &replica(&a),
        "--root",
        &root_arg(&b),
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let listed: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let aside_versions: Vec<&serde_json::Value> =
        listed.iter().filter(|v| v["rewound"] == true).collect();
    assert!(!aside_versions.is_empty(), "{listed:?}");
    let newest = aside_versions.last().unwrap();
    assert_eq!(newest["commit"], tip.as_str(), "{listed:?}");
    let out = skillfs(&[
        "log",
        "--no-pager",
        "--replica",
        &replica(&a),
        "--root",
        &root_arg(&b),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("(rewound: no longer on its branch)"),
        "{}",
        describe(&out)
    );
    let name = format!("{}:{}:x.md", &replica(&a)[..8], newest["id"]);
    let out = skillfs(&["show", &name, "--root", &root_arg(&b)]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from a, again");
    // Deleted: still kept.
    git(&remote, &["update-ref", "-d", &branch]);
    sync_b();
    gc();
    assert!(holds(&repo, &tip) && holds(&repo, &other));
}

#[test]
fn bad_remotes_and_a_running_agent_sync_are_refused() {
    let m = Mount::new("syncbad");
    let r = root_arg(&m);
    let remote = bare(&m.scratch);
    let url = remote.to_str().unwrap();
    assert_refused(
        &skillfs(&["remote", "add", "--root", &r, "--", "-x", url]),
        2,
        &["not a remote name"],
    );
    assert_refused(
        &skillfs(&["remote", "add", "a/b", url, "--root", &r]),
        2,
        &["not a remote name"],
    );
    assert_refused(
        &skillfs(&[
            "remote",
            "add",
            "--root",
            &r,
            "--",
            "o",
            "--upload-pack=touch",
        ]),
        2,
        &["not a URL git takes"],
    );
    let gone = m.scratch.root().parent().unwrap().join("nowhere.git");
    assert_refused(
        &skillfs(&["remote", "add", "o", gone.to_str().unwrap(), "--root", &r]),
        10,
        &["cannot reach", "--no-check"],
    );
    let out = skillfs(&[
        "remote",
        "add",
        "o",
        gone.to_str().unwrap(),
        "--no-check",
        "--root",
        &r,
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_refused(
        &skillfs(&["remote", "add", "o", url, "--root", &r]),
        2,
        &["exists already"],
    );
    // An unreachable remote fails the sync with 10, and says so.
    fs::write(m.path("f.md"), "x").unwrap();
    assert_refused(
        &skillfs(&["sync", "--root", &r]),
        10,
        &["could not push to remote 'o'"],
    );
    assert_refused(
        &skillfs(&["sync", "nope", "--root", &r]),
        2,
        &["no remote named 'nope'", "o"],
    );
    assert_refused(
        &skillfs(&["remote", "remove", "nope", "--root", &r]),
        2,
        &["no remote named"],
    );
    let out = skillfs(&["remote", "remove", "o", "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_refused(&skillfs(&["sync", "--root", &r]), 2, &["no remote"]);
    // The agent's own Skill Sync on: refused, nothing pushed.
    add_remote(&r, "origin", url);
    let home = m.root().parent().unwrap().to_path_buf();
    fs::write(
        home.join("config.yaml"),
        "model: x\nsync:\n  enabled: true\n",
    )
    .unwrap();
    let out = Command::new(common::BIN)
        .args(["sync", "--root", &r])
        .env("HERMES_HOME", &home)
        .output()
        .unwrap();
    assert_refused(&out, 2, &["Skill Sync is on"]);
    assert_eq!(git(&remote, &["for-each-ref"]).trim(), "", "nothing pushed");
}

/// What a hostile review of `skillfs sync` found, held: no hook of the
/// user's runs in the store's repository, names git refuses in refs are
/// refused, the remotes do not change under a running sync, and what git
/// or a remote says is printed on one line with its control characters
/// escaped.
#[test]
fn a_sync_runs_no_hook_of_the_user_and_prints_no_control_character() {
    use std::os::unix::io::AsRawFd;
    let m = Mount::new("synchard");
    let r = root_arg(&m);
    let remote = bare(&m.scratch);
    let url = remote.to_str().unwrap();
    for bad in ["a..b", "x.lock", "a."] {
        assert_refused(
            &skillfs(&["remote", "add", bad, url, "--root", &r]),
            2,
            &["not a remote name"],
        );
    }
    add_remote(&r, "origin", url);

    // The user's global git config names a hooks directory whose hooks
    // would run at a push and at every ref update.
    let dir = m.scratch.root().parent().unwrap().join("userhooks");
    fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("ran");
    for hook in ["pre-push", "reference-transaction", "post-update"] {
        let h = dir.join(hook);
        fs::write(
            &h,
            format!("#!/bin/sh\necho {hook} $(pwd) >> '{}'\n", marker.display()),
        )
        .unwrap();
        fs::set_permissions(&h, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let gconf = dir.join("gitconfig");
    fs::write(&gconf, format!("[core]\n\thooksPath = {}\n", dir.display())).unwrap();
    fs::write(m.path("f.md"), "x").unwrap();
    let out = Command::new(common::BIN)
        .args(["sync", "--root", &r])
        .env("GIT_CONFIG_GLOBAL", &gconf)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    // (Only the receiving repository's, a path remote's here: its hooks
    // are the remote's, as in any push.)
    let ran = fs::read_to_string(&marker).unwrap_or_default();
    let remote_s = remote.display().to_string();
    assert!(
        ran.lines().all(|l| l.ends_with(&format!(" {remote_s}"))),
        "a hook of the user's ran in a sync outside the remote: {ran}"
    );
    let _ = fs::remove_file(&marker);
    // (The hooks are live: git itself, without skillfs's settings, runs
    // them in the same repository.)
    let repo = m.store().join("sync/repo.git");
    let ran = Command::new("git")
        .arg("--git-dir")
        .arg(&repo)
        .args(["update-ref", "refs/heads/probe", "HEAD"])
        .env("GIT_CONFIG_GLOBAL", &gconf)
        .output()
        .unwrap();
    assert!(ran.status.success(), "{}", describe(&ran));
    assert!(
        marker.exists(),
        "the probe's hook did not run: the check above proves nothing"
    );

    // A sync (here: this test) holds sync/lock: the remotes do not change.
    let lock = fs::File::open(m.store().join("sync/lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    assert_refused(
        &skillfs(&["remote", "add", "two", url, "--root", &r]),
        9,
        &["a sync of"],
    );
    assert_refused(
        &skillfs(&["remote", "remove", "origin", "--root", &r]),
        9,
        &["a sync of"],
    );
    drop(lock);

    // A remote whose answer carries a terminal escape (its own hook
    // refuses the push): listed on one line, the escape written out, not
    // sent to the terminal.
    let evil = m.scratch.root().parent().unwrap().join("evil.git");
    let made = Command::new("git")
        .args(["init", "--bare", "--quiet"])
        .arg(&evil)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", describe(&made));
    let hook = evil.join("hooks/pre-receive");
    fs::write(
        &hook,
        "#!/bin/sh
printf 'no\x1b[2Jway\\n' >&2\nexit 1
",
    )
    .unwrap();
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    add_remote(&r, "evil", evil.to_str().unwrap());
    assert_refused(&skillfs(&["sync", "evil", "--root", &r]), 10, &["evil"]);
    for args in [
        &["remote", "list", "--root", &r][..],
        &["status", "--root", &r][..],
    ] {
        let out = skillfs(args);
        assert!(out.status.success(), "{args:?}: {}", describe(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains('\x1b'),
            "{args:?} printed an escape: {text:?}"
        );
        let line = text
            .lines()
            .find(|l| l.contains("evil"))
            .unwrap_or_default();
        assert!(line.contains("\\u{1b}"), "{args:?}: {text:?}");
        assert!(line.contains("failed"), "{args:?}: {text:?}");
    }
}

/// `"sync": {"every": …}` in `config.json`: the mounted daemon syncs on
/// its own, and a schedule that is not one refuses the mount.
#[test]
fn the_daemon_syncs_on_the_configured_schedule() {
    let s = Scratch::new("syncsched");
    fs::create_dir_all(s.store()).unwrap();
    for (bad, why) in [("soon", "not an age"), ("0s", "shorter than")] {
        fs::write(
            s.store().join("config.json"),
            format!(r#"{{"sync": {{"every": "{bad}"}}}}"#),
        )
        .unwrap();
        let out = skillfs(&["mount", s.root().to_str().unwrap()]);
        assert_refused(&out, 7, &["config.json", "sync: every", why]);
    }
    fs::write(
        s.store().join("config.json"),
        r#"{"sync": {"every": "1s"}}"#,
    )
    .unwrap();
    let remote = bare(&s);
    let m = Mount::over(s, Vec::new());
    let r = root_arg(&m);
    add_remote(&r, "origin", remote.to_str().unwrap());
    fs::write(m.path("greet.md"), "Say hi.\n").unwrap();
    let want = last_id(&m);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let branch = loop {
        let refs = git(&remote, &["for-each-ref", "--format=%(refname)"]);
        if let Some(b) = refs.lines().next()
            && ids(&remote, b).first() == Some(&want)
        {
            break b.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon pushed nothing in 30 s: {refs}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(branch, format!("refs/heads/skillfs/{}", replica(&m)));
    let out = skillfs(&["status", "--root", &r]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("origin") && text.contains("synced"), "{text}");
}

/// Over a home (`--versioned skills`), the daemon's schedule checks the
/// agent's own Skill Sync in the home's `config.yaml` (read from the
/// directory under the mount, opened before it) and refuses to sync.
#[test]
fn the_schedule_over_a_home_refuses_while_the_agents_sync_is_on() {
    let s = Scratch::home("synchome");
    fs::create_dir_all(s.store()).unwrap();
    fs::write(
        s.store().join("config.json"),
        r#"{"sync": {"every": "1s"}}"#,
    )
    .unwrap();
    fs::write(
        s.mount_point().join("config.yaml"),
        "model: a\nsync:\n  enabled: true\n",
    )
    .unwrap();
    // Beside the home, not in it: never a path under the mount.
    let remote = bare_at(s.mount_point().parent().unwrap().join("remote.git"));
    let m = Mount::over(s, Vec::new());
    add_remote(&root_arg(&m), "origin", remote.to_str().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let log = fs::read_to_string(m.store().join("daemon.log")).unwrap();
        if log.contains("the agent's own Skill Sync is on") {
            assert!(log.contains("config.yaml"), "{log}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{log}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let refs = git(&remote, &["for-each-ref", "--format=%(refname)"]);
    assert!(
        refs.trim().is_empty(),
        "pushed while the agent's sync is on: {refs}"
    );
}
