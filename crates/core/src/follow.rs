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
//! the mount. Outside the root (`..` above it, an absolute target) the walk
//! is lexical and comes back in where it reaches the root's own path
//! (`../skills/x`, `/home/u/.hermes//skills/x`). A path that stays outside
//! is then looked at where it leads (`outside`): each component lstat'ed
//! from `/`, the symlinks there resolved by hand, so the link is judged as
//! the directory or file it leads to (`lnk.rollback-broken -> /elsewhere`
//! is hidden as that directory would be). That walk never reaches the
//! mount: a path that comes to the mount point (or the root's own path) is
//! not looked into, and the link is judged by its name as a symlink (the
//! daemon must not ask itself; what lies there is the mount's own tree,
//! which a lexical walk back into the root already judges). Missing, a
//! loop, or a walk past `MAX_STEPS` components leaves the link judged by
//! its name as a symlink too. A missing name is judged by the rules as it would be once made
//! (a link to `later.bak` is hidden), and `.history` hides the link.
//!
//! Invariant: no system call here reaches this daemon's mount (every path
//! is relative to a held fd below the root or in the store, or, outside
//! the root, a path with no symlink in it that is not the mount point
//! [`never_touch`] names, nor below it), so it may run under the namespace
//! lock without asking the daemon anything.
//! Locks: none of its own.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use crate::hide::HideRules;
use crate::scan::kind_of;
use skillfs_base::relpath::RelPath;
use skillfs_base::sys;
use skillfs_store::journal::Kind;

/// The kernel's own limit on links followed in one path walk.
const MAX_LINKS: usize = 40;
/// Components walked at most (the kernel's path limit is 4096 bytes, but
/// links multiply it): past this the link is judged by its name.
const MAX_STEPS: usize = 4096;
/// The history tree's name (see `fs::history_view`).
const HISTORY: &[u8] = b".history";

/// The mount point of this process's mount (canonical components): a walk
/// outside the root never looks into it.
static MOUNT_POINT: OnceLock<Vec<Vec<u8>>> = OnceLock::new();

/// Names the daemon's mount point, before anything judges a link: a link
/// leading outside the root is then never followed into it. (A process
/// that serves no mount names none, and may look anywhere.)
pub fn never_touch(mount_point: &Path) {
    let p = mount_point
        .canonicalize()
        .unwrap_or_else(|_| mount_point.to_path_buf());
    let _ = MOUNT_POINT.set(split(p.as_os_str().as_bytes()));
}

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
    root_fd: BorrowedFd<'_>,
    parked_fd: BorrowedFd<'_>,
    rules: &HideRules,
    dir: &RelPath,
    name: &[u8],
    target: &[u8],
) -> Seen {
    // The link's own path: a walk back to it is a loop, whichever place
    // (inside or attached) it has while it is being judged.
    let own = dir.join(name);
    // The root's own absolute path (as the daemon opened it), for targets
    // that leave it and come back (`../skills/x`, `/home/u/.hermes/skills/x`).
    let root_abs: Vec<Vec<u8>> =
        std::fs::read_link(format!("/proc/self/fd/{}", root_fd.as_raw_fd()))
            .map(|p| split(p.as_os_str().as_bytes()))
            .unwrap_or_default();
    let mut pos = Pos::Inside(dir.components().map(<[u8]>::to_vec).collect());
    let mut todo: Vec<Vec<u8>> = Vec::new();
    queue(&mut todo, &mut pos, target);
    let (mut links, mut steps) = (0, 0);
    // `todo` holds the components still to walk, the next one last.
    while let Some(name) = todo.pop() {
        steps += 1;
        if steps > MAX_STEPS {
            return Seen::As(Kind::Symlink);
        }
        if name.is_empty() || name == b"." {
            continue;
        }
        let at = match &mut pos {
            // Outside the root: a lexical walk (nothing outside is read),
            // which enters the root again where it reaches the root's path.
            Pos::Outside(abs) => {
                if name == b".." {
                    abs.pop();
                } else {
                    abs.push(name);
                }
                if !root_abs.is_empty() && *abs == root_abs {
                    pos = Pos::Inside(Vec::new());
                }
                continue;
            }
            Pos::Inside(at) => at,
        };
        if name == b".." {
            if at.pop().is_none() {
                if root_abs.is_empty() {
                    return Seen::As(Kind::Symlink);
                }
                pos = Pos::Outside(root_abs[..root_abs.len() - 1].to_vec());
            }
            continue;
        }
        // `.history` is the history tree: every version of every skill.
        if name == HISTORY {
            return Seen::Hidden;
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
        let in_root = at.is_empty();
        let st = match sys::lstatat(root_fd, &path) {
            Ok(st) => st,
            Err(_) => {
                // Not inside: attached to its directory (hidden), or
                // missing, then judged by the name it would have: a link
                // to a park's name is a park to be.
                let attached = sys::dir_key(root_fd, &here).is_ok_and(|key| {
                    sys::lstatat(parked_fd, &[key.as_bytes(), b"/", &name].concat()).is_ok()
                });
                let inside = || in_skill(root_fd, at);
                let named = |k| rules.is_hidden(&name, k, in_root, &mut { inside });
                return if attached || named(Kind::Dir) || named(Kind::File) {
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
            && rules.is_hidden(&name, k, in_root, &mut || in_skill(root_fd, at))
        {
            return Seen::Hidden;
        }
        match kind_of(&st) {
            Some(Kind::Symlink) => {
                links += 1;
                let Ok(t) = sys::readlinkat(root_fd, &path) else {
                    return Seen::As(Kind::Symlink);
                };
                if links > MAX_LINKS {
                    return Seen::As(Kind::Symlink);
                }
                queue(&mut todo, &mut pos, &t);
            }
            Some(Kind::Dir) => at.push(name),
            Some(k) if todo.iter().all(|c| c.is_empty() || c == b".") => return Seen::As(k),
            _ => return Seen::As(Kind::Symlink), // a file in the middle of a path
        }
    }
    match pos {
        Pos::Inside(_) => Seen::As(Kind::Dir),
        Pos::Outside(abs) => Seen::As(outside(abs, &root_abs, links)),
    }
}

/// The kind of what the absolute path `abs` (outside the root) leads to,
/// `links` links followed already: each component lstat'ed from `/`, each
/// symlink resolved by hand, so that every path looked at has no symlink
/// in it and can be compared with the mount point. `Symlink` when it is
/// missing, a loop, or reaches the mount point or the root (never looked
/// into: see the module doc).
fn outside(abs: Vec<Vec<u8>>, root_abs: &[Vec<u8>], mut links: usize) -> Kind {
    let fence = |at: &[Vec<u8>]| {
        MOUNT_POINT.get().is_some_and(|mp| at.starts_with(mp))
            || (!root_abs.is_empty() && at.starts_with(root_abs))
    };
    let mut at: Vec<Vec<u8>> = Vec::new();
    let mut todo: Vec<Vec<u8>> = abs.into_iter().rev().collect();
    let mut steps = 0;
    let mut kind = Kind::Dir; // `/`
    while let Some(name) = todo.pop() {
        steps += 1;
        if steps > MAX_STEPS {
            return Kind::Symlink;
        }
        if name.is_empty() || name == b"." {
            continue;
        }
        if kind != Kind::Dir {
            return Kind::Symlink; // a file in the middle of a path
        }
        if name == b".." {
            at.pop();
            continue;
        }
        at.push(name);
        if fence(&at) {
            return Kind::Symlink;
        }
        let path = [b"/".as_slice(), &at.join(&b'/')].concat();
        let Ok(st) = sys::lstatat(sys::CWD, &path) else {
            return Kind::Symlink;
        };
        match kind_of(&st) {
            Some(Kind::Symlink) => {
                links += 1;
                let Ok(t) = sys::readlinkat(sys::CWD, &path) else {
                    return Kind::Symlink;
                };
                if links > MAX_LINKS {
                    return Kind::Symlink;
                }
                at.pop();
                if t.starts_with(b"/") {
                    at.clear();
                }
                todo.extend(t.split(|&b| b == b'/').rev().map(<[u8]>::to_vec));
                kind = Kind::Dir;
            }
            Some(k) => kind = k,
            None => return Kind::Symlink,
        }
    }
    kind
}

/// Where a walk is: inside the root (components from it), or outside it
/// (absolute components, walked lexically).
enum Pos {
    Inside(Vec<Vec<u8>>),
    Outside(Vec<Vec<u8>>),
}

/// A path's components (empty ones dropped).
fn split(p: &[u8]) -> Vec<Vec<u8>> {
    p.split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// Queues the components of `target` to walk next; an absolute one starts
/// from `/`, outside the root.
fn queue(todo: &mut Vec<Vec<u8>>, pos: &mut Pos, target: &[u8]) {
    if target.starts_with(b"/") {
        *pos = Pos::Outside(Vec::new());
    }
    todo.extend(target.split(|&b| b == b'/').rev().map(<[u8]>::to_vec));
}

/// Whether the directory at `at` (components from the root) or one of
/// its ancestors is a skill package (holds a `SKILL.md`).
fn in_skill(root_fd: BorrowedFd<'_>, at: &[Vec<u8>]) -> bool {
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

/// Whether the rules hide an entry `name` of `kind` in visible directory
/// `dir`; a symlink (its `target`) is judged by where it leads (see the
/// module doc). `hidden` is the rules' own answer for a given kind.
/// (Eight plain values: the daemon's and the settle's callers hold them
/// in different places.)
#[allow(clippy::too_many_arguments)]
pub fn hides(
    root_fd: BorrowedFd<'_>,
    parked_fd: BorrowedFd<'_>,
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
