//! The control channel: how a command asks the mounted daemon to do work
//! on its store (`skillfs forget`), so that the one writer of the store
//! stays the daemon and the agent keeps writing meanwhile.
//!
//! A unix socket, `control`, in the store directory: bound through the
//! daemon's held fd of the store (`/proc/self/fd/N/control`, never by a
//! path someone could swap), mode 0600 inside the 0700 store, and every
//! peer's uid checked (`SO_PEERCRED`): the store's owner or root only.
//! One request a connection, one JSON line each way; requests are served
//! one at a time (a second waits), and a peer that sends nothing within
//! [`READ_TIMEOUT`] is dropped. The client trusts the daemon no more than
//! the daemon trusts it ([`ask`]): it connects through an fd of the store
//! too, asks only a listener owned by the store's owner or root, and
//! bounds the answer in time and size.
//!
//! Invariants: the socket is unlinked and bound again at every mount (the
//! store's lock is held, so no other daemon uses it); a request is never
//! more than [`MAX_REQUEST`] bytes, an answer read never more than
//! [`MAX_ANSWER`].
//!
//! Locks: none of its own; a request reaches the core's locks through
//! `SkillFs`.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::fs::SkillFs;
use crate::retention::Policy;
use crate::retention::run::Report;
use crate::store::Dir;

/// The socket's name in the store.
pub use crate::store::CONTROL;
const READ_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_REQUEST: u64 = 64 << 10;

#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "kebab-case")]
pub enum Request {
    Forget {
        policy: Policy,
        dry_run: bool,
    },
    /// What `skillfs status` shows of the daemon itself.
    Status,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    Forgot(Report),
    Refused(String),
    Status { transport: String },
}

/// Binds the control socket in the store held open as `top` and serves it
/// from a thread of its own for the daemon's life.
pub fn serve(top: &Dir, fs: Arc<SkillFs>, transport: String) -> io::Result<()> {
    match top.unlink(CONTROL) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let at = format!("/proc/self/fd/{}/{CONTROL}", top.as_raw_fd());
    let listener = UnixListener::bind(&at)?;
    // Bound, then made the owner's alone (the store around it is already).
    crate::sys::fchmodat(top.fd(), CONTROL.as_bytes(), 0o600)?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => {
                        if let Err(e) = answer(c, &fs, &transport) {
                            tracing::warn!("control: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("control: accept: {e}"),
                }
            }
        })?;
    Ok(())
}

fn answer(conn: UnixStream, fs: &SkillFs, transport: &str) -> io::Result<()> {
    let uid = crate::sys::peer_uid(&conn)?;
    let me = crate::process::geteuid();
    if uid != me && uid != 0 {
        return reply(
            &conn,
            &Response::Refused(format!(
                "uid {uid} may not control a store owned by uid {me}"
            )),
        );
    }
    // A peer that trickles its request or never reads the answer is
    // dropped, not waited on: the next request would wait behind it.
    conn.set_write_timeout(Some(READ_TIMEOUT))?;
    let deadline = std::time::Instant::now() + READ_TIMEOUT;
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    while !line.contains(&b'\n') && (line.len() as u64) < MAX_REQUEST {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "request too slow"));
        }
        conn.set_read_timeout(Some(left))?;
        let n = (&conn).read(&mut buf)?;
        if n == 0 {
            break;
        }
        line.extend_from_slice(&buf[..n]);
    }
    let response = match parse_request(&line) {
        Err(e) => Response::Refused(e),
        Ok(Request::Status) => Response::Status {
            transport: transport.to_string(),
        },
        Ok(Request::Forget { policy, dry_run }) => match policy.check() {
            Err(why) => Response::Refused(why),
            Ok(()) => {
                tracing::info!(
                    "control: forget {policy:?}{}",
                    if dry_run { " (dry run)" } else { "" }
                );
                match fs.forget_versions(&policy, dry_run) {
                    Ok(r) => {
                        tracing::info!(
                            "control: forgot {} ids (kept {}), freed {} bytes",
                            r.selection.forget_count(),
                            r.kept,
                            r.reclaimed.bytes_freed
                        );
                        Response::Forgot(r)
                    }
                    Err(e) => Response::Refused(format!("forget failed: {e}")),
                }
            }
        },
    };
    reply(&conn, &response)
}

/// A request as read from a peer (untrusted bytes, at most
/// [`MAX_REQUEST`] of them): its first line, as JSON.
pub fn parse_request(read: &[u8]) -> Result<Request, String> {
    let line = read.split(|&b| b == b'\n').next().unwrap_or_default();
    serde_json::from_slice::<Request>(line).map_err(|e| format!("not a request: {e}"))
}

fn reply(mut conn: &UnixStream, r: &Response) -> io::Result<()> {
    let mut line = serde_json::to_vec(r).map_err(io::Error::other)?;
    line.push(b'\n');
    conn.write_all(&line)
}

/// How long `skillfs status` waits for the daemon's answer.
pub const STATUS_WAIT: Duration = Duration::from_secs(5);
/// How long `skillfs forget` waits: a forget of a large store rewrites
/// packs for minutes, and sends nothing until it is done.
pub const FORGET_WAIT: Duration = Duration::from_secs(60 * 60);
/// The largest answer read: a report is a few KB (its forgotten ids are
/// ranges); more is not the daemon speaking.
const MAX_ANSWER: usize = 8 << 20;

/// Sends `req` to the daemon serving the store at `store` and waits at
/// most `wait` for its answer.
///
/// Whatever listens on `control` is untrusted until proven: the socket is
/// reached through an fd of the store (`/proc/self/fd/N/control`, as the
/// daemon binds it, so a store at any depth is reachable past `sun_path`'s
/// 108 bytes), its listener must be the store's owner or root
/// (`SO_PEERCRED`, checked before anything is sent), and the answer is
/// bounded in time and in size.
pub fn ask(store: &Path, req: &Request, wait: Duration) -> io::Result<Response> {
    use std::os::unix::ffi::OsStrExt;
    let deadline = Instant::now() + wait;
    let dir = crate::sys::openat(
        crate::sys::CWD,
        store.as_os_str().as_bytes(),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?;
    let owner = crate::sys::fstat(&dir)?.st_uid;
    let st = crate::sys::lstatat(dir.as_fd(), CONTROL.as_bytes())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("'{CONTROL}' in the store is not a socket"),
        ));
    }
    let at = format!("/proc/self/fd/{}/{CONTROL}", dir.as_raw_fd());
    let mut conn = crate::sys::connect_unix(at.as_bytes(), wait)?;
    // The listener's credentials, as of its listen(): a socket swapped in
    // since the lstat above is caught here.
    let uid = crate::sys::peer_uid(&conn)?;
    if uid != owner && uid != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the control socket is served by uid {uid}, not by the store's owner \
                 (uid {owner}) or root: not asking it"
            ),
        ));
    }
    let mut line = serde_json::to_vec(req).map_err(io::Error::other)?;
    line.push(b'\n');
    conn.set_write_timeout(Some(left(deadline, wait)?))?;
    conn.write_all(&line)?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    while !answer.contains(&b'\n') {
        if answer.len() > MAX_ANSWER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the answer passed {} MiB without ending: not the daemon's",
                    MAX_ANSWER >> 20
                ),
            ));
        }
        conn.set_read_timeout(Some(left(deadline, wait)?))?;
        let n = match conn.read(&mut buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(late(wait));
            }
            r => r?,
        };
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    parse_answer(&answer)
}

/// An answer as read from whatever listens on the socket (untrusted
/// bytes): its first line, as JSON.
pub fn parse_answer(read: &[u8]) -> io::Result<Response> {
    let line = read.split(|&b| b == b'\n').next().unwrap_or_default();
    let not_one = |e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the daemon's answer is not one: {e}"),
        )
    };
    let r = serde_json::from_slice(line).map_err(|e| not_one(&e))?;
    // What a daemon's forget sends: ascending ranges of ids.
    match &r {
        Response::Forgot(report) if !report.selection.well_formed() => {
            Err(not_one(&"its ranges of ids are not ascending ranges"))
        }
        _ => Ok(r),
    }
}

/// The time left before `deadline`, or the error of one passed.
fn left(deadline: Instant, wait: Duration) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(late(wait))
    } else {
        Ok(left)
    }
}

fn late(wait: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no answer within {} s", wait.as_secs()),
    )
}
