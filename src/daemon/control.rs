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
//! [`READ_TIMEOUT`] is dropped.
//!
//! Invariants: the socket is unlinked and bound again at every mount (the
//! store's lock is held, so no other daemon uses it); a request is never
//! more than [`MAX_REQUEST`] bytes.
//!
//! Locks: none of its own; a request reaches the core's locks through
//! `SkillFs`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::fs::SkillFs;
use crate::retention::Policy;
use crate::retention::run::Report;
use crate::store::Dir;

/// The socket's name in the store.
pub const CONTROL: &str = "control";
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
    let at = format!("/proc/self/fd/{}/{CONTROL}", top.fd());
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
    let me = crate::sys::geteuid();
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
    if let Some(end) = line.iter().position(|&b| b == b'\n') {
        line.truncate(end);
    }
    let response = match serde_json::from_slice::<Request>(&line) {
        Err(e) => Response::Refused(format!("not a request: {e}")),
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

fn reply(mut conn: &UnixStream, r: &Response) -> io::Result<()> {
    let mut line = serde_json::to_vec(r).map_err(io::Error::other)?;
    line.push(b'\n');
    conn.write_all(&line)
}

/// Sends `req` to the daemon serving the store at `store` and waits for
/// its answer (a forget of a large store may take minutes: no timeout).
pub fn ask(store: &Path, req: &Request) -> io::Result<Response> {
    let mut conn = UnixStream::connect(store.join(CONTROL))?;
    let mut line = serde_json::to_vec(req).map_err(io::Error::other)?;
    line.push(b'\n');
    conn.write_all(&line)?;
    let mut answer = Vec::new();
    BufReader::new(conn).read_until(b'\n', &mut answer)?;
    serde_json::from_slice(&answer).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the daemon's answer is not one: {e}"),
        )
    })
}
