//! Log output: lines go to stderr from one thread, through a bounded queue.
//!
//! Invariants:
//! - No request thread ever writes to the log file itself: in the
//!   background the log is `daemon.log` on the store's filesystem, and a
//!   full or slow disk must not stall a request, fail it, or (as a failed
//!   `eprintln!` would) panic the thread that serves the mount.
//! - The queue is bounded: when the writer falls behind (or the disk is
//!   full), lines are dropped and counted, and the count is written with
//!   the next line that gets through.
//! - The log on disk is bounded too (once [`cap`] is called, as the
//!   daemon does): when it grows past its cap, the writer thread moves it
//!   aside (`daemon.log.1`, replacing the one before) and starts a new one,
//!   so a daemon that logs for months keeps at most twice the cap.
//! - `SKILLFS_LOG` is a level (`debug`) or per-crate directives
//!   (`skillfs_core=debug,info`), as `tracing_subscriber`'s `Targets`
//!   reads them; a bad one falls back to `info` and says so.
//!
//! Locks: the queue's (a leaf), never held across a write of the log.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Lines waiting for the writer thread, at most.
const QUEUE: usize = 4096;

struct Queue {
    tx: SyncSender<Vec<u8>>,
    /// Lines handed to the queue, and lines the writer is done with
    /// (written or failed), for `flush`.
    queued: AtomicU64,
    done: AtomicU64,
    /// Lines dropped because the queue was full, not yet reported.
    dropped: AtomicU64,
}

static QUEUE_SLOT: OnceLock<Queue> = OnceLock::new();

/// The log's cap on disk, and how to start a new log file once the old
/// one is moved aside (see [`cap`]).
struct Cap {
    max_bytes: u64,
    rotate: Box<dyn Fn() -> std::io::Result<File> + Send + Sync>,
}

static CAP: OnceLock<Cap> = OnceLock::new();

/// Bounds the log that stderr is: once it holds more than `max_bytes`,
/// the writer thread calls `rotate` (which moves the log aside and opens
/// a new one) and writes on into what it returns. Called once, by the
/// daemon, after stderr is its log file.
pub fn cap(max_bytes: u64, rotate: Box<dyn Fn() -> std::io::Result<File> + Send + Sync>) {
    let _ = CAP.set(Cap { max_bytes, rotate });
}

/// The size of what stderr is, when it is a regular file.
fn stderr_size() -> Option<u64> {
    // SAFETY: `st` is plain data, for which all zeros is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only fills `st`; a closed fd 2 answers EBADF.
    let ok = unsafe { libc::fstat(std::io::stderr().as_raw_fd(), &mut st) } == 0;
    (ok && st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(st.st_size as u64)
}

/// The size past which a failed rotation is tried again (the writer
/// thread's alone).
static RETRY_AT: AtomicU64 = AtomicU64::new(0);

/// After a line is written: past the cap, a new log file becomes stderr.
/// A failed rotation (a full disk, a directory planted at the old log's
/// name) is said once in the log and tried again after another eighth of
/// the cap; past twice the cap the log is emptied instead, so it stays
/// bounded whatever fails. No line is lost to a rotation.
fn rotate_if_full() {
    let Some(cap) = CAP.get() else { return };
    let Some(size) = stderr_size() else { return };
    if size <= cap.max_bytes || size < RETRY_AT.load(Ordering::Relaxed) {
        return;
    }
    match (cap.rotate)() {
        Ok(f) => {
            // SAFETY: both fds are open (`f` lives across the call); dup2
            // replaces fd 2 atomically, and only this thread writes to it.
            unsafe { libc::dup2(f.as_raw_fd(), 2) };
            RETRY_AT.store(0, Ordering::Relaxed);
        }
        Err(e) => {
            let mut err = std::io::stderr().lock();
            if size > cap.max_bytes.saturating_mul(2) {
                // SAFETY: fd 2 is open; only this thread writes to it.
                let _ = unsafe { libc::ftruncate(2, 0) };
                let _ = writeln!(
                    err,
                    "skillfs: the log could not be moved aside ({e}) and passed twice its cap: \
                     emptied"
                );
            } else {
                let _ = writeln!(err, "skillfs: the log could not be moved aside: {e}");
            }
            RETRY_AT.store(size + cap.max_bytes / 8, Ordering::Relaxed);
        }
    }
}

fn queue() -> &'static Queue {
    QUEUE_SLOT.get_or_init(|| {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        std::thread::Builder::new()
            .name("log".into())
            .spawn(move || {
                for line in rx {
                    let q = queue();
                    let mut err = std::io::stderr().lock();
                    let lost = q.dropped.swap(0, Ordering::Relaxed);
                    if lost > 0 {
                        let _ = writeln!(err, "skillfs: {lost} log lines dropped (log queue full)");
                    }
                    // A failed write (a full disk) loses the line, nothing else.
                    let _ = err.write_all(&line);
                    drop(err);
                    rotate_if_full();
                    q.done.fetch_add(1, Ordering::Release);
                }
            })
            .expect("spawn the log thread");
        Queue {
            tx,
            queued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    })
}

/// The `MakeWriter` of the log subscriber: one buffered line per event,
/// queued when the event is written out.
#[derive(Clone, Copy, Default)]
pub struct Queued;

pub struct Line(Vec<u8>);

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let q = queue();
        match q.tx.try_send(std::mem::take(&mut self.0)) {
            Ok(()) => {
                q.queued.fetch_add(1, Ordering::Release);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                q.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl<'a> MakeWriter<'a> for Queued {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line(Vec::new())
    }
}

/// Waits (briefly) until the lines queued so far are written: before the
/// process exits, so its last words are not lost.
pub fn flush() {
    let Some(q) = QUEUE_SLOT.get() else { return };
    let target = q.queued.load(Ordering::Acquire);
    let start = Instant::now();
    while q.done.load(Ordering::Acquire) < target && start.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What `SKILLFS_LOG` asks for: a level, or comma-separated directives,
/// each a level (the default) or `TARGET=LEVEL` (`skillfs_core=debug,info`);
/// unset, `info`. Directives without a default level keep `info` for the
/// rest, so naming one crate never silences the others' errors. A value
/// that is not that (`WARNING`, `verbose`: `Targets` alone would read them
/// as targets and log nothing else) is `info`, with the reason.
fn filter(var: Option<&str>) -> (Targets, Option<String>) {
    use tracing_subscriber::filter::LevelFilter;
    let info = || Targets::new().with_default(tracing::Level::INFO);
    let Some(v) = var.map(str::trim).filter(|v| !v.is_empty()) else {
        return (info(), None);
    };
    let bad = |why: String| {
        (
            info(),
            Some(format!(
                "SKILLFS_LOG={v:?} is not a level or TARGET=LEVEL directives ({why}): logging at info"
            )),
        )
    };
    let mut targets = Targets::new();
    let mut default = None;
    for d in v.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        match d.split_once('=') {
            None => match d.parse::<LevelFilter>() {
                Ok(l) => default = Some(l),
                Err(_) => {
                    return bad(format!(
                        "'{d}' is no level: error, warn, info, debug, trace or off"
                    ));
                }
            },
            Some((target, level)) => match level.trim().parse::<LevelFilter>() {
                Ok(l) if !target.trim().is_empty() => {
                    targets = targets.with_target(target.trim(), l)
                }
                _ => return bad(format!("'{d}' is not TARGET=LEVEL")),
            },
        }
    }
    (
        targets.with_default(default.unwrap_or(LevelFilter::INFO)),
        None,
    )
}

/// Installs the subscriber, filtered by `SKILLFS_LOG` (see [`filter`]).
pub fn init() {
    let var = std::env::var("SKILLFS_LOG").ok();
    let (targets, bad) = filter(var.as_deref());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(Queued)
        .with_ansi(false)
        // Its report of a failed write is an `eprintln!`, which panics when
        // stderr fails; our writer never fails.
        .log_internal_errors(false);
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(targets))
        .try_init();
    if let Some(why) = bad {
        tracing::warn!("{why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;
    use tracing_subscriber::filter::LevelFilter;

    #[test]
    fn skillfs_log_is_a_level_or_directives() {
        let (t, bad) = filter(None);
        assert_eq!((t.default_level(), bad), (Some(LevelFilter::INFO), None));
        let (t, _) = filter(Some("debug"));
        assert_eq!(t.default_level(), Some(LevelFilter::DEBUG));
        let (t, bad) = filter(Some("skillfs_core=trace,warn"));
        assert!(bad.is_none());
        assert!(t.would_enable("skillfs_core::fs", &Level::TRACE));
        assert!(!t.would_enable("skillfs_fuser::uring", &Level::INFO));
        assert!(t.would_enable("skillfs_fuser::uring", &Level::WARN));
        let (t, bad) = filter(Some("loud=="));
        assert_eq!(t.default_level(), Some(LevelFilter::INFO));
        assert!(bad.is_some_and(|m| m.contains("loud==")));
        // A word that is no level is refused, not read as a target (which
        // would log nothing else).
        for typo in ["WARNING", "verbose", "warning"] {
            let (t, bad) = filter(Some(typo));
            assert_eq!(t.default_level(), Some(LevelFilter::INFO), "{typo}");
            assert!(bad.is_some(), "{typo}");
        }
        // One crate named: the others keep info, errors included.
        let (t, bad) = filter(Some("skillfs_core=debug"));
        assert!(bad.is_none());
        assert!(t.would_enable("skillfs_core::fs", &Level::DEBUG));
        assert!(t.would_enable("skillfs::daemon", &Level::ERROR));
        assert!(t.would_enable("skillfs::daemon", &Level::INFO));
    }
}
