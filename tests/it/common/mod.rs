//! Test harness: real mounts in temporary directories, each with a deadline.
//!
//! Rules it enforces: a mount that fails fails the test (never a skip);
//! every mount is detached and its daemon killed when the test ends, even by
//! panic; a watchdog kills the daemon and detaches the mount if the test
//! outlives its deadline, so a hung request turns into an error, not a hung
//! test run. The harness never touches a mount point except through the
//! test's own file operations.

#![allow(dead_code)]

pub mod plain;
pub mod power_loss;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_skillfs");

// What the tests of this binary share, and how none changes it for the
// others. One process: its environment (a daemon's is given per mount,
// `Mount::with_env`, never set here), its umask (a test that needs the
// daemon's umask 0 in-process takes it for its own thread, `own_umask`),
// its panic hook (replaced only to wrap it). One machine: its mounts and
// its switches. A test that changes the machine for every mount (a mount
// namespace, which copies every mount there is and so makes their
// unmounts busy; io_uring switched off) runs `alone()`: every scratch
// directory and every disk a test mounts holds `among_others()` while it
// lives, so such a test starts when no other test has a mount and none
// mounts until it ends.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

thread_local! {
    /// How many `Shared` this thread holds, and the read guard they share
    /// (one per thread: a second read of a lock with a writer waiting
    /// would wait forever).
    static SHARED: std::cell::RefCell<(usize, Option<std::sync::RwLockReadGuard<'static, ()>>)> =
        const { std::cell::RefCell::new((0, None)) };
    /// Whether this thread runs `alone()`.
    static ALONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A test's share of the machine (see `MACHINE`): held by every scratch
/// directory and every disk a test mounts.
pub struct Shared {
    counted: bool,
    /// Counted in the thread that made it: never dropped in another.
    _here: std::marker::PhantomData<std::sync::MutexGuard<'static, ()>>,
}

/// Waits while a test runs `alone()`, then holds it off until dropped.
pub fn among_others() -> Shared {
    if ALONE.get() {
        return Shared {
            counted: false,
            _here: std::marker::PhantomData,
        };
    }
    SHARED.with(|s| {
        let mut s = s.borrow_mut();
        if s.0 == 0 {
            s.1 = Some(MACHINE.read().unwrap_or_else(|e| e.into_inner()));
        }
        s.0 += 1;
    });
    Shared {
        counted: true,
        _here: std::marker::PhantomData,
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.counted {
            SHARED.with(|s| {
                let mut s = s.borrow_mut();
                s.0 -= 1;
                if s.0 == 0 {
                    s.1 = None;
                }
            });
        }
    }
}

/// The machine to this test alone (see `MACHINE`) until dropped: taken
/// before the test makes any scratch directory.
pub struct Alone {
    _guard: std::sync::RwLockWriteGuard<'static, ()>,
}

pub fn alone() -> Alone {
    assert_eq!(
        SHARED.with(|s| s.borrow().0),
        0,
        "alone() is taken before any scratch directory of the test"
    );
    let guard = MACHINE.write().unwrap_or_else(|e| e.into_inner());
    ALONE.set(true);
    Alone { _guard: guard }
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE.set(false);
    }
}

/// Gives this thread a umask of its own and sets it to `mask`: the
/// daemon's umask 0 for a test that drives the core in this process,
/// without changing the umask of the other tests' threads (the threads
/// this one starts share it).
pub fn own_umask(mask: u32) {
    // SAFETY: unshare(CLONE_FS) only copies this thread's filesystem
    // attributes (root, working directory, umask) out of those it shares.
    let r = unsafe { libc::unshare(libc::CLONE_FS) };
    assert_eq!(
        r,
        0,
        "unshare(CLONE_FS): {}",
        std::io::Error::last_os_error()
    );
    unsafe { libc::umask(mask as libc::mode_t) };
}
static COUNTER: AtomicU32 = AtomicU32::new(0);

pub fn skillfs(args: &[&str]) -> Output {
    run_skillfs(args, None, &[])
}

/// [`skillfs`] run under the file mode creation mask `mask`.
pub fn skillfs_umask(args: &[&str], mask: u32) -> Output {
    run_skillfs(args, Some(mask), &[])
}

fn run_skillfs(args: &[&str], umask: Option<u32>, env: &[(String, String)]) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("HERMES_HOME");
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(mask) = umask {
        unsafe {
            cmd.pre_exec(move || {
                libc::umask(mask as libc::mode_t);
                Ok(())
            });
        }
    }
    cmd.output().expect("run skillfs")
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A scratch directory `<tmp>/skillfs-<tag>-<pid>-<n>/` with `skills/` in
/// it, or (`home`) with `home/skills/`, for a mount over the home.
pub struct Scratch {
    pub dir: PathBuf,
    pub home: bool,
    _shared: Shared,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        Scratch::at(&std::env::temp_dir(), tag)
    }

    /// A scratch directory in `parent` (another filesystem, say). With
    /// `SKILLFS_TEST_HOME` set, a home around `skills/` that the harness
    /// mounts with `--versioned skills`: the suites that pass over a skills
    /// directory run again over an agent's home.
    pub fn at(parent: &Path, tag: &str) -> Scratch {
        Scratch::make(parent, tag, std::env::var_os("SKILLFS_TEST_HOME").is_some())
    }

    /// A scratch directory with an agent's home, `home/skills/`.
    pub fn home(tag: &str) -> Scratch {
        Scratch::make(&std::env::temp_dir(), tag, true)
    }

    fn make(parent: &Path, tag: &str, home: bool) -> Scratch {
        let shared = among_others();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = parent.join(format!("skillfs-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = Scratch {
            dir,
            home,
            _shared: shared,
        };
        fs::create_dir_all(s.root()).unwrap();
        s
    }

    /// The versioned root.
    pub fn root(&self) -> PathBuf {
        if self.home {
            self.dir.join("home").join("skills")
        } else {
            self.dir.join("skills")
        }
    }

    /// Where the mount goes: the root, or the home around it.
    pub fn mount_point(&self) -> PathBuf {
        if self.home {
            self.dir.join("home")
        } else {
            self.dir.join("skills")
        }
    }

    pub fn store(&self) -> PathBuf {
        let name = if self.home { "home" } else { "skills" };
        self.dir.join(".skillfs").join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Only when nothing is mounted below it any more.
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        // SKILLFS_KEEP_FAILED keeps a failed test's directory to read.
        let keep = std::thread::panicking() && std::env::var_os("SKILLFS_KEEP_FAILED").is_some();
        if !keep && !mounts.contains(self.dir.to_str().unwrap_or("\0")) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn lazy_unmount(root: &Path) {
    let _ = Command::new("umount").arg("-l").arg(root).output();
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(root)
        .output();
}

/// A bind mount of `dir` at `at`, made before skillfs covers `dir`: a
/// route to the underlying directory, behind the daemon. Detached when
/// dropped (declare it after the `Mount`, so that it goes first).
pub struct BindMount(pub PathBuf);

impl BindMount {
    pub fn new(dir: &Path, at: &Path) -> BindMount {
        fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .arg("--bind")
            .arg(dir)
            .arg(at)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "bind mount: {}", describe(&out));
        BindMount(at.to_path_buf())
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        lazy_unmount(&self.0);
    }
}

/// Asserts that nothing is at `p` (following a symlink, as `exists()`):
/// the answer must be ENOENT. `!p.exists()` also passes on a dead mount
/// (ENOTCONN) or a refused permission, which would hide the failure.
#[track_caller]
pub fn assert_enoent(p: impl AsRef<Path>) {
    let p = p.as_ref();
    match fs::metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => panic!("{} should not exist, but: {other:?}", p.display()),
    }
}

pub fn is_mounted(root: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let needle = format!(" {} ", root.display());
    mounts
        .lines()
        .any(|l| l.contains(&needle) && l.contains("skillfs:"))
}

pub fn daemon_pid(store: &Path) -> Option<u32> {
    fs::read_to_string(store.join("LOCK"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Waits until nothing holds the store's lock: the flock on LOCK is
/// released when a dying daemon's files are (so the kernel has aborted its
/// connection: every access to its mount fails with ENOTCONN).
pub fn wait_unlocked(store: &Path) {
    let lock = fs::File::open(store.join("LOCK")).unwrap();
    let t = Instant::now();
    while unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&lock),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } != 0
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the daemon of {} did not die",
            store.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Running, not a zombie (our daemons are reparented to a PID 1 that may
/// reap them late).
pub fn pid_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// A mounted skillfs over `scratch.root()`.
pub struct Mount {
    pub scratch: Scratch,
    pub pid: u32,
    pub extra_args: Vec<String>,
    /// The umask `skillfs mount` runs under (the test's own if `None`).
    pub umask: Option<u32>,
    /// What `skillfs mount`, and so the daemon, gets in its environment
    /// beside this process's.
    pub env: Vec<(String, String)>,
    done: Arc<AtomicBool>,
}

impl Mount {
    /// Mounts over an empty `skills/`.
    pub fn new(tag: &str) -> Mount {
        Mount::with_tree(tag, |_| {})
    }

    /// Fills `skills/` with `setup` first (an "offline" tree), then mounts.
    pub fn with_tree(tag: &str, setup: impl FnOnce(&Path)) -> Mount {
        let scratch = Scratch::new(tag);
        setup(&scratch.root());
        Mount::over(scratch, Vec::new())
    }

    /// [`Mount::with_tree`], the daemon started with `env` in its
    /// environment (for this mount alone: the other tests' daemons start
    /// from this process too).
    pub fn with_env(tag: &str, env: &[(&str, &str)], setup: impl FnOnce(&Path)) -> Mount {
        let scratch = Scratch::new(tag);
        setup(&scratch.root());
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Mount::start(scratch, Vec::new(), None, env)
    }

    pub fn over(scratch: Scratch, extra_args: Vec<String>) -> Mount {
        Mount::over_umask(scratch, extra_args, None)
    }

    /// [`Mount::over`], with `skillfs mount` run under `umask`.
    pub fn over_umask(scratch: Scratch, extra_args: Vec<String>, umask: Option<u32>) -> Mount {
        Mount::start(scratch, extra_args, umask, Vec::new())
    }

    fn start(
        scratch: Scratch,
        extra_args: Vec<String>,
        umask: Option<u32>,
        env: Vec<(String, String)>,
    ) -> Mount {
        let mut m = Mount {
            scratch,
            pid: 0,
            extra_args,
            umask,
            env,
            done: Arc::new(AtomicBool::new(false)),
        };
        m.mount();
        m.start_watchdog(Duration::from_secs(240));
        m
    }

    /// The guard of a mount made by other means (another binary, say):
    /// its daemon found from the store, the deadline and cleanup as for
    /// any other.
    pub fn adopt(scratch: Scratch) -> Mount {
        let m = Mount {
            pid: daemon_pid(&scratch.store()).expect("daemon pid in LOCK"),
            scratch,
            extra_args: Vec::new(),
            umask: None,
            env: Vec::new(),
            done: Arc::new(AtomicBool::new(false)),
        };
        assert!(is_mounted(&m.mount_point()));
        m.start_watchdog(Duration::from_secs(240));
        m
    }

    pub fn root(&self) -> PathBuf {
        self.scratch.root()
    }

    /// The mount point (the home around the root for a mount over one).
    pub fn mount_point(&self) -> PathBuf {
        self.scratch.mount_point()
    }

    /// The store: `--store` of the extra arguments, else the default one.
    pub fn store(&self) -> PathBuf {
        match self.extra_args.iter().position(|a| a == "--store") {
            Some(i) => PathBuf::from(&self.extra_args[i + 1]),
            None => self.scratch.store(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    fn mount(&mut self) {
        let root = self.mount_point();
        let mut args: Vec<String> = vec!["mount".into(), root.display().to_string()];
        if self.scratch.home {
            args.extend(["--versioned".into(), "skills".into()]);
        }
        args.extend(self.extra_args.iter().cloned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_skillfs(&argv, self.umask, &self.env);
        assert!(
            out.status.success(),
            "mount of {} failed (a mount that fails is a test failure):\n{}",
            root.display(),
            describe(&out)
        );
        assert!(
            is_mounted(&root),
            "mount reported ready but {} is not mounted",
            root.display()
        );
        self.pid = daemon_pid(&self.store()).expect("daemon pid in LOCK");
    }

    fn start_watchdog(&self, deadline: Duration) {
        let done = Arc::clone(&self.done);
        let root = self.mount_point();
        let store = self.store();
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < deadline {
                if done.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!(
                "deadline of {deadline:?} passed: killing the daemon of {}",
                root.display()
            );
            if let Some(pid) = daemon_pid(&store) {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            lazy_unmount(&root);
        });
    }

    /// `skillfs umount`, asserting it succeeds and the daemon is gone.
    /// (Busy, exit 9, is tried again for a few seconds: another test's
    /// child, between its fork and its exec, holds copies of every open
    /// file of this process for a moment.)
    pub fn umount(&mut self) {
        self.umount_within(Duration::from_secs(5));
    }

    /// `skillfs umount` as a user runs it while a writer comes and goes:
    /// again while it says busy (exit 9), then as [`Mount::umount`].
    pub fn umount_when_quiet(&mut self) {
        self.umount_within(Duration::from_secs(30));
    }

    fn umount_within(&mut self, limit: Duration) {
        let root = self.mount_point().display().to_string();
        let t = Instant::now();
        let out = loop {
            let out = skillfs(&["umount", &root]);
            if out.status.code() != Some(9) || t.elapsed() > limit {
                break out;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(out.status.success(), "umount failed:\n{}", describe(&out));
        assert!(!is_mounted(&self.mount_point()));
        let t = Instant::now();
        while pid_alive(self.pid) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !pid_alive(self.pid),
            "daemon {} still running after umount",
            self.pid
        );
    }

    pub fn remount(&mut self) {
        self.mount();
    }

    /// SIGKILL the daemon and detach its dead mount.
    pub fn kill9(&mut self) {
        self.kill_daemon();
        self.detach();
    }

    /// SIGKILL the daemon and wait until its files are closed (so the
    /// kernel has aborted the connection: every access to the mount now
    /// fails with ENOTCONN). The dead mount stays attached.
    pub fn kill_daemon(&mut self) {
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        wait_unlocked(&self.store());
    }

    /// Lazily detach the (dead) mount.
    pub fn detach(&mut self) {
        lazy_unmount(&self.mount_point());
    }

    /// The journal as `skillfs log --json` prints it.
    pub fn log(&self) -> Vec<serde_json::Value> {
        let root = self.root().display().to_string();
        let out = skillfs(&["log", "--json", "--root", &root]);
        assert!(out.status.success(), "log failed:\n{}", describe(&out));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).expect("log line is JSON"))
            .collect()
    }

    /// The log once `done` holds of it, read again for up to 10 s: the
    /// kernel sends a file's last release after `close` returned, so the
    /// version it publishes may land a moment later.
    pub fn log_when(&self, done: impl Fn(&[serde_json::Value]) -> bool) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if done(&log) || Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn ops_for(&self, path: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|r| r["path"] == path || r["to"] == path)
            .map(|r| r["op"].as_str().unwrap().to_string())
            .collect()
    }

    /// Bytes of a blob in the store (loose or packed), checked against
    /// its hash where packed.
    pub fn blob(&self, id: &str) -> Vec<u8> {
        let store = self.store();
        let io = skillfs::store::durable::StoreIo::real();
        skillfs::store::blobs::BlobStore::open_path(&store.join("blobs"), io)
            .expect("blob store opens")
            .read(id)
            .expect("blob exists")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if is_mounted(&self.mount_point()) {
            // The test may have remounted behind our back: ask the store.
            let pid = daemon_pid(&self.store()).unwrap_or(self.pid);
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            lazy_unmount(&self.mount_point());
        } else if let Some(pid) = daemon_pid(&self.store()).filter(|&p| pid_alive(p)) {
            // Detached by the test (a lazy unmount): its daemon is still
            // ending, writing to its store. Waited for (a while), so that
            // the scratch directory is removed whole after it.
            let t = Instant::now();
            while pid_alive(pid) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A seed from `var` if set (to replay a failure), else from the clock;
/// printed either way. Never 0 (xorshift needs a non-zero state).
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    eprintln!("{var}={seed}");
    seed
}

/// xorshift64*: reproducible from a seed (see `seed`), never 0.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.range(0, n as u64) as usize
    }

    pub fn pick<'a, T: ?Sized>(&mut self, from: &[&'a T]) -> &'a T {
        from[self.below(from.len())]
    }
}

/// The names in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// `renameat2(2)` with flags (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
pub fn renameat2(a: &Path, b: &Path, flags: u32) -> std::io::Result<()> {
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cpath(a).as_ptr(),
            libc::AT_FDCWD,
            cpath(b).as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `p` as a C string, for calling libc directly.
pub fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// A command refused as docs/commands.md's error rule says: exit `code`, one
/// line on stderr that starts `skillfs: ` and holds each of `words`.
pub fn assert_refused(out: &Output, code: i32, words: &[&str]) {
    assert_eq!(out.status.code(), Some(code), "{}", describe(out));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("skillfs: "), "{err}");
    for w in words {
        assert!(lines[0].contains(w), "'{w}' missing from: {err}");
    }
}

/// What skillfs does to a file with hard links made offline before one of
/// its names is changed, done to a plain directory: the name `p` gets a
/// copy of its own (bytes, mode and times), renamed over it, and the other
/// names keep the old inode. Nothing for a file with one link.
pub fn split_link(p: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(m) = fs::symlink_metadata(p) else {
        return;
    };
    if !m.is_file() || m.nlink() < 2 {
        return;
    }
    let tmp = p.with_file_name(".split-link");
    fs::copy(p, &tmp).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(m.mode() & 0o7777)).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: m.atime(),
            tv_nsec: m.atime_nsec(),
        },
        libc::timespec {
            tv_sec: m.mtime(),
            tv_nsec: m.mtime_nsec(),
        },
    ];
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, cpath(&tmp).as_ptr(), ts.as_ptr(), 0) },
        0
    );
    fs::rename(&tmp, p).unwrap();
}

/// `cp -a` of a directory (the test's own copy, never through a mount).
pub fn copy_dir(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

/// Where the symlink at `rel` of the plain tree at `root` leads, walked as
/// skillfs's `follow::seen` walks it (relative targets only, `..` never
/// above the root, at most 40 links): `None` when it leads to or through
/// an entry `hidden(dir, name, type)` calls hidden, to a missing name that
/// `hidden_name` calls hidden, or to `.history`; else the kind it ends at:
/// 'd', 'f', or 'l' when that is not known (nowhere, outside, a loop).
pub fn link_end(
    root: &Path,
    rel: &str,
    hidden: &dyn Fn(&Path, &str, fs::FileType) -> bool,
    hidden_name: &dyn Fn(&str) -> bool,
) -> Option<char> {
    let Ok(target) = fs::read_link(root.join(rel)) else {
        return Some('l');
    };
    let mut at: Vec<String> = Path::new(rel)
        .parent()
        .map(|d| d.iter().map(|c| c.to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let split = |t: &Path| -> Vec<String> {
        t.to_string_lossy()
            .split('/')
            .rev()
            .map(str::to_string)
            .collect()
    };
    if target.is_absolute() {
        return Some('l');
    }
    let mut todo = split(&target);
    let mut links = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                if at.pop().is_none() {
                    return Some('l');
                }
                continue;
            }
            _ => {}
        }
        let dir = root.join(at.join("/"));
        if dir.join(&c) == root.join(rel) {
            return Some('l'); // back to itself: a loop
        }
        if c == ".history" {
            return None; // the history tree
        }
        let Ok(m) = fs::symlink_metadata(dir.join(&c)) else {
            // Missing: judged by the name it would have.
            return if hidden_name(&c) { None } else { Some('l') };
        };
        if hidden(&dir, &c, m.file_type()) {
            return None;
        }
        if m.file_type().is_symlink() {
            links += 1;
            match fs::read_link(dir.join(&c)) {
                Ok(t) if links <= 40 && !t.is_absolute() => todo.extend(split(&t)),
                _ => return Some('l'),
            }
        } else if m.is_dir() {
            at.push(c);
        } else if todo.iter().all(|c| c.is_empty() || c == ".") {
            return Some('f');
        } else {
            return Some('l');
        }
    }
    Some('d')
}

/// Sets the access and modification times of `p` (not following a
/// symlink) to `secs`.`nsec`.
pub fn set_mtime(p: &Path, secs: i64, nsec: i64) {
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: nsec,
    };
    let c = cpath(p);
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

/// Bytes no compressor shrinks: a large content stored as they are (its
/// chunks are plain entries of a pack, where `damage_stored` finds them).
/// (Not every test binary uses it.)
#[allow(unused_imports)]
pub use skillfs_store::fixtures::noise;

/// Flips one byte of the stored copy of `content` (made with `noise`) near
/// `at`, wherever the store at `store` keeps it; returns that file.
pub fn damage_stored(store: &Path, content: &[u8], at: usize) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let sample = &content[at..at + 64];
    let mut dirs = vec![store.join("blobs")];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let mut raw = fs::read(&p).unwrap();
            if let Some(i) = raw.windows(sample.len()).position(|w| w == sample) {
                raw[i + 32] ^= 0x08;
                fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
                fs::write(&p, &raw).unwrap();
                return p;
            }
        }
    }
    panic!("no stored copy of the content in {}", store.display());
}

/// The interpreter of a venv holding the real agent (`hermes-agent` from
/// PyPI), as `scripts/test.sh` makes it. Required under CI; elsewhere a
/// run without it says so and does not pretend to pass.
pub fn agent_python() -> Option<String> {
    match std::env::var("SKILLFS_HERMES_PYTHON") {
        Ok(p) => Some(p),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("SKILLFS_HERMES_PYTHON is not set: scripts/test.sh installs the agent for CI")
        }
        Err(_) => {
            eprintln!("SKIPPED: SKILLFS_HERMES_PYTHON not set (scripts/test.sh sets it)");
            None
        }
    }
}

/// A small ext4 image, mounted on a loop device, that the test fills.
pub struct SmallDisk {
    pub dir: PathBuf,
    pub mnt: PathBuf,
    _shared: Shared,
}

impl SmallDisk {
    /// `None` only where loop mounts cannot be had (not root); in CI, as
    /// root, a failure to make one fails the test.
    pub fn new(tag: &str, mib: u32) -> Option<SmallDisk> {
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "CI runs as root");
            eprintln!("skipped: a loop mount needs root");
            return None;
        }
        let shared = among_others();
        let dir = std::env::temp_dir().join(format!("skillfs-disk-{tag}-{}", std::process::id()));
        let mnt = dir.join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        let img = dir.join("img");
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{}", describe(&out));
        };
        run(Command::new("truncate")
            .arg("-s")
            .arg(format!("{mib}M"))
            .arg(&img));
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt));
        Some(SmallDisk {
            dir,
            mnt,
            _shared: shared,
        })
    }

    pub fn fill(&self, name: &str) {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.mnt.join(name))
            .unwrap();
        for bs in [1 << 16, 1 << 10, 1] {
            let buf = vec![0u8; bs];
            while std::io::Write::write_all(&mut f, &buf).is_ok() {}
        }
    }

    /// Gives back the room `fill` took.
    pub fn free(&self, name: &str) {
        fs::remove_file(self.mnt.join(name)).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Runs `skillfs ARGS`, killed if it outlives `limit`: its output and how
/// long it took, or `None` when it had to be killed.
pub fn within(args: &[&str], limit: Duration) -> Option<(std::process::Output, Duration)> {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("HERMES_HOME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((child.wait_with_output().unwrap(), t.elapsed()))
}

/// A bare git repository made at `path` (a remote for the sync tests).
pub fn bare_repo(path: &Path) {
    let out = Command::new("git")
        .args(["init", "--bare", "--quiet"])
        .arg(path)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "{}", describe(&out));
}
