//! The repository an export goes into: found, or made bare when DIR is
//! missing or empty (and removed again if the run fails); the change its
//! branch holds, read from the newest commit's trailers.
//!
//! A private repository (the store's, for `sync`, made under its lock) is
//! made whole beside DIR and renamed into place, so that a run killed
//! part way through `git init` leaves no half-made DIR that the next run
//! would refuse; a half-made one a build before this left (no object, no
//! ref in it) is made again.
//!
//! Invariant: git is always run with an explicit `--git-dir` and none of
//! the environment that could send it to another repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{ID_TRAILER, TIME_TRAILER};
use crate::error::{Exit, Failure};

/// `git` with no environment that could send it to another repository.
pub fn git(git_dir: Option<&Path>) -> Command {
    let mut c = Command::new("git");
    for v in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
    ] {
        c.env_remove(v);
    }
    if let Some(d) = git_dir {
        c.arg("--git-dir").arg(d);
    }
    // It ends with the skillfs that started it (SIGTERM: git removes its
    // lock files on the way out), and one whose skillfs is gone already
    // never starts: no git of skillfs's outlives it to write a repository
    // the next run takes for idle (`sync::run::settle`).
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: getpid(2) touches no memory.
        let parent = unsafe { libc::getpid() };
        // SAFETY: prctl(2) and getppid(2) are async-signal-safe; this runs
        // in the forked child before exec and touches nothing of the
        // parent.
        unsafe {
            c.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    // No hook of the user's (a global `core.hooksPath`, say a
    // `reference-transaction` hook) runs on the refs skillfs writes.
    c.args(["-c", "core.hooksPath=/dev/null"]);
    c
}

/// Runs `cmd`; its stdout, or a failure naming what it was for.
fn run(mut cmd: Command, what: &str, dir: &Path) -> Result<Vec<u8>, Failure> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
        Failure::new(
            Exit::Internal,
            format!("could not run git (needed for --git): {e}"),
        )
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Failure::new(
            Exit::Internal,
            format!(
                "could not {what} '{}': git says: {}",
                dir.display(),
                err.trim().replace('\n', "; ")
            ),
        ));
    }
    Ok(out.stdout)
}

/// Whether `dir` is what a killed `git init` leaves: a directory that git
/// ran and said is no repository, with no object and no ref in it (so
/// nothing in it was ever fetched or exported). Anything it cannot read
/// or run counts against: a repository is never removed on a guess.
fn killed_init(dir: &Path) -> bool {
    /// Whether `d` holds a file, below it too (missing: no; unreadable: yes).
    fn holds_a_file(d: &Path) -> bool {
        match std::fs::read_dir(d) {
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
            Ok(rd) => rd.into_iter().any(|e| match e {
                Err(_) => true,
                Ok(e) => match e.file_type() {
                    Ok(t) if t.is_dir() => holds_a_file(&e.path()),
                    _ => true,
                },
            }),
        }
    }
    std::fs::symlink_metadata(dir).is_ok_and(|md| md.is_dir())
        && is_repository(dir) == Some(false)
        && !holds_a_file(&dir.join("objects"))
        && !holds_a_file(&dir.join("refs"))
        && std::fs::symlink_metadata(dir.join("packed-refs"))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

/// Whether git takes `dir` for a repository (`None`: git did not run, or
/// said something else than that it is none).
fn is_repository(dir: &Path) -> Option<bool> {
    let out = git(Some(dir))
        .args(["rev-parse", "--git-dir"])
        // Its message untranslated, to be read.
        .env("LC_ALL", "C")
        .env_remove("LANGUAGE")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if out.status.success() {
        return Some(true);
    }
    String::from_utf8_lossy(&out.stderr)
        .contains("not a git repository")
        .then_some(false)
}

/// A repository to export into, and what this run made of it (removed
/// again if the run fails).
pub struct Repo {
    pub git_dir: PathBuf,
    /// The branch the history goes on (`refs/heads/...`).
    pub branch: String,
    pub made: Option<PathBuf>,
    /// DIR itself was made (else it was an empty directory).
    made_dir: bool,
}

impl Repo {
    /// DIR's repository; DIR missing or empty becomes a bare one whose HEAD
    /// is `branch` (`git clone DIR` checks the history out). A `private`
    /// one (inside the store) has no hooks, and only its owner may read
    /// it (files 0600, directories 0700, as the store's audit wants).
    pub fn open(dir: &Path, branch: &str, private: bool) -> Result<Repo, Failure> {
        let usage = |m: String| Failure::new(Exit::Usage, m);
        if private && killed_init(dir) {
            tracing::info!(
                "removed '{}', left by a git init that was killed",
                dir.display()
            );
            std::fs::remove_dir_all(dir)
                .map_err(|e| Failure::io(Exit::BadStore, "remove", dir, &e))?;
        }
        let empty = match std::fs::symlink_metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Failure::io(Exit::Usage, "examine", dir, &e)),
            Ok(md) if !md.is_dir() => {
                return Err(usage(format!(
                    "'{}' is not a directory: --git takes a git repository or a new directory",
                    dir.display()
                )));
            }
            Ok(_) => Some(
                std::fs::read_dir(dir)
                    .map_err(|e| Failure::io(Exit::Usage, "list", dir, &e))?
                    .next()
                    .is_none(),
            ),
        };
        if empty == Some(false) {
            let dot = dir.join(".git");
            let git_dir = if dot.exists() { dot } else { dir.to_path_buf() };
            if is_repository(&git_dir) == Some(true) {
                return Ok(Repo {
                    git_dir,
                    branch: branch.to_string(),
                    made: None,
                    made_dir: false,
                });
            }
            return Err(usage(format!(
                "'{}' is neither a git repository nor empty: --git writes into a repository \
                 or a new directory",
                dir.display()
            )));
        }
        let parent = dir.parent().unwrap_or(Path::new("/"));
        if !parent.is_dir() {
            return Err(usage(format!(
                "'{}' does not exist: --git makes DIR, not its parents",
                parent.display()
            )));
        }
        let repo = Repo {
            git_dir: dir.to_path_buf(),
            branch: branch.to_string(),
            made: Some(dir.to_path_buf()),
            made_dir: empty.is_none(),
        };
        // Private and missing: made beside DIR, then renamed into place.
        let at = match (private, empty) {
            (true, None) => {
                let name = dir.file_name().unwrap_or_default().to_string_lossy();
                let new = dir.with_file_name(format!(".{name}.new"));
                // A killed run's; the caller's lock says no other runs.
                let gone = match std::fs::symlink_metadata(&new) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Ok(md) if md.is_dir() => std::fs::remove_dir_all(&new),
                    _ => std::fs::remove_file(&new),
                };
                gone.map_err(|e| Failure::io(Exit::BadStore, "remove", &new, &e))?;
                new
            }
            _ => dir.to_path_buf(),
        };
        let mut c = git(None);
        c.args(["init", "--bare", "--quiet"]);
        if private {
            c.args(["--shared=0600", "--template="]);
        }
        c.arg(&at);
        let made = run(c, "make a git repository in", &at)
            .and_then(|_| {
                let mut c = git(Some(&at));
                c.args(["symbolic-ref", "HEAD", branch]);
                run(c, "set HEAD of", &at)
            })
            .and_then(|_| {
                if at == dir {
                    return Ok(());
                }
                std::fs::rename(&at, dir)
                    .and_then(|_| std::fs::File::open(parent)?.sync_all())
                    .map_err(|e| Failure::io(Exit::BadStore, "move into place", &at, &e))
            });
        match made {
            Ok(_) => Ok(repo),
            Err(f) => {
                if at != dir {
                    let _ = std::fs::remove_dir_all(&at);
                }
                repo.unmake();
                Err(f)
            }
        }
    }

    /// The branch's name without `refs/heads/`, for messages.
    pub fn short(&self) -> &str {
        self.branch
            .strip_prefix("refs/heads/")
            .unwrap_or(&self.branch)
    }

    /// Removes what this run made: DIR, or what it put in the empty DIR.
    pub fn unmake(&self) {
        let Some(dir) = &self.made else { return };
        if self.made_dir {
            let _ = std::fs::remove_dir_all(dir);
        } else if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let p = e.path();
                let _ = if p.is_dir() && !p.is_symlink() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
        }
    }

    /// The change the branch's newest commit holds: its id and time, from
    /// its trailers. `None` when there is no branch yet.
    pub fn tip(&self, dir: &Path) -> Result<Option<(u64, i64)>, Failure> {
        let mut c = git(Some(&self.git_dir));
        c.args(["rev-parse", "--quiet", "--verify"])
            .arg(format!("{}^{{commit}}", self.branch));
        let Ok(out) = c.stdin(Stdio::null()).output() else {
            return Err(Failure::new(
                Exit::Internal,
                "could not run git (needed for --git)",
            ));
        };
        if !out.status.success() {
            return Ok(None);
        }
        let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let mut c = git(Some(&self.git_dir));
        c.args(["cat-file", "commit", &sha]);
        let text = run(c, &format!("read the branch {} of", self.short()), dir)?;
        match tip_of_commit(&text) {
            Some(tip) => Ok(Some(tip)),
            None => Err(Failure::new(
                Exit::Usage,
                format!(
                    "'{}': the newest commit of its branch {} ({}) was not made by skillfs \
                     export (it has no {}trailer); export into another repository",
                    dir.display(),
                    self.short(),
                    &sha[..sha.len().min(12)],
                    ID_TRAILER
                ),
            )),
        }
    }
}

/// The change id and time a commit's trailers hold, from the raw commit
/// object (`git cat-file commit`: headers, a blank line, the message);
/// `None` unless both are there and the id is positive.
pub fn tip_of_commit(commit: &[u8]) -> Option<(u64, i64)> {
    let text = String::from_utf8_lossy(commit);
    let message = text.split_once("\n\n").map_or("", |(_, m)| m);
    let trailer = |key: &str| {
        message
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    match (trailer(ID_TRAILER), trailer(TIME_TRAILER)) {
        (Some(id), Some(t)) if id > 0 => Some((id as u64, t)),
        _ => None,
    }
}
