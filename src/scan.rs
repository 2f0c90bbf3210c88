//! The mount-time scan: records what changed in the root while it was not
//! mounted (on the first mount, the whole tree as the baseline).
//!
//! Invariants: a file whose size, mtime, mode and owner match the catalog is
//! not read (remounting an unchanged tree costs one `lstat` per entry);
//! parents are recorded before their children; a removed directory is
//! recorded once, at its top. Runs before the mount, through the root fd.

use std::collections::HashSet;
use std::os::fd::RawFd;

use crate::error::{Exit, Failure};
use crate::ledger::Ledger;
use crate::relpath::{ByteString, RelPath};
use crate::store::blobs::BlobStore;
use crate::store::journal::{Actor, Change, EntryState, Kind, Op};
use crate::sys;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanReport {
    pub entries: u64,
    pub hashed: u64,
    pub recorded: u64,
    pub removed: u64,
}

pub fn kind_of(st: &libc::stat) -> Option<Kind> {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Some(Kind::File),
        libc::S_IFDIR => Some(Kind::Dir),
        libc::S_IFLNK => Some(Kind::Symlink),
        _ => None,
    }
}

/// The state of an entry from its `lstat`, without content.
pub fn state_from_stat(st: &libc::stat, kind: Kind) -> EntryState {
    EntryState {
        kind,
        blob: None,
        size: if kind == Kind::Dir {
            0
        } else {
            st.st_size as u64
        },
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime_ns: sys::mtime_ns(st),
        target: None,
    }
}

/// True when `now` (from lstat) shows no change against `old` (recorded).
fn unchanged(old: &EntryState, now: &EntryState) -> bool {
    if old.kind != now.kind || old.mode != now.mode || old.uid != now.uid || old.gid != now.gid {
        return false;
    }
    match now.kind {
        // A directory's own content is its entries, scanned one by one.
        Kind::Dir => true,
        Kind::File | Kind::Symlink => old.size == now.size && old.mtime_ns == now.mtime_ns,
    }
}

pub fn scan(
    root_fd: RawFd,
    ledger: &mut Ledger,
    blobs: &BlobStore,
    is_hidden: &dyn Fn(&RelPath, Kind) -> bool,
) -> Result<ScanReport, Failure> {
    let mut report = ScanReport::default();
    let mut seen: HashSet<RelPath> = HashSet::new();
    let mut stack = vec![RelPath::root()];
    let fail = |what: &str, p: &RelPath, e: std::io::Error| {
        Failure::new(
            Exit::BadRoot,
            format!("could not {what} '{p}' in ROOT while scanning for offline edits: {e}"),
        )
    };
    while let Some(dir) = stack.pop() {
        let mut names =
            sys::read_dir_at(root_fd, dir.as_bytes()).map_err(|e| fail("list", &dir, e))?;
        names.sort_by(|a, b| a.name.cmp(&b.name));
        let mut subdirs = Vec::new();
        for ent in names {
            let path = dir.join(&ent.name);
            let st = match sys::lstatat(root_fd, path.as_bytes()) {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(fail("stat", &path, e)),
            };
            let Some(kind) = kind_of(&st) else {
                tracing::warn!("not versioned (not a file, directory or symlink): {path}");
                continue;
            };
            if is_hidden(&path, kind) {
                continue;
            }
            report.entries += 1;
            seen.insert(path.clone());
            if kind == Kind::Dir {
                subdirs.push(path.clone());
            }
            let mut now = state_from_stat(&st, kind);
            if let Some(old) = ledger.catalog().get(&path)
                && unchanged(old, &now)
            {
                continue;
            }
            match kind {
                Kind::File => {
                    let f = sys::openat(
                        root_fd,
                        path.as_bytes(),
                        libc::O_RDONLY | libc::O_NOFOLLOW,
                        0,
                    )
                    .map_err(|e| fail("open", &path, e))?;
                    let (id, size) = blobs.put_reader(&f).map_err(|e| fail("store", &path, e))?;
                    report.hashed += 1;
                    now.blob = Some(id);
                    now.size = size;
                }
                Kind::Symlink => {
                    let t = sys::readlinkat(root_fd, path.as_bytes())
                        .map_err(|e| fail("read link", &path, e))?;
                    now.target = Some(ByteString(t));
                }
                Kind::Dir => {}
            }
            if ledger.catalog().get(&path) == Some(&now) {
                continue;
            }
            ledger
                .record(Change::new(Op::Scan, path, Some(now)), Actor::daemon())
                .map_err(|e| {
                    Failure::new(
                        Exit::BadStore,
                        format!("could not append to the journal: {e}"),
                    )
                })?;
            report.recorded += 1;
        }
        // Depth-first in name order: push in reverse so the first name pops first.
        stack.extend(subdirs.into_iter().rev());
    }
    let gone: Vec<RelPath> = ledger
        .catalog()
        .iter()
        .map(|(p, _)| p)
        .filter(|p| !seen.contains(*p))
        .filter(|p| {
            p.parent()
                .is_none_or(|par| par.is_root() || seen.contains(&par))
        })
        .cloned()
        .collect();
    for p in gone {
        ledger
            .record(Change::new(Op::ScanRemove, p, None), Actor::daemon())
            .map_err(|e| {
                Failure::new(
                    Exit::BadStore,
                    format!("could not append to the journal: {e}"),
                )
            })?;
        report.removed += 1;
    }
    Ok(report)
}
