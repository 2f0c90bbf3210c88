//! Other replicas' versions under `.history`: the name `REPLICA:ID` (as
//! `skillfs log --replica` prints it) looked up in a `.history` listing is
//! that directory as replica `REPLICA`'s version `ID` has it, read-only,
//! so that a plain `cp -a .history/REPLICA:ID/cat/skill ./cat/` restores
//! it as `cp` does one of this tree's own versions. Like an alias, the
//! name resolves on lookup and no listing shows it.
//!
//! The core knows no git: what a replica's version holds and its bytes
//! come from a [`Replicas`] the application gives it at mount
//! (`SkillFs::set_replicas`); without one, no such name exists.
//!
//! Invariants:
//! - a node names an entry by its place in its version's sorted tree (0:
//!   the root) and an interned *version key* (what the application
//!   resolved the name to: a commit, which never changes), so its inode
//!   number stays the same while the mount lives and what is below it
//!   never changes; the name itself is resolved again at every
//!   lookup (a rewritten branch may give an id another commit), and the
//!   attributes are asked again as a `.history` listing's are (they are
//!   owned like the root, which may change);
//! - the interned keys only grow, by versions that exist (a lookup of a
//!   name that resolves to nothing interns nothing); no path is interned;
//! - nothing under it can be changed (`history_view::check_writable`).
//!
//! Owns: [`Theirs`], the interned keys, the last trees read and weak
//! references to the files open now.
//! Locks: `table`, briefly, never while the application is asked;
//! `asking`, held while it is (it runs git: milliseconds, more for a large
//! tree or file), so one request thread at a time waits on git for this,
//! one more waits at most [`ASK_WAIT`] for it, and any other answers
//! `EAGAIN` at once: a slow git holds at most two request threads, and
//! the others serve the rest of the mount; `open`, briefly, never while
//! the application is asked. No lock of these is taken with any other
//! lock of the core held.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{FsError, FsResult};
use skillfs_base::sched;
use skillfs_store::blobs::Opened;
use skillfs_store::journal::Kind;

/// An entry of another replica's version, as its git tree holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TheirEntry {
    pub kind: Kind,
    /// A file's executable bit (all git keeps of a mode).
    pub exec: bool,
    /// A file's size; a symlink's target's length.
    pub size: u64,
    /// What [`Replicas::content`] takes to read it (git's object id).
    pub object: String,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
}

/// A version of another replica: every entry (directories too), sorted
/// by path below the root. An entry's number in the version is its
/// position plus one (0: the root), which never changes for a commit, so
/// nothing of a listing needs remembering.
#[derive(Clone, Debug, Default)]
pub struct TheirTree {
    entries: Vec<(Vec<u8>, TheirEntry)>,
}

impl TheirTree {
    pub fn new(entries: BTreeMap<Vec<u8>, TheirEntry>) -> TheirTree {
        TheirTree {
            entries: entries.into_iter().collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of the entry at `path` (`b""`: the root, 0).
    pub fn number(&self, path: &[u8]) -> Option<u32> {
        if path.is_empty() {
            return Some(0);
        }
        let i = self
            .entries
            .binary_search_by(|(p, _)| p.as_slice().cmp(path))
            .ok()?;
        u32::try_from(i + 1).ok()
    }

    /// The path and entry numbered `n` (`None` for the root, or none).
    fn numbered(&self, n: u32) -> Option<&(Vec<u8>, TheirEntry)> {
        self.entries.get((n as usize).checked_sub(1)?)
    }

    /// The entries directly below the entry numbered `dir` (0: the root):
    /// name, entry, number.
    pub fn children(&self, dir: u32) -> Vec<(&[u8], &TheirEntry, u32)> {
        let prefix = match self.numbered(dir) {
            None if dir == 0 => Vec::new(),
            None => return Vec::new(),
            Some((p, _)) => [p.as_slice(), b"/"].concat(),
        };
        let n = prefix.len();
        // Every path that starts with `prefix` sorts together.
        let from = self
            .entries
            .partition_point(|(p, _)| p.as_slice() < prefix.as_slice());
        self.entries[from..]
            .iter()
            .enumerate()
            .take_while(|(_, (p, _))| p.starts_with(&prefix))
            .filter_map(|(i, (p, e))| {
                let name = &p[n..];
                let number = u32::try_from(from + i + 1).ok()?;
                (!name.is_empty() && !name.contains(&b'/')).then_some((name, e, number))
            })
            .collect()
    }
}

/// What the application knows of other replicas' versions (git's).
pub trait Replicas: Send + Sync {
    /// The version that `name` (`REPLICA:ID`) names, as a key that names
    /// its content for good (a commit id) and when it was made (ns since
    /// the epoch); `Ok(None)` when no version of that name is kept, or it
    /// may not be shown.
    fn resolve(&self, name: &str) -> std::io::Result<Option<(String, i64)>>;
    /// The entries of the version `key` names.
    fn tree(&self, key: &str) -> std::io::Result<TheirTree>;
    /// A file holding the bytes of `object` (an entry's, `size` bytes),
    /// to read at any offset.
    fn content(&self, object: &str, size: u64) -> std::io::Result<File>;
}

/// The errno for a version the application could not read: a full disk
/// and a file or tree too large say so; anything else is `EIO`.
pub fn unreadable(e: &std::io::Error) -> i32 {
    use std::io::ErrorKind as K;
    match (e.raw_os_error(), e.kind()) {
        (Some(c @ (libc::ENOSPC | libc::EFBIG)), _) => c,
        (_, K::StorageFull) => libc::ENOSPC,
        (_, K::FileTooLarge) => libc::EFBIG,
        _ => libc::EIO,
    }
}

/// How long a request waits for another one asking the application.
pub const ASK_WAIT: Duration = Duration::from_secs(2);
/// The trees kept in memory: at most this many...
const TREES_KEPT: usize = 16;
/// ...and at most this many entries in all (the newest is kept whatever
/// its size).
const ENTRIES_KEPT: usize = 1 << 20;

#[derive(Default)]
struct Table {
    keys: Vec<(String, i64)>,
    key_ix: HashMap<String, u32>,
    /// The newest first.
    trees: VecDeque<(u32, Arc<TheirTree>)>,
}

impl Table {
    fn intern_key(&mut self, key: String, time_ns: i64) -> FsResult<u32> {
        if let Some(&i) = self.key_ix.get(&key) {
            return Ok(i);
        }
        // The inode number holds it plus one in 32 bits.
        let i = u32::try_from(self.keys.len())
            .ok()
            .filter(|&i| i < u32::MAX - 1)
            .ok_or(FsError::of(libc::ENOSPC))?;
        self.key_ix.insert(key.clone(), i);
        self.keys.push((key, time_ns));
        Ok(i)
    }

    fn cached(&mut self, n: u32) -> Option<Arc<TheirTree>> {
        let i = self.trees.iter().position(|(k, _)| *k == n)?;
        let found = self.trees.remove(i).expect("in range");
        let tree = Arc::clone(&found.1);
        self.trees.push_front(found);
        Some(tree)
    }

    fn keep(&mut self, n: u32, tree: Arc<TheirTree>) {
        self.trees.retain(|(k, _)| *k != n);
        self.trees.push_front((n, tree));
        let mut entries = 0;
        let mut kept = 0;
        for (i, (_, t)) in self.trees.iter().enumerate() {
            entries += t.len();
            if i > 0 && (i >= TREES_KEPT || entries > ENTRIES_KEPT) {
                break;
            }
            kept = i + 1;
        }
        self.trees.truncate(kept);
    }
}

/// The other replicas' versions the kernel has looked up.
#[derive(Default)]
pub struct Theirs {
    replicas: OnceLock<Box<dyn Replicas>>,
    table: Mutex<Table>,
    /// The files open now, by object: a second open of one shares the
    /// first's copy rather than having the application copy it again
    /// (a large file is copied at every open it asks for). Weak: the
    /// copy goes with its last handle.
    open: Mutex<HashMap<String, Weak<Opened>>>,
    asking: Mutex<()>,
    /// Requests waiting for `asking` (at most one waits).
    waiting: AtomicUsize,
}

/// What a node of another replica's version is.
pub enum Node {
    /// A directory (the version's root, or one in it).
    Dir,
    Entry(TheirEntry),
}

impl Theirs {
    /// Set once, by the application, at mount.
    pub fn set(&self, r: Box<dyn Replicas>) {
        let _ = self.replicas.set(r);
    }

    /// Whether `name` may name another replica's version: the start of a
    /// replica's id (8 to 32 hex digits), a colon and a change id. Checked
    /// before the application is asked, so no other name costs anything.
    pub fn may_name(name: &[u8]) -> bool {
        let Some(colon) = name.iter().position(|&b| b == b':') else {
            return false;
        };
        let (r, n) = (&name[..colon], &name[colon + 1..]);
        (8..=32).contains(&r.len())
            && r.iter().all(u8::is_ascii_hexdigit)
            && (1..=20).contains(&n.len())
            && n.iter().all(u8::is_ascii_digit)
    }

    /// Runs `f` on the application, one request at a time (`asking`):
    /// one more may wait for it, up to [`ASK_WAIT`]; any other answers
    /// `EAGAIN` at once, so at most two request threads are ever held
    /// here. Run at `SCHED_OTHER` (an io_uring quick request is served at
    /// `SCHED_IDLE`, which would starve under load while it holds
    /// `asking`).
    fn ask<T>(
        &self,
        what: &str,
        f: impl FnOnce(&dyn Replicas) -> std::io::Result<T>,
    ) -> FsResult<T> {
        let r = self.replicas.get().ok_or(FsError::ENOENT)?;
        let busy = || {
            FsError::of(libc::EAGAIN).context(format_args!(
                "{what}: another request is reading another replica's versions"
            ))
        };
        let asking = match self.asking.try_lock() {
            Some(g) => g,
            None => {
                if self.waiting.fetch_add(1, Ordering::SeqCst) > 0 {
                    self.waiting.fetch_sub(1, Ordering::SeqCst);
                    return Err(busy());
                }
                let g = self.asking.try_lock_for(ASK_WAIT);
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                g.ok_or_else(busy)?
            }
        };
        let out = sched::at_normal_priority(|| f(r.as_ref()));
        drop(asking);
        out.map_err(|e| FsError::of(unreadable(&e)).context(format_args!("{what}: {e}")))
    }

    /// The version `name` names, seen from the directory `scope` (`b""`:
    /// the root): its node there (entry and version numbers), if the
    /// version has that directory.
    pub fn resolve(&self, name: &[u8], scope: &[u8]) -> FsResult<(u32, u32)> {
        if !Self::may_name(name) {
            return Err(FsError::ENOENT);
        }
        let text = std::str::from_utf8(name).map_err(|_| FsError::ENOENT)?;
        let (key, time) = self
            .ask("find another replica's version", |r| r.resolve(text))?
            .ok_or(FsError::ENOENT)?;
        let n = self.table.lock().intern_key(key, time)?;
        let tree = self.tree_of(n)?;
        let p = tree.number(scope).ok_or(FsError::ENOENT)?;
        match tree.numbered(p) {
            Some((_, e)) if e.kind != Kind::Dir => Err(FsError::ENOENT),
            _ => Ok((p, n)),
        }
    }

    /// The tree of the version numbered `n`: kept, or read (outside
    /// `table`).
    fn tree_of(&self, n: u32) -> FsResult<Arc<TheirTree>> {
        let key = {
            let mut t = self.table.lock();
            if let Some(tree) = t.cached(n) {
                return Ok(tree);
            }
            t.keys.get(n as usize).ok_or(FsError::ENOENT)?.0.clone()
        };
        let tree = self.ask("read another replica's version", |r| {
            // Read by another request while this one waited?
            if let Some(tree) = self.table.lock().cached(n) {
                return Ok(tree);
            }
            r.tree(&key).map(Arc::new)
        })?;
        self.table.lock().keep(n, Arc::clone(&tree));
        Ok(tree)
    }

    /// What the node `(p, n)` is, and when its version was made.
    pub fn node(&self, p: u32, n: u32) -> FsResult<(Node, i64)> {
        let time = self
            .table
            .lock()
            .keys
            .get(n as usize)
            .ok_or(FsError::ENOENT)?
            .1;
        if p == 0 {
            return Ok((Node::Dir, time));
        }
        let tree = self.tree_of(n)?;
        let (_, e) = tree.numbered(p).ok_or(FsError::ENOENT)?;
        Ok((
            match e.kind {
                Kind::Dir => Node::Dir,
                _ => Node::Entry(e.clone()),
            },
            time,
        ))
    }

    /// The child `name` of the directory node `(p, n)`: its number.
    pub fn child(&self, p: u32, n: u32, name: &[u8]) -> FsResult<u32> {
        let tree = self.tree_of(n)?;
        let child = match tree.numbered(p) {
            None if p == 0 => name.to_vec(),
            None => return Err(FsError::ENOENT),
            Some((path, _)) => [path.as_slice(), b"/", name].concat(),
        };
        tree.number(&child).ok_or(FsError::ENOENT)
    }

    /// The entries of the directory node `(p, n)`: name, kind, number.
    pub fn children(&self, p: u32, n: u32) -> FsResult<Vec<(Vec<u8>, Kind, u32)>> {
        let tree = self.tree_of(n)?;
        Ok(tree
            .children(p)
            .into_iter()
            .map(|(name, e, c)| (name.to_vec(), e.kind, c))
            .collect())
    }

    /// A file's bytes, to read: the copy a handle open now holds, else
    /// one asked for (as the rest: a copy holds one request thread, and
    /// another waits for it at most [`ASK_WAIT`]).
    pub fn content(&self, e: &TheirEntry) -> FsResult<Arc<Opened>> {
        if let Some(file) = self.open.lock().get(&e.object).and_then(Weak::upgrade) {
            return Ok(file);
        }
        let file = Arc::new(Opened::File(self.ask(
            &format!("read object {} of another replica's version", e.object),
            |r| r.content(&e.object, e.size),
        )?));
        let mut open = self.open.lock();
        // (Two first opens at once: each keeps its own copy, the later
        // one is shared from now on.)
        open.retain(|_, f| f.strong_count() > 0);
        open.insert(e.object.clone(), Arc::downgrade(&file));
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(object: &str, size: u64) -> TheirEntry {
        TheirEntry {
            kind: Kind::File,
            exec: false,
            size,
            object: object.into(),
            target: None,
        }
    }

    fn dir() -> TheirEntry {
        TheirEntry {
            kind: Kind::Dir,
            exec: false,
            size: 0,
            object: String::new(),
            target: None,
        }
    }

    /// Two versions of one replica, `a1b2c3d4:1` and `:2`, counting how
    /// often each was asked for.
    #[derive(Default)]
    struct Fake {
        trees_read: std::sync::atomic::AtomicUsize,
    }

    impl Replicas for Fake {
        fn resolve(&self, name: &str) -> std::io::Result<Option<(String, i64)>> {
            Ok(match name {
                "a1b2c3d4:1" => Some(("c1".into(), 10)),
                "a1b2c3d4:2" | "A1B2C3D4:2" => Some(("c2".into(), 20)),
                _ => None,
            })
        }
        fn tree(&self, key: &str) -> std::io::Result<TheirTree> {
            self.trees_read
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut entries = BTreeMap::new();
            entries.insert(b"cat".to_vec(), dir());
            entries.insert(b"cat/s".to_vec(), dir());
            entries.insert(b"cat/s/SKILL.md".to_vec(), file("o1", 5));
            if key == "c2" {
                entries.insert(b"cat/s/more.md".to_vec(), file("o2", 7));
                entries.insert(b"cat-x".to_vec(), file("o3", 1));
            }
            Ok(TheirTree::new(entries))
        }
        fn content(&self, _: &str, _: u64) -> std::io::Result<File> {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        }
    }

    #[test]
    fn only_a_replicas_version_name_is_asked_for() {
        assert!(Theirs::may_name(b"a1b2c3d4:1"));
        assert!(Theirs::may_name(b"0123456789abcdef0123456789abcdef:42"));
        assert!(!Theirs::may_name(b"a1b2c3d:1"), "seven digits");
        assert!(!Theirs::may_name(b"latest"));
        assert!(!Theirs::may_name(b"a1b2c3d4:"));
        assert!(!Theirs::may_name(b"a1b2c3d4:1x"));
        assert!(!Theirs::may_name(b"g1b2c3d4:1"));
        assert!(!Theirs::may_name(b"42"));
    }

    #[test]
    fn a_version_is_a_tree_of_nodes_that_keep_their_numbers() {
        let t = Theirs::default();
        assert!(t.resolve(b"a1b2c3d4:1", b"").is_err(), "no replicas given");
        t.set(Box::new(Fake::default()));
        let (root, n1) = t.resolve(b"a1b2c3d4:1", b"").unwrap();
        let (root2, n2) = t.resolve(b"a1b2c3d4:2", b"").unwrap();
        assert_eq!(root, root2, "one path, one number");
        assert_ne!(n1, n2);
        assert_eq!(t.resolve(b"a1b2c3d4:1", b"").unwrap(), (root, n1));
        assert!(t.resolve(b"a1b2c3d4:9", b"").is_err());
        // From a directory's `.history`: that directory, if it has it.
        let (cat, n) = t.resolve(b"a1b2c3d4:1", b"cat").unwrap();
        assert_eq!(n, n1);
        assert_eq!(t.child(root, n1, b"cat").ok(), Some(cat));
        assert!(
            t.resolve(b"a1b2c3d4:1", b"cat/s/SKILL.md").is_err(),
            "a file"
        );
        assert!(t.resolve(b"a1b2c3d4:1", b"dog").is_err());

        let names = |p, n| {
            t.children(p, n)
                .unwrap()
                .into_iter()
                .map(|(name, _, _)| String::from_utf8(name).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(root, n1), ["cat"]);
        assert_eq!(names(root, n2), ["cat", "cat-x"]);
        // Numbers are each version's own (its entries' order).
        let cat2 = t.child(root, n2, b"cat").unwrap();
        let s2 = t.child(cat2, n2, b"s").unwrap();
        let s1 = t.child(cat, n1, b"s").unwrap();
        assert_eq!(names(s2, n2), ["SKILL.md", "more.md"]);
        assert_eq!(names(s1, n1), ["SKILL.md"]);
        assert!(t.child(s1, n1, b"more.md").is_err(), "not in version 1");
        let more = t.child(s2, n2, b"more.md").unwrap();
        match t.node(more, n2) {
            Ok((Node::Entry(e), 20)) => assert_eq!(e, file("o2", 7)),
            _ => panic!("a file of version 2"),
        }
        assert_eq!(t.resolve(b"a1b2c3d4:2", b"cat/s").unwrap(), (s2, n2));
        assert!(t.node(99, n1).is_err());
        assert!(matches!(t.node(root, n1), Ok((Node::Dir, 10))));
    }

    /// One application the test keeps a hold of too.
    struct Shared<R>(Arc<R>);

    impl<R: Replicas> Replicas for Shared<R> {
        fn resolve(&self, name: &str) -> std::io::Result<Option<(String, i64)>> {
            self.0.resolve(name)
        }
        fn tree(&self, key: &str) -> std::io::Result<TheirTree> {
            self.0.tree(key)
        }
        fn content(&self, o: &str, size: u64) -> std::io::Result<File> {
            self.0.content(o, size)
        }
    }

    /// A file open now is shared by its next open, not copied again; once
    /// its last handle is gone, the next open asks for a copy.
    #[test]
    fn a_file_open_now_is_not_copied_again() {
        #[derive(Default)]
        struct Copies(std::sync::atomic::AtomicUsize);
        impl Replicas for Copies {
            fn resolve(&self, name: &str) -> std::io::Result<Option<(String, i64)>> {
                Fake::default().resolve(name)
            }
            fn tree(&self, key: &str) -> std::io::Result<TheirTree> {
                Fake::default().tree(key)
            }
            fn content(&self, _: &str, _: u64) -> std::io::Result<File> {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                File::open("/dev/null")
            }
        }
        let copies = Arc::new(Copies::default());
        let t = Theirs::default();
        t.set(Box::new(Shared(Arc::clone(&copies))));
        let made = || copies.0.load(std::sync::atomic::Ordering::SeqCst);
        let (a, b) = (file("o1", 5 << 20), file("o2", 7));
        let first = t.content(&a).unwrap();
        let second = t.content(&a).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(made(), 1);
        let other = t.content(&b).unwrap();
        assert_eq!(made(), 2);
        drop((first, second, other));
        let again = t.content(&a).unwrap();
        assert_eq!(made(), 3, "copied again once no handle held it");
        // What no handle holds is not remembered.
        assert_eq!(t.open.lock().len(), 1);
        drop(again);
    }

    #[test]
    fn trees_read_again_only_past_the_kept_few() {
        let t = Theirs::default();
        let fake = Arc::new(Fake::default());
        t.set(Box::new(Shared(Arc::clone(&fake))));
        let (root, n) = t.resolve(b"a1b2c3d4:1", b"").unwrap();
        for _ in 0..10 {
            t.children(root, n).unwrap();
        }
        let read = || fake.trees_read.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(read(), 1);
        // Forgotten from memory, a tree is read again and is the same.
        t.table.lock().trees.clear();
        assert_eq!(t.children(root, n).unwrap().len(), 1);
        assert_eq!(read(), 2);
    }

    /// A slow application holds up only the lookups that ask it: a
    /// second one waits `ASK_WAIT`, then answers `EAGAIN`; what is kept
    /// in memory is served meanwhile.
    #[test]
    fn a_slow_reader_holds_up_only_other_readers_and_not_for_long() {
        struct Slow(std::sync::atomic::AtomicBool);
        impl Replicas for Slow {
            fn resolve(&self, name: &str) -> std::io::Result<Option<(String, i64)>> {
                Fake::default().resolve(name)
            }
            fn tree(&self, key: &str) -> std::io::Result<TheirTree> {
                if key == "c2" && self.0.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(ASK_WAIT + Duration::from_secs(1));
                }
                Fake::default().tree(key)
            }
            fn content(&self, _: &str, _: u64) -> std::io::Result<File> {
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            }
        }
        let t = Arc::new(Theirs::default());
        t.set(Box::new(Slow(std::sync::atomic::AtomicBool::new(true))));
        let (root, n1) = t.resolve(b"a1b2c3d4:1", b"").unwrap();
        let slow = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || t.resolve(b"a1b2c3d4:2", b"").is_ok())
        };
        std::thread::sleep(Duration::from_millis(200));
        let started = std::time::Instant::now();
        // Kept: answered at once.
        assert_eq!(t.children(root, n1).unwrap().len(), 1);
        assert!(started.elapsed() < ASK_WAIT / 2);
        // Not kept: one request waits, and is refused after the wait; a
        // third is refused at once (two request threads held at most).
        t.table.lock().trees.clear();
        let waiter = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || t.children(root, n1).map(|_| ()).unwrap_err())
        };
        std::thread::sleep(Duration::from_millis(200));
        let at_once = std::time::Instant::now();
        let e = t.children(root, n1).map(|_| ()).unwrap_err();
        assert!(e.is(libc::EAGAIN), "{e:?}");
        assert!(at_once.elapsed() < ASK_WAIT / 2, "{:?}", at_once.elapsed());
        let e = waiter.join().unwrap();
        assert!(e.is(libc::EAGAIN), "{e:?}");
        assert!(started.elapsed() >= ASK_WAIT);
        assert!(slow.join().unwrap(), "the slow one is answered");
        assert_eq!(t.children(root, n1).unwrap().len(), 1);
    }

    #[test]
    fn the_trees_kept_are_bounded_by_count_and_entries() {
        let mut t = Table::default();
        let tree = |n: usize| {
            let mut entries = BTreeMap::new();
            for i in 0..n {
                entries.insert(format!("f{i}").into_bytes(), file("o", 1));
            }
            Arc::new(TheirTree::new(entries))
        };
        for n in 0..40 {
            t.keep(n, tree(1));
        }
        assert_eq!(t.trees.len(), TREES_KEPT);
        assert_eq!(t.trees.front().unwrap().0, 39, "the newest first");
        t.keep(100, tree(ENTRIES_KEPT - 2));
        assert_eq!(t.trees.len(), 3, "the big one and two small ones");
        t.keep(101, tree(ENTRIES_KEPT + 5));
        assert_eq!(t.trees.len(), 1, "the newest, whatever its size");
        assert!(t.cached(101).is_some() && t.cached(100).is_none());
    }
}
