//! skillfs: a versioning FUSE filesystem mounted over an AI agent's skills
//! directory. See DESIGN.md (shared with the team) and the README.
//!
//! Layers, from the kernel down: `fuse` (the only user of `fuser`) →
//! `fs::SkillFs` (the core, testable without a kernel) → `ledger` (the
//! journal kept in step with its fold: `catalog`, which feeds `history`) and
//! `store` (blobs, journal file, layout) → `sys` (`*at` calls).

// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod agent;
pub mod catalog;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod daemon;
pub mod error;
pub mod export;
pub mod follow;
pub mod fs;
pub mod fuse;
pub mod fusermount;
pub mod hide;
pub mod history;
pub mod import;
pub mod ledger;
pub mod logging;
pub mod open;
pub mod relpath;
pub mod retention;
pub mod scan;
pub mod store;
pub mod sys;
pub mod time;
pub mod verify;
