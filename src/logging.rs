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
//!
//! Locks: the queue's (a leaf), never held across a write of the log.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

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

/// Installs the subscriber: level from `SKILLFS_LOG` (default info).
pub fn init() {
    let level = match std::env::var("SKILLFS_LOG").as_deref() {
        Ok("error") => tracing::Level::ERROR,
        Ok("warn") => tracing::Level::WARN,
        Ok("debug") => tracing::Level::DEBUG,
        Ok("trace") => tracing::Level::TRACE,
        _ => tracing::Level::INFO,
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(Queued)
        .with_ansi(false)
        // Its report of a failed write is an `eprintln!`, which panics when
        // stderr fails; our writer never fails.
        .log_internal_errors(false)
        .try_init();
}
