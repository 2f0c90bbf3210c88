//! The tree at an id as a gzip tar, laid out as the agent's curator
//! snapshots are: what `tarfile.open(..., "w:gz", compresslevel=6)` with
//! `tf.add(entry, arcname=entry.name)` for each top-level entry writes
//! (`agent/curator_backup.py`).
//!
//! Invariants (each one the agent's, so its rollback extracts ours as its
//! own):
//! - member names are relative to the skills root, with no `./` or
//!   `skills/` prefix; a directory's name ends in `/`, as Python writes it;
//! - members come depth first, a directory before its entries, names in
//!   byte order (`export::entries`), so an extractor makes parents first;
//! - each member has its version's mode (`& 0o7777`), owner ids and mtime;
//!   a symlink is a symlink with its exact target bytes, never followed;
//! - ustar headers, with a PAX record where one does not fit (as Python's
//!   default PAX format does): the mtime's nanoseconds, a name or target
//!   longer than 100 bytes, an owner id past 7 octal digits;
//! - the output depends only on the tree: the gzip header's time is the
//!   change's, so two exports of one id are the same bytes.
//!
//! Locks: none.

use std::io::Write;

use flate2::{Compression, GzBuilder};
use tar::{Builder, EntryType, Header};

use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::journal::{EntryState, Kind};

/// The agent's `compresslevel=6`.
const LEVEL: u32 = 6;

/// The largest number an octal field of `width` bytes holds (one byte is
/// its terminator).
fn fits(v: u64, width: u32) -> bool {
    v < 8u64.pow(width - 1)
}

/// A time in PAX's decimal seconds: `1764520170.123456789`, no trailing
/// zeros, no fraction when whole (Python writes its float the same way).
pub fn pax_time(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs();
    let (secs, frac) = (a / 1_000_000_000, a % 1_000_000_000);
    if frac == 0 {
        return format!("{sign}{secs}");
    }
    let f = format!("{frac:09}");
    format!("{sign}{secs}.{}", f.trim_end_matches('0'))
}

/// Copies `bytes` into a header field, cut at its width: the whole value
/// is then in a PAX record, and the field only names it for old readers.
fn put(field: &mut [u8], bytes: &[u8]) {
    let n = bytes.len().min(field.len());
    field[..n].copy_from_slice(&bytes[..n]);
}

/// Where a tarball goes, for messages: "could not write '<dest>'".
pub struct Dest<'a>(pub &'a std::path::Path);

impl Dest<'_> {
    fn fail(&self, e: std::io::Error) -> Failure {
        Failure::io(Exit::Internal, "write", self.0, &e)
    }
}

/// Writes `entries` (in their order) as a gzip tar to `out`, its gzip
/// header dated `mtime_ns`; returns `out`, finished.
pub fn write<W: Write>(
    store: &Store,
    entries: &[(RelPath, EntryState)],
    mtime_ns: i64,
    out: W,
    dest: &Dest,
) -> Result<W, Failure> {
    let gz_time = u32::try_from(mtime_ns.div_euclid(1_000_000_000)).unwrap_or(0);
    let gz = GzBuilder::new()
        .mtime(gz_time)
        .write(out, Compression::new(LEVEL));
    let mut b = Builder::new(gz);
    for (path, st) in entries {
        append(&mut b, store, path, st, dest)?;
    }
    let gz = b.into_inner().map_err(|e| dest.fail(e))?;
    gz.finish().map_err(|e| dest.fail(e))
}

/// One member: its PAX record if it needs one, then its header and data.
fn append<W: Write>(
    b: &mut Builder<W>,
    store: &Store,
    path: &RelPath,
    st: &EntryState,
    dest: &Dest,
) -> Result<(), Failure> {
    let mut h = Header::new_ustar();
    let mut pax: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut name = path.as_bytes().to_vec();
    let data = match st.kind {
        Kind::File => {
            h.set_entry_type(EntryType::Regular);
            store.content(st)?
        }
        Kind::Dir => {
            h.set_entry_type(EntryType::Directory);
            name.push(b'/');
            Vec::new()
        }
        Kind::Symlink => {
            h.set_entry_type(EntryType::Symlink);
            let target = st.target.as_ref().map(|t| t.0.as_slice()).unwrap_or(b"");
            if target.len() > h.as_old().linkname.len() {
                pax.push(("linkpath", target.to_vec()));
            }
            put(&mut h.as_old_mut().linkname, target);
            Vec::new()
        }
    };
    if name.len() > h.as_old().name.len() {
        pax.push(("path", name.clone()));
    }
    put(&mut h.as_old_mut().name, &name);
    if pax.iter().any(|(_, v)| std::str::from_utf8(v).is_err()) {
        // PAX values are UTF-8 unless said otherwise; a name that is not
        // keeps its bytes (as Python and GNU tar write it).
        pax.insert(0, ("hdrcharset", b"BINARY".to_vec()));
    }
    h.set_mode(st.mode & 0o7777);
    for (key, id, set) in [
        ("uid", st.uid, Header::set_uid as fn(&mut Header, u64)),
        ("gid", st.gid, Header::set_gid),
    ] {
        if fits(id.into(), 8) {
            set(&mut h, id.into());
        } else {
            set(&mut h, 0);
            pax.push((key, id.to_string().into_bytes()));
        }
    }
    let secs = st.mtime_ns.div_euclid(1_000_000_000);
    match u64::try_from(secs) {
        Ok(s) if fits(s, 12) => h.set_mtime(s),
        _ => h.set_mtime(0),
    }
    if st.mtime_ns.rem_euclid(1_000_000_000) != 0 || h.mtime().ok() != u64::try_from(secs).ok() {
        pax.push(("mtime", pax_time(st.mtime_ns).into_bytes()));
    }
    h.set_size(data.len() as u64);
    h.set_cksum();
    if !pax.is_empty() {
        b.append_pax_extensions(pax.iter().map(|(k, v)| (*k, v.as_slice())))
            .map_err(|e| dest.fail(e))?;
    }
    b.append(&h, data.as_slice()).map_err(|e| dest.fail(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times_are_exact_decimal_seconds() {
        assert_eq!(pax_time(1_764_520_170_000_000_000), "1764520170");
        assert_eq!(pax_time(1_764_520_170_123_456_789), "1764520170.123456789");
        assert_eq!(pax_time(1_764_520_170_500_000_000), "1764520170.5");
        assert_eq!(pax_time(-1_500_000_000), "-1.5");
        assert_eq!(pax_time(0), "0");
    }

    #[test]
    fn octal_fields_hold_what_fits() {
        assert!(fits(0o7777777, 8));
        assert!(!fits(0o10000000, 8));
        assert!(fits(0o77777777777, 12));
    }
}
