//! The vendored FUSE library logs through the `log` crate; its lines reach
//! the daemon's log (`daemon.log` in the store) with skillfs's own, through
//! the `log` → `tracing` bridge.

use crate::common;

use std::fs;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::Mount;

#[test]
fn a_warning_of_the_fuse_library_reaches_the_daemon_log() {
    let m = Mount::new("forklog");
    fs::write(m.path("f.md"), "data").unwrap();
    // skillfs answers no FUSE_LSEEK: the library's default handler warns
    // "[Not Implemented] lseek(...)" and answers ENOSYS, after which the
    // kernel seeks by itself.
    let f = fs::File::open(m.path("f.md")).unwrap();
    let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert_eq!(at, 0, "the kernel's own SEEK_DATA after ENOSYS");
    drop(f);
    let log = m.store().join("daemon.log");
    let t = Instant::now();
    loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains("[Not Implemented] lseek") {
            assert!(
                text.lines()
                    .any(|l| l.contains("WARN") && l.contains("[Not Implemented] lseek")),
                "{text}"
            );
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the library's warning is not in daemon.log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every Python `open()` (3.11-3.13) asks `isatty`, an ioctl the kernel
/// sends each time: it is answered ENOTTY without a line in the log (the
/// library's default logged a warning per call, filling `daemon.log` with
/// one for every file the agent opened). The lseek warning after them is
/// the mark that the log writer has caught up.
#[test]
fn an_isatty_per_open_leaves_no_line_in_the_daemon_log() {
    let m = Mount::new("ttylog");
    fs::write(m.path("f.md"), "data").unwrap();
    for _ in 0..20 {
        let f = fs::File::open(m.path("f.md")).unwrap();
        let mut termios = std::mem::MaybeUninit::<libc::termios>::zeroed();
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, termios.as_mut_ptr()) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOTTY)
        );
    }
    let f = fs::File::open(m.path("f.md")).unwrap();
    unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    drop(f);
    let log = m.store().join("daemon.log");
    let t = Instant::now();
    let text = loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains("[Not Implemented] lseek") {
            break text;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no mark:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!text.contains("] ioctl("), "{text}");
}

/// The daemon's log is bounded on disk: past its cap it is moved aside to
/// `daemon.log.1` (replacing the one before) and a new one starts, so a
/// daemon that logs for months keeps at most twice the cap.
#[test]
fn the_daemon_log_is_moved_aside_past_its_cap() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = common::Scratch::new("logcap");
    let cap = 65536u64;
    let out = std::process::Command::new(common::BIN)
        .args(["mount", &scratch.root().display().to_string()])
        .env_remove("HERMES_HOME")
        .env("SKILLFS_LOG", "debug")
        .env("SKILLFS_LOG_MAX_BYTES", cap.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::describe(&out));
    let m = Mount::adopt(scratch);
    let log = m.store().join("daemon.log");
    let old = m.store().join("daemon.log.1");
    // Each failed lookup, create and publish is a debug line or more: far
    // more than the cap in all.
    let churn = |from: usize| {
        for i in from..from + 1500 {
            let _ = fs::metadata(m.path(&format!("missing-{i}")));
            fs::write(m.path(&format!("f{i}.md")), "x").unwrap();
        }
    };
    churn(0);
    let t = Instant::now();
    while !old.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no daemon.log.1 after far more than {cap} bytes of log; daemon.log is {} bytes",
            fs::metadata(&log).map(|m| m.len()).unwrap_or(0)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A line is written whole before the size is looked at: a file holds
    // at most the cap plus one line.
    for f in [&log, &old] {
        let md = fs::metadata(f).unwrap();
        assert!(
            md.len() <= cap + 4096,
            "{} is {} bytes",
            f.display(),
            md.len()
        );
        assert_eq!(md.permissions().mode() & 0o777, 0o600, "{}", f.display());
    }
    assert!(
        fs::metadata(&old).unwrap().len() > cap,
        "moved aside only once full"
    );
    // A log removed by hand (to free space) is made again at the next
    // rotation, and the space it held comes back.
    fs::remove_file(&log).unwrap();
    fs::remove_file(&old).unwrap();
    churn(1500);
    churn(3000);
    let t = Instant::now();
    while !(log.exists() && old.exists()) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no new daemon.log after one was removed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fs::metadata(&log).unwrap().len() <= cap + 4096);
}
