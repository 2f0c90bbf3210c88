//! Unmounting: `skillfs umount` asks the daemon to finish and waits for
//! it; `lazy_unmount` detaches a mount now.
//!
//! Invariants: only a pid proven to be the store's daemon is signalled
//! (`StoreLock::daemon`; the pid in `LOCK` alone proves nothing), otherwise
//! the mount is detached and the daemon ends once it is released; with a
//! daemon running, `umount` returns once the store's lock is free, or
//! fails after its timeout.
//!
//! Locks: none taken; the store's flock is only tested (`StoreLock::
//! is_held`).

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::checks::absolute_root;
use super::mountinfo::mount_at;
use crate::error::{Exit, Failure};
use crate::store::{Layout, StoreLock};

/// Detaches the mount at `root` now; the daemon keeps serving files still
/// open and exits when the last one is closed.
pub fn lazy_unmount(root: &Path) -> io::Result<()> {
    if crate::sys::geteuid() == 0 {
        let c = std::ffi::CString::new(root.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c` is a NUL-terminated string that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(e);
        }
    }
    for bin in ["fusermount3", "fusermount"] {
        match Command::new(bin)
            .arg("-u")
            .arg("-z")
            .arg("--")
            .arg(root)
            .output()
        {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                return Err(io::Error::other(
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ));
            }
            Err(_) => continue,
        }
    }
    Err(io::Error::other(
        "fusermount3 not found (install the fuse3 package)",
    ))
}

/// Runs `skillfs umount ROOT`: asks the daemon to finish and waits for it.
pub fn umount(root: &Path, timeout: Duration) -> Result<String, Failure> {
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
    if StoreLock::is_held(&layout) {
        // Signal only a pid proven to be this store's daemon (`LOCK`
        // is a file: its pid alone proves nothing). Otherwise detach:
        // the daemon ends once its mount is released, as after a
        // signal.
        match StoreLock::daemon(&layout) {
            // SAFETY: kill takes plain integers; `proven` is the pid proven to hold this
            // store's lock (`StoreLock::daemon`).
            Some(proven) => unsafe {
                libc::kill(proven as i32, libc::SIGTERM);
            },
            None => {
                tracing::warn!(
                    "the pid in the lock of '{}' is not proven to be its daemon: detaching the mount without signalling",
                    root.display()
                );
                lazy_unmount(&root).map_err(|e| {
                    Failure::new(
                        Exit::Internal,
                        format!("could not unmount '{}': {e}", root.display()),
                    )
                })?;
            }
        }
        let deadline = Instant::now() + timeout;
        while StoreLock::is_held(&layout) {
            if Instant::now() > deadline {
                return Err(Failure::new(
                    Exit::Internal,
                    format!(
                        "the daemon of '{}' did not finish within {timeout:?}; files may still be open",
                        root.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The daemon detached the mount itself; a stacked mount left by
        // a failure is detached here too.
        if mount_at(&root).is_some_and(|m| m.skillfs_store().is_some()) {
            let _ = lazy_unmount(&root);
        }
        Ok(format!("unmounted {}", root.display()))
    } else {
        lazy_unmount(&root).map_err(|e| {
            Failure::new(
                Exit::Internal,
                format!("could not unmount '{}': {e}", root.display()),
            )
        })?;
        Ok(format!(
            "the daemon of {} was not running; detached its stale mount",
            root.display()
        ))
    }
}
