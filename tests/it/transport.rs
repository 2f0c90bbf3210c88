//! The transport between the kernel and the daemon: classic `/dev/fuse`
//! reads, or FUSE over io_uring (`--transport`, `SKILLFS_TRANSPORT`).
//!
//! The other suites run once per transport (`scripts/test.sh`); these check
//! what is the transport's own: which one a mount uses and says it uses, a
//! refusal when io_uring was asked for and is not there, and a handler that
//! blocks leaving the other requests of its CPU served.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Mount, Scratch, assert_refused, describe, lazy_unmount, skillfs};

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// The tests of this file run one at a time: one switches io_uring off
/// for the whole machine while it runs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn uring_on() -> bool {
    fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "Y")
}

fn transport_line(root: &Path) -> String {
    let out = skillfs(&["status", "--root", root.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("transport:"))
        .unwrap_or_else(|| panic!("no transport line in status: {}", describe(&out)))
        .to_string()
}

/// The mount uses the transport the run asked for (SKILLFS_TRANSPORT, as
/// test.sh sets it), and `status` says which.
#[test]
fn status_names_the_transport_in_use() {
    let _serial = serial();
    let m = Mount::new("transport-status");
    fs::write(m.path("a.md"), b"served").unwrap();
    assert_eq!(fs::read(m.path("a.md")).unwrap(), b"served");
    let line = transport_line(&m.root());
    let asked = std::env::var("SKILLFS_TRANSPORT").unwrap_or_else(|_| "auto".into());
    let uring = match asked.as_str() {
        "uring" => true,
        "classic" => false,
        _ => uring_on(),
    };
    if uring {
        assert!(line.contains("io_uring ("), "{line}");
        // Every request but FORGET and INTERRUPT came through the ring:
        // the ring's threads have served, and are pinned one set per CPU.
        let threads = daemon_threads(m.pid);
        assert!(
            threads.iter().any(|t| t.starts_with("fuse-uring-")),
            "{threads:?}"
        );
    } else {
        assert!(line.contains("classic"), "{line}");
        assert!(
            !daemon_threads(m.pid)
                .iter()
                .any(|t| t.starts_with("fuse-uring-")),
            "a classic mount started io_uring threads"
        );
    }
}

fn daemon_threads(pid: u32) -> Vec<String> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

/// `--transport uring` where the kernel will not offer it: refused before
/// the store is opened, with one line naming the parameter; `auto` mounts
/// with the classic transport and says why.
#[test]
fn uring_refused_when_the_kernel_will_not_offer_it() {
    let _serial = serial();
    let s = Scratch::new("transport-refused");
    let param = s.root().parent().unwrap().join("enable_uring");
    fs::write(&param, "N\n").unwrap();
    let root = s.root();
    let mount = |env: (&str, &Path), args: &[&str]| {
        Command::new(BIN)
            .arg("mount")
            .arg(&root)
            .args(args)
            .env(env.0, env.1)
            .env_remove("HERMES_HOME")
            .output()
            .unwrap()
    };
    let out = mount(
        ("SKILLFS_TEST_ENABLE_URING", &param),
        &["--transport", "uring"],
    );
    assert_refused(&out, 6, &["--transport uring", "enable_uring", "is off"]);
    assert!(!common::is_mounted(&root));
    common::assert_enoent(s.store());

    // A kernel without the parameter at all.
    let missing = s.root().parent().unwrap().join("no-such-parameter");
    let out = mount(
        ("SKILLFS_TEST_ENABLE_URING", &missing),
        &["--transport", "uring"],
    );
    assert_refused(&out, 6, &["--transport uring", "Linux 6.14"]);

    // A bad SKILLFS_TRANSPORT is a usage error.
    let out = mount(("SKILLFS_TRANSPORT", Path::new("fast")), &[]);
    assert_refused(&out, 2, &["SKILLFS_TRANSPORT", "fast"]);

    let _m = Manual::mount(
        &s,
        &[("SKILLFS_TEST_ENABLE_URING", param.as_os_str())],
        &["--transport", "auto"],
    );
    let line = transport_line(&root);
    assert!(
        line.contains("classic") && line.contains("is off"),
        "{line}"
    );
}

/// A mount started by hand (for an environment of its own), unmounted and
/// its daemon killed on drop, panicking or not.
struct Manual {
    root: PathBuf,
    store: PathBuf,
}

impl Manual {
    fn mount(s: &Scratch, env: &[(&str, &std::ffi::OsStr)], args: &[&str]) -> Manual {
        let root = s.root();
        let mut cmd = Command::new(BIN);
        cmd.arg("mount")
            .arg(&root)
            .args(args)
            .env_remove("HERMES_HOME");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let m = Manual {
            root: root.clone(),
            store: s.store(),
        };
        assert!(out.status.success(), "mount failed: {}", describe(&out));
        assert!(common::is_mounted(&root));
        m
    }
}

impl Drop for Manual {
    fn drop(&mut self) {
        let pid = common::daemon_pid(&self.store);
        let out = Command::new(BIN)
            .args(["umount", self.root.to_str().unwrap(), "--timeout", "20"])
            .output();
        if !out.is_ok_and(|o| o.status.success()) {
            if let Some(pid) = pid {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            lazy_unmount(&self.root);
        }
    }
}

fn pin_to_cpu0() {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// An fsync the daemon holds for 3 s (a test hook standing for a slow
/// disk) does not hold the other calls of its CPU: a thread on the same
/// CPU stats, reads, writes and lists 200 times meanwhile, and finishes
/// long before the fsync returns. (On io_uring a request is served from
/// its caller's CPU queue; each queue has several entries, each its own
/// thread, so one blocked handler holds one entry.)
#[test]
fn a_blocked_fsync_does_not_stall_its_cpu() {
    let _serial = serial();
    let s = Scratch::new("transport-stall");
    fs::write(s.root().join("other.md"), b"read me").unwrap();
    let hold = std::ffi::OsString::from("3000");
    let _m = Manual::mount(
        &s,
        &[("SKILLFS_TEST_FSYNC_DELAY_MS", hold.as_os_str())],
        &[],
    );
    let root = s.root();
    let rounds = || {
        pin_to_cpu0();
        let start = Instant::now();
        for i in 0..200 {
            fs::metadata(root.join("other.md")).unwrap();
            assert_eq!(fs::read(root.join("other.md")).unwrap(), b"read me");
            fs::write(root.join(format!("n{}.md", i % 10)), b"x").unwrap();
            fs::read_dir(&root).unwrap().count();
        }
        (start.elapsed(), Instant::now())
    };
    // What the same calls take with nothing held, on this machine now.
    let (baseline, _) = std::thread::scope(|sc| sc.spawn(rounds).join().unwrap());
    let slow = fs::File::create(root.join("slow.md")).unwrap();
    std::io::Write::write_all(&mut &slow, b"synced").unwrap();
    let fsync_done = std::thread::scope(|sc| {
        let t = sc.spawn(|| {
            pin_to_cpu0();
            let start = Instant::now();
            slow.sync_all().unwrap();
            (start.elapsed(), Instant::now())
        });
        std::thread::sleep(Duration::from_millis(300));
        let (others, others_end) = sc.spawn(rounds).join().unwrap();
        let (fsync, fsync_end) = t.join().unwrap();
        // They ran while the fsync was held, and were not held with it.
        assert!(
            others_end < fsync_end,
            "the other calls ended after the held fsync ({others:?}, baseline {baseline:?})"
        );
        assert!(
            others < baseline * 3 + Duration::from_secs(1),
            "200 rounds of other calls took {others:?} while an fsync was held \
             (baseline {baseline:?})"
        );
        fsync
    });
    assert!(
        fsync_done >= Duration::from_millis(2900),
        "the hook did not hold the fsync ({fsync_done:?})"
    );
}

/// Puts `kernel.io_uring_disabled` back as it was, panicking or not.
struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = fs::write(IO_URING_DISABLED, &self.0);
    }
}

/// The kernel offers io_uring at INIT but this process may not make a
/// ring (`kernel.io_uring_disabled=2`, as a seccomp profile or a sysctl
/// would): the flag is left out of the INIT reply, so the mount serves on
/// the classic transport instead of hanging (the kernel holds every
/// request of a connection that agreed to io_uring until its ring is
/// ready), `status` says why, and `--transport uring` is refused with
/// nothing left mounted.
#[test]
fn a_ring_that_cannot_be_made_leaves_a_classic_mount() {
    let _serial = serial();
    // io_uring is switched off for the whole machine, a moment per mount:
    // no other test mounts meanwhile.
    let _alone = common::alone();
    if !uring_on() {
        eprintln!("the kernel does not offer io_uring here (enable_uring off): nothing to test");
        return;
    }
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("only root may switch kernel.io_uring_disabled: not tested by this user");
        return;
    }
    let Ok(was) = fs::read_to_string(IO_URING_DISABLED) else {
        eprintln!("no {IO_URING_DISABLED} on this kernel: nothing to test");
        return;
    };
    // Off only while a daemon sets its rings up (the whole machine's
    // io_uring is off meanwhile).
    let without_rings = |f: &mut dyn FnMut()| {
        fs::write(IO_URING_DISABLED, "2").expect("as root, io_uring_disabled can be set");
        let _restore = Restore(was.clone());
        f();
    };
    let s = Scratch::new("transport-no-ring");
    let root = s.root();
    {
        let mut m = None;
        without_rings(&mut || m = Some(Manual::mount(&s, &[], &["--transport", "auto"])));
        // Every call answers (a hang here fails the test at the deadline).
        let (tx, rx) = std::sync::mpsc::channel();
        let r = root.clone();
        std::thread::spawn(move || {
            fs::write(r.join("a.md"), b"served").unwrap();
            let _ = tx.send(fs::read(r.join("a.md")).unwrap());
        });
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a mount whose ring could not be made must serve");
        assert_eq!(got, b"served");
        let line = transport_line(&root);
        assert!(
            line.contains("classic") && line.contains("could not be set up"),
            "{line}"
        );
    }
    let mut out = None;
    without_rings(&mut || {
        out = Some(
            Command::new(BIN)
                .args(["mount", root.to_str().unwrap(), "--transport", "uring"])
                .env_remove("HERMES_HOME")
                .output()
                .unwrap(),
        )
    });
    assert_refused(
        &out.unwrap(),
        6,
        &["--transport uring", "could not be set up"],
    );
    assert!(
        !common::is_mounted(&root),
        "a refused mount was left mounted"
    );
}
