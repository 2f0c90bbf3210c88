//! A merged tree written into the live tree through the mount, so that
//! every change it makes is an ordinary version (`undo` takes it back).
//! Its actor is a thread of this `skillfs` named after the replica the
//! change came from, `sync:<first 8 digits of its id>` (`apply_as`): the
//! daemon records a change's actor by the thread that made it.
//!
//! The unit is the merge's: a skill (a directory holding `SKILL.md`, with
//! everything below it), else one entry. A skill is built whole in a
//! hidden staging directory beside it and put in place by one rename
//! (`RENAME_EXCHANGE` over the old one, which stays in the staging
//! directory, hidden, until the park sweep): the agent's loader sees the
//! old skill or the new one, never half of each. What the old skill held
//! that no version has (a file of an untracked name, a hidden entry) is
//! moved into the new one right after the swap (`carry_over`). A file outside every
//! skill is swapped the same way; a directory outside every skill is made
//! or, once empty, removed; a unit the merge removed is parked (history
//! keeps it).
//!
//! A unit is left for the next sync (it is *busy*) when anything changed
//! it after the state the merge started from, or a process holds a file
//! in it open for writing: the agent's edit always wins the moment.
//!
//! Invariants: everything is written inside ROOT, reached one component
//! at a time without following a symlink (`commands::open_parent`); a
//! unit whose parent is not there is busy, never made by a path that
//! could lead elsewhere. Units are applied parents first, removals
//! children first.
//!
//! Locks: none of its own; the writes go through the mount, under the
//! daemon's locks, and the caller holds `sync/lock`.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use skillfs_sync::skill;
use skillfs_sync::tree::{Entry, Tree, parent, within};

use super::gittree::{Both, GitBlobs};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::journal::Record;
use crate::sys;

/// What an apply did.
#[derive(Debug, Default)]
pub struct Applied {
    /// The units written, removed or made.
    pub done: Vec<Vec<u8>>,
    /// The units left for the next sync, with why.
    pub busy: Vec<(Vec<u8>, String)>,
    /// The units that could not be written, with why: listed as
    /// conflicts (the other side's change is in its commit), not retried.
    pub failed: Vec<(Vec<u8>, String)>,
}

impl Applied {
    /// What an apply wrote made durable: `root` synced, which syncs the
    /// mount's journal with it.
    pub fn durable(&self, root: &Path) -> Result<(), Failure> {
        std::fs::File::open(root)
            .and_then(|d| d.sync_all())
            .map_err(|e| Failure::io(Exit::Internal, "sync", root, &e))
    }

    /// The apply of a command (`restore`, `sync --take`) as its answer:
    /// the first unit left (exit 9: in use) or that failed (exit 1), with
    /// the units written before it (`none`: the words for none).
    pub fn verdict(&self, none: &str) -> Result<(), Failure> {
        let unit = |u: &[u8]| String::from_utf8_lossy(u).into_owned();
        if let Some((u, why)) = self.busy.first() {
            return Err(Failure::new(
                Exit::Busy,
                format!(
                    "'{}' is in use: {why}; {}; try again",
                    unit(u),
                    self.written(none)
                ),
            ));
        }
        if let Some((u, why)) = self.failed.first() {
            return Err(Failure::new(
                Exit::Internal,
                format!(
                    "'{}' could not be written: {why}; {}",
                    unit(u),
                    self.written(none)
                ),
            ));
        }
        Ok(())
    }

    /// What was written, for the message of an apply that stopped at a
    /// unit (each unit is written or left whole): `none` when nothing was.
    fn written(&self, none: &str) -> String {
        match self.done.len() {
            0 => none.to_string(),
            n => format!(
                "{n} of its parts were written ({}; skillfs undo takes them back)",
                self.done
                    .iter()
                    .map(|u| format!("'{}'", String::from_utf8_lossy(u)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The unit of each changed path: its innermost skill, else itself.
pub fn changed_units(ours: &Tree, merged: &Tree) -> BTreeSet<Vec<u8>> {
    let roots: BTreeSet<Vec<u8>> = skill::roots(ours)
        .into_iter()
        .chain(skill::roots(merged))
        .collect();
    let unit_of = |p: &[u8]| -> Vec<u8> {
        let mut at = Some(p);
        while let Some(a) = at {
            if roots.contains(a) {
                return a.to_vec();
            }
            at = parent(a);
        }
        p.to_vec()
    };
    let paths: BTreeSet<&[u8]> = ours.iter().chain(merged.iter()).map(|(p, _)| p).collect();
    paths
        .into_iter()
        .filter(|p| ours.get(p) != merged.get(p))
        .map(unit_of)
        .collect()
}

/// Whether `rec` touched `unit` or anything below it.
fn touches(rec: &Record, unit: &[u8]) -> bool {
    let at = |p: &RelPath| within(p.as_bytes(), unit) || within(unit, p.as_bytes());
    at(&rec.path) || rec.to.as_ref().is_some_and(at)
}

/// Why `unit` must wait, if it must: a change of another process
/// recorded since the merge read the tree (`others`), or a file below it
/// open for writing (`writers`: the open files' paths).
fn busy(unit: &[u8], others: &[&Record], writers: &[PathBuf], root: &Path) -> Option<String> {
    if let Some(r) = others.iter().find(|r| touches(r, unit)) {
        return Some(format!("changed since the merge began (change {})", r.seq));
    }
    let at = root.join(std::ffi::OsStr::from_bytes(unit));
    writers
        .iter()
        .find(|w| w.starts_with(&at))
        .map(|w| format!("'{}' is open for writing", w.display()))
}

/// Every file some process holds open for writing, by the path the kernel
/// gives it (`/proc/*/fd`); processes this user cannot see are not
/// counted (see docs/limits.md).
pub fn open_for_writing() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let pid = p.file_name();
        if !pid.as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let info = p.path().join("fdinfo").join(fd.file_name());
            let writes = std::fs::read_to_string(info).ok().and_then(|t| {
                let flags = t.lines().find_map(|l| l.strip_prefix("flags:"))?;
                let flags = u32::from_str_radix(flags.trim(), 8).ok()?;
                Some(matches!(flags & libc::O_ACCMODE as u32, 1 | 2))
            });
            if writes == Some(true) {
                out.push(target);
            }
        }
    }
    out
}

/// What the live tree's newest state says of each entry: its mode and
/// mtime (ns).
pub type Meta = HashMap<Vec<u8>, (u32, i128)>;

/// Writes the unit `unit` (`sub`: its entry and every one below it) at
/// `dest`, a path inside a staging directory. A file the live tree has
/// keeps its mode (the merge decides only the executable bits, which is
/// all git holds), and its mtime too when its bytes are the same; a new
/// one is 0644 or 0755.
fn build(
    dest: &Path,
    sub: &[(&[u8], &Entry)],
    unit: &[u8],
    (contents, ours, meta): (&Both, &Tree, &Meta),
) -> Result<(), String> {
    let mut dirs = Vec::new();
    for (p, e) in sub {
        let rest = &p[unit.len()..];
        let at = if rest.is_empty() {
            dest.to_path_buf()
        } else {
            dest.join(std::ffi::OsStr::from_bytes(&rest[1..]))
        };
        let fail = |e: std::io::Error| format!("{}: {e}", at.display());
        match e {
            Entry::Dir => {
                std::fs::create_dir(&at).map_err(fail)?;
                // The mode of what was a directory here too, else 0755.
                if let (Some(&(mode, _)), Some(Entry::Dir)) = (meta.get(*p), ours.get(p)) {
                    dirs.push((at, mode));
                }
            }
            Entry::File { blob, exec } => {
                contents.write_into(blob, &at)?;
                let exec_bits = |m: u32| if *exec { (m & 0o444) >> 2 } else { 0 };
                // The mode of what was a file here too, else 0644.
                let mode = match (meta.get(*p), ours.get(p)) {
                    (Some(&(m, _)), Some(Entry::File { .. })) => (m & 0o666) | exec_bits(m),
                    _ => 0o644 | exec_bits(0o644),
                };
                std::fs::set_permissions(&at, std::os::unix::fs::PermissionsExt::from_mode(mode))
                    .map_err(fail)?;
                if let (Some(&(_, mtime)), Some(Entry::File { blob: had, .. })) =
                    (meta.get(*p), ours.get(p))
                    && had == blob
                {
                    let (secs, nsecs) = sys::split_ns(mtime);
                    let t = sys::Time::At(secs, nsecs);
                    sys::lutimensat(sys::CWD, at.as_os_str().as_bytes(), t, t).map_err(fail)?;
                }
            }
            Entry::Symlink { target } => {
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &at)
                    .map_err(fail)?
            }
        }
    }
    // Directory modes last, innermost first: a mode may forbid the making
    // of what is inside.
    for (d, mode) in dirs.iter().rev() {
        std::fs::set_permissions(
            d,
            std::os::unix::fs::PermissionsExt::from_mode(*mode & 0o7777),
        )
        .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    Ok(())
}

/// What became of a unit.
enum Outcome {
    Done,
    /// Left for the next sync: someone is at it (why).
    Busy(String),
    /// It could not be written (why): not a matter of waiting.
    Failed(String),
}

/// Puts the unit `unit` of `merged` in place through the mounted `root`,
/// or removes it; `ours` says what the live tree holds. `quiet` is asked
/// last, right before the one call that changes the live tree (after the
/// build), and says why the unit must wait, if it must.
fn put(
    root: &Path,
    unit: &[u8],
    (ours, merged): (&Tree, &Tree),
    (contents, meta): (&Both, &Meta),
    quiet: &mut dyn FnMut() -> Result<Option<String>, Failure>,
) -> Result<Outcome, Failure> {
    let rel = RelPath::from_bytes_unchecked(unit.to_vec());
    let name = rel.file_name().to_vec();
    let target = root.join(rel.as_os_str());
    let failed = |why: String| Ok(Outcome::Failed(why));
    // A skill on either side is swapped whole, whatever it is now.
    let is_skill = skill::roots(merged)
        .into_iter()
        .chain(skill::roots(ours))
        .any(|r| r.as_slice() == unit);
    let (parent_fd, top) = match crate::commands::open_parent(root, &rel) {
        Ok(p) => p,
        Err(f) => return failed(f.to_string()),
    };
    let dir = parent_fd.as_fd();
    let Some(want) = merged.get(unit) else {
        if top != rel {
            return Ok(Outcome::Done); // already gone
        }
        if let Some(why) = quiet()? {
            return Ok(Outcome::Busy(why));
        }
        // Removed by the merge: parked (a directory outside every skill
        // only once empty: what is left in it is someone's).
        if !matches!(ours.get(unit), Some(Entry::Dir)) || is_skill {
            return match crate::commands::remove(root, &rel) {
                Ok(()) => Ok(Outcome::Done),
                Err(f) => failed(f.to_string()),
            };
        }
        return match sys::unlinkat(dir, &name, true) {
            Ok(()) => Ok(Outcome::Done),
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => Ok(Outcome::Done),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Outcome::Done),
            Err(e) => failed(format!("{}: {e}", target.display())),
        };
    };
    if top != rel {
        return Ok(Outcome::Busy(format!("'{top}' is not there")));
    }
    if *want == Entry::Dir && !is_skill && ours.get(unit).is_none_or(|e| *e == Entry::Dir) {
        // A directory outside every skill: made if missing (its entries
        // are units of their own).
        if ours.get(unit).is_some() {
            return Ok(Outcome::Done);
        }
        if let Some(why) = quiet()? {
            return Ok(Outcome::Busy(why));
        }
        return match sys::mkdirat(dir, &name, 0o755) {
            Ok(()) => Ok(Outcome::Done),
            Err(e) => failed(format!("{}: {e}", target.display())),
        };
    }
    // A skill, a file or link, or a directory where a file was: built
    // whole beside it, then swapped in. (A directory outside every skill
    // is built empty: its entries are units of their own, after it.)
    let park_name = match crate::commands::staging_dir(&parent_fd, &target, "sync") {
        Ok(n) => n,
        Err(f) => return failed(f.to_string()),
    };
    let parent = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let stage = parent
        .join(&park_name)
        .join(std::ffi::OsStr::from_bytes(&name));
    let sub: Vec<(&[u8], &Entry)> = if is_skill || *want != Entry::Dir {
        merged.subtree(unit).into_iter().collect()
    } else {
        vec![(unit, want)]
    };
    let undo = || {
        let _ = std::fs::remove_dir_all(parent.join(&park_name));
    };
    if let Err(e) = build(&stage, &sub, unit, (contents, ours, meta)) {
        undo();
        return failed(e);
    }
    // Asked now, after the build (which may take long: a large file
    // streamed from git), right before the swap.
    match quiet() {
        Ok(None) => {}
        Ok(Some(why)) => {
            undo();
            return Ok(Outcome::Busy(why));
        }
        Err(f) => {
            undo();
            return Err(f);
        }
    }
    let mut staged = park_name.as_bytes().to_vec();
    staged.push(b'/');
    staged.extend_from_slice(&name);
    let exists = sys::lstatat(dir, &name).is_ok();
    let flags = if exists {
        libc::RENAME_EXCHANGE
    } else {
        libc::RENAME_NOREPLACE
    };
    if let Err(e) = sys::renameat2(dir, &staged, dir, &name, flags) {
        undo();
        return failed(format!("swap into {}: {e}", target.display()));
    }
    if !exists {
        let _ = sys::unlinkat(dir, park_name.as_bytes(), true);
    } else if matches!(ours.get(unit), Some(Entry::Dir)) {
        // What the old skill held that no version has (a file of an
        // untracked name, a hidden one) is not the merge's to drop.
        carry_over(
            &stage,
            &parent.join(std::ffi::OsStr::from_bytes(&name)),
            unit,
            (ours, merged),
        );
    }
    Ok(Outcome::Done)
}

/// Moves every entry under `old` (the unit swapped out) that `ours` does
/// not version into the same place under `new` (the unit swapped in),
/// where that place is free and `merged` has its directory (a directory
/// of the new unit, never a link); the rest stays in the staging
/// directory, hidden, until the park sweep.
fn carry_over(old: &Path, new: &Path, unit: &[u8], (ours, merged): (&Tree, &Tree)) {
    let mut dirs = vec![Vec::<u8>::new()];
    while let Some(rel) = dirs.pop() {
        let here = |base: &Path| {
            if rel.is_empty() {
                base.to_path_buf()
            } else {
                base.join(std::ffi::OsStr::from_bytes(&rel))
            }
        };
        let Ok(entries) = std::fs::read_dir(here(old)) else {
            continue;
        };
        for e in entries.flatten() {
            let mut q = rel.clone();
            if !q.is_empty() {
                q.push(b'/');
            }
            q.extend_from_slice(e.file_name().as_bytes());
            let mut versioned = unit.to_vec();
            versioned.push(b'/');
            versioned.extend_from_slice(&q);
            match ours.get(&versioned) {
                Some(Entry::Dir) => dirs.push(q),
                Some(_) => {}
                None => {
                    let to = new.join(std::ffi::OsStr::from_bytes(&q));
                    let mut above = unit.to_vec();
                    if !rel.is_empty() {
                        above.push(b'/');
                        above.extend_from_slice(&rel);
                    }
                    if merged.get(&above) == Some(&Entry::Dir) {
                        let _ = sys::renameat2(
                            sys::CWD,
                            e.path().as_os_str().as_bytes(),
                            sys::CWD,
                            to.as_os_str().as_bytes(),
                            libc::RENAME_NOREPLACE,
                        );
                    }
                }
            }
        }
    }
}

/// The journal's records of other processes since change `since`, kept
/// up to date by reading only what was appended since the last look (each
/// segment from where the last read stopped; a record is one line).
struct Others {
    dir: PathBuf,
    since: u64,
    /// How far each segment was read.
    read: HashMap<String, u64>,
    records: Vec<Record>,
}

impl Others {
    fn new(layout: &crate::store::Layout, since: u64) -> Others {
        Others {
            dir: layout.journal(),
            since,
            read: HashMap::new(),
            records: Vec::new(),
        }
    }

    /// Reads what was appended since the last call.
    fn refresh(&mut self) -> Result<(), Failure> {
        let fail = |e: std::io::Error| Failure::io(Exit::BadStore, "read", &self.dir, &e);
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map_err(fail)?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(".jsonl"))
            .collect();
        names.sort();
        for name in names {
            let path = self.dir.join(&name);
            let from = self.read.get(&name).copied().unwrap_or(0);
            let mut f = std::fs::File::open(&path).map_err(fail)?;
            let len = f.metadata().map_err(fail)?.len();
            if len <= from {
                continue;
            }
            std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(from)).map_err(fail)?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut bytes).map_err(fail)?;
            // Only whole lines: a record being appended is read next time.
            let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            for line in bytes[..whole]
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
            {
                if let Ok(r) = crate::store::journal::decode(line)
                    && r.seq > self.since
                    && !own_thread(&r.actor)
                {
                    self.records.push(r);
                }
            }
            self.read.insert(name, from + whole as u64);
        }
        Ok(())
    }
}

/// The threads of this process that applied merges, with their names:
/// what they (and the main thread) wrote is no one else's change
/// (`Others`). The name is matched too: a finished thread's id may go to
/// another process's thread in a long sync.
static APPLIERS: std::sync::Mutex<Vec<(u32, String)>> = std::sync::Mutex::new(Vec::new());

pub(super) fn own_thread(actor: &crate::store::journal::Actor) -> bool {
    actor.pid == std::process::id()
        || APPLIERS.lock().is_ok_and(|t| {
            t.iter()
                .any(|(tid, name)| *tid == actor.pid && *name == actor.comm)
        })
}

/// The actor's name of what a merge of `replica`'s side writes: the name
/// its thread takes (at most 15 bytes, the kernel's `comm`; a replica id
/// is hex digits, and anything else in one read from the store is left
/// out, never a panic).
pub fn actor_of(replica: &str) -> String {
    let short: String = replica
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!("sync:{short}")
}

/// [`apply`], in a thread named [`actor_of`] `replica`, so that `log`
/// says where each change came from (the daemon names a change's actor
/// by the thread that made it, from the FUSE request's pid, which is the
/// thread's).
pub fn apply_as(
    replica: &str,
    root: &Path,
    layout: &crate::store::Layout,
    ours: (&Tree, u64),
    merged: &Tree,
    contents: (&Both, &Meta),
) -> Result<Applied, Failure> {
    let name = actor_of(replica);
    std::thread::scope(|s| {
        let t = std::thread::Builder::new()
            .name(name.clone())
            .spawn_scoped(s, || {
                if let Ok(mut t) = APPLIERS.lock() {
                    t.push((crate::process::gettid(), name));
                }
                apply(root, layout, ours, merged, contents)
            })
            .map_err(|e| Failure::new(Exit::Internal, format!("could not start a thread: {e}")))?;
        t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Another replica's side of one path, to be written as it has it.
pub(super) struct TheirSide<'a> {
    pub replica: &'a str,
    /// The store's sync repository, and the commit of the side.
    pub repo: &'a Path,
    pub commit: &'a str,
    pub tree: &'a Tree,
    pub blobs: &'a GitBlobs,
}

/// Writes `at` as `side` has it, and the rest of this tree as it is, as
/// one unit of a merge (`apply_as`: staged, swapped in whole, a version
/// `undo` takes back); then makes its records durable and notes where
/// they came from, in that order (`origins`). What `sync --take` and
/// `restore REPLICA:ID` do. `nothing`: what the verdict says when nothing
/// was written.
pub(super) fn take_side(
    root: &Path,
    layout: &crate::store::Layout,
    dir: &crate::store::Dir,
    side: &TheirSide,
    at: &[u8],
    nothing: &str,
) -> Result<Applied, Failure> {
    let store = crate::commands::Store::open(layout.clone())?;
    let (ours, since, meta) = super::pull::ours(&store);
    let mut taken = Tree::new();
    for (p, e) in ours.iter().filter(|(p, _)| !within(p, at)) {
        taken.insert(p, e.clone());
    }
    // The directories above `at` this tree lacks are made (`insert`).
    for (p, e) in side.tree.subtree(at) {
        taken.insert(p, e.clone());
    }
    if !taken.is_whole() {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "a parent of '{}' is no directory in this tree: {nothing}",
                String::from_utf8_lossy(at)
            ),
        ));
    }
    let contents = Both {
        store: &store.blobs,
        git: side.blobs,
        made: Default::default(),
    };
    let applied = apply_as(
        side.replica,
        root,
        layout,
        (&ours, since),
        &taken,
        (&contents, &meta),
    )?;
    // The records first, then the note that names them.
    applied.durable(root)?;
    if let Ok(records) = crate::commands::read_records(layout) {
        let author = super::origins::Authors::of_one(side.repo, side.commit, at);
        super::origins::note(dir, side.replica, (&records, since), &applied, |_| {
            super::origins::From {
                commit: side.commit,
                author: author.clone(),
            }
        });
    }
    applied.verdict(nothing)?;
    Ok(applied)
}

/// Makes the live tree under the mounted `root`, whose newest state is
/// `ours` as of change `since`, hold `merged`. Each unit is checked for
/// writers and for changes since `since` just before it is written (what
/// the journal gained since the last look).
pub fn apply(
    root: &Path,
    layout: &crate::store::Layout,
    (ours, since): (&Tree, u64),
    merged: &Tree,
    (contents, meta): (&Both, &Meta),
) -> Result<Applied, Failure> {
    let units = changed_units(ours, merged);
    let mut done = Applied::default();
    if units.is_empty() {
        return Ok(done);
    }
    // What this merge writes itself is no one else's change.
    let mut others = Others::new(layout, since);
    let mut held: Vec<Vec<u8>> = Vec::new();
    let present: Vec<&Vec<u8>> = units.iter().filter(|u| merged.get(u).is_some()).collect();
    let removed: Vec<&Vec<u8>> = units
        .iter()
        .rev()
        .filter(|u| merged.get(u).is_none())
        .collect();
    for unit in present.into_iter().chain(removed) {
        // Below a unit left for later: later too.
        if let Some(h) = held.iter().find(|h| within(unit, h)) {
            let why = format!("'{}' waits", String::from_utf8_lossy(h));
            held.push(unit.clone());
            done.busy.push((unit.clone(), why));
            continue;
        }
        let mut quiet = || -> Result<Option<String>, Failure> {
            others.refresh()?;
            let recent: Vec<&Record> = others.records.iter().collect();
            Ok(busy(unit, &recent, &open_for_writing(), root))
        };
        match put(root, unit, (ours, merged), (contents, meta), &mut quiet)? {
            Outcome::Done => done.done.push(unit.clone()),
            Outcome::Busy(why) => {
                held.push(unit.clone());
                done.busy.push((unit.clone(), why));
            }
            Outcome::Failed(why) => {
                held.push(unit.clone());
                done.failed.push((unit.clone(), why));
            }
        }
    }
    Ok(done)
}
