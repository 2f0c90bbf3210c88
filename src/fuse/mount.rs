//! Mounting: the session over ROOT (mount(2) as root, `fusermount3`
//! otherwise), its options, and the core's cache notices wired to the
//! kernel.
//!
//! Locks: none.

use super::*;

/// A mounted session, ready to serve.
pub struct Mounted(fuser::Session<FuseAdapter>);

impl Mounted {
    /// Serves requests until the filesystem is unmounted.
    pub fn run(self) -> std::io::Result<()> {
        self.0.run()
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
) -> std::io::Result<Mounted> {
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
    let adapter = FuseAdapter::new(Arc::clone(&fs));
    let session = if crate::sys::geteuid() == 0 {
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
    Ok(Mounted(session))
}
