//! `skillfs export`: its arguments, which output each form writes, and the
//! line it ends with (the work is `crate::export`'s).
//!
//! Exit codes: 8 for an id or PATH not in history; 2 for an output it
//! refuses (inside ROOT or the store, an existing file without --force, a
//! repository holding another history); 3 when --curator finds ROOT
//! unmounted; 1 when writing fails. Whatever fails, nothing is left
//! behind.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use super::locate::{self, Where};
use crate::commands::Store;
use crate::error::{Exit, Failure};
use crate::export::{self, Counts, Output, curator, git, tar};
use crate::relpath::RelPath;

/// The arguments of `skillfs export`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("to").required(true).args(["output", "curator", "git"])))]
pub struct ExportCmd {
    /// The change: an id or alias (latest, @2026-11-30T18:09:30Z, @-10m).
    #[arg(required_unless_present = "git")]
    id: Option<String>,
    /// Only this subtree (relative to the current directory inside the
    /// mount, else to ROOT; or absolute); its members are still named from
    /// ROOT.
    #[arg(conflicts_with_all = ["curator", "git"])]
    path: Option<PathBuf>,
    /// Write the tarball to FILE (`-` for stdout); never inside ROOT.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Replace FILE if it exists.
    #[arg(long, requires = "output")]
    force: bool,
    /// Keep .hub/ and .curator_backups/, which the agent's snapshots leave
    /// out.
    #[arg(long, requires = "output")]
    all: bool,
    /// Write the tree at ID as a snapshot of the agent's curator,
    /// ROOT/.curator_backups/<utc-id>/ (skills.tar.gz, manifest.json),
    /// through the mount: `hermes curator rollback` lists and restores it.
    #[arg(long)]
    curator: bool,
    /// Export every change as a commit on the branch skillfs of the git
    /// repository DIR (made, bare, if missing); a second run adds only the
    /// changes made since.
    #[arg(long, value_name = "DIR", conflicts_with = "id")]
    git: Option<PathBuf>,
    /// With --git: one commit per span of changes, each holding the
    /// changes within DURATION (30m, 1h, 2d) of its first.
    #[arg(long, value_name = "DURATION", requires = "git")]
    squash: Option<String>,
    #[command(flatten)]
    at: Where,
}

pub const EXAMPLES: &str = "\
Examples:
  skillfs export latest -o skills.tar.gz      the tree now, as the agent's snapshots hold it
  skillfs export @-1d cat/foo -o foo.tar.gz   cat/foo as it was a day ago
  skillfs export 42 -o - | tar tzvf -         list the tree after change 42
  skillfs export --curator @-1h               a snapshot `hermes curator rollback` restores
  skillfs export --git ~/skills-history       every change as a git commit (run again to add more)
  skillfs export --git ~/skills-history --squash 1h

Refused, changing nothing: an id or PATH not in history (exit 8); FILE or
DIR inside ROOT or the store, an existing FILE without --force, a DIR
holding another history (exit 2); --curator with ROOT unmounted (exit 3).";

pub fn export(c: ExportCmd) -> Result<(), Failure> {
    if let Some(dir) = &c.git {
        return to_git(&c, dir);
    }
    let id_text = c.id.as_deref().unwrap_or("latest");
    let t = locate::locate(&c.at, c.path.as_deref())?;
    let rel = match c.path.as_deref() {
        Some(p) => t.rel(p)?,
        None => RelPath::root(),
    };
    if c.curator {
        t.live_mount_for(
            "--curator writes its snapshot through the mount, where the agent keeps its own",
        )?;
        let store = Store::open(t.layout.clone())?;
        let id = store.resolve(id_text)?;
        let entries = export::entries(&store, id, &RelPath::root(), true)?;
        let snap = curator::write_snapshot(&store, &t.root, id, &entries)?;
        println!(
            "wrote {}/{} of change {id} ({}): {}, skills.tar.gz {} bytes; the agent's \
             `hermes curator rollback --list` shows it",
            curator::BACKUPS,
            snap.id,
            when(&store, id),
            Counts::of(&entries),
            snap.archive_bytes
        );
        return Ok(());
    }
    let out = c.output.as_deref().unwrap_or(Path::new("-"));
    let to_stdout = out == Path::new("-");
    let out = std::path::absolute(out).map_err(|e| Failure::io(Exit::Usage, "resolve", out, &e))?;
    if to_stdout {
        if std::io::stdout().is_terminal() {
            return Err(Failure::new(
                Exit::Usage,
                "-o - writes a gzip tar to stdout, which is a terminal: redirect or pipe it",
            ));
        }
    } else {
        export::refuse_inside(&out, &t.root, &t.layout.dir, "-o")?;
    }
    let store = Store::open(t.layout.clone())?;
    let id = store.resolve(id_text)?;
    let entries = export::entries(&store, id, &rel, !c.all)?;
    let time = store.index.time_of(id).unwrap_or_default();
    if to_stdout {
        let dest = tar::Dest(Path::new("stdout"));
        let w = std::io::BufWriter::new(std::io::stdout().lock());
        let mut w = tar::write(&store, &entries, time, w, &dest)?;
        return w
            .flush()
            .map_err(|e| Failure::io(Exit::Internal, "write", Path::new("stdout"), &e));
    }
    let mut o = Output::create(&out, c.force)?;
    let dest = tar::Dest(&out);
    let w = tar::write(
        &store,
        &entries,
        time,
        std::io::BufWriter::new(o.file()),
        &dest,
    )?;
    w.into_inner()
        .map_err(|e| Failure::io(Exit::Internal, "write", &out, e.error()))?;
    o.commit(c.force)?;
    let what = if rel.is_root() {
        String::new()
    } else {
        format!("{rel} ")
    };
    println!(
        "exported {what}as of change {id} ({}) to {}: {}",
        when(&store, id),
        out.display(),
        Counts::of(&entries)
    );
    Ok(())
}

/// When change `id` was made, for messages.
fn when(store: &Store, id: u64) -> String {
    store
        .index
        .time_of(id)
        .map(crate::time::format_utc)
        .unwrap_or_default()
}

fn to_git(c: &ExportCmd, dir: &Path) -> Result<(), Failure> {
    let squash = match &c.squash {
        None => None,
        Some(s) => Some(crate::time::parse_age(s).ok_or_else(|| {
            Failure::new(
                Exit::Usage,
                format!("--squash '{s}' is not a duration (30m, 1h, 2d)"),
            )
        })?),
    };
    let t = locate::locate(&c.at, None)?;
    let dir = std::path::absolute(dir).map_err(|e| Failure::io(Exit::Usage, "resolve", dir, &e))?;
    export::refuse_inside(&dir, &t.root, &t.layout.dir, "--git")?;
    let records = crate::commands::read_records(&t.layout)?;
    let store = Store::from_records(t.layout.clone(), &records)?;
    let done = git::export(&store, &records, &dir, squash)?;
    let made = if done.created {
        " (a new bare repository: `git clone` it to look at the files)"
    } else {
        ""
    };
    let left = if done.left_out > 0 {
        format!(
            "; {} paths named .git left out (git cannot check them out)",
            done.left_out
        )
    } else {
        String::new()
    };
    match done.ids {
        None if store.index.last() == 0 => {
            println!("the history is empty: nothing to export{made}")
        }
        None => println!(
            "'{}' is up to date: its branch skillfs holds every change to {}{made}",
            dir.display(),
            store.index.last()
        ),
        Some((a, b)) => println!(
            "exported changes {a} to {b} into '{}' as {} commits on branch skillfs{made}{left}",
            dir.display(),
            done.commits
        ),
    }
    Ok(())
}
