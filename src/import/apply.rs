//! What one part of the agent's history does to the tree, as changes
//! against the catalog (the tree just before it): a snapshot is a whole
//! tree, a ledger entry changes the paths it names. Pure: no I/O.
//!
//! Invariants:
//! - only what the mount would version is taken: entries the hide rules
//!   hide (with everything below them) and untracked paths are left out,
//!   judged as the mount's scan judges them (a directory is inside a skill
//!   package when it or an ancestor holds `SKILL.md`); a symlink is judged
//!   by its name (the scan judges it by where it leads, which an archive
//!   cannot say);
//! - removals come first, each once at its top (`import-remove` takes what
//!   lies below), then new states parent before child: the order in which
//!   the catalog's fold gives the tree described;
//! - a directory whose kind, mode and owner are unchanged is not recorded
//!   again (directory mtimes are not versioned, as in the scan).
//!
//! Locks: none.

use std::collections::{BTreeMap, BTreeSet};

use crate::agent::snapshots::{Member, MemberKind};
use crate::catalog::Catalog;
use crate::hide::HideRules;
use crate::relpath::{ByteString, RelPath};
use crate::store::journal::{Change, EntryState, Kind, Op};

/// The owner and time given to what the agent's history does not say (a
/// directory a ledger entry implies, a file's mode).
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    pub uid: u32,
    pub gid: u32,
    pub ts: i64,
}

impl Defaults {
    fn dir(&self) -> EntryState {
        EntryState {
            kind: Kind::Dir,
            blob: None,
            size: 0,
            mode: 0o755,
            uid: self.uid,
            gid: self.gid,
            mtime_ns: self.ts as i128,
            target: None,
        }
    }
}

/// Whether the mount would version `path`, an entry of `kind`: no
/// component is hidden, none is untracked. `holds_skill_md(d)`: directory
/// `d` holds a `SKILL.md`.
pub fn versioned(
    rules: &HideRules,
    path: &RelPath,
    kind: Kind,
    holds_skill_md: &dyn Fn(&RelPath) -> bool,
) -> bool {
    let names: Vec<&[u8]> = path.components().collect();
    let mut dir = RelPath::root();
    let mut in_pkg = false;
    for (i, name) in names.iter().enumerate() {
        in_pkg = in_pkg || holds_skill_md(&dir);
        let k = if i + 1 == names.len() {
            kind
        } else {
            Kind::Dir
        };
        if rules.is_hidden(name, k, dir.is_root(), &mut || in_pkg) {
            return false;
        }
        dir = dir.join(name);
        if rules.is_untracked(&dir, k) {
            return false;
        }
    }
    true
}

/// A snapshot's tree as the mount would version it: each path's state,
/// files without their blob yet (`content` says which member's bytes
/// each file takes: its own or, for a hard link, the member it names).
pub struct Tree {
    pub states: BTreeMap<RelPath, EntryState>,
    pub content: BTreeMap<RelPath, RelPath>,
    /// One line per member no tree can hold, left out.
    pub refused: Vec<String>,
}

/// The tree of a snapshot's `members` (later members replace earlier
/// ones, as when extracting). A member no tree can hold (below a member
/// that is no directory, as a symlink that may lead out of the root; a
/// hard link to no file) is refused by name and left out, the others kept.
pub fn snapshot_tree(members: &[Member], rules: &HideRules, d: Defaults) -> Tree {
    let mut all: BTreeMap<&RelPath, &Member> = members.iter().map(|m| (&m.path, m)).collect();
    let mut refused = Vec::new();
    let below_no_dir: Vec<(&RelPath, RelPath)> = all
        .keys()
        .filter_map(|p| {
            let mut up = p.parent();
            while let Some(a) = up.filter(|a| !a.is_root()) {
                if all.get(&a).is_some_and(|m| m.kind != MemberKind::Dir) {
                    return Some((*p, a));
                }
                up = a.parent();
            }
            None
        })
        .collect();
    for (p, a) in below_no_dir {
        refused.push(format!(
            "member '{p}' is below '{a}', which is no directory"
        ));
        all.remove(p);
    }
    let skill_md: BTreeSet<RelPath> = all
        .keys()
        .filter(|p| p.file_name() == b"SKILL.md")
        .filter_map(|p| p.parent())
        .collect();
    let holds = |dir: &RelPath| skill_md.contains(dir);
    let mut tree = Tree {
        states: BTreeMap::new(),
        content: BTreeMap::new(),
        refused,
    };
    for (path, m) in &all {
        if let MemberKind::HardLink { to } = &m.kind
            && !matches!(all.get(to).map(|t| &t.kind), Some(MemberKind::File { .. }))
        {
            tree.refused
                .push(format!("member '{path}' links to '{to}', which is no file"));
            continue;
        }
        let kind = match m.kind {
            MemberKind::Dir => Kind::Dir,
            MemberKind::Symlink { .. } => Kind::Symlink,
            MemberKind::File { .. } | MemberKind::HardLink { .. } => Kind::File,
        };
        if !versioned(rules, path, kind, &holds) {
            continue;
        }
        let mut state = EntryState {
            kind,
            blob: None,
            size: 0,
            mode: m.mode,
            uid: m.uid,
            gid: m.gid,
            mtime_ns: m.mtime_ns,
            target: None,
        };
        match &m.kind {
            MemberKind::File { size } => {
                state.size = *size;
                tree.content.insert((*path).clone(), (*path).clone());
            }
            MemberKind::HardLink { to } => match all.get(to).map(|t| &t.kind) {
                Some(MemberKind::File { size }) => {
                    state.size = *size;
                    tree.content.insert((*path).clone(), to.clone());
                }
                _ => continue, // refused above
            },
            MemberKind::Symlink { target } => {
                state.size = target.len() as u64;
                state.target = Some(ByteString(target.clone()));
            }
            MemberKind::Dir => {}
        }
        // Directories an archive leaves implicit (it names only the file).
        let mut up = path.parent();
        while let Some(a) = up.filter(|a| !a.is_root() && !all.contains_key(a)) {
            tree.states.entry(a.clone()).or_insert_with(|| d.dir());
            up = a.parent();
        }
        tree.states.insert((*path).clone(), state);
    }
    tree
}

/// Whether `new` is a change from `old` worth a record.
fn differs(old: Option<&EntryState>, new: &EntryState) -> bool {
    match old {
        None => true,
        Some(o) if o.kind == Kind::Dir && new.kind == Kind::Dir => {
            (o.mode, o.uid, o.gid) != (new.mode, new.uid, new.gid)
        }
        Some(o) => o != new,
    }
}

/// Whether `p` or an ancestor of it is in `removed`.
fn covered(removed: &BTreeSet<RelPath>, p: &RelPath) -> bool {
    let mut cur = Some(p.clone());
    while let Some(c) = cur.filter(|c| !c.is_root()) {
        if removed.contains(&c) {
            return true;
        }
        cur = c.parent();
    }
    false
}

/// One `import-remove` per top of `removed`, then one `import` per state
/// of `states` that is new against `cat` (or whose path was removed).
fn changes(
    cat: &Catalog,
    removed: &BTreeSet<RelPath>,
    states: &BTreeMap<RelPath, EntryState>,
) -> Vec<Change> {
    let mut out: Vec<Change> = removed
        .iter()
        .filter(|p| p.parent().is_none_or(|par| !covered(removed, &par)))
        .map(|p| Change::new(Op::ImportRemove, p.clone(), None))
        .collect();
    for (p, s) in states {
        let old = if covered(removed, p) {
            None
        } else {
            cat.get(p)
        };
        if differs(old, s) {
            out.push(Change::new(Op::Import, p.clone(), Some(s.clone())));
        }
    }
    out
}

/// The changes that take `cat` to the snapshot tree `states` (files with
/// their blobs).
pub fn to_tree(cat: &Catalog, states: &BTreeMap<RelPath, EntryState>) -> Vec<Change> {
    let removed: BTreeSet<RelPath> = cat
        .iter()
        .filter(|(p, s)| states.get(*p).map(|n| n.kind) != Some(s.kind))
        .map(|(p, _)| p.clone())
        .collect();
    changes(cat, &removed, states)
}

/// A ledger entry, its paths made relative and checked: what it wrote
/// (path, blob, size) and what it names only before.
pub struct EntryPaths {
    pub after: Vec<(RelPath, String, u64)>,
    pub before: Vec<RelPath>,
}

/// The changes a ledger entry makes to `cat`: each `after` file gets its
/// content (keeping the mode and owner it had, else 0644 and `d`'s
/// owner, with the entry's time as mtime), with the directories it needs;
/// each path named only `before` is removed, and so is each directory it
/// leaves empty up to the skill's own (the one holding the `SKILL.md`
/// named before: the agent removes a deleted or archived skill whole).
pub fn ledger_entry(cat: &Catalog, e: &EntryPaths, rules: &HideRules, d: Defaults) -> Vec<Change> {
    let written: BTreeSet<&RelPath> = e.after.iter().map(|(p, _, _)| p).collect();
    let holds = |dir: &RelPath| {
        let md = dir.join(b"SKILL.md");
        cat.get(&md).is_some() || written.contains(&md)
    };
    let mut removed: BTreeSet<RelPath> = e
        .before
        .iter()
        .filter(|p| !written.contains(p) && cat.get(p).is_some())
        .filter(|p| versioned(rules, p, Kind::File, &holds))
        .cloned()
        .collect();
    let package = e
        .before
        .iter()
        .find(|p| p.file_name() == b"SKILL.md")
        .and_then(|p| p.parent())
        .filter(|p| !p.is_root());
    if let Some(pkg) = &package {
        let mut dirs: Vec<RelPath> = removed
            .iter()
            .flat_map(|p| {
                std::iter::successors(p.parent(), |a| a.parent())
                    .take_while(|a| a.starts_with(pkg))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Deepest first: a directory is empty once its subdirectories are.
        dirs.sort_by_key(|a| std::cmp::Reverse(a.components().count()));
        dirs.dedup();
        for dir in dirs {
            let empty = cat.below(&dir).all(|(p, _)| covered(&removed, p))
                && !written.iter().any(|w| w.starts_with(&dir));
            if empty && cat.get(&dir).is_some() {
                removed.insert(dir);
            }
        }
    }
    let mut states: BTreeMap<RelPath, EntryState> = BTreeMap::new();
    for (p, blob, size) in &e.after {
        if !versioned(rules, p, Kind::File, &holds) {
            continue;
        }
        let mut up = p.parent();
        while let Some(a) = up.filter(|a| !a.is_root()) {
            let is_dir = !covered(&removed, &a) && cat.get(&a).is_some_and(|s| s.kind == Kind::Dir);
            if !is_dir {
                states.entry(a.clone()).or_insert_with(|| d.dir());
            }
            up = a.parent();
        }
        let old = cat
            .get(p)
            .filter(|s| s.kind == Kind::File && !covered(&removed, p));
        if old.is_some_and(|o| o.blob.as_deref() == Some(blob.as_str())) {
            continue; // the same content: nothing to record
        }
        states.insert(
            p.clone(),
            EntryState {
                kind: Kind::File,
                blob: Some(blob.clone()),
                size: *size,
                mode: old.map_or(0o644, |o| o.mode),
                uid: old.map_or(d.uid, |o| o.uid),
                gid: old.map_or(d.gid, |o| o.gid),
                mtime_ns: d.ts as i128,
                target: None,
            },
        );
    }
    changes(cat, &removed, &states)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::Record;

    fn p(s: &str) -> RelPath {
        RelPath::parse(s.as_bytes()).unwrap()
    }

    fn cat_of(files: &[&str]) -> Catalog {
        let mut c = Catalog::default();
        for f in files {
            let kind = if f.ends_with('/') {
                Kind::Dir
            } else {
                Kind::File
            };
            let st = EntryState::sample(kind, "aa");
            c.apply(&Record::sample(0, 0, Op::Import, f, None, Some(st)));
        }
        c
    }

    fn show(cs: &[Change]) -> Vec<String> {
        cs.iter()
            .map(|c| format!("{} {}", c.op.name(), c.path))
            .collect()
    }

    const D: Defaults = Defaults {
        uid: 0,
        gid: 0,
        ts: 7,
    };

    #[test]
    fn a_deleted_skill_goes_whole_and_its_category_stays() {
        let cat = cat_of(&[
            "cat/",
            "cat/DESCRIPTION.md",
            "cat/foo/",
            "cat/foo/SKILL.md",
            "cat/foo/references/",
            "cat/foo/references/a.md",
        ]);
        let e = EntryPaths {
            after: vec![],
            before: vec![p("cat/foo/SKILL.md"), p("cat/foo/references/a.md")],
        };
        let cs = ledger_entry(&cat, &e, &HideRules::defaults(), D);
        assert_eq!(show(&cs), ["import-remove cat/foo"]);
    }

    #[test]
    fn an_entry_changes_only_what_it_names() {
        let cat = cat_of(&["cat/", "cat/foo/", "cat/foo/SKILL.md", "cat/bar/"]);
        let e = EntryPaths {
            after: vec![
                (p("cat/foo/SKILL.md"), "bb".into(), 2),
                (p("cat/foo/scripts/r.py"), "cc".into(), 3),
                (p(".usage.json"), "dd".into(), 3),
            ],
            before: vec![p("cat/foo/SKILL.md")],
        };
        let cs = ledger_entry(&cat, &e, &HideRules::defaults(), D);
        assert_eq!(
            show(&cs),
            [
                "import cat/foo/SKILL.md",
                "import cat/foo/scripts",
                "import cat/foo/scripts/r.py"
            ]
        );
        assert_eq!(cs[0].state.as_ref().unwrap().mode, 0o644);
    }

    #[test]
    fn a_snapshot_replaces_the_tree_and_hides_what_the_mount_hides() {
        let cat = cat_of(&["old/", "old/SKILL.md", "keep/", "keep/SKILL.md"]);
        let m = |path: &str, kind: MemberKind| Member {
            path: p(path),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime_ns: 0,
        };
        let file = || MemberKind::File { size: 0 };
        let members = vec![
            m("keep", MemberKind::Dir),
            m("keep/SKILL.md", file()),
            m("x.bak/SKILL.md", file()),
            m("new/deep/SKILL.md", file()),
            m(
                "new/deep/twin",
                MemberKind::HardLink {
                    to: p("new/deep/SKILL.md"),
                },
            ),
        ];
        let tree = snapshot_tree(&members, &HideRules::defaults(), D);
        assert!(tree.refused.is_empty(), "{:?}", tree.refused);
        let paths: Vec<String> = tree.states.keys().map(|k| k.to_string()).collect();
        assert_eq!(
            paths,
            [
                "keep",
                "keep/SKILL.md",
                "new",
                "new/deep",
                "new/deep/SKILL.md",
                "new/deep/twin"
            ]
        );
        assert_eq!(tree.content[&p("new/deep/twin")], p("new/deep/SKILL.md"));
        let mut states = tree.states;
        for s in states.values_mut().filter(|s| s.kind == Kind::File) {
            s.blob = Some("aa".into());
        }
        let cs = to_tree(&cat, &states);
        assert_eq!(show(&cs)[0], "import-remove old");
        assert!(
            !show(&cs).iter().any(|c| c.contains("keep")),
            "{:?}",
            show(&cs)
        );
        // What no tree can hold is refused by name; the rest is kept.
        let bad = vec![
            m("a", file()),
            m("a/b", file()),
            m(
                "out",
                MemberKind::Symlink {
                    target: b"/tmp".to_vec(),
                },
            ),
            m("out/evil", file()),
            m("twin", MemberKind::HardLink { to: p("a/b") }),
            m("ok/SKILL.md", file()),
        ];
        let tree = snapshot_tree(&bad, &HideRules::defaults(), D);
        let paths: Vec<String> = tree.states.keys().map(|k| k.to_string()).collect();
        assert_eq!(paths, ["a", "ok", "ok/SKILL.md", "out"]);
        assert_eq!(
            tree.refused,
            [
                "member 'a/b' is below 'a', which is no directory",
                "member 'out/evil' is below 'out', which is no directory",
                "member 'twin' links to 'a/b', which is no file",
            ]
        );
    }
}
