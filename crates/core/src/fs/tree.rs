//! The inode table and where each inode physically lives.
//!
//! Invariants:
//! - inode numbers are never reused (generation 0 suffices); the kernel's
//!   root is 1 ([`ROOT_INO`]). Over a skills directory that is the versioned
//!   root too. Over a home (`--versioned skills`) it is the home, a plain
//!   directory, and the versioned root is its child `skills`, inode 2
//!   ([`Tree::root`]); an entry of the home outside it is *outside*: its
//!   location is relative to the home's fd, never visible, never versioned;
//!   and the name of the versioned root in the home is fixed (see
//!   `SkillFs::pinned`);
//! - `by_name` maps a (parent, name) the kernel knows to its inode, and only
//!   for entries still linked; an unlinked inode lives on while the kernel
//!   holds lookups on it;
//! - a node is *attached* when it lives in the attached area of its parent
//!   (`parked/<key of parent>/<name>`) instead of inside the parent itself;
//!   an entry is hidden when it or any ancestor is attached. The key of a
//!   directory (inode number + birth time) survives renames, so renaming a
//!   visible directory carries its hidden children with it atomically.
//!
//! Locks: the table is behind `SkillFs::tree` (taken after `namespace`,
//! before `open_files`); nothing here locks on its own.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::BorrowedFd;

use crate::error::{FsError, FsResult};
use skillfs_base::relpath::RelPath;
use skillfs_base::sys;
use skillfs_store::journal::Kind;

pub type Ino = u64;
/// The kernel's root: the mount point.
pub const ROOT_INO: Ino = 1;
/// The versioned root when the mount is over a home.
const SKILLS_IN_HOME: Ino = 2;

/// Which of the daemon's directories an entry physically lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// ROOT (the versioned tree, visible or hidden names).
    Root,
    /// The store's `parked/`: attached areas of hidden entries.
    Parked,
    /// The home a versioned root sits in (a home mount).
    Home,
}

/// The directories of the areas, borrowed from the core that holds them
/// open from mount to unmount: what a location's `area` names for a
/// system call.
#[derive(Clone, Copy, Debug)]
pub struct AreaDirs<'a> {
    pub root: BorrowedFd<'a>,
    pub parked: BorrowedFd<'a>,
    /// The home's, over a home (`None` over a skills directory, where no
    /// location is in a home).
    pub home: Option<BorrowedFd<'a>>,
}

impl<'a> AreaDirs<'a> {
    pub fn of(&self, area: Area) -> BorrowedFd<'a> {
        match area {
            Area::Root => self.root,
            Area::Parked => self.parked,
            // A home location is made only from the home's top node,
            // which only a mount over a home has.
            Area::Home => self.home.expect("a location in a home only over one"),
        }
    }

    /// The directory `loc.phys` is relative to.
    pub fn at(&self, loc: &Location) -> BorrowedFd<'a> {
        self.of(loc.area)
    }
}

/// Where an entry physically is, and what the agent calls it.
#[derive(Clone, Debug)]
pub struct Location {
    /// The directory `phys` is relative to (see [`AreaDirs`]).
    pub area: Area,
    pub phys: Vec<u8>,
    /// Its path in the visible tree; `None` when it or an ancestor is hidden.
    pub visible: Option<RelPath>,
    /// Its path by the names the agent uses, hidden names included.
    pub logical: RelPath,
}

impl Location {
    pub fn root() -> Location {
        Location {
            area: Area::Root,
            phys: Vec::new(),
            visible: Some(RelPath::root()),
            logical: RelPath::root(),
        }
    }

    /// The home a versioned root sits in: its entries are outside (never
    /// visible), named `../<path>` from the versioned root.
    pub fn home() -> Location {
        Location {
            area: Area::Home,
            phys: Vec::new(),
            visible: None,
            logical: RelPath::from_bytes_unchecked(b"..".to_vec()),
        }
    }

    /// The entry `name` inside this directory.
    pub fn child(&self, name: &[u8]) -> Location {
        let mut phys = self.phys.clone();
        if !phys.is_empty() {
            phys.push(b'/');
        }
        phys.extend_from_slice(name);
        Location {
            area: self.area,
            phys,
            visible: self.visible.as_ref().map(|v| v.join(name)),
            logical: self.logical.join(name),
        }
    }

    /// The entry `name` in the attached area of this directory (`key`).
    pub fn attached_child(&self, key: &str, name: &[u8]) -> Location {
        let mut phys = key.as_bytes().to_vec();
        phys.push(b'/');
        phys.extend_from_slice(name);
        Location {
            area: Area::Parked,
            phys,
            visible: None,
            logical: self.logical.join(name),
        }
    }

    pub fn is_hidden(&self) -> bool {
        self.visible.is_none()
    }

    pub fn lstat(&self, dirs: AreaDirs<'_>) -> std::io::Result<libc::stat> {
        sys::lstatat(dirs.at(self), &self.phys)
    }
}

pub struct Node {
    pub parent: Ino,
    pub name: Vec<u8>,
    pub kind: Kind,
    pub nlookup: u64,
    /// Removed from the namespace; kept while the kernel still knows it.
    pub unlinked: bool,
    /// Lives in its parent's attached area.
    pub attached: bool,
    /// The identity key of a directory, once computed.
    pub key: Option<String>,
}

#[derive(Default)]
pub struct Tree {
    pub nodes: HashMap<Ino, Node>,
    /// Ordered so that a directory's children are one range.
    by_name: BTreeMap<(Ino, Vec<u8>), Ino>,
    next_ino: Ino,
    /// The versioned root: [`ROOT_INO`], or its child in a home.
    pub root: Ino,
    /// The last attributes of removed directories the kernel still knows,
    /// for what holds one open (`fstat` of a removed directory answers,
    /// with no links). Beside the nodes, not in them: it is rare, and a
    /// `stat` would double the size of every node.
    gone: HashMap<Ino, libc::stat>,
}

impl Tree {
    /// The table of a mount over the versioned root itself, or (`home`:
    /// the home's key and the versioned root's name in it) over a home.
    pub fn new(root_key: String, home: Option<(String, Vec<u8>)>) -> Tree {
        let dir = |parent, name, key| Node {
            parent,
            name,
            kind: Kind::Dir,
            nlookup: 1,
            unlinked: false,
            attached: false,
            key: Some(key),
        };
        let mut t = Tree::default();
        match home {
            None => {
                t.root = ROOT_INO;
                t.nodes
                    .insert(ROOT_INO, dir(ROOT_INO, Vec::new(), root_key));
            }
            Some((home_key, name)) => {
                t.root = SKILLS_IN_HOME;
                t.nodes
                    .insert(ROOT_INO, dir(ROOT_INO, Vec::new(), home_key));
                t.nodes
                    .insert(SKILLS_IN_HOME, dir(ROOT_INO, name.clone(), root_key));
                t.by_name.insert((ROOT_INO, name), SKILLS_IN_HOME);
            }
        }
        t.next_ino = t.root + 1;
        t
    }

    /// Whether `ino` is outside the versioned root, in the home around it.
    pub fn is_outside(&self, ino: Ino) -> bool {
        let mut cur = ino;
        while cur != self.root {
            if cur == ROOT_INO {
                return true;
            }
            match self.nodes.get(&cur) {
                Some(n) => cur = n.parent,
                None => return false,
            }
        }
        false
    }

    /// Whether `ino` is the kernel's root or the versioned root: never
    /// forgotten, never moved.
    pub fn is_top(&self, ino: Ino) -> bool {
        ino == ROOT_INO || ino == self.root
    }

    /// The location of `ino`, computing (and caching) the keys of the
    /// directories whose attached areas it passes through.
    ///
    /// `ESTALE` for a non-directory that is no longer in the tree: the
    /// kernel resolved a path to it just before a rename replaced it or an
    /// unlink removed it, and on `ESTALE` it walks the path again, so an
    /// `open` or `stat` racing an atomic replace finds the new file (as on
    /// ext4) instead of failing with `ENOENT`; a removed name then answers
    /// `ENOENT` from that fresh lookup. `ENOENT` for a removed directory or
    /// an entry under one: a walk that starts there (a process's current
    /// directory) would only meet it again.
    ///
    /// `dirs`: for the keys of attached directories not known yet.
    pub fn location(&mut self, ino: Ino, dirs: AreaDirs<'_>) -> FsResult<Location> {
        let mut chain: Vec<Ino> = Vec::new();
        let mut cur = ino;
        while !self.is_top(cur) {
            let n = self.nodes.get(&cur).ok_or(FsError::ESTALE)?;
            if n.unlinked {
                return Err(if cur == ino && n.kind != Kind::Dir {
                    FsError::ESTALE
                } else {
                    FsError::ENOENT
                });
            }
            chain.push(cur);
            cur = n.parent;
        }
        let mut loc = if cur == self.root {
            Location::root()
        } else {
            Location::home()
        };
        let mut parent = cur;
        for &n in chain.iter().rev() {
            let (attached, name) = {
                let node = &self.nodes[&n];
                (node.attached, node.name.clone())
            };
            loc = if attached {
                let key = self.key_of(parent, &loc, dirs)?;
                loc.attached_child(&key, &name)
            } else {
                loc.child(&name)
            };
            parent = n;
        }
        Ok(loc)
    }

    /// The identity key of directory `ino` found at `loc`.
    pub fn key_of(&mut self, ino: Ino, loc: &Location, dirs: AreaDirs<'_>) -> FsResult<String> {
        if let Some(k) = self.nodes.get(&ino).and_then(|n| n.key.clone()) {
            return Ok(k);
        }
        let k = sys::dir_key(dirs.at(loc), &loc.phys)?;
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.key = Some(k.clone());
        }
        Ok(k)
    }

    pub fn parent_of(&self, ino: Ino) -> Ino {
        self.nodes.get(&ino).map_or(ROOT_INO, |n| n.parent)
    }

    /// The inode of `parent/name`, created if new; counts one lookup.
    pub fn link(&mut self, parent: Ino, name: &[u8], kind: Kind, attached: bool) -> Ino {
        let key = (parent, name.to_vec());
        if let Some(&ino) = self.by_name.get(&key) {
            let n = self.nodes.get_mut(&ino).expect("by_name points at a node");
            if n.kind == kind {
                n.nlookup += 1;
                n.attached = attached;
                return ino;
            }
            // Replaced by an entry of another kind behind our back (only
            // possible before the mount): give it a fresh inode.
            n.unlinked = true;
            self.by_name.remove(&key);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(
            ino,
            Node {
                parent,
                name: name.to_vec(),
                kind,
                nlookup: 1,
                unlinked: false,
                attached,
                key: None,
            },
        );
        self.by_name.insert(key, ino);
        ino
    }

    pub fn child(&self, parent: Ino, name: &[u8]) -> Option<Ino> {
        self.by_name.get(&(parent, name.to_vec())).copied()
    }

    /// The node at a visible path, if the kernel knows it.
    pub fn find(&self, path: &RelPath) -> Option<Ino> {
        let mut cur = self.root;
        for c in path.components() {
            cur = self.child(cur, c)?;
        }
        Some(cur)
    }

    /// `ino` and every inode the kernel knows below it.
    pub fn subtree(&self, ino: Ino) -> Vec<Ino> {
        let mut out = vec![ino];
        let mut k = 0;
        while k < out.len() {
            let p = out[k];
            if self.nodes.get(&p).is_some_and(|n| n.kind == Kind::Dir) {
                let children = self.by_name.range((p, Vec::new())..(p + 1, Vec::new()));
                out.extend(children.map(|(_, &i)| i).filter(|&i| i != ROOT_INO));
            }
            k += 1;
        }
        out
    }

    pub fn set_attached(&mut self, ino: Ino, attached: bool) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.attached = attached;
        }
    }

    /// Keeps `st` (with no links) as the attributes of the directory
    /// `name` in `parent`, about to be detached (removed or replaced).
    pub fn keep_gone(&mut self, parent: Ino, name: &[u8], mut st: libc::stat) {
        if let Some(ino) = self.child(parent, name) {
            st.st_nlink = 0;
            self.gone.insert(ino, st);
        }
    }

    pub fn gone(&self, ino: Ino) -> Option<libc::stat> {
        self.gone.get(&ino).copied()
    }

    pub fn detach(&mut self, parent: Ino, name: &[u8]) {
        if let Some(ino) = self.by_name.remove(&(parent, name.to_vec()))
            && let Some(n) = self.nodes.get_mut(&ino)
        {
            n.unlinked = true;
            if n.nlookup == 0 {
                self.nodes.remove(&ino);
                self.gone.remove(&ino);
            }
        }
    }

    /// Whether the kernel still holds `ino` (its lookups are not all
    /// forgotten), in the tree or detached from it.
    pub fn knows(&self, ino: Ino) -> bool {
        self.nodes.contains_key(&ino)
    }

    pub fn forget(&mut self, ino: Ino, n: u64) {
        if self.is_top(ino) {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.nlookup = node.nlookup.saturating_sub(n);
        if node.nlookup == 0 {
            let key = (node.parent, node.name.clone());
            let unlinked = node.unlinked;
            self.nodes.remove(&ino);
            self.gone.remove(&ino);
            if !unlinked && self.by_name.get(&key) == Some(&ino) {
                self.by_name.remove(&key);
            }
        }
    }

    pub fn move_entry(
        &mut self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        attached: bool,
    ) {
        self.detach(newparent, newname);
        if let Some(ino) = self.by_name.remove(&(parent, name.to_vec())) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.parent = newparent;
                n.name = newname.to_vec();
                n.attached = attached;
            }
            self.by_name.insert((newparent, newname.to_vec()), ino);
        }
    }

    /// Swaps two entries; each takes the other's place (and placement).
    pub fn exchange(
        &mut self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        a_att: bool,
        b_att: bool,
    ) {
        let a = self.by_name.remove(&(parent, name.to_vec()));
        let b = self.by_name.remove(&(newparent, newname.to_vec()));
        if let Some(a) = a {
            if let Some(n) = self.nodes.get_mut(&a) {
                n.parent = newparent;
                n.name = newname.to_vec();
                n.attached = b_att;
            }
            self.by_name.insert((newparent, newname.to_vec()), a);
        }
        if let Some(b) = b {
            if let Some(n) = self.nodes.get_mut(&b) {
                n.parent = parent;
                n.name = name.to_vec();
                n.attached = a_att;
            }
            self.by_name.insert((parent, name.to_vec()), b);
        }
    }
}
