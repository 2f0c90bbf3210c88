//! Which ROOT and store a command means, and what a user's PATH names in
//! it. Found as git finds its repository: from a PATH argument, else the
//! current directory, inside a skillfs mount (`/proc/self/mountinfo` names
//! its store, the store's `ROOT` file its versioned directory); else
//! `--root`; else `$HERMES_HOME/skills` or `~/.hermes/skills`.
//!
//! Invariants: nothing here writes; ROOT itself is never resolved through
//! the filesystem (a dead mount answers ENOTCONN), only its parent; a
//! PATH is made absolute lexically (it may name an entry removed since, of
//! which only history knows).
//!
//! Locks: none.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::daemon::{self, MountInfo};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::{Layout, RootId};

/// `--root` and `--store`, taken by every command that reads or writes a
/// store.
#[derive(clap::Args, Clone, Default)]
pub struct Where {
    /// The versioned directory, or the home mounted over it [default: the
    /// mount holding PATH or the current directory, else
    /// $HERMES_HOME/skills, else ~/.hermes/skills].
    #[arg(long, value_name = "ROOT")]
    pub root: Option<PathBuf>,
    /// The store, when it is not the one of ROOT's mount or ROOT's default.
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

/// A command's ROOT, its store and the mount serving it.
pub struct Target {
    /// The versioned directory.
    pub root: PathBuf,
    pub layout: Layout,
    /// The mount serving ROOT (over it or over its home), live or dead.
    pub mount: Option<MountInfo>,
    /// Where a relative PATH counts from: the current directory when it
    /// lies inside ROOT or its mount (as in every Unix tool), else ROOT
    /// (`skillfs log cat/foo` from anywhere).
    base: PathBuf,
    /// The current directory, if it has one.
    cwd: Option<PathBuf>,
}

/// `p` joined to `base` and rid of `.` and `..` without touching the
/// filesystem.
fn lexical(base: &Path, p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    };
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The same place with its existing part canonical (symlinks resolved),
/// for a path given through a symlink to the mount.
fn canonical(p: &Path) -> Option<PathBuf> {
    let mut cur = p.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = cur.canonicalize() {
            return Some(rest.iter().rev().fold(c, |acc: PathBuf, n| acc.join(n)));
        }
        rest.push(cur.file_name()?.to_os_string());
        cur = cur.parent()?.to_path_buf();
    }
}

/// The versioned directory of a skillfs mount: the one its store's `ROOT`
/// names when that lies in the mount (a home mounted with `--versioned`),
/// else the mount point.
fn versioned_dir(m: &MountInfo) -> Option<PathBuf> {
    let store = m.skillfs_store()?;
    Some(match RootId::read(&Layout::new(store)) {
        Some(id) if id.path.starts_with(&m.mount_point) => id.path,
        _ => m.mount_point.clone(),
    })
}

/// The innermost skillfs mount holding `p`.
fn mount_holding(p: &Path) -> Option<MountInfo> {
    daemon::mounts()
        .into_iter()
        .filter(|m| m.skillfs_store().is_some() && p.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
}

/// `$HERMES_HOME/skills`, else `~/.hermes/skills`.
pub fn default_root() -> Result<PathBuf, Failure> {
    if let Some(h) = std::env::var_os("HERMES_HOME") {
        return Ok(PathBuf::from(h).join("skills"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".hermes").join("skills")),
        None => Err(Failure::new(
            Exit::Usage,
            "neither HERMES_HOME nor HOME is set; pass --root",
        )),
    }
}

/// The ROOT, store and mount `w` and `path` (a PATH argument, if any) mean.
pub fn locate(w: &Where, path: Option<&Path>) -> Result<Target, Failure> {
    let cwd = std::env::current_dir().ok();
    let here = cwd.clone().unwrap_or_else(|| PathBuf::from("/"));
    let (root, mount) = match &w.root {
        Some(r) => {
            let root = daemon::versioned_root_of(&daemon::absolute_root(r)?);
            (root.clone(), daemon::mount_serving(&root))
        }
        None => {
            // PATH first (`skillfs log ~/.hermes/skills/cat/foo` from
            // anywhere), then the current directory.
            let found = path
                .map(|p| lexical(&here, p))
                .into_iter()
                .chain(cwd.clone())
                .flat_map(|p| [Some(p.clone()), canonical(&p)])
                .flatten()
                .find_map(|p| mount_holding(&p));
            match found.and_then(|m| versioned_dir(&m).map(|r| (r, m))) {
                Some((root, m)) => (root, Some(m)),
                None => {
                    // The root a given store names, else the default one
                    // (a missing one is said by the store check below).
                    let named = w.store.as_ref().and_then(|s| {
                        RootId::read(&Layout::new(
                            daemon::store_dir(Path::new("/"), Some(s)).ok()?,
                        ))
                    });
                    let root = match named {
                        Some(id) => id.path,
                        None => {
                            let d = default_root()?;
                            daemon::versioned_root_of(&daemon::absolute_root(&d).unwrap_or(d))
                        }
                    };
                    (root.clone(), daemon::mount_serving(&root))
                }
            }
        }
    };
    let layout = match (&w.store, &mount) {
        (Some(s), _) => {
            let dir = daemon::store_dir(&root, Some(s))?;
            if !dir.is_dir() {
                return Err(Failure::new(
                    Exit::BadStore,
                    format!("store '{}' does not exist", dir.display()),
                ));
            }
            Layout::new(dir)
        }
        (None, Some(m)) => Layout::new(m.skillfs_store().unwrap_or_default()),
        (None, None) => {
            let layout = Layout::new(daemon::default_store_of(&root)?);
            if !layout.journal().is_dir() {
                return Err(Failure::new(
                    Exit::BadStore,
                    format!(
                        "'{}' is not mounted and has no store at '{}': mount it first \
                         (`skillfs mount`), or give --root or --store",
                        root.display(),
                        layout.dir.display()
                    ),
                ));
            }
            layout
        }
    };
    let inside = |c: &PathBuf| {
        c.starts_with(&root)
            || mount
                .as_ref()
                .is_some_and(|m| c.starts_with(&m.mount_point))
    };
    let base = cwd.clone().filter(inside).unwrap_or_else(|| root.clone());
    Ok(Target {
        root,
        layout,
        mount,
        base,
        cwd,
    })
}

impl Target {
    /// A user's PATH as a path relative to ROOT: relative to the current
    /// directory inside the mount, else to ROOT; absolute inside ROOT.
    pub fn rel(&self, p: &Path) -> Result<RelPath, Failure> {
        let abs = lexical(&self.base, p);
        let inside = |a: &Path| a.strip_prefix(&self.root).ok().map(Path::to_path_buf);
        // From a home around ROOT, a path not inside ROOT counts from ROOT
        // (`cd ~/.hermes && skillfs log cat/foo` as well as `skills/cat/foo`).
        let rel = inside(&abs)
            .or_else(|| canonical(&abs).and_then(|c| inside(&c)))
            .or_else(|| {
                (!p.is_absolute() && !self.base.starts_with(&self.root))
                    .then(|| inside(&lexical(&self.root, p)))
                    .flatten()
            })
            .ok_or_else(|| {
                Failure::new(
                    Exit::Usage,
                    format!(
                        "'{}' is not inside the versioned directory '{}': give a path \
                         under it, or --root for another versioned directory",
                        abs.display(),
                        self.root.display()
                    ),
                )
            })?;
        let rel = RelPath::parse(rel.as_os_str().as_bytes()).ok_or_else(|| {
            Failure::new(
                Exit::Usage,
                format!("'{}' is not a path inside ROOT", rel.display()),
            )
        })?;
        Ok(live_path(&rel))
    }

    /// A user's PATH in a message: as given, then what it names under
    /// ROOT when that is not plain from it (a relative PATH, counted from
    /// the current directory inside the mount, else from ROOT; one inside
    /// `.history`, which means its live path).
    pub fn shown(&self, given: &Path, rel: &RelPath) -> String {
        let abs = self.root.join(rel.as_os_str());
        if given.is_absolute() && lexical(&self.base, given) == abs {
            return format!("'{}'", given.display());
        }
        let from_root = !given.is_absolute()
            && self
                .cwd
                .as_ref()
                .is_none_or(|c| !lexical(c, given).starts_with(&self.root));
        let via_history = lexical(&self.base, given)
            .components()
            .any(|c| c.as_os_str() == ".history");
        format!(
            "'{}' (that is '{}'{})",
            given.display(),
            abs.display(),
            if from_root {
                ", counted from ROOT, as the current directory is outside it"
            } else if via_history {
                ", the live path of that entry of .history"
            } else {
                ""
            }
        )
    }

    /// The mount that serves ROOT, with a daemon alive behind it; exit 3
    /// otherwise (a restore writes through the mount so that it is versioned).
    pub fn live_mount(&self) -> Result<&MountInfo, Failure> {
        self.live_mount_for("a restore writes through the mount so that it is versioned")
    }

    /// [`Target::live_mount`], saying `why` the command needs it.
    pub fn live_mount_for(&self, why: &str) -> Result<&MountInfo, Failure> {
        let Some(m) = &self.mount else {
            return Err(Failure::new(
                Exit::BadRoot,
                format!(
                    "'{}' is not mounted: {why} (mount it with `skillfs mount`)",
                    self.root.display()
                ),
            ));
        };
        if m.skillfs_store().as_deref() != Some(self.layout.dir.as_path()) {
            return Err(Failure::new(
                Exit::BadStore,
                format!(
                    "store '{}' is not the store of the mount at '{}' ('{}')",
                    self.layout.dir.display(),
                    m.mount_point.display(),
                    m.skillfs_store().unwrap_or_default().display()
                ),
            ));
        }
        if !crate::store::StoreLock::is_held(&self.layout) {
            return Err(Failure::new(
                Exit::BadRoot,
                format!(
                    "'{}' is a mount whose daemon died: run `skillfs mount {}`, which detaches it, \
                     checks the store and mounts again",
                    m.mount_point.display(),
                    m.mount_point.display()
                ),
            ));
        }
        Ok(m)
    }
}

/// The live path a path under `.history` stands for: `.history/<id>/cat/foo`
/// (or `cat/.history/<id>/foo`, from the `.history` of `cat`) is `cat/foo`
/// as it was at `<id>`. A user browsing history (`cd .history/29/cat`)
/// means the entry, not the view of it.
fn live_path(rel: &RelPath) -> RelPath {
    let comps: Vec<&[u8]> = rel.components().collect();
    // The name the mount answers in every versioned directory (`fs::history_view`).
    let Some(at) = comps.iter().position(|c| *c == b".history") else {
        return rel.clone();
    };
    let mut out = RelPath::root();
    for c in comps[..at].iter().chain(comps.iter().skip(at + 2)) {
        out = out.join(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_paths_count_from_the_base_and_never_climb_above_slash() {
        let b = Path::new("/m/skills/cat");
        assert_eq!(
            lexical(b, Path::new("foo/./SKILL.md")),
            Path::new("/m/skills/cat/foo/SKILL.md")
        );
        assert_eq!(lexical(b, Path::new("../x")), Path::new("/m/skills/x"));
        assert_eq!(lexical(b, Path::new("/a/../b")), Path::new("/b"));
        assert_eq!(lexical(b, Path::new("../../../../..")), Path::new("/"));
        assert_eq!(lexical(b, Path::new(".")), b);
    }

    #[test]
    fn a_path_under_history_means_its_live_path() {
        let live = |s: &str| live_path(&RelPath::parse(s.as_bytes()).unwrap()).to_string();
        assert_eq!(live(".history/29/demo/SKILL.md"), "demo/SKILL.md");
        assert_eq!(live("cat/.history/@-10m/foo"), "cat/foo");
        assert_eq!(live(".history/29"), ".");
        assert_eq!(live(".history"), ".");
        assert_eq!(live("cat/foo"), "cat/foo");
    }
}
