//! The journal: the append-only record of every change, one JSON object a
//! line, in segments (`<first seq>.jsonl`) under the store's `journal/`.
//!
//! One question a file:
//! - `record`: what a record says (`Record`, `Change`, `EntryState`, `Op`,
//!   `Kind`, `Actor`);
//! - `encoding`: one record as one line, ending in its CRC-32;
//! - `read`: reading a journal directory at mount: its segments, a torn
//!   tail, damage, and the `acked_through` watermark that tells them apart;
//! - `append`: the open [`Journal`] that appends, reserves room ahead of its
//!   end, and syncs;
//! - `repair`: a damaged journal made readable, every id kept, nothing
//!   deleted (`skillfs repair`).
//!
//! The paths the rest of skillfs uses (`journal::{Journal, Record, ...,
//! read_dir, encode}`) are re-exported here; the files are private.
//!
//! Locks: none of its own; `append` says which lock guards the one
//! `Journal` of a mount, and what is synced outside it.

mod append;
mod encoding;
#[cfg(test)]
mod fixtures;
mod read;
mod record;
mod repair;

pub use append::Journal;
pub use encoding::{crc32, crc32_extend, decode, encode};
pub use read::{After, Contents, list_segments, read_dir, read_in, read_in_after};
pub use record::{Actor, Change, EntryState, Kind, Op, Origin, Record, Source};
pub use repair::{Repaired, repair};
