//! `skillfs mount` in the background: it starts the daemon in a session of
//! its own and waits for its readiness report on a pipe, which the daemon
//! writes once: start-up warnings (`warn <text>`, printed on stderr), then
//! `ok`, or `err <exit code> <reason>`.
//!
//! Invariants: `mount` without `--foreground` returns only once the mount
//! is ready (exit 0) or has failed (the daemon's one-line reason and exit
//! code); the daemon takes the pipe only if it is an open pipe above
//! stderr, and takes its variable out of the environment.
//!
//! Locks: none.

// The daemon answers errors, never unwraps them (see `daemon`'s mod.rs).
#![deny(clippy::unwrap_used)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::prepare::MountArgs;
use crate::error::{Exit, Failure};

const READY_FD_ENV: &str = "SKILLFS_READY_FD";

/// The pipe our parent `skillfs mount` reads the readiness report from.
/// The variable is taken out of the environment (nothing we start inherits
/// it), and only an open pipe above stderr is taken: a stray or hostile
/// value never makes us own, and later close, stdin, stdout, stderr or a
/// file.
pub(super) fn ready_pipe() -> Option<File> {
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

pub(super) fn spawn_daemon(args: &MountArgs) -> Result<(), Failure> {
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
    cmd.arg("--transport").arg(
        clap::ValueEnum::to_possible_value(&args.transport)
            .map(|v| v.get_name().to_string())
            .unwrap_or_else(|| "auto".into()),
    );
    if args.allow_other {
        cmd.arg("--allow-other");
    }
    if let Some(s) = &args.store {
        cmd.arg("--store").arg(s);
    }
    if let Some(v) = &args.versioned {
        cmd.arg("--versioned").arg(v);
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
    // Start-up warnings first (one line each), then the verdict.
    let mut lines = msg.lines();
    let mut line = "";
    for l in lines.by_ref() {
        match l.strip_prefix("warn ") {
            Some(w) => eprintln!("skillfs: warning: {w}"),
            None => {
                line = l;
                break;
            }
        }
    }
    let line = line.to_string();
    if line == "ok" {
        return Ok(());
    }
    let status = child.wait().ok();
    if let Some(rest) = line.strip_prefix("err ") {
        let (code, text) = rest.split_once(' ').unwrap_or(("1", rest));
        let exit = match code {
            "2" => Exit::Usage,
            "3" => Exit::BadRoot,
            "4" => Exit::BadStore,
            "5" => Exit::DamagedJournal,
            "6" => Exit::MountRefused,
            "7" => Exit::BadRules,
            "8" => Exit::NotFound,
            "9" => Exit::Busy,
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

pub(super) fn report_ready(ready: &mut Option<File>, msg: &str) {
    if let Some(f) = ready.as_mut() {
        let _ = f.write_all(msg.as_bytes());
    }
    *ready = None;
}
