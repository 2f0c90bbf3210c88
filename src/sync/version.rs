//! One version of another replica, named as `log --replica` prints it
//! (`REPLICA:ID`: the start of the replica's id, at least 8 hex digits,
//! and its change id there), shown (`skillfs show`) or put back in this
//! tree (`skillfs restore`).
//!
//! A restore is a merge unit's write (`apply_as`): PATH and everything
//! below it made as that version has them, staged and swapped in through
//! the mount whole (a skill as one rename), a version of this tree whose
//! actor names the replica, which `undo` takes back; entries below PATH
//! that version does not have are removed (as a restore of this tree's
//! own versions does). A unit a writer has open is left as it is (each
//! unit is written or left whole, and what was written is said), and a
//! version a signed remote quarantined is refused: those are never put in
//! the tree (`show` prints one, to judge it, and says so).
//!
//! Invariants: nothing here writes into the blob store, and into the
//! sync repository nothing but what taking `sync/lock` clears (a killed
//! git's lock files) and `sync/blobmap`'s new lines; the bytes written
//! are checked against their hashes as they stream from git (`gittree`),
//! and a link that would lead out of the tree is left out, as in a merge.
//!
//! Locks: `restore` holds `sync/lock` (no sync merges meanwhile); `show`
//! none (git reads without them); `diff` takes it without waiting, only
//! to append what it hashed to `sync/blobmap`, and goes without if busy.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::apply::{TheirSide, take_side};
use super::fetched::{Fetched, fetched, pick};
use super::git::git_output;
use super::gittree::GitBlobs;
use super::remotes::sync_dir;
use super::{git, lock};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::Layout;

/// The fewest hex digits of a replica's id that name a version: as many
/// as `log --replica` prints. An all-digit one could also be a change id
/// of this store (10^7 changes and more): the caller falls back to that
/// when the store keeps no such replica (`keeps_replica`).
const SHORTEST: usize = 8;

/// Whether the store keeps exactly one replica whose id starts with
/// `prefix`.
pub fn keeps_replica(layout: &Layout, prefix: &str) -> bool {
    pick(layout, prefix).is_ok()
}

/// At most this many entries left out of a restore are named.
const LEFT_OUT_SHOWN: usize = 10;

/// `REPLICA:ID` as the replica's id (or its start) and its change id, if
/// `spec` is one.
pub fn parse_version(spec: &str) -> Option<(&str, u64)> {
    let (r, n) = spec.split_once(':')?;
    let hex = (SHORTEST..=32).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    (hex && digits).then(|| n.parse().ok().map(|n| (r, n)))?
}

/// `REPLICA:ID:PATH` as a version and a path, if `spec` is one.
pub fn parse_version_path(spec: &str) -> Option<((&str, u64), &str)> {
    let (r, rest) = spec.split_once(':')?;
    let (n, path) = rest.split_once(':')?;
    let v = parse_version(&spec[..r.len() + 1 + n.len()])?;
    Some((v, path))
}

/// The version `id` of the replica `prefix` names, and the repository
/// that holds it.
fn find(
    layout: &Layout,
    (prefix, id): (&str, u64),
) -> Result<(std::path::PathBuf, Fetched), Failure> {
    let (repo, replica) = pick(layout, prefix)?;
    let all = fetched(layout, &replica, None)?;
    match choose(&all, id) {
        Some(v) => Ok((repo, v.clone())),
        None => Err(Failure::new(
            Exit::NotFound,
            format!(
                "replica {replica} has no version {id} kept here (`skillfs log --replica {}` lists them)",
                &replica[..SHORTEST]
            ),
        )),
    }
}

/// The version `id` among a replica's (`fetched`). One id on several
/// histories (a rewritten branch may reuse ids): the branch's own, then
/// one rewound away, then a quarantined one.
pub(super) fn choose(all: &[Fetched], id: u64) -> Option<&Fetched> {
    all.iter()
        .find(|v| v.id == id && !v.quarantined && !v.rewound)
        .or_else(|| all.iter().find(|v| v.id == id && !v.quarantined))
        .or_else(|| all.iter().find(|v| v.id == id))
}

fn no_path(v: &Fetched, path: &RelPath) -> Failure {
    Failure::new(
        Exit::NotFound,
        format!(
            "'{path}' is not in replica {}'s version {} (commit {})",
            v.replica, v.id, v.commit
        ),
    )
}

/// One entry of a git tree (`ls-tree` line): mode, type and object id.
struct Listed {
    mode: String,
    kind: String,
    object: String,
    name: Vec<u8>,
}

/// `git ls-tree -z` of `treeish` (with `path`, that entry alone).
fn ls_tree(repo: &Path, treeish: &str, path: Option<&RelPath>) -> Result<Vec<Listed>, Failure> {
    let mut c = git(Some(repo));
    c.args(["--literal-pathspecs", "ls-tree", "-z", "--full-tree"])
        .arg(treeish)
        .arg("--");
    if let Some(p) = path {
        c.arg(std::ffi::OsStr::from_bytes(p.as_bytes()));
    }
    let out = git_output(c, &format!("list {treeish} in '{}'", repo.display()))?;
    Ok(out
        .split(|&b| b == 0)
        .filter_map(|line| {
            let tab = line.iter().position(|&b| b == b'\t')?;
            let head = std::str::from_utf8(&line[..tab]).ok()?;
            let mut f = head.split(' ');
            Some(Listed {
                mode: f.next()?.to_string(),
                kind: f.next()?.to_string(),
                object: f.next()?.to_string(),
                name: line[tab + 1..].to_vec(),
            })
        })
        .collect())
}

/// Prints `path` as replica `version` had it: a file's bytes, a link's
/// target, a directory's entries (`show`'s forms for this store's own).
pub fn show_version(layout: &Layout, version: (&str, u64), path: &RelPath) -> Result<(), Failure> {
    let (repo, v) = find(layout, version)?;
    let (tree, kind, mode) = if path.is_root() {
        (
            format!("{}^{{tree}}", v.commit),
            "tree".to_string(),
            String::new(),
        )
    } else {
        let listed = ls_tree(&repo, &v.commit, Some(path))?;
        let e = listed
            .into_iter()
            .find(|e| e.name == path.as_bytes())
            .ok_or_else(|| no_path(&v, path))?;
        (e.object, e.kind, e.mode)
    };
    say_quarantined(&v, "printed");
    let mut out = std::io::stdout().lock();
    let res = match kind.as_str() {
        "tree" => {
            let mut r = Ok(());
            for e in ls_tree(&repo, &tree, None)? {
                let name = e.name.rsplit(|&b| b == b'/').next().unwrap_or(&e.name);
                let slash = if e.kind == "tree" { "/" } else { "" };
                // Another machine's names: no control byte reaches the
                // terminal as it is (a newline would forge an entry).
                r = r
                    .and_then(|()| out.write_all(&crate::commands::escaped(name)))
                    .and_then(|()| writeln!(out, "{slash}"));
            }
            r
        }
        "blob" => {
            // Streamed by git itself (a file may be large).
            let _ = out.flush();
            let status = git(Some(&repo))
                .args(["cat-file", "blob", &tree])
                .status()
                .map_err(|e| {
                    Failure::new(Exit::Internal, format!("could not run git cat-file: {e}"))
                })?;
            // A reader that stopped reading (`| head`) ends git by SIGPIPE:
            // not an error, as for this store's own `show`.
            use std::os::unix::process::ExitStatusExt;
            if !status.success() && status.signal() != Some(libc::SIGPIPE) {
                return Err(Failure::new(
                    Exit::BadStore,
                    format!("git could not read {tree} of commit {}", v.commit),
                ));
            }
            if mode == "120000" {
                writeln!(out)
            } else {
                Ok(())
            }
        }
        // A submodule: no entry of a version.
        _ => return Err(no_path(&v, path)),
    };
    let _ = res; // a closed stdout (`| head`) is not an error
    Ok(())
}

/// Another replica's version, for `diff`: its tree and where its files'
/// bytes are read from.
pub struct TheirVersion {
    /// Its name as `log --replica` prints it (`REPLICA:ID`).
    pub label: String,
    tree: skillfs_sync::tree::Tree,
    blobs: GitBlobs,
}

impl TheirVersion {
    /// `path` and everything below it as this version has them, modes
    /// as git keeps them (a file executable or not).
    pub fn side(&self, path: &RelPath) -> crate::commands::DiffSide {
        use skillfs_sync::tree::Entry;
        let entries: Vec<(&[u8], &Entry)> = if path.is_root() {
            self.tree.iter().collect()
        } else {
            self.tree.subtree(path.as_bytes()).into_iter().collect()
        };
        let entries = entries
            .into_iter()
            .filter_map(|(p, e)| {
                let shown = match e {
                    Entry::Dir => crate::commands::Shown {
                        kind: crate::store::journal::Kind::Dir,
                        mode: None,
                        blob: None,
                        target: None,
                    },
                    Entry::File { blob, exec } => crate::commands::Shown {
                        kind: crate::store::journal::Kind::File,
                        mode: Some(if *exec { 0o755 } else { 0o644 }),
                        blob: Some(blob.clone()),
                        target: None,
                    },
                    Entry::Symlink { target } => crate::commands::Shown {
                        kind: crate::store::journal::Kind::Symlink,
                        mode: None,
                        blob: None,
                        target: Some(target.clone()),
                    },
                };
                Some((RelPath::parse(p)?, shown))
            })
            .collect();
        crate::commands::DiffSide {
            label: self.label.clone(),
            entries,
        }
    }

    /// A file's bytes by its sha256, read from git (`None`: not this
    /// version's, or too large to hold whole).
    pub fn read(&self, blob: &str) -> Option<Vec<u8>> {
        self.blobs.fetched(blob)
    }

    /// Whether this version's git holds the file named `blob`.
    pub fn has(&self, blob: &str) -> bool {
        self.blobs.knows(blob)
    }
}

/// Notes on stderr that `v`, `done` (printed, compared), was quarantined.
fn say_quarantined(v: &Fetched, done: &str) {
    if v.quarantined {
        eprintln!(
            "skillfs: replica {}'s version {} was quarantined by a signed remote's check \
             (never merged): {done} as that replica sent it",
            &v.replica[..SHORTEST],
            v.id
        );
    }
}

/// The tree of `v`'s commit; what it leaves out is said in `skipped`.
fn read_tree(
    blobs: &mut GitBlobs,
    v: &Fetched,
    skipped: &mut Vec<String>,
) -> Result<skillfs_sync::tree::Tree, Failure> {
    blobs.tree(&v.commit, skipped).map_err(|why| {
        Failure::new(
            Exit::BadStore,
            format!(
                "cannot read replica {}'s commit {}: {why}",
                v.replica, v.commit
            ),
        )
    })
}

/// Replica `version`'s tree, to compare (`skillfs diff`). Changes
/// nothing but `sync/blobmap`, where git's ids it hashed are noted for the
/// next reader when no sync holds the lock (a diff never waits for one).
/// A quarantined version is read as that replica sent it, and said so.
pub fn their_version(layout: &Layout, version: (&str, u64)) -> Result<TheirVersion, Failure> {
    let (repo, v) = find(layout, version)?;
    let dir = repo.parent().unwrap_or(&repo).to_path_buf();
    let mut blobs = GitBlobs::open(&dir, &repo);
    let tree = read_tree(&mut blobs, &v, &mut Vec::new())?;
    // Held only for the append, and only when there is one: a sync
    // started meanwhile is refused as busy for that moment. (Opened, never
    // made, and never through a symlink, as a sync opens it.)
    if blobs.unsaved()
        && let Ok(sync) = crate::store::Dir::open_path(&dir)
        && let Ok(lock) = sync.open("lock", libc::O_RDWR, 0)
        && crate::sys::try_lock_exclusive(&lock).unwrap_or(false)
        && let Err(why) = blobs.save()
    {
        tracing::warn!("diff: could not save sync/blobmap: {why}");
    }
    let label = format!("{}:{}", &v.replica[..SHORTEST], v.id);
    say_quarantined(&v, "compared");
    Ok(TheirVersion { label, tree, blobs })
}

/// Puts `path` back in the mounted `root` as replica `version` had it
/// (see the module's doc). Returns what it did, for the user.
pub fn restore_version(
    layout: &Layout,
    root: &Path,
    version: (&str, u64),
    path: &RelPath,
) -> Result<String, Failure> {
    if path.is_root() {
        return Err(Failure::new(
            Exit::Usage,
            "restore takes a path below ROOT; restore the top-level entries one by one",
        ));
    }
    let Some(dir) = sync_dir(layout, false)? else {
        // No sync ever ran: `find` says which replicas there are (none).
        find(layout, version)?;
        return Err(Failure::new(
            Exit::Internal,
            "the store's sync directory went away",
        ));
    };
    // No merge meanwhile; the version is looked up under it.
    let _lock = lock(&dir, layout)?;
    let (repo, v) = find(layout, version)?;
    if v.quarantined {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "replica {}'s version {} was quarantined by a signed remote's check: it is never \
                 put in the tree (`skillfs show` prints it)",
                v.replica, v.id
            ),
        ));
    }
    let mut blobs = GitBlobs::open(dir.path(), &repo);
    let mut skipped = Vec::new();
    let theirs = read_tree(&mut blobs, &v, &mut skipped)?;
    let at = path.as_bytes();
    // What was left out at or below `path` (`tree` names each as 'PATH' (why)).
    let shown = String::from_utf8_lossy(at);
    let left_out: Vec<&String> = skipped
        .iter()
        .filter(|s| {
            s.strip_prefix('\'')
                .and_then(|s| s.strip_prefix(&*shown))
                .is_some_and(|rest| rest.starts_with('\'') || rest.starts_with('/'))
        })
        .collect();
    let left_out = match left_out.len() {
        0 => String::new(),
        n => format!(
            "; left out: {}{}",
            left_out
                .iter()
                .take(LEFT_OUT_SHOWN)
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            if n > LEFT_OUT_SHOWN {
                format!(" and {} more", n - LEFT_OUT_SHOWN)
            } else {
                String::new()
            }
        ),
    };
    if theirs.get(at).is_none() {
        if !left_out.is_empty() {
            return Err(Failure::new(
                Exit::Usage,
                format!("nothing was restored{left_out}"),
            ));
        }
        return Err(no_path(&v, path));
    }
    // What this run hashed is remembered for the next (under the lock).
    if let Err(why) = blobs.save() {
        tracing::warn!("restore: could not save sync/blobmap: {why}");
    }
    let side = TheirSide {
        replica: &v.replica,
        repo: &repo,
        commit: &v.commit,
        tree: &theirs,
        blobs: &blobs,
    };
    let applied = take_side(root, layout, &dir, &side, at, "nothing was restored")?;
    Ok(format!(
        "restored {path} as replica {}'s version {} had it (commit {}){}{left_out}",
        &v.replica[..SHORTEST],
        v.id,
        &v.commit[..12.min(v.commit.len())],
        if applied.done.is_empty() {
            ": it was so already"
        } else {
            ": a version of this tree (skillfs undo takes it back)"
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicas_version_is_named_by_eight_hex_digits_or_more() {
        assert_eq!(parse_version("0a1b2c3d:42"), Some(("0a1b2c3d", 42)));
        assert_eq!(parse_version("12345678:7"), Some(("12345678", 7)));
        assert_eq!(parse_version("0a1b2c3:42"), None, "seven digits");
        assert_eq!(parse_version("latest:42"), None);
        assert_eq!(parse_version("0a1b2c3d:"), None);
        assert_eq!(parse_version("0a1b2c3d:4x"), None);
        assert_eq!(parse_version("42"), None);
        assert_eq!(
            parse_version_path("0a1b2c3d:42:cat/s/SKILL.md"),
            Some((("0a1b2c3d", 42), "cat/s/SKILL.md"))
        );
        assert_eq!(
            parse_version_path("0a1b2c3d:42:"),
            Some((("0a1b2c3d", 42), ""))
        );
        assert_eq!(parse_version_path("42:cat/s/SKILL.md"), None);
        assert_eq!(parse_version_path("0a1b2c3d:x:cat"), None);
    }
}
