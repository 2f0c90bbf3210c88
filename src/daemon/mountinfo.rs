//! Which mounts there are, read from `/proc/self/mountinfo`, and which of
//! them are skillfs's (their source names the store).
//!
//! Invariants: an unreadable mountinfo or a line it cannot parse is no
//! mount (nothing here fails); names come unescaped, byte for byte.
//!
//! Locks: none.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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

/// The mount serving the versioned root `root`: a mount over it, or over
/// its parent (a home), whose store versions `root` (a mount over a home
/// serves its versioned directory, not the home itself).
pub fn mount_serving(root: &Path) -> Option<MountInfo> {
    for at in [Some(root), root.parent()].into_iter().flatten() {
        let Some(m) = mount_at(at) else { continue };
        let Some(store) = m.skillfs_store() else {
            continue;
        };
        match crate::store::RootId::read(&crate::store::Layout::new(store)) {
            Some(id) if id.path == root => return Some(m),
            // A store from before its `ROOT` file: a mount over `root` itself.
            None if at == root => return Some(m),
            _ => {}
        }
    }
    None
}

/// The versioned directory a command given `root` means: `root` itself,
/// or, where `root` is a home mounted (or last mounted) with its one
/// versioned directory, that directory.
pub fn versioned_root_of(root: &Path) -> PathBuf {
    let store = mount_at(root)
        .and_then(|m| m.skillfs_store())
        .or_else(|| crate::store::Layout::default_dir(root).filter(|d| crate::store::is_store(d)));
    if let Some(s) = store
        && let Some(id) = crate::store::RootId::read(&crate::store::Layout::new(s))
        && id.path.parent() == Some(root)
    {
        return id.path;
    }
    root.to_path_buf()
}
