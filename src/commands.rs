//! `show`, `diff`, `restore` and an undo's removal: history read from the
//! store (mounted or not), and a restore or removal written through the
//! mount so that it is itself an ordinary, versioned change.
//!
//! Invariant: a restore writes only inside ROOT. The directory that will
//! hold the restored entry (or, when directories above it are gone, the
//! deepest one left, which gets the outermost missing one) is reached from
//! ROOT one component at a time without following a symlink, and
//! everything (the staging directory, the swap) happens relative to that
//! directory's fd.
//! System calls go through `sys`; this module has no `unsafe`.
//!
//! Locks: none; a command reads the journal once (`read_records`) and
//! works on what it read. A restore's writes go through the mount, where
//! the daemon's own locks apply.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use crate::catalog::Fold;
use crate::error::{Exit, Failure};
use crate::history::{HistoryIndex, PathIdx, ROOT_IDX, parse_alias};
use crate::relpath::RelPath;
use crate::store::blobs::BlobStore;
use crate::store::journal::{EntryState, Kind, Record};
use crate::store::{Layout, journal};
use crate::sys;

/// History as the store has it.
pub struct Store {
    pub layout: Layout,
    pub index: HistoryIndex,
    pub blobs: BlobStore,
}

/// Every record of the store at `layout` (read-only; mounted or not).
pub fn read_records(layout: &Layout) -> Result<Vec<Record>, Failure> {
    Ok(journal::read_dir(&journal_dir(layout)?)?.records)
}

/// The journal directory of the store at `layout`, which must have one.
fn journal_dir(layout: &Layout) -> Result<PathBuf, Failure> {
    let dir = layout.journal();
    if !dir.is_dir() {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "no skillfs store at '{}' (it has no journal/)",
                layout.dir.display()
            ),
        ));
    }
    Ok(dir)
}

impl Store {
    /// History as the store has it, loaded from the journal's checkpoint
    /// where one applies (see `checkpoint`), else folded from every record.
    pub fn open(layout: Layout) -> Result<Store, Failure> {
        let path = journal_dir(&layout)?;
        let dir = crate::store::Dir::open_path(&path)
            .map_err(|e| Failure::io(Exit::BadStore, "open", &path, &e))?;
        let (contents, base) = crate::checkpoint::read_for_mount(&dir, &mut Vec::new())?;
        let index = crate::checkpoint::fold(base, contents.records).into_history();
        Store::with_index(layout, index)
    }

    pub fn from_records(layout: Layout, records: &[Record]) -> Result<Store, Failure> {
        Store::with_index(layout, Fold::replay(records).into_history())
    }

    fn with_index(layout: Layout, index: HistoryIndex) -> Result<Store, Failure> {
        // Read-only: opened by path, never through a symlink.
        let blobs = BlobStore::open_path(&layout.blobs(), crate::store::durable::StoreIo::real())
            .map_err(|e| Failure::io(Exit::BadStore, "open", &layout.blobs(), &e))?;
        Ok(Store {
            layout,
            index,
            blobs,
        })
    }

    /// The id an id or alias names (resolved over the whole tree).
    pub fn resolve(&self, text: &str) -> Result<u64, Failure> {
        let alias = parse_alias(text, crate::time::now_ns()).ok_or_else(|| {
            Failure::new(
                Exit::NotFound,
                format!(
                    "'{text}' is not an id or alias (42, latest, @2026-11-30T18:09:30Z, @-10m)"
                ),
            )
        })?;
        self.index.resolve(ROOT_IDX, alias).ok_or_else(|| {
            if let crate::history::Alias::Id(id) = alias
                && self.index.is_forgotten(id)
            {
                return Failure::new(
                    Exit::NotFound,
                    format!("change {id} was forgotten (skillfs forget): its tree is gone"),
                );
            }
            Failure::new(
                Exit::NotFound,
                format!(
                    "'{text}' names no change: the history holds ids 1 to {}{}",
                    self.index.last(),
                    self.index
                        .time_of(1)
                        .map(|t| format!(", from {}", crate::time::format_utc(t)))
                        .unwrap_or_default()
                ),
            )
        })
    }

    /// `path`'s index and state at `id` (the root has no recorded state).
    pub fn lookup(
        &self,
        path: &RelPath,
        id: u64,
    ) -> Result<(PathIdx, Option<&EntryState>), Failure> {
        let missing = || {
            Failure::new(
                Exit::NotFound,
                format!("'{path}' did not exist just after change {id}"),
            )
        };
        let idx = self.index.idx(path).ok_or_else(missing)?;
        if idx == ROOT_IDX {
            return Ok((idx, None));
        }
        let st = self.index.state_at(idx, id).ok_or_else(missing)?;
        Ok((idx, Some(st)))
    }

    pub fn content(&self, st: &EntryState) -> Result<Vec<u8>, Failure> {
        self.content_of(st.blob.as_deref().unwrap_or(""))
    }

    /// The bytes of `blob`.
    pub fn content_of(&self, blob: &str) -> Result<Vec<u8>, Failure> {
        self.blobs.read(blob).map_err(|e| {
            let msg = if e.kind() == std::io::ErrorKind::InvalidData {
                e.to_string() // damaged: the error names the blob and the file
            } else {
                format!("blob {blob} is missing from the store: {e}")
            };
            Failure::new(Exit::BadStore, msg)
        })
    }

    /// Every entry at or below `idx` at `id`, parents first.
    pub fn subtree(&self, idx: PathIdx, id: u64) -> Vec<(RelPath, EntryState)> {
        let mut out = Vec::new();
        let mut stack = vec![idx];
        while let Some(i) = stack.pop() {
            let kids = self.index.children_at(i, id);
            for (c, s) in kids.iter().rev() {
                if s.kind == Kind::Dir {
                    stack.push(*c);
                }
            }
            for (c, s) in kids {
                out.push((self.index.path(c).clone(), s.clone()));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Splits `ID:PATH` (an alias may itself hold `:`, as in `@…T18:09:30Z`).
pub fn split_spec(spec: &str) -> Result<(&str, &str), Failure> {
    let now = crate::time::now_ns();
    spec.match_indices(':')
        .map(|(i, _)| (&spec[..i], &spec[i + 1..]))
        .find(|(id, _)| parse_alias(id, now).is_some())
        .or_else(|| spec.split_once(':'))
        .ok_or_else(|| {
            Failure::new(
                Exit::Usage,
                format!("'{spec}' is not ID:PATH (for example latest:cat/foo/SKILL.md)"),
            )
        })
}

/// Prints `path` as it was just after change `id_text`.
pub fn show(store: &Store, id_text: &str, path: &RelPath) -> Result<(), Failure> {
    let id = store.resolve(id_text)?;
    let (idx, st) = store.lookup(path, id)?;
    let mut out = std::io::stdout().lock();
    let res = match st.map(|s| s.kind) {
        Some(Kind::File) => out.write_all(&store.content(st.expect("file"))?),
        Some(Kind::Symlink) => {
            let t = st
                .and_then(|s| s.target.as_ref())
                .map(|t| t.0.clone())
                .unwrap_or_default();
            out.write_all(&t).and_then(|()| out.write_all(b"\n"))
        }
        _ => {
            let mut r = Ok(());
            for (c, s) in store.index.children_at(idx, id) {
                let name = store.index.path(c).file_name().to_vec();
                let slash = if s.kind == Kind::Dir { "/" } else { "" };
                r = r
                    .and_then(|()| out.write_all(&name))
                    .and_then(|()| writeln!(out, "{slash}"));
            }
            r
        }
    };
    let _ = res; // a closed stdout (`| head`) is not an error
    Ok(())
}

/// `name` with each control byte written `\xNN`: a name or link target
/// shown, never interpreted by the terminal (a newline would forge a line).
pub fn escaped(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len());
    for &b in name {
        if b < 0x20 || b == 0x7f {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

fn is_binary(b: &[u8]) -> bool {
    b.contains(&0) || std::str::from_utf8(b).is_err()
}

/// What a diff compares of an entry: its kind, its mode (`None` where a
/// side cannot say: a directory of another replica's version), and its
/// content (a file's blob, a link's target).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    pub kind: Kind,
    pub mode: Option<u32>,
    pub blob: Option<String>,
    pub target: Option<Vec<u8>>,
}

impl Shown {
    /// `s` as a diff compares it; with `git_modes`, as a git tree has it
    /// (a file executable or not, a directory without one), to compare
    /// with another replica's version.
    pub fn of(s: &EntryState, git_modes: bool) -> Shown {
        let mode = match (git_modes, s.kind) {
            (false, _) => Some(s.mode),
            (true, Kind::File) => Some(if s.mode & 0o100 != 0 { 0o755 } else { 0o644 }),
            (true, _) => None,
        };
        Shown {
            kind: s.kind,
            mode,
            blob: s.blob.clone(),
            target: s.target.as_ref().map(|t| t.0.clone()),
        }
    }
}

/// One side of a diff: its name in the headers (`change 42`) and what is
/// at or below the path compared.
pub struct DiffSide {
    pub label: String,
    pub entries: std::collections::BTreeMap<RelPath, Shown>,
}

/// This store's side at change `id`: `path` and everything below it.
pub fn local_side(store: &Store, id: u64, path: &RelPath, git_modes: bool) -> DiffSide {
    let mut entries = std::collections::BTreeMap::new();
    if let Some(i) = store.index.idx(path) {
        let at = if i == ROOT_IDX {
            Some(None)
        } else {
            store.index.state_at(i, id).map(Some)
        };
        if let Some(top) = at {
            if let Some(s) = top {
                entries.insert(path.clone(), Shown::of(s, git_modes));
            }
            for (p, s) in store.subtree(i, id) {
                entries.insert(p, Shown::of(&s, git_modes));
            }
        }
    }
    DiffSide {
        label: format!("change {id}"),
        entries,
    }
}

/// `diff A [B] [PATH]`: what changed from A to B (default: the newest).
pub fn diff(store: &Store, a: &str, b: Option<&str>, path: &RelPath) -> Result<(), Failure> {
    let ida = store.resolve(a)?;
    let idb = match b {
        Some(b) => store.resolve(b)?,
        None => store.index.last(),
    };
    let old = local_side(store, ida, path, false);
    let new = local_side(store, idb, path, false);
    print_diff(&old, &new, path, &|blob| store.content_of(blob).map(Some))
}

/// A file's bytes by blob (`None`: too large to read whole).
pub type ReadBlob<'a> = dyn Fn(&str) -> Result<Option<Vec<u8>>, Failure> + 'a;

/// Prints what changed from `old` to `new` at or below `path`: a unified
/// diff of each text, a line for each other change. `read` gives a file's
/// bytes by blob (`None`: too large to read whole).
pub fn print_diff(
    old: &DiffSide,
    new: &DiffSide,
    path: &RelPath,
    read: &ReadBlob,
) -> Result<(), Failure> {
    if old.entries.is_empty() && new.entries.is_empty() && !path.is_root() {
        return Err(Failure::new(
            Exit::NotFound,
            format!("'{path}' exists at neither {} nor {}", old.label, new.label),
        ));
    }
    let mut keys: Vec<&RelPath> = old.entries.keys().chain(new.entries.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = std::io::stdout().lock();
    let mode_line = |out: &mut std::io::StdoutLock, k: &RelPath, o: &Shown, n: &Shown| {
        if let (Some(om), Some(nm)) = (o.mode, n.mode)
            && om != nm
        {
            let _ = writeln!(out, "mode of {k}: {om:o} -> {nm:o}");
        }
    };
    for k in keys {
        let (o, n) = (old.entries.get(k), new.entries.get(k));
        if o == n
            || (o.is_some_and(|o| o.kind == Kind::Dir) && n.is_some_and(|n| n.kind == Kind::Dir))
        {
            if let (Some(o), Some(n)) = (o, n) {
                mode_line(&mut out, k, o, n);
            }
            continue;
        }
        let text = |s: Option<&Shown>| -> Result<Option<Vec<u8>>, Failure> {
            Ok(Some(match s {
                None => Vec::new(),
                Some(s) if s.kind == Kind::File => {
                    return read(s.blob.as_deref().unwrap_or(""));
                }
                Some(s) if s.kind == Kind::Symlink => {
                    let mut t = b"-> ".to_vec();
                    t.extend(escaped(s.target.as_deref().unwrap_or_default()));
                    t.push(b'\n');
                    t
                }
                Some(_) => Vec::new(),
            }))
        };
        if o.is_some_and(|s| s.kind == Kind::Dir) || n.is_some_and(|s| s.kind == Kind::Dir) {
            let what = if n.is_some() { "added" } else { "removed" };
            let _ = writeln!(out, "directory {what}: {k}");
            continue;
        }
        let an = if o.is_some() {
            format!("a/{k}")
        } else {
            "/dev/null".into()
        };
        let bn = if n.is_some() {
            format!("b/{k}")
        } else {
            "/dev/null".into()
        };
        let (Some(ob), Some(nb)) = (text(o)?, text(n)?) else {
            let _ = writeln!(
                out,
                "Files {an} and {bn} differ (too large to compare here)"
            );
            continue;
        };
        if ob == nb {
            if let (Some(o), Some(n)) = (o, n) {
                mode_line(&mut out, k, o, n);
            }
            continue;
        }
        if is_binary(&ob) || is_binary(&nb) {
            let _ = writeln!(out, "Binary files {an} and {bn} differ");
            continue;
        }
        let (os, ns) = (String::from_utf8_lossy(&ob), String::from_utf8_lossy(&nb));
        let d = similar::TextDiff::from_lines(os.as_ref(), ns.as_ref());
        let _ = write!(
            out,
            "{}",
            d.unified_diff().context_radius(3).header(
                &format!("{an}\t({})", old.label),
                &format!("{bn}\t({})", new.label)
            )
        );
    }
    Ok(())
}

/// Gives `p` the state's owner, mode and mtime (not following symlinks).
fn apply_meta(p: &Path, s: &EntryState) -> std::io::Result<()> {
    let path = p.as_os_str().as_bytes();
    if crate::process::geteuid() == 0 {
        // Best effort, as `cp -a`: the content and times still restore.
        let _ = sys::lchownat(sys::CWD, path, s.uid, s.gid);
    }
    if s.kind != Kind::Symlink {
        fs::set_permissions(p, fs::Permissions::from_mode(s.mode))?;
    }
    let (secs, nsecs) = sys::split_ns(s.mtime_ns);
    let t = sys::Time::At(secs, nsecs);
    sys::lutimensat(sys::CWD, path, t, t)
}

/// Creates `s` (with its content) at `p`.
fn materialize(store: &Store, p: &Path, s: &EntryState) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::io(Exit::Internal, "write", p, &e);
    match s.kind {
        Kind::Dir => fs::create_dir(p).map_err(io)?,
        Kind::File => fs::write(p, store.content(s)?).map_err(io)?,
        Kind::Symlink => {
            let t = s.target.as_ref().map(|t| t.0.clone()).unwrap_or_default();
            symlink(std::ffi::OsStr::from_bytes(&t), p).map_err(io)?
        }
    }
    if s.kind != Kind::Dir {
        apply_meta(p, s).map_err(io)?;
    }
    Ok(())
}

pub struct Restored {
    pub files: usize,
    pub dirs: usize,
    pub symlinks: usize,
    pub replaced: bool,
    /// The missing directories above the path that were made with it,
    /// outermost first.
    pub parents: Vec<RelPath>,
}

/// Puts `path` back as it was just after `id`, through the mounted `root`:
/// the old state is built under a hidden name beside it, then swapped in
/// with one `RENAME_EXCHANGE` (readers see the old or the restored entry,
/// never a mix), and what it replaced is removed (it stays in history).
///
/// Directories above `path` that are gone now (the agent removes a
/// category with its last skill) are built with it, each with only the
/// way down to `path` in it and its own mode, owner and times at `id`,
/// and the outermost of them is what the one rename puts in place: the
/// whole restore is still one operation, and one `undo` takes it all out.
pub fn restore(store: &Store, root: &Path, id: u64, path: &RelPath) -> Result<Restored, Failure> {
    if path.is_root() {
        return Err(Failure::new(
            Exit::Usage,
            "restore takes a path below ROOT; restore the top-level entries one by one",
        ));
    }
    let (idx, st) = store.lookup(path, id)?;
    let st = st.expect("not the root").clone();
    let (parent_fd, top) = open_parent(root, path)?;
    // What the rename puts in place: `path`, or its outermost missing
    // ancestor with the chain down to it, each as it was at `id`.
    let mut chain: Vec<(RelPath, EntryState)> = Vec::new();
    let mut p = path.parent().unwrap_or_default();
    while p.starts_with(&top) {
        let (_, s) = store.lookup(&p, id)?;
        let s = s.expect("not the root").clone();
        if s.kind != Kind::Dir {
            return Err(Failure::new(
                Exit::NotFound,
                format!("'{p}' was no directory just after change {id}"),
            ));
        }
        chain.push((p.clone(), s));
        p = p.parent().unwrap_or_default();
    }
    chain.reverse();
    let target = root.join(top.as_os_str());
    // The directory opened above, by a name that never resolves again
    // through ROOT's path (a component swapped for a symlink meanwhile
    // cannot redirect what follows).
    let parent = PathBuf::from(format!("/proc/self/fd/{}", parent_fd.as_raw_fd()));
    let name = top.file_name();
    // Built inside a directory the default rules hide wherever it is, so no
    // listing shows any of it, whatever kind the restored entry is; what
    // the swap replaces stays there, hidden, until the park sweep (its
    // hidden and untracked entries, which are in no history, are kept).
    let park_name = staging_dir(&parent_fd, &target, "restore")?;
    let park = parent.join(&park_name);
    let stage = park.join(std::ffi::OsStr::from_bytes(name));
    let mut stage_rel = park_name.as_bytes().to_vec();
    stage_rel.push(b'/');
    stage_rel.extend_from_slice(name);
    let mut done = Restored {
        files: 0,
        dirs: 0,
        symlinks: 0,
        replaced: false,
        parents: chain.iter().map(|(p, _)| p.clone()).collect(),
    };
    let count = |d: &mut Restored, k: Kind| match k {
        Kind::File => d.files += 1,
        Kind::Dir => d.dirs += 1,
        Kind::Symlink => d.symlinks += 1,
    };
    let staged = |p: &RelPath| match p.rebase(&top, &RelPath::root()) {
        rest if rest.is_root() => stage.clone(),
        rest => stage.join(rest.as_os_str()),
    };
    let build = || -> Result<(), Failure> {
        let entries = chain
            .iter()
            .cloned()
            .chain(std::iter::once((path.clone(), st.clone())))
            .chain(store.subtree(idx, id));
        let mut dirs = Vec::new();
        for (p, s) in entries {
            let dest = staged(&p);
            materialize(store, &dest, &s)?;
            if s.kind == Kind::Dir {
                dirs.push((dest, s));
            }
        }
        // Directory modes and times last, innermost first: creating their
        // entries changed the times, and a mode may forbid the creating.
        for (d, s) in dirs.iter().rev() {
            apply_meta(d, s)
                .map_err(|e| Failure::io(Exit::Internal, "set attributes of", d, &e))?;
        }
        Ok(())
    };
    if let Err(f) = build() {
        let _ = fs::remove_dir_all(&park);
        return Err(f);
    }
    count(&mut done, st.kind);
    for (_, s) in store.subtree(idx, id) {
        count(&mut done, s.kind);
    }
    let dir = parent_fd.as_fd();
    let exists = sys::lstatat(dir, name).is_ok();
    let flags = if exists { libc::RENAME_EXCHANGE } else { 0 };
    if let Err(e) = sys::renameat2(dir, &stage_rel, dir, name, flags) {
        let _ = fs::remove_dir_all(&park);
        return Err(Failure::io(
            Exit::Internal,
            "swap the restored entry into",
            &target,
            &e,
        ));
    }
    if exists {
        done.replaced = true;
    } else {
        let _ = sys::unlinkat(dir, park_name.as_bytes(), true);
    }
    Ok(done)
}

/// A new directory beside `target`, in the directory `parent_fd`, by a
/// name the default rules hide wherever it is (`.rollback-staging-*`):
/// what is built or set aside in it is in no listing, and what stays in it
/// is swept with the parks.
pub(crate) fn staging_dir(
    parent_fd: &OwnedFd,
    target: &Path,
    what: &str,
) -> Result<String, Failure> {
    let name = format!(
        ".rollback-staging-skillfs-{what}-{}-{}",
        std::process::id(),
        crate::time::now_ns()
    );
    sys::mkdirat(parent_fd.as_fd(), name.as_bytes(), 0o700)
        .map_err(|e| Failure::io(Exit::Internal, "create", &target.with_file_name(&name), &e))?;
    Ok(name)
}

/// Takes `path` out of the tree through the mounted `root`, by one rename
/// into a hidden staging directory beside it: journaled as a `park`
/// (history keeps it, as removed), and its hidden entries, which no
/// history has, stay there until the park sweep instead of being deleted.
pub fn remove(root: &Path, path: &RelPath) -> Result<(), Failure> {
    if path.is_root() {
        return Err(Failure::new(Exit::Usage, "ROOT itself cannot be removed"));
    }
    let target = root.join(path.as_os_str());
    let (parent_fd, top) = open_parent(root, path)?;
    if &top != path {
        return Err(Failure::new(
            Exit::NotFound,
            format!("'{path}' is not in the tree: '{top}' is gone"),
        ));
    }
    let park_name = staging_dir(&parent_fd, &target, "undo")?;
    let mut to = park_name.clone().into_bytes();
    to.push(b'/');
    to.extend_from_slice(path.file_name());
    let dir = parent_fd.as_fd();
    sys::renameat2(dir, path.file_name(), dir, &to, 0).map_err(|e| {
        let _ = sys::unlinkat(dir, park_name.as_bytes(), true);
        Failure::io(Exit::Internal, "set aside", &target, &e)
    })
}

/// The directory that holds `path`, reached from ROOT one component at a
/// time, never through a symlink: a symlinked component could lead out of
/// ROOT, where a restore must not write (and which no history covers).
/// Where a directory on the way is gone, the last one that exists, and the
/// outermost missing path (else `path` itself).
pub(crate) fn open_parent(root: &Path, path: &RelPath) -> Result<(OwnedFd, RelPath), Failure> {
    let mut fd = sys::openat(
        sys::CWD,
        root.as_os_str().as_bytes(),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )
    .map(OwnedFd::from)
    .map_err(|e| Failure::io(Exit::BadRoot, "open", root, &e))?;
    let parent = path.parent().unwrap_or_default();
    let mut so_far = RelPath::root();
    for comp in parent.components() {
        so_far = so_far.join(comp);
        match sys::open_dir(fd.as_fd(), comp) {
            Ok(next) => fd = next,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((fd, so_far)),
            Err(e) => {
                let st = sys::lstatat(fd.as_fd(), comp);
                let what = if st.is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK) {
                    "a symlink: a restore writes only inside ROOT, never through a link"
                } else if e.raw_os_error() == Some(libc::ENOTDIR) {
                    "not a directory now"
                } else {
                    return Err(Failure::io(
                        Exit::Internal,
                        "open the directory",
                        &root.join(so_far.as_os_str()),
                        &e,
                    ));
                };
                return Err(Failure::new(
                    Exit::Usage,
                    format!("'{so_far}' is {what} (restore '{so_far}' itself first)"),
                ));
            }
        }
    }
    Ok((fd, path.clone()))
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn a_shown_name_holds_no_control_byte() {
        assert_eq!(escaped(b"ok/name.md"), b"ok/name.md");
        assert_eq!(escaped(b"a\nb\x1b[2J\x7f"), b"a\\x0ab\\x1b[2J\\x7f");
    }
}
