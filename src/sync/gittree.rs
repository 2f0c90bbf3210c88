//! A replica's commit as a merge sees it: a `Tree` whose files are named
//! by the hash the blob store uses (sha256), read from the store's sync
//! repository; and the contents behind those names, from the blob store
//! (this replica's versions) or from git (what was fetched).
//!
//! Nothing here writes into the blob store (the daemon owns it while
//! mounted): a fetched file reaches the store when the merge writes it
//! through the mount, as any other write. Git's ids are mapped to sha256
//! once and remembered in `sync/blobmap` (one `SHA1 SHA256` line each),
//! so a file is read from git to be hashed only the first time.
//!
//! Invariants: every path taken from git is checked (`tree::valid_path`);
//! a submodule, or any entry git lists that is no file, link or
//! directory, is left out and said. Each content read from git is hashed
//! here, so a name always matches its bytes.
//!
//! Locks: `sync/lock`, held by the caller.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use sha2::{Digest, Sha256};
use skillfs_sync::merge::Contents;
use skillfs_sync::tree::{Entry, Tree, valid_path};

use super::git;
use crate::store::blobs::BlobStore;

const BLOBMAP: &str = "blobmap";
/// A fetched file larger than this is never held in memory whole: it is
/// hashed and written as it streams from git, and a merge takes it for
/// binary (both sides changed: a conflict, never a line merge).
const KEEP_MAX: usize = 8 << 20;
/// The most bytes of fetched files held in memory at once; past it a file
/// is only hashed, and read again from git when it is needed.
const HELD_MAX: usize = 64 << 20;

/// Git ids mapped to the blob store's, and the contents read this run.
pub struct GitBlobs {
    repo: PathBuf,
    map_path: PathBuf,
    /// Git's id of a blob to its sha256 (hex).
    sha256: HashMap<String, String>,
    /// The other way, to read a fetched file back from git.
    git_id: HashMap<String, String>,
    /// Contents read from git this run, by sha256 (at most [`HELD_MAX`]
    /// bytes in all).
    read: HashMap<String, Vec<u8>>,
    held: usize,
    /// Lines of `sync/blobmap` not written yet.
    new: Vec<String>,
}

pub(super) fn hex_sha256(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|x| format!("{x:02x}")).collect()
}

impl GitBlobs {
    /// The map kept in `sync_dir`, for the repository `repo`.
    pub fn open(sync_dir: &Path, repo: &Path) -> GitBlobs {
        let map_path = sync_dir.join(BLOBMAP);
        let mut g = GitBlobs {
            repo: repo.to_path_buf(),
            map_path,
            sha256: HashMap::new(),
            git_id: HashMap::new(),
            read: HashMap::new(),
            held: 0,
            new: Vec::new(),
        };
        if let Ok(text) = std::fs::read_to_string(&g.map_path) {
            for line in text.lines() {
                // A torn last line (a sync killed while appending) is
                // skipped: it is hashed again when needed.
                let hex = |t: &str| t.bytes().all(|c| c.is_ascii_hexdigit());
                if let Some((a, b)) = line.split_once(' ')
                    && a.len() == 40
                    && b.len() == 64
                    && hex(a)
                    && hex(b)
                {
                    g.sha256.insert(a.to_string(), b.to_string());
                    g.git_id.insert(b.to_string(), a.to_string());
                }
            }
        }
        g
    }

    /// Reads the blobs `ids` from git (one `cat-file --batch`), hashes
    /// and remembers them.
    fn load(&mut self, ids: &[String]) -> Result<(), String> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut child = git(Some(&self.repo))
            .args(["cat-file", "--batch"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not run git cat-file: {e}"))?;
        let mut input = child.stdin.take().expect("piped");
        let text: String = ids.iter().map(|i| format!("{i}\n")).collect();
        // Written on a thread: git answers while it reads.
        let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        for id in ids {
            let mut header = String::new();
            out.read_line(&mut header)
                .map_err(|e| format!("git cat-file: {e}"))?;
            let mut parts = header.split_whitespace();
            let (Some(got), Some("blob"), Some(size)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(format!("git cat-file has no blob {id}: {}", header.trim()));
            };
            let size: usize = size
                .parse()
                .map_err(|_| format!("git cat-file: a bad header '{}'", header.trim()))?;
            if got != id {
                return Err(format!("git cat-file answered {got} for {id}"));
            }
            // Hashed as it streams by; kept only when small (a large one is
            // read again from git, streamed, when it is written).
            let mut hasher = Sha256::new();
            let keep = size <= KEEP_MAX && self.held + size <= HELD_MAX;
            let mut kept = Vec::new();
            let mut left = size;
            let mut buf = vec![0u8; 64 << 10];
            while left > 0 {
                let n = left.min(buf.len());
                out.read_exact(&mut buf[..n])
                    .map_err(|e| format!("git cat-file: {e}"))?;
                hasher.update(&buf[..n]);
                if keep {
                    kept.extend_from_slice(&buf[..n]);
                }
                left -= n;
            }
            out.read_exact(&mut [0u8; 1])
                .map_err(|e| format!("git cat-file: {e}"))?;
            let sha = hex(&hasher.finalize());
            if !self.sha256.contains_key(id) {
                self.new.push(format!("{id} {sha}\n"));
            }
            self.sha256.insert(id.clone(), sha.clone());
            self.git_id.insert(sha.clone(), id.clone());
            if keep {
                self.held += size;
                self.read.insert(sha, kept);
            }
        }
        let _ = writer.join();
        let _ = child.wait();
        Ok(())
    }

    /// Whether this run hashed something `sync/blobmap` does not say.
    pub fn unsaved(&self) -> bool {
        !self.new.is_empty()
    }

    /// Appends what was learnt to `sync/blobmap`.
    pub fn save(&mut self) -> Result<(), String> {
        if self.new.is_empty() {
            return Ok(());
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.map_path)
            .map_err(|e| format!("{}: {e}", self.map_path.display()))?;
        f.write_all(self.new.concat().as_bytes())
            .and_then(|_| f.sync_data())
            .map_err(|e| format!("{}: {e}", self.map_path.display()))?;
        self.new.clear();
        Ok(())
    }

    /// The tree of `commit`, its files named by sha256; what was left out
    /// (a submodule, a name that is no path) is said in `skipped`.
    pub fn tree(&mut self, commit: &str, skipped: &mut Vec<String>) -> Result<Tree, String> {
        let out = git(Some(&self.repo))
            .args(["ls-tree", "-r", "-t", "-z", "--full-tree", commit])
            .output()
            .map_err(|e| format!("could not run git ls-tree: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "git ls-tree {commit}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let mut listed: Vec<(Vec<u8>, String, String)> = Vec::new();
        for item in out.stdout.split(|&b| b == 0).filter(|i| !i.is_empty()) {
            let Some(tab) = item.iter().position(|&b| b == b'\t') else {
                return Err("git ls-tree: a line without a tab".into());
            };
            let head = String::from_utf8_lossy(&item[..tab]).to_string();
            let path = item[tab + 1..].to_vec();
            let mut f = head.split(' ');
            let (Some(mode), Some(_), Some(id)) = (f.next(), f.next(), f.next()) else {
                return Err(format!("git ls-tree: a bad line '{head}'"));
            };
            if !valid_path(&path) || path.split(|&b| b == b'/').any(|c| c == b".history") {
                skipped.push(format!("'{}' (not a path)", String::from_utf8_lossy(&path)));
                continue;
            }
            listed.push((path, mode.to_string(), id.to_string()));
        }
        let mut missing = std::collections::BTreeSet::new();
        for (_, mode, id) in &listed {
            let known = self.sha256.get(id);
            let need = match mode.as_str() {
                // A link's target is its content: read it whatever the map knows.
                "120000" => !known.is_some_and(|s| self.read.contains_key(s)),
                m if m.starts_with("100") => known.is_none(),
                _ => false,
            };
            if need {
                missing.insert(id.clone());
            }
        }
        let missing: Vec<String> = missing.into_iter().collect();
        self.load(&missing)?;
        let mut tree = Tree::new();
        for (path, mode, id) in listed {
            let entry = match mode.as_str() {
                "040000" => Entry::Dir,
                m if m.starts_with("100") => Entry::File {
                    blob: self.sha256[&id].clone(),
                    exec: mode == "100755",
                },
                "120000" => {
                    let sha = &self.sha256[&id];
                    let Some(target) = self.read.get(sha).cloned().or_else(|| {
                        self.fetched(sha)
                            .filter(|t| t.len() <= libc::PATH_MAX as usize)
                    }) else {
                        skipped.push(format!(
                            "'{}' (a link too long)",
                            String::from_utf8_lossy(&path)
                        ));
                        continue;
                    };
                    if !link_stays_inside(&path, &target) {
                        skipped.push(format!(
                            "'{}' (a link out of the tree, to '{}')",
                            String::from_utf8_lossy(&path),
                            String::from_utf8_lossy(&target)
                        ));
                        continue;
                    }
                    Entry::Symlink { target }
                }
                _ => {
                    skipped.push(format!(
                        "'{}' (git mode {mode})",
                        String::from_utf8_lossy(&path)
                    ));
                    continue;
                }
            };
            tree.insert(&path, entry);
        }
        Ok(tree)
    }

    /// Whether git holds the file named `sha` (sha256), as far as this
    /// run has mapped it.
    pub(super) fn knows(&self, sha: &str) -> bool {
        self.read.contains_key(sha) || self.git_id.contains_key(sha)
    }

    /// The contents of a fetched file, by sha256, read from git if this
    /// run has not read it yet.
    pub(super) fn fetched(&self, sha: &str) -> Option<Vec<u8>> {
        if let Some(b) = self.read.get(sha) {
            return Some(b.clone());
        }
        let id = self.git_id.get(sha)?;
        let size = git(Some(&self.repo))
            .args(["cat-file", "-s", id])
            .output()
            .ok()
            .and_then(|o| super::parse_count(&o.stdout))?;
        if size as usize > KEEP_MAX {
            return None;
        }
        let out = git(Some(&self.repo))
            .args(["cat-file", "blob", id])
            .output()
            .ok()?;
        (out.status.success() && hex_sha256(&out.stdout) == sha).then_some(out.stdout)
    }

    /// Writes the fetched file `sha` at `to` as it streams from git,
    /// checked against its name.
    fn stream_into(&self, sha: &str, to: &Path) -> Result<(), String> {
        let id = self
            .git_id
            .get(sha)
            .ok_or_else(|| format!("the content {sha} of '{}' is nowhere", to.display()))?;
        let mut child = git(Some(&self.repo))
            .args(["cat-file", "blob", id])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not run git cat-file: {e}"))?;
        let mut from = child.stdout.take().expect("piped");
        let mut file = std::fs::File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = from
                .read(&mut buf)
                .map_err(|e| format!("git cat-file: {e}"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n])
                .map_err(|e| format!("{}: {e}", to.display()))?;
        }
        let _ = child.wait();
        let got = hex(&hasher.finalize());
        if got != sha {
            return Err(format!(
                "git gave other bytes than {sha} for '{}'",
                to.display()
            ));
        }
        Ok(())
    }
}

/// Whether a link at `path` to `target` stays inside the tree whatever
/// the tree's other links are: relative, and with no `..` at all (a
/// target that only goes down, even through other links that only go
/// down, never leaves the link's own directory). A synced skill is
/// instructions the agent runs: no link from another machine may lead
/// out of the tree, and a chain of links each climbing a little can.
pub fn link_stays_inside(_path: &[u8], target: &[u8]) -> bool {
    // A NUL ends the target where the kernel reads it (`..\0x` is `..`).
    !target.is_empty()
        && !target.contains(&0)
        && !target.starts_with(b"/")
        && target.split(|&b| b == b'/').all(|c| c != b"..")
}

/// Contents for a merge: the blob store's, then git's.
pub struct Both<'a> {
    pub store: &'a BlobStore,
    pub git: &'a GitBlobs,
    /// Texts the merge made.
    pub made: HashMap<String, Vec<u8>>,
}

impl Both<'_> {
    /// Writes the file named `blob` at `to` (a new file).
    pub fn write_into(&self, blob: &str, to: &Path) -> Result<(), String> {
        if let Some(b) = self.made.get(blob) {
            return std::fs::write(to, b).map_err(|e| format!("{}: {e}", to.display()));
        }
        if let Ok(b) = self.store.read(blob) {
            return std::fs::write(to, b).map_err(|e| format!("{}: {e}", to.display()));
        }
        self.git.stream_into(blob, to)
    }
}

impl Contents for Both<'_> {
    fn read(&self, blob: &str) -> Option<Vec<u8>> {
        if let Some(b) = self.made.get(blob) {
            return Some(b.clone());
        }
        self.store
            .read(blob)
            .ok()
            .or_else(|| self.git.fetched(blob))
    }
}

#[cfg(test)]
mod tests {
    use super::link_stays_inside;

    #[test]
    fn a_link_is_taken_only_when_it_stays_in_the_tree() {
        assert!(link_stays_inside(b"cat/s/l", b"SKILL.md"));
        assert!(link_stays_inside(b"cat/s/l", b"./references/r.md"));
        // A climb, however small: chained, links climb out (found by review).
        assert!(!link_stays_inside(b"cat/s/l", b"../t/SKILL.md"));
        assert!(!link_stays_inside(b"a/b/c/d/e/m", b"../../../../../.."));
        assert!(!link_stays_inside(b"cat/s/l", b"../../../etc/passwd"));
        assert!(!link_stays_inside(b"l", b".."));
        assert!(!link_stays_inside(b"cat/l", b"/etc/passwd"));
        assert!(!link_stays_inside(b"cat/l", b""));
        assert!(!link_stays_inside(b"cat/l", b"./x/../y"));
        assert!(!link_stays_inside(b"l", b"..\0x"), "cut at the NUL: '..'");
        assert!(!link_stays_inside(b"l", b"a\0"));
    }
}
