//! skillfs-base: what every layer above stands on and that knows nothing of
//! skillfs's own data: the `*at` system calls (`sys`), processes and ids
//! (`process`), paths relative to a root (`relpath`), time as UTC nanoseconds (`time`), and the mount table
//! (`mounts`).
//!
//! Invariant: this crate depends on no other skillfs crate (the workspace's
//! graph is drawn in ARCHITECTURE.md).

// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod mounts;
pub mod process;
pub mod relpath;
pub mod sched;
pub mod sys;
pub mod time;
