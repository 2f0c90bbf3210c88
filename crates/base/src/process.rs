//! Processes and the ids they run as: whether one exists, its name, the
//! calling thread's id, this process's effective ids and its umask. Locks:
//! only the `process_name` cache's own mutex, a leaf.

use std::io;

/// Whether a process `pid` exists (any user's; a zombie counts).
pub fn process_exists(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks that `pid` can be signalled; nothing
    // is sent, and no memory is touched.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The calling thread's id (what FUSE gives as a request's pid).
pub fn gettid() -> u32 {
    // SAFETY: gettid(2) cannot fail and touches no memory.
    unsafe { libc::gettid() as u32 }
}

/// The process name of `pid` (from `/proc/<pid>/comm`), or `?`. Names are
/// remembered for a second: a writer makes many changes in a row, and a pid
/// is not reused that fast.
pub fn process_name(pid: u32) -> String {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    static CACHE: Mutex<Option<HashMap<u32, (String, Instant)>>> = Mutex::new(None);
    let now = Instant::now();
    if let Ok(mut c) = CACHE.lock()
        && let Some((name, at)) = c.get_or_insert_with(HashMap::new).get(&pid)
        && now.duration_since(*at) < Duration::from_secs(1)
    {
        return name.clone();
    }
    let name = match std::fs::read(format!("/proc/{pid}/comm")) {
        Ok(mut b) => {
            while b.last() == Some(&b'\n') {
                b.pop();
            }
            String::from_utf8_lossy(&b).into_owned()
        }
        Err(_) => "?".to_string(),
    };
    if let Ok(mut c) = CACHE.lock() {
        let map = c.get_or_insert_with(HashMap::new);
        if map.len() > 4096 {
            map.clear();
        }
        map.insert(pid, (name.clone(), now));
    }
    name
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Sets the file mode creation mask; returns the previous one.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: umask cannot fail and touches no memory.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

pub fn getegid() -> u32 {
    // SAFETY: getegid cannot fail and touches no memory.
    unsafe { libc::getegid() }
}
