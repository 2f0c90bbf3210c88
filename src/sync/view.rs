//! Other replicas' versions for the daemon's `.history`: the name
//! `REPLICA:ID` there is that version's tree, read from the store's
//! `sync/repo.git` (see `skillfs_core::fs::Replicas`), so a plain `cp`
//! restores from it as from this tree's own versions.
//!
//! What it shows is what a merge or `restore` would take of that
//! version: the same names and links are left out (a name that is no
//! path, any name `.history`, a submodule, a link that is absolute or
//! climbs with `..`); a file is 0644 or 0755 as git keeps it, and every
//! entry has the version's own time. A version a signed remote
//! quarantined resolves to nothing (`skillfs show` prints it, to judge
//! it): it is never put where a plain `cp` takes it into the tree.
//!
//! Invariants: it only reads the repository (git takes no lock to read,
//! and a sync running meanwhile only adds to it), with git made a reader
//! for the mount (`git::for_the_mount`: none of the user's configuration,
//! a bounded CPU time); a file's bytes are streamed by git into an
//! unlinked file in the store's `sync/` directory (a memory file where
//! that filesystem has no `O_TMPFILE`), which the reader's handle holds
//! (the core shares it with the opens of that file meanwhile) and which
//! is gone when the last closes (the last small ones are kept a while,
//! [`COPIES_KEPT`] of at most [`COPY_KEPT_MAX`] bytes, to open again without
//! git), and only while that leaves the
//! store's filesystem room ([`room_left`]); a tree of more than
//! [`ENTRIES_MAX`] entries is refused, never held; of a replica's
//! versions only their ids, times and commits are held (never a subject
//! or an author, which are the replica's words), read as git prints them
//! and at most [`VERSIONS_MAX`] of them.
//!
//! Locks: `cache`, held while git runs; the core asks one request at a
//! time (its `asking`), holding no other lock of its own.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::fetched::{Detail, Fetched, read, replica_ids};
use super::git;
use super::git::for_the_mount;
use super::gittree::link_stays_inside;
use super::version::{choose, parse_version};
use crate::store::Layout;
use crate::store::journal::Kind;
use skillfs_core::fs::{Replicas, TheirEntry, TheirTree};

/// The versions each replica has, as read while the store's refs were
/// `refs` (read again when they move), and when the refs were read (or
/// failed to be: said once, tried again after [`REFS_FOR`]).
#[derive(Default)]
struct Cache {
    refs: Vec<u8>,
    read: Option<Instant>,
    failed: bool,
    /// Each replica's versions, or why they cannot be shown (said again
    /// at every lookup until the refs move, not read again).
    lists: HashMap<String, Result<Vec<Fetched>, String>>,
}

/// The most entries a version's tree may have to be shown...
pub const ENTRIES_MAX: usize = 1_000_000;
/// ...and the most bytes its `ls-tree` lines may take.
pub const TREE_BYTES_MAX: usize = 128 << 20;
/// The most versions of one replica held to be found by id (about
/// 150 bytes each: its id, time and commit, none of its words; a replica
/// with more is refused until the refs move, without reading it again).
pub const VERSIONS_MAX: usize = 1_000_000;
/// The largest file copied into memory where the store's filesystem has
/// no `O_TMPFILE`.
const MEMORY_COPY_MAX: u64 = 64 << 20;

/// How long the refs read are taken as they are: a version fetched
/// meanwhile is found after this, and a stream of lookups of names that
/// name nothing (anyone may ask any name) runs git at most once in it.
const REFS_FOR: Duration = Duration::from_secs(1);

/// Other replicas' versions, as this store keeps them.
pub struct Versions {
    layout: Layout,
    cache: Mutex<Cache>,
    /// The last small files copied, by git object id (the newest first):
    /// opened again (`cat`, then `cp`) without git.
    copies: Mutex<VecDeque<(String, File)>>,
    /// [`VERSIONS_MAX`], lowered by a test.
    versions_max: usize,
}

/// Small files kept copied: at most this many...
const COPIES_KEPT: usize = 32;
/// ...of at most this size each (so at most 32 MiB of the store's disk).
const COPY_KEPT_MAX: u64 = 1 << 20;

impl Versions {
    pub fn new(layout: Layout) -> Versions {
        Versions {
            layout,
            cache: Mutex::default(),
            copies: Mutex::default(),
            versions_max: VERSIONS_MAX,
        }
    }

    fn sync(&self) -> PathBuf {
        self.layout.dir.join("sync")
    }

    fn repo(&self) -> PathBuf {
        self.sync().join("repo.git")
    }
}

fn failed(what: &str, out: &std::process::Output) -> io::Error {
    io::Error::other(format!("git {what}: {}", super::git::said(out)))
}

/// A git ended by a status other than success: said.
fn check(what: &str, status: std::process::ExitStatus) -> io::Result<()> {
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("git {what}: {status}")))
    }
}

impl Replicas for Versions {
    fn resolve(&self, name: &str) -> io::Result<Option<(String, i64)>> {
        for_the_mount(|| self.find(name))
    }

    fn tree(&self, commit: &str) -> io::Result<TheirTree> {
        for_the_mount(|| read_tree(&self.repo(), commit))
    }

    fn content(&self, object: &str, size: u64) -> io::Result<File> {
        if object.is_empty() || !object.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let small = size <= COPY_KEPT_MAX;
        if small {
            let mut copies = self.copies.lock();
            if let Some(i) = copies.iter().position(|(o, _)| o == object) {
                let found = copies.remove(i).expect("in range");
                // The same open file: read at offsets only (`pread`).
                let file = found.1.try_clone();
                copies.push_front(found);
                return file;
            }
        }
        let sync = self.sync();
        room_left(&sync, size)?;
        let file = unlinked(&sync, size)?;
        let status = for_the_mount(|| {
            git(Some(&self.repo()))
                .args(["cat-file", "blob", object])
                .stdout(Stdio::from(file.try_clone()?))
                .stderr(Stdio::null())
                .status()
        })?;
        check(&format!("cat-file blob {object}"), status)?;
        if small && let Ok(kept) = file.try_clone() {
            let mut copies = self.copies.lock();
            copies.retain(|(o, _)| o != object);
            copies.push_front((object.to_string(), kept));
            copies.truncate(COPIES_KEPT);
        }
        Ok(file)
    }
}

impl Versions {
    /// The commit and time of the version `name` names, unless it is
    /// quarantined.
    fn find(&self, name: &str) -> io::Result<Option<(String, i64)>> {
        let Some((prefix, id)) = parse_version(name) else {
            return Ok(None);
        };
        let repo = self.repo();
        if !repo.is_dir() {
            return Ok(None);
        }
        let mut cache = self.cache.lock();
        if cache.read.is_none_or(|t| t.elapsed() >= REFS_FOR) {
            cache.read = Some(Instant::now());
            let out = git(Some(&repo))
                .args([
                    "for-each-ref",
                    "--format=%(refname) %(objectname)",
                    "refs/skillfs/",
                ])
                .output()
                .and_then(|o| {
                    if o.status.success() {
                        Ok(o.stdout)
                    } else {
                        Err(failed("for-each-ref", &o))
                    }
                });
            match out {
                Ok(refs) => {
                    if cache.refs != refs {
                        cache.refs = refs;
                        cache.lists.clear();
                    }
                    cache.failed = false;
                }
                Err(e) => {
                    // Said once, not at every lookup of the second.
                    if !cache.failed {
                        tracing::warn!(
                            "cannot read the replicas kept in '{}': {e}",
                            repo.display()
                        );
                    }
                    cache.failed = true;
                    return Err(e);
                }
            }
        } else if cache.failed {
            return Err(io::Error::other(
                "the store's sync repository could not be read",
            ));
        }
        let prefix = prefix.to_ascii_lowercase();
        let matching: Vec<String> = replica_ids(&cache.refs)
            .into_iter()
            .filter(|r| r.starts_with(&prefix))
            .collect();
        let [replica] = matching.as_slice() else {
            return Ok(None);
        };
        if !cache.lists.contains_key(replica) {
            let list = read(
                &self.layout,
                replica,
                None,
                Detail::Brief,
                self.versions_max,
            )
            .map_err(|f| f.to_string());
            if let Err(e) = &list {
                tracing::warn!("{e}");
            }
            cache.lists.insert(replica.clone(), list);
        }
        let list = cache.lists[replica]
            .as_ref()
            .map_err(|e| io::Error::other(e.clone()))?;
        Ok(choose(list, id)
            .filter(|v| !v.quarantined)
            .map(|v| (v.commit.clone(), v.time)))
    }
}

/// The tree of `commit`, as a merge would take it (see the module's doc).
fn read_tree(repo: &Path, commit: &str) -> io::Result<TheirTree> {
    let mut child = git(Some(repo))
        .args(["ls-tree", "-r", "-t", "-l", "-z", "--full-tree", commit])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let read = list_tree(
        &mut std::io::BufReader::new(child.stdout.take().expect("piped")),
        commit,
    );
    if read.is_err() {
        // Too large, or not what git prints: no more of it is wanted.
        let _ = child.kill();
    }
    let status = child.wait()?;
    let (mut entries, links) = read?;
    check(&format!("ls-tree {commit}"), status)?;
    for (path, target) in targets(repo, links)? {
        match target {
            Some(t) if link_stays_inside(&path, &t) => {
                if let Some(e) = entries.get_mut(&path) {
                    e.size = t.len() as u64;
                    e.target = Some(t);
                }
            }
            _ => {
                entries.remove(&path);
            }
        }
    }
    Ok(TheirTree::new(entries))
}

type Listed = (BTreeMap<Vec<u8>, TheirEntry>, Vec<(Vec<u8>, String)>);

/// The entries `git ls-tree -r -t -l -z` prints on `from`, and the links
/// among them (path, object) whose targets are still to be read.
fn list_tree(from: &mut impl std::io::BufRead, commit: &str) -> io::Result<Listed> {
    let mut entries = BTreeMap::new();
    let mut links = Vec::new();
    let mut item = Vec::new();
    let mut bytes = 0usize;
    // A line: mode, type, object, size and a path no longer than a path
    // may be; a longer one is never held whole.
    let line_max = libc::PATH_MAX as u64 + 128;
    loop {
        item.clear();
        if from.by_ref().take(line_max).read_until(0, &mut item)? == 0 {
            break;
        }
        if item.last() == Some(&0) {
            item.pop();
        } else if item.len() as u64 == line_max {
            // Skipped to its end: a path longer than PATH_MAX.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let n = from.by_ref().take(line_max).read_until(0, &mut rest)?;
                if n == 0 || rest.last() == Some(&0) {
                    break;
                }
            }
            continue;
        }
        bytes += item.len();
        if bytes > TREE_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("commit {commit} lists more than {TREE_BYTES_MAX} bytes of paths"),
            ));
        }
        if item.is_empty() {
            continue;
        }
        if entries.len() >= ENTRIES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("commit {commit} has more than {ENTRIES_MAX} entries"),
            ));
        }
        let bad = || io::Error::other(format!("git ls-tree {commit}: a line it should not print"));
        let tab = item.iter().position(|&b| b == b'\t').ok_or_else(bad)?;
        let path = item[tab + 1..].to_vec();
        let head = String::from_utf8_lossy(&item[..tab]).to_string();
        let mut f = head.split_ascii_whitespace();
        let (Some(mode), Some(_), Some(object), Some(size)) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad());
        };
        // What a merge would leave out is not shown either (and what is
        // below a name left out is reached by no lookup); nor a name no
        // lookup could reach.
        if !skillfs_sync::tree::valid_path(&path)
            || path
                .split(|&b| b == b'/')
                .any(|c| c == b".history" || c.len() > NAME_MAX)
        {
            continue;
        }
        let size = if size == "-" {
            0
        } else {
            size.parse().map_err(|_| bad())?
        };
        let (kind, exec) = match mode {
            "040000" => (Kind::Dir, false),
            "120000" => {
                links.push((path.clone(), object.to_string()));
                (Kind::Symlink, false)
            }
            m if m.starts_with("100") => (Kind::File, m == "100755"),
            // A submodule.
            _ => continue,
        };
        entries.insert(
            path,
            TheirEntry {
                kind,
                exec,
                size,
                object: object.to_string(),
                target: None,
            },
        );
    }
    Ok((entries, links))
}

/// The longest name a lookup takes.
const NAME_MAX: usize = 255;

/// Whether the store's filesystem, at `dir`, has room for a copy of
/// `size` bytes and still keeps a tenth of itself (at most 1 GiB) free
/// for the versions of the live tree; `ENOSPC` if not.
fn room_left(dir: &Path, size: u64) -> io::Result<()> {
    let (avail, total) = free_space(dir)?;
    let reserve = (total / 10).min(1 << 30);
    if size.saturating_add(reserve) > avail {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "a copy of {size} bytes would leave the store's filesystem less than {reserve} bytes free"
            ),
        ));
    }
    Ok(())
}

/// Bytes available to this user and in all on the filesystem of `dir`.
fn free_space(dir: &Path) -> io::Result<(u64, u64)> {
    let st = crate::sys::fstatvfs(&File::open(dir)?)?;
    let unit = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// An unlinked file in `dir` to write `size` bytes in and read (a memory
/// file where the filesystem has no `O_TMPFILE`, for at most
/// [`MEMORY_COPY_MAX`] bytes).
fn unlinked(dir: &Path, size: u64) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_NOFOLLOW)
        .open(dir)
    {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            if size > MEMORY_COPY_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::FileTooLarge,
                    format!(
                        "'{}' has no O_TMPFILE, and a copy of {size} bytes in memory is refused",
                        dir.display()
                    ),
                ));
            }
            // SAFETY: a NUL-ended name and plain flags; the fd returned is
            // new and ours alone.
            let fd = unsafe { libc::memfd_create(c"skillfs-version".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` was just made and is owned by nothing else.
            Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        }
        r => r,
    }
}

/// A link's path and its target (`None`: git could not give it, or it is
/// longer than a path may be).
type Found = (Vec<u8>, Option<Vec<u8>>);

/// The targets of the links `links` (path, git object), read in one
/// `git cat-file --batch`; a target longer than a path is skipped as it
/// streams, never held.
fn targets(repo: &Path, links: Vec<(Vec<u8>, String)>) -> io::Result<Vec<Found>> {
    if links.is_empty() {
        return Ok(Vec::new());
    }
    let mut child = git(Some(repo))
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    let asked: String = links.iter().map(|(_, o)| format!("{o}\n")).collect();
    // Written on a thread: git answers as it reads, and a full pipe either
    // way would stall both.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(asked.as_bytes());
    });
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let read = read_targets(&mut out, links);
    if read.is_err() {
        let _ = child.kill();
    }
    drop(out);
    let _ = writer.join();
    let status = child.wait()?;
    let found = read?;
    check("cat-file --batch", status)?;
    Ok(found)
}

/// What `git cat-file --batch` printed on `out` for `links`, in order.
fn read_targets(
    out: &mut impl std::io::BufRead,
    links: Vec<(Vec<u8>, String)>,
) -> io::Result<Vec<Found>> {
    let mut found: Vec<Found> = Vec::new();
    let mut head = Vec::new();
    for (path, _) in links {
        head.clear();
        if out.read_until(b'\n', &mut head)? == 0 || head.last() != Some(&b'\n') {
            return Err(io::Error::other("git cat-file --batch ended early"));
        }
        let text = String::from_utf8_lossy(&head).trim_end().to_string();
        let mut f = text.split(' ');
        let (Some(_), Some(kind), Some(size)) = (f.next(), f.next(), f.next()) else {
            // `<object> missing`: nothing follows.
            found.push((path, None));
            continue;
        };
        let size: u64 = size
            .parse()
            .map_err(|_| io::Error::other(format!("git cat-file --batch: '{text}'")))?;
        let mut body = out.by_ref().take(size + 1);
        if kind == "blob" && size <= libc::PATH_MAX as u64 {
            let mut bytes = Vec::with_capacity(size as usize + 1);
            body.read_to_end(&mut bytes)?;
            if bytes.len() as u64 != size + 1 {
                return Err(io::Error::other("git cat-file --batch ended early"));
            }
            bytes.pop();
            found.push((path, Some(bytes)));
        } else {
            io::copy(&mut body, &mut io::sink())?;
            found.push((path, None));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replicas_kept_are_read_from_their_refs() {
        let a = "0123456789abcdef0123456789abcdef";
        let b = "fedcba9876543210fedcba9876543210";
        let refs = format!(
            "refs/skillfs/kept/{a} 1111\nrefs/skillfs/quarantine/{b} 2222\n\
             refs/skillfs/quarantine/{a} 3333\nrefs/skillfs/rewound/{a}/1 4444\n\
             refs/skillfs/kept/not-an-id 5555\n"
        );
        assert_eq!(replica_ids(refs.as_bytes()), [a, b]);
    }

    #[test]
    fn a_tree_is_read_as_a_merge_takes_it() {
        let listed = b"040000 tree aaaa       -\tcat\0\
100644 blob bbbb      46\tcat/SKILL.md\0\
100755 blob cccc      10\tcat/run.sh\0\
120000 blob dddd       8\tcat/link\0\
160000 commit eeee       -\tcat/sub\0\
100644 blob ffff       1\tcat/.history/x\0\
040000 tree 1111       -\t.history\0";
        let (entries, links) = list_tree(&mut &listed[..], "c").unwrap();
        let paths: Vec<&[u8]> = entries.keys().map(|k| &k[..]).collect();
        assert_eq!(
            paths,
            [&b"cat"[..], b"cat/SKILL.md", b"cat/link", b"cat/run.sh"]
        );
        assert_eq!(entries[&b"cat/SKILL.md"[..]].size, 46);
        assert!(entries[&b"cat/run.sh"[..]].exec);
        assert_eq!(links, [(b"cat/link".to_vec(), "dddd".to_string())]);
        let long = [b"100644 blob 2222 1\tcat/".as_slice(), &[b'x'; 256], b"\0"].concat();
        assert!(list_tree(&mut &long[..], "c").unwrap().0.is_empty());
        assert!(list_tree(&mut &b"100644 blob 2222\tcat/a\0"[..], "c").is_err());
        // A path longer than a path may be is skipped as it streams, and
        // the line after it read.
        let deep = [
            b"100644 blob 3333 1\t".as_slice(),
            &b"d/".repeat(libc::PATH_MAX as usize),
            b"f\x00",
            b"100644 blob 4444 2\tok\0",
        ]
        .concat();
        let (entries, _) = list_tree(&mut &deep[..], "c").unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), [&b"ok".to_vec()]);
    }

    #[test]
    fn link_targets_are_read_and_long_ones_skipped_as_they_stream() {
        let long = vec![b'a'; libc::PATH_MAX as usize + 1];
        let mut out = Vec::new();
        out.extend_from_slice(b"aaaa blob 8\nSKILL.md\n");
        out.extend_from_slice(b"bbbb missing\n");
        out.extend_from_slice(format!("cccc blob {}\n", long.len()).as_bytes());
        out.extend_from_slice(&long);
        out.extend_from_slice(b"\ndddd blob 2\nok\n");
        let links = ["aaaa", "bbbb", "cccc", "dddd"]
            .iter()
            .map(|o| (o.as_bytes().to_vec(), o.to_string()))
            .collect();
        let found = read_targets(&mut &out[..], links).unwrap();
        let targets: Vec<Option<&[u8]>> = found.iter().map(|(_, t)| t.as_deref()).collect();
        assert_eq!(targets, [Some(&b"SKILL.md"[..]), None, None, Some(b"ok")]);
        let cut = &out[..10];
        let links = vec![(b"l".to_vec(), "aaaa".to_string())];
        assert!(read_targets(&mut &cut[..], links).is_err());
    }

    /// Where the store's filesystem has no `O_TMPFILE` (`/proc` stands
    /// for it), a copy is made in memory, and one larger than
    /// `MEMORY_COPY_MAX` is refused rather than held in memory.
    #[test]
    fn a_copy_is_in_memory_without_o_tmpfile_and_bounded_there() {
        use std::io::{Read, Seek, Write};
        let mut f = unlinked(Path::new("/proc"), 5).unwrap();
        let at = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f));
        let link = std::fs::read_link(&at).unwrap();
        assert!(
            link.to_string_lossy().starts_with("/memfd:skillfs-version"),
            "{link:?}"
        );
        f.write_all(b"bytes").unwrap();
        f.rewind().unwrap();
        let mut back = String::new();
        f.read_to_string(&mut back).unwrap();
        assert_eq!(back, "bytes");
        assert!(unlinked(Path::new("/proc"), MEMORY_COPY_MAX).is_ok());
        let e = unlinked(Path::new("/proc"), MEMORY_COPY_MAX + 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge, "{e}");
    }

    /// A small file opened again is served from its copy, without git
    /// (its object removed from the repository meanwhile); a large one is
    /// copied at each open.
    #[test]
    fn small_files_are_opened_again_from_their_copy() {
        use std::os::unix::fs::FileExt;
        let dir = std::env::temp_dir().join(format!("skillfs-view-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let repo = dir.join("sync").join("repo.git");
        std::fs::create_dir_all(&repo).unwrap();
        // Objects written as a fetch writes them (from files: git's own
        // command for the store, no stdin).
        let git_out = |args: &[&str]| {
            let out = git(Some(&repo)).args(args).output().unwrap();
            assert!(out.status.success(), "git {args:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        git_out(&["init", "-q", "--bare"]);
        let small = b"a small file\n".to_vec();
        let large = vec![7u8; COPY_KEPT_MAX as usize + 1];
        let write = |name: &str, bytes: &[u8]| {
            let f = dir.join(name);
            std::fs::write(&f, bytes).unwrap();
            git_out(&["hash-object", "-w", f.to_str().unwrap()])
        };
        let (s, l) = (write("small", &small), write("large", &large));
        let v = Versions::new(Layout::new(dir.clone()));
        let read = |f: File, n: usize| {
            let mut b = vec![0u8; n];
            f.read_exact_at(&mut b, 0).unwrap();
            b
        };
        assert_eq!(
            read(v.content(&s, small.len() as u64).unwrap(), small.len()),
            small
        );
        assert_eq!(
            read(v.content(&l, large.len() as u64).unwrap(), 16),
            large[..16]
        );
        let object = |o: &str| repo.join("objects").join(&o[..2]).join(&o[2..]);
        std::fs::remove_file(object(&s)).unwrap();
        std::fs::remove_file(object(&l)).unwrap();
        assert_eq!(
            read(v.content(&s, small.len() as u64).unwrap(), small.len()),
            small
        );
        assert!(v.content(&l, large.len() as u64).is_err(), "copied again");
        assert!(v.content("not-hex", 1).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A replica of more versions than the cap is refused, and the
    /// refusal kept while its refs stay as they were: a cap raised
    /// meanwhile changes nothing, because its log is not read again at
    /// each lookup; once its refs move it is read again.
    #[test]
    fn a_replica_over_the_cap_is_refused_until_its_refs_move() {
        let dir = std::env::temp_dir().join(format!("skillfs-view-cap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let replica = "0123456789abcdef0123456789abcdef";
        let mut commits = vec![("a", "one", "1"), ("a", "two", "2"), ("a", "three", "3")];
        let (layout, _) = super::super::fetched::tests::store_with(&dir, replica, &commits);
        let mut v = Versions::new(layout);
        v.versions_max = 2;
        let e = v.find("01234567:1").unwrap_err();
        assert!(e.to_string().contains("more than 2 versions"), "{e}");
        v.versions_max = 10;
        // The refs are read again (the second gone by), and are the same.
        v.cache.lock().read = None;
        let e = v.find("01234567:2").unwrap_err();
        assert!(e.to_string().contains("more than 2 versions"), "{e}");
        commits.push(("a", "four", "4"));
        let (_, made) = super::super::fetched::tests::store_with(&dir, replica, &commits);
        v.cache.lock().read = None;
        assert_eq!(v.find("01234567:2").unwrap(), Some((made[1].clone(), 1001)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
