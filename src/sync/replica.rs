//! The replica id: 128 random bits, made the first time a store needs one
//! and kept in `REPLICA` for good. Two stores are two replicas, even on
//! one host; a store copied whole is the same replica (and its first
//! refused push says so).
//!
//! Locks: none; made with `O_EXCL`, so two racing commands keep one id.

use std::io::{Read, Write};

use crate::error::{Exit, Failure};
use crate::store::durable::StoreIo;
use crate::store::{Dir, Layout};

const REPLICA: &str = "REPLICA";

pub(super) fn valid(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The replica id a `REPLICA` file's bytes hold, if they hold one.
pub fn parse(bytes: &[u8]) -> Option<String> {
    let id = String::from_utf8_lossy(bytes).trim().to_string();
    valid(&id).then_some(id)
}

/// The store's replica id, made if it has none yet (`make`).
pub fn replica_id(layout: &Layout, make: bool) -> Result<Option<String>, Failure> {
    let top = Dir::open_path(&layout.dir)
        .map_err(|e| Failure::io(Exit::BadStore, "open", &layout.dir, &e))?;
    let path = layout.dir.join(REPLICA);
    let read = |top: &Dir| -> Result<Option<String>, Failure> {
        match top.read_small(REPLICA, 64) {
            Ok(None) => Ok(None),
            Ok(Some(b)) => {
                if let Some(id) = parse(&b) {
                    Ok(Some(id))
                } else {
                    Err(Failure::new(
                        Exit::BadStore,
                        format!(
                            "'{}' is not a replica id (32 hex digits): remove it to make a new one",
                            path.display()
                        ),
                    ))
                }
            }
            Err(e) => Err(Failure::io(Exit::BadStore, "read", &path, &e)),
        }
    };
    if let Some(id) = read(&top)? {
        return Ok(Some(id));
    }
    if !make {
        return Ok(None);
    }
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Failure::new(Exit::Internal, format!("could not read /dev/urandom: {e}")))?;
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match top.create_new(REPLICA, crate::store::fsutil::FILE_MODE) {
        Ok(mut f) => {
            f.write_all(format!("{id}\n").as_bytes())
                .and_then(|()| f.sync_all())
                .and_then(|()| top.sync(&StoreIo::real()))
                .map_err(|e| Failure::io(Exit::BadStore, "write", &path, &e))?;
            Ok(Some(id))
        }
        // Another command made it first: that one is the id.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&top),
        Err(e) => Err(Failure::io(Exit::BadStore, "make", &path, &e)),
    }
}
