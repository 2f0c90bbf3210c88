//! skillfs-core: the filesystem without a kernel. `fs::SkillFs` answers
//! every request as a plain call; `scan` settles ROOT against the journal
//! at mount; `hide` and `follow` decide what a listing shows; `config` is
//! the store's `config.json`. Errors are the core's own (`error::FsError`,
//! `config::ConfigError`, `hide::RulesError`), never an exit code.
//!
//! Invariant: no FUSE type appears here; the adapter (`skillfs-fuse`) is
//! above the core and translates.

// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod error;
pub mod follow;
pub mod fs;
pub mod hide;
pub mod scan;
