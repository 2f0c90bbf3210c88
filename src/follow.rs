//! What a symlink leads to, as the hide rules see it.
//!
//! The agent's loader walks with `os.walk(followlinks=True)`: through a
//! symlink it reads what the link leads to. So the rules judge a symlink
//! by its target, not by its own kind: a link named like a park
//! (`foo.bak -> real-dir`) is hidden as the directory it leads to would be,
//! and a link that leads to a hidden entry (`shortcut -> foo.bak`, or into
//! one) is hidden itself, so no park is reachable from a listing.
//!
//! Owns: resolving a link's target inside the versioned root, through the
//! daemon's own directory fds (the root's and `parked/`'s), never through
//! the mount: a relative target from the link's directory, an absolute one
//! only if it names a path under the root (by the root's own path); `..`
//! above the root, an absolute path elsewhere, a loop or a missing name end
//! the walk with nothing known, and the link is judged as a symlink, by its
//! name, as before.
//!
//! Invariant: no system call here reaches a FUSE mount (every path is
//! relative to a held fd below the root or in the store), so it may run
//! under the namespace lock without asking the daemon anything.
//! Locks: none of its own.

use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;

use crate::hide::HideRules;
use crate::relpath::RelPath;
use crate::scan::kind_of;
use crate::store::journal::Kind;
use crate::sys;

/// The kernel's own limit on links followed in one path walk.
const MAX_LINKS: usize = 40;

/// How the rules see a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// As the kind of the entry it leads to (`Symlink` when that is not
    /// known: dangling, outside the root, a loop).
    As(Kind),
    /// It leads to, or through, a hidden entry.
    Hidden,
}

/// How the rules see the symlink with `target` in visible directory `dir`
/// (relative to the root at `root_fd`; hidden entries attached in
/// `parked_fd`).
pub fn seen(
    root_fd: RawFd,
    parked_fd: RawFd,
    rules: &HideRules,
    dir: &RelPath,
    name: &[u8],
    target: &[u8],
) -> Seen {
    // The link's own path: a walk back to it is a loop, whichever place
    // (inside or attached) it has while it is being judged.
    let own = dir.join(name);
    let mut at: Vec<Vec<u8>> = dir.components().map(<[u8]>::to_vec).collect();
    let mut todo: Vec<Vec<u8>> = Vec::new();
    if !push_target(root_fd, &mut at, &mut todo, target) {
        return Seen::As(Kind::Symlink);
    }
    let mut links = 0;
    // `todo` holds the components still to walk, the next one last.
    while let Some(name) = todo.pop() {
        match name.as_slice() {
            b"" | b"." => continue,
            b".." => {
                if at.pop().is_none() {
                    return Seen::As(Kind::Symlink); // above the root
                }
                continue;
            }
            _ => {}
        }
        let here = at.join(&b'/');
        let path = if here.is_empty() {
            name.clone()
        } else {
            [here.as_slice(), b"/", &name].concat()
        };
        if path == own.as_bytes() {
            return Seen::As(Kind::Symlink);
        }
        let st = match sys::lstatat(root_fd, &path) {
            Ok(st) => st,
            Err(_) => {
                // Not inside: attached to its directory (hidden), or missing.
                let attached = sys::dir_key(root_fd, &here).is_ok_and(|key| {
                    sys::lstatat(parked_fd, &[key.as_bytes(), b"/", &name].concat()).is_ok()
                });
                return if attached {
                    Seen::Hidden
                } else {
                    Seen::As(Kind::Symlink)
                };
            }
        };
        // An entry the rules hide is hidden wherever it is yet (a settle
        // may not have come to it): the answer does not depend on the
        // order in which a walk places the entries.
        if let Some(k) = kind_of(&st).filter(|k| *k != Kind::Symlink)
            && rules.is_hidden(&name, k, at.is_empty(), &mut || in_skill(root_fd, &at))
        {
            return Seen::Hidden;
        }
        match kind_of(&st) {
            Some(Kind::Symlink) => {
                links += 1;
                let Ok(t) = sys::readlinkat(root_fd, &path) else {
                    return Seen::As(Kind::Symlink);
                };
                if links > MAX_LINKS || !push_target(root_fd, &mut at, &mut todo, &t) {
                    return Seen::As(Kind::Symlink);
                }
            }
            Some(Kind::Dir) => at.push(name),
            Some(k) if todo.iter().all(|c| c.is_empty() || c == b".") => return Seen::As(k),
            _ => return Seen::As(Kind::Symlink), // a file in the middle of a path
        }
    }
    Seen::As(Kind::Dir)
}

/// Whether the directory at `at` (components from the root) or one of
/// its ancestors is a skill package (holds a `SKILL.md`).
fn in_skill(root_fd: RawFd, at: &[Vec<u8>]) -> bool {
    (0..=at.len()).any(|n| {
        let dir = at[..n].join(&b'/');
        let p = if dir.is_empty() {
            b"SKILL.md".to_vec()
        } else {
            [dir.as_slice(), b"/SKILL.md"].concat()
        };
        sys::lstatat(root_fd, &p).is_ok()
    })
}

/// Queues the components of `target` to walk from `at` (moved to the
/// root for an absolute target under the root's own path). False for an
/// absolute target elsewhere.
fn push_target(
    root_fd: RawFd,
    at: &mut Vec<Vec<u8>>,
    todo: &mut Vec<Vec<u8>>,
    target: &[u8],
) -> bool {
    let rel = if target.starts_with(b"/") {
        let Ok(root) = std::fs::read_link(format!("/proc/self/fd/{root_fd}")) else {
            return false;
        };
        let root = root.as_os_str().as_bytes();
        let Some(rest) = target.strip_prefix(root) else {
            return false;
        };
        if !(rest.is_empty() || rest.starts_with(b"/")) {
            return false; // a sibling whose name starts like the root's
        }
        at.clear();
        rest
    } else {
        target
    };
    todo.extend(rel.split(|&b| b == b'/').rev().map(<[u8]>::to_vec));
    true
}

/// Whether the rules hide an entry `name` of `kind` in visible directory
/// `dir`; a symlink (its `target`) is judged by where it leads (see the
/// module doc). `hidden` is the rules' own answer for a given kind.
/// (Eight plain values: the daemon's and the settle's callers hold them
/// in different places.)
#[allow(clippy::too_many_arguments)]
pub fn hides(
    root_fd: RawFd,
    parked_fd: RawFd,
    rules: &HideRules,
    dir: &RelPath,
    name: &[u8],
    kind: Kind,
    target: Option<&[u8]>,
    hidden: &mut dyn FnMut(Kind) -> bool,
) -> bool {
    match (kind, target) {
        (Kind::Symlink, Some(t)) => match seen(root_fd, parked_fd, rules, dir, name, t) {
            Seen::Hidden => true,
            Seen::As(k) => hidden(k) || (k != Kind::Symlink && hidden(Kind::Symlink)),
        },
        _ => hidden(kind),
    }
}
