//! The daemon's life: the mount itself, the threads beside the FUSE
//! session (signals, the park sweeper), and the shutdown.
//!
//! Invariants: the daemon never touches the mount point by path once
//! mounted (only the root fd opened before); the shutdown signals are
//! blocked before any thread starts, so only the signal thread takes them,
//! and it answers them by unmounting once the mount is quiet (never by
//! detaching a busy one: that would let writes by path bypass versioning); the core is shut down
//! (published and synced) when the session ends, even where the kernel
//! never sent DESTROY.
//!
//! Locks: the store's flock (`StoreLock`), held for the daemon's life (by
//! `Prepared`); the signal and sweep threads reach the core's locks only
//! through `SkillFs`.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::mountinfo::SOURCE_PREFIX;
use super::prepare::{MountArgs, prepare};
use super::spawn::{ready_pipe, report_ready, spawn_daemon};
use super::unmount::{Quiet, unmount_if_quiet};
use crate::error::{Exit, Failure};
use crate::fs::SkillFs;
use crate::store::Dir;

/// Runs `skillfs mount`.
pub fn mount(args: MountArgs) -> Result<(), Failure> {
    // Refused before the store is opened: nothing is touched.
    if args.transport == crate::fuse::Transport::Uring
        && let Some(why) = crate::fuse::uring_unavailable()
    {
        return Err(Failure::new(
            Exit::MountRefused,
            format!(
                "cannot mount '{}' with --transport uring: {why}",
                args.root.display()
            ),
        ));
    }
    // A dead mount is recovered, an older daemon restarted when quiet.
    // (The daemon a background mount starts finds nothing left to do.)
    match super::lifecycle::settle(&args, args.wait)? {
        super::lifecycle::Found::ServedByOlder(line) => {
            eprintln!("skillfs: {}", crate::error::one_line(line));
            return Ok(());
        }
        super::lifecycle::Found::Mount(done) => {
            for line in done {
                eprintln!("skillfs: {}", crate::error::one_line(line));
            }
        }
    }
    if args.foreground {
        return run_daemon(args, ready_pipe());
    }
    spawn_daemon(&args)
}

fn run_daemon(args: MountArgs, mut ready: Option<File>) -> Result<(), Failure> {
    // Modes arrive from the kernel with the caller's umask applied already.
    crate::process::umask(0);
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
    let mut prepared = match prepare(&args, &super::DiskAccess::real()) {
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
        redirect_stderr(&prepared.top);
    }
    for n in &prepared.notes {
        tracing::info!("{}", crate::error::one_line(n.clone()));
    }
    // Logged, and told to the `skillfs mount` waiting on the terminal.
    for w in &prepared.warnings {
        // One line each, whatever paths it names (a newline would forge a
        // verdict on the pipe).
        let w = crate::error::one_line(w.clone());
        tracing::warn!("{w}");
        if let Some(f) = ready.as_mut() {
            let _ = std::io::Write::write_all(f, format!("warn {w}\n").as_bytes());
        }
    }

    let fsname = format!("{SOURCE_PREFIX}{}", prepared.layout.dir.display());
    let session = crate::fuse::mount(
        Arc::clone(&prepared.fs),
        &prepared.mount_point,
        &fsname,
        args.threads,
        args.allow_other,
        args.transport,
    );
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            let f = Failure::new(
                Exit::MountRefused,
                format!(
                    "could not mount on '{}': {e}{}",
                    prepared.mount_point.display(),
                    fuse_device_hint(&e.to_string())
                ),
            );
            // Nothing was served: a clean end, not a crash.
            prepared.finish();
            report_ready(
                &mut ready,
                &format!("err {} {}\n", f.exit as i32, f.message),
            );
            return Err(f);
        }
    };
    let transport = session.transport.clone();
    let root = prepared.mount_point.clone();
    let source = fsname.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || wait_for_signal_and_unmount(&root, &source))
        .map_err(|e| {
            Failure::new(
                Exit::Internal,
                format!("could not start the signal thread: {e}"),
            )
        })?;
    tracing::info!(
        "mounted {} (versioned: {}; store {})",
        prepared.mount_point.display(),
        prepared.root.display(),
        prepared.layout.dir.display()
    );
    start_sweeper(Arc::clone(&prepared.fs));
    start_deferred_flusher(Arc::clone(&prepared.fs));
    if let Some(policy) = prepared.retention.clone() {
        start_retention(Arc::clone(&prepared.fs), policy);
    }
    if let Some((every, opts)) = prepared.sync.take() {
        start_sync(prepared.layout.clone(), prepared.root.clone(), every, opts);
    }
    // Without it the store's commands that need the daemon say so; the
    // mount itself serves either way.
    if let Err(e) = super::control::serve(&prepared.top, Arc::clone(&prepared.fs), transport) {
        tracing::error!("could not open the control socket in the store: {e}");
    }
    // What the start-up logged (repairs, the scan) is in the log before
    // `mount` returns.
    crate::logging::flush();
    report_ready(&mut ready, "ok\n");
    // Requests sent from here on wait for `run` (a few microseconds).
    sd_notify(&format!("READY=1\nMAINPID={}\n", std::process::id()));
    let result = session.run();
    sd_notify("STOPPING=1\n");
    // No git of a scheduled sync outlives the mount.
    crate::sync::stop();
    // `destroy` has published and synced; make sure of it for the paths
    // where the kernel never sent DESTROY (connection aborted).
    let _ = prepared.top.unlink(super::control::CONTROL);
    prepared.finish();
    tracing::info!("unmounted {}", prepared.mount_point.display());
    result.map_err(|e| Failure::new(Exit::Internal, format!("session ended with an error: {e}")))
}

/// What to do when `/dev/fuse` may not be opened by this user (a
/// container or a system without the distributions' udev rule).
fn fuse_device_hint(err: &str) -> String {
    if !(err.contains("/dev/fuse") && err.contains("Permission denied")) {
        return String::new();
    }
    use std::os::unix::fs::MetadataExt;
    let how = std::fs::metadata("/dev/fuse")
        .map(|m| {
            format!(
                "mode {:o}, owner uid {} gid {}",
                m.mode() & 0o7777,
                m.uid(),
                m.gid()
            )
        })
        .unwrap_or_else(|_| "unreadable".to_string());
    format!(
        " (/dev/fuse is {how}: as root, `chmod 0666 /dev/fuse`, as distributions ship it, or \
         add this user to the group that owns it; then mount again)"
    )
}

/// Tells the service manager how the daemon is (`Type=notify` in a systemd
/// unit): one datagram to `$NOTIFY_SOCKET`, a path or, with a leading `@`,
/// an abstract name. Nothing when the variable is unset; a failure is only
/// logged (the mount works either way).
fn sd_notify(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let bytes = target.as_bytes();
    let sent = UnixDatagram::unbound().and_then(|sock| match bytes.strip_prefix(b"@") {
        Some(name) => {
            let addr = SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)
        }
        None => sock.send_to(state.as_bytes(), Path::new(&target)),
    });
    if let Err(e) = sent {
        tracing::warn!("could not notify the service manager ({state:?}): {e}");
    }
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

/// Journals the removals held back for an editor's new file (see
/// `Ledger::defer`) once they have waited `DEFER_MAX`, checking twice in
/// that time: a removal is in the log at most one and a half times that
/// after it was made.
fn start_deferred_flusher(fs: Arc<SkillFs>) {
    let every = crate::ledger::DEFER_MAX / 2;
    let spawned = std::thread::Builder::new()
        .name("deferred".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                fs.flush_deferred();
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start the thread of held-back removals: {e}");
    }
}

/// Applies the retention policy of `config.json` every `every` while
/// mounted (the first time one interval after the mount), as `skillfs
/// forget` would: the agent keeps writing meanwhile.
fn start_retention(fs: Arc<SkillFs>, policy: crate::retention::Policy) {
    let every = policy.interval();
    let spawned = std::thread::Builder::new()
        .name("retention".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                match fs.forget_versions(&policy, false) {
                    Ok(r) => tracing::info!(
                        "retention: forgot {} ids, freed {} bytes",
                        r.selection.forget_count(),
                        r.reclaimed.bytes_freed
                    ),
                    Err(e) => tracing::error!("retention: {e}"),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start the retention thread: {e}");
    }
}

/// Runs `skillfs sync` with every remote every `every` while mounted (the
/// first time one interval after the mount), logging what each did. A sync
/// already running (a user's `skillfs sync`) is left to finish: this one
/// is skipped. The daemon's own process runs it, reading the store as the
/// command does; the agent keeps writing meanwhile.
fn start_sync(
    layout: crate::store::Layout,
    root: std::path::PathBuf,
    every: std::time::Duration,
    opts: crate::sync::Options,
) {
    let spawned = std::thread::Builder::new()
        .name("sync".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                match crate::sync::sync(&layout, &root, None, &opts) {
                    Ok(reports) => {
                        if reports.iter().any(|r| r.error.is_none())
                            && crate::sync::anything_to_merge(&layout)
                        {
                            merge_fetched(&root, opts.deadline);
                        }
                        for r in reports {
                            match r.error {
                                Some((_, why)) => tracing::warn!("sync: {why}"),
                                None => {
                                    tracing::info!("sync: {}: {}", r.remote, r.summary());
                                    for line in &r.rewritten {
                                        tracing::warn!("sync: {line}");
                                    }
                                }
                            }
                        }
                    }
                    Err(f) if f.exit == Exit::Busy => {
                        tracing::info!("sync: skipped, another is running")
                    }
                    Err(f) => tracing::warn!("sync: {f}"),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("could not start the sync thread: {e}");
    }
}

/// Merges what the scheduled sync fetched into the tree, through the
/// mount, by a `skillfs sync --merge` of its own: the daemon never touches
/// its own mount, but serves that process as any other. Bounded and
/// killed at the unmount as the sync's git is (`sync::child`).
fn merge_fetched(root: &std::path::Path, deadline: Option<std::time::Duration>) {
    // The daemon's own binary, even if an upgrade replaced the file.
    let mut c = std::process::Command::new("/proc/self/exe");
    c.args(["sync", "--merge", "--root"])
        .arg(root)
        .current_dir("/")
        .stdin(std::process::Stdio::null());
    match crate::sync::run_bounded(c, deadline) {
        Ok(out) => {
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                tracing::info!("sync: {l}");
            }
            for l in String::from_utf8_lossy(&out.stderr).lines() {
                tracing::warn!("sync: {}", l.strip_prefix("skillfs: ").unwrap_or(l));
            }
        }
        Err(e) => tracing::warn!("sync: the merge did not finish: {e}"),
    }
}

/// The log's default cap: past it, `daemon.log` becomes `daemon.log.1`
/// and a new one starts (so at most twice this is kept).
const LOG_MAX_BYTES: u64 = 16 << 20;
/// The smallest cap taken (below it the log would be moved aside at every
/// few lines).
const LOG_MIN_BYTES: u64 = 64 << 10;

/// Sends stderr to `daemon.log`, opened from the store's held fd, and
/// bounds it (`SKILLFS_LOG_MAX_BYTES`, else [`LOG_MAX_BYTES`]).
fn redirect_stderr(store: &Arc<Dir>) {
    if let Ok(f) = store.open_append(crate::store::LOG) {
        // SAFETY: both fds are open (`f` lives across the call); dup2 replaces fd 2 atomically.
        unsafe { libc::dup2(f.as_raw_fd(), 2) };
        let max = match std::env::var("SKILLFS_LOG_MAX_BYTES") {
            Err(_) => LOG_MAX_BYTES,
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(n) if n >= LOG_MIN_BYTES => n,
                _ => {
                    tracing::warn!(
                        "SKILLFS_LOG_MAX_BYTES={v:?} is not a number of bytes of at least \
                         {LOG_MIN_BYTES}: the log's cap is {LOG_MAX_BYTES}"
                    );
                    LOG_MAX_BYTES
                }
            },
        };
        let dir = Arc::clone(store);
        crate::logging::cap(
            max,
            Box::new(move || {
                use crate::store::{LOG, LOG_OLD};
                // The new log is made first and exchanged with the full
                // one, so that `daemon.log` is there at every moment (for
                // a reader that polls it, or `tail -F`); the full one then
                // replaces `daemon.log.1`.
                const NEW: &str = "daemon.log.new";
                let new = dir.open(
                    NEW,
                    libc::O_WRONLY
                        | libc::O_APPEND
                        | libc::O_CREAT
                        | libc::O_TRUNC
                        | libc::O_NONBLOCK,
                    crate::store::fsutil::FILE_MODE,
                )?;
                match dir.rename(NEW, &dir, LOG, libc::RENAME_EXCHANGE) {
                    Ok(()) => dir.rename(NEW, &dir, LOG_OLD, 0)?,
                    // A log removed by hand is nothing to move aside: the
                    // new one takes its name, and the space comes back.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        dir.rename(NEW, &dir, LOG, 0)?
                    }
                    Err(e) => return Err(e),
                }
                Ok(new)
            }),
        );
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

/// Waits for a shutdown signal, then unmounts once the mount is quiet:
/// while any process is inside, the daemon keeps serving (every write
/// stays versioned) and tries again every second, logging who holds it
/// whenever that changes. `skillfs umount --lazy` detaches a busy mount
/// for a user who wants it gone now; a service manager's stop timeout
/// ends in SIGKILL, which leaves a dead mount that lets nothing through.
fn wait_for_signal_and_unmount(root: &Path, source: &str) {
    let set = signal_set();
    let mut sig = 0;
    // SAFETY: `set` is an initialised signal set and `sig` a valid int to write.
    unsafe { libc::sigwait(&set, &mut sig) };
    tracing::info!(
        "signal {sig}: unmounting {} once it is quiet",
        root.display()
    );
    let mut said = String::new();
    loop {
        // Only our own mount, on top at ROOT: one unmounted elsewhere (a
        // `--lazy`, another tool) is not tried again, and whatever was
        // mounted at ROOT since is never ours to unmount.
        let ours = crate::daemon::mount_at(root)
            .is_some_and(|m| m.source.as_os_str().as_bytes() == source.as_bytes());
        if !ours {
            tracing::warn!(
                "{} is no longer this daemon's mount here (detached, or covered by another \
                 mount): not unmounting it; serving what is still open until the kernel ends \
                 the session",
                root.display()
            );
            crate::logging::flush();
            return;
        }
        // (This daemon is never named: `busy` leaves out its caller.)
        let now = match unmount_if_quiet(root, None) {
            Ok(Quiet::Unmounted) => return,
            Ok(Quiet::Busy(busy)) => format!(
                "{} is busy (held by {}): still serving it, versioned; trying again every \
                 second (`skillfs umount --lazy {}` detaches it now)",
                root.display(),
                busy.describe(8),
                root.display()
            ),
            Err(e) => format!("could not unmount {}: {e}; trying again", root.display()),
        };
        if now != said {
            tracing::warn!("{now}");
            crate::logging::flush();
            said = now;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
