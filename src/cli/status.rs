//! `skillfs status`, read like `df -h` and `restic stats`: where ROOT,
//! its mount and its store are, whether a daemon serves it, how many
//! changes and file versions the history holds from when to when, the
//! store's size and what deduplication saves, the parks waiting for the
//! sweep with their ages, and the rules in force.
//!
//! Locks: none; it reads the journal once and the store's directories.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsFd;

use crate::error::Failure;
use crate::store::journal::{Kind, Record};
use crate::store::{self, Layout, StoreLock};

use super::locate::Target;

/// Bytes in binary units, as `df -h`: `512 B`, `12.3 KiB`, `4.0 GiB`.
pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Every file version the history holds, and the bytes of its distinct
/// contents: (versions, their bytes, distinct contents' bytes).
fn versions(records: &[Record]) -> (u64, u64, u64) {
    let mut seen: HashMap<&str, u64> = HashMap::new();
    let (mut n, mut total) = (0u64, 0u64);
    for s in records.iter().filter_map(|r| r.state.as_ref()) {
        if s.kind != Kind::File {
            continue;
        }
        let Some(blob) = s.blob.as_deref() else {
            continue;
        };
        n += 1;
        total = total.saturating_add(s.size);
        seen.entry(blob).or_insert(s.size);
    }
    (n, total, seen.values().sum())
}

/// The entries of `area` (`parked/<key>/<name>` or `orphans/<…>/<name>`)
/// with the newest time in each (what the sweep's age counts from).
fn waiting(area: &std::path::Path) -> Vec<(String, i128)> {
    let mut out = Vec::new();
    let Ok(fd) = crate::sys::openat(
        crate::sys::CWD,
        std::os::unix::ffi::OsStrExt::as_bytes(area.as_os_str()),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    ) else {
        return out;
    };
    let fd = std::os::fd::OwnedFd::from(fd);
    for key in crate::sys::read_dir_at(fd.as_fd(), b".").unwrap_or_default() {
        for e in crate::sys::read_dir_at(fd.as_fd(), &key.name).unwrap_or_default() {
            let mut rel = key.name.clone();
            rel.push(b'/');
            rel.extend_from_slice(&e.name);
            if let Ok(t) = crate::sys::newest_mtime_at(fd.as_fd(), &rel) {
                out.push((String::from_utf8_lossy(&e.name).into_owned(), t));
            }
        }
    }
    out.sort_by_key(|(_, t)| *t);
    out
}

pub fn status(t: &Target) -> Result<(), Failure> {
    let records = crate::commands::read_records(&t.layout)?;
    let layout: &Layout = &t.layout;
    let now = crate::time::now_ns();
    let mut out = std::io::stdout().lock();
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "{:<10} {v}", format!("{k}:"));
    };
    row("root", t.root.display().to_string());
    if let Some(m) = t.mount.as_ref().filter(|m| m.mount_point != t.root) {
        row(
            "mount",
            format!(
                "{} (the rest of it is plain, unversioned)",
                m.mount_point.display()
            ),
        );
    }
    let state = match (&t.mount, StoreLock::holder(layout)) {
        (Some(_), Some(pid)) => format!("mounted (daemon pid {pid})"),
        (Some(m), None) => format!(
            "mounted, but its daemon is not running (a dead mount: `skillfs mount {}` \
             recovers it)",
            m.mount_point.display()
        ),
        (None, Some(pid)) => format!(
            "not mounted; a daemon (pid {pid}) still serves files left open in a detached \
             mount, and ends when they are closed"
        ),
        (None, None) => "not mounted".to_string(),
    };
    row("state", state);
    // After an upgrade the running daemon is the binary as it was.
    if let Some(m) = &t.mount
        && let Some(pid) = StoreLock::daemon(layout)
    {
        use crate::daemon::Build;
        match crate::daemon::compare_build(pid) {
            Ok(Build::Older) => row(
                "daemon",
                format!(
                    "pid {pid} runs an older skillfs build than this one: `skillfs mount {}` \
                     restarts it on this one when the mount is quiet (--wait waits for that)",
                    m.mount_point.display()
                ),
            ),
            Ok(Build::NotOlder) => row(
                "daemon",
                format!("pid {pid} runs another skillfs build, not older than this one"),
            ),
            Ok(Build::Same) | Err(_) => {}
        }
    }
    if t.mount.is_some() && StoreLock::holder(layout).is_some() {
        let transport = match crate::daemon::control::ask(
            &layout.dir,
            &crate::daemon::control::Request::Status,
            crate::daemon::control::STATUS_WAIT,
        ) {
            Ok(crate::daemon::control::Response::Status { transport }) => transport,
            Ok(other) => format!("unknown (the daemon answered {other:?})"),
            Err(e) => format!("unknown (no answer on the control socket: {e})"),
        };
        row("transport", transport);
    }
    let size = store::disk_usage(&layout.dir).unwrap_or(0);
    row(
        "store",
        format!("{} ({} on disk)", layout.dir.display(), human(size)),
    );
    let (n, total, distinct) = versions(&records);
    row(
        "history",
        format!(
            "{} changes, {n} file versions ({} of content, {} distinct: {} saved by dedup)",
            records.len(),
            human(total),
            human(distinct),
            human(total - distinct)
        ),
    );
    let when = |r: &Record| {
        format!(
            "id {} at {} ({})",
            r.seq,
            crate::time::format_utc(r.ts),
            crate::time::ago(r.ts, now)
        )
    };
    if let (Some(first), Some(last)) = (records.first(), records.last()) {
        row("oldest", when(first));
        row("newest", when(last));
    }
    let forgotten = records.len() - crate::retention::unforgotten(&records).len();
    let schedule = crate::config::Config::load(&layout.dir)
        .ok()
        .and_then(|c| c.retention)
        .map(|p| {
            let mut p = p;
            let every = p.every.take().unwrap_or_else(|| "1d".to_string());
            format!(
                "; config.json: every {every}, {}",
                serde_json::to_string(&p).unwrap_or_default()
            )
        })
        .unwrap_or_default();
    row(
        "forgotten",
        format!("{forgotten} ids (skillfs forget){schedule}"),
    );
    let written = store::fsutil::read_small(&layout.rules(), 1 << 20)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let rules = match (&t.mount, written) {
        (Some(_), Some(text)) => text,
        _ => {
            let r = crate::hide::HideRules::build(
                &crate::config::Config::load(&layout.dir)?,
                &crate::hide::RuleArgs::default(),
            )?;
            format!(
                "hidden: {}\nuntracked: {}\nparks swept after: {}\n",
                r.describe().join("  "),
                r.describe_untracked().join("  "),
                crate::time::format_age(r.park_max_age_ns)
            )
        }
    };
    for (what, area) in [("parks", layout.parked()), ("orphans", layout.orphans())] {
        let w = waiting(&area);
        let list: Vec<String> = w
            .iter()
            .take(10)
            .map(|(name, t)| {
                let ns = i64::try_from(*t).unwrap_or(i64::MAX);
                format!("{name} (touched {})", crate::time::ago(ns, now))
            })
            .collect();
        let more = w.len().saturating_sub(list.len());
        row(
            what,
            match w.len() {
                0 => "none".to_string(),
                n => format!(
                    "{n}: {}{}",
                    list.join(", "),
                    if more > 0 {
                        format!(", and {more} more")
                    } else {
                        String::new()
                    }
                ),
            },
        );
    }
    for line in rules.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            row(k, v.to_string());
        }
    }
    // Skills across machines: the replica and each remote's last sync.
    let remotes = crate::sync::remotes_dir(layout, false)
        .ok()
        .flatten()
        .and_then(|d| crate::sync::Remotes::load(Some(&d)).ok())
        .unwrap_or_default();
    if !remotes.remotes.is_empty() {
        let id = crate::sync::replica_id(layout, false).ok().flatten();
        row(
            "replica",
            id.unwrap_or_else(|| "none yet (made at the first sync)".to_string()),
        );
        let last = records.last().map_or(0, |r| r.seq);
        for r in &remotes.remotes {
            let ahead = match (r.error.as_ref(), r.pushed) {
                (None, Some(p)) if last > p => format!(" ({} newer changes to push)", last - p),
                _ => String::new(),
            };
            row(
                &format!("remote {}", r.name),
                format!("{} {}{ahead}", r.url, super::sync::describe(r, now)),
            );
        }
        let conflicts = crate::sync::conflicts(layout).map_or(0, |c| c.len());
        if conflicts > 0 {
            row(
                "conflicts",
                format!("{conflicts} (this tree's side live; skillfs sync --conflicts lists them)"),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn sizes_read_as_df_h() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(5 * 1024 * 1024 * 1024), "5.0 GiB");
    }
}
