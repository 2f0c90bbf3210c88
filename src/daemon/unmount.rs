//! Unmounting: `skillfs umount` unmounts a quiet mount and waits for its
//! daemon to finish (`skillfs_base::mounts::lazy_unmount` detaches one now).
//!
//! Invariants: a mount whose daemon is alive is unmounted only when
//! nothing is inside it (`unmount_if_quiet`: the kernel's EBUSY decides,
//! atomically), so no write under ROOT ever reaches the plain directory
//! while a process still works in it; the one exception is `--lazy`,
//! asked for by name. No process is signalled: the end of the FUSE
//! session is what ends the daemon. A dead mount (no daemon holds the
//! store) is detached, since it lets nothing through. With a daemon
//! running, `umount` returns once the store's lock is free, or fails
//! after its timeout.
//!
//! Locks: none taken; the store's flock is only tested (`StoreLock::
//! is_held`).

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::checks::absolute_root;
use super::holders::{self, Busy};
use super::mountinfo::mount_at;
use crate::error::{Exit, Failure};
use crate::store::{Layout, LockState, StoreLock};
use skillfs_base::mounts::lazy_unmount;

/// How long a busy mount with no holder to show is tried again.
const PASSING: Duration = Duration::from_secs(2);

/// What an unmount that waits for a quiet mount found.
pub enum Quiet {
    /// The mount is gone: the kernel ends the daemon's session.
    Unmounted,
    /// Processes (or mounts) inside: nothing was changed.
    Busy(Busy),
}

/// Unmounts `root` only if nothing is inside it (`umount(8)` without
/// `-l`): the kernel refuses a busy mount with EBUSY atomically, so a
/// mount that is in use is never detached and stays versioned. `daemon`:
/// the mount's daemon, never named as a holder.
pub fn unmount_if_quiet(root: &Path, daemon: Option<u32>) -> io::Result<Quiet> {
    let busy = || Ok(Quiet::Busy(holders::busy(root, daemon)));
    // The kernel's EBUSY counts this mount and the copies an unmount
    // propagates to, not a bind mount or a private copy in another mount
    // namespace: through those the daemon would serve on while writes by
    // path here went to the plain directory.
    if !holders::elsewhere(root).is_empty() {
        return busy();
    }
    if crate::process::geteuid() == 0 {
        let c = std::ffi::CString::new(root.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c` is a NUL-terminated string that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(Quiet::Unmounted);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EBUSY) => return busy(),
            Some(libc::EPERM) => {}
            _ => return Err(e),
        }
    }
    let mut last = None;
    for bin in ["fusermount3", "fusermount"] {
        // (In the C locale: its "Device or resource busy" is matched.)
        match Command::new(bin)
            .arg("-u")
            .arg("--")
            .arg(root)
            .env("LC_ALL", "C")
            .output()
        {
            Ok(out) if out.status.success() => return Ok(Quiet::Unmounted),
            Ok(out) => {
                let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
                if err.contains("busy") {
                    return busy();
                }
                return Err(io::Error::other(err));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
            Err(e) => return Err(io::Error::other(format!("could not run {bin}: {e}"))),
        }
    }
    Err(io::Error::other(format!(
        "fusermount3 not found (install the fuse3 package): {}",
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

/// [`unmount_if_quiet`], for a command: a busy mount that no process
/// shows is tried again for a moment (a passing reference: a child forked
/// by a process with a file open there holds a copy until its exec closes
/// it) before it is called busy.
pub fn unmount_once_quiet(root: &Path, daemon: Option<u32>) -> io::Result<Quiet> {
    let deadline = Instant::now() + PASSING;
    loop {
        match unmount_if_quiet(root, daemon)? {
            Quiet::Busy(busy) if busy.is_empty() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            q => return Ok(q),
        }
    }
}

/// The line a refused unmount ends with.
pub fn busy_failure(root: &Path, busy: &Busy) -> Failure {
    Failure::new(
        Exit::Busy,
        format!(
            "'{root}' is busy: held by {}; nothing was changed (it stays mounted and versioned): \
             close those files or leave the directory and run this again, or detach it now \
             with `skillfs umount --lazy {word}` (then new writes go to the plain directory, \
             unversioned until the next mount)",
            busy.describe(8),
            root = root.display(),
            word = crate::error::shell_word(root)
        ),
    )
}

/// Runs `skillfs umount ROOT`: unmounts it once nothing is inside (the
/// daemon then publishes, syncs and exits) and waits for the daemon to
/// finish; a busy mount is refused and left as it was. `lazy` detaches at
/// once instead, as `umount -l` does.
pub fn umount(root: &Path, timeout: Duration, lazy: bool) -> Result<String, Failure> {
    let mut root = absolute_root(root)?;
    // The versioned root of a mount over a home: that mount.
    if mount_at(&root).is_none()
        && let Some(m) = super::mountinfo::mount_serving(&root)
    {
        root = m.mount_point;
    }
    let Some(m) = mount_at(&root) else {
        return Err(Failure::new(
            Exit::BadRoot,
            format!("'{}' is not mounted", root.display()),
        ));
    };
    let Some(store) = m.skillfs_store() else {
        return Err(Failure::new(
            Exit::BadRoot,
            format!("'{}' is a {} mount, not skillfs", root.display(), m.fstype),
        ));
    };
    let layout = Layout::new(store);
    let detach = |root: &Path| {
        lazy_unmount(root).map_err(|e| {
            Failure::new(
                Exit::Internal,
                format!("could not unmount '{}': {e}", root.display()),
            )
        })
    };
    let daemon = match StoreLock::state(&layout) {
        LockState::Free => {
            // A dead mount serves nothing (every access fails with
            // ENOTCONN): detaching it lets nothing through that was
            // versioned before. (Only a lock taken proves it dead.)
            detach(&root)?;
            return Ok(format!(
                "the daemon of {} was not running; detached its stale mount",
                root.display()
            ));
        }
        LockState::Held(pid) => pid,
        // Alive or not, the quiet unmount below is safe either way.
        LockState::Unknown(_) => None,
    };
    if lazy {
        let busy = holders::busy(&root, daemon);
        detach(&root)?;
        if !busy.is_empty() {
            return Ok(format!(
                "detached {root}; its daemon serves what is still open there (held by {}) and \
                 ends when they are closed; until the next mount, new writes under {root} go to \
                 the plain directory, unversioned (the next mount's scan records their final \
                 state)",
                busy.describe(8),
                root = root.display()
            ));
        }
    } else {
        match unmount_once_quiet(&root, daemon) {
            Ok(Quiet::Unmounted) => {}
            Ok(Quiet::Busy(busy)) => return Err(busy_failure(&root, &busy)),
            Err(e) => {
                return Err(Failure::new(
                    Exit::Internal,
                    format!("could not unmount '{}': {e}", root.display()),
                ));
            }
        }
    }
    // The session has ended: the daemon publishes, syncs and lets go of
    // the store's lock.
    if !released(&layout, timeout) {
        return Err(Failure::new(
            Exit::Internal,
            format!(
                "'{}' is unmounted, but its daemon did not finish within {timeout:?} \
                 (see daemon.log in '{}')",
                root.display(),
                layout.dir.display()
            ),
        ));
    }
    // A dead mount of this store left stacked below by a failure is
    // detached too (nothing serves it).
    if mount_at(&root).is_some_and(|m| m.source == mount_source(&layout))
        && matches!(StoreLock::state(&layout), LockState::Free)
    {
        let _ = lazy_unmount(&root);
    }
    Ok(format!("unmounted {}", root.display()))
}

/// Waits up to `timeout` for the store's daemon to let go of its lock
/// (its session ended, it has published and synced); whether it did.
pub(super) fn released(layout: &Layout, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while StoreLock::is_held(layout) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// How long a mount waits for the daemon of its store to finish after a
/// plain unmount.
const UNMOUNTED_FINISH: Duration = Duration::from_secs(10);

/// A daemon whose mount is gone from this namespace while it still holds
/// the store is finishing a plain unmount (`umount DIR`, `fusermount3 -u`
/// return before it has published and synced): wait up to
/// [`UNMOUNTED_FINISH`] for it to let go, so that `umount DIR; mount DIR`
/// mounts. A daemon still serving elsewhere (a lazily detached mount with
/// files open, another mount namespace) holds on, and the mount is then
/// refused as before.
pub(super) fn await_unmounted_daemon(layout: &Layout) {
    let source = mount_source(layout);
    if StoreLock::is_held(layout)
        && !super::mountinfo::mounts()
            .iter()
            .any(|m| m.source == source)
    {
        released(layout, UNMOUNTED_FINISH);
    }
}

fn mount_source(layout: &Layout) -> PathBuf {
    PathBuf::from(format!(
        "{}{}",
        super::mountinfo::SOURCE_PREFIX,
        layout.dir.display()
    ))
}
