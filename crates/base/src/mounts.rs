//! The mount table, read from `/proc/self/mountinfo`, and the detaching
//! unmount: what the daemon, the FUSE adapter and the command line all
//! need to know about mounts, below each of them.
//!
//! Invariants: an unreadable mountinfo or a line it cannot parse is no
//! mount (nothing here fails); names come unescaped, byte for byte. A
//! skillfs mount is told by its source (`skillfs:<store>`), never by its
//! mount point alone.
//!
//! Locks: none.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Our mounts are told apart by their source, `skillfs:<store dir>` (the
/// fs type is `fuse` or `fuse.skillfs` depending on how it was mounted).
pub const SOURCE_PREFIX: &str = "skillfs:";

/// One line of `/proc/self/mountinfo`: mount point, fs type, source.
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: PathBuf,
}

fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

pub fn mounts() -> Vec<MountInfo> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < sep + 3 || fields.len() < 5 {
            continue;
        }
        out.push(MountInfo {
            mount_point: PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(
                &unescape_mountinfo(fields[4]),
            ))),
            fstype: fields[sep + 1].to_string(),
            source: PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(
                &unescape_mountinfo(fields[sep + 2]),
            ))),
        });
    }
    out
}

/// The mount at exactly `root`, the last one if several are stacked.
pub fn mount_at(root: &Path) -> Option<MountInfo> {
    mounts().into_iter().rfind(|m| m.mount_point == root)
}

impl MountInfo {
    /// The store of a skillfs mount; `None` for any other mount.
    pub fn skillfs_store(&self) -> Option<PathBuf> {
        let s = self
            .source
            .as_os_str()
            .as_bytes()
            .strip_prefix(SOURCE_PREFIX.as_bytes())?;
        self.fstype
            .starts_with("fuse")
            .then(|| PathBuf::from(std::ffi::OsStr::from_bytes(s)))
    }
}

/// Detaches the mount at `root` now; the daemon keeps serving files still
/// open and exits when the last one is closed.
pub fn lazy_unmount(root: &Path) -> io::Result<()> {
    if crate::process::geteuid() == 0 {
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
