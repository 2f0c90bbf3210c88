//! POSIX behaviour through a real mount (contract G5), driven with `std::fs`
//! and `libc` the way unmodified programs call them. One test a behaviour.

use crate::common;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use common::{Mount, cpath as c, renameat2};

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn create_write_read_append() {
    let m = Mount::new("rw");
    let p = m.path("a.txt");
    fs::write(&p, b"hello").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"hello");
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b" world").unwrap();
    drop(f);
    assert_eq!(fs::read(&p).unwrap(), b"hello world");
    // Overwrite in the middle without truncation.
    let mut f = OpenOptions::new().write(true).open(&p).unwrap();
    f.seek(SeekFrom::Start(6)).unwrap();
    f.write_all(b"WORLD").unwrap();
    drop(f);
    assert_eq!(fs::read(&p).unwrap(), b"hello WORLD");
    assert_eq!(fs::metadata(&p).unwrap().len(), 11);
    // A larger file, past one FUSE request.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(m.path("big.bin"), &big).unwrap();
    assert_eq!(fs::read(m.path("big.bin")).unwrap(), big);
}

#[test]
fn truncate_by_path_handle_and_o_trunc() {
    let m = Mount::new("trunc");
    let p = m.path("t.txt");
    fs::write(&p, b"0123456789").unwrap();
    // truncate(2) with no handle open.
    let r = unsafe { libc::truncate(c(&p).as_ptr(), 4) };
    assert_eq!(r, 0);
    assert_eq!(fs::read(&p).unwrap(), b"0123");
    // ftruncate on a write handle, extending with zeros.
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(6).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 6);
    drop(f);
    assert_eq!(fs::read(&p).unwrap(), b"0123\0\0");
    // O_TRUNC empties at open, visible at once to another reader.
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"");
    w.write_all(b"new").unwrap();
    drop(w);
    assert_eq!(fs::read(&p).unwrap(), b"new");
    // O_RDONLY | O_TRUNC truncates on Linux too (write permission needed);
    // the kernel empties its own cache and counts on the open to do it.
    let r = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(&p)
        .unwrap();
    assert_eq!(r.metadata().unwrap().len(), 0);
    drop(r);
    let out = Command::new("cat").arg(&p).output().unwrap();
    assert_eq!(out.stdout, b"", "another process reads it empty");
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    let ops = m.ops_for("t.txt");
    assert!(ops.contains(&"truncate".to_string()), "{ops:?}");
    // Published at the last release, which the kernel sends after `close`.
    let log = m.log_when(|l| l.last().is_some_and(|r| r["state"]["size"] == 0));
    assert_eq!(
        log.last().unwrap()["state"]["size"],
        0,
        "the empty file is a version"
    );
}

/// A truncating open of a file a process runs as its program is refused
/// (ETXTBSY), as on ext4, and changes nothing. With FUSE_ATOMIC_O_TRUNC
/// the kernel checks for a running program only after the daemon answered
/// an open that takes no write access (`O_RDONLY`, or access mode 3, with
/// `O_TRUNC`): the daemon must refuse first, or the refused open had
/// emptied the file, made a version and killed the program (SIGBUS).
/// Opened right after `spawn` returns, as pjdfstest does: the program's
/// pages may not be mapped yet.
#[test]
fn o_trunc_of_a_running_program_is_refused_and_changes_nothing() {
    use std::os::unix::process::CommandExt;
    let m = Mount::new("txtbsy");
    let p = m.path("prog");
    let sleep = Command::new("sh")
        .args(["-c", "command -v sleep"])
        .output()
        .unwrap();
    let sleep = String::from_utf8(sleep.stdout).unwrap();
    let bytes = fs::read(sleep.trim()).unwrap();
    let open = |flags: i32| {
        let fd = unsafe { libc::open(c(&p).as_ptr(), flags) };
        if fd >= 0 {
            unsafe { libc::close(fd) };
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    for round in 0..20 {
        fs::write(&p, &bytes).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        let versions = m.log().len();
        // (Another test's fork can hold the file open for writing a moment
        // after the write, which makes the exec ETXTBSY: tried again.)
        let mut child = (0..100)
            .find_map(|_| match Command::new(&p).arg0("sleep").arg("30").spawn() {
                Err(e) if errno_of(&e) == libc::ETXTBSY => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    None
                }
                r => Some(r.unwrap()),
            })
            .expect("the program runs");
        for flags in [
            libc::O_RDONLY | libc::O_TRUNC,
            libc::O_ACCMODE | libc::O_TRUNC,
            libc::O_WRONLY,
            libc::O_RDWR | libc::O_TRUNC,
        ] {
            let e = open(flags).expect_err("a running program is not opened to change");
            assert_eq!(
                errno_of(&e),
                libc::ETXTBSY,
                "round {round}, flags {flags:#o}"
            );
        }
        assert!(
            fs::read(&p).unwrap() == bytes,
            "round {round}: its bytes stay"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: it runs on"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(m.log().len(), versions, "round {round}: no version");
    }
    // Once no program runs from it, the open truncates as before (its
    // close reaches the daemon a moment after the program's end: a busy
    // machine may take longer than the daemon waits).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while let Err(e) = open(libc::O_RDONLY | libc::O_TRUNC) {
        assert_eq!(errno_of(&e), libc::ETXTBSY);
        assert!(std::time::Instant::now() < deadline, "still refused");
    }
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
}

#[test]
fn o_excl_create() {
    let m = Mount::new("excl");
    let p = m.path("x");
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    // O_CREAT without O_EXCL opens the existing file.
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
}

#[test]
fn rename_over_existing_keeps_readers_bytes() {
    let m = Mount::new("renover");
    fs::write(m.path("old"), b"old bytes").unwrap();
    fs::write(m.path("new"), b"new bytes").unwrap();
    let mut reader = File::open(m.path("old")).unwrap();
    fs::rename(m.path("new"), m.path("old")).unwrap();
    let mut got = Vec::new();
    reader.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"old bytes");
    assert_eq!(fs::read(m.path("old")).unwrap(), b"new bytes");
    assert_eq!(
        fs::metadata(m.path("new")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn rename_noreplace_and_exchange() {
    let m = Mount::new("ren2");
    fs::write(m.path("a"), b"A").unwrap();
    fs::write(m.path("b"), b"B").unwrap();
    let e = renameat2(&m.path("a"), &m.path("b"), libc::RENAME_NOREPLACE).unwrap_err();
    assert_eq!(errno_of(&e), libc::EEXIST);
    renameat2(&m.path("a"), &m.path("b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("a")).unwrap(), b"B");
    assert_eq!(fs::read(m.path("b")).unwrap(), b"A");
    renameat2(&m.path("a"), &m.path("c"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(m.path("c")).unwrap(), b"B");
    let log = m.log();
    assert!(
        log.iter()
            .any(|r| r["op"] == "exchange" && r["path"] == "a" && r["to"] == "b")
    );
    assert!(
        log.iter()
            .any(|r| r["op"] == "rename" && r["noreplace"] == true)
    );
}

#[test]
fn rename_directories() {
    let m = Mount::new("rendir");
    fs::create_dir_all(m.path("cat/foo/references")).unwrap();
    fs::write(m.path("cat/foo/SKILL.md"), b"skill").unwrap();
    fs::write(m.path("cat/foo/references/r.md"), b"ref").unwrap();
    fs::rename(m.path("cat/foo"), m.path("cat/bar")).unwrap();
    assert_eq!(fs::read(m.path("cat/bar/references/r.md")).unwrap(), b"ref");
    common::assert_enoent(m.path("cat/foo"));
    // Over an empty directory: allowed; over a non-empty one: ENOTEMPTY.
    fs::create_dir(m.path("empty")).unwrap();
    fs::rename(m.path("cat/bar"), m.path("empty")).unwrap();
    assert_eq!(fs::read(m.path("empty/SKILL.md")).unwrap(), b"skill");
    fs::create_dir_all(m.path("full/x")).unwrap();
    let e = fs::rename(m.path("empty"), m.path("full")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOTEMPTY);
    // Into its own subtree: EINVAL.
    let e = fs::rename(m.path("full"), m.path("full/x/y")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EINVAL);
}

#[test]
fn error_codes_match_ext4() {
    let m = Mount::new("errno");
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"x").unwrap();
    fs::write(m.path("f"), b"x").unwrap();
    let cases: Vec<(std::io::Error, i32)> = vec![
        (fs::read(m.path("missing")).unwrap_err(), libc::ENOENT),
        (fs::create_dir(m.path("d")).unwrap_err(), libc::EEXIST),
        (fs::remove_dir(m.path("d")).unwrap_err(), libc::ENOTEMPTY),
        (fs::remove_file(m.path("d")).unwrap_err(), libc::EISDIR),
        (fs::remove_dir(m.path("f")).unwrap_err(), libc::ENOTDIR),
        (fs::read(m.path("f/x")).unwrap_err(), libc::ENOTDIR),
        (
            fs::rename(m.path("d"), m.path("f")).unwrap_err(),
            libc::ENOTDIR,
        ),
        (
            fs::rename(m.path("f"), m.path("d")).unwrap_err(),
            libc::EISDIR,
        ),
        (
            File::open(m.path("d"))
                .and_then(|mut f| f.read(&mut [0u8; 4]))
                .unwrap_err(),
            libc::EISDIR,
        ),
        (
            fs::write(m.path(&"n".repeat(256)), b"").unwrap_err(),
            libc::ENAMETOOLONG,
        ),
    ];
    for (i, (e, want)) in cases.iter().enumerate() {
        assert_eq!(errno_of(e), *want, "case {i}: {e}");
    }
    fs::remove_file(m.path("d/f")).unwrap();
    fs::remove_dir(m.path("d")).unwrap();
    common::assert_enoent(m.path("d"));
}

#[test]
fn symlinks_are_followed_and_read() {
    let m = Mount::new("symlink");
    fs::create_dir_all(m.path("real/skill")).unwrap();
    fs::write(m.path("real/skill/SKILL.md"), b"name: s").unwrap();
    symlink("real", m.path("link")).unwrap();
    symlink("/nonexistent/target", m.path("dangling")).unwrap();
    assert_eq!(fs::read_link(m.path("link")).unwrap(), Path::new("real"));
    assert_eq!(fs::read(m.path("link/skill/SKILL.md")).unwrap(), b"name: s");
    assert!(
        fs::symlink_metadata(m.path("dangling"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::metadata(m.path("dangling")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let rec = m
        .log()
        .into_iter()
        .find(|r| r["op"] == "symlink" && r["path"] == "link")
        .unwrap();
    assert_eq!(rec["state"]["target"], "real");
}

#[test]
fn hard_links_are_refused_with_eperm() {
    let m = Mount::new("link");
    fs::write(m.path("a"), b"x").unwrap();
    let e = fs::hard_link(m.path("a"), m.path("b")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EPERM);
}

#[test]
fn chmod_chown_utimens() {
    let m = Mount::new("attrs");
    let p = m.path("f");
    fs::write(&p, b"x").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let ts = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 987_654_321,
        },
    ];
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c(&p).as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_500_000_000, 987_654_321));
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    let ops = m.ops_for("f");
    for want in ["chmod", "chown", "utimes"] {
        assert!(ops.iter().any(|o| o == want), "{want} missing from {ops:?}");
    }
    let last = m
        .log()
        .into_iter()
        .rev()
        .find(|r| r["path"] == "f")
        .unwrap();
    assert_eq!(last["state"]["mtime_ns"], 1_500_000_000_987_654_321i64);
    assert_eq!(last["state"]["mode"], 0o600);
}

/// A writer's copy of a sparse file keeps its holes (xfstests generic/130
/// writes a byte at 10 GB with O_SYNC: each write's copy was dense, and
/// filled the disk).
#[test]
fn a_sparse_file_stays_sparse_when_written() {
    use std::os::unix::fs::FileExt;
    const SIZE: u64 = 256 << 20;
    let m = Mount::new("sparse");
    let p = m.path("f");
    let f = File::create(&p).unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.set_len(SIZE).unwrap();
    drop(f);
    // Each open for writing copies the file; each close publishes it.
    for round in 0..3u64 {
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"tail", SIZE - 4 - round * 8192).unwrap();
        f.sync_all().unwrap();
    }
    let md = fs::metadata(&p).unwrap();
    assert_eq!(md.len(), SIZE);
    assert!(
        md.blocks() * 512 < 1 << 20,
        "{} bytes allocated for a file of 3 small writes",
        md.blocks() * 512
    );
    let f = File::open(&p).unwrap();
    let mut buf = [0u8; 4];
    for (at, want) in [(0, b"head"), (SIZE - 4, b"tail"), (SIZE / 2, &[0u8; 4])] {
        f.read_exact_at(&mut buf, at).unwrap();
        assert_eq!(&buf, want, "at {at}");
    }
}

/// A write is no access (xfstests generic/003): rewriting a file, by a
/// truncating open or by an append, moves its mtime and not its atime,
/// though each is published as a new copy of the file.
#[test]
fn a_write_leaves_the_access_time_alone() {
    let m = Mount::new("atime-write");
    let p = m.path("f");
    fs::write(&p, b"x").unwrap();
    common::set_mtime(&p, 1_000_000_000, 123_456_789);
    fs::write(&p, b"truncated and rewritten").unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert!(md.mtime() > 1_000_000_000);
    common::set_mtime(&p, 1_000_000_000, 123_456_789);
    OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b" and appended")
        .unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert!(md.mtime() > 1_000_000_000);
    assert_eq!(
        fs::read(&p).unwrap(),
        b"truncated and rewritten and appended"
    );
}

#[test]
fn statfs_reports_the_underlying_filesystem() {
    let m = Mount::new("statfs");
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c(&m.root()).as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bsize > 0 && st.f_namemax >= 255);
}

#[test]
fn fsync_and_fdatasync_publish_durably() {
    let m = Mount::new("fsync");
    let mut f = File::create(m.path("s.bin")).unwrap();
    f.write_all(b"first").unwrap();
    f.sync_all().unwrap();
    // The version is in the journal before close.
    assert!(
        m.log()
            .iter()
            .any(|r| r["path"] == "s.bin" && r["op"] == "write" && r["state"]["size"] == 5)
    );
    f.write_all(b" second").unwrap();
    f.sync_data().unwrap();
    assert!(
        m.log()
            .iter()
            .any(|r| r["path"] == "s.bin" && r["state"]["size"] == 12)
    );
    drop(f);
    let dir = File::open(m.root()).unwrap();
    dir.sync_all().unwrap();
}

#[test]
fn flock_and_fcntl_locks_between_processes() {
    let m = Mount::new("locks");
    let p = m.path("lockfile");
    fs::write(&p, b"").unwrap();
    let a = File::open(&p).unwrap();
    assert_eq!(
        unsafe { libc::flock(a.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let script = r#"
import fcntl, sys
f = open(sys.argv[1], 'r+')
try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('flock-acquired')
except BlockingIOError:
    print('flock-busy')
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('lockf-acquired')
except (BlockingIOError, PermissionError):
    print('lockf-busy')
"#;
    // Hold a POSIX record lock too.
    let b = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    assert_eq!(unsafe { libc::fcntl(b.as_raw_fd(), libc::F_SETLK, &fl) }, 0);
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "flock-busy\nlockf-busy\n",
        "{out:?}"
    );
    drop(a);
    drop(b);
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "flock-acquired\nlockf-acquired\n",
        "{out:?}"
    );
}

#[test]
fn xattrs_answer_enotsup_never_eio() {
    let m = Mount::new("xattr");
    let p = m.path("f");
    fs::write(&p, b"x").unwrap();
    let name = CString::new("user.test").unwrap();
    let r = unsafe { libc::setxattr(c(&p).as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTSUP)
    );
    let mut buf = [0u8; 64];
    let r = unsafe { libc::getxattr(c(&p).as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTSUP)
    );
    let r = unsafe { libc::listxattr(c(&p).as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert!(r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTSUP));
    // shutil.copy2 / copystat treat this as "no xattrs".
    let out = Command::new("python3")
        .arg("-c")
        .arg("import shutil,sys; shutil.copy2(sys.argv[1], sys.argv[2]); shutil.copystat(sys.argv[1], sys.argv[2])")
        .arg(&p)
        .arg(m.path("g"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unlinked_while_open_still_reads_and_writes() {
    let m = Mount::new("unlinked");
    let p = m.path("f");
    fs::write(&p, b"content").unwrap();
    let mut f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    fs::remove_file(&p).unwrap();
    common::assert_enoent(&p);
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "content");
    f.write_all(b" more").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "content more");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    drop(f);
    common::assert_enoent(&p);
    // The deleted content stays in history.
    let rec = m
        .log()
        .into_iter()
        .rev()
        .find(|r| r["path"] == "f" && r["op"] == "write")
        .unwrap();
    assert_eq!(m.blob(rec["state"]["blob"].as_str().unwrap()), b"content");
}

#[test]
fn a_directory_removed_while_open_still_answers_fstat_and_fsync() {
    let m = Mount::new("gone-dir");
    for (name, how) in [("removed", "rmdir"), ("replaced", "rename over")] {
        let d = m.path(name);
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o751)).unwrap();
        let f = File::open(&d).unwrap();
        if how == "rmdir" {
            fs::remove_dir(&d).unwrap();
        } else {
            fs::create_dir(m.path("other")).unwrap();
            fs::rename(m.path("other"), &d).unwrap();
        }
        let st = f
            .metadata()
            .unwrap_or_else(|e| panic!("fstat after {how}: {e}"));
        assert!(st.is_dir(), "{how}");
        assert_eq!(st.mode() & 0o7777, 0o751, "{how}: its mode as it was");
        assert_eq!(st.nlink(), 0, "{how}: no links left");
        f.sync_all()
            .unwrap_or_else(|e| panic!("fsync after {how}: {e}"));
    }
}

#[test]
fn mmap_reads_see_the_file() {
    let m = Mount::new("mmap");
    let p = m.path("f");
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 256) as u8).collect();
    fs::write(&p, &data).unwrap();
    let f = File::open(&p).unwrap();
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            data.len(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    let got = unsafe { std::slice::from_raw_parts(ptr as *const u8, data.len()) };
    assert_eq!(got, &data[..]);
    unsafe { libc::munmap(ptr, data.len()) };
}

#[test]
fn readers_see_a_writers_bytes_before_close() {
    let m = Mount::new("coherent");
    let p = m.path("f");
    fs::write(&p, b"old").unwrap();
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    w.write_all(b"staged!").unwrap();
    // Another process reads the staged bytes and size before the close.
    let out = Command::new("cat").arg(&p).output().unwrap();
    assert_eq!(out.stdout, b"staged!");
    assert_eq!(fs::metadata(&p).unwrap().len(), 7);
    drop(w);
    assert_eq!(fs::read(&p).unwrap(), b"staged!");
}

#[test]
fn mknod_regular_and_o_tmpfile_like_sequences() {
    let m = Mount::new("mknod");
    let p = m.path("node");
    let r = unsafe { libc::mknod(c(&p).as_ptr(), libc::S_IFREG | 0o640, 0) };
    assert_eq!(r, 0);
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
    // A FIFO is made (scratch, unversioned: see tests/it/trust.rs); a device
    // node is not.
    let fifo = m.path("fifo");
    let r = unsafe { libc::mkfifo(c(&fifo).as_ptr(), 0o644) };
    assert_eq!(r, 0);
    assert_eq!(
        fs::metadata(&fifo).unwrap().mode() & libc::S_IFMT,
        libc::S_IFIFO
    );
    let dev = m.path("dev");
    let r = unsafe { libc::mknod(c(&dev).as_ptr(), libc::S_IFBLK | 0o600, 0) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
}

#[test]
fn create_mode_respects_umask_and_exact_modes() {
    let m = Mount::new("modes");
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o751)
        .open(m.path("x"))
        .unwrap();
    drop(f);
    let mode = fs::metadata(m.path("x")).unwrap().mode() & 0o777;
    // Read, not set and put back: the umask is the whole process's, and
    // the other tests of the binary create files meanwhile.
    let status = fs::read_to_string("/proc/thread-self/status").unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|m| u32::from_str_radix(m.trim(), 8).unwrap())
        .expect("a Umask line");
    assert_eq!(mode, 0o751 & !mask);
    fs::create_dir(m.path("d")).unwrap();
    fs::set_permissions(m.path("d"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::metadata(m.path("d")).unwrap().mode() & 0o7777, 0o700);
}

#[test]
fn directory_listing_and_dir_mtime() {
    let m = Mount::new("readdir");
    for i in 0..300 {
        fs::write(m.path(&format!("f{i:03}")), b"x").unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 300);
    assert_eq!(names[0], "f000");
    // A directory's mtime changes when entries are added, removed or renamed.
    let before = fs::metadata(m.root()).unwrap().mtime_nsec()
        + fs::metadata(m.root()).unwrap().mtime() * 1_000_000_000;
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::remove_file(m.path("f000")).unwrap();
    let md = fs::metadata(m.root()).unwrap();
    assert!(md.mtime() * 1_000_000_000 + md.mtime_nsec() > before);
    // A file's mtime does not change when it is only read or renamed.
    let md1 = fs::metadata(m.path("f001")).unwrap();
    let _ = fs::read(m.path("f001")).unwrap();
    fs::rename(m.path("f001"), m.path("g001")).unwrap();
    let md2 = fs::metadata(m.path("g001")).unwrap();
    assert_eq!(
        (md1.mtime(), md1.mtime_nsec(), md1.size()),
        (md2.mtime(), md2.mtime_nsec(), md2.size())
    );
}

#[test]
fn new_entries_are_fresh_and_take_what_their_directory_passes_on() {
    let m = Mount::new("fresh");
    // Files and directories come from spares made ahead of time: they
    // must look made now, empty, with the mode asked for.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let before = std::time::SystemTime::now() - std::time::Duration::from_millis(10);
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"").unwrap();
    for p in ["d", "d/f"] {
        let md = fs::symlink_metadata(m.path(p)).unwrap();
        assert!(md.modified().unwrap() >= before, "{p}: old mtime");
        assert!(
            md.ctime()
                >= before
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64,
            "{p}: old ctime"
        );
    }
    assert_eq!(fs::read_dir(m.path("d")).unwrap().count(), 1);
    assert_eq!(fs::metadata(m.path("d/f")).unwrap().len(), 0);

    // A set-group-ID directory gives new entries its group (and new
    // directories its set-group-ID bit), as the kernel does natively; the
    // same inside a hidden directory (it lives in the store's parks).
    for dir in ["shared", ".locks"] {
        fs::create_dir(m.path(dir)).unwrap();
        std::os::unix::fs::chown(m.path(dir), None, Some(65534)).unwrap();
        fs::set_permissions(m.path(dir), fs::Permissions::from_mode(0o2775)).unwrap();
        fs::write(m.path(&format!("{dir}/f")), b"x").unwrap();
        fs::create_dir(m.path(&format!("{dir}/sub"))).unwrap();
        assert_eq!(
            fs::metadata(m.path(&format!("{dir}/f"))).unwrap().gid(),
            65534
        );
        let sub = fs::metadata(m.path(&format!("{dir}/sub"))).unwrap();
        assert_eq!(sub.gid(), 65534, "{dir}/sub");
        assert_ne!(
            sub.mode() & 0o2000,
            0,
            "{dir}/sub: set-group-ID bit inherited"
        );
    }
}

#[test]
fn removing_thousands_of_files_at_once_frees_them_all() {
    // Removed files are freed by a background thread; a burst of removals
    // must neither run the daemon out of descriptors nor lose any.
    let m = Mount::new("burst");
    fs::create_dir(m.path("many")).unwrap();
    for i in 0..3000 {
        fs::write(m.path(&format!("many/f{i:04}")), b"x").unwrap();
    }
    fs::remove_dir_all(m.path("many")).unwrap();
    assert!(fs::metadata(m.path("many")).is_err());
    fs::write(m.path("after"), b"still serving").unwrap();
    assert_eq!(fs::read(m.path("after")).unwrap(), b"still serving");
}
