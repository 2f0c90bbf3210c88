//! No cache shows stale data: the kernel may cache entries, attributes,
//! listings and pages for long, so after each kind of change made through
//! the mount, another process that had the old state cached must see the
//! new state at once (stat, ls, read).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{Mount, describe, skillfs};

/// Runs `script` in a separate process (sh) and returns its stdout.
fn other(script: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Caches everything about `p` in the kernel: entry, attributes, pages,
/// and its directory's listing.
fn prime(p: &Path) {
    let dir = p.parent().unwrap();
    other(&format!(
        "cat '{0}' >/dev/null 2>&1; stat '{0}' >/dev/null 2>&1; ls -la '{1}' >/dev/null",
        p.display(),
        dir.display()
    ));
}

fn read(p: &Path) -> String {
    other(&format!("cat '{}' 2>&1", p.display()))
}

fn stat(p: &Path, fmt: &str) -> String {
    other(&format!("stat -c '{fmt}' '{}' 2>&1", p.display()))
        .trim()
        .to_string()
}

fn ls(p: &Path) -> String {
    other(&format!("ls -A '{}'", p.display()))
}

#[test]
fn writes_truncates_and_attribute_changes_are_seen_at_once() {
    let m = Mount::new("cache-write");
    let f = m.path("f.md");
    fs::write(&f, "old content").unwrap();
    prime(&f);
    fs::write(&f, "new, longer content").unwrap();
    assert_eq!(read(&f), "new, longer content");
    assert_eq!(stat(&f, "%s"), "19");
    prime(&f);
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(3)
        .unwrap();
    assert_eq!(read(&f), "new");
    assert_eq!(stat(&f, "%s"), "3");
    prime(&f);
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(stat(&f, "%a"), "600");
    prime(&f);
    let out = Command::new("touch")
        .args(["-m", "-d", "@1234567890"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(stat(&f, "%Y"), "1234567890");
}

#[test]
fn renames_unlinks_and_directory_changes_are_seen_at_once() {
    let m = Mount::new("cache-names");
    let (a, b) = (m.path("a.md"), m.path("b.md"));
    fs::write(&a, "from a").unwrap();
    fs::write(&b, "old b").unwrap();
    prime(&a);
    prime(&b);
    fs::rename(&a, &b).unwrap();
    assert_eq!(read(&b), "from a");
    assert!(read(&a).contains("No such file"));
    assert_eq!(ls(&m.root()), "b.md\n");
    prime(&b);
    fs::remove_file(&b).unwrap();
    assert!(stat(&b, "%s").contains("No such file"));
    assert_eq!(ls(&m.root()), "");
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    prime(&d.join("x"));
    fs::create_dir(d.join("sub")).unwrap();
    assert_eq!(ls(&d), "sub\n");
    fs::remove_dir(d.join("sub")).unwrap();
    assert_eq!(ls(&d), "");
}

#[test]
fn a_restore_from_history_is_seen_at_once() {
    let m = Mount::new("cache-restore");
    let r = m.root().display().to_string();
    fs::create_dir(m.path("skill")).unwrap();
    fs::write(m.path("skill/SKILL.md"), "good").unwrap();
    let good = m.log().last().unwrap()["seq"].as_u64().unwrap();
    fs::write(m.path("skill/SKILL.md"), "broken").unwrap();
    fs::write(m.path("skill/extra.md"), "extra").unwrap();
    prime(&m.path("skill/SKILL.md"));
    prime(&m.path("skill/extra.md"));
    let out = skillfs(&["restore", &good.to_string(), "skill", "--root", &r]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&m.path("skill/SKILL.md")), "good");
    assert_eq!(ls(&m.path("skill")), "SKILL.md\n");
    // And by copy from .history.
    fs::write(m.path("skill/SKILL.md"), "broken again").unwrap();
    prime(&m.path("skill/SKILL.md"));
    let src = m.path(&format!(".history/{good}/skill/SKILL.md"));
    fs::copy(&src, m.path("skill/SKILL.md")).unwrap();
    assert_eq!(read(&m.path("skill/SKILL.md")), "good");
    // A .history listing seen before a change lists the new id after it.
    let before = ls(&m.path(".history")).lines().count();
    fs::write(m.path("skill/SKILL.md"), "one more").unwrap();
    assert_eq!(ls(&m.path(".history")).lines().count(), before + 1);
}

#[test]
fn a_directory_listed_while_hidden_hides_its_parks_once_visible() {
    let m = Mount::new("cache-unpark");
    let staging = m.path(".rollback-staging-1");
    fs::create_dir(&staging).unwrap();
    fs::create_dir(staging.join("cat")).unwrap();
    fs::create_dir(staging.join("cat/foo.bak")).unwrap();
    fs::write(staging.join("cat/keep.md"), "k").unwrap();
    // Inside a hidden tree nothing is filtered, and the kernel caches that.
    assert_eq!(ls(&staging.join("cat")), "foo.bak\nkeep.md\n");
    fs::rename(staging.join("cat"), m.path("cat")).unwrap();
    assert_eq!(ls(&m.path("cat")), "keep.md\n");
    assert!(m.path("cat/foo.bak").is_dir(), "still reachable by name");
}

#[test]
fn a_directory_moved_between_hidden_and_visible_lists_anew() {
    let m = Mount::new("cache-hidemove");
    fs::create_dir_all(m.path("cat/foo")).unwrap();
    fs::write(m.path("cat/foo/SKILL.md"), "---\nname: foo\n---\n").unwrap();
    fs::create_dir(m.path("cat/foo.bak")).unwrap();
    fs::write(
        m.path("cat/foo.bak/SKILL.md"),
        "---\nname: foo\n---\nstale\n",
    )
    .unwrap();
    assert_eq!(ls(&m.path("cat")), "foo\n");
    // Hidden: its listing is whole, and the kernel caches that.
    fs::rename(m.path("cat"), m.path(".rollback-staging-1")).unwrap();
    assert_eq!(ls(&m.path(".rollback-staging-1")), "foo\nfoo.bak\n");
    // Visible again: filtered again, at once.
    fs::rename(m.path(".rollback-staging-1"), m.path("cat")).unwrap();
    assert_eq!(ls(&m.path("cat")), "foo\n");
    let found = other(&format!(
        "find '{}' -name SKILL.md | sort",
        m.root().display()
    ));
    assert_eq!(found.lines().count(), 1, "{found}");
}

/// Bytes `n` long that say which round wrote them.
fn version(round: usize, n: usize) -> Vec<u8> {
    let tag = format!("<round {round}>");
    tag.bytes().cycle().take(n).collect()
}

/// Rewrite, truncate, append and replace one file many times, with sizes
/// that end mid-page, while other threads keep reading it, and read back
/// every version as soon as it is written. This catches two ways a cache
/// can outlive a write: an attribute reply whose size predates a publish
/// (short reads), and a page handed to the kernel after its last writer
/// closed (`fs::pages`) landing after a newer write; the readers' page
/// locks are what make such a store wait.
#[test]
fn a_file_rewritten_while_read_reads_back_whole_at_once() {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let m = Mount::new("cache-pages");
    let f = m.path("SKILL.md");
    fs::write(&f, b"start").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (f, stop) = (f.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = fs::read(&f);
                }
            })
        })
        .collect();
    let mut rng = common::seed("SKILLFS_PAGES_SEED");
    let mut next = move |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % bound) as usize
    };
    let mut last = b"start".to_vec();
    for round in 0..600 {
        // Mostly a few pages; one in eight past the 64 KiB that are stored
        // whole (then only the last page is).
        let n = 1 + next(if round % 8 == 5 { 100_000 } else { 3 * 4096 });
        let want = match round % 5 {
            0 | 1 => {
                let v = version(round, n);
                fs::write(&f, &v).unwrap();
                v
            }
            2 => {
                // Shrink or grow through a handle, then append to it.
                let mut v = last.clone();
                let keep = next(v.len() as u64 + 1);
                fs::OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_len(keep as u64)
                    .unwrap();
                v.truncate(keep);
                let more = version(round, n % 700 + 1);
                let mut a = fs::OpenOptions::new().append(true).open(&f).unwrap();
                a.write_all(&more).unwrap();
                drop(a);
                v.extend_from_slice(&more);
                v
            }
            3 => {
                // Truncate by path, with no handle open.
                let mut v = last.clone();
                let keep = next(v.len() as u64 + 1);
                let c = common::cpath(&f);
                assert_eq!(
                    unsafe { libc::truncate(c.as_ptr(), keep as libc::off_t) },
                    0
                );
                v.resize(keep, 0);
                v
            }
            _ => {
                // The agent's atomic write: a hidden temp file renamed over.
                let v = version(round, n);
                let tmp = m.path(".SKILL.md.tmp");
                fs::write(&tmp, &v).unwrap();
                fs::rename(&tmp, &f).unwrap();
                v
            }
        };
        last = want.clone();
        let got = fs::read(&f).unwrap();
        assert!(
            got == want,
            "round {round}: read {} bytes ({:?}…) after writing {} bytes ({:?}…)",
            got.len(),
            String::from_utf8_lossy(&got[..got.len().min(12)]),
            want.len(),
            String::from_utf8_lossy(&want[..want.len().min(12)]),
        );
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
}

/// A name looked up while missing is remembered as missing by the kernel
/// (a negative entry): whatever then makes it exist must be seen at once,
/// by this process and another.
#[test]
fn a_name_looked_up_while_missing_is_seen_once_made() {
    let m = Mount::new("cache-negative");
    fs::create_dir(m.path("skill")).unwrap();
    fs::write(m.path("skill/SKILL.md"), "v1").unwrap();
    let missing = |rel: &str| {
        let p = m.path(rel);
        assert!(fs::symlink_metadata(&p).is_err(), "{rel} exists too early");
        assert!(
            stat(&p, "%s").contains("No such file"),
            "{rel}: another process"
        );
        p
    };
    // Made by another process: a file, a directory, a symlink.
    let f = missing("skill/notes.md");
    other(&format!("printf made > '{}'", f.display()));
    assert_eq!(fs::read_to_string(&f).unwrap(), "made");
    let d = missing("skill/references");
    other(&format!("mkdir '{}'", d.display()));
    assert!(d.is_dir());
    let l = missing("skill/link");
    other(&format!("ln -s SKILL.md '{}'", l.display()));
    assert_eq!(fs::read_to_string(&l).unwrap(), "v1");
    // Renamed onto, and made again after an unlink.
    let r = missing("skill/renamed.md");
    fs::rename(&f, &r).unwrap();
    assert_eq!(read(&r), "made");
    assert!(fs::symlink_metadata(&f).is_err());
    fs::write(&f, "again").unwrap();
    assert_eq!(read(&f), "again");
    // A hidden name (a park) made after being looked up.
    let bak = missing("skill.bak");
    fs::rename(m.path("skill"), &bak).unwrap();
    assert!(bak.join("SKILL.md").is_file());
    assert!(!ls(&m.root()).contains("skill.bak"));
    // `.history` of a hidden directory appears once it is visible again.
    assert!(fs::metadata(bak.join(".history")).is_err());
    fs::rename(&bak, m.path("skill")).unwrap();
    assert!(m.path("skill/.history").is_dir());
    // An id not yet recorded appears with the change that records it.
    let next = m.log().last().unwrap()["seq"].as_u64().unwrap() + 1;
    let id = m.path(&format!(".history/{next}"));
    assert!(fs::metadata(&id).is_err());
    fs::write(m.path("skill/SKILL.md"), "v2").unwrap();
    assert!(id.is_dir(), "{} after the change", id.display());
    assert_eq!(read(&id.join("skill/SKILL.md")), "v2");
}
