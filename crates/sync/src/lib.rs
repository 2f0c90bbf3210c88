//! skillfs-sync: skills across machines, through git remotes (issue 25).
//!
//! This first part is the merge, with no I/O: two replicas' trees and
//! their last merged base in, the merged tree and the conflicts out
//! (`merge`), per skill, then per file, then per line (`diff3`), checked
//! against what the agent's loader reads (`skill`). The transport (git
//! refs per replica), the import of fetched commits as versions and the
//! apply through the mount build on it.
//!
//! Invariant: nothing here reads a clock or a replica id; every replica
//! computes the same merge from the same inputs.

// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod diff3;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod merge;
pub mod skill;
pub mod tree;
