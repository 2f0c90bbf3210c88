//! `skillfs mount` over a mount that is there already: a dead one (its
//! daemon killed or crashed) is recovered, an older daemon (its binary
//! replaced by an upgrade) is restarted on this binary once the mount is
//! quiet, and a live one of this very binary is left to `checks` to refuse
//! as "already mounted".
//!
//! Invariants: a live mount is never detached here: an older daemon is
//! unmounted only by `unmount_if_quiet` (the kernel refuses a busy mount),
//! and while busy it keeps serving, so no write under ROOT goes
//! unversioned; a dead mount is detached only after its store's journal
//! reads sound (a damaged store refuses, and the dead mount, which lets
//! nothing through, stays). Only skillfs mounts of the store this mount
//! would use are touched.
//!
//! Locks: none taken; the store's flock is only tested.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::checks::{absolute_root, store_dir};
use super::mountinfo::mount_at;
use super::prepare::MountArgs;
use super::unmount::{Quiet, released, unmount_once_quiet};
use crate::error::{Exit, Failure};
use crate::store::{Layout, LockState, StoreLock};
use skillfs_base::mounts::lazy_unmount;

/// What `skillfs mount` found at its mount point.
pub(super) enum Found {
    /// Nothing of ours is mounted there (any more): mount. The lines say
    /// what was done to get there (a dead mount detached, an older daemon
    /// finished).
    Mount(Vec<String>),
    /// An older daemon serves the mount and it is busy: it goes on serving;
    /// the line says so.
    ServedByOlder(String),
}

/// How long an older daemon may take to finish once unmounted.
const FINISH: Duration = Duration::from_secs(60);

/// Settles what is mounted at `args.root` before a mount (see the module's
/// invariants). `wait`: wait for an older daemon's mount to be quiet
/// instead of leaving it serving.
pub(super) fn settle(args: &MountArgs, wait: bool) -> Result<Found, Failure> {
    let mount_point = absolute_root(&args.root)?;
    let mut done = Vec::new();
    // A failed mount may have left more than one of ours stacked.
    for _ in 0..4 {
        let Some(m) = mount_at(&mount_point) else {
            break;
        };
        let Some(store) = m.skillfs_store() else {
            break;
        };
        if let Some(given) = &args.store
            && store_dir(&mount_point, Some(given))? != store
        {
            // Another store's mount: `checks` names it.
            break;
        }
        let layout = Layout::new(store);
        match StoreLock::state(&layout) {
            LockState::Free => {}
            LockState::Held(_) => {
                upgrade(&mount_point, &layout, wait, &mut done)?;
                match done.last() {
                    Some(Step::Served(line)) => return Ok(Found::ServedByOlder(line.clone())),
                    Some(Step::Upgraded(_)) => continue,
                    _ => break,
                }
            }
            LockState::Unknown(e) => {
                // Only a lock taken proves a daemon dead: never detach on a guess.
                return Err(Failure::new(
                    Exit::BadStore,
                    format!(
                        "cannot tell whether a daemon serves '{}': its store's lock '{}' cannot \
                         be read ({e}); nothing was changed",
                        mount_point.display(),
                        layout.lock().display()
                    ),
                ));
            }
        }
        // Dead: no daemon holds the store.
        check_journal(&layout, &mount_point)?;
        lazy_unmount(&mount_point).map_err(|e| {
            Failure::new(
                Exit::BadRoot,
                format!(
                    "'{}' is a dead mount (its daemon died) and could not be detached: {e}",
                    mount_point.display()
                ),
            )
        })?;
        done.push(Step::Recovered(format!(
            "'{}' was a dead mount (its daemon had died): detached it; the store's journal \
             reads sound; mounting again",
            mount_point.display()
        )));
    }
    Ok(Found::Mount(
        done.into_iter()
            .filter_map(|s| match s {
                Step::Recovered(l) | Step::Upgraded(l) => Some(l),
                Step::Served(_) | Step::Current => None,
            })
            .collect(),
    ))
}

/// What was done to a mount already there.
enum Step {
    /// A dead mount detached.
    Recovered(String),
    /// An older daemon unmounted when quiet, and finished.
    Upgraded(String),
    /// An older daemon left serving a busy mount.
    Served(String),
    /// A daemon of this binary, or of one not older: left alone.
    Current,
}

/// A live daemon at `mount_point`: one of an older build is unmounted
/// once the mount is quiet (see the module's invariants).
fn upgrade(
    mount_point: &Path,
    layout: &Layout,
    wait: bool,
    done: &mut Vec<Step>,
) -> Result<(), Failure> {
    let Some(pid) = StoreLock::daemon(layout) else {
        done.push(Step::Current);
        return Ok(());
    };
    if !matches!(compare_build(pid), Ok(Build::Older)) {
        // "already mounted", from `checks`.
        done.push(Step::Current);
        return Ok(());
    }
    let mut said = false;
    loop {
        match unmount_once_quiet(mount_point, Some(pid)) {
            Ok(Quiet::Unmounted) => break,
            Ok(Quiet::Busy(busy)) if wait => {
                if !said {
                    eprintln!(
                        "skillfs: waiting for '{}' to be quiet to restart its older daemon (pid \
                         {pid}) on this binary: held by {}",
                        mount_point.display(),
                        busy.describe(8)
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(Quiet::Busy(busy)) => {
                done.push(Step::Served(format!(
                    "'{mp}' stays served by an older skillfs daemon (pid {pid}, a build older \
                     than this one), because the mount is busy (held by {}): it stays mounted \
                     and versioned; run `skillfs mount` again when it is quiet to restart it on \
                     this binary, or with --wait to wait for that",
                    busy.describe(8),
                    mp = mount_point.display()
                )));
                return Ok(());
            }
            Err(e) => {
                return Err(Failure::new(
                    Exit::MountRefused,
                    format!(
                        "could not unmount the older daemon's mount '{}': {e}",
                        mount_point.display()
                    ),
                ));
            }
        }
    }
    if !released(layout, FINISH) {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "'{}' is unmounted, but its older daemon (pid {pid}) did not finish within \
                 {FINISH:?} and still holds the store, so it is not mounted again: see \
                 daemon.log in '{}'; once that process has ended (a SIGKILL loses nothing \
                 acknowledged), run `skillfs mount` again",
                mount_point.display(),
                layout.dir.display()
            ),
        ));
    }
    done.push(Step::Upgraded(format!(
        "'{}' was served by an older skillfs daemon (pid {pid}): it was quiet, so it was \
         unmounted and has finished; mounting on this binary",
        mount_point.display()
    )));
    Ok(())
}

/// Reads the store's journal as a mount does, changing nothing: a damaged
/// one refuses before the dead mount is detached.
fn check_journal(layout: &Layout, mount_point: &Path) -> Result<(), Failure> {
    let dir = crate::store::Dir::open_path(&layout.journal()).map_err(|e| {
        Failure::new(
            Exit::BadStore,
            format!(
                "'{}' is a dead mount, and its store's journal '{}' cannot be opened ({e}): \
                 left as it is",
                mount_point.display(),
                layout.journal().display()
            ),
        )
    })?;
    let mut notes = Vec::new();
    crate::checkpoint::read_for_mount(&dir, &mut notes)?;
    Ok(())
}

/// How the binary a daemon runs stands to this one.
#[derive(Debug, PartialEq, Eq)]
pub enum Build {
    /// The very same bytes (a rebuild of the same source installed again
    /// is the same binary: an upgrade replaces the file, so paths and
    /// inodes say nothing).
    Same,
    /// Other bytes, in a file older than this one's: an upgrade.
    Older,
    /// Other bytes, in a file not older than this one's (a downgrade, or
    /// a second install): never restarted by this binary.
    NotOlder,
}

/// How the binary of the process `pid` stands to this one (its file's
/// mtime tells which is the newer build: `install` and `cargo build`
/// both stamp the file they write).
pub fn compare_build(pid: u32) -> io::Result<Build> {
    let theirs = PathBuf::from(format!("/proc/{pid}/exe"));
    let ours = Path::new("/proc/self/exe");
    if same_bytes(ours, &theirs)? {
        return Ok(Build::Same);
    }
    use std::os::unix::fs::MetadataExt;
    let mtime = |p: &Path| std::fs::metadata(p).map(|m| (m.mtime(), m.mtime_nsec()));
    Ok(if mtime(&theirs)? < mtime(ours)? {
        Build::Older
    } else {
        Build::NotOlder
    })
}

fn same_bytes(a: &Path, b: &Path) -> io::Result<bool> {
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let (ma, mb) = (fa.metadata()?, fb.metadata()?);
    use std::os::unix::fs::MetadataExt;
    if (ma.dev(), ma.ino()) == (mb.dev(), mb.ino()) {
        return Ok(true);
    }
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut fa, &mut ba)?;
        let m = read_full(&mut fb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_this_binary_and_a_changed_copy_is_another() {
        assert_eq!(
            compare_build(std::process::id()).expect("own exe readable"),
            Build::Same
        );
        let d = std::env::temp_dir().join(format!("skillfs-samebin-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch");
        let copy = d.join("copy");
        std::fs::copy("/proc/self/exe", &copy).expect("copy");
        assert!(same_bytes(Path::new("/proc/self/exe"), &copy).expect("compare"));
        let mut bytes = std::fs::read(&copy).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&copy, &bytes).expect("write");
        assert!(!same_bytes(Path::new("/proc/self/exe"), &copy).expect("compare"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
