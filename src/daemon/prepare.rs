//! A core ready to serve, its store locked: the checks, the store's layout
//! and lock, the journal read into the ledger, at the first mount the
//! agent's own history imported (`crate::import`), and the scan of ROOT.
//! The daemon and `open::open_core` take the very same steps; `skillfs
//! import` takes them up to the import.
//!
//! Invariants: every check that can refuse a mount runs before anything in
//! ROOT or an existing store is changed. The journal is read once per
//! mount, here, before anything is created; the ledger starts from that
//! read (see `journal::Contents::is_current`).
//!
//! Locks: the store's flock (`StoreLock`), taken here and held by
//! [`Prepared`] for as long as it lives.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::checks::{absolute_root, check_nesting, check_root, existing_ancestor, store_dir};
use crate::config::Config;
use crate::error::{Exit, Failure};
use crate::fs::{Home, SkillFs};
use crate::hide::{HideRules, RuleArgs};
use crate::ledger::Ledger;
use crate::relpath::RelPath;
use crate::scan::{Areas, Settler, tend_parked};
use crate::store::blobs::BlobStore;
use crate::store::durable::{Durability, StoreIo};
use crate::store::journal::{self, Journal};
use crate::store::journal::{Actor, Op};
use crate::store::{self, Dir, Layout, StoreLock, fsutil};

pub struct MountArgs {
    /// The mount point: the versioned root, or the home around it.
    pub root: PathBuf,
    /// Mount over a home and version only this directory of it (`skills`);
    /// the rest of the home is plain (see `fs::tree`).
    pub versioned: Option<PathBuf>,
    pub store: Option<PathBuf>,
    pub foreground: bool,
    pub threads: usize,
    /// Other users may enter the mount (see `fuse::mount`).
    pub allow_other: bool,
    /// How requests reach the daemon (see `fuse::Transport`).
    pub transport: crate::fuse::Transport,
    pub rules: RuleArgs,
    /// Over a mount served by an older daemon: wait for it to be quiet
    /// (see `lifecycle`), instead of leaving it serving.
    pub wait: bool,
}

/// A core ready to serve, its store locked (see `crate::open`).
pub(crate) struct Prepared {
    /// Where the mount goes: `root`, or the home around it.
    pub(super) mount_point: PathBuf,
    /// The versioned root.
    pub(super) root: PathBuf,
    /// The store directory, held open (the daemon's log is opened from it).
    pub(super) top: Arc<Dir>,
    pub(super) layout: Layout,
    /// Start-up warnings (repairs of the store, a store carried over).
    pub(super) warnings: Vec<String>,
    /// Start-up facts for the log alone (the journal's checkpoint).
    pub(super) notes: Vec<String>,
    /// Taken by [`Prepared::finish`] at a clean end.
    lock: Option<StoreLock>,
    /// The door to the disk the store was opened with.
    io: StoreIo,
    pub(crate) fs: Arc<SkillFs>,
    /// The retention policy of `config.json`, applied on its schedule.
    pub(super) retention: Option<crate::retention::Policy>,
    /// `config.json`'s sync schedule: its interval, and how the sync runs.
    pub(super) sync: Option<(std::time::Duration, crate::sync::Options)>,
}

impl Prepared {
    /// The clean end of a core: what writers left published and synced
    /// (`SkillFs::shutdown`), then, unless a sync failed meanwhile (the
    /// door poisoned), the store marked clean (`store::clean`), so the
    /// next mount knows this one finished.
    pub(crate) fn finish(&mut self) {
        self.fs.shutdown();
        if self.lock.take().is_some()
            && !self.io.is_poisoned()
            && let Err(e) = store::clean::mark_clean(&self.top, &self.io)
        {
            tracing::warn!("could not mark the store cleanly unmounted: {e}");
        }
    }
}

/// The agent's home (see `sync::agent_home`) opened now, before the
/// mount: the daemon's scheduled sync reads its `config.yaml` from the
/// directory under the mount, never through it.
fn agent_home_under(root: &Path) -> crate::sync::AgentHome {
    let Some(home) = crate::sync::agent_home(root) else {
        return crate::sync::AgentHome::Missing;
    };
    match crate::sys::openat(
        crate::sys::CWD,
        home.as_os_str().as_bytes(),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    ) {
        Ok(f) => crate::sync::AgentHome::At(Arc::new(OwnedFd::from(f)), home),
        Err(e) => {
            tracing::info!(
                "sync: no agent home to check for its own Skill Sync at '{}': {e}",
                home.display()
            );
            crate::sync::AgentHome::Missing
        }
    }
}

/// A store opened for a mount (or an import), locked: everything of
/// [`prepare`] up to the journal read under the lock and `tmp/` emptied.
pub(crate) struct Opened {
    mount_point: PathBuf,
    root: PathBuf,
    name: Option<std::ffi::OsString>,
    layout: Layout,
    warnings: Vec<String>,
    rules: HideRules,
    fds: store::StoreFds,
    lock: StoreLock,
    /// The journal as read under the lock.
    contents: journal::Contents,
    /// The index of the journal's checkpoint, when the read started after it.
    base: Option<crate::history::HistoryIndex>,
    notes: Vec<String>,
    blobs: BlobStore,
    retention: Option<crate::retention::Policy>,
    sync: Option<(std::time::Duration, crate::sync::Options)>,
}

/// How a mount reaches the disk: the door every durable sync of the store,
/// ROOT and the core goes through, and the order of durable publishes
/// (`None`: what the store's filesystem allows, unless
/// `SKILLFS_PORTABLE_FSYNC=1` asks for each step in order; the variable is
/// read here and nowhere else).
#[derive(Clone)]
pub struct DiskAccess {
    pub io: StoreIo,
    pub durability: Option<Durability>,
}

impl DiskAccess {
    /// The real disk, in the order its filesystem allows: the one instance
    /// a daemon builds.
    pub fn real() -> DiskAccess {
        DiskAccess {
            io: StoreIo::real(),
            durability: None,
        }
    }

    /// The order durable publishes take over a store held as `fds`.
    fn durability(&self, fds: &store::StoreFds) -> Durability {
        self.durability.unwrap_or_else(|| {
            let portable = std::env::var_os("SKILLFS_PORTABLE_FSYNC").is_some();
            Durability::of_filesystem(&*fds.parked, portable)
        })
    }
}

pub(crate) fn prepare(args: &MountArgs, disk: &DiskAccess) -> Result<Prepared, Failure> {
    let mut o = open_store(args, &disk.io)?;
    // Before any link is judged: a link leading out of the root is never
    // followed into this mount (see `follow`).
    crate::follow::never_touch(&o.mount_point);
    // The first mount of a root: the agent's own history goes first, whole
    // or not at all (see `import`), and the scan below records the live
    // tree against it.
    if crate::import::may_import(&o.contents) {
        let report = crate::import::into_new_store(&o.root, &o.rules, &o.fds, &o.blobs)?;
        o.warnings.extend(report.lines());
        if report.records > 0 {
            o.contents = journal::read_in(&o.fds.journal)?;
            o.base = None;
        }
    }
    let durability = disk.durability(&o.fds);
    settle(o, durability)
}

/// `skillfs import`: the agent's history into the store of `args`, which
/// must hold no record yet; the store is then as a first mount leaves it
/// just before its scan.
pub fn import(args: &MountArgs) -> Result<crate::import::Report, Failure> {
    let o = open_store(args, &StoreIo::real())?;
    if !crate::import::may_import(&o.contents) {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "store '{}' already holds history ({} records): the agent's history is \
                 imported only into a store with none, by the first mount or `skillfs import` \
                 before it (ids and times must rise together)",
                o.layout.dir.display(),
                o.contents.last_seq()
            ),
        ));
    }
    crate::import::into_new_store(&o.root, &o.rules, &o.fds, &o.blobs)
}

/// The versioned root and the store `args` mean, checked, made and locked
/// (see the module's invariants), the journal read; every sync through
/// `io`.
pub(crate) fn open_store(args: &MountArgs, io: &StoreIo) -> Result<Opened, Failure> {
    let mount_point = absolute_root(&args.root)?;
    check_root(&mount_point)?;
    let mount_point = mount_point
        .canonicalize()
        .map_err(|e| Failure::io(Exit::BadRoot, "resolve ROOT", &mount_point, &e))?;
    // What the user should hear of, on the terminal of a background mount
    // as in the log (see `run`).
    let mut warnings: Vec<String> = Vec::new();
    let name = match args.versioned.as_deref() {
        Some(v) => Some(versioned_name(v)?),
        // The store remembers what it versions: a home mounted before
        // with `--versioned NAME` is mounted the same way again.
        None => remembered_name(&mount_point, args.store.as_deref())?
            .map(|n| versioned_name(Path::new(&n)))
            .transpose()?,
    };
    let root = match &name {
        None => mount_point.clone(),
        Some(n) => mount_point.join(n),
    };
    let wanted = match (&args.store, &name) {
        (None, None) => super::checks::default_store_of(&root)?,
        (store, _) => store_dir(&mount_point, store.as_deref())?,
    };
    let resolve = |wanted: &Path| {
        let (anc, tail) = existing_ancestor(wanted);
        let path = if tail.as_os_str().is_empty() {
            anc.clone()
        } else {
            anc.join(&tail)
        };
        (anc, path)
    };
    let (anc, store_path) = resolve(&wanted);
    check_nesting(&mount_point, &store_path)?;
    if name.is_some() {
        refuse_filesystem_root(&mount_point)?;
    }
    store::check_placement(&mount_point, &store_path, &anc)?;
    // A store of another root is refused before the versioned directory
    // is made (a directory not yet there has no identity to match: its
    // path alone must).
    if name.is_some() && fs::symlink_metadata(&root).is_err() {
        store::RootId {
            path: root.clone(),
            dev: 0,
            ino: 0,
        }
        .check(&Layout::new(store_path.clone()))?;
    }
    // Only now is anything made or moved: the versioned directory, and a
    // store of it kept inside the home by a skills-only mount.
    if let Some(n) = &name {
        make_versioned_root(&mount_point, n)?;
        if args.store.is_none() {
            warnings.extend(carry_over(&root, &wanted, io)?);
        }
    }
    let (anc, store_path) = resolve(&wanted);
    if store_path.as_os_str().as_bytes().contains(&b',') {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "store path '{}' contains ',', which mount options cannot carry",
                store_path.display()
            ),
        ));
    }
    let layout = Layout::new(store_path.clone());
    // A store another user can reach, bad rules, a damaged journal and a
    // store of another root are refused before anything is created,
    // repaired or locked.
    super::unmount::await_unmounted_daemon(&layout);
    StoreLock::refuse_if_held(&layout)?;
    let uid = crate::process::geteuid();
    let mut repairs = fsutil::audit_parent(&store_path, &anc, uid)?;
    if fs::symlink_metadata(&store_path).is_ok() {
        repairs.extend(fsutil::audit(&store_path, uid)?);
    }
    let config = Config::load(&layout.dir)?;
    let rules = HideRules::build(&config, &args.rules)?;
    if let Some(p) = &config.retention {
        p.check().map_err(|why| {
            Failure::new(
                Exit::BadRules,
                format!(
                    "config file '{}': retention: {why}",
                    layout.dir.join(crate::config::CONFIG_FILE).display()
                ),
            )
        })?;
    }
    let sync = match &config.sync {
        Some(schedule) => {
            let bad = |why| {
                Failure::new(
                    Exit::BadRules,
                    format!(
                        "config file '{}': sync: {why}",
                        layout.dir.join(crate::config::CONFIG_FILE).display()
                    ),
                )
            };
            let every = schedule.interval().map_err(bad)?;
            let deadline = Some(schedule.timeout().map_err(bad)?);
            Some((
                every,
                crate::sync::Options {
                    deadline,
                    agent_home: agent_home_under(&root),
                },
            ))
        }
        None => None,
    };
    // The journal is read once, here: a damaged one refuses the mount
    // before anything exists, and what was read is what the ledger starts
    // from (a new store's, made below, is read there).
    // What became of the journal's checkpoint, for the log once open.
    let mut notes: Vec<String> = Vec::new();
    let read = if layout.journal().is_dir() {
        let dir = store::Dir::open_path(&layout.journal()).map_err(|e| {
            store::StoreError::io(
                store::ErrorKind::DamagedJournal,
                "list journal",
                &layout.journal(),
                e,
            )
        })?;
        Some(crate::checkpoint::read_for_mount(&dir, &mut notes)?)
    } else {
        None
    };
    let root_id = store::RootId::of(&root)?;
    let root_id_stale = root_id.check(&layout)?;
    fsutil::repair(&repairs)?;
    // From here on the store is reached only through the fds of its
    // directories, opened once (`store::dir`): whatever is swapped on the
    // path to it afterwards, the daemon's writes stay in this store.
    let fds = layout.create(io.clone())?;
    store::check_placement(&mount_point, &store_path, &store_path)?;
    let lock = StoreLock::acquire(&fds.top, &layout)?;
    if root_id_stale {
        root_id.write(&fds.top, io)?;
    }
    // A daemon that came and went between the read and the lock changed
    // the journal: then (only then) it is read again, under the lock.
    let (contents, base) = match read {
        Some((contents, base)) if contents.is_current_in(&fds.journal) => (contents, base),
        _ => {
            notes.clear();
            crate::checkpoint::read_for_mount(&fds.journal, &mut notes)?
        }
    };
    fds.clear_scratch()?;
    let blobs = BlobStore::new(Arc::clone(&fds.blobs), io.clone());
    Ok(Opened {
        mount_point,
        root,
        name,
        layout,
        warnings: warnings
            .into_iter()
            .chain(repairs.iter().map(|r| r.to_string()))
            .collect(),
        rules,
        fds,
        lock,
        contents,
        base,
        notes,
        blobs,
        retention: config.retention,
        sync,
    })
}

/// The versioned name a store records for a mount over `mount_point`:
/// the store (`--store`, else the default one of `mount_point`) versions a
/// directory directly inside it.
fn remembered_name(
    mount_point: &Path,
    store: Option<&Path>,
) -> Result<Option<std::ffi::OsString>, Failure> {
    let store = store_dir(mount_point, store)?;
    if !store::is_store(&store) {
        return Ok(None);
    }
    Ok(store::RootId::read(&Layout::new(store))
        .filter(|id| id.path.parent() == Some(mount_point))
        .and_then(|id| id.path.file_name().map(|n| n.to_os_string())))
}

/// The rest of [`prepare`]: the journal opened, ROOT opened and scanned.
fn settle(o: Opened, durability: Durability) -> Result<Prepared, Failure> {
    let Opened {
        mount_point,
        root,
        name,
        layout,
        warnings,
        rules,
        fds,
        lock,
        contents,
        base,
        notes,
        blobs,
        retention,
        sync,
    } = o;
    // The last daemon did not finish (its DIRTY mark is still there): a
    // power cut may have left live files empty or zero-filled (see
    // `scan::torn`).
    let unclean = store::clean::last_unclean(&fds.top);
    let journal = Journal::open_in(&fds.journal, &contents, fds.io.clone())?;
    // Folded and let go: a year's records are hundreds of MB the daemon
    // need not keep.
    let mut ledger = Ledger::from_records(journal, base, contents.records);

    let open_dir = |p: &Path, exit: Exit| {
        crate::sys::openat(
            crate::sys::CWD,
            p.as_os_str().as_bytes(),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map(OwnedFd::from)
        .map_err(|e| Failure::io(exit, "open", p, &e))
    };
    // Over a home the versioned root is opened from the home's fd, by one
    // name that is no symlink: both are the directories the mount serves.
    let (root_fd, home) = match &name {
        None => (open_dir(&root, Exit::BadRoot)?, None),
        Some(name) => {
            let home_fd = open_dir(&mount_point, Exit::BadRoot)?;
            let name = name.as_bytes().to_vec();
            let root_fd = crate::sys::openat(
                home_fd.as_fd(),
                &name,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )
            .map(OwnedFd::from)
            .map_err(|e| Failure::io(Exit::BadRoot, "open", &root, &e))?;
            let home = Home {
                fd: home_fd,
                versioned: name,
            };
            (root_fd, Some(home))
        }
    };

    let started = Instant::now();
    let areas = Areas {
        root_fd: root_fd.as_fd(),
        parked_fd: fds.parked.fd(),
        orphans_fd: fds.orphans.fd(),
    };
    let mut warnings = warnings;
    let report = {
        let mut settler = Settler::new(areas, &rules, &mut ledger, &blobs, Actor::daemon());
        settler.repair_torn = unclean;
        let scanned = settler
            .settle(&RelPath::root(), Op::Scan, false, false, None)
            .and_then(|()| settler.record_removals())
            .and_then(|()| tend_parked(&mut settler, crate::time::now_ns(), &fds.tmp));
        scanned.map_err(|e| Failure::new(Exit::BadRoot, format!("scan of ROOT failed: {e}")))?;
        // Said by `mount` and kept in the log: files put back after a power cut.
        warnings.append(&mut settler.repairs);
        settler.report
    };
    ledger
        .sync(&blobs)
        .map_err(|e| Failure::new(Exit::BadStore, format!("could not sync the journal: {e}")))?;
    tracing::info!(
        "scan of {}: {report:?} in {:?}",
        root.display(),
        started.elapsed()
    );
    let rules_text = format!(
        "hidden: {}\nuntracked: {}\nparks swept after: {}\n",
        rules.describe().join("  "),
        rules.describe_untracked().join("  "),
        crate::time::format_age(rules.park_max_age_ns)
    );
    fds.top
        .replace(store::RULES, rules_text.as_bytes(), &fds.io)
        .map_err(|e| Failure::io(Exit::BadStore, "write", &layout.rules(), &e))?;
    let top = Arc::clone(&fds.top);
    let io = fds.io.clone();
    // From here on the core may serve: a power cut must be seen.
    store::clean::mark_serving(&fds.top, &io).map_err(|e| {
        Failure::io(
            Exit::BadStore,
            "mark as served",
            &layout.dir.join(store::clean::DIRTY),
            &e,
        )
    })?;
    let fs = SkillFs::new(root_fd, home, fds, rules, blobs, ledger, durability)
        .map_err(|e| Failure::new(Exit::BadRoot, format!("could not stat ROOT: {e:?}")))?;
    // `.history/REPLICA:ID`: other replicas' versions, read from git.
    fs.set_replicas(Box::new(crate::sync::Versions::new(layout.clone())));
    Ok(Prepared {
        mount_point,
        root,
        top,
        layout,
        warnings,
        notes,
        lock: Some(lock),
        io,
        fs: Arc::new(fs),
        retention,
        sync,
    })
}

/// The name given to `--versioned`: exactly one plain name (`skills`;
/// not `skills/`, `a/b`, `..` or a path), as the home lists it.
fn versioned_name(name: &Path) -> Result<std::ffi::OsString, Failure> {
    let bytes = name.as_os_str().as_bytes();
    let plain = !bytes.is_empty() && !bytes.contains(&b'/') && bytes != b"." && bytes != b"..";
    if !plain {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "--versioned '{}': give one directory name inside ROOT (e.g. skills)",
                name.display()
            ),
        ));
    }
    Ok(name.as_os_str().to_os_string())
}

/// A home that is the root of its filesystem has no place for a store:
/// it must be on the home's filesystem (versions are published by rename)
/// and outside the mount.
fn refuse_filesystem_root(home: &Path) -> Result<(), Failure> {
    let dev = |p: &Path| {
        fs::metadata(p)
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .ok()
    };
    let parent = home.parent().unwrap_or(Path::new("/"));
    if home == Path::new("/") || dev(home) != dev(parent) {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "'{}' is the root of its own filesystem: a store must be on that filesystem and \
                 outside the mount, and there is no such place; mount its skills directory alone \
                 (skillfs mount '{}/skills', or skillfs-mount --skills-only)",
                home.display(),
                home.display()
            ),
        ));
    }
    Ok(())
}

/// The directory `name` of the home `home` that a mount over the home
/// versions, made if missing: a directory (not a symlink: the mount
/// serves what is inside the home), on the home's filesystem (an entry is
/// moved between the two by rename).
fn make_versioned_root(home: &Path, name: &std::ffi::OsStr) -> Result<(), Failure> {
    let root = home.join(name);
    match fs::symlink_metadata(&root) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => {
            return Err(Failure::new(
                Exit::BadRoot,
                format!(
                    "'{}' is not a directory: --versioned names a real directory inside ROOT \
                     (a symlink would lead out of the mount)",
                    root.display()
                ),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir(&root).map_err(|e| Failure::io(Exit::BadRoot, "create", &root, &e))?;
        }
        Err(e) => return Err(Failure::io(Exit::BadRoot, "stat", &root, &e)),
    }
    let dev = |p: &Path| {
        fs::metadata(p)
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .map_err(|e| Failure::io(Exit::BadRoot, "stat", p, &e))
    };
    if dev(&root)? != dev(home)? {
        return Err(Failure::new(
            Exit::BadRoot,
            format!(
                "'{}' is another filesystem than '{}': an entry moves between them by rename, \
                 which cannot cross filesystems",
                root.display(),
                home.display()
            ),
        ));
    }
    Ok(())
}

/// A store kept by a mount over the versioned root alone (its default
/// place, `<home>/.skillfs/<name>`) is inside a mount over the home: it is
/// moved, whole and by one rename, to the default place of the home's
/// store, `wanted`, keeping every id. Only a store of this very root that
/// no daemon holds, and only when `wanted` does not exist yet; a move that
/// cannot be one rename (another filesystem) is refused with the command
/// that makes it. Says what it moved.
fn carry_over(root: &Path, wanted: &Path, io: &StoreIo) -> Result<Option<String>, Failure> {
    let Some(old) = Layout::default_dir(root) else {
        return Ok(None);
    };
    if !store::is_store(&old) {
        return Ok(None);
    }
    let old_layout = Layout::new(old.clone());
    if store::RootId::of(root)?.check(&old_layout).is_err() {
        return Ok(None); // another root's store: not ours to move
    }
    if fs::symlink_metadata(wanted).is_ok() {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "'{}' has two stores: '{}' (of a mount over it alone) and '{}' (of a mount over \
                 '{}'); keep one: `skillfs log --store` reads each, and `mv` puts the one to keep \
                 at '{}'",
                root.display(),
                old.display(),
                wanted.display(),
                root.parent().unwrap_or(Path::new("/")).display(),
                wanted.display()
            ),
        ));
    }
    StoreLock::refuse_if_held(&old_layout)?;
    let parent = wanted.parent().unwrap_or(Path::new("/"));
    fsutil::create_dir_all(parent, io)
        .map_err(|e| Failure::io(Exit::BadStore, "create", parent, &e))?;
    match fs::rename(&old, wanted) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            return Err(Failure::new(
                Exit::BadStore,
                format!(
                    "the store of '{}' is at '{}', inside the mount; it must move to '{}', on \
                     another filesystem: run `mv '{}' '{}'` (or pass --store) and mount again",
                    root.display(),
                    old.display(),
                    wanted.display(),
                    old.display(),
                    wanted.display()
                ),
            ));
        }
        Err(e) => return Err(Failure::io(Exit::BadStore, "move the store", &old, &e)),
    }
    let old_parent = old.parent().unwrap_or(Path::new("/"));
    for dir in [parent, old_parent] {
        fsutil::sync_dir(dir, io).map_err(|e| Failure::io(Exit::BadStore, "sync", dir, &e))?;
    }
    // The `.skillfs` directory it leaves, if nothing else is in it.
    let _ = fs::remove_dir(old_parent);
    Ok(Some(format!(
        "moved the store of {} from {} to {}: a store lives outside the mount",
        root.display(),
        old.display(),
        wanted.display()
    )))
}
