//! The command line. Errors end as one line on stderr and the exit code of
//! [`crate::error::Exit`].
//!
//! Owns: the arguments and help of every command, and the exit code each
//! failure ends with. Locks: none (it parses, then calls `commands` or
//! `daemon`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::daemon::{self, MountArgs};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::journal::{self, Record};
use crate::store::{self, Layout, StoreLock};

/// A versioning filesystem for an AI agent's skills directory: every write
/// is a copy-on-write version kept in a store beside the directory.
#[derive(Parser)]
#[command(name = "skillfs", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount skillfs over ROOT itself; the files stay plain files underneath.
    ///
    /// Over an agent's home (`skillfs mount ~/.hermes --versioned skills`)
    /// only ROOT/skills is versioned; the rest of the home is plain, written
    /// in place, and an entry can be renamed between the two (the agent's
    /// batch rollback parks a skill in ~/.hermes/.skill-rollback-asides).
    Mount {
        /// The directory to mount over (it must exist): the versioned
        /// directory itself, or with --versioned the home around it.
        root: PathBuf,
        /// Version only this directory of ROOT (made if missing); the rest
        /// of ROOT is a plain pass-through with no hide rules and no history.
        #[arg(long, value_name = "NAME")]
        versioned: Option<PathBuf>,
        /// Store directory [default: <parent of ROOT>/.skillfs/<name of ROOT>].
        #[arg(long)]
        store: Option<PathBuf>,
        /// Stay in the foreground instead of returning once the mount is ready.
        #[arg(long)]
        foreground: bool,
        /// Threads serving requests.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Let other users (a service account, root's processes) enter the
        /// mount; the kernel checks each entry's mode and owner, as on any
        /// filesystem. Unprivileged, it needs `user_allow_other` in
        /// /etc/fuse.conf.
        #[arg(long)]
        allow_other: bool,
        /// Also hide names matching this rule: `[/]GLOB[:dir|file|root|outside-skills|keep,…]`.
        #[arg(long, value_name = "RULE")]
        hide: Vec<String>,
        /// Stop hiding what a default rule hides (give its text or pattern).
        #[arg(long, value_name = "RULE")]
        show: Vec<String>,
        /// Parks untouched for longer than this are swept at mount (e.g. 12h, 7d; at least 1h) [default: 7d].
        #[arg(long, value_name = "AGE")]
        park_max_age: Option<String>,
        /// Accept a park age below 1h (for tests: it sweeps the temp files
        /// of atomic writers still at work).
        #[arg(long, hide = true)]
        allow_short_park_max_age: bool,
        /// Keep no versions of visible files matching this rule (written
        /// copy-on-write all the same). Defaults: /.usage.json, /.curator_ledger.jsonl.
        #[arg(long, value_name = "RULE")]
        untracked: Vec<String>,
        /// Version again what a default untracked rule excludes.
        #[arg(long, value_name = "RULE")]
        tracked: Vec<String>,
    },
    /// Publish what is open, then unmount ROOT.
    Umount {
        root: PathBuf,
        /// Seconds to wait for the daemon to finish.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Mount state, store location and size, and the range of recorded changes.
    Status {
        /// The versioned directory [default: $HERMES_HOME/skills or ~/.hermes/skills].
        #[arg(long)]
        root: Option<PathBuf>,
        /// The store, when it is not the default one of ROOT.
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// Print a path as it was just after a change: a file's bytes, a
    /// symlink's target, a directory's entries. ID is an id or an alias
    /// (latest, @2026-11-30T18:09:30Z, @-10m).
    Show {
        /// ID:PATH, PATH relative to ROOT (e.g. latest:cat/foo/SKILL.md).
        spec: String,
        #[arg(long)]
        root: Option<PathBuf>,
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// Unified diff between two changes (the second defaults to the newest),
    /// for the whole tree or below PATH. A PATH that looks like an id is
    /// written ./PATH.
    Diff {
        id: String,
        /// A second ID, then an optional PATH.
        rest: Vec<String>,
        #[arg(long)]
        root: Option<PathBuf>,
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// Put PATH back as it was just after change ID, through the mount, as
    /// one swap; entries that did not exist then are removed. The replaced
    /// state stays in history, so a restore can itself be undone.
    Restore {
        id: String,
        /// Relative to ROOT, or absolute under it.
        path: PathBuf,
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// Check the store, changing nothing: the journal's lines and CRCs,
    /// ids with no gap, every pack entry, every record's blob present; with
    /// --full every blob re-hashed and the live tree against the newest
    /// state. Exit 0 when sound, 5 with one line per problem.
    Verify {
        /// Also re-hash every blob and compare the live tree.
        #[arg(long)]
        full: bool,
        #[arg(long)]
        root: Option<PathBuf>,
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// List recorded changes (id, time, operation, path, actor), oldest first.
    Log {
        /// Only changes at or below this path (relative to ROOT, or absolute under it).
        path: Option<PathBuf>,
        /// One JSON object per line, as stored in the journal.
        #[arg(long)]
        json: bool,
        /// The versioned directory [default: $HERMES_HOME/skills or ~/.hermes/skills].
        #[arg(long)]
        root: Option<PathBuf>,
        /// The store, when it is not the default one of ROOT.
        #[arg(long)]
        store: Option<PathBuf>,
    },
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { Exit::Usage as u8 } else { 0 });
        }
    };
    crate::logging::init();
    let code = match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            crate::logging::flush();
            // Not `eprintln!`: it panics when stderr fails (a full disk).
            let _ = writeln!(std::io::stderr(), "skillfs: {}", f.message);
            ExitCode::from(f.exit as u8)
        }
    };
    crate::logging::flush();
    code
}

fn run(cmd: Cmd) -> Result<(), Failure> {
    match cmd {
        Cmd::Mount {
            root,
            versioned,
            store,
            foreground,
            threads,
            allow_other,
            hide,
            show,
            park_max_age,
            allow_short_park_max_age,
            untracked,
            tracked,
        } => daemon::mount(MountArgs {
            root,
            versioned,
            store,
            foreground,
            threads,
            allow_other,
            rules: crate::hide::RuleArgs {
                hide,
                show,
                untracked,
                tracked,
                park_max_age,
                allow_short_park_max_age,
            },
        }),
        Cmd::Umount { root, timeout } => {
            let msg = daemon::umount(&root, Duration::from_secs(timeout))?;
            println!("{msg}");
            Ok(())
        }
        Cmd::Status { root, store } => status(root, store),
        Cmd::Show { spec, root, store } => {
            let (_, layout, records) = open_history(root, store)?;
            crate::commands::show(
                &crate::commands::Store::from_records(layout, &records)?,
                &spec,
            )
        }
        Cmd::Diff {
            id,
            rest,
            root,
            store,
        } => {
            let (_, layout, records) = open_history(root, store)?;
            let st = crate::commands::Store::from_records(layout, &records)?;
            let looks_like_id =
                |t: &str| crate::history::parse_alias(t, crate::time::now_ns()).is_some();
            let (b, path) = match rest.as_slice() {
                [] => (None, None),
                [x] if looks_like_id(x) => (Some(x.as_str()), None),
                [x] => (None, Some(x.as_str())),
                [x, y] => (Some(x.as_str()), Some(y.as_str())),
                _ => return Err(Failure::new(Exit::Usage, "diff takes ID [ID] [PATH]")),
            };
            let rel = match path {
                None => RelPath::root(),
                Some(p) => RelPath::parse(p.as_bytes()).ok_or_else(|| {
                    Failure::new(Exit::Usage, format!("'{p}' must not contain '..'"))
                })?,
            };
            crate::commands::diff(&st, &id, b, &rel)
        }
        Cmd::Restore { id, path, root } => restore(&id, &path, root),
        Cmd::Log {
            path,
            json,
            root,
            store,
        } => log(path, json, root, store),
        Cmd::Verify { full, root, store } => verify(full, root, store),
    }
}

/// `skillfs verify`: problems and notes on stdout, one line each, then the
/// summary; exit 5 if there is any problem.
fn verify(full: bool, root: Option<PathBuf>, store: Option<PathBuf>) -> Result<(), Failure> {
    let root = daemon::versioned_root_of(&daemon::absolute_root(&match root {
        Some(r) => r,
        None => default_root()?,
    })?);
    let layout = resolve_store(&root, store)?;
    if !layout.journal().is_dir() {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "no skillfs store at '{}' (it has no journal/)",
                layout.dir.display()
            ),
        ));
    }
    let mounted = daemon::mount_serving(&root).is_some();
    let r = crate::verify::verify(&layout, &root, full, mounted);
    let mut out = std::io::stdout().lock();
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    for p in &r.problems {
        let _ = writeln!(out, "{p}");
    }
    let ids = r
        .ids
        .map_or("none".to_string(), |(a, b)| format!("{a}-{b}"));
    let mib = r.bytes_read as f64 / (1 << 20) as f64;
    let secs = r.elapsed.as_secs_f64().max(1e-6);
    let what = format!(
        "{} records (ids {ids}), {} packs ({} entries), {} loose blobs{}; {mib:.1} MiB read in \
         {secs:.2} s ({:.0} MiB/s)",
        r.records,
        r.packs,
        r.pack_entries,
        r.loose,
        if full { ", live tree compared" } else { "" },
        mib / secs
    );
    if r.problems.is_empty() {
        let _ = writeln!(out, "sound: {what}");
        return Ok(());
    }
    Err(Failure::new(
        Exit::DamagedJournal,
        format!(
            "{} problem(s) in store '{}': {what}",
            r.problems.len(),
            layout.dir.display()
        ),
    ))
}

/// `$HERMES_HOME/skills`, else `~/.hermes/skills`.
pub fn default_root() -> Result<PathBuf, Failure> {
    if let Some(h) = std::env::var_os("HERMES_HOME") {
        return Ok(PathBuf::from(h).join("skills"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".hermes").join("skills")),
        None => Err(Failure::new(
            Exit::Usage,
            "neither HERMES_HOME nor HOME is set; pass --root",
        )),
    }
}

/// The store to read: `--store`, else the mounted store of ROOT, else ROOT's
/// default store.
fn resolve_store(root: &Path, store: Option<PathBuf>) -> Result<Layout, Failure> {
    if let Some(s) = store {
        return Ok(Layout::new(daemon::store_dir(root, Some(&s))?));
    }
    if let Some(store) = daemon::mount_serving(root).and_then(|m| m.skillfs_store()) {
        return Ok(Layout::new(store));
    }
    Ok(Layout::new(daemon::default_store_of(root)?))
}

/// ROOT (default if not given), its store, and the store's records.
fn open_history(
    root: Option<PathBuf>,
    store: Option<PathBuf>,
) -> Result<(PathBuf, Layout, Vec<Record>), Failure> {
    let root = daemon::versioned_root_of(&daemon::absolute_root(&match root {
        Some(r) => r,
        None => default_root()?,
    })?);
    let layout = resolve_store(&root, store)?;
    let records = crate::commands::read_records(&layout)?;
    Ok((root, layout, records))
}

fn restore(id: &str, path: &Path, root: Option<PathBuf>) -> Result<(), Failure> {
    let root = daemon::versioned_root_of(&daemon::absolute_root(&match root {
        Some(r) => r,
        None => default_root()?,
    })?);
    let Some(store_dir) = daemon::mount_serving(&root).and_then(|m| m.skillfs_store()) else {
        return Err(Failure::new(
            Exit::BadRoot,
            format!(
                "'{}' is not mounted: a restore writes through the mount so that it is versioned",
                root.display()
            ),
        ));
    };
    let rel = relative_to_root(&root, path)?;
    let store = crate::commands::Store::open(Layout::new(store_dir))?;
    let id = store.resolve(id)?;
    let done = crate::commands::restore(&store, &root, id, &rel)?;
    let when = store
        .index
        .time_of(id)
        .map(crate::time::format_utc)
        .unwrap_or_default();
    println!(
        "restored {rel} as of change {id} ({when}): files {}, directories {}, symlinks {}{}",
        done.files,
        done.dirs,
        done.symlinks,
        if done.replaced {
            "; what it replaced stays in history"
        } else {
            ""
        }
    );
    Ok(())
}

/// A user-given path as a path relative to ROOT.
fn relative_to_root(root: &Path, p: &Path) -> Result<RelPath, Failure> {
    use std::os::unix::ffi::OsStrExt;
    let rel = if p.is_absolute() {
        p.strip_prefix(root).map(Path::to_path_buf).map_err(|_| {
            Failure::new(
                Exit::Usage,
                format!("'{}' is not under ROOT '{}'", p.display(), root.display()),
            )
        })?
    } else {
        p.to_path_buf()
    };
    RelPath::parse(rel.as_os_str().as_bytes()).ok_or_else(|| {
        Failure::new(
            Exit::Usage,
            format!("'{}' must not contain '..'", rel.display()),
        )
    })
}

fn status(root: Option<PathBuf>, store: Option<PathBuf>) -> Result<(), Failure> {
    let (root, layout, records) = open_history(root, store)?;
    let mounted = daemon::mount_serving(&root);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "root:     {}", root.display());
    if let Some(m) = mounted.as_ref().filter(|m| m.mount_point != root) {
        let _ = writeln!(
            out,
            "mount:    {} (the rest of it is plain, unversioned)",
            m.mount_point.display()
        );
    }
    let state = match (&mounted, StoreLock::holder(&layout)) {
        (Some(_), Some(pid)) => format!("mounted (daemon pid {pid})"),
        (Some(_), None) => {
            "mounted, but its daemon is not running (run `skillfs umount`)".to_string()
        }
        (None, _) => "not mounted".to_string(),
    };
    let _ = writeln!(out, "state:    {state}");
    let size = store::disk_usage(&layout.dir).unwrap_or(0);
    let _ = writeln!(out, "store:    {} ({} bytes)", layout.dir.display(), size);
    let written = store::fsutil::read_small(&layout.rules(), 1 << 20)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let rules = match (&mounted, written) {
        (Some(_), Some(text)) => text,
        _ => {
            let r = crate::hide::HideRules::build(
                &crate::hide::Config::load(&layout.dir)?,
                &crate::hide::RuleArgs::default(),
            )?;
            format!(
                "hidden: {}\nuntracked: {}\n",
                r.describe().join("  "),
                r.describe_untracked().join("  ")
            )
        }
    };
    for line in rules.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            let _ = writeln!(out, "{:<9} {v}", format!("{k}:"));
        }
    }
    match (records.first(), records.last()) {
        (Some(first), Some(last)) => {
            let _ = writeln!(
                out,
                "changes:  {} (oldest id {} at {}, newest id {} at {})",
                records.len(),
                first.seq,
                crate::time::format_utc(first.ts),
                last.seq,
                crate::time::format_utc(last.ts)
            );
        }
        _ => {
            let _ = writeln!(out, "changes:  0");
        }
    }
    Ok(())
}

fn log(
    path: Option<PathBuf>,
    json: bool,
    root: Option<PathBuf>,
    store: Option<PathBuf>,
) -> Result<(), Failure> {
    let (root, _layout, records) = open_history(root, store)?;
    let filter = match path {
        None => None,
        Some(p) => Some(relative_to_root(&root, &p)?),
    };
    let mut out = std::io::stdout().lock();
    for r in &records {
        if let Some(f) = &filter {
            let hit = r.path.starts_with(f) || r.to.as_ref().is_some_and(|t| t.starts_with(f));
            if !hit {
                continue;
            }
        }
        let res = if json {
            out.write_all(&journal::encode(r))
        } else {
            let to =
                r.to.as_ref()
                    .map(|t| format!(" -> {t}"))
                    .unwrap_or_default();
            writeln!(
                out,
                "{:>6}  {}  {:<11} {}{}  {}[{}] uid={}",
                r.seq,
                crate::time::format_utc(r.ts),
                r.op.name(),
                r.path,
                to,
                r.actor.comm,
                r.actor.pid,
                r.actor.uid
            )
        };
        if res.is_err() {
            break; // stdout closed (e.g. `| head`)
        }
    }
    Ok(())
}
