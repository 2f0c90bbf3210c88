//! The vendored FUSE library logs through the `log` crate; its lines reach
//! the daemon's log (`daemon.log` in the store) with skillfs's own, through
//! the `log` → `tracing` bridge.

mod common;

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
