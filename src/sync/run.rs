//! `skillfs sync [NAME]`: this replica's versions pushed as commits on its
//! own ref, then the other replicas' refs fetched, for each remote (or the
//! one named). See the module doc of `sync` for what it keeps and refuses.
//!
//! Locks: `sync/lock` for the whole run.

use std::path::{Path, PathBuf};

use super::git::{clear_own_ref_lock, clear_stale_git_locks, git, said, settle};
use super::remotes::{Remotes, sync_dir};
use super::{branch_of, replica_id};
use super::{child, kept};
use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::store::Layout;

/// What a sync did with one remote.
pub struct SyncReport {
    pub remote: String,
    /// The change ids its copy of this replica's branch now ends at, and
    /// where it ended before (`None`: it had none).
    pub pushed: Option<(Option<u64>, u64)>,
    /// The other replicas it holds, with the commits this store keeps of
    /// each (see `kept`).
    pub replicas: Vec<(String, u64)>,
    /// What the fetch found rewritten, each a line for the user.
    pub rewritten: Vec<String>,
    /// Why it failed, if it did.
    pub error: Option<(Exit, String)>,
}

impl SyncReport {
    /// What a sync that did not fail did, in a few words.
    pub fn summary(&self) -> String {
        let pushed = match self.pushed {
            Some((Some(a), b)) if a == b => "up to date".to_string(),
            Some((Some(a), b)) => format!("pushed changes {} to {b}", a + 1),
            Some((None, b)) => format!("pushed changes 1 to {b}"),
            None => "nothing to push".to_string(),
        };
        let commits: u64 = self.replicas.iter().map(|(_, n)| n).sum();
        format!(
            "{pushed}; fetched {} other replica{} ({commits} commits kept)",
            self.replicas.len(),
            if self.replicas.len() == 1 { "" } else { "s" }
        )
    }
}

/// Whether the agent's own Skill Sync is switched on in `home`'s
/// `config.yaml` (a top-level `sync:` whose `enabled:` is true): then the
/// two would feed each other, and skillfs refuses.
pub fn agent_sync_on(home: &Path) -> bool {
    std::fs::read_to_string(home.join("config.yaml")).is_ok_and(|t| sync_enabled(&t))
}

/// [`agent_sync_on`] for the home open at `fd` (at `path`, for messages).
fn agent_sync_on_at(fd: &std::os::fd::OwnedFd, path: &Path) -> bool {
    use std::os::fd::AsFd;
    let read =
        crate::sys::openat(fd.as_fd(), b"config.yaml", libc::O_RDONLY, 0).and_then(|mut f| {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut f, &mut text).map(|_| text)
        });
    match read {
        Ok(text) => sync_enabled(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => {
            tracing::warn!(
                "sync: could not read '{}': {e}",
                path.join("config.yaml").display()
            );
            false
        }
    }
}

/// Whether a `config.yaml`'s text switches the agent's Skill Sync on.
fn sync_enabled(text: &str) -> bool {
    let mut in_sync = false;
    for line in text.lines() {
        if !line.starts_with([' ', '\t']) && !line.trim().is_empty() {
            in_sync = line.trim_end() == "sync:";
            continue;
        }
        if in_sync {
            let l = line.trim();
            if let Some(v) = l.strip_prefix("enabled:") {
                let v = v
                    .split('#')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                if matches!(v.as_str(), "true" | "yes" | "on") {
                    return true;
                }
            }
        }
    }
    false
}

/// Takes `sync/lock` (one sync, or one change of the remotes, at a time):
/// held while the returned file is open; what a killed sync's git left
/// locked in `repo.git` is cleared once no git works there ([`settle`]).
pub fn lock(dir: &crate::store::Dir, layout: &Layout) -> Result<std::fs::File, Failure> {
    let lock = dir
        .open(
            "lock",
            libc::O_RDWR | libc::O_CREAT,
            crate::store::fsutil::FILE_MODE,
        )
        .map_err(|e| Failure::io(Exit::BadStore, "open", &dir.join("lock"), &e))?;
    if !crate::sys::try_lock_exclusive(&lock)
        .map_err(|e| Failure::io(Exit::BadStore, "lock", &dir.join("lock"), &e))?
    {
        return Err(Failure::new(
            Exit::Busy,
            format!("a sync of '{}' is running", layout.dir.display()),
        ));
    }
    let repo = dir.join("repo.git");
    settle(&repo, layout)?;
    clear_stale_git_locks(&repo);
    Ok(lock)
}

/// How a sync runs: a user's `skillfs sync` takes the defaults; the
/// daemon's schedule bounds its git and never reads through its own mount.
#[derive(Default)]
pub struct Options {
    /// Each git command that talks to a remote is stopped after this long
    /// (see `child`); `None`: it runs until it ends or is interrupted.
    pub deadline: Option<std::time::Duration>,
    /// Where the agent's `config.yaml` is read, which says whether its
    /// own Skill Sync is on.
    pub agent_home: AgentHome,
}

/// The agent's home a sync checks for the agent's own Skill Sync.
#[derive(Default)]
pub enum AgentHome {
    /// `HERMES_HOME`, else the root's parent, by path (a user's sync).
    #[default]
    ByPath,
    /// The home opened before the mount (so the directory under it, for
    /// the daemon, which never reads through its own mount), with its
    /// path for messages.
    At(std::sync::Arc<std::os::fd::OwnedFd>, PathBuf),
    /// There was none to open when the mount was made.
    Missing,
}

/// The agent's home a sync of `root` checks for its own Skill Sync:
/// `HERMES_HOME`, else the root's parent.
pub fn agent_home(root: &Path) -> Option<PathBuf> {
    std::env::var_os("HERMES_HOME")
        .map(PathBuf::from)
        .or_else(|| root.parent().map(Path::to_path_buf))
}

/// Syncs the store at `layout` (whose root is `root`) with every remote,
/// or with `only`.
pub fn sync(
    layout: &Layout,
    root: &Path,
    only: Option<&str>,
    opts: &Options,
) -> Result<Vec<SyncReport>, Failure> {
    let (on, home) = match &opts.agent_home {
        AgentHome::At(fd, path) => (agent_sync_on_at(fd, path), Some(path.clone())),
        AgentHome::ByPath => match agent_home(root) {
            Some(h) => (agent_sync_on(&h), Some(h)),
            None => (false, None),
        },
        AgentHome::Missing => (false, None),
    };
    if on && let Some(home) = home {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "the agent's own Skill Sync is on ('{}' says sync: enabled: true): two syncs \
                 would feed each other; switch one off",
                home.join("config.yaml").display()
            ),
        ));
    }
    let dir = sync_dir(layout, true)?.expect("made");
    let _lock = lock(&dir, layout)?;
    let mut remotes = Remotes::load(Some(&dir))?;
    let chosen: Vec<String> = match only {
        Some(n) if remotes.get(n).is_none() => {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "no remote named '{n}'{}",
                    if remotes.remotes.is_empty() {
                        " (there are none: skillfs remote add NAME URL)".to_string()
                    } else {
                        format!(
                            " (remotes: {})",
                            remotes
                                .remotes
                                .iter()
                                .map(|r| r.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                ),
            ));
        }
        Some(n) => vec![n.to_string()],
        None if remotes.remotes.is_empty() => {
            return Err(Failure::new(
                Exit::Usage,
                "this store has no remote: add one with skillfs remote add NAME URL",
            ));
        }
        None => remotes.remotes.iter().map(|r| r.name.clone()).collect(),
    };
    let replica = replica_id(layout, true)?.expect("made");
    let branch = branch_of(&replica);
    // This replica's versions as commits, in the store's own repository.
    let store = Store::open(layout.clone())?;
    let records = crate::commands::read_records(layout)?;
    let repo = dir.join("repo.git");
    // Each commit says what this store had merged of the others by then:
    // their next merge's base (see `pull`).
    let trailers = super::pull::merged_trailers(layout)?;
    // The other replicas' commits merged here since the last export: the
    // parents of this run's last commit, so git's merge base sees them.
    let merges = super::pull::unattached_merges(&dir, &repo, &branch);
    let exported = crate::export::git::export_branch(
        &store,
        &records,
        &repo,
        &branch,
        true,
        None,
        (&trailers, &merges),
    )?;
    if exported.commits > 0 {
        super::pull::merges_attached(&dir, &repo, &branch);
    }
    // Signed once for every remote that wants it (see `trust`).
    if chosen
        .iter()
        .any(|n| remotes.get(n).is_some_and(|r| r.sign))
    {
        super::trust::seal(&repo, &branch, &replica)?;
    }
    let tip = tip_id(&repo, &branch);
    let mut reports = Vec::new();
    for name in chosen {
        let r = remotes.get(&name).expect("chosen").clone();
        let report = with_remote(
            &repo,
            &replica,
            &branch,
            (&r.name, &r.url),
            r.pushed,
            tip,
            (
                opts.deadline,
                r.signers.then(|| super::trust::signers_path(&dir, &r.name)),
            ),
        );
        let entry = remotes.get_mut(&name).expect("chosen");
        entry.last_sync = Some(crate::time::now_ns());
        // What a remote said, as one line no terminal acts on.
        entry.error = report
            .error
            .as_ref()
            .map(|(_, m)| crate::error::one_line(m.clone()));
        if let Some((_, now)) = report.pushed {
            entry.pushed = Some(now);
        }
        if report.error.is_none() {
            entry.replicas = report.replicas.clone();
        }
        reports.push(report);
    }
    remotes.save(&dir)?;
    // The repository's own upkeep (git starts none of itself, see `git`):
    // packs loose objects once there are many, as git's auto gc would.
    let mut gc = git(Some(&repo));
    gc.args(["-c", "gc.auto=6700", "-c", "gc.autoDetach=false"])
        .args(["gc", "--auto", "--quiet"]);
    match child::output(gc, opts.deadline) {
        Ok(out) if !out.status.success() => tracing::warn!("sync: git gc: {}", said(&out)),
        Err(e) => tracing::warn!("sync: could not run git gc: {e}"),
        Ok(_) => {}
    }
    Ok(reports)
}

/// The change id the newest commit of `branch` holds (its trailer).
fn tip_id(repo: &Path, branch: &str) -> Option<u64> {
    let out = git(Some(repo))
        .args(["log", "-1", "--format=%(trailers:key=skillfs-id,valueonly)"])
        .arg(branch)
        .output()
        .ok()?;
    parse_count(&out.stdout)
}

/// A number git printed alone (a trailer's value, `rev-list --count`).
pub fn parse_count(out: &[u8]) -> Option<u64> {
    String::from_utf8_lossy(out).trim().parse().ok()
}

/// Whether `git push --porcelain`'s output says the push of `branch` was
/// refused as not a fast-forward.
pub fn push_rejected(porcelain: &[u8], branch: &str) -> bool {
    String::from_utf8_lossy(porcelain)
        .lines()
        .any(|l| l.starts_with('!') && l.contains(branch) && l.contains("[rejected]"))
}

/// The other replicas' refs in `git for-each-ref --format=%(refname)
/// PREFIX`'s output: each one's id (its name past `prefix`) and ref,
/// `replica`'s own left out, and any name that is no replica id (what a
/// remote calls its refs is not trusted to be a ref name of ours).
pub fn remote_refs(out: &[u8], prefix: &str, replica: &str) -> Vec<(String, String)> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|r| {
            let id = super::replica::parse(r.strip_prefix(prefix)?.as_bytes())?;
            (id != replica).then(|| (id, r.to_string()))
        })
        .collect()
}

fn with_remote(
    repo: &Path,
    replica: &str,
    branch: &str,
    (name, url): (&str, &str),
    before: Option<u64>,
    tip: Option<u64>,
    (deadline, signers): (Option<std::time::Duration>, Option<PathBuf>),
) -> SyncReport {
    // A command that could not run, or was stopped (see `child`).
    let failed = |what: &str, e: std::io::Error| {
        if child::is_stopped(&e) {
            (
                Exit::RemoteFailed,
                format!("git {what} with remote '{name}' ({url}) did not finish: {e}"),
            )
        } else {
            (Exit::Internal, format!("could not run git {what}: {e}"))
        }
    };
    let mut report = SyncReport {
        remote: name.to_string(),
        pushed: None,
        replicas: Vec::new(),
        rewritten: Vec::new(),
        error: None,
    };
    let fail = |exit, m: String| Some((exit, m));
    if tip.is_some() {
        clear_own_ref_lock(url, branch);
        // Never forced: not a fast-forward of what the remote holds is
        // refused by git, and the remote compares and swaps the ref.
        let mut push = git(Some(repo));
        push.args(["push", "--porcelain", "--no-verify", url])
            .arg(format!("{branch}:{branch}"));
        match child::output(push, deadline) {
            Err(e) => {
                report.error = Some(failed("push", e));
                return report;
            }
            Ok(out) if out.status.success() => {
                report.pushed = tip.map(|t| (before, t));
            }
            Ok(out) => {
                report.error = if push_rejected(&out.stdout, branch) {
                    fail(
                        Exit::BadStore,
                        format!(
                            "remote '{name}' holds another history on this replica's branch \
                             skillfs/{replica}: two stores share the replica id {replica} (a \
                             store copied whole?), or someone else pushed to that branch. \
                             Nothing was overwritten; give this store a new id by removing its \
                             REPLICA file, then sync again"
                        ),
                    )
                } else {
                    fail(
                        Exit::RemoteFailed,
                        format!("could not push to remote '{name}' ({url}): {}", said(&out)),
                    )
                };
                return report;
            }
        }
    }
    // The other replicas' branches, as the remote has them now.
    let mut fetch = git(Some(repo));
    fetch
        .args(["fetch", "--no-tags", "--prune", "--quiet", url])
        .arg(format!("+refs/heads/skillfs/*:refs/remotes/{name}/*"));
    let fetched = child::output(fetch, deadline);
    match fetched {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            report.error = fail(
                Exit::RemoteFailed,
                format!(
                    "could not fetch from remote '{name}' ({url}): {}",
                    said(&out)
                ),
            );
            return report;
        }
        Err(e) => {
            report.error = Some(failed("fetch", e));
            return report;
        }
    }
    let prefix = format!("refs/remotes/{name}/");
    if let Ok(out) = git(Some(repo))
        .args(["for-each-ref", "--format=%(refname)"])
        .arg(&prefix)
        .output()
    {
        for (id, r) in remote_refs(&out.stdout, &prefix, replica) {
            // Unsigned where signatures are wanted: never kept, so never
            // merged.
            // Nor is a signed one of another history than the one kept:
            // an old seal made a new commit, or another replica's, is no
            // way back to what was merged and removed since.
            let refused = signers.as_ref().and_then(|file| {
                super::trust::verify(repo, &r, &id, file).err().or_else(|| {
                    kept::diverges(repo, &id, &r).then(|| {
                        "it is not a descendant of what this store kept of that replica".to_string()
                    })
                })
            });
            if let Some(why) = refused {
                let aside = kept::resolve(repo, &r)
                    .map(|c| super::trust::quarantine(repo, &id, &c))
                    .unwrap_or_default();
                report.rewritten.push(format!(
                    "replica {id}'s newest commit on remote '{name}' is not signed by a key of \
                     the remote's signers ({why}): quarantined as {aside}, not merged"
                ));
                report.replicas.push((id.clone(), kept::commits(repo, &id)));
                continue;
            }
            match kept::keep(repo, &id, &r) {
                Ok(kept::Kept::Diverged(aside)) => report.rewritten.push(format!(
                    "remote '{name}' holds another history of replica {id} than this store \
                     fetched before (rewritten by someone): the earlier one is kept as {aside}"
                )),
                Ok(_) => {}
                Err(why) => report.rewritten.push(format!(
                    "could not keep what was fetched of replica {id}: {why}"
                )),
            }
            report.replicas.push((id.clone(), kept::commits(repo, &id)));
        }
    }
    report
}
