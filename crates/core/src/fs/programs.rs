//! Programs running from a file, and the truncating opens they refuse.
//!
//! Owns: which handles of an inode an `execve` opened (`OpenState::programs`,
//! the callers' pids), whether such a process still runs, and the answer
//! to an open that would empty the file under it.
//! Why here: with FUSE_ATOMIC_O_TRUNC the daemon empties the file while
//! answering the open, before the kernel's own check for a running program
//! (`handle_truncate`); an open without write access (`O_RDONLY | O_TRUNC`,
//! access mode 3) is not stopped by the kernel's earlier write-access
//! check, so the daemon refuses it as the kernel would (ETXTBSY).
//! Invariants: a pid is counted when the open carries `__FMODE_EXEC` and
//! dropped at that handle's release; the check is made again under the
//! open state's lock right where the file is emptied (see `open`, `create`).

use super::*;

/// `__FMODE_EXEC`: the open of an `execve` (the kernel passes its file
/// flags on to FUSE_OPEN as they are).
const FMODE_EXEC: i32 = 0x20;

/// Counts an open of `flags` into `of`'s programs if an `execve` made it.
pub(super) fn counted_program(of: &OpenFile, flags: i32, caller: &Caller) -> Option<u32> {
    (flags & FMODE_EXEC != 0).then(|| {
        of.lock().programs.push(caller.pid);
        caller.pid
    })
}

/// Whether an open of `flags` empties the file without the write access
/// the kernel takes first for `O_WRONLY` and `O_RDWR` (which a running
/// program refuses): `O_TRUNC` with `O_RDONLY` or access mode 3.
pub(super) fn truncates_unguarded(flags: i32) -> bool {
    flags & libc::O_TRUNC != 0 && !matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
}

/// Whether a process that opened the file to run it (`pids`, from its
/// open state) still runs: not gone, and no zombie (a zombie let go of
/// its memory, the executable with it).
pub(super) fn program_alive(pids: &[u32]) -> bool {
    pids.iter().any(|pid| {
        std::fs::read(format!("/proc/{pid}/stat")).is_ok_and(|st| {
            // The state follows the last ')' (the name may hold one).
            st.iter()
                .rposition(|&b| b == b')')
                .and_then(|i| st.get(i + 2))
                .is_some_and(|state| !matches!(state, b'Z' | b'X'))
        })
    })
}

/// The answer to a truncating open of a running program.
pub(super) fn busy_program(ino: Ino) -> FsError {
    tracing::info!("refused to truncate inode {ino}: a program runs from it (ETXTBSY)");
    FsError::of(libc::ETXTBSY)
}

/// Whether an open waits for a program's RELEASE now (one at a time).
static WAITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl SkillFs {
    /// Whether a program runs from `ino`: an `execve`'s handle of it is
    /// open (the kernel holds it as the executable of the processes that
    /// run it, and refuses writes to the file, until the last of them
    /// ends). Seen whoever runs it, from whatever path. One whose process
    /// is still there answers at once. The RELEASE of a program that
    /// just ended comes a moment after its end: with `wait` (and no lock
    /// held), one open at a time gives it up to 100 ms; a handle still
    /// open then (a child the program forked runs it on) is a program.
    pub(super) fn runs_as_program(&self, ino: Ino, wait: bool) -> bool {
        let pids = |of: &OpenFile| of.lock().programs.clone();
        let Some(of) = self.open_files.get(ino) else {
            return false;
        };
        let now = pids(&of);
        if now.is_empty() {
            return false;
        }
        if program_alive(&now) || !wait || WAITING.swap(true, Ordering::AcqRel) {
            return true;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
        let running = loop {
            if pids(&of).is_empty() {
                break false;
            }
            if std::time::Instant::now() >= deadline {
                break true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        WAITING.store(false, Ordering::Release);
        running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_truncate_without_write_access_is_unguarded() {
        assert!(truncates_unguarded(libc::O_RDONLY | libc::O_TRUNC));
        assert!(truncates_unguarded(libc::O_ACCMODE | libc::O_TRUNC));
        assert!(!truncates_unguarded(libc::O_WRONLY | libc::O_TRUNC));
        assert!(!truncates_unguarded(libc::O_RDWR | libc::O_TRUNC));
        assert!(!truncates_unguarded(libc::O_RDONLY));
    }

    /// A running process is alive; a zombie and a reaped one are not.
    #[test]
    fn a_program_is_alive_until_its_process_ends() {
        assert!(!program_alive(&[]));
        assert!(program_alive(&[std::process::id()]));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(program_alive(&[pid]));
        child.kill().unwrap();
        // Killed and not yet reaped: a zombie.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while program_alive(&[pid]) {
            assert!(std::time::Instant::now() < deadline, "never a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            std::fs::read(format!("/proc/{pid}/stat")).is_ok(),
            "a zombie"
        );
        child.wait().unwrap();
        assert!(!program_alive(&[pid]));
        assert!(program_alive(&[pid, std::process::id()]));
    }
}
