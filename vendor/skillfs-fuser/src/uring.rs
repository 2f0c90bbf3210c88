//! FUSE over io_uring (Linux 6.14 and later, `fuse.enable_uring=1`).
//!
//! skillfs's addition to this fork of fuser 0.18. The protocol is the
//! kernel's `Documentation/filesystems/fuse-io-uring.rst`, as libfuse's
//! `lib/fuse_uring.c` speaks it:
//!
//! - INIT is answered with `FUSE_OVER_IO_URING` (the filesystem asks for it
//!   in `init`; the kernel offers it only while `enable_uring` is on). From
//!   that reply on, the kernel holds every new request until the ring is
//!   ready, or until a registration fails (then it falls back to
//!   `/dev/fuse`). So the rings, buffers and threads are made *before* the
//!   reply ([`prepare`]): if any of that fails, the flag is left out of the
//!   reply and nothing waits on a ring that will never come.
//! - The kernel keeps one queue per possible CPU (qid = CPU id); a request
//!   goes to the queue of the CPU its caller runs on. An entry is a header
//!   buffer (`struct fuse_uring_req_header`: the in/out header, the
//!   operation's own header, the entry's commit id and payload size) and a
//!   payload buffer of the kernel's largest request, registered by an
//!   `IORING_OP_URING_CMD` (`FUSE_IO_URING_CMD_REGISTER`, the two buffers as
//!   iovecs). Its completion carries a request; the reply is written into
//!   the same buffers and sent with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`,
//!   which also waits for the next.
//! - Once every queue has an entry, the kernel sends every request there
//!   except FORGET and INTERRUPT, which still come through `/dev/fuse` (the
//!   classic threads keep reading it); notifications are written there too.
//!
//! Design: one thread per ring entry, each with its own small io_uring,
//! pinned to its queue's CPU (where the kernel wakes it: a request is
//! served on its caller's CPU). A handler that blocks (an fsync, a publish)
//! holds only its own entry; the queue's other entries keep serving.
//!
//! Invariants:
//! - Between a submission (REGISTER, COMMIT_AND_FETCH) and its completion
//!   the kernel owns the entry's buffers; Rust touches them only between a
//!   completion and the next submission, and only through raw pointers
//!   (no reference to them outlives a copy).
//! - Every request taken from the ring is answered and committed: a reply
//!   from the handler (from any thread), else EIO (a handler that panicked,
//!   a request fuser cannot parse, a session gone). An entry whose thread
//!   ended never comes back, so a thread ends only when the kernel has
//!   ended its entry (unmount, the daemon's death).
//! - A request without payload is parsed in place: its headers are copied
//!   just before the payload area, so the reply (written into the payload
//!   area) never overlaps the bytes the handler reads. One with payload
//!   is copied out first.
//!
//! The parts of that which need no ring (a reply written into an entry's
//! buffers, a request rebuilt for fuser, EIO for a request not served) are
//! plain functions over the buffers, tested in `tests.rs`.

use std::alloc::Layout;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::Weak;
use std::sync::mpsc;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use zerocopy::IntoBytes;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::dev_fuse::DevFuse;
use crate::ll::Operation;
use crate::open_flags::OpenFlags;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

/// The kernel's ABI (include/uapi/linux/fuse.h), as `repr(C)` structs
/// whose sizes and offsets are asserted at compile time below: every
/// byte offset this module reads or writes is one of their fields'.
mod abi {
    /// `struct fuse_uring_ent_in_out`.
    #[repr(C)]
    pub(super) struct EntInOut {
        pub(super) flags: u64,
        pub(super) commit_id: u64,
        pub(super) payload_sz: u32,
        pub(super) padding: u32,
        pub(super) reserved: u64,
    }

    /// `struct fuse_uring_req_header`: the in/out header, the op header
    /// (`FUSE_URING_IN_OUT_HEADER_SZ`, `FUSE_URING_OP_IN_OUT_SZ`), the
    /// entry's info.
    #[repr(C)]
    pub(super) struct ReqHeader {
        pub(super) in_out: [u8; 128],
        pub(super) op_in: [u8; 128],
        pub(super) ring_ent_in_out: EntInOut,
    }

    /// `struct fuse_uring_cmd_req`, the SQE's command area.
    #[repr(C)]
    pub(super) struct CmdReq {
        pub(super) flags: u64,
        pub(super) commit_id: u64,
        pub(super) qid: u16,
        pub(super) padding: [u8; 6],
    }

    /// `struct fuse_in_header`.
    #[repr(C)]
    pub(super) struct InHeader {
        pub(super) len: u32,
        pub(super) opcode: u32,
        pub(super) unique: u64,
        pub(super) nodeid: u64,
        pub(super) uid: u32,
        pub(super) gid: u32,
        pub(super) pid: u32,
        pub(super) total_extlen: u16,
        pub(super) padding: u16,
    }

    /// `struct fuse_out_header`.
    #[repr(C)]
    pub(super) struct OutHeader {
        pub(super) len: u32,
        pub(super) error: i32,
        pub(super) unique: u64,
    }

    use std::mem::{offset_of, size_of};
    const _: () = {
        assert!(size_of::<EntInOut>() == 32);
        assert!(offset_of!(EntInOut, commit_id) == 8);
        assert!(offset_of!(EntInOut, payload_sz) == 16);
        assert!(size_of::<ReqHeader>() == 288);
        assert!(offset_of!(ReqHeader, op_in) == 128);
        assert!(offset_of!(ReqHeader, ring_ent_in_out) == 256);
        assert!(size_of::<CmdReq>() == 24);
        assert!(offset_of!(CmdReq, commit_id) == 8);
        assert!(offset_of!(CmdReq, qid) == 16);
        assert!(size_of::<InHeader>() == 40);
        assert!(offset_of!(InHeader, opcode) == 4);
        assert!(offset_of!(InHeader, unique) == 8);
        assert!(size_of::<OutHeader>() == 16);
        assert!(offset_of!(OutHeader, error) == 4);
        assert!(offset_of!(OutHeader, unique) == 8);
    };
}

use std::mem::{offset_of, size_of};

/// Where `struct fuse_uring_req_header`'s parts are.
const IN_OUT: usize = offset_of!(abi::ReqHeader, in_out);
const OP_IN: usize = offset_of!(abi::ReqHeader, op_in);
const OP_IN_SIZE: usize = size_of::<[u8; 128]>();
const ENT_IN_OUT: usize = offset_of!(abi::ReqHeader, ring_ent_in_out);
const ENT_COMMIT_ID: usize = ENT_IN_OUT + offset_of!(abi::EntInOut, commit_id);
const ENT_PAYLOAD_SZ: usize = ENT_IN_OUT + offset_of!(abi::EntInOut, payload_sz);
const HEADER_SIZE: usize = size_of::<abi::ReqHeader>();
/// `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HEADER_SIZE: usize = size_of::<abi::InHeader>();
const IN_OPCODE: usize = offset_of!(abi::InHeader, opcode);
const IN_UNIQUE: usize = offset_of!(abi::InHeader, unique);
const OUT_HEADER_SIZE: usize = size_of::<abi::OutHeader>();
const OUT_ERROR: usize = offset_of!(abi::OutHeader, error);
const OUT_UNIQUE: usize = offset_of!(abi::OutHeader, unique);
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The kernel's FUSE_MIN_READ_BUFFER.
const MIN_PAYLOAD: usize = 8192;
/// Room before the payload area for a request's in-header and op header,
/// so that a request without payload is parsed where it lies.
const PREFIX: usize = 256;

/// How the ring was set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringInfo {
    /// Queues registered (the kernel's possible CPUs).
    pub queues: usize,
    /// Ring entries (and threads) per queue.
    pub per_queue: usize,
}

/// A request from the ring as `Config::io_uring_quick` sees it, before
/// it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringRequest {
    /// The kernel's opcode (`enum fuse_opcode` in `linux/fuse.h`).
    pub opcode: u32,
    /// The open flags of an OPEN or a RELEASE; None for other requests.
    pub flags: Option<OpenFlags>,
}

impl UringRequest {
    /// Reads it from an entry's header.
    fn read(h: &[u8; HEADER_SIZE]) -> UringRequest {
        use crate::ll::fuse_abi::{fuse_open_in, fuse_opcode as op, fuse_release_in};
        let word = |at: usize| u32::from_ne_bytes(h[at..at + 4].try_into().unwrap_or_default());
        let opcode = word(IN_OUT + IN_OPCODE);
        let flags_at = match opcode {
            o if o == op::FUSE_OPEN as u32 => Some(offset_of!(fuse_open_in, flags)),
            o if o == op::FUSE_RELEASE as u32 => Some(offset_of!(fuse_release_in, flags)),
            _ => None,
        };
        UringRequest {
            opcode,
            flags: flags_at.map(|at| OpenFlags(word(OP_IN + at) as i32)),
        }
    }
}

/// An entry's buffers, as the kernel reads and writes them: the header,
/// and one area holding [`PREFIX`] bytes then the payload. Only raw
/// pointers: see the module's invariants for who may touch them when.
struct Buffers {
    header: *mut u8,
    area: *mut u8,
    payload_len: usize,
}

// SAFETY: the pointers are owned by the entry and used under the protocol
// of the module's invariants (one owner at a time: the kernel, the entry's
// thread, or a reply under `Entry::replied`'s mutex).
unsafe impl Send for Buffers {}
unsafe impl Sync for Buffers {}

impl Buffers {
    fn new(payload_len: usize) -> io::Result<Buffers> {
        let (h, a) = Buffers::layouts(payload_len)?;
        // SAFETY: both layouts have a non-zero size.
        let header = unsafe { std::alloc::alloc_zeroed(h) };
        let area = unsafe { std::alloc::alloc_zeroed(a) };
        if header.is_null() || area.is_null() {
            // SAFETY: each non-null pointer came from alloc_zeroed with its layout.
            unsafe {
                if !header.is_null() {
                    std::alloc::dealloc(header, h);
                }
                if !area.is_null() {
                    std::alloc::dealloc(area, a);
                }
            }
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(Buffers {
            header,
            area,
            payload_len,
        })
    }

    fn layouts(payload_len: usize) -> io::Result<(Layout, Layout)> {
        let bad = |_| io::Error::from(io::ErrorKind::InvalidInput);
        Ok((
            Layout::from_size_align(HEADER_SIZE, 8).map_err(bad)?,
            Layout::from_size_align(PREFIX + payload_len, 4096).map_err(bad)?,
        ))
    }

    fn payload(&self) -> *mut u8 {
        // SAFETY: the area is PREFIX + payload_len bytes long.
        unsafe { self.area.add(PREFIX) }
    }

    /// Copies the header out (the kernel does not write it now).
    fn read_header(&self) -> [u8; HEADER_SIZE] {
        let mut h = [0u8; HEADER_SIZE];
        // SAFETY: the header is HEADER_SIZE bytes; nobody writes it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(self.header, h.as_mut_ptr(), HEADER_SIZE) };
        h
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        if let Ok((h, a)) = Buffers::layouts(self.payload_len) {
            // SAFETY: allocated in `new` with these layouts; the kernel no
            // longer uses them (the entry's ring is closed first: see Worker).
            unsafe {
                std::alloc::dealloc(self.header, h);
                std::alloc::dealloc(self.area, a);
            }
        }
    }
}

/// One ring entry: where its replies go.
pub(crate) struct Entry {
    bufs: Buffers,
    /// Whether the current request has its reply in the buffers.
    replied: Mutex<Replied>,
    done: Condvar,
}

/// The reply's state for the request in hand.
#[derive(Default)]
struct Replied {
    /// Which request of this entry is in hand (counts up): a reply for an
    /// earlier one (sent late from another thread, after its request was
    /// answered EIO) is dropped, never written over the next request.
    generation: u64,
    done: bool,
    /// The entry's thread waits for a reply sent from another thread
    /// (only then is the condvar signalled: a wake is a system call).
    waiting: bool,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("uring::Entry")
    }
}

impl Entry {
    fn new(payload_len: usize) -> io::Result<Entry> {
        Ok(Entry {
            bufs: Buffers::new(payload_len)?,
            replied: Mutex::new(Replied::default()),
            done: Condvar::new(),
        })
    }

    /// Takes the next request in hand; returns its generation (a reply for
    /// an earlier one is dropped from now on).
    fn begin(&self) -> u64 {
        let mut r = self.replied.lock().unwrap_or_else(|p| p.into_inner());
        let generation = r.generation.wrapping_add(1);
        *r = Replied {
            generation,
            ..Replied::default()
        };
        generation
    }

    /// Writes a reply (fuser's iovecs: the out header, then the data) into
    /// the entry's buffers ([`write_reply`]). A second reply to one request
    /// is dropped (as the kernel would refuse it on `/dev/fuse`).
    pub(crate) fn send(&self, generation: u64, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let mut replied = self.replied.lock().unwrap_or_else(|p| p.into_inner());
        if replied.done || replied.generation != generation {
            return Err(io::Error::other("a second or late reply to an io_uring request"));
        }
        let b = &self.bufs;
        // SAFETY: the header is HEADER_SIZE bytes, the payload area
        // payload_len. The request in hand is this reply's (its
        // generation), so the kernel does not touch them before its
        // commit, and the mutex makes this the only reply writing them; the
        // request's bytes handed to fuser lie outside them (in the prefix,
        // or copied: module invariants).
        let (header, payload) = unsafe {
            (
                &mut *b.header.cast::<[u8; HEADER_SIZE]>(),
                std::slice::from_raw_parts_mut(b.payload(), b.payload_len),
            )
        };
        write_reply(header, payload, data);
        replied.done = true;
        let waiting = replied.waiting;
        drop(replied);
        if waiting {
            self.done.notify_all();
        }
        Ok(())
    }

    /// EIO for request `unique`, unless it has its reply already.
    fn fail(&self, unique: u64) {
        let generation = self.replied.lock().unwrap_or_else(|p| p.into_inner()).generation;
        let _ = self.send(generation, &[io::IoSlice::new(&eio_reply(unique))]);
    }
}

/// Writes a reply (fuser's iovecs: the out header, then the data) into an
/// entry's buffers: the out header at the start of the header's in/out
/// area, the rest into `payload`, its size into the entry's `payload_sz`.
/// A reply longer than `payload` goes as EIO without payload: the kernel
/// sized the payload for its largest request, so a longer reply is the
/// filesystem's bug, and the caller gets EIO.
fn write_reply(header: &mut [u8; HEADER_SIZE], payload: &mut [u8], data: &[io::IoSlice<'_>]) {
    let mut head = [0u8; OUT_HEADER_SIZE];
    let (mut h, mut n) = (0, 0);
    let mut too_long = false;
    for slice in data {
        let mut s: &[u8] = slice;
        // The header first (fuser sends it as the first slice).
        let take = s.len().min(OUT_HEADER_SIZE - h);
        head[h..h + take].copy_from_slice(&s[..take]);
        h += take;
        s = &s[take..];
        let Some(to) = payload.get_mut(n..n + s.len()) else {
            too_long = true;
            break;
        };
        to.copy_from_slice(s);
        n += s.len();
    }
    if too_long {
        warn!("io_uring reply longer than the payload buffer");
        head[OUT_ERROR..OUT_ERROR + 4].copy_from_slice(&(-libc::EIO).to_ne_bytes());
        n = 0;
    }
    header[IN_OUT..IN_OUT + OUT_HEADER_SIZE].copy_from_slice(&head);
    header[ENT_PAYLOAD_SZ..ENT_PAYLOAD_SZ + 4].copy_from_slice(&(n as u32).to_ne_bytes());
}

/// The reply EIO to request `unique`: an out header alone.
fn eio_reply(unique: u64) -> [u8; OUT_HEADER_SIZE] {
    let mut out = [0u8; OUT_HEADER_SIZE];
    let at = offset_of!(abi::OutHeader, len);
    out[at..at + 4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
    out[OUT_ERROR..OUT_ERROR + 4].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    out[OUT_UNIQUE..OUT_UNIQUE + 8].copy_from_slice(&unique.to_ne_bytes());
    out
}

/// What an entry's header says of the request in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    unique: u64,
    commit_id: u64,
    /// The in-header's `len`: in-header, op header and payload.
    len: usize,
    payload_sz: usize,
}

impl Head {
    fn read(h: &[u8; HEADER_SIZE]) -> Head {
        let word = |at: usize| u64::from_ne_bytes(h[at..at + 8].try_into().unwrap_or_default());
        let half = |at: usize| u32::from_ne_bytes(h[at..at + 4].try_into().unwrap_or_default()) as usize;
        Head {
            unique: word(IN_OUT + IN_UNIQUE),
            commit_id: word(ENT_COMMIT_ID),
            len: half(IN_OUT + offset_of!(abi::InHeader, len)),
            payload_sz: half(ENT_PAYLOAD_SZ),
        }
    }

    /// The op header's length, if the sizes agree (the op header fits its
    /// area, the payload the entry's `payload_len`); None: malformed.
    fn op_len(&self, payload_len: usize) -> Option<usize> {
        self.len
            .checked_sub(IN_HEADER_SIZE)
            .and_then(|l| l.checked_sub(self.payload_sz))
            .filter(|&l| l <= OP_IN_SIZE && self.payload_sz <= payload_len)
    }
}

/// The request as a `/dev/fuse` read gives it (in-header, op header,
/// payload), for fuser's parser, which wants it 8-byte aligned. Without
/// payload it is assembled in place, at the end of `prefix` (the area
/// before the payload, whose end is aligned: a reply, written into the
/// payload area, never overlaps it); with payload (or an op header that
/// would leave it unaligned) it is copied into `copy`. `op_len` is
/// [`Head::op_len`]'s; `payload` is the entry's payload area.
fn rebuild<'a>(
    h: &[u8; HEADER_SIZE],
    head: &Head,
    op_len: usize,
    prefix: &'a mut [u8],
    payload: &[u8],
    copy: &'a mut Vec<u64>,
) -> &'a [u8] {
    let heads = IN_HEADER_SIZE + op_len;
    let to: &mut [u8] = if head.payload_sz == 0 && heads % 8 == 0 {
        let start = prefix.len() - heads;
        &mut prefix[start..]
    } else {
        copy.clear();
        copy.resize(head.len.div_ceil(8), 0);
        &mut copy.as_mut_bytes()[..head.len]
    };
    to[..IN_HEADER_SIZE].copy_from_slice(&h[IN_OUT..IN_OUT + IN_HEADER_SIZE]);
    to[IN_HEADER_SIZE..heads].copy_from_slice(&h[OP_IN..OP_IN + op_len]);
    to[heads..].copy_from_slice(&payload[..head.payload_sz]);
    to
}

/// Serves the request in `entry` (`h`: its header, copied): rebuilt for
/// fuser and handed to `dispatch` with the session and the request's
/// generation, or answered EIO when it cannot be (module invariants: every
/// request is committed): a malformed request, a session gone (`session`
/// None), a request fuser cannot parse (`dispatch` returns false), a
/// handler that panicked. The reply may come later, from another thread.
/// Returns the request's unique and commit ids.
fn serve_request<S>(
    entry: &Entry,
    h: &[u8; HEADER_SIZE],
    session: Option<S>,
    copy: &mut Vec<u64>,
    qid: u16,
    dispatch: impl FnOnce(S, &[u8], u64) -> bool,
) -> (u64, u64) {
    let generation = entry.begin();
    let head = Head::read(h);
    let b = &entry.bufs;
    let (Some(op_len), Some(session)) = (head.op_len(b.payload_len), session) else {
        warn!("io_uring queue {qid}: a request not served (malformed, or the session ended)");
        entry.fail(head.unique);
        return (head.unique, head.commit_id);
    };
    // SAFETY: the kernel does not write the buffers until the commit, and
    // no reply writes the prefix; the payload is read here only, before
    // the handler runs (a late reply to an earlier request is dropped
    // since `begin`).
    let (prefix, payload) = unsafe {
        (
            std::slice::from_raw_parts_mut(b.area, PREFIX),
            std::slice::from_raw_parts(b.payload(), b.payload_len),
        )
    };
    let data = rebuild(h, &head, op_len, prefix, payload, copy);
    let served = std::panic::catch_unwind(AssertUnwindSafe(|| dispatch(session, data, generation)));
    match served {
        Ok(true) => {}
        Ok(false) => warn!("io_uring queue {qid}: a request fuser cannot parse"),
        Err(_) => error!("io_uring queue {qid}: a handler panicked; answered EIO"),
    }
    if !matches!(served, Ok(true)) {
        entry.fail(head.unique);
    }
    (head.unique, head.commit_id)
}

/// Reads the kernel's possible CPUs (`/sys/devices/system/cpu/possible`,
/// e.g. `0-3,8`): a queue for each, numbered by CPU id.
pub fn possible_cpus() -> io::Result<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "cannot read the possible CPUs");
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        cpus.extend(a..=b);
    }
    Ok(cpus)
}

fn pin_to(cpu: usize) {
    // cpu_set_t holds CPU_SETSIZE CPUs: a larger id stays unpinned.
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it (in bounds).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        // A CPU that is possible but offline (or outside our cpuset)
        // refuses: the thread runs anywhere, which is only slower.
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("io_uring queue {cpu}: not pinned: {}", io::Error::last_os_error());
        }
    }
}

/// Sets this thread's policy: SCHED_IDLE (`idle`) or SCHED_OTHER.
fn set_idle(idle: bool) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle { libc::SCHED_IDLE } else { libc::SCHED_OTHER };
    // SAFETY: a valid sched_param for this thread (0: the calling thread).
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// Whether the filesystem's callback (`Config::io_uring_quick`) calls the
/// request in an entry's header `h` quick: never without one, nor when it
/// panics (the entry must go on serving).
fn is_quick(quick: Option<fn(UringRequest) -> bool>, h: &[u8; HEADER_SIZE]) -> bool {
    let request = UringRequest::read(h);
    quick.is_some_and(|quick| std::panic::catch_unwind(|| quick(request)).unwrap_or(false))
}

/// Whether a thread may go to SCHED_IDLE and come back to SCHED_OTHER
/// (coming back needs CAP_SYS_NICE or a RLIMIT_NICE of 20): tried in a
/// thread of its own, which ends either way.
fn can_idle_and_return() -> bool {
    std::thread::Builder::new()
        .name("fuse-uring-probe".into())
        .spawn(|| set_idle(true) && set_idle(false))
        .is_ok_and(|t| t.join().unwrap_or(false))
}

/// The command area of the SQE: `struct fuse_uring_cmd_req`.
fn cmd_req(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    let at = offset_of!(abi::CmdReq, commit_id);
    cmd[at..at + 8].copy_from_slice(&commit_id.to_ne_bytes());
    let at = offset_of!(abi::CmdReq, qid);
    cmd[at..at + 2].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

fn sqe(fd: RawFd, op: u32, qid: u16, commit_id: u64, iov: Option<&[libc::iovec; 2]>) -> squeue::Entry128 {
    let mut b = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd_req(qid, commit_id));
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let e = b.build();
    if iov.is_none() {
        return e;
    }
    // `sqe->len`: the iovec count, which io-uring's builder does not set.
    // SAFETY: Entry128 is repr(C): a 64-byte io_uring_sqe, then 64 bytes;
    // `len` is the u32 at offset 24 of the SQE.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    unsafe { std::mem::transmute(raw) }
}

/// What the session hands the ring's threads once it runs.
pub(crate) struct Shared<FS: Filesystem> {
    /// Set by `run` (a weak reference: `run` takes the filesystem back at
    /// the end); never set if the session ends without running.
    pub(crate) fs: OnceLock<Weak<FilesystemHolder<FS>>>,
    /// True once `fs` is set, or the session ended without it.
    pub(crate) ready: Mutex<bool>,
    pub(crate) ready_cv: Condvar,
    /// Threads still alive (each counts itself out as it ends).
    pub(crate) alive: Mutex<usize>,
    pub(crate) alive_cv: Condvar,
}

impl<FS: Filesystem> Shared<FS> {
    pub(crate) fn new() -> Self {
        Shared {
            fs: OnceLock::new(),
            ready: Mutex::new(false),
            ready_cv: Condvar::new(),
            alive: Mutex::new(0),
            alive_cv: Condvar::new(),
        }
    }

    /// Lets the threads go: to serve (`fs` set) or to end.
    pub(crate) fn release(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ready_cv.notify_all();
    }

    /// Waits up to `limit` for every thread to have ended.
    pub(crate) fn wait_ended(&self, limit: std::time::Duration) -> bool {
        let alive = self.alive.lock().unwrap_or_else(|p| p.into_inner());
        let (alive, _) = self
            .alive_cv
            .wait_timeout_while(alive, limit, |n| *n > 0)
            .unwrap_or_else(|p| p.into_inner());
        *alive == 0
    }
}

/// Counts a thread out of `Shared::alive` when it ends, panicking or not.
struct Alive<FS: Filesystem>(Arc<Shared<FS>>);

impl<FS: Filesystem> Drop for Alive<FS> {
    fn drop(&mut self) {
        let mut n = self.0.alive.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        drop(n);
        self.0.alive_cv.notify_all();
    }
}

/// Rings and threads made, not yet registered (see [`prepare`]).
pub(crate) struct Prepared {
    /// None until `register` or drop: Some(true) to register, Some(false)
    /// to end.
    go: Arc<(Mutex<Option<bool>>, Condvar)>,
    results: mpsc::Receiver<io::Result<()>>,
    info: UringInfo,
}

impl Prepared {
    fn signal(&self, register: bool) {
        let (lock, cv) = &*self.go;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(register);
        cv.notify_all();
    }

    /// Submits every entry's REGISTER (after the INIT reply) and waits for
    /// each to be accepted or refused. A refusal also makes the kernel
    /// fall back to `/dev/fuse` (it clears the connection's io_uring), so
    /// an error here leaves a working mount on the classic transport —
    /// unless the other queues' entries still made the ring ready (every
    /// queue got one), in which case requests come through the ring all
    /// the same: the caller cannot tell which.
    pub(crate) fn register(self) -> io::Result<UringInfo> {
        self.signal(true);
        let total = self.info.queues * self.info.per_queue;
        let mut failed = Vec::new();
        for _ in 0..total {
            match self.results.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed.push(e),
                Err(_) => {
                    failed.push(io::Error::other("an io_uring thread ended before registering"));
                    break;
                }
            }
        }
        match failed.into_iter().next() {
            None => Ok(self.info.clone()),
            Some(e) => Err(io::Error::new(
                e.kind(),
                format!("registering the io_uring entries: {e}"),
            )),
        }
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // Not registered (an error before the INIT reply): the threads end.
        let (lock, _) = &*self.go;
        if lock.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            self.signal(false);
        }
    }
}

struct Worker<FS: Filesystem> {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// SCHED_IDLE while waiting and committing, SCHED_OTHER while serving
    /// (see `serve`).
    idle_between: bool,
    /// `Config::io_uring_quick`: requests served without leaving SCHED_IDLE.
    quick: Option<fn(UringRequest) -> bool>,
    dev: Arc<DevFuse>,
    qid: u16,
    entry: Arc<Entry>,
    shared: Arc<Shared<FS>>,
    allowed: SessionACL,
    owner: nix::unistd::Uid,
}

/// Makes `per_queue` entries for every queue, each with its ring, buffers
/// and a thread pinned to the queue's CPU, before the INIT reply: any
/// failure here (no io_uring for this process, no memory, no threads)
/// comes back as an error with nothing registered, and the reply must then
/// leave `FUSE_OVER_IO_URING` out.
pub(crate) fn prepare<FS: Filesystem + 'static>(
    dev: &Arc<DevFuse>,
    per_queue: usize,
    quick: Option<fn(UringRequest) -> bool>,
    payload_len: usize,
    shared: &Arc<Shared<FS>>,
    allowed: SessionACL,
    owner: nix::unistd::Uid,
) -> io::Result<Prepared> {
    let cpus = possible_cpus()?;
    // The kernel makes one queue per possible CPU and takes qid = CPU id
    // below their count: a gap in the ids leaves a CPU with no queue.
    if cpus.iter().enumerate().any(|(i, &c)| i != c) || cpus.len() > usize::from(u16::MAX) {
        return Err(io::Error::other(
            "the possible CPUs are not numbered 0..n (FUSE's io_uring queues need that)",
        ));
    }
    let payload_len = payload_len.max(MIN_PAYLOAD);
    let idle_between = can_idle_and_return();
    if !idle_between {
        debug!("io_uring threads stay SCHED_OTHER (no way back from SCHED_IDLE here)");
    }
    let (tx, results) = mpsc::channel::<io::Result<()>>();
    let prepared = Prepared {
        go: Arc::new((Mutex::new(None), Condvar::new())),
        results,
        info: UringInfo {
            queues: cpus.len(),
            per_queue,
        },
    };
    for &cpu in &cpus {
        for i in 0..per_queue {
            // Made here, so that a failure is known before the INIT reply
            // (`prepared` dropped on the error path ends the threads
            // already started).
            let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .build(4)
                .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
            let entry = Arc::new(Entry::new(payload_len)?);
            let worker = Worker {
                ring,
                idle_between,
                quick,
                dev: dev.clone(),
                qid: cpu as u16,
                entry,
                shared: shared.clone(),
                allowed,
                owner,
            };
            let tx = tx.clone();
            let go = prepared.go.clone();
            *shared.alive.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            let alive = Alive(shared.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-uring-{cpu}.{i}"))
                .spawn(move || {
                    let _alive = alive;
                    pin_to(cpu);
                    {
                        let (lock, cv) = &*go;
                        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
                        while g.is_none() {
                            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
                        }
                        if *g == Some(false) {
                            return;
                        }
                    }
                    // The iovecs naming the entry's buffers live as long as
                    // the thread (the kernel reads them when it issues the
                    // REGISTER).
                    let mut iov = [libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    }; 2];
                    let first = worker.register(&mut iov);
                    let ok = first.is_ok();
                    let _ = tx.send(first.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string())));
                    drop(tx);
                    if let (true, Ok(first)) = (ok, first) {
                        worker.serve(first);
                    }
                });
            if let Err(e) = spawned {
                // The closure (and its Alive) was dropped: counted out.
                return Err(e);
            }
        }
    }
    drop(tx);
    Ok(prepared)
}

impl<FS: Filesystem> Worker<FS> {
    /// Submits the REGISTER; the kernel refuses a bad one at once (its
    /// completion is already there), and keeps a good one pending until a
    /// request arrives. Returns a completion already reaped: a request
    /// that came at once (the last queue's registration readies the ring).
    fn register(&self, iov: &mut [libc::iovec; 2]) -> io::Result<Option<i32>> {
        let b = &self.entry.bufs;
        *iov = [
            libc::iovec {
                iov_base: b.header.cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                iov_base: b.payload().cast(),
                iov_len: b.payload_len,
            },
        ];
        let e = sqe(self.dev.as_raw_fd(), CMD_REGISTER, self.qid, 0, Some(&*iov));
        // SAFETY: the iovecs and the buffers they name outlive the
        // submission (the caller keeps `iov`; the buffers live as long as
        // this worker, whose ring is closed before them).
        unsafe {
            self.ring
                .submission_shared()
                .push(&e)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        self.ring.submit()?;
        // SAFETY: only this thread reads the completion queue.
        match unsafe { self.ring.completion_shared() }.next() {
            Some(c) if c.result() < 0 => Err(io::Error::from_raw_os_error(-c.result())),
            Some(c) => Ok(Some(c.result())),
            None => Ok(None),
        }
    }

    fn serve(self, mut first: Option<i32>) {
        // Wait for the session to run (requests wait in the kernel).
        {
            let mut go = self.shared.ready.lock().unwrap_or_else(|p| p.into_inner());
            while !*go {
                go = self.shared.ready_cv.wait(go).unwrap_or_else(|p| p.into_inner());
            }
        }
        let weak = self.shared.fs.get().cloned();
        let se_ch = Channel::new(self.dev.clone());
        let mut copy: Vec<u64> = Vec::new();
        // Where the caller wakes up: the commit below wakes the process
        // that made the request, while this thread still runs on its CPU.
        // A CPU running only SCHED_IDLE threads counts as idle when the
        // scheduler places a waking task, so the caller stays on its CPU
        // (its next request comes back to this queue, its wakeups are
        // local); with this thread SCHED_OTHER the caller is moved to the
        // other, idle CPU at every reply, an IPI and a cold vCPU each (on
        // the 2-core VM of BENCHMARKS.md: 60 us a round trip instead of
        // 15). While serving anything but a request the filesystem calls
        // quick (`Config::io_uring_quick`: none unless it says), the
        // thread is SCHED_OTHER again, so that a busy CPU cannot starve a
        // handler that writes, publishes or flushes.
        if self.idle_between {
            set_idle(true);
        }
        loop {
            let result = match first.take() {
                Some(r) => r,
                None => {
                    match self.ring.submit_and_wait(1) {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                        // Transient: the submission stays queued; try again.
                        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY | libc::ENOMEM)) => {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            continue;
                        }
                        Err(e) => {
                            error!("io_uring queue {}: {e}: this entry stops serving", self.qid);
                            // The kernel may still hold the entry: its
                            // buffers are never freed.
                            std::mem::forget(self.entry.clone());
                            return;
                        }
                    }
                    // SAFETY: only this thread reads the completion queue.
                    match unsafe { self.ring.completion_shared() }.next() {
                        Some(c) => c.result(),
                        None => continue,
                    }
                }
            };
            if result < 0 {
                let e = io::Error::from_raw_os_error(-result);
                match -result {
                    // The ring is torn down: unmount, or the connection aborted.
                    libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED => {
                        debug!("io_uring queue {}: {e}", self.qid);
                    }
                    _ => error!("io_uring queue {}: {e}: this entry stops serving", self.qid),
                }
                return;
            }
            // SCHED_OTHER to serve anything but a quick request.
            // The header, copied once: the kernel does not write it until
            // the commit.
            let h = self.entry.bufs.read_header();
            let raised = self.idle_between && !is_quick(self.quick, &h) && {
                let ok = set_idle(false);
                if !ok {
                    warn!("io_uring queue {}: could not leave SCHED_IDLE to serve", self.qid);
                }
                ok
            };
            let (_, commit_id) = self.serve_one(&h, weak.as_ref(), &se_ch, &mut copy);
            // Answered by now, or answered EIO here (module invariants).
            {
                let mut replied = self.entry.replied.lock().unwrap_or_else(|p| p.into_inner());
                while !replied.done {
                    replied.waiting = true;
                    replied = self.entry.done.wait(replied).unwrap_or_else(|p| p.into_inner());
                }
            }
            if raised {
                set_idle(true);
            }
            let e = sqe(self.dev.as_raw_fd(), CMD_COMMIT_AND_FETCH, self.qid, commit_id, None);
            // SAFETY: the entry's buffers were registered and live on.
            if unsafe { self.ring.submission_shared().push(&e) }.is_err() {
                error!("io_uring queue {}: submission queue full", self.qid);
                return;
            }
        }
    }

    /// Takes the request the kernel put in the entry's buffers and
    /// dispatches it ([`serve_request`]); returns its unique and commit ids.
    fn serve_one(
        &self,
        h: &[u8; HEADER_SIZE],
        weak: Option<&Weak<FilesystemHolder<FS>>>,
        se_ch: &Channel,
        copy: &mut Vec<u64>,
    ) -> (u64, u64) {
        let fs = weak.and_then(Weak::upgrade);
        serve_request(&self.entry, h, fs, copy, self.qid, |fs, data, generation| {
            let se = SessionEventLoop {
                thread_name: String::new(),
                ch: se_ch.clone(),
                filesystem: fs,
                allowed: self.allowed,
                session_owner: self.owner,
            };
            let sender = ChannelSender::to_entry(self.dev.clone(), self.entry.clone(), generation);
            match RequestWithSender::new(sender, data) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<ReplyEmpty>().ok();
                    } else {
                        req.dispatch(&se);
                    }
                    true
                }
                None => false,
            }
        })
    }
}

#[cfg(test)]
mod tests;
