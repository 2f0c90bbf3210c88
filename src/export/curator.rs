//! `skillfs export --curator ID`: the tree at ID as a snapshot of the
//! agent's curator, `<ROOT>/.curator_backups/<utc-id>/` holding
//! `skills.tar.gz` and `manifest.json` as `agent/curator_backup.py` writes
//! them, so that the agent's own `hermes curator rollback` lists it and
//! restores it.
//!
//! Invariants:
//! - the snapshot is written through the live mount, as the agent writes
//!   its own: `.curator_backups` is hidden (a `keep` rule, never swept), so
//!   the snapshot lives with the agent's, out of every listing of the skills
//!   and out of history (it holds nothing history lacks); were the rule
//!   shown, it would be an ordinary versioned change. Unmounted, it is
//!   refused (exit 3), as `restore` is: the agent's snapshots then live in
//!   the store's parks, not in ROOT, so one written into the bare ROOT
//!   would sit apart from them until the next mount merged it;
//! - the directory is named as the agent names its own, from the time of
//!   the change (`_utc_id`, with `-NN` after a name taken), so the agent's
//!   newest-first order is the order of history;
//! - the snapshot appears whole or not at all: it is built in a
//!   `.rollback-staging-*` directory beside the others (which the agent's
//!   list ignores and its prune removes if a crash left one), then renamed
//!   to its name, never over another;
//! - the directory is reached from ROOT without following a symlink.
//!
//! Locks: none of ours; the writes go through the mount, where the
//! daemon's own apply.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::tar::{Dest, write};
use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::journal::EntryState;
use crate::sys;

pub const BACKUPS: &str = ".curator_backups";
const ARCHIVE: &str = "skills.tar.gz";
const MANIFEST: &str = "manifest.json";

/// Directories whose `SKILL.md` files the agent does not count
/// (`agent.skill_utils.EXCLUDED_SKILL_DIRS`).
const NOT_COUNTED: &[&[u8]] = &[
    b".git",
    b".github",
    b".hub",
    b".archive",
    b".venv",
    b"venv",
    b"node_modules",
    b"site-packages",
    b"__pycache__",
    b".tox",
    b".nox",
    b".pytest_cache",
    b".mypy_cache",
    b".ruff_cache",
];

/// A skill's support directories (`SKILL_SUPPORT_DIRS`): a `SKILL.md`
/// below one of them is documentation, not a skill.
const SUPPORT: &[&[u8]] = &[b"references", b"templates", b"assets", b"scripts"];

/// The agent's snapshot id for a time: `2026-05-01T13-05-42Z` (`_utc_id`:
/// UTC, whole seconds, `:` written `-`).
pub fn utc_id(ns: i64) -> String {
    crate::time::format_utc(ns).replace(':', "-")
}

/// `datetime.isoformat()` of an aware UTC time, as the manifest's
/// `created_at`: microseconds, shown only when not zero.
pub fn iso_time(ns: i64) -> String {
    let base = crate::time::format_utc(ns);
    let base = base.trim_end_matches('Z');
    let micros = ns.rem_euclid(1_000_000_000) / 1000;
    if micros == 0 {
        format!("{base}+00:00")
    } else {
        format!("{base}.{micros:06}+00:00")
    }
}

/// How many skills the agent's manifest counts in a tree: each `SKILL.md`
/// not below an excluded directory nor below a skill's support directory
/// (`_count_skill_files` with `is_excluded_skill_path`).
pub fn skill_files(entries: &[(RelPath, EntryState)]) -> usize {
    let present: std::collections::HashSet<&[u8]> =
        entries.iter().map(|(p, _)| p.as_bytes()).collect();
    let is_skill_dir = |comps: &[&[u8]]| {
        let mut p = RelPath::root();
        for c in comps {
            p = p.join(c);
        }
        present.contains(p.join(b"SKILL.md").as_bytes())
    };
    entries
        .iter()
        .filter(|(p, _)| p.file_name() == b"SKILL.md")
        .filter(|(p, _)| {
            let comps: Vec<&[u8]> = p.components().collect();
            let excluded = comps.iter().any(|c| NOT_COUNTED.contains(c));
            let support = (0..comps.len() - 1)
                .any(|i| SUPPORT.contains(&comps[i]) && is_skill_dir(&comps[..i]));
            !excluded && !support
        })
        .count()
}

/// The manifest the agent writes beside its tarball (`_write_manifest`:
/// `json.dumps(indent=2, sort_keys=True)`). Cron jobs live outside the
/// skills, so outside history: the snapshot says it holds none, as the
/// agent's does when `cron/jobs.json` is missing, and the agent's rollback
/// then leaves the cron jobs alone.
pub fn manifest(id: &str, change: u64, time_ns: i64, archive_bytes: u64, skills: usize) -> String {
    // serde_json's map keeps its keys sorted, as `sort_keys=True` does.
    let v = serde_json::json!({
        "id": id,
        "reason": format!("skillfs export of change {change}"),
        "created_at": iso_time(time_ns),
        "archive": ARCHIVE,
        "archive_bytes": archive_bytes,
        "skill_files": skills,
        "cron_jobs": {
            "backed_up": false,
            "jobs_count": 0,
            "reason": "not in skillfs history (cron/jobs.json is outside skills/)",
        },
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// A snapshot written: its id and what it holds.
pub struct Snapshot {
    pub id: String,
    pub archive_bytes: u64,
}

/// Writes the tree at `id` (`entries`, in the agent's layout) as a
/// snapshot into `<root>/.curator_backups/`, through the mount at `root`.
pub fn write_snapshot(
    store: &Store,
    root: &Path,
    id: u64,
    entries: &[(RelPath, EntryState)],
) -> Result<Snapshot, Failure> {
    let time = store.index.time_of(id).unwrap_or_default();
    let backups_path = root.join(BACKUPS);
    let io = |what: &str, p: &Path, e: std::io::Error| Failure::io(Exit::Internal, what, p, &e);
    let root_fd: OwnedFd = sys::openat(
        sys::CWD,
        root.as_os_str().as_bytes(),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )
    .map_err(|e| Failure::io(Exit::BadRoot, "open", root, &e))?
    .into();
    // Made as the agent makes it (`mkdir(parents=True, exist_ok=True)`).
    let made = match sys::mkdirat(root_fd.as_fd(), BACKUPS.as_bytes(), 0o777) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => false,
        Err(e) => return Err(io("create", &backups_path, e)),
    };
    let backups = sys::open_dir(root_fd.as_fd(), BACKUPS.as_bytes()).map_err(|e| {
        io(
            "open the directory (never through a symlink)",
            &backups_path,
            e,
        )
    })?;
    let bfd = backups.as_fd();
    let staging = format!(
        ".rollback-staging-skillfs-export-{}-{}",
        std::process::id(),
        crate::time::now_ns()
    );
    let staging_path = backups_path.join(&staging);
    sys::mkdirat(bfd, staging.as_bytes(), 0o777).map_err(|e| io("create", &staging_path, e))?;
    let result =
        build(store, time, entries, &backups, &staging, &staging_path).and_then(|archive_bytes| {
            let skills = skill_files(entries);
            place(&backups, &staging, &backups_path, time, |name| {
                manifest(name, id, time, archive_bytes, skills)
            })
            .map(|id| Snapshot { id, archive_bytes })
        });
    if result.is_err() {
        let _ = sys::remove_tree_at(bfd, staging.as_bytes());
        if made {
            let _ = sys::unlinkat(root_fd.as_fd(), BACKUPS.as_bytes(), true);
        }
    }
    result
}

/// Writes the tarball into the staging directory; returns its size.
fn build(
    store: &Store,
    time: i64,
    entries: &[(RelPath, EntryState)],
    backups: &OwnedFd,
    staging: &str,
    staging_path: &Path,
) -> Result<u64, Failure> {
    let archive_path = staging_path.join(ARCHIVE);
    let file = create_in(backups, staging, staging_path, ARCHIVE)?;
    let out = write(
        store,
        entries,
        time,
        std::io::BufWriter::new(file),
        &Dest(&archive_path),
    )?;
    let io = |what: &str, e: std::io::Error| Failure::io(Exit::Internal, what, &archive_path, &e);
    let file = out.into_inner().map_err(|e| io("write", e.into_error()))?;
    sys::fsync(&file).map_err(|e| io("write", e))?;
    Ok(sys::fstat(&file).map_err(|e| io("stat", e))?.st_size as u64)
}

/// A new file `name` in the staging directory (replacing one an earlier
/// attempt wrote).
fn create_in(
    backups: &OwnedFd,
    staging: &str,
    staging_path: &Path,
    name: &str,
) -> Result<File, Failure> {
    let mut rel = staging.as_bytes().to_vec();
    rel.push(b'/');
    rel.extend_from_slice(name.as_bytes());
    sys::openat(
        backups.as_fd(),
        &rel,
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW,
        0o666,
    )
    .map_err(|e| Failure::io(Exit::Internal, "create", &staging_path.join(name), &e))
}

/// The agent's id for `time`, with `-01`, `-02`… after a name taken.
fn free_name(backups: &OwnedFd, time: i64) -> String {
    let base = utc_id(time);
    let mut name = base.clone();
    let mut n = 1;
    while sys::lstatat(backups.as_fd(), name.as_bytes()).is_ok() {
        name = format!("{base}-{n:02}");
        n += 1;
    }
    name
}

/// Writes the manifest for the first free name, then renames the staging
/// directory to that name, never over another: a name taken meanwhile (the
/// agent snapshotting in the same second) means the next one, and a
/// manifest that says so.
fn place(
    backups: &OwnedFd,
    staging: &str,
    backups_path: &Path,
    time: i64,
    manifest_for: impl Fn(&str) -> String,
) -> Result<String, Failure> {
    let b = backups.as_fd();
    let staging_path = backups_path.join(staging);
    loop {
        let name = free_name(backups, time);
        let mut m = create_in(backups, staging, &staging_path, MANIFEST)?;
        std::io::Write::write_all(&mut m, manifest_for(&name).as_bytes())
            .and_then(|()| sys::fsync(&m))
            .map_err(|e| Failure::io(Exit::Internal, "write", &staging_path.join(MANIFEST), &e))?;
        // Its entries durable before it takes a name the agent lists.
        if let Ok(d) = sys::open_dir(b, staging.as_bytes()) {
            sys::fsync(&d).map_err(|e| Failure::io(Exit::Internal, "write", &staging_path, &e))?;
        }
        match sys::renameat2(
            b,
            staging.as_bytes(),
            b,
            name.as_bytes(),
            libc::RENAME_NOREPLACE,
        ) {
            Ok(()) => {
                let _ = sys::fsync(backups);
                return Ok(name);
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => {
                return Err(Failure::io(
                    Exit::Internal,
                    "put the snapshot in place at",
                    &backups_path.join(&name),
                    &e,
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::Kind;

    #[test]
    fn ids_and_times_are_written_as_the_agent_writes_them() {
        let t = 1_777_640_742_000_000_000; // 2026-05-01T13:05:42Z
        assert_eq!(utc_id(t), "2026-05-01T13-05-42Z");
        assert_eq!(utc_id(t + 999_999_999), "2026-05-01T13-05-42Z");
        assert_eq!(iso_time(t), "2026-05-01T13:05:42+00:00");
        assert_eq!(
            iso_time(t + 123_456_789),
            "2026-05-01T13:05:42.123456+00:00"
        );
    }

    #[test]
    fn the_manifest_has_the_agents_keys_sorted_and_indented() {
        let m = manifest("2026-05-01T13-05-42Z", 7, 1_777_640_742_000_000_000, 123, 2);
        let keys: Vec<&str> = m
            .lines()
            .filter(|l| l.starts_with("  \""))
            .map(|l| l.trim().split('"').nth(1).unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "archive",
                "archive_bytes",
                "created_at",
                "cron_jobs",
                "id",
                "reason",
                "skill_files"
            ]
        );
        assert!(
            m.starts_with("{\n  \"archive\": \"skills.tar.gz\",\n"),
            "{m}"
        );
        let v: serde_json::Value = serde_json::from_str(&m).unwrap();
        assert_eq!(v["archive_bytes"], 123);
        assert_eq!(v["cron_jobs"]["backed_up"], false);
    }

    #[test]
    fn skill_files_are_counted_as_the_agent_counts_them() {
        let st = |k| EntryState::sample(k, "b");
        let e = |p: &str, k| (RelPath::parse(p.as_bytes()).unwrap(), st(k));
        let entries = vec![
            e("cat", Kind::Dir),
            e("cat/a/SKILL.md", Kind::File),
            e("cat/a/references/old/SKILL.md", Kind::File),
            e("scripts/b/SKILL.md", Kind::File),
            e(".archive/c/SKILL.md", Kind::File),
            e("cat/d/node_modules/x/SKILL.md", Kind::File),
        ];
        // cat/a, and scripts/b (a category named scripts, not a support dir).
        assert_eq!(skill_files(&entries), 2);
    }
}
