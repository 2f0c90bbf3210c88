//! The plain side of the model tests: a plain directory made to stand for
//! what a program sees through skillfs. The mounted model test (`model::`)
//! and the in-process one (`reftest::`) compare skillfs with it, so what
//! it does unlike POSIX is what skillfs promises unlike POSIX, and it is
//! all here, in one place:
//!
//! 1. **Hidden names** (the default rules `.*.tmp:file` and
//!    `*.bak:dir,outside-skills`, see [`hidden`]) are left out of a visible
//!    directory's listing and reachable by name (G3, G5).
//! 2. **A symlink is judged by where it leads** when it is placed (made,
//!    renamed into view) and again at each mount: hidden if it leads to or
//!    through a hidden entry, or its name is hidden for the kind it leads
//!    to (`skillfs::follow`; [`Plain::place_link`]).
//! 3. **A visible directory whose only entries are hidden is empty** to
//!    `rmdir` and to a rename over it: they go with it, attached to it
//!    elsewhere ([`Plain::drop_hidden_only`]).
//! 4. **A hard link made offline is split before a change** of one of its
//!    names (copy on write never reaches the other names;
//!    `common::split_link`).
//! 5. **A rename of one name of a file over another name of it** removes
//!    the source, where rename(2) leaves both (`docs/guarantees.md`,
//!    "Other names of a file"; [`same_file_rename`]).

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The default rules the models use, by kind ('f', 'd' or 'l'):
/// `.*.tmp:file` and `*.bak:dir,outside-skills` (the models make no skill,
/// so every `.bak` directory is outside one). A symlink's name alone hides
/// nothing (rule 2).
pub fn hidden(name: &str, kind: char) -> bool {
    match kind {
        'f' => name.starts_with('.') && name.ends_with(".tmp") && name.len() > 5,
        'd' => name.ends_with(".bak"),
        _ => false,
    }
}

/// 'd', 'l' or 'f' for a file type.
pub fn kind_of(t: fs::FileType) -> char {
    if t.is_dir() {
        'd'
    } else if t.is_symlink() {
        'l'
    } else {
        'f'
    }
}

/// `name` in directory `rel` (the root is "").
pub fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

/// Rule 5: whether a rename of `from` to `to` (relative to `root`, not an
/// exchange) is one of a file's names over another of its names.
pub fn same_file_rename(root: &Path, from: &str, to: &str) -> bool {
    let entry = |rel: &str| {
        let p = root.join(rel);
        let dir = p.parent().and_then(|d| fs::canonicalize(d).ok());
        (dir, p.file_name().map(|n| n.to_owned()))
    };
    entry(from) != entry(to)
        && match (
            fs::symlink_metadata(root.join(from)),
            fs::symlink_metadata(root.join(to)),
        ) {
            (Ok(a), Ok(b)) => !a.is_dir() && a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
}

/// A plain tree and the symlinks in it that skillfs would hide.
pub struct Plain {
    pub root: PathBuf,
    /// The symlinks (by inode) skillfs hid when it placed them: judged by
    /// where they led then, and again at each mount (rule 2).
    hidden_links: HashSet<u64>,
}

impl Plain {
    pub fn new(root: PathBuf) -> Plain {
        Plain {
            root,
            hidden_links: HashSet::new(),
        }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Whether the directory at `rel` is visible: no directory on its real
    /// path (symlinks resolved) has a hidden name.
    pub fn visible_dir(&self, rel: &str) -> bool {
        let (Ok(root), Ok(dir)) = (self.root.canonicalize(), self.p(rel).canonicalize()) else {
            return true;
        };
        dir.strip_prefix(&root)
            .map(|r| {
                r.components()
                    .all(|c| !hidden(&c.as_os_str().to_string_lossy(), 'd'))
            })
            .unwrap_or(true)
    }

    /// The entries of `rel`, with their kinds, and whether the listing
    /// hides hidden names (a visible directory).
    pub fn raw_list(&self, rel: &str) -> std::io::Result<(Vec<(String, char)>, bool)> {
        Ok((self.entries(rel)?, self.visible_dir(rel)))
    }

    /// The entries of `rel`, with their kinds, sorted.
    pub fn entries(&self, rel: &str) -> std::io::Result<Vec<(String, char)>> {
        let mut v = Vec::new();
        for e in fs::read_dir(self.p(rel))? {
            let e = e?;
            v.push((
                e.file_name().into_string().unwrap(),
                kind_of(e.file_type()?),
            ));
        }
        v.sort();
        Ok(v)
    }

    /// What a listing of `rel` shows (rule 1).
    pub fn list(&self, rel: &str) -> std::io::Result<Vec<String>> {
        let (v, filter) = self.raw_list(rel)?;
        Ok(v.into_iter()
            .filter(|(n, k)| !(filter && self.hides(rel, n, *k)))
            .map(|(n, _)| n)
            .collect())
    }

    /// Whether the entry `name` of kind `kind` in `rel` is hidden: by its
    /// name, or (a symlink) as skillfs placed it.
    pub fn hides(&self, rel: &str, name: &str, kind: char) -> bool {
        match kind {
            'l' => fs::symlink_metadata(self.p(rel).join(name))
                .is_ok_and(|m| self.hidden_links.contains(&m.ino())),
            k => hidden(name, k),
        }
    }

    /// How skillfs's rules judge the symlink at `rel` (a visible
    /// directory's entry) by where it leads (`skillfs::follow::seen`, on
    /// the plain tree: hidden entries are in place here, named so).
    pub fn judge_link(&self, rel: &str) -> bool {
        let name = rel.rsplit('/').next().unwrap();
        let root = self.root.clone();
        let hidden_at = |dir: &Path, n: &str, t: fs::FileType| {
            let dir = dir.strip_prefix(&root).unwrap().to_str().unwrap();
            self.hides(dir, n, kind_of(t))
        };
        let hidden_name = |n: &str| hidden(n, 'd') || hidden(n, 'f');
        match super::link_end(&self.root, rel, &hidden_at, &hidden_name) {
            None => true, // leads to, or through, a hidden entry
            Some(kind) => hidden(name, kind),
        }
    }

    /// Judges the symlink at `rel` again (placed there, in a visible
    /// directory) and records the answer.
    pub fn place_link(&mut self, rel: &str) {
        let Ok(m) = fs::symlink_metadata(self.p(rel)) else {
            return;
        };
        if !m.file_type().is_symlink() {
            return;
        }
        let parent = Path::new(rel).parent().unwrap().to_str().unwrap();
        if self.visible_dir(parent) && self.judge_link(rel) {
            self.hidden_links.insert(m.ino());
        } else if self.visible_dir(parent) {
            self.hidden_links.remove(&m.ino());
        }
    }

    /// Judges every symlink under the visible directory `rel` again, in
    /// the order skillfs's settle walks (depth-first, by name), as a mount
    /// and an unpark do.
    pub fn judge_links_under(&mut self, rel: &str) {
        let Ok(entries) = self.entries(rel) else {
            return;
        };
        for (name, kind) in entries {
            let r = join(rel, &name);
            match kind {
                'l' => self.place_link(&r),
                'd' if !hidden(&name, 'd') => self.judge_links_under(&r),
                _ => {}
            }
        }
    }

    /// Rule 3: called where `rmdir` or a rename over `rel` failed with
    /// ENOTEMPTY; removes its entries if they are all hidden, and says so
    /// (the call is then to be made again).
    pub fn drop_hidden_only(&self, rel: &str) -> bool {
        let Ok((entries, true)) = self.raw_list(rel) else {
            return false;
        };
        if entries.is_empty() || !entries.iter().all(|(n, k)| self.hides(rel, n, *k)) {
            return false;
        }
        for (n, k) in entries {
            let p = self.p(rel).join(n);
            if k == 'd' {
                fs::remove_dir_all(p).unwrap();
            } else {
                fs::remove_file(p).unwrap();
            }
        }
        true
    }

    /// `rel` by its real directory (symlinks on the way resolved), if
    /// that is inside the root.
    pub fn real(&self, rel: &str) -> Option<String> {
        let p = Path::new(rel);
        let dir = self.p(p.parent()?.to_str()?).canonicalize().ok()?;
        let root = self.root.canonicalize().ok()?;
        let dir = dir.strip_prefix(&root).ok()?.to_str()?.to_string();
        Some(join(&dir, p.file_name()?.to_str()?))
    }
}
