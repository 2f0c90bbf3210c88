//! skillfs: a versioning FUSE filesystem mounted over an AI agent's skills
//! directory. See docs/design.md (the guarantees) and the README.
//!
//! This crate is the application: the command line (`cli`, `commands`),
//! the daemon (`daemon`, `open`, `logging`), history taken elsewhere and
//! brought in (`export`, `import`, `agent`), `verify`, and the one error
//! type that carries an exit code (`error::Failure`). The layers below are
//! crates of their own, each depending only on those below it
//! (ARCHITECTURE.md draws the graph); they are re-exported here under the
//! module names the application and its tests use.

// Every `unsafe` says why it is sound, in a `// SAFETY:` line above it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub use skillfs_base::{mounts, process, relpath, sys, time};
pub use skillfs_core::{config, follow, fs, hide, scan};
pub use skillfs_fuse as fuse;
pub use skillfs_fuse::fusermount;
pub use skillfs_model::{catalog, checkpoint, history, ledger, retention};
pub use skillfs_store as store;

pub mod agent;
pub mod cli;
pub mod commands;
pub mod daemon;
pub mod error;
pub mod export;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod import;
pub mod logging;
pub mod open;
pub mod sync;
pub mod verify;
