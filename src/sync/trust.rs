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

/// What a seal's checks read of a commit: its headers and its message.
struct Raw {
    /// Each header's name and first line, in order.
    headers: Vec<(String, String)>,
    message: String,
}

fn raw(repo: &Path, commit: &str) -> Option<Raw> {
    let out = git(Some(repo))
        .args(["cat-file", "commit", commit])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, message) = text.split_once("\n\n").unwrap_or((&text, ""));
    let headers = head
        .lines()
        // A continuation line (of a signature) starts with a space.
        .filter(|l| !l.starts_with(' '))
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap_or((l, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    Some(Raw {
        headers,
        message: message.to_string(),
    })
}

/// The committer a seal of `replica` names (git's identity, and the
/// replica it stands for: part of what the signature covers).
fn seal_email(replica: &str) -> String {
    format!("skillfs@{replica}")
}

/// The first line of a seal's message.
fn seal_subject(replica: &str) -> String {
    format!("skillfs: replica {replica}, signed")
}

/// Why `commit` is not a seal of `replica` as `seal` makes them: one ssh
/// signature and no other (a `gpgsig-sha256` header is outside what the
/// signature covers: a way to make a new commit id of a signed commit),
/// `replica`'s seal committer and subject (so a commit a signer made for
/// anything else, or for another replica, is not one).
fn not_a_seal(repo: &Path, commit: &str, replica: &str) -> Option<String> {
    let Some(raw) = raw(repo, commit) else {
        return Some("it is not a commit".into());
    };
    let sigs: Vec<&str> = raw
        .headers
        .iter()
        .filter(|(k, _)| k.starts_with("gpgsig") || k == "mergetag")
        .map(|(k, v)| if k == "gpgsig" { v.as_str() } else { "" })
        .collect();
    match sigs.as_slice() {
        [] => return Some("it is not signed".into()),
        [s] if s.trim() == "-----BEGIN SSH SIGNATURE-----" => {}
        [_] => return Some("it is signed, but not with an ssh key".into()),
        _ => return Some("it carries more than one signature header".into()),
    }
    let committer = raw
        .headers
        .iter()
        .find(|(k, _)| k == "committer")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let subject = raw.message.lines().next().unwrap_or("");
    if !committer.contains(&format!("<{}>", seal_email(replica)))
        || subject != seal_subject(replica)
    {
        return Some(format!("it is not a skillfs seal of replica {replica}"));
    }
    None
}

/// Signs the tip of `branch` (a seal on it) unless it is a seal of
/// `replica` already. Returns whether it made one.
pub fn seal(repo: &Path, branch: &str, replica: &str) -> Result<bool, Failure> {
    let Some(tip) = super::kept::resolve(repo, branch) else {
        return Ok(false);
    };
    if not_a_seal(repo, &tip, replica).is_none() {
        return Ok(false);
    }
    let trailers = git(Some(repo))
        .args(["log", "-1", "--format=%(trailers:only,unfold)", &tip])
        .output()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not run git log: {e}")))?;
    let message = format!(
        "{}\n\n{}",
        seal_subject(replica),
        String::from_utf8_lossy(&trailers.stdout).trim()
    );
    let who = seal_email(replica);
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
    let cannot = |why: String| {
        Failure::new(
            Exit::Usage,
            format!(
                "a remote takes only signed commits (--sign), and git could not sign: {why} \
                 (set user.signingKey and gpg.format=ssh in your git config)"
            ),
        )
    };
    if !out.status.success() || sealed.is_empty() {
        return Err(cannot(said));
    }
    // Signed as the receivers check it (an OpenPGP one would be
    // quarantined there): nothing is moved otherwise.
    if let Some(why) = not_a_seal(repo, &sealed, replica) {
        return Err(cannot(why));
    }
    let mut c = git(Some(repo));
    c.args([
        "update-ref",
        "-m",
        "skillfs sync: sign",
        branch,
        &sealed,
        &tip,
    ]);
    super::git::git_output(c, &format!("move {branch} to its seal"))?;
    Ok(true)
}

/// Whether `commit` is a seal of `replica` that a key of `signers` signed
/// (`not_a_seal`, then `git verify-commit`), or why not.
pub fn verify(repo: &Path, commit: &str, replica: &str, signers: &Path) -> Result<(), String> {
    if !signers.is_file() {
        return Err(format!(
            "its signers file '{}' is missing",
            signers.display()
        ));
    }
    // Only an ssh signature is checked against the signers file: git
    // would check an OpenPGP or X.509 one against the user's keyring,
    // which the file does not bound.
    if let Some(why) = not_a_seal(repo, commit, replica) {
        return Err(why);
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
