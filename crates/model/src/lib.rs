//! skillfs-model: the history the journal tells, as values and folds.
//!
//! - `ledger`: the journal kept in step with its fold, the one writer of
//!   records;
//! - `catalog`: the fold of every record (what each path holds now), which
//!   feeds `history`;
//! - `history`: versions by path and id, their aliases, the forgotten ids;
//! - `checkpoint`: the folded history saved at unmount and loaded at mount
//!   when it still matches the journal;
//! - `retention`: which ids a policy keeps and the order of a forget.
//!
//! Invariant: the model reaches the disk only through `skillfs-store`; it
//! knows nothing of the live tree, the kernel or the command line.

// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod catalog;
pub mod checkpoint;
pub mod history;
pub mod ledger;
pub mod retention;
