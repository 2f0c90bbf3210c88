//! A tree as sync sees it: every entry of the versioned root by its path
//! (relative, `/`-separated bytes), with its kind and, for a file, the
//! hash of its content. What a commit holds, what history shows at an id,
//! and what a merge makes.
//!
//! Invariants: a path never starts or ends with `/` and has no empty,
//! `.` or `..` component (`Tree::insert` refuses one); every entry's
//! parent directory is in the tree (`Tree::is_whole` checks it, a merge
//! keeps it).
//!
//! Locks: none; values.

use std::collections::BTreeMap;

/// What is at a path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    Dir,
    /// A regular file: its content's hash (as the blob store names it) and
    /// whether it is executable.
    File {
        blob: String,
        exec: bool,
    },
    Symlink {
        target: Vec<u8>,
    },
}

/// Every entry of a tree, by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree(pub(crate) BTreeMap<Vec<u8>, Entry>);

/// Whether `path` names an entry below the root: no empty, `.` or `..`
/// component, no leading or trailing `/`.
pub fn valid_path(path: &[u8]) -> bool {
    !path.is_empty()
        && path
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// The parent of `path` (`None` for an entry in the root).
pub fn parent(path: &[u8]) -> Option<&[u8]> {
    path.iter().rposition(|&b| b == b'/').map(|i| &path[..i])
}

/// Whether `path` is `dir` or below it.
pub fn within(path: &[u8], dir: &[u8]) -> bool {
    path == dir || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}

impl Tree {
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Adds `entry` at `path`, and the directories above it that are not
    /// there yet. A path that is not one is refused (false).
    pub fn insert(&mut self, path: &[u8], entry: Entry) -> bool {
        if !valid_path(path) {
            return false;
        }
        let mut p = parent(path);
        while let Some(d) = p {
            self.0.entry(d.to_vec()).or_insert(Entry::Dir);
            p = parent(d);
        }
        self.0.insert(path.to_vec(), entry);
        true
    }

    pub fn get(&self, path: &[u8]) -> Option<&Entry> {
        self.0.get(path)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.0.iter().map(|(p, e)| (p.as_slice(), e))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries at `dir` and below it.
    pub fn subtree(&self, dir: &[u8]) -> BTreeMap<&[u8], &Entry> {
        self.0
            .range(dir.to_vec()..)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| within(p, dir))
            .map(|(p, e)| (p.as_slice(), e))
            .collect()
    }

    /// Whether every entry's parent is a directory of the tree.
    pub fn is_whole(&self) -> bool {
        self.0
            .keys()
            .all(|p| parent(p).is_none_or(|d| self.0.get(d) == Some(&Entry::Dir)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_parents() {
        assert!(valid_path(b"a/b.md") && !valid_path(b"a//b") && !valid_path(b"../x"));
        assert!(!valid_path(b"/a") && !valid_path(b"a/") && !valid_path(b"a/./b"));
        assert_eq!(parent(b"a/b/c"), Some(&b"a/b"[..]));
        assert_eq!(parent(b"a"), None);
        assert!(within(b"a/b", b"a") && within(b"a", b"a") && !within(b"ab", b"a"));
    }

    #[test]
    fn an_insert_makes_the_directories_above_and_a_subtree_is_one_directory() {
        let mut t = Tree::new();
        let f = Entry::File {
            blob: "h".into(),
            exec: false,
        };
        assert!(t.insert(b"cat/s/SKILL.md", f.clone()));
        assert!(t.insert(b"cat/s2/x", f.clone()));
        assert!(!t.insert(b"cat/../x", f.clone()));
        assert_eq!(t.get(b"cat"), Some(&Entry::Dir));
        assert!(t.is_whole());
        let s: Vec<&[u8]> = t.subtree(b"cat/s").into_keys().collect();
        assert_eq!(s, vec![&b"cat/s"[..], &b"cat/s/SKILL.md"[..]]);
    }
}
