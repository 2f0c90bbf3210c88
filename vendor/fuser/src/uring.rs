//! FUSE over io_uring (Linux 6.14 and later, `fuse.enable_uring=1`).
//!
//! skillfs's addition to this fork of fuser 0.18. The protocol is the
//! kernel's `Documentation/filesystems/fuse-io-uring.rst`, as libfuse's
//! `lib/fuse_uring.c` speaks it:
//!
//! - INIT is answered with `FUSE_OVER_IO_URING` (the filesystem asks for it
//!   in `init`, and the kernel offers it only while `enable_uring` is on).
//! - The kernel keeps one queue per possible CPU; a request is put on the
//!   queue of the CPU its caller runs on. Each queue needs ring entries: a
//!   header buffer (`struct fuse_uring_req_header`: the in/out header, the
//!   operation's own header, and the entry's commit id and payload size)
//!   and a payload buffer of at least the largest write. An entry is
//!   registered by an `IORING_OP_URING_CMD` (`FUSE_IO_URING_CMD_REGISTER`,
//!   the two buffers as iovecs); its completion carries a request; the
//!   reply is written into the same buffers and sent with
//!   `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the next.
//! - Once every queue has an entry, the kernel sends every request there,
//!   except FORGET and INTERRUPT, which still come through `/dev/fuse`:
//!   the classic threads keep reading it.
//!
//! Design: one thread per ring entry, each with its own small io_uring and
//! pinned to its queue's CPU (where the kernel wakes it, so a request is
//! served on its caller's CPU). A handler that blocks (an fsync, a
//! publish) holds only its own entry: the queue's other entries keep
//! taking requests, so one slow call never stalls its CPU's queue.
//!
//! A reply may be sent from any thread (fuser's reply objects can move):
//! it is written into the entry's buffers under their lock, and the entry's
//! thread commits it once the handler has replied.

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;
use std::sync::Weak;
use std::sync::mpsc;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::dev_fuse::DevFuse;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

/// `struct fuse_uring_req_header`: in/out header, op header, entry info.
const IN_OUT: usize = 0;
const OP_IN: usize = 128;
const OP_IN_SIZE: usize = 128;
const ENT_IN_OUT: usize = 256;
const HEADER_SIZE: usize = 288;
/// `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HEADER_SIZE: usize = 40;
const OUT_HEADER_SIZE: usize = 16;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The kernel's FUSE_MIN_READ_BUFFER.
const MIN_PAYLOAD: usize = 8192;

/// How the session talks to the kernel, once `Session::start_uring` has
/// answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringInfo {
    /// Queues registered (the kernel's possible CPUs).
    pub queues: usize,
    /// Ring entries (and threads) per queue.
    pub per_queue: usize,
}

/// An entry's two buffers, as the kernel reads and writes them. 8-byte
/// aligned (the headers are read in place); their addresses never change.
struct Buffers {
    header: Box<[u64; HEADER_SIZE / 8]>,
    payload: Vec<u64>,
    payload_len: usize,
    /// Set once the handler's reply is in the buffers.
    replied: bool,
}

impl Buffers {
    fn header(&mut self) -> &mut [u8] {
        // SAFETY: a [u64; 36] is 288 initialized bytes.
        unsafe { std::slice::from_raw_parts_mut(self.header.as_mut_ptr().cast(), HEADER_SIZE) }
    }

    fn payload(&mut self) -> &mut [u8] {
        // SAFETY: the Vec holds payload_len / 8 (rounded up) initialized u64s.
        unsafe { std::slice::from_raw_parts_mut(self.payload.as_mut_ptr().cast(), self.payload_len) }
    }
}

/// One ring entry: where its reply goes.
pub(crate) struct Entry {
    bufs: Mutex<Buffers>,
    replied: Condvar,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("uring::Entry")
    }
}

impl Entry {
    /// Writes a reply (fuser's iovecs: the out header, then the data) into
    /// the entry's buffers: the header in `in_out`, the rest as payload.
    pub(crate) fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let mut b = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        let mut head = [0u8; OUT_HEADER_SIZE];
        let (mut h, mut n) = (0, 0);
        let mut too_long = false;
        {
            let payload = b.payload();
            for slice in data {
                let mut s: &[u8] = slice;
                // The header first (fuser sends it as the first slice).
                let take = s.len().min(OUT_HEADER_SIZE - h);
                head[h..h + take].copy_from_slice(&s[..take]);
                h += take;
                s = &s[take..];
                if n + s.len() > payload.len() {
                    too_long = true;
                    break;
                }
                payload[n..n + s.len()].copy_from_slice(s);
                n += s.len();
            }
        }
        if too_long {
            // The kernel sized the payload for its largest request; a
            // longer reply is the filesystem's bug: the caller gets EIO.
            warn!("io_uring reply longer than the payload buffer");
            head[8..12].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            n = 0;
        }
        let header = b.header();
        header[IN_OUT..IN_OUT + OUT_HEADER_SIZE].copy_from_slice(&head);
        header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(n as u32).to_ne_bytes());
        b.replied = true;
        drop(b);
        self.replied.notify_all();
        Ok(())
    }
}

/// Reads the kernel's possible CPUs (`/sys/devices/system/cpu/possible`,
/// e.g. `0-3,8`): the number of queues is their count, qid their index.
fn possible_cpus() -> io::Result<Vec<usize>> {
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
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        // A CPU that is possible but offline refuses: the thread runs
        // anywhere, which is only slower.
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("io_uring queue {cpu}: not pinned: {}", io::Error::last_os_error());
        }
    }
}

/// The command area of the SQE: `struct fuse_uring_cmd_req`.
fn cmd_req(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
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

struct Worker<FS: Filesystem> {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    dev: Arc<DevFuse>,
    qid: u16,
    entry: Arc<Entry>,
    fs: Arc<std::sync::OnceLock<Weak<FilesystemHolder<FS>>>>,
    ready: Arc<(Mutex<bool>, Condvar)>,
    allowed: SessionACL,
    owner: nix::unistd::Uid,
}

/// Registers `per_queue` entries on every queue, each served by a thread
/// of its own. Returns once every registration has been accepted or one
/// refused (then the ring is never ready and the kernel keeps using
/// `/dev/fuse`). The threads serve once `fs` is set, and end when the
/// kernel tears the ring down (unmount) or the process exits.
pub(crate) fn start<FS: Filesystem + 'static>(
    dev: &Arc<DevFuse>,
    per_queue: usize,
    payload_len: usize,
    fs: Arc<std::sync::OnceLock<Weak<FilesystemHolder<FS>>>>,
    ready: Arc<(Mutex<bool>, Condvar)>,
    allowed: SessionACL,
    owner: nix::unistd::Uid,
) -> io::Result<UringInfo> {
    let cpus = possible_cpus()?;
    let payload_len = payload_len.max(MIN_PAYLOAD);
    let (tx, rx) = mpsc::channel::<io::Result<()>>();
    let mut started = 0;
    // The kernel numbers its queues by CPU id (a request goes to the queue
    // of `task_cpu`), one per possible CPU.
    for &cpu in &cpus {
        let qid = cpu;
        for i in 0..per_queue {
            let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .build(4)
                .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
            let entry = Arc::new(Entry {
                bufs: Mutex::new(Buffers {
                    header: Box::new([0u64; HEADER_SIZE / 8]),
                    payload: vec![0u64; payload_len.div_ceil(8)],
                    payload_len,
                    replied: false,
                }),
                replied: Condvar::new(),
            });
            let worker = Worker {
                ring,
                dev: dev.clone(),
                qid: qid as u16,
                entry,
                fs: fs.clone(),
                ready: ready.clone(),
                allowed,
                owner,
            };
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("fuse-uring-{qid}.{i}"))
                .spawn(move || {
                    pin_to(cpu);
                    match worker.register() {
                        Ok(first) => {
                            let _ = tx.send(Ok(()));
                            worker.serve(first);
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                })?;
            started += 1;
        }
    }
    drop(tx);
    for _ in 0..started {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("an io_uring thread ended at start")),
        }
    }
    Ok(UringInfo {
        queues: cpus.len(),
        per_queue,
    })
}

impl<FS: Filesystem> Worker<FS> {
    /// Submits the REGISTER; the kernel refuses a bad one at once (its
    /// completion is already there), and keeps a good one pending until a
    /// request arrives. Returns a completion already reaped: a request
    /// that came at once (the last queue's registration readies the ring).
    fn register(&self) -> io::Result<Option<i32>> {
        let (hdr, pay, len) = {
            let mut b = self.entry.bufs.lock().unwrap_or_else(|p| p.into_inner());
            let len = b.payload_len;
            (b.header().as_mut_ptr(), b.payload().as_mut_ptr(), len)
        };
        let iov = Box::new([
            libc::iovec {
                iov_base: hdr.cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                iov_base: pay.cast(),
                iov_len: len,
            },
        ]);
        let e = sqe(self.dev.as_raw_fd(), CMD_REGISTER, self.qid, 0, Some(&iov));
        // SAFETY: the iovecs and the buffers they point at outlive the
        // submission (the kernel copies the iovecs at submit; the buffers
        // live as long as this worker).
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
            let (lock, cv) = &*self.ready;
            let mut go = lock.lock().unwrap_or_else(|p| p.into_inner());
            while !*go {
                go = cv.wait(go).unwrap_or_else(|p| p.into_inner());
            }
        }
        let Some(weak) = self.fs.get().cloned() else {
            return;
        };
        let se_ch = Channel::new(self.dev.clone());
        let mut req_buf = vec![0u64; (IN_HEADER_SIZE + OP_IN_SIZE + self.payload_len()).div_ceil(8)];
        loop {
            let result = match first.take() {
                Some(r) => r,
                None => {
                    match self.ring.submit_and_wait(1) {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                        Err(e) => {
                            warn!("io_uring queue {}: {e}", self.qid);
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
                // ENOTCONN, ECANCELED: the ring is torn down (unmount).
                debug!("io_uring queue {}: {}", self.qid, io::Error::from_raw_os_error(-result));
                return;
            }
            let (len, commit_id) = match self.take_request(&mut req_buf) {
                Some(x) => x,
                None => {
                    warn!("io_uring queue {}: a malformed request", self.qid);
                    return;
                }
            };
            // SAFETY: req_buf holds `len` initialized bytes, 8-aligned.
            let data = unsafe { std::slice::from_raw_parts(req_buf.as_ptr().cast::<u8>(), len) };
            let Some(fs) = weak.upgrade() else {
                return;
            };
            let se = SessionEventLoop {
                thread_name: String::new(),
                ch: se_ch.clone(),
                filesystem: fs,
                allowed: self.allowed,
                session_owner: self.owner,
            };
            let sender = ChannelSender::to_entry(self.dev.clone(), self.entry.clone());
            match RequestWithSender::new(sender, data) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<ReplyEmpty>().ok();
                    } else {
                        req.dispatch(&se);
                    }
                }
                None => {
                    // Unparseable: answer EIO so the caller is not left waiting.
                    let unique = u64::from_ne_bytes(data[8..16].try_into().unwrap_or_default());
                    let mut out = [0u8; OUT_HEADER_SIZE];
                    out[0..4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
                    out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
                    out[8..16].copy_from_slice(&unique.to_ne_bytes());
                    let _ = self.entry.send(&[io::IoSlice::new(&out)]);
                }
            }
            drop(se);
            // A reply sent from another thread: wait for it (the entry is
            // this thread's alone until it is committed).
            {
                let mut b = self.entry.bufs.lock().unwrap_or_else(|p| p.into_inner());
                while !b.replied {
                    b = self.entry.replied.wait(b).unwrap_or_else(|p| p.into_inner());
                }
            }
            let e = sqe(self.dev.as_raw_fd(), CMD_COMMIT_AND_FETCH, self.qid, commit_id, None);
            // SAFETY: the entry's buffers were registered and live on.
            if unsafe { self.ring.submission_shared().push(&e) }.is_err() {
                warn!("io_uring queue {}: submission queue full", self.qid);
                return;
            }
        }
    }

    fn payload_len(&self) -> usize {
        self.entry.bufs.lock().unwrap_or_else(|p| p.into_inner()).payload_len
    }

    /// Copies the request the kernel put in the entry's buffers into
    /// `out` as `/dev/fuse` would have delivered it (in header, the op's
    /// header, the payload), and clears the reply flag. Returns its
    /// length and commit id.
    fn take_request(&self, out: &mut [u64]) -> Option<(usize, u64)> {
        let mut b = self.entry.bufs.lock().unwrap_or_else(|p| p.into_inner());
        b.replied = false;
        let payload_len = b.payload_len;
        let mut h = [0u8; HEADER_SIZE];
        h.copy_from_slice(b.header());
        let len = u32::from_ne_bytes(h[0..4].try_into().ok()?) as usize;
        let commit_id = u64::from_ne_bytes(h[ENT_IN_OUT + 8..ENT_IN_OUT + 16].try_into().ok()?);
        let payload_sz = u32::from_ne_bytes(h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].try_into().ok()?) as usize;
        let op_len = len.checked_sub(IN_HEADER_SIZE)?.checked_sub(payload_sz)?;
        if op_len > OP_IN_SIZE || payload_sz > payload_len {
            return None;
        }
        // SAFETY: `out` is sized for the largest request.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 8) };
        if len > dst.len() {
            return None;
        }
        dst[..IN_HEADER_SIZE].copy_from_slice(&h[IN_OUT..IN_OUT + IN_HEADER_SIZE]);
        dst[IN_HEADER_SIZE..IN_HEADER_SIZE + op_len].copy_from_slice(&h[OP_IN..OP_IN + op_len]);
        let payload = b.payload();
        dst[IN_HEADER_SIZE + op_len..len].copy_from_slice(&payload[..payload_sz]);
        Some((len, commit_id))
    }
}
