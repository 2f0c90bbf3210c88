//! The git commands of the daemon's scheduled sync, bounded: each one in
//! a process group of its own, killed with everything it started when it
//! outlives its deadline or when the mount ends ([`stop`]). A remote that
//! never answers (a path remote whose receiving hook hangs, a user's
//! `GIT_SSH_COMMAND` that waits forever) then costs one deadline, not
//! `sync/lock` for good, and no git of the daemon's outlives its unmount.
//!
//! A user's `skillfs sync` runs its git unbounded, in its own process
//! group (the terminal's): the user's Ctrl-C reaches it.
//!
//! Invariants: after [`stop`] no command starts, and the one running is
//! killed; a killed command's group is killed before its leader is reaped
//! (so the group id cannot have been reused).
//!
//! Locks: `RUNNING` (the group of the command running), briefly; never
//! held while waiting.

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The process group of the bounded command running, if one is.
static RUNNING: Mutex<Option<i32>> = Mutex::new(None);
/// Set by [`stop`]: the mount is ending.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// How often a bounded command's end is looked for.
const POLL: Duration = Duration::from_millis(20);

/// Why a bounded command did not finish.
pub fn is_stopped(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Runs `c` to its end and collects its output, as `Command::output`; with
/// a `limit`, in a group of its own, killed with the group when it runs
/// longer (`TimedOut`) or the mount ends (`Interrupted`).
pub fn output(mut c: Command, limit: Option<Duration>) -> io::Result<Output> {
    let Some(limit) = limit else {
        return c.output();
    };
    c.process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = {
        let mut running = RUNNING.lock();
        if STOPPED.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the mount is ending",
            ));
        }
        let child = c.spawn()?;
        *running = Some(child.id() as i32);
        child
    };
    // Drained on threads, so a chatty command never stalls on a full pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let err = drain(child.stderr.take().map(|s| Box::new(s) as _));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        let why = if STOPPED.load(Ordering::SeqCst) {
            Some((
                io::ErrorKind::Interrupted,
                "the mount is ending".to_string(),
            ))
        } else if started.elapsed() >= limit {
            Some((
                io::ErrorKind::TimedOut,
                format!(
                    "it ran longer than {}s and was stopped",
                    limit.as_secs_f64().round()
                ),
            ))
        } else {
            None
        };
        if let Some((kind, why)) = why {
            // The leader is not reaped yet: its group id is still ours.
            kill_group(child.id() as i32);
            let _ = child.wait();
            break Err(io::Error::new(kind, why));
        }
        std::thread::sleep(POLL);
    };
    *RUNNING.lock() = None;
    let status = status?;
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// The mount is ending: no bounded command starts from now on, and the
/// one running is killed with everything it started.
pub fn stop() {
    let running = RUNNING.lock();
    STOPPED.store(true, Ordering::SeqCst);
    if let Some(group) = *running {
        kill_group(group);
    }
}

fn kill_group(group: i32) {
    // SAFETY: kill(2) with a negative pid signals that process group; the
    // group is a command's we started in a group of its own and have not
    // reaped, so it names no process of anyone else.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that outlives its deadline is killed with what it
    /// started (its child holds the pipe: the read would hang otherwise).
    #[test]
    fn a_command_past_its_deadline_is_killed_with_its_children() {
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 30 & sleep 30; echo never"]);
        let t = Instant::now();
        let e = output(c, Some(Duration::from_millis(300))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(RUNNING.lock().is_none());
    }

    #[test]
    fn a_command_within_its_deadline_gives_its_output() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = output(c, Some(Duration::from_secs(30))).unwrap();
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");
        assert_eq!(o.status.code(), Some(3));
    }
}
