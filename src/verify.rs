//! `skillfs verify`: whether a store is sound, read at disk speed, changing
//! nothing.
//!
//! Owns the checks and their report: the journal (every line's CRC, ids
//! with no gap: the journal reader's own rules, a torn tail told from
//! damage), every pack entry against its header (and, `--full`, its hash),
//! every loose blob's name (and, `--full`, its hash), every record's blob
//! named and present, and (`--full`) the live tree against the newest state the
//! journal gives it.
//!
//! Invariants: nothing is written, renamed or locked; every file is opened
//! read-only and never through a symlink (`O_NOFOLLOW`). A problem is one
//! line naming the file (and line, offset or blob) and what is wrong. A
//! torn tail of the journal or of a pack (a crash mid-append, recovered by
//! the next mount) and, unmounted, a live tree changed since the last
//! mount (recorded by the next mount) are notes, not problems.
//! Locks: none. Run against a mounted store it reads what the daemon has
//! written so far; a record being appended meanwhile is a torn tail.

use std::collections::HashSet;
use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::catalog::Fold;
use crate::hide::HideRules;
use crate::relpath::{RelPath, hex};
use crate::store::Layout;
use crate::store::journal::{self, Kind, Record};

/// What `verify` found.
#[derive(Default)]
pub struct Report {
    pub problems: Vec<String>,
    pub notes: Vec<String>,
    pub records: usize,
    pub ids: Option<(u64, u64)>,
    pub packs: usize,
    pub pack_entries: usize,
    pub loose: usize,
    pub bytes_read: u64,
    pub elapsed: Duration,
}

/// Progress on a terminal, once a check has run for a second.
struct Progress {
    started: Instant,
    last: Instant,
    on: bool,
}

impl Progress {
    fn new() -> Progress {
        let now = Instant::now();
        Progress {
            started: now,
            last: now,
            on: std::io::stderr().is_terminal(),
        }
    }

    fn show(&mut self, what: &str, bytes: u64) {
        let now = Instant::now();
        if !self.on
            || now - self.started < Duration::from_secs(1)
            || now - self.last < Duration::from_millis(200)
        {
            return;
        }
        self.last = now;
        let secs = (now - self.started).as_secs_f64();
        let mib = bytes as f64 / (1 << 20) as f64;
        let _ = write!(
            std::io::stderr(),
            "\rverify: {what}, {mib:.0} MiB read ({:.0} MiB/s)   ",
            mib / secs
        );
    }

    fn done(&self) {
        if self.on && Instant::now() - self.started >= Duration::from_secs(1) {
            let _ = writeln!(std::io::stderr());
        }
    }
}

mod packs;
use packs::check_packs;

fn open_ro(p: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
}

/// Checks the store at `layout` (versioning `root`); `live_is_mounted`:
/// the live tree is read through the mount (a difference is a problem),
/// else directly (a difference is a change made while unmounted).
pub fn verify(layout: &Layout, root: &Path, full: bool, live_is_mounted: bool) -> Report {
    let started = Instant::now();
    let mut r = Report::default();
    let mut progress = Progress::new();
    let records = check_journal(layout, &mut r);
    let mut present = HashSet::new();
    let findings = check_packs(layout, full, &mut r, &mut present, &mut progress);
    check_loose(layout, full, &mut r, &mut present, &mut progress);
    findings.judge(records.as_deref(), &mut r);
    if let Some(records) = &records {
        check_contents(records, &mut r);
        let missing: Vec<&crate::store::journal::Record> = records
            .iter()
            .filter(|rec| {
                rec.state
                    .as_ref()
                    .and_then(|s| s.blob.as_ref())
                    .is_some_and(|b| !present.contains(b.as_str()))
            })
            .collect();
        // After a `forget`, the blobs only forgotten ids showed are gone by
        // design; a prune running meanwhile (mounted) removes more of them
        // than the journal read first says, so the journal is read again.
        let needed = (!missing.is_empty()).then(|| {
            let records = crate::store::journal::read_dir(&layout.journal())
                .map(|c| c.records)
                .unwrap_or_else(|_| records.clone());
            crate::retention::prune::live_blobs(
                &crate::catalog::Fold::replay(&records).into_history(),
            )
        });
        for rec in missing {
            let Some(blob) = rec.state.as_ref().and_then(|s| s.blob.as_ref()) else {
                continue;
            };
            let live = crate::retention::prune::raw_of(blob)
                .is_none_or(|raw| needed.as_ref().is_none_or(|n| n.contains(&raw)));
            if live {
                r.problems.push(format!(
                    "journal: record {} ({} {}): its blob {blob} is in no pack and no loose file (or a chunk of it is missing or damaged)",
                    rec.seq,
                    rec.op.name(),
                    rec.path
                ));
            }
        }
        check_checkpoint(layout, records, &mut r);
        if full {
            check_live(
                layout,
                root,
                records,
                live_is_mounted,
                &mut r,
                &mut progress,
            );
        }
    }
    progress.done();
    r.elapsed = started.elapsed();
    r
}

/// Every record of a file names its content, and every record of a symlink
/// its target: one that does not (journaled by a daemon that met a file
/// written behind it and recorded only its metadata) is a version history
/// cannot show (`.history` answers EIO, `show`, `export` and `restore`
/// fail on it).
fn check_contents(records: &[Record], r: &mut Report) {
    for rec in records {
        let Some(state) = &rec.state else { continue };
        let lacks = match state.kind {
            Kind::File if state.blob.is_none() => "a file state with no content (no blob)",
            Kind::Symlink if state.target.is_none() => "a symlink state with no target",
            _ => continue,
        };
        r.problems.push(format!(
            "journal: record {} ({} {}): {lacks}; history cannot show this version (the next \
             mount records the live file again if it still holds it)",
            rec.seq,
            rec.op.name(),
            rec.path
        ));
    }
}

/// The journal's checkpoint, if a mount would use it, holds exactly the
/// fold of the records it covers (its own CRCs only say it was written
/// whole, not that what was written is right).
fn check_checkpoint(layout: &Layout, records: &[Record], r: &mut Report) {
    let Ok(dir) = crate::store::Dir::open_path(&layout.journal()) else {
        return;
    };
    let mut notes = Vec::new();
    let Some(cp) = crate::checkpoint::load(&dir, &mut notes) else {
        return;
    };
    // Only one a mount would use: one made of another journal (or of this
    // one before a `repair`) is passed over there, harmlessly.
    let after = crate::store::journal::After {
        segment: &cp.segment,
        offset: cp.offset,
        prefix_crc: cp.prefix_crc,
        seq: cp.seq,
    };
    if !matches!(journal::read_in_after(&dir, &after), Ok(Some(_))) {
        return;
    }
    let Some(upto) = records.iter().position(|rec| rec.seq == cp.seq) else {
        return;
    };
    let fold = crate::catalog::Fold::replay(&records[..=upto]);
    if fold.history().encode() != cp.index.encode() {
        r.problems.push(format!(
            "journal/{}: the history it holds is not the fold of records 1-{}; a mount \
             would show it: remove the file (the next unmount writes it again)",
            crate::checkpoint::NAME,
            cp.seq
        ));
    }
}

fn check_journal(layout: &Layout, r: &mut Report) -> Option<Vec<Record>> {
    let contents = match journal::read_dir(&layout.journal()) {
        Ok(c) => c,
        Err(e) => {
            r.problems.push(format!("journal: {e}"));
            return None;
        }
    };
    if contents.torn_lines > 0 {
        // Whole lines that fail their check with nothing after them to
        // vouch they were durable: damage, or a crash in the middle of a
        // group of appends; either way records the history may lack.
        r.problems.push(format!(
            "journal/{}: {} bytes ({} whole lines) after record {} fail their check (damaged, \
             or cut by a crash); the next mount sets them aside in journal/torn-*",
            contents.segment_name(),
            contents.torn_bytes,
            contents.torn_lines,
            contents.records.last().map_or(0, |r| r.seq)
        ));
    } else if contents.torn_bytes > 0 {
        r.notes.push(format!(
            "journal/{}: {} bytes after its last record are a torn tail (a crash while \
             appending); the next mount sets them aside",
            contents.segment_name(),
            contents.torn_bytes
        ));
    }
    for w in contents.records.windows(2) {
        if w[1].seq != w[0].seq + 1 {
            r.problems.push(format!(
                "journal: ids jump from {} to {}: records are missing",
                w[0].seq, w[1].seq
            ));
        }
    }
    r.records = contents.records.len();
    r.ids = contents
        .records
        .first()
        .zip(contents.records.last())
        .map(|(a, b)| (a.seq, b.seq));
    Some(contents.records)
}

fn check_loose(
    layout: &Layout,
    full: bool,
    r: &mut Report,
    present: &mut HashSet<String>,
    progress: &mut Progress,
) {
    let Ok(rd) = std::fs::read_dir(layout.blobs()) else {
        r.problems
            .push(format!("{}: cannot be listed", layout.blobs().display()));
        return;
    };
    let mut fans: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_name().len() == 2)
        .map(|e| e.path())
        .collect();
    fans.sort();
    for fan in fans {
        let Ok(rd) = std::fs::read_dir(&fan) else {
            continue;
        };
        let fan_name = fan
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for e in rd.filter_map(Result::ok) {
            let id = e.file_name().to_string_lossy().into_owned();
            let name = format!("blobs/{fan_name}/{id}");
            let well_named = id.len() == 64
                && id
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                && id.starts_with(&fan_name);
            if !well_named {
                r.problems.push(format!(
                    "{name}: not a blob's name (sha256 hex, in its fan-out)"
                ));
                continue;
            }
            if full {
                match hash_file(&e.path(), &mut r.bytes_read) {
                    Ok(h) if h == id => {}
                    Ok(h) => {
                        r.problems
                            .push(format!("{name}: its content's hash is {h}, not its name"));
                        continue;
                    }
                    Err(err) => {
                        r.problems.push(format!("{name}: cannot be read: {err}"));
                        continue;
                    }
                }
            }
            r.loose += 1;
            present.insert(id);
            progress.show(&format!("{} loose blobs", r.loose), r.bytes_read);
        }
    }
}

fn hash_file(p: &Path, counted: &mut u64) -> std::io::Result<String> {
    let mut f = open_ro(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        *counted += n as u64;
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// The live tree at `root` against the newest state of every path.
/// Mounted, the tree may move on while it is read: a difference is checked
/// again against the journal read anew, and one whose entry changed while
/// `verify` ran is a note; what stays is a problem.
fn check_live(
    layout: &Layout,
    root: &Path,
    records: &[Record],
    mounted: bool,
    r: &mut Report,
    progress: &mut Progress,
) {
    let started = std::time::SystemTime::now();
    let rules = match crate::config::Config::load(&layout.dir)
        .map_err(crate::error::Failure::from)
        .and_then(|c| Ok(HideRules::build(&c, &crate::hide::RuleArgs::default())?))
    {
        Ok(rules) => rules,
        Err(e) => {
            r.problems
                .push(format!("{}: {}", layout.dir.display(), e.message));
            return;
        }
    };
    let fold = Fold::replay(records);
    let catalog = fold.catalog();
    let mut seen: HashSet<RelPath> = HashSet::new();
    let mut diffs: Vec<(RelPath, String)> = Vec::new();
    let mut stack = vec![RelPath::root()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(root.join(dir.as_os_str())) else {
            continue;
        };
        for e in rd.filter_map(Result::ok) {
            let path = dir.join(e.file_name().as_bytes());
            let Some(kind) = live_kind(&root.join(path.as_os_str())) else {
                continue; // gone, or a FIFO or socket (never versioned)
            };
            if rules.is_untracked(&path, kind) {
                continue;
            }
            seen.insert(path.clone());
            if kind == Kind::Dir && catalog.get(&path).is_some_and(|w| w.kind == Kind::Dir) {
                stack.push(path.clone());
            }
            if let Some(d) = compare(root, &path, catalog.get(&path), &mut r.bytes_read) {
                diffs.push((path, d));
            }
            progress.show(&format!("{} live entries", seen.len()), r.bytes_read);
        }
    }
    for (path, was) in catalog.iter() {
        if !seen.contains(path) && !path.is_root() && !rules.is_untracked(path, was.kind) {
            diffs.push((path.clone(), "recorded, but not in the tree".to_string()));
        }
    }
    if diffs.is_empty() {
        return;
    }
    if !mounted {
        for (path, d) in diffs {
            r.notes.push(format!(
                "live {path}: {d} (changed while unmounted: the next mount records it)"
            ));
        }
        return;
    }
    let again = journal::read_dir(&layout.journal())
        .map(|c| Fold::replay(&c.records))
        .ok();
    for (path, d) in diffs {
        let full = root.join(path.as_os_str());
        let now = again.as_ref().map(|f| f.catalog().get(&path).cloned());
        if let Some(want) = now
            && compare(root, &path, want.as_ref(), &mut r.bytes_read).is_none()
        {
            continue; // recorded since the first read
        }
        let moved_on = std::fs::symlink_metadata(&full).map_or(true, |m| {
            use std::os::unix::fs::MetadataExt;
            let ctime = std::time::UNIX_EPOCH
                + Duration::new(m.ctime().max(0) as u64, m.ctime_nsec().max(0) as u32);
            ctime + Duration::from_secs(2) >= started
        });
        if moved_on {
            r.notes
                .push(format!("live {path}: {d} (it changed while verify ran)"));
        } else {
            r.problems.push(format!("live {path}: {d}"));
        }
    }
}

/// The kind of the live entry at `p`, if versioned kinds hold it.
fn live_kind(p: &Path) -> Option<Kind> {
    let ft = std::fs::symlink_metadata(p).ok()?.file_type();
    if ft.is_dir() {
        Some(Kind::Dir)
    } else if ft.is_symlink() {
        Some(Kind::Symlink)
    } else if ft.is_file() {
        Some(Kind::File)
    } else {
        None
    }
}

/// How the live entry at `path` differs from `want` (its newest recorded
/// state), if it does.
fn compare(
    root: &Path,
    path: &RelPath,
    want: Option<&crate::store::journal::EntryState>,
    bytes: &mut u64,
) -> Option<String> {
    let full = root.join(path.as_os_str());
    let Some(kind) = live_kind(&full) else {
        return want.map(|_| "recorded, but not in the tree".to_string());
    };
    let Some(want) = want else {
        return Some("in no record".to_string());
    };
    if want.kind != kind {
        return Some(format!("a {kind:?}, recorded as a {:?}", want.kind));
    }
    match kind {
        Kind::Dir => None,
        Kind::Symlink => {
            let t = std::fs::read_link(&full).unwrap_or_default();
            (want.target.as_ref().map(|t| t.0.as_slice()) != Some(t.as_os_str().as_bytes()))
                .then(|| "its target differs from the newest record".to_string())
        }
        Kind::File => match hash_file(&full, bytes) {
            Ok(h) if want.blob.as_deref() == Some(h.as_str()) => None,
            Ok(_) => Some("its content differs from the newest record".to_string()),
            Err(e) => Some(format!("cannot be read: {e}")),
        },
    }
}
