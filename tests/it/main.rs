//! Every integration test of the `skillfs` package, one binary, a module
//! per area (`cargo test --test it -- posix::` runs one). The harness,
//! shared by all, is `common`; what a test may and may not do to the
//! process and the machine they share is said there.

mod common;

mod agent;
mod bad_input;
mod behind;
mod cache;
mod checkpoint;
mod cli;
mod concurrency;
mod crash;
mod editors;
mod export;
mod fuzz_replay;
mod hide;
mod history;
mod home;
mod import;
mod lifecycle;
mod logging;
mod model;
mod posix;
mod power_loss;
mod power_loss_core;
mod reftest;
mod retention;
mod scripts;
mod sequences;
mod store_race;
mod stress;
mod sync;
mod sync_merge;
mod sync_ssh;
mod sync_third;
mod torn;
mod transport;
mod trust;
mod trust_store;
mod unprivileged;
mod verify;
mod versioning;
