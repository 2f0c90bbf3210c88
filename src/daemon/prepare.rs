//! A core ready to serve, its store locked: the checks, the store's layout
//! and lock, the journal read into the ledger, and the scan of ROOT. The
//! daemon and `open::open_core` take the very same steps.
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
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::checks::{absolute_root, check_nesting, check_root, existing_ancestor, store_dir};
use crate::error::{Exit, Failure};
use crate::fs::SkillFs;
use crate::hide::{Config, HideRules, RuleArgs};
use crate::ledger::Ledger;
use crate::relpath::RelPath;
use crate::scan::{Areas, Settler, tend_parked};
use crate::store::blobs::BlobStore;
use crate::store::durable::StoreIo;
use crate::store::journal::{self, Journal};
use crate::store::journal::{Actor, Op};
use crate::store::{self, Dir, Layout, StoreLock, fsutil};

pub struct MountArgs {
    pub root: PathBuf,
    pub store: Option<PathBuf>,
    pub foreground: bool,
    pub threads: usize,
    /// Other users may enter the mount (see `fuse::mount`).
    pub allow_other: bool,
    pub rules: RuleArgs,
}

/// A core ready to serve, its store locked (see `crate::open`).
pub(crate) struct Prepared {
    pub(super) root: PathBuf,
    /// The store directory, held open (the daemon's log is opened from it).
    pub(super) top: Arc<Dir>,
    pub(super) layout: Layout,
    pub(super) repaired: Vec<fsutil::Repair>,
    _lock: StoreLock,
    pub(crate) fs: Arc<SkillFs>,
}

pub(crate) fn prepare(args: &MountArgs) -> Result<Prepared, Failure> {
    let root = absolute_root(&args.root)?;
    check_root(&root)?;
    let root = root
        .canonicalize()
        .map_err(|e| Failure::io(Exit::BadRoot, "resolve ROOT", &root, &e))?;
    let wanted = store_dir(&root, args.store.as_deref())?;
    let (anc, tail) = existing_ancestor(&wanted);
    let store_path = if tail.as_os_str().is_empty() {
        anc.clone()
    } else {
        anc.join(&tail)
    };
    check_nesting(&root, &store_path)?;
    store::check_placement(&root, &store_path, &anc)?;
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
    StoreLock::refuse_if_held(&layout)?;
    let uid = crate::sys::geteuid();
    let mut repairs = fsutil::audit_parent(&store_path, &anc, uid)?;
    if fs::symlink_metadata(&store_path).is_ok() {
        repairs.extend(fsutil::audit(&store_path, uid)?);
    }
    let config = Config::load(&layout.dir)?;
    let rules = HideRules::build(&config, &args.rules)?;
    // The journal is read once, here: a damaged one refuses the mount
    // before anything exists, and what was read is what the ledger starts
    // from (a new store's, made below, is read there).
    let read = if layout.journal().is_dir() {
        Some(journal::read_dir(&layout.journal())?)
    } else {
        None
    };
    let root_id = store::RootId::of(&root)?;
    let root_id_stale = root_id.check(&layout)?;
    fsutil::repair(&repairs)?;
    // From here on the store is reached only through the fds of its
    // directories, opened once (`store::dir`): whatever is swapped on the
    // path to it afterwards, the daemon's writes stay in this store.
    let fds = layout.create()?;
    store::check_placement(&root, &store_path, &store_path)?;
    let lock = StoreLock::acquire(&fds.top, &layout)?;
    if root_id_stale {
        root_id.write(&fds.top)?;
    }
    // A daemon that came and went between the read and the lock changed
    // the journal: then (only then) it is read again, under the lock.
    let contents = match read {
        Some(contents) if contents.is_current_in(&fds.journal) => contents,
        _ => journal::read_in(&fds.journal)?,
    };
    fds.clear_scratch()?;
    let journal = Journal::open_in(&fds.journal, &contents, StoreIo::real())?;
    let mut ledger = Ledger::new(journal, &contents.records);
    let blobs = BlobStore::new(Arc::clone(&fds.blobs), Arc::clone(&fds.tmp));

    let root_fd = crate::sys::openat(
        libc::AT_FDCWD,
        root.as_os_str().as_bytes(),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )
    .map(OwnedFd::from)
    .map_err(|e| Failure::io(Exit::BadRoot, "open", &root, &e))?;

    let started = Instant::now();
    let areas = Areas {
        root_fd: root_fd.as_raw_fd(),
        parked_fd: fds.parked.fd(),
        orphans_fd: fds.orphans.fd(),
    };
    let report = {
        let mut settler = Settler::new(areas, &rules, &mut ledger, &blobs, Actor::daemon());
        let scanned = settler
            .settle(&RelPath::root(), Op::Scan, false, false, None)
            .and_then(|()| settler.record_removals())
            .and_then(|()| tend_parked(&mut settler, crate::time::now_ns(), &fds.tmp));
        scanned.map_err(|e| Failure::new(Exit::BadRoot, format!("scan of ROOT failed: {e}")))?;
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
        "hidden: {}\nuntracked: {}\n",
        rules.describe().join("  "),
        rules.describe_untracked().join("  ")
    );
    fds.top
        .replace(store::RULES, rules_text.as_bytes())
        .map_err(|e| Failure::io(Exit::BadStore, "write", &layout.rules(), &e))?;
    let top = Arc::clone(&fds.top);
    let fs = SkillFs::new(root_fd, fds, rules, blobs, ledger)
        .map_err(|e| Failure::new(Exit::BadRoot, format!("could not stat ROOT: {e:?}")))?;
    Ok(Prepared {
        root,
        top,
        layout,
        repaired: repairs,
        _lock: lock,
        fs: Arc::new(fs),
    })
}
