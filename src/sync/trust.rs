//! Signed commits between replicas. Synced skills are instructions the
//! agent runs, and whoever can push to a remote can push a replica's
//! branch: a remote added with `--signers FILE` (ssh-keygen's
//! allowed_signers format, as git's `gpg.ssh.allowedSignersFile`) has each
//! fetched replica's tip checked by `git verify-commit` against that file
//! before it is kept; a tip that no key of it signed is **quarantined**
//! (`refs/skillfs/quarantine/<replica>` in `sync/repo.git`, for a look with
//! git) and never kept, so never merged. A remote added with `--sign` gets
//! this replica's tip signed before each push: a **seal**, a commit with
//! the tip's tree, the tip as its one parent and the tip's trailers, made
//! by `git commit-tree -S` with the user's own signing key (git's
//! `user.signingKey`, `gpg.format=ssh`).
//!
//! Why the tip alone: a commit's id covers its tree and its parents, so a
//! good signature on the tip vouches for every commit and file reachable
//! from it, and the merge reads nothing else of a replica (its tip, and
//! merge bases among the tip's ancestors).
//!
//! Layout: `sync/signers-<remote>`, a copy of the file given (private as
//! the rest of the store).
//!
//! Invariants: with signers, nothing fetched from that remote moves a
//! kept ref unless it carries an ssh signature and `git verify-commit`
//! passed on it with the remote's file (a missing file, a git that cannot
//! verify, an OpenPGP signature that only the user's keyring would judge:
//! quarantined, never trusted by default); a seal
//! changes no tree and holds the trailers the export and the merge read.

use std::path::{Path, PathBuf};

use super::git;
use crate::error::{Exit, Failure};
use crate::store::Dir;
use crate::store::durable::StoreIo;

/// The largest signers file taken.
const SIGNERS_MAX: u64 = 1 << 20;

fn signers_name(remote: &str) -> String {
    format!("signers-{remote}")
}

/// Where the store keeps `remote`'s signers.
pub fn signers_path(dir: &Dir, remote: &str) -> PathBuf {
    dir.join(&signers_name(remote))
}

/// The text of an allowed_signers file, checked to hold at least one key
/// line (a principal and a key type and key, options allowed between).
pub fn read_signers(path: &Path) -> Result<String, Failure> {
    let bad = |why: String| {
        Failure::new(
            Exit::Usage,
            format!("'{}' is not an allowed_signers file: {why}", path.display()),
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.len() > SIGNERS_MAX {
        return Err(bad(format!(
            "not a regular file of at most {SIGNERS_MAX} bytes"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let keys = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| {
            l.split_whitespace()
                .skip(1)
                .any(|w| w.starts_with("ssh-") || w.starts_with("ecdsa-") || w.starts_with("sk-"))
        })
        .count();
    if keys == 0 {
        return Err(bad(
            "no line names a principal and a key ('user@host ssh-ed25519 AAAA...')".into(),
        ));
    }
    Ok(text)
}

/// Keeps `text` as `remote`'s signers.
pub fn save_signers(dir: &Dir, remote: &str, text: &str) -> Result<(), Failure> {
    let name = signers_name(remote);
    dir.replace(&name, text.as_bytes(), &StoreIo::real())
        .map_err(|e| Failure::io(Exit::BadStore, "write", &dir.join(&name), &e))
}

/// Drops `remote`'s signers, if it had any.
pub fn forget_signers(dir: &Dir, remote: &str) -> Result<(), Failure> {
    let name = signers_name(remote);
    match dir.unlink(&name) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Failure::io(Exit::BadStore, "remove", &dir.join(&name), &e)),
    }
}

/// The first line of `commit`'s signature (its `gpgsig` header), if it
/// has one.
fn signature(repo: &Path, commit: &str) -> Option<String> {
    let out = git(Some(repo))
        .args(["cat-file", "commit", commit])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let header = text.split("\n\n").next().unwrap_or("");
    header
        .lines()
        .find_map(|l| l.strip_prefix("gpgsig ").map(str::to_string))
}

fn signed(repo: &Path, commit: &str) -> bool {
    signature(repo, commit).is_some()
}

/// Signs the tip of `branch` (a seal on it) unless it is signed already.
/// Returns whether it made a seal.
pub fn seal(repo: &Path, branch: &str, replica: &str) -> Result<bool, Failure> {
    let Some(tip) = super::kept::resolve(repo, branch) else {
        return Ok(false);
    };
    if signed(repo, &tip) {
        return Ok(false);
    }
    let trailers = git(Some(repo))
        .args(["log", "-1", "--format=%(trailers:only,unfold)", &tip])
        .output()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git log: {e}")))?;
    let message = format!(
        "skillfs: replica {replica}, signed\n\n{}",
        String::from_utf8_lossy(&trailers.stdout).trim()
    );
    let who = format!("skillfs@{replica}");
    let out = git(Some(repo))
        .env("GIT_AUTHOR_NAME", "skillfs")
        .env("GIT_AUTHOR_EMAIL", &who)
        .env("GIT_COMMITTER_NAME", "skillfs")
        .env("GIT_COMMITTER_EMAIL", &who)
        .args(["commit-tree", "-S", "-p", &tip, "-m", &message])
        .arg(format!("{tip}^{{tree}}"))
        .output()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git: {e}")))?;
    let said = String::from_utf8_lossy(&out.stderr)
        .trim()
        .replace('\n', "; ");
    let sealed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || sealed.is_empty() {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "a remote takes only signed commits (--sign), and git could not sign: {said} \
                 (set user.signingKey and gpg.format=ssh in your git config)"
            ),
        ));
    }
    let out = git(Some(repo))
        .args([
            "update-ref",
            "-m",
            "skillfs sync: sign",
            branch,
            &sealed,
            &tip,
        ])
        .output()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git: {e}")))?;
    if !out.status.success() {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "could not move {branch} to its seal: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(true)
}

/// Whether a key of `signers` signed `commit` (`git verify-commit`), or
/// what git said.
pub fn verify(repo: &Path, commit: &str, signers: &Path) -> Result<(), String> {
    if !signers.is_file() {
        return Err(format!(
            "its signers file '{}' is missing",
            signers.display()
        ));
    }
    // Only an ssh signature is checked against the signers file: git
    // would check an OpenPGP or X.509 one against the user's keyring,
    // which the file does not bound.
    match signature(repo, commit) {
        None => return Err("it is not signed".into()),
        Some(s) if s.trim() != "-----BEGIN SSH SIGNATURE-----" => {
            return Err("it is signed, but not with an ssh key".into());
        }
        Some(_) => {}
    }
    let out = git(Some(repo))
        .arg("-c")
        .arg(format!("gpg.ssh.allowedSignersFile={}", signers.display()))
        .args(["verify-commit", commit])
        .output()
        .map_err(|e| format!("could not run git verify-commit: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let said = String::from_utf8_lossy(&out.stderr)
            .trim()
            .replace('\n', "; ");
        Err(if said.is_empty() {
            "it is not signed".to_string()
        } else {
            said
        })
    }
}

/// Puts `commit` of `replica` aside, where git shows it and nothing
/// merges it; returns the ref.
pub fn quarantine(repo: &Path, replica: &str, commit: &str) -> String {
    let r = format!("refs/skillfs/quarantine/{replica}");
    let _ = git(Some(repo))
        .args(["update-ref", "-m", "skillfs sync: quarantine", &r, commit])
        .output();
    r
}
