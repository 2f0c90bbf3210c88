//! The command line: the arguments, help, completions and man page of
//! every command (one clap definition for all four), and the exit code
//! each failure ends with. Errors end as one line on stderr and the exit
//! code of [`crate::error::Exit`].
//!
//! One question a file:
//! - `locate`: which ROOT and store a command means (git-style, from PATH
//!   or the current directory inside a mount);
//! - `log`: `skillfs log`, its filters and its grouping by operation;
//! - `missing`: what a command says when its PATH is not in history;
//! - `undo`: `skillfs undo`;
//! - `status`: `skillfs status`;
//! - `export`: `skillfs export` (a tarball, a curator snapshot, git);
//! - `import`: `skillfs import`, the agent's own history into a new store;
//! - `sync`: `skillfs remote` and `skillfs sync`, skills across machines;
//! - `man`: `skillfs man`, the pages made from the clap definition;
//! - `output`: paging and colour on a terminal.
//!
//! Locks: none (it parses, then calls `commands` or `daemon`).

mod export;
pub(crate) mod forget;
mod import;
mod locate;
mod log;
mod man;
mod missing;
mod output;
mod show;
mod status;
mod sync;
mod undo;
mod verify;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use crate::daemon::{self, MountArgs};
use crate::error::{Exit, Failure};

pub use locate::{Where, default_root};

const EXAMPLES: &str = "\
Examples:
  skillfs mount ~/.hermes --versioned skills   version the agent's skills
  ls -v ~/.hermes/skills/.history              every change id, oldest first
  cat ~/.hermes/skills/.history/@-10m/cat/foo/SKILL.md
                                               a file as it was 10 minutes ago
  cd ~/.hermes/skills/cat/foo && skillfs log SKILL.md
                                               that file's changes
  skillfs diff @-1h cat/foo                    what changed in the last hour
  skillfs undo                                 put back the state before the newest change
  skillfs restore 42 cat/foo                   cat/foo as it was just after change 42
  skillfs status                               mount, history and store at a glance
  skillfs export --git ~/skills-history        every change as a git commit

Inside a mount, commands find ROOT and the store themselves (as git finds
its repository); elsewhere ROOT is $HERMES_HOME/skills or ~/.hermes/skills.
Every directory of a mount answers `.history` (never listed):
.history/<id>/ and .history/<alias>/ (latest, @2026-11-30T18:09:30Z, @-10m,
@-2h, @-3d) hold the tree as it was then, read-only; `cp -a` restores.

Exit codes:
  0 success             1 internal failure      2 usage error
  3 bad ROOT (missing, not mounted, a dead mount)
  4 bad store (for import: it holds history already)
  5 damaged journal (for import: damaged parts skipped or members refused, the rest imported)
  6 the mount was refused
  7 bad hide rules or config                    8 not in history
  9 busy (umount refused: processes are inside the mount; nothing changed)
  10 a remote could not be reached or refused a push";

/// A versioning filesystem for an AI agent's skills directory: every write
/// is a copy-on-write version kept in a store beside the directory.
#[derive(Parser)]
#[command(name = "skillfs", version, after_help = EXAMPLES)]
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
    #[command(after_help = "\
Examples:
  skillfs mount ~/.hermes --versioned skills   the agent's home, versioning skills/
  skillfs mount ~/.claude/skills               a skills directory alone")]
    Mount(MountCmd),
    /// Unmount ROOT once nothing is inside it; refuse (exit 9) while busy.
    ///
    /// As umount(8): while any process has a file open, a directory as its
    /// working directory or a file mapped inside the mount, nothing is
    /// changed: the mount stays up and versioned, and the command names
    /// the processes (pid and command) and exits 9. --lazy detaches at once
    /// instead, as `umount -l`: the daemon serves what is open until it is
    /// closed, and new writes under ROOT go to the plain directory,
    /// unversioned until the next mount.
    #[command(
        visible_alias = "unmount",
        after_help = "Examples:\n  skillfs umount ~/.hermes\n  skillfs umount --lazy ~/.hermes   detach now, even while busy"
    )]
    Umount {
        /// The mount point (a home mounted with --versioned, or the
        /// versioned directory itself).
        root: PathBuf,
        /// Seconds to wait for the daemon to finish once unmounted.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Detach now even if busy (writes by path then bypass versioning
        /// until the next mount).
        #[arg(long, short = 'l')]
        lazy: bool,
    },
    /// Mount state, history (changes, versions, oldest and newest), store
    /// size and what dedup saves, parks waiting for the sweep, rules.
    #[command(after_help = "Example:\n  skillfs status")]
    Status {
        #[command(flatten)]
        at: Where,
    },
    /// Check the store, changing nothing: the journal's lines and CRCs,
    /// ids with no gap, every pack entry, every record's blob present; with
    /// --full every blob re-hashed and the live tree against the newest
    /// state. Exit 0 when sound, 5 with one line per problem.
    #[command(after_help = "Examples:\n  skillfs verify\n  skillfs verify --full")]
    Verify {
        /// Also re-hash every blob and compare the live tree.
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        at: Where,
    },
    /// Forget old versions by a retention policy (restic's words), and
    /// reclaim the bytes only they held. Kept ids keep their numbers and
    /// their trees; forgotten ids leave .history and log. Always kept: the
    /// newest id, and the tree just before each removal (a removed path's
    /// last version). Mounted, the daemon does it while the agent writes.
    #[command(after_help = "\
Examples:
  skillfs forget --keep-within 30d --keep-daily 90 --dry-run
  skillfs forget --keep-last 200 --keep-weekly 52

Counts keep the newest id of each of the last N hours, UTC days, ISO
weeks or months that have one; --keep-within keeps every id within that
age of the newest. Rules add up. A kill leaves the store sound; run the
command again to finish reclaiming.")]
    Forget {
        #[command(flatten)]
        policy: crate::retention::Policy,
        /// Say what would be forgotten and freed; change nothing.
        #[arg(long, short = 'n')]
        dry_run: bool,
        #[command(flatten)]
        at: Where,
    },
    /// Make a damaged journal readable again, the store unmounted: every
    /// sound record is kept with its id, every id a damaged line held gets
    /// a `lost` record, and each changed segment is first copied whole into
    /// journal/damaged-*; nothing is deleted.
    #[command(after_help = "Example:\n  skillfs verify; skillfs repair; skillfs verify")]
    Repair {
        #[command(flatten)]
        at: Where,
    },
    /// List recorded changes, oldest first, one line per operation (the
    /// records of one process in one go, as a `sed -i` or a restore).
    #[command(after_help = "\
Examples:
  skillfs log -n 10                 the ten newest operations
  skillfs log --since 2h cat/foo    what happened to cat/foo in two hours
  skillfs log --actor python3 --all every record made by python3
  skillfs log --replica 0a1b2c3d cat/foo   another machine's versions of cat/foo

A line is `id  time  operation  path[ -> to]  process[pid] uid=N`; an
operation of several records shows `first-last  time  N changes  path
(+M more) (operations)`. On a terminal it pages ($PAGER, else less) and
colours; piped, it prints plain text.")]
    Log {
        /// Only changes at or below this path (relative to the current
        /// directory inside the mount, else to ROOT; or absolute).
        path: Option<PathBuf>,
        /// Only the newest N operations (records with --all or --json).
        #[arg(short = 'n', long = "max-count", value_name = "N")]
        count: Option<usize>,
        /// Only changes made since then: an age (30m, 1h, 2d) or a UTC
        /// time (2026-11-30T18:09:30Z).
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// Only changes made until then (an age or a UTC time).
        #[arg(long, value_name = "WHEN")]
        until: Option<String>,
        /// Only changes made by this process name (or pid); a merge's are
        /// `sync:<8 digits of the replica>`, and `sync:<8 digits>/NAME`
        /// keeps those that came from NAME on that replica.
        #[arg(long, value_name = "NAME")]
        actor: Option<String>,
        /// Another replica's versions as this store keeps them (its id, or
        /// the start of one), merged here or not: one line each, with the
        /// commit that holds its files.
        #[arg(long, value_name = "REPLICA", conflicts_with = "all")]
        replica: Option<String>,
        /// Every record on its own line, not grouped by operation.
        #[arg(long)]
        all: bool,
        /// One JSON object per record, as stored in the journal.
        #[arg(long)]
        json: bool,
        /// Never page, even on a terminal.
        #[arg(long)]
        no_pager: bool,
        #[command(flatten)]
        at: Where,
    },
    /// Print a path as it was just after a change: a file's bytes, a
    /// symlink's target, a directory's entries. ID is an id or an alias
    /// (latest, @2026-11-30T18:09:30Z, @-10m), or another machine's
    /// version as `log --replica` names it, REPLICA:ID: at least 8 hex
    /// digits of that store's replica id (`log` shows them in
    /// `sync:0a1b2c3d`; `skillfs status` there prints it whole) and the
    /// change's id there.
    #[command(after_help = "\
Examples:
  skillfs show @-1h:cat/foo/SKILL.md
  skillfs show 42 cat/foo/SKILL.md   the same form as diff and restore
  skillfs show 0a1b2c3d:17:cat/foo/SKILL.md   replica 0a1b2c3d's version 17")]
    Show {
        /// ID:PATH (e.g. latest:cat/foo/SKILL.md), or ID alone with PATH
        /// after it. ID is an id, an alias, or REPLICA:ID; PATH as for log.
        #[arg(value_name = "ID:PATH|ID")]
        spec: String,
        /// PATH, when the first argument is an ID alone.
        path: Option<PathBuf>,
        #[command(flatten)]
        at: Where,
    },
    /// Unified diff between two changes (the second defaults to the newest),
    /// for the whole tree or below PATH. A PATH that looks like an id is
    /// written ./PATH. Either change may be another machine's version
    /// (REPLICA:ID, as `log --replica` names it): then modes are compared
    /// as git keeps them (executable or not).
    #[command(after_help = "\
Examples:
  skillfs diff @-1d latest cat/foo
  skillfs diff 0a1b2c3d:17 cat/foo   from replica 0a1b2c3d's version 17 to now")]
    Diff {
        /// The change to compare from: an id as log shows it, an alias
        /// (latest, @2026-11-30T18:09:30Z, @-10m), or another replica's
        /// version (REPLICA:ID).
        id: String,
        /// A second ID, then an optional PATH.
        rest: Vec<String>,
        #[command(flatten)]
        at: Where,
    },
    /// Put PATH back as it was just after change ID, through the mount, as
    /// one swap; entries that did not exist then are removed. The replaced
    /// state stays in history, so a restore can itself be undone. ID may
    /// be another machine's version (REPLICA:ID, as `log --replica` names
    /// it, with at least 8 hex digits of its replica id): PATH as that
    /// replica had it, written under the sync lock (exit 9 while a sync
    /// runs).
    #[command(after_help = "\
Examples:
  skillfs restore @-10m cat/foo
  skillfs restore 0a1b2c3d:17 cat/foo   as replica 0a1b2c3d's version 17 had it")]
    Restore {
        /// The change whose state to put back: an id as log shows it, an
        /// alias (latest, @2026-11-30T18:09:30Z, @-10m), or another
        /// replica's version as `log --replica` shows it (REPLICA:ID).
        id: String,
        /// Relative to the current directory inside the mount, else to
        /// ROOT; or absolute under ROOT.
        path: PathBuf,
        #[command(flatten)]
        at: Where,
    },
    /// Put back the state before the newest operation (of PATH, or of the
    /// whole tree), through the mount, as an operation of its own: `undo`
    /// again undoes the undo.
    #[command(after_help = "\
Examples:
  skillfs undo --dry-run          what an undo would put back, as a diff from now
  skillfs undo cat/foo/SKILL.md   that file as it was before its newest change")]
    Undo {
        /// Only this path (as for log).
        path: Option<PathBuf>,
        /// Print what the undo would do: each path it would restore or
        /// remove, and the diff from now to the state it goes back to;
        /// change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        at: Where,
    },
    /// Take history elsewhere: the tree at ID as a gzip tar laid out as the
    /// agent's curator snapshots are (-o), such a snapshot where the agent's
    /// rollback finds it (--curator), or every change as a git commit
    /// (--git). Reads the store, mounted or not; never writes into ROOT
    /// except --curator's snapshot.
    #[command(after_help = export::EXAMPLES)]
    Export(export::ExportCmd),
    /// Make the agent's own history the start of skillfs's: its curator
    /// snapshots (skills/.curator_backups/<id>/skills.tar.gz) and its skill
    /// ledger (skills/.curator_ledger.jsonl, blobs in
    /// .curator_backups/blobs beside skills/), oldest first, each at its
    /// own time.
    /// The first mount of a root does this by itself; this command does it
    /// before, into a store that holds no history yet (it refuses one that
    /// does). A damaged part is one line on stderr and is skipped (exit 5);
    /// so is a snapshot member whose name leads out of the root (refused
    /// alone, as GNU tar does). The rest is imported.
    #[command(after_help = "\
Examples:
  skillfs import ~/.hermes --versioned skills --dry-run   what would be taken and skipped
  skillfs import ~/.hermes --versioned skills             then mount as usual")]
    Import {
        #[command(flatten)]
        at: Placement,
        /// Read and check everything, say what would be imported and what
        /// skipped; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Manage the remotes this store syncs with (git repositories).
    #[command(subcommand, after_help = sync::REMOTE_EXAMPLES)]
    Remote(sync::RemoteCmd),
    /// Push this replica's versions to the remotes, as commits on its own
    /// ref, fetch the other replicas', and merge them into this tree
    /// through the mount (per skill, per file, per line; a conflict keeps
    /// this tree's side live).
    #[command(after_help = sync::SYNC_EXAMPLES)]
    Sync {
        /// Only this remote.
        name: Option<String>,
        /// List the conflicts of the merges so far, and do nothing else.
        #[arg(long, conflicts_with = "merge")]
        conflicts: bool,
        /// Only merge what earlier syncs fetched (no push, no fetch): what
        /// the mounted daemon runs after its scheduled sync.
        #[arg(long)]
        merge: bool,
        /// Take the other replica's side of the conflict at PATH: written
        /// through the mount as a version (undo takes it back); the
        /// conflict is listed no more.
        #[arg(long, value_name = "PATH", conflicts_with_all = ["name", "conflicts", "merge", "keep"])]
        take: Option<PathBuf>,
        /// Keep this tree's side of the conflict at PATH as it is; the
        /// conflict is listed no more (the other replica keeps its side
        /// until it takes this one).
        #[arg(long, value_name = "PATH", conflicts_with_all = ["name", "conflicts", "merge"])]
        keep: Option<PathBuf>,
        /// With --take or --keep: whose conflict, where more than one
        /// replica has one at PATH.
        #[arg(long, value_name = "REPLICA")]
        replica: Option<String>,
        #[command(flatten)]
        at: Where,
    },
    /// Print a completion script for a shell.
    #[command(after_help = "\
Examples:
  skillfs completions bash > ~/.local/share/bash-completion/completions/skillfs
  skillfs completions zsh > \"${fpath[1]}/_skillfs\"
  skillfs completions fish > ~/.config/fish/completions/skillfs.fish")]
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff) of skillfs or of one command, made from
    /// this help; or write every page into a directory.
    #[command(after_help = "\
Examples:
  skillfs man --dir ~/.local/share/man/man1   skillfs.1 and skillfs-<command>.1
  skillfs man restore | man -l -              the page of one command")]
    Man {
        /// The command whose page to print (skillfs-COMMAND(1)).
        #[arg(value_name = "COMMAND", conflicts_with = "dir")]
        command: Option<String>,
        /// Write skillfs.1 and skillfs-<command>.1 for every command into
        /// DIR (made if missing), replacing pages of those names.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// Which directory a store versions and where the store is: `mount`'s,
/// and `import`'s, which prepares the same store.
#[derive(clap::Args)]
struct Placement {
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
}

/// The arguments of `skillfs mount`.
#[derive(clap::Args)]
struct MountCmd {
    #[command(flatten)]
    at: Placement,
    /// Stay in the foreground instead of returning once the mount is ready.
    #[arg(long)]
    foreground: bool,
    /// Over a mount served by an older skillfs daemon (after an upgrade):
    /// wait until nothing is inside it to restart it on this binary,
    /// instead of leaving the older daemon serving.
    #[arg(long)]
    wait: bool,
    /// Threads serving requests.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// How the kernel sends requests: io_uring when it offers it (Linux
    /// 6.14+, `fuse.enable_uring=1`), else classic `/dev/fuse` reads
    /// [default: $SKILLFS_TRANSPORT, else auto].
    #[arg(long, value_enum)]
    transport: Option<crate::fuse::Transport>,
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
    /// copy-on-write all the same). Defaults: /.usage.json,
    /// /.curator_ledger.jsonl, and editors' scratch files: .NAME.sw?, NAME~,
    /// 4913, .#NAME, #NAME#, NAME.vsctmp, NAME___jb_tmp___, NAME___jb_old___
    /// (`skillfs status` lists the rules in force).
    #[arg(long, value_name = "RULE")]
    untracked: Vec<String>,
    /// Version again what a default untracked rule excludes (give its text
    /// or pattern, e.g. '*~').
    #[arg(long, value_name = "RULE")]
    tracked: Vec<String>,
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

/// `SKILLFS_TRANSPORT` (auto, uring, classic): the default of
/// `--transport`, so that every mount of a test run uses one transport.
fn transport_from_env() -> Result<crate::fuse::Transport, Failure> {
    match std::env::var("SKILLFS_TRANSPORT") {
        Err(_) => Ok(crate::fuse::Transport::Auto),
        Ok(v) => <crate::fuse::Transport as clap::ValueEnum>::from_str(&v, false).map_err(|_| {
            Failure::new(
                Exit::Usage,
                format!("SKILLFS_TRANSPORT='{v}' is not one of auto, uring, classic"),
            )
        }),
    }
}

fn run(cmd: Cmd) -> Result<(), Failure> {
    match cmd {
        Cmd::Mount(m) => daemon::mount(MountArgs {
            root: m.at.root,
            versioned: m.at.versioned,
            store: m.at.store,
            foreground: m.foreground,
            threads: m.threads,
            allow_other: m.allow_other,
            transport: match m.transport {
                Some(t) => t,
                None => transport_from_env()?,
            },
            rules: crate::hide::RuleArgs {
                hide: m.hide,
                show: m.show,
                untracked: m.untracked,
                tracked: m.tracked,
                park_max_age: m.park_max_age,
                allow_short_park_max_age: m.allow_short_park_max_age,
            },
            wait: m.wait,
        }),
        Cmd::Import { at, dry_run } => import::import(
            &MountArgs {
                root: at.root,
                versioned: at.versioned,
                store: at.store,
                foreground: false,
                threads: 1,
                allow_other: false,
                transport: crate::fuse::Transport::Classic,
                rules: crate::hide::RuleArgs::default(),
                wait: false,
            },
            dry_run,
        ),
        Cmd::Umount {
            root,
            timeout,
            lazy,
        } => {
            let msg = daemon::umount(&root, Duration::from_secs(timeout), lazy)?;
            println!("{}", crate::error::one_line(msg));
            Ok(())
        }
        Cmd::Status { at } => status::status(&locate::locate(&at, None)?),
        Cmd::Verify { full, at } => verify::verify(&locate::locate(&at, None)?, full),
        Cmd::Repair { at } => verify::repair(&locate::locate(&at, None)?),
        Cmd::Forget {
            policy,
            dry_run,
            at,
        } => forget::forget(&locate::locate(&at, None)?, policy, dry_run),
        Cmd::Show { spec, path, at } => show::show(&spec, path.as_deref(), &at),
        Cmd::Diff { id, rest, at } => show::diff(&id, &rest, &at),
        Cmd::Restore { id, path, at } => show::restore(&id, &path, &at),
        Cmd::Export(c) => export::export(c),
        Cmd::Remote(c) => sync::remote(c),
        Cmd::Sync {
            name,
            conflicts,
            merge,
            take,
            keep,
            replica,
            at,
        } => match (take, keep) {
            (Some(p), _) => sync::resolve(&p, crate::sync::Resolve::Take, replica.as_deref(), &at),
            (_, Some(p)) => sync::resolve(&p, crate::sync::Resolve::Keep, replica.as_deref(), &at),
            _ => sync::sync(name.as_deref(), (conflicts, merge), &at),
        },
        Cmd::Undo { path, dry_run, at } => {
            let t = locate::locate(&at, path.as_deref())?;
            let rel = path.as_deref().map(|p| t.rel(p)).transpose()?;
            undo::undo(&t, rel, dry_run)
        }
        Cmd::Log {
            path,
            count,
            since,
            until,
            actor,
            replica,
            all,
            json,
            no_pager,
            at,
        } => {
            let t = locate::locate(&at, path.as_deref())?;
            let now = crate::time::now_ns();
            let mut filter = log::Filter {
                path: path.as_deref().map(|p| t.rel(p)).transpose()?,
                since: since.map(|s| log::parse_when(&s, now, false)).transpose()?,
                until: until.map(|s| log::parse_when(&s, now, true)).transpose()?,
                actor,
                authors: Default::default(),
            };
            let show = log::Show {
                json,
                all,
                count,
                page: !no_pager,
            };
            if let Some(r) = replica {
                let list = crate::sync::fetched(&t.layout, &r, filter.path.as_ref())?;
                return log::print_fetched(&list, &filter, &show);
            }
            let records = crate::commands::read_records(&t.layout)?;
            if let (Some(p), Some(rel)) = (path.as_deref(), &filter.path) {
                missing::logged(&t, &records, p, rel)?;
            }
            // The live ledger, read now: entries the agent appended since
            // the versions they describe were recorded.
            let (ledger, _) = crate::agent::ledger::places(&t.root);
            let (entries, _) = crate::agent::ledger::read(&ledger);
            let mut roots = vec![t.root.clone()];
            roots.extend(t.root.canonicalize().ok().filter(|c| *c != t.root));
            let mut notes = crate::agent::ledger::annotations(&records, &entries, &roots);
            // Where the changes a merge, a take or a restore of another
            // replica's version wrote came from: believed for a record of
            // that replica's applier only (the journal is the truth).
            let by_author = filter
                .actor
                .as_deref()
                .is_some_and(|a| a.starts_with("sync:") && a.contains('/'));
            if !json || by_author {
                for (seq, o) in crate::sync::origins(&t.layout) {
                    let by_applier = records
                        .binary_search_by_key(&seq, |r| r.seq)
                        .is_ok_and(|i| records[i].actor.comm == crate::sync::actor_of(&o.replica));
                    if !by_applier {
                        continue;
                    }
                    if !json {
                        notes.entry(seq).or_default().push(log::origin_words(&o));
                    }
                    if by_author {
                        filter.authors.insert(seq, o.author);
                    }
                }
            }
            log::print(&records, &notes, &filter, &show)?;
            // Another replica's versions are this store's history too
            // before they are merged: said where to find them (on
            // stderr, so that the log itself stays what it was).
            if !json {
                for (r, n) in crate::sync::unmerged(&t.layout, filter.path.as_ref()) {
                    eprintln!(
                        "replica {}: {n} version{} fetched and not merged here yet: \
                         skillfs log --replica {}",
                        &r[..8.min(r.len())],
                        if n == 1 { "" } else { "s" },
                        &r[..8.min(r.len())]
                    );
                }
            }
            Ok(())
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "skillfs",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Cmd::Man { command, dir } => man::man(Cli::command(), command.as_deref(), dir.as_deref()),
    }
}
