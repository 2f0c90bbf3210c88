//! Mounting and unmounting: the checks before a mount, the background
//! daemon, its readiness report and its clean shutdown.
//!
//! Invariants: every check that can refuse a mount runs before anything in
//! ROOT or an existing store is changed; the daemon never touches the mount
//! point by path once mounted (only the root fd opened before); `mount`
//! without `--foreground` returns only once the mount is ready (exit 0) or
//! has failed (the daemon's one-line reason and exit code).
//! The journal is read once per mount, by `prepare`, before anything is
//! created; the ledger starts from that read (see `journal::Contents::
//! is_current`). Store errors become exit codes through `error::Failure`.
//!
//! Locks: the store's flock (`StoreLock`), held for the daemon's life; the
//! signal and sweep threads reach the core's locks only through `SkillFs`.

// A daemon that panics on a failed call takes the mount down with it: it
// answers the error instead (tests may unwrap; see clippy.toml).
#![deny(clippy::unwrap_used)]

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Exit, Failure};
use crate::fs::{SkillFs, StoreDirs};
use crate::hide::{Config, HideRules, RuleArgs};
use crate::ledger::Ledger;
use crate::relpath::RelPath;
use crate::scan::{Areas, Settler, tend_parked};
use crate::store::blobs::BlobStore;
use crate::store::journal::{self, Journal};
use crate::store::journal::{Actor, Op};
use crate::store::{self, Layout, StoreLock, fsutil};

const READY_FD_ENV: &str = "SKILLFS_READY_FD";
/// Our mounts are told apart by their source, `skillfs:<store dir>` (the
/// fs type is `fuse` or `fuse.skillfs` depending on how it was mounted).
pub const SOURCE_PREFIX: &str = "skillfs:";

pub struct MountArgs {
    pub root: PathBuf,
    pub store: Option<PathBuf>,
    pub foreground: bool,
    pub threads: usize,
    /// Other users may enter the mount (see `fuse::mount`).
    pub allow_other: bool,
    pub rules: RuleArgs,
}

/// `ROOT` made absolute without touching ROOT itself (a dead mount answers
/// every access to it with ENOTCONN): only its parent is resolved.
pub fn absolute_root(root: &Path) -> Result<PathBuf, Failure> {
    let abs = if root.is_absolute() {
        root.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| {
                Failure::new(
                    Exit::BadRoot,
                    format!("could not read the current directory: {e}"),
                )
            })?
            .join(root)
    };
    let mut cur = abs;
    // Follow a symlinked ROOT by reading the link (in its parent), never by
    // resolving ROOT itself.
    for _ in 0..40 {
        let Some(name) = cur.file_name().map(|n| n.to_os_string()) else {
            // `/` or a path ending in `..`: nothing of it can be our mount.
            return cur
                .canonicalize()
                .map_err(|e| Failure::io(Exit::BadRoot, "resolve ROOT", &cur, &e));
        };
        let parent = cur.parent().unwrap_or(Path::new("/"));
        let parent = parent
            .canonicalize()
            .map_err(|e| Failure::io(Exit::BadRoot, "resolve the parent of ROOT", parent, &e))?;
        let joined = parent.join(&name);
        match fs::symlink_metadata(&joined) {
            Ok(md) if md.file_type().is_symlink() => {
                let target = fs::read_link(&joined)
                    .map_err(|e| Failure::io(Exit::BadRoot, "read the link", &joined, &e))?;
                cur = parent.join(target);
            }
            _ => return Ok(joined),
        }
    }
    Err(Failure::new(
        Exit::BadRoot,
        format!(
            "ROOT '{}': too many levels of symbolic links",
            root.display()
        ),
    ))
}

/// One line of `/proc/self/mountinfo`: mount point, fs type, source.
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: PathBuf,
}

fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

pub fn mounts() -> Vec<MountInfo> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < sep + 3 || fields.len() < 5 {
            continue;
        }
        out.push(MountInfo {
            mount_point: PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(
                &unescape_mountinfo(fields[4]),
            ))),
            fstype: fields[sep + 1].to_string(),
            source: PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(
                &unescape_mountinfo(fields[sep + 2]),
            ))),
        });
    }
    out
}

/// The mount at exactly `root`, the last one if several are stacked.
pub fn mount_at(root: &Path) -> Option<MountInfo> {
    mounts().into_iter().rfind(|m| m.mount_point == root)
}

impl MountInfo {
    /// The store of a skillfs mount; `None` for any other mount.
    pub fn skillfs_store(&self) -> Option<PathBuf> {
        let s = self
            .source
            .as_os_str()
            .as_bytes()
            .strip_prefix(SOURCE_PREFIX.as_bytes())?;
        self.fstype
            .starts_with("fuse")
            .then(|| PathBuf::from(std::ffi::OsStr::from_bytes(s)))
    }
}

/// Runs `skillfs mount`.
pub fn mount(args: MountArgs) -> Result<(), Failure> {
    if args.foreground {
        return run_daemon(args, ready_pipe());
    }
    spawn_daemon(&args)
}

/// The pipe our parent `skillfs mount` reads the readiness report from.
/// The variable is taken out of the environment (nothing we start inherits
/// it), and only an open pipe above stderr is taken: a stray or hostile
/// value never makes us own, and later close, stdin, stdout, stderr or a
/// file.
fn ready_pipe() -> Option<File> {
    let value = std::env::var(READY_FD_ENV).ok();
    // SAFETY: called before the daemon starts any thread.
    unsafe { std::env::remove_var(READY_FD_ENV) };
    let fd = value?.parse::<i32>().ok().filter(|fd| *fd > 2)?;
    let mut st = crate::sys::empty_stat();
    // SAFETY: fcntl and fstat only inspect the fd number.
    let open =
        unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 && unsafe { libc::fstat(fd, &mut st) } == 0;
    if !open || st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return None;
    }
    // SAFETY: an open pipe passed to us by our parent for this report;
    // nothing else in this process owns it.
    Some(unsafe { File::from_raw_fd(fd) })
}

fn spawn_daemon(args: &MountArgs) -> Result<(), Failure> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is the array of two ints pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Failure::new(
            Exit::Internal,
            format!("could not create a pipe: {}", io::Error::last_os_error()),
        ));
    }
    // SAFETY: pipe2 succeeded: both fds are open, and nothing else owns them.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            Exit::Internal,
            format!("could not find the skillfs binary: {e}"),
        )
    })?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg(&args.root).arg("--foreground");
    cmd.arg("--threads").arg(args.threads.to_string());
    if args.allow_other {
        cmd.arg("--allow-other");
    }
    if let Some(s) = &args.store {
        cmd.arg("--store").arg(s);
    }
    let r = &args.rules;
    for (flag, values) in [
        ("hide", &r.hide),
        ("show", &r.show),
        ("untracked", &r.untracked),
        ("tracked", &r.tracked),
    ] {
        for v in values {
            cmd.arg(format!("--{flag}={v}"));
        }
    }
    if let Some(a) = &r.park_max_age {
        cmd.arg("--park-max-age").arg(a);
    }
    if r.allow_short_park_max_age {
        cmd.arg("--allow-short-park-max-age");
    }
    cmd.env(READY_FD_ENV, wr.as_raw_fd().to_string());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let wr_raw = wr.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only setsid and fcntl,
    // which are async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            // Leave the caller's session and terminal; keep the ready pipe.
            libc::setsid();
            let flags = libc::fcntl(wr_raw, libc::F_GETFD);
            libc::fcntl(wr_raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure::new(Exit::Internal, format!("could not start the daemon: {e}")))?;
    drop(wr);
    let mut msg = String::new();
    let _ = File::from(rd).read_to_string(&mut msg);
    let line = msg.lines().next().unwrap_or("").to_string();
    if line == "ok" {
        return Ok(());
    }
    let status = child.wait().ok();
    if let Some(rest) = line.strip_prefix("err ") {
        let (code, text) = rest.split_once(' ').unwrap_or(("1", rest));
        let exit = match code {
            "3" => Exit::BadRoot,
            "4" => Exit::BadStore,
            "5" => Exit::DamagedJournal,
            "6" => Exit::MountRefused,
            "7" => Exit::BadRules,
            _ => Exit::Internal,
        };
        return Err(Failure::new(exit, text));
    }
    Err(Failure::new(
        Exit::Internal,
        format!(
            "the daemon exited ({status:?}) before the mount was ready; see its log in the store"
        ),
    ))
}

/// A core ready to serve, its store locked (see `crate::core`).
pub(crate) struct Prepared {
    root: PathBuf,
    layout: Layout,
    repaired: Vec<fsutil::Repair>,
    _lock: StoreLock,
    pub(crate) fs: Arc<SkillFs>,
}

/// The store directory for `root` (not created), made absolute.
pub fn store_dir(root: &Path, store: Option<&Path>) -> Result<PathBuf, Failure> {
    match store {
        Some(s) => {
            if s.is_absolute() {
                Ok(s.to_path_buf())
            } else {
                Ok(std::env::current_dir()
                    .map_err(|e| {
                        Failure::new(
                            Exit::BadStore,
                            format!("could not read the current directory: {e}"),
                        )
                    })?
                    .join(s))
            }
        }
        None => Layout::default_dir(root).ok_or_else(|| {
            Failure::new(
                Exit::BadRoot,
                format!("ROOT '{}' has no parent to keep a store in", root.display()),
            )
        }),
    }
}

/// The deepest existing ancestor of `p` (canonical), and the rest of `p`.
fn existing_ancestor(p: &Path) -> (PathBuf, PathBuf) {
    let mut cur = p.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = cur.canonicalize() {
            let mut tail = PathBuf::new();
            for r in rest.iter().rev() {
                tail.push(r);
            }
            return (c, tail);
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(n), Some(par)) => {
                rest.push(n);
                cur = par.to_path_buf();
            }
            _ => return (PathBuf::from("/"), PathBuf::new()),
        }
    }
}

fn check_root(root: &Path) -> Result<(), Failure> {
    match fs::metadata(root) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => {
            return Err(Failure::new(
                Exit::BadRoot,
                format!("ROOT '{}' is not a directory", root.display()),
            ));
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(Failure::new(
                Exit::BadRoot,
                format!(
                    "ROOT '{}' is a mount whose daemon died; run `skillfs umount {}` first",
                    root.display(),
                    root.display()
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Failure::new(
                Exit::BadRoot,
                format!("ROOT '{}' does not exist", root.display()),
            ));
        }
        Err(e) => return Err(Failure::io(Exit::BadRoot, "stat ROOT", root, &e)),
    }
    if let Some(m) = mount_at(root)
        && m.fstype.starts_with("fuse")
    {
        return Err(Failure::new(
            Exit::BadRoot,
            format!(
                "ROOT '{}' is already mounted ({}, from {})",
                root.display(),
                m.fstype,
                m.source.display()
            ),
        ));
    }
    Ok(())
}

/// Refuses nested mounts: ROOT inside a skillfs mount (its store would be
/// in the outer tree, and every write versioned twice), a skillfs mount
/// inside ROOT (the scan would read it through its daemon), and a store
/// inside a skillfs mount.
fn check_nesting(root: &Path, store: &Path) -> Result<(), Failure> {
    for m in mounts() {
        if m.skillfs_store().is_none() || m.mount_point == root {
            continue;
        }
        let mp = &m.mount_point;
        let why = if root.starts_with(mp) {
            (
                Exit::BadRoot,
                format!(
                    "ROOT '{}' is inside the skillfs mount '{}': mount only the outer one",
                    root.display(),
                    mp.display()
                ),
            )
        } else if mp.starts_with(root) {
            (
                Exit::BadRoot,
                format!(
                    "ROOT '{}' holds the skillfs mount '{}': unmount that one first",
                    root.display(),
                    mp.display()
                ),
            )
        } else if store.starts_with(mp) {
            (
                Exit::BadStore,
                format!(
                    "store '{}' is inside the skillfs mount '{}': it would be versioned there",
                    store.display(),
                    mp.display()
                ),
            )
        } else {
            continue;
        };
        return Err(Failure::new(why.0, why.1));
    }
    Ok(())
}

pub(crate) fn prepare(args: &MountArgs) -> Result<Prepared, Failure> {
    let root = absolute_root(&args.root)?;
    check_root(&root)?;
    let root = root
        .canonicalize()
        .map_err(|e| Failure::io(Exit::BadRoot, "resolve ROOT", &root, &e))?;
    let wanted = store_dir(&root, args.store.as_deref())?;
    let (anc, tail) = existing_ancestor(&wanted);
    let store_path = if tail.as_os_str().is_empty() {
        anc.clone()
    } else {
        anc.join(&tail)
    };
    check_nesting(&root, &store_path)?;
    store::check_placement(&root, &store_path, &anc)?;
    if store_path.as_os_str().as_bytes().contains(&b',') {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "store path '{}' contains ',', which mount options cannot carry",
                store_path.display()
            ),
        ));
    }
    let layout = Layout::new(store_path.clone());
    // A store another user can reach, bad rules, a damaged journal and a
    // store of another root are refused before anything is created,
    // repaired or locked.
    StoreLock::refuse_if_held(&layout)?;
    let uid = crate::sys::geteuid();
    let mut repairs = fsutil::audit_parent(&store_path, &anc, uid)?;
    if fs::symlink_metadata(&store_path).is_ok() {
        repairs.extend(fsutil::audit(&store_path, uid)?);
    }
    let config = Config::load(&layout.dir)?;
    let rules = HideRules::build(&config, &args.rules)?;
    // The journal is read once, here: a damaged one refuses the mount
    // before anything exists, and what was read is what the ledger starts
    // from (a new store's, made below, is read there).
    let read = if layout.journal().is_dir() {
        Some(journal::read_dir(&layout.journal())?)
    } else {
        None
    };
    let root_id = store::RootId::of(&root)?;
    let root_id_stale = root_id.check(&layout)?;
    fsutil::repair(&repairs)?;
    layout.create()?;
    store::check_placement(&root, &store_path, &store_path)?;
    let lock = StoreLock::acquire(&layout)?;
    if root_id_stale {
        root_id.write(&layout)?;
    }
    // A daemon that came and went between the read and the lock changed
    // the journal: then (only then) it is read again, under the lock.
    let contents = match read {
        Some(contents) if contents.is_current() => contents,
        _ => journal::read_dir(&layout.journal())?,
    };
    layout.clear_scratch()?;
    let journal = Journal::open(&contents)?;
    let mut ledger = Ledger::new(journal, &contents.records);
    let blobs = BlobStore::new(layout.blobs(), layout.tmp());

    let open_dir = |p: &Path, exit: Exit| {
        crate::sys::openat(
            libc::AT_FDCWD,
            p.as_os_str().as_bytes(),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map(OwnedFd::from)
        .map_err(|e| Failure::io(exit, "open", p, &e))
    };
    let root_fd = open_dir(&root, Exit::BadRoot)?;
    let parked_fd = open_dir(&layout.parked(), Exit::BadStore)?;
    let orphans_fd = open_dir(&layout.orphans(), Exit::BadStore)?;

    let started = Instant::now();
    let areas = Areas {
        root_fd: root_fd.as_raw_fd(),
        parked_fd: parked_fd.as_raw_fd(),
        orphans_fd: orphans_fd.as_raw_fd(),
    };
    let report = {
        let mut settler = Settler::new(areas, &rules, &mut ledger, &blobs, Actor::daemon());
        let scanned = settler
            .settle(&RelPath::root(), Op::Scan, false, false, None)
            .and_then(|()| settler.record_removals())
            .and_then(|()| tend_parked(&mut settler, crate::time::now_ns()));
        scanned.map_err(|e| Failure::new(Exit::BadRoot, format!("scan of ROOT failed: {e}")))?;
        settler.report
    };
    ledger
        .sync(&blobs)
        .map_err(|e| Failure::new(Exit::BadStore, format!("could not sync the journal: {e}")))?;
    tracing::info!(
        "scan of {}: {report:?} in {:?}",
        root.display(),
        started.elapsed()
    );
    let rules_text = format!(
        "hidden: {}\nuntracked: {}\n",
        rules.describe().join("  "),
        rules.describe_untracked().join("  ")
    );
    fsutil::replace_file(&layout.rules(), rules_text.as_bytes())
        .map_err(|e| Failure::io(Exit::BadStore, "write", &layout.rules(), &e))?;
    let dirs = StoreDirs {
        staging: layout.staging(),
        tmp: layout.tmp(),
        parked_fd,
        orphans_fd,
    };
    let fs = SkillFs::new(root_fd, dirs, rules, blobs, ledger)
        .map_err(|e| Failure::new(Exit::BadRoot, format!("could not stat ROOT: {e:?}")))?;
    Ok(Prepared {
        root,
        layout,
        repaired: repairs,
        _lock: lock,
        fs: Arc::new(fs),
    })
}

fn report_ready(ready: &mut Option<File>, msg: &str) {
    if let Some(f) = ready.as_mut() {
        let _ = f.write_all(msg.as_bytes());
    }
    *ready = None;
}

fn run_daemon(args: MountArgs, mut ready: Option<File>) -> Result<(), Failure> {
    // Modes arrive from the kernel with the caller's umask applied already.
    crate::sys::umask(0);
    // Every file the agent holds open is a descriptor here too (and the
    // janitor holds some briefly): take what the hard limit allows.
    // SAFETY: `rlimit` is plain integers (all zeros is valid), and `lim` is a valid one to read
    // and write.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    // Before any thread starts: only the signal thread may take them.
    block_signals();
    let background = ready.is_some();
    let prepared = match prepare(&args) {
        Ok(p) => p,
        Err(f) => {
            report_ready(
                &mut ready,
                &format!("err {} {}\n", f.exit as i32, f.message),
            );
            return Err(f);
        }
    };
    if background {
        redirect_stderr(&prepared.layout.log());
    }
    for r in &prepared.repaired {
        tracing::warn!("{r}");
    }

    let fsname = format!("{SOURCE_PREFIX}{}", prepared.layout.dir.display());
    let session = crate::fuse::mount(
        Arc::clone(&prepared.fs),
        &prepared.root,
        &fsname,
        args.threads,
        args.allow_other,
    );
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            let f = Failure::new(
                Exit::MountRefused,
                format!("could not mount on '{}': {e}", prepared.root.display()),
            );
            report_ready(
                &mut ready,
                &format!("err {} {}\n", f.exit as i32, f.message),
            );
            return Err(f);
        }
    };
    let root = prepared.root.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || wait_for_signal_and_unmount(&root))
        .map_err(|e| {
            Failure::new(
                Exit::Internal,
                format!("could not start the signal thread: {e}"),
            )
        })?;
    tracing::info!(
        "mounted {} (store {})",
        prepared.root.display(),
        prepared.layout.dir.display()
    );
    start_sweeper(Arc::clone(&prepared.fs));
    // What the start-up logged (repairs, the scan) is in the log before
    // `mount` returns.
    crate::logging::flush();
    report_ready(&mut ready, "ok\n");
    let result = session.run();
    // `destroy` has published and synced; make sure of it for the paths
    // where the kernel never sent DESTROY (connection aborted).
    prepared.fs.shutdown();
    tracing::info!("unmounted {}", prepared.root.display());
    result.map_err(|e| Failure::new(Exit::Internal, format!("session ended with an error: {e}")))
}

/// Sweeps old parks while mounted, every quarter of the park age (at least
/// every second, at most every hour), so a long-lived mount keeps no park
/// longer than a remount would.
fn start_sweeper(fs: Arc<SkillFs>) {
    let age = Duration::from_nanos(fs.rules().park_max_age_ns.max(0) as u64);
    let every = (age / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    let spawned = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                match fs.sweep() {
                    Ok(r) if r.swept > 0 || r.recorded > 0 => tracing::info!("sweep: {r:?}"),
                    Ok(_) => {}
                    Err(e) => tracing::error!("sweep: {e:?}"),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start the sweep thread: {e}");
    }
}

fn redirect_stderr(log: &Path) {
    if let Ok(f) = fsutil::open_append(log) {
        // SAFETY: both fds are open (`f` lives across the call); dup2 replaces fd 2 atomically.
        unsafe { libc::dup2(f.as_raw_fd(), 2) };
    }
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: `sigset_t` is plain data, for which all zeros is a valid value, and `set` is
    // initialised by sigemptyset before it is added to.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Blocks the shutdown signals in this thread and every thread started
/// after it, so only the signal thread receives them.
fn block_signals() {
    let set = signal_set();
    // SAFETY: `set` is an initialised signal set; the old mask is not asked for (null).
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

fn wait_for_signal_and_unmount(root: &Path) {
    let set = signal_set();
    let mut sig = 0;
    // SAFETY: `set` is an initialised signal set and `sig` a valid int to write.
    unsafe { libc::sigwait(&set, &mut sig) };
    tracing::info!("signal {sig}: unmounting {}", root.display());
    if let Err(e) = lazy_unmount(root) {
        tracing::error!("could not unmount {}: {e}", root.display());
    }
}

/// Detaches the mount at `root` now; the daemon keeps serving files still
/// open and exits when the last one is closed.
pub fn lazy_unmount(root: &Path) -> io::Result<()> {
    if crate::sys::geteuid() == 0 {
        let c = std::ffi::CString::new(root.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c` is a NUL-terminated string that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(e);
        }
    }
    for bin in ["fusermount3", "fusermount"] {
        match Command::new(bin)
            .arg("-u")
            .arg("-z")
            .arg("--")
            .arg(root)
            .output()
        {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                return Err(io::Error::other(
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ));
            }
            Err(_) => continue,
        }
    }
    Err(io::Error::other(
        "fusermount3 not found (install the fuse3 package)",
    ))
}

/// Runs `skillfs umount ROOT`: asks the daemon to finish and waits for it.
pub fn umount(root: &Path, timeout: Duration) -> Result<String, Failure> {
    let root = absolute_root(root)?;
    let Some(m) = mount_at(&root) else {
        return Err(Failure::new(
            Exit::BadRoot,
            format!("'{}' is not mounted", root.display()),
        ));
    };
    let Some(store) = m.skillfs_store() else {
        return Err(Failure::new(
            Exit::BadRoot,
            format!("'{}' is a {} mount, not skillfs", root.display(), m.fstype),
        ));
    };
    let layout = Layout::new(store);
    if StoreLock::is_held(&layout) {
        // Signal only a pid proven to be this store's daemon (`LOCK`
        // is a file: its pid alone proves nothing). Otherwise detach:
        // the daemon ends once its mount is released, as after a
        // signal.
        match StoreLock::daemon(&layout) {
            // SAFETY: kill takes plain integers; `proven` is the pid proven to hold this
            // store's lock (`StoreLock::daemon`).
            Some(proven) => unsafe {
                libc::kill(proven as i32, libc::SIGTERM);
            },
            None => {
                tracing::warn!(
                    "the pid in the lock of '{}' is not proven to be its daemon: detaching the mount without signalling",
                    root.display()
                );
                lazy_unmount(&root).map_err(|e| {
                    Failure::new(
                        Exit::Internal,
                        format!("could not unmount '{}': {e}", root.display()),
                    )
                })?;
            }
        }
        let deadline = Instant::now() + timeout;
        while StoreLock::is_held(&layout) {
            if Instant::now() > deadline {
                return Err(Failure::new(
                    Exit::Internal,
                    format!(
                        "the daemon of '{}' did not finish within {timeout:?}; files may still be open",
                        root.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The daemon detached the mount itself; a stacked mount left by
        // a failure is detached here too.
        if mount_at(&root).is_some_and(|m| m.skillfs_store().is_some()) {
            let _ = lazy_unmount(&root);
        }
        Ok(format!("unmounted {}", root.display()))
    } else {
        lazy_unmount(&root).map_err(|e| {
            Failure::new(
                Exit::Internal,
                format!("could not unmount '{}': {e}", root.display()),
            )
        })?;
        Ok(format!(
            "the daemon of {} was not running; detached its stale mount",
            root.display()
        ))
    }
}
