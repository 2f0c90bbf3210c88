//! The calling thread's scheduling policy, changed for a while.
//!
//! Locks: none; each call touches the calling thread only.

/// Runs `f` with the calling thread at `SCHED_OTHER`, and puts back the
/// policy it had (an io_uring request thread may be at `SCHED_IDLE`).
/// Failing to switch is no error: `f` runs at the policy the thread has.
pub fn at_normal_priority<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sched_getscheduler(2) on the calling thread (0) reads only.
    let before = unsafe { libc::sched_getscheduler(0) };
    let normal = libc::sched_param { sched_priority: 0 };
    let switched = before == libc::SCHED_IDLE
        // SAFETY: sched_setscheduler(2) on the calling thread, with a
        // valid sched_param that outlives the call.
        && unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal) } == 0;
    let out = f();
    if switched {
        // SAFETY: as above.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &normal) };
    }
    out
}
