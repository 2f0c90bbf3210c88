//! Running `git` on the store's sync repository (`repo.git`), what it
//! printed, and what a killed one left behind: the processes still at work
//! in the repository, found in `/proc`, and their lock files.
//!
//! Invariant: every git skillfs starts names the repository on its command
//! line and ends with the command that started it (the parent-death signal
//! of `export::git::git`), and none starts a gc or maintenance of its own;
//! so a lock file found with no git at work is a killed one's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Exit, Failure};
use crate::store::Layout;

/// `git` for the store's sync repository (or none, `repo` `None`): no
/// terminal prompt (a sync may run unattended), no `ext::` transport (a
/// URL must never run a command), no hooks of the user's (`core.hooksPath`
/// emptied), a connection that stalls given up (ssh keepalives, and
/// http's low-speed limit) rather than a sync that hangs for good, ssh in
/// batch mode unless the user set their own, and the umask 077, so that
/// what it writes outside its shared-permission files (`FETCH_HEAD`,
/// packs) is as private as the rest of the store.
pub fn git(repo: Option<&Path>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = crate::export::git::git(repo);
    // SAFETY: umask(2) is async-signal-safe and touches nothing of the
    // parent: it runs in the forked child before exec.
    unsafe {
        c.pre_exec(|| {
            libc::umask(0o077);
            Ok(())
        });
    }
    let for_the_mount = FOR_THE_MOUNT.with(std::cell::Cell::get);
    if for_the_mount {
        // None of the user's or the system's configuration (an `include`
        // of a file in the mount would have the daemon wait on itself;
        // reading the repository needs none), and a git that runs long
        // is ended: it holds a request of the mount.
        // Nothing of the environment either (`GIT_CONFIG_PARAMETERS`,
        // `GIT_CONFIG_COUNT`, a `GIT_TRACE` file in the mount): only PATH.
        let path = std::env::var_os("PATH");
        c.env_clear();
        if let Some(p) = path {
            c.env("PATH", p);
        }
        c.env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null");
        // SAFETY: sched_setscheduler(2) and setrlimit(2) are
        // async-signal-safe system calls on the child itself, run in the
        // forked child before exec.
        unsafe {
            c.pre_exec(|| {
                // A request thread of io_uring may be at SCHED_IDLE: git
                // is not to inherit it (it would starve under load).
                let p = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_OTHER, &p);
                let cpu = libc::rlimit {
                    rlim_cur: MOUNT_GIT_CPU_SECONDS,
                    rlim_max: MOUNT_GIT_CPU_SECONDS,
                };
                libc::setrlimit(libc::RLIMIT_CPU, &cpu);
                Ok(())
            });
        }
    }
    c.env("GIT_TERMINAL_PROMPT", "0")
        .args(["-c", "protocol.ext.allow=never"])
        // No gc or maintenance started by git itself: it would run as a
        // process whose command line does not name the repository, which
        // the next sync could not see (`git_at_work`); a sync runs its own
        // `gc --auto` at its end.
        .args(["-c", "gc.auto=0", "-c", "maintenance.auto=false"])
        .args([
            "-c",
            "http.lowSpeedLimit=1000",
            "-c",
            "http.lowSpeedTime=60",
        ])
        .stdin(Stdio::null())
        // Never a path under a mount the caller (the daemon, for a
        // scheduled sync) may serve: every path given is absolute.
        .current_dir("/");
    // The user's own ssh (a key, a proxy) wins; only a default is made
    // to fail fast.
    // Asked of git once a process (a sync runs git a few dozen times; the
    // daemon sees a change of the user's git config at its next start).
    static SSH_COMMAND_SET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let own_ssh = for_the_mount
        || ["GIT_SSH_COMMAND", "GIT_SSH"]
            .iter()
            .any(|v| std::env::var_os(v).is_some())
        || *SSH_COMMAND_SET.get_or_init(|| {
            crate::export::git::git(None)
                .args(["config", "--get", "core.sshCommand"])
                .stdin(Stdio::null())
                // The user's and the system's config, not a repository's
                // around the caller's working directory (or a mount's).
                .current_dir("/")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if !own_ssh {
        c.env(
            "GIT_SSH_COMMAND",
            "ssh -o BatchMode=yes -o ConnectTimeout=30 -o ServerAliveInterval=15 \
             -o ServerAliveCountMax=4",
        );
    }
    c
}

thread_local! {
    /// Set while this thread reads the repository for the daemon's
    /// `.history` (`for_the_mount`).
    static FOR_THE_MOUNT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The CPU time a git run for the mount may take.
const MOUNT_GIT_CPU_SECONDS: libc::rlim_t = 30;

/// Runs `f` with every `git` this thread starts meanwhile made a reader
/// for the mount (see `git`): a request thread of the daemon serving
/// `.history/REPLICA:ID`. Other threads (the daemon's scheduled sync,
/// which needs the user's configuration: keys, URL rewrites) are not
/// touched.
pub(super) fn for_the_mount<T>(f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FOR_THE_MOUNT.with(|c| c.set(false));
        }
    }
    FOR_THE_MOUNT.with(|c| c.set(true));
    let _reset = Reset;
    f()
}

pub(super) fn said(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .trim()
        .replace('\n', "; ")
}

/// What `c` (a `git` of the store's own repository) printed. A git that
/// cannot start is exit 1; one that fails is exit 4 (the store's
/// repository), said as "git could not `doing`" with git's own words.
pub(super) fn git_output(mut c: Command, doing: &str) -> Result<Vec<u8>, Failure> {
    let out = c
        .output()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git to {doing}: {e}")))?;
    if !out.status.success() {
        return Err(Failure::new(
            Exit::BadStore,
            format!("git could not {doing}: {}", said(&out)),
        ));
    }
    Ok(out.stdout)
}

/// A process at work in the store's `repo.git`: one whose command line
/// names it (every git skillfs starts has `--git-dir REPO`) or whose
/// working directory is in it (a git run there by hand). Read from
/// `/proc`; a process whose details cannot be read is not seen.
fn git_at_work(repo: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let me = std::process::id();
    let needle = repo.as_os_str().as_bytes();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let named = std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            c.split(|&b| b == 0)
                .any(|a| a == needle || a.strip_prefix(b"--git-dir=".as_slice()) == Some(needle))
        });
        let inside = std::fs::read_link(e.path().join("cwd")).is_ok_and(|c| c.starts_with(repo));
        if named || inside {
            return Some(pid);
        }
    }
    None
}

/// Waits a few seconds at most until no process works in any of `dirs`
/// (see [`git_at_work`]): a git of a sync killed a moment ago is ending
/// (its parent-death signal). `Err` names one still at work then.
fn wait_quiet(dirs: &[&Path]) -> Result<(), u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while let Some(pid) = dirs.iter().find_map(|d| git_at_work(d)) {
        if std::time::Instant::now() >= deadline {
            return Err(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(())
}

/// Waits until no process works in `repo` ([`wait_quiet`]); one still
/// there is said.
pub(super) fn settle(repo: &Path, layout: &Layout) -> Result<(), Failure> {
    wait_quiet(&[repo]).map_err(|pid| {
        Failure::new(
            Exit::Busy,
            format!(
                "a git (pid {pid}) works in '{}' of the store of '{}': a sync starts once it \
                 has ended",
                repo.display(),
                layout.dir.display()
            ),
        )
    })
}

/// Removes the lock files a killed git left in the store's `repo.git`
/// (a ref's, `packed-refs.lock`, `config.lock`, ...): called with
/// `sync/lock` held and no process at work in it ([`settle`]): every git
/// skillfs starts names the repository on its command line and ends with
/// the sync that started it (the parent-death signal of
/// `export::git::git`), and none starts a gc or maintenance of its own
/// (`git`), so a lock file left is a killed git's (SIGKILL, as a whole
/// process group is killed on a script's Ctrl-C or at the schedule's
/// deadline, leaves them). Loose objects' directories are not looked in:
/// git takes no lock there.
pub(super) fn clear_stale_git_locks(repo: &Path) {
    fn walk(dir: &Path, top: bool, removed: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let Ok(kind) = e.file_type() else { continue };
            let path = e.path();
            if kind.is_dir() {
                let loose = !top
                    && dir.file_name().is_some_and(|n| n == "objects")
                    && name.len() == 2
                    && name.bytes().all(|b| b.is_ascii_hexdigit());
                if !loose {
                    walk(&path, false, removed);
                }
            } else if kind.is_file()
                && name.ends_with(".lock")
                && std::fs::remove_file(&path).is_ok()
            {
                removed.push(path);
            }
        }
    }
    let mut removed = Vec::new();
    walk(repo, true, &mut removed);
    for p in removed {
        tracing::info!(
            "sync: removed '{}', left by a git that was killed",
            p.display()
        );
    }
}

/// Removes the lock of this replica's own ref in a remote on a path of
/// this host (`/...` or `file:///...`) when this user made it and no
/// process works in that repository (waiting a few seconds for one that
/// ends): it is a killed push's. A push to such a remote runs git's
/// receive-pack here, as this user and in the sync's process group, so a
/// sync killed whole (a script's Ctrl-C, the schedule's deadline) kills
/// it holding the ref's lock, and every later push failed with "cannot
/// lock ref" until a user removed it. Only this replica pushes this ref,
/// and it holds `sync/lock`; git's upkeep there (`pack-refs` of a `gc`)
/// takes the lock too, for a moment: as this user, in a process whose
/// working directory is the repository, which is waited for; as another
/// user (whose processes this one may not see), in a lock file it owns,
/// which is left. Another ref's lock, or `packed-refs.lock`, is someone
/// else's and left.
pub(super) fn clear_own_ref_lock(url: &str, branch: &str) {
    use std::os::unix::fs::MetadataExt;
    let path = url.strip_prefix("file://").unwrap_or(url);
    if !path.starts_with('/') {
        return;
    }
    let Ok(path) = std::fs::canonicalize(path) else {
        return;
    };
    let git_dir = if path.join(".git").is_dir() {
        path.join(".git")
    } else {
        path.clone()
    };
    let lock = git_dir.join(format!("{branch}.lock"));
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    match std::fs::symlink_metadata(&lock) {
        Ok(md) if md.is_file() && md.uid() == me => {}
        _ => return,
    }
    if wait_quiet(&[&git_dir, &path]).is_err() {
        return;
    }
    match std::fs::remove_file(&lock) {
        Ok(()) => tracing::info!(
            "sync: removed '{}', left by a push that was killed",
            lock.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("sync: could not remove '{}': {e}", lock.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a git's own child (an alias run by `sh`) reports: its whole
    /// environment, its CPU limit and its scheduling policy.
    fn probe() -> String {
        let script = "!env; echo ulimit=$(ulimit -t); \
                      echo policy=$(cut -d' ' -f41 /proc/$$/stat)";
        let out = git(None)
            .args(["-c", &format!("alias.probe={script}"), "probe"])
            .current_dir("/")
            .output()
            .expect("git runs");
        assert!(out.status.success(), "{}", said(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// A git run for the mount (a request thread of io_uring, at
    /// SCHED_IDLE) gets no environment but PATH and the two settings that
    /// keep the user's and the system's configuration out, leaves
    /// SCHED_IDLE, and has 30 seconds of CPU; another thread's git keeps
    /// all three as they were.
    #[test]
    fn a_git_for_the_mount_gets_no_environment_and_normal_priority_and_a_cpu_limit() {
        // Cargo gives every test this variable: the parent has it.
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let idle = libc::sched_param { sched_priority: 0 };
        // SAFETY: changes this test thread's own policy (it ends with the
        // test); `idle` outlives the call.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        let plain = probe();
        assert!(plain.contains("CARGO_PKG_NAME="), "{plain}");
        assert!(
            plain.contains(&format!("policy={}", libc::SCHED_IDLE)),
            "{plain}"
        );
        let mounted = for_the_mount(probe);
        let names: Vec<&str> = mounted
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        assert!(!names.contains(&"CARGO_PKG_NAME"), "{mounted}");
        assert!(!names.contains(&"HOME"), "{mounted}");
        assert!(mounted.contains("GIT_CONFIG_NOSYSTEM=1"), "{mounted}");
        assert!(mounted.contains("GIT_CONFIG_GLOBAL=/dev/null"), "{mounted}");
        assert!(
            mounted.contains(&format!("ulimit={MOUNT_GIT_CPU_SECONDS}")),
            "{mounted}"
        );
        // (Leaving SCHED_IDLE takes root, or an RLIMIT_NICE that allows
        // nice 0: as root, as CI and the daemon over io_uring run.)
        if crate::process::geteuid() == 0 {
            assert!(
                mounted.contains(&format!("policy={}", libc::SCHED_OTHER)),
                "{mounted}"
            );
        }
        // And the thread is back to other gits afterwards.
        assert!(probe().contains("CARGO_PKG_NAME="));
    }
}
