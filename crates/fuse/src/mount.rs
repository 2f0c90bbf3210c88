//! Mounting: the session over ROOT (mount(2) as root, `fusermount3`
//! otherwise), its options, and the core's cache notices wired to the
//! kernel.
//!
//! Locks: none.

use super::*;

/// A mounted session, ready to serve.
pub struct Mounted {
    session: fuser::Session<FuseAdapter>,
    /// How requests reach the daemon, as `skillfs status` shows it.
    pub transport: String,
}

impl Mounted {
    /// Serves requests until the filesystem is unmounted.
    pub fn run(self) -> std::io::Result<()> {
        self.session.run()
    }
}

/// How the kernel sends requests: `/dev/fuse` reads (classic), or FUSE
/// over io_uring (Linux 6.14 and later, with `fuse.enable_uring=1`): one
/// queue per CPU, a request served on its caller's CPU (see ARCHITECTURE.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Transport {
    /// io_uring when the kernel offers it, classic otherwise.
    Auto,
    /// io_uring or no mount.
    Uring,
    /// `/dev/fuse` reads only.
    Classic,
}

/// The module parameter that lets the kernel offer io_uring at INIT.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why the kernel will not offer io_uring, if it will not. (A debug
/// build's tests point `SKILLFS_TEST_ENABLE_URING` at a file of their own
/// to see the refusal and the fallback without switching the kernel's
/// parameter.)
pub fn uring_unavailable() -> Option<String> {
    let param = if cfg!(debug_assertions) {
        std::env::var("SKILLFS_TEST_ENABLE_URING").unwrap_or_else(|_| ENABLE_URING.into())
    } else {
        ENABLE_URING.to_string()
    };
    let param = param.as_str();
    match std::fs::read_to_string(param) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => None,
        Ok(_) => Some(format!(
            "{param} is off (as root: echo 1 > {param}; see docs/guide.md, \"Faster: FUSE over io_uring\")"
        )),
        Err(_) => Some(format!(
            "this kernel has no FUSE over io_uring ({param} is missing: it needs Linux 6.14 or \
             later built with CONFIG_FUSE_IO_URING)"
        )),
    }
}

/// io_uring entries per CPU queue: each is a thread, so a handler that
/// blocks (an fsync, a publish) holds one while the others serve; at least
/// 2, at most 8, and fewer on a host with many possible CPUs (every one
/// gets a queue): no more than 64 in all unless that leaves fewer than 2.
fn per_queue(threads: usize) -> usize {
    let cpus = fuser::possible_cpus().map_or(1, |c| c.len().max(1));
    threads.clamp(2, 8).min(64 / cpus).max(2)
}

/// Requests whose handlers take microseconds and never publish or flush:
/// the fork's ring threads serve them without leaving SCHED_IDLE (two
/// system calls fewer; ARCHITECTURE.md, "Where the caller wakes up"), and
/// every other request at SCHED_OTHER. An OPEN or RELEASE counts only for
/// a read-only handle (an open with O_TRUNC, or the release of a written
/// handle, publishes).
fn quick(request: fuser::UringRequest) -> bool {
    /// The kernel's opcodes (`enum fuse_opcode` in `linux/fuse.h`).
    const LOOKUP: u32 = 1;
    const GETATTR: u32 = 3;
    const READLINK: u32 = 5;
    const OPEN: u32 = 14;
    const STATFS: u32 = 17;
    const RELEASE: u32 = 18;
    const GETXATTR: u32 = 22;
    const LISTXATTR: u32 = 23;
    const OPENDIR: u32 = 27;
    const RELEASEDIR: u32 = 29;
    const ACCESS: u32 = 34;
    const IOCTL: u32 = 39;
    const LSEEK: u32 = 46;
    let read_only = |flags: fuser::OpenFlags| {
        flags.0 & libc::O_ACCMODE == libc::O_RDONLY && flags.0 & libc::O_TRUNC == 0
    };
    match request.opcode {
        OPEN | RELEASE => request.flags.is_some_and(read_only),
        op => [
            LOOKUP, GETATTR, IOCTL, OPENDIR, RELEASEDIR, ACCESS, READLINK, STATFS, GETXATTR,
            LISTXATTR, LSEEK,
        ]
        .contains(&op),
    }
}

/// Whether /etc/fuse.conf lets unprivileged users mount with `allow_other`.
fn user_allow_other() -> bool {
    std::fs::read_to_string("/etc/fuse.conf").is_ok_and(|c| {
        c.lines()
            .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other")
    })
}

/// Mounts `fs` on `root` (as root through mount(2), otherwise through
/// `fusermount3`) and wires the core's cache invalidations to the kernel.
///
/// `allow_other`: other users may enter (`allow_other`, and fuser's request
/// filter opened to every uid); `default_permissions` makes the kernel
/// check modes and owners for them as on any filesystem. Without it only
/// the mounting user may (the kernel refuses the rest, root included).
pub fn mount(
    fs: Arc<SkillFs>,
    root: &Path,
    fsname: &str,
    threads: usize,
    allow_other: bool,
    transport: Transport,
) -> std::io::Result<Mounted> {
    // Refused before anything is mounted.
    let why_not = uring_unavailable();
    if transport == Transport::Uring
        && let Some(why) = &why_not
    {
        return Err(std::io::Error::other(format!("--transport uring: {why}")));
    }
    let want_uring = transport != Transport::Classic && why_not.is_none();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(fsname.to_string()),
        fuser::MountOption::Subtype("skillfs".to_string()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    config.acl = if allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    config.io_uring_per_queue = if want_uring { per_queue(threads) } else { 0 };
    config.io_uring_quick = Some(quick);
    let mut adapter = FuseAdapter::new(Arc::clone(&fs));
    adapter.uring = want_uring;
    let session = if skillfs_base::process::geteuid() == 0 {
        fuser::Session::new(adapter, root, &config)?
    } else {
        let mut opts = format!("fsname={fsname},subtype=skillfs,default_permissions,nodev,nosuid");
        if allow_other {
            if !user_allow_other() {
                return Err(std::io::Error::other(
                    "--allow-other needs a line 'user_allow_other' in /etc/fuse.conf \
                     (as root: echo user_allow_other >> /etc/fuse.conf)",
                ));
            }
            opts.push_str(",allow_other");
        }
        let fd = crate::fusermount::mount(root, &opts)?;
        fuser::Session::from_fd(adapter, fd, config.acl, config)?
    };
    // The handshake has set io_uring up, or left it out of the INIT reply.
    let used = match (session.uring(), session.uring_not_started()) {
        (Some(Ok(info)), _) => Ok(format!(
            "io_uring ({} queues, {} entries each)",
            info.queues, info.per_queue
        )),
        (Some(Err(e)), _) => Err(format!(
            "the kernel refused a registration ({e}): requests come through /dev/fuse, or \
             through the entries that did register if every CPU got one"
        )),
        (None, Some(e)) => Err(format!("it could not be set up ({e})")),
        (None, None) => Err(match (transport, &why_not) {
            (Transport::Classic, _) => "--transport classic".to_string(),
            (_, Some(why)) => why.clone(),
            (_, None) => "the kernel did not offer it at INIT".to_string(),
        }),
    };
    let transport = match used {
        Ok(t) => t,
        Err(why) if transport == Transport::Uring => {
            // Mounted already: taken down before the error is told. As root
            // the session's drop unmounts; a user's mount (made by
            // fusermount3) is detached here, if it is still ours.
            let ours = skillfs_base::mounts::mount_at(root).is_some_and(|m| {
                m.skillfs_store().is_some() && m.source.as_os_str().as_bytes() == fsname.as_bytes()
            });
            drop(session);
            if ours && skillfs_base::process::geteuid() != 0 {
                let _ = skillfs_base::mounts::lazy_unmount(root);
            }
            return Err(std::io::Error::other(format!("--transport uring: {why}")));
        }
        Err(why) => format!("classic ({why})"),
    };
    tracing::info!("transport: {transport}");
    // Invalidations are sent from their own thread: a notification written
    // from inside a request handler can wait on the very kernel locks that
    // request holds.
    let notifier = session.notifier();
    let (tx, rx) = std::sync::mpsc::channel::<Invalidation>();
    std::thread::Builder::new()
        .name("invalidate".into())
        .spawn(move || {
            for inval in rx {
                let r = match &inval {
                    Invalidation::Inode(ino) => notifier.inval_inode(INodeNo(*ino), 0, 0),
                    Invalidation::Entry(parent, name) => {
                        notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
                    }
                    Invalidation::Barrier(done) => {
                        let _ = done.send(());
                        Ok(())
                    }
                };
                if let Err(e) = r {
                    tracing::debug!("invalidate: {e}");
                }
            }
        })?;
    let tx = std::sync::Mutex::new(tx);
    fs.set_invalidator(Box::new(move |inval| {
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(inval);
        }
    }));
    // Stores are written from a thread of their own too: one can wait on
    // the page lock of a read in flight, and invalidations must not wait
    // behind it.
    let notifier = session.notifier();
    fs.start_page_store(Box::new(move |op| {
        let r = match op {
            PageOp::Store(ino, offset, data) => notifier.store(INodeNo(ino), offset, data),
            PageOp::Forget(ino) => notifier.inval_inode(INodeNo(ino), 0, 0),
        };
        if let Err(e) = r {
            tracing::debug!("page store: {e}");
        }
    }))?;
    Ok(Mounted { session, transport })
}

#[cfg(test)]
mod tests {
    use super::quick;
    use fuser::{OpenFlags, UringRequest};

    fn request(opcode: u32, flags: Option<i32>) -> UringRequest {
        UringRequest {
            opcode,
            flags: flags.map(OpenFlags),
        }
    }

    #[test]
    fn quick_requests_are_the_short_reads_and_read_only_handles() {
        // LOOKUP, GETATTR, READLINK, STATFS, ACCESS, IOCTL, LSEEK.
        for op in [1, 3, 5, 17, 34, 39, 46] {
            assert!(quick(request(op, None)), "opcode {op}");
        }
        // SETATTR, WRITE, FSYNC, FLUSH, CREATE, RENAME2.
        for op in [4, 16, 20, 25, 35, 45] {
            assert!(!quick(request(op, None)), "opcode {op}");
        }
        // OPEN (14) and RELEASE (18): only of a read-only handle.
        for op in [14, 18] {
            assert!(quick(request(op, Some(libc::O_RDONLY))));
            assert!(!quick(request(op, Some(libc::O_RDONLY | libc::O_TRUNC))));
            assert!(!quick(request(op, Some(libc::O_WRONLY))));
            assert!(!quick(request(op, Some(libc::O_RDWR))));
        }
    }
}
