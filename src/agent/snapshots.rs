//! The agent's curator snapshots: `<skills>/.curator_backups/<id>/` holds
//! `skills.tar.gz` (the skills tree, members named relative to it, as
//! Python's `tarfile` writes them: directories, files, symlinks, hard links;
//! times to the microsecond in PAX headers) and `manifest.json` (`reason`,
//! `created_at`). The id is the UTC second it was taken,
//! `2026-05-01T13-05-42Z`, with `-01`, `-02`… for more in the same second;
//! other names there (`.rollback-staging-*`) are not snapshots.
//!
//! Invariants: an archive is read whole, its gzip trailer (CRC and length)
//! included, before anything of it is believed; a member named by an
//! absolute path or with a `..` component (or a hard link naming one) is
//! refused by name and left out, the other members kept, as GNU tar
//! extracts an archive; members that are neither
//! files, directories nor links (devices, FIFOs) are left out, as the
//! mount's scan leaves them out. Reading never follows a symlink out of
//! the snapshot directory. An archive that unpacks to more than
//! [`unpack_limit`] (its members' sizes and 512 bytes a header) is damaged,
//! found before that much is read: a gzip bomb must not fill the disk of
//! every mount that tries to import it.
//!
//! Locks: none.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Damage, plain};
use crate::relpath::RelPath;

/// The directory of the snapshots, in the skills root.
pub const BACKUPS: &str = ".curator_backups";
/// The archive of one snapshot, in its directory.
pub const ARCHIVE: &str = "skills.tar.gz";
const MANIFEST: &str = "manifest.json";
/// An archive may unpack to this many times its own size...
const UNPACK_RATIO: u64 = 64;
/// ...or to this much, whichever is more (skills are text: an archive of
/// real skills unpacks to a few times its size).
const UNPACK_MIN: u64 = 1 << 30;

/// The most an archive of `len` bytes may unpack to: `UNPACK_RATIO`
/// times its size, at least `UNPACK_MIN` (or `SKILLFS_UNPACK_MIN` bytes
/// from the environment, the tests' way to try a bomb in little room).
pub fn unpack_limit(len: u64) -> u64 {
    let min = std::env::var("SKILLFS_UNPACK_MIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(UNPACK_MIN);
    len.saturating_mul(UNPACK_RATIO).max(min)
}

/// One snapshot found.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub id: String,
    /// When it was taken: its manifest's `created_at` (written once the
    /// archive was complete, to the microsecond) when that is within the
    /// hour after the id's second, else the id's second (plus its counter
    /// in nanoseconds, so that `-01` follows the plain id).
    pub ts: i64,
    pub dir: PathBuf,
    /// Its manifest's reason (`pre-curator-run`, `manual`), or `snapshot`.
    pub reason: String,
    /// Who owns the archive (the agent's user).
    pub uid: u32,
    pub gid: u32,
}

/// The time an id names (`None`: not a snapshot id).
pub fn id_time(id: &str) -> Option<i64> {
    let (base, counter) = match id.len() {
        20 => (id, 0),
        23 if id.as_bytes()[20] == b'-' => {
            let n = id.get(21..)?;
            if !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (id.get(..20)?, n.parse::<i64>().ok()?)
        }
        _ => return None,
    };
    if base.as_bytes().get(13) != Some(&b'-') {
        return None;
    }
    crate::time::parse_utc(base).map(|t| t + counter)
}

/// The snapshots in `<root>/.curator_backups/`, oldest first, and one
/// damage for each snapshot directory that has no archive.
pub fn list(root: &Path) -> (Vec<Snapshot>, Vec<Damage>) {
    let (mut found, mut damage) = (Vec::new(), Vec::new());
    let dir = root.join(BACKUPS);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return (found, damage); // none taken yet
    };
    for e in entries.flatten() {
        let Some(id) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let (Some(id_ts), Ok(ft)) = (id_time(&id), e.file_type()) else {
            continue;
        };
        if !ft.is_dir() {
            continue;
        }
        let part = format!("snapshot {id}");
        let archive = e.path().join(ARCHIVE);
        let md = match std::fs::symlink_metadata(&archive) {
            Ok(md) if md.is_file() => md,
            Ok(_) => {
                damage.push(Damage {
                    part,
                    why: format!("{ARCHIVE} is not a plain file"),
                });
                continue;
            }
            Err(err) => {
                damage.push(Damage {
                    part,
                    why: format!("no {ARCHIVE} ({err})"),
                });
                continue;
            }
        };
        let manifest = read_manifest(&e.path());
        let created = manifest
            .as_ref()
            .and_then(|m| m.get("created_at")?.as_str())
            .and_then(crate::time::parse_rfc3339)
            .filter(|&t| (id_ts..id_ts + 3_600_000_000_000).contains(&t));
        let reason = manifest
            .as_ref()
            .and_then(|m| m.get("reason")?.as_str().map(|r| plain(r, 200)))
            .unwrap_or_else(|| "snapshot".to_string());
        found.push(Snapshot {
            id,
            ts: created.unwrap_or(id_ts),
            dir: e.path(),
            reason,
            uid: md.uid(),
            gid: md.gid(),
        });
    }
    found.sort_by(|a, b| (a.ts, &a.id).cmp(&(b.ts, &b.id)));
    (found, damage)
}

/// The manifest, if it is there and JSON (it only says why and when).
fn read_manifest(dir: &Path) -> Option<serde_json::Value> {
    let f = crate::sys::openat(
        crate::sys::CWD,
        dir.join(MANIFEST).as_os_str().as_encoded_bytes(),
        libc::O_RDONLY | libc::O_NOFOLLOW,
        0,
    )
    .ok()?;
    let mut text = Vec::new();
    f.take(1 << 20).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Opens a snapshot's archive, never through a symlink.
pub fn open(s: &Snapshot) -> io::Result<File> {
    crate::sys::openat(
        crate::sys::CWD,
        s.dir.join(ARCHIVE).as_os_str().as_encoded_bytes(),
        libc::O_RDONLY | libc::O_NOFOLLOW,
        0,
    )
}

/// What a member is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberKind {
    File {
        size: u64,
    },
    Dir,
    Symlink {
        target: Vec<u8>,
    },
    /// The same content as the earlier member it names.
    HardLink {
        to: RelPath,
    },
}

/// One member of an archive.
#[derive(Clone, Debug)]
pub struct Member {
    pub path: RelPath,
    pub kind: MemberKind,
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i128,
}

/// An archive read through: its members in order, and one line per
/// member refused (named by an absolute path or with a `..`).
#[derive(Debug, Default)]
pub struct Members {
    pub members: Vec<Member>,
    pub refused: Vec<String>,
}

/// Why an archive could not be read through.
#[derive(Debug)]
pub enum Failed {
    /// The archive itself: not gzip, cut short, a bad CRC, a bad member.
    Damaged(String),
    /// What the caller did with a member's content (storing it) failed.
    Content(io::Error),
}

/// A reader that remembers whether it failed: an error in the caller's
/// `content` is then the archive's, not the caller's own.
struct Watched<'a, R> {
    inner: R,
    failed: &'a Cell<bool>,
}

impl<R: Read> Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|_| self.failed.set(true))
    }
}

/// A member's name as a path inside the skills root: `None` for the
/// archive's own top (`./`); an error for an absolute name or a `..`.
fn member_path(name: &[u8]) -> Result<Option<RelPath>, String> {
    let shown = String::from_utf8_lossy(name);
    if name.starts_with(b"/") {
        return Err(format!(
            "member '{}' is an absolute path",
            plain(&shown, 200)
        ));
    }
    match RelPath::parse(name) {
        None => Err(format!(
            "member '{}' climbs out with '..'",
            plain(&shown, 200)
        )),
        Some(p) if p.is_root() => Ok(None),
        Some(p) => Ok(Some(p)),
    }
}

/// Nanoseconds of a PAX time (`1714568742.123456`).
fn pax_time(text: &str) -> Option<i128> {
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i128 = secs.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: i128 = format!("{digits:0<9}").parse().ok()?;
    Some(secs * 1_000_000_000 + if secs < 0 { -frac } else { frac })
}

/// Reads the archive `file` whole, from its start: every member in order,
/// each regular file's bytes handed to `content` (which may read them or
/// not), then the rest of the gzip stream, whose trailer checks it all.
/// A member whose name leads out of the root is refused, its bytes
/// skipped, and the reading goes on.
pub fn read(
    file: &File,
    content: &mut dyn FnMut(&Member, &mut dyn Read) -> io::Result<()>,
) -> Result<Members, Failed> {
    let damaged = |what: &str, e: io::Error| Failed::Damaged(format!("{what}: {e}"));
    let len = file
        .metadata()
        .map_err(|e| damaged("could not read it", e))?
        .len();
    let limit = unpack_limit(len);
    let mut unpacked = 0u64;
    let mut f = file;
    f.seek(SeekFrom::Start(0))
        .map_err(|e| damaged("could not read it", e))?;
    let failed = Cell::new(false);
    let gz = flate2::read::GzDecoder::new(BufReader::new(f));
    let mut archive = tar::Archive::new(Watched {
        inner: gz,
        failed: &failed,
    });
    let mut members = Vec::new();
    let mut refused = Vec::new();
    let entries = archive
        .entries()
        .map_err(|e| damaged("not a tar.gz archive", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| damaged("not a whole tar.gz archive", e))?;
        // Counted from the header, before the content is read.
        unpacked = unpacked.saturating_add(512).saturating_add(entry.size());
        if unpacked > limit {
            return Err(Failed::Damaged(format!(
                "it unpacks to more than {limit} bytes, the most a {len}-byte archive may \
                 (a gzip bomb?)"
            )));
        }
        let path = match member_path(&entry.path_bytes()) {
            Ok(Some(path)) => path,
            Ok(None) => continue,
            Err(why) => {
                refused.push(why);
                continue;
            }
        };
        let pax: Vec<(String, String)> = match entry.pax_extensions() {
            Ok(Some(exts)) => exts
                .flatten()
                .filter_map(|x| Some((x.key().ok()?.to_string(), x.value().ok()?.to_string())))
                .collect(),
            Ok(None) => Vec::new(),
            Err(e) => return Err(damaged("a damaged PAX header", e)),
        };
        let pax_get = |k: &str| {
            pax.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let h = entry.header();
        let bad_field = |e| damaged(&format!("member '{path}' has a bad header"), e);
        let id = |key: &str, ustar: io::Result<u64>| -> Result<u32, Failed> {
            match pax_get(key).and_then(|v| v.parse::<u32>().ok()) {
                Some(v) => Ok(v),
                None => Ok(ustar.map_err(bad_field)? as u32),
            }
        };
        let uid = id("uid", h.uid())?;
        let gid = id("gid", h.gid())?;
        let mode = h.mode().map_err(bad_field)? & 0o7777;
        let mtime_ns = match pax_get("mtime").and_then(pax_time) {
            Some(t) => t,
            None => h.mtime().map_err(bad_field)? as i128 * 1_000_000_000,
        };
        let kind = match h.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                MemberKind::File { size: entry.size() }
            }
            tar::EntryType::Directory => MemberKind::Dir,
            tar::EntryType::Symlink => MemberKind::Symlink {
                target: entry.link_name_bytes().unwrap_or_default().into_owned(),
            },
            tar::EntryType::Link => {
                let to = entry.link_name_bytes().unwrap_or_default();
                match member_path(&to) {
                    Ok(Some(to)) => MemberKind::HardLink { to },
                    Ok(None) => continue,
                    Err(_) => {
                        let to = plain(&String::from_utf8_lossy(&to), 200);
                        refused.push(format!(
                            "member '{path}' is a hard link to '{to}', outside the root"
                        ));
                        continue;
                    }
                }
            }
            _ => continue, // devices, FIFOs: never versioned
        };
        let m = Member {
            path,
            kind,
            mode,
            uid,
            gid,
            mtime_ns,
        };
        if matches!(m.kind, MemberKind::File { .. }) {
            content(&m, &mut entry).map_err(|e| {
                if failed.get() {
                    damaged(&format!("member '{}' is cut short or damaged", m.path), e)
                } else {
                    Failed::Content(e)
                }
            })?;
        }
        members.push(m);
    }
    // The end-of-archive blocks, then the gzip trailer: its CRC and length
    // vouch for every byte read above.
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(|e| damaged("damaged gzip data", e))?;
    Ok(Members { members, refused })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_utc_seconds_with_a_counter() {
        let t = crate::time::parse_utc("2026-05-01T13:05:42Z").unwrap();
        assert_eq!(id_time("2026-05-01T13-05-42Z"), Some(t));
        assert_eq!(id_time("2026-05-01T13-05-42Z-02"), Some(t + 2));
        for bad in [
            "2026-05-01T13:05:42Z",
            ".rollback-staging-2026-05-01T13-05-42Z",
            "2026-05-01T13-05-42Z-x1",
            "2026-05-01T13-05-42Z-1",
        ] {
            assert_eq!(id_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn member_names_stay_inside_the_root() {
        assert_eq!(
            member_path(b"./cat/foo/SKILL.md").unwrap(),
            RelPath::parse(b"cat/foo/SKILL.md")
        );
        assert_eq!(member_path(b"./").unwrap(), None);
        assert!(
            member_path(b"/etc/passwd")
                .unwrap_err()
                .contains("absolute")
        );
        assert!(member_path(b"cat/../../x").unwrap_err().contains(".."));
    }

    #[test]
    fn pax_times_keep_their_fraction() {
        assert_eq!(pax_time("12.5"), Some(12_500_000_000));
        assert_eq!(pax_time("12"), Some(12_000_000_000));
        assert_eq!(pax_time("1.0000000019"), Some(1_000_000_001));
        assert_eq!(pax_time("x"), None);
    }
}
