//! `skillfs remote add|list|remove` and `skillfs sync`: the command line of
//! skills across machines (the work is `crate::sync`'s).
//!
//! Locks: `sync/lock` in the store while the remotes change or a sync
//! runs.

use super::locate::{Target, Where};
use crate::error::{Exit, Failure};
use crate::sync::{Remote, Remotes, check_name};

pub const REMOTE_EXAMPLES: &str = "\
Examples:
  skillfs remote add origin git@github.com:me/skills.git
  skillfs remote add usb /media/usb/skills.git     a bare repository on a path
  skillfs remote add team URL --sign --signers ~/.ssh/allowed_signers
                                 sign what is pushed; merge only what those keys signed
  skillfs remote list
  skillfs remote remove usb";

pub const SYNC_EXAMPLES: &str = "\
Examples:
  skillfs sync              with every remote
  skillfs sync origin       with one
  skillfs sync --conflicts  what collided, with the commit of the other side
  skillfs sync --take cat/s/SKILL.md   take the other side of one

Each store is a replica with an id of its own (REPLICA in the store). A
sync pushes every version as a commit on this replica's one ref,
refs/heads/skillfs/<replica>, never forced, and fetches the other
replicas' refs, keeping what it fetched in the store for good. Then,
with ROOT mounted, it merges each other replica's newest version into
this tree, through the mount: a skill only one side changed is taken
whole, one both changed is merged file by file and line by line, and
where the changes collide this tree's side stays live and the other is
a conflict (`skillfs sync --conflicts`), never a file in the tree. Each
skill is swapped in whole; one being written is left for the next sync.
`skillfs undo` takes a merge back.";

#[derive(clap::Subcommand)]
pub enum RemoteCmd {
    /// Add a remote: any URL git takes (a path, file://, ssh://,
    /// https://). Checked with `git ls-remote` unless --no-check.
    Add {
        name: String,
        url: String,
        /// Do not check that git can reach it now.
        #[arg(long)]
        no_check: bool,
        /// Sign this replica's newest commit before each push there (with
        /// your git's signing key: user.signingKey, gpg.format=ssh).
        #[arg(long)]
        sign: bool,
        /// Merge a replica's commits fetched from it only when a key of
        /// this file (ssh-keygen's allowed_signers format, as git's
        /// gpg.ssh.allowedSignersFile) signed them; the others are
        /// quarantined, never merged. The file is copied into the store.
        #[arg(long, value_name = "FILE")]
        signers: Option<std::path::PathBuf>,
        #[command(flatten)]
        at: Where,
    },
    /// List the remotes, with what the last sync with each did.
    List {
        #[command(flatten)]
        at: Where,
    },
    /// Remove a remote (what was pushed to it stays there).
    Remove {
        name: String,
        #[command(flatten)]
        at: Where,
    },
}

fn remotes_dir(t: &Target, make: bool) -> Result<Option<crate::store::Dir>, Failure> {
    if !t.layout.journal().is_dir() {
        return Err(Failure::new(
            Exit::BadStore,
            format!(
                "no skillfs store at '{}' (it has no journal/)",
                t.layout.dir.display()
            ),
        ));
    }
    crate::sync::remotes_dir(&t.layout, make)
}

pub fn remote(cmd: RemoteCmd) -> Result<(), Failure> {
    match cmd {
        RemoteCmd::Add {
            name,
            url,
            no_check,
            sign,
            signers,
            at,
        } => {
            let t = super::locate::locate(&at, None)?;
            check_name(&name)?;
            let signers = signers
                .map(|f| crate::sync::trust::read_signers(&f))
                .transpose()?;
            if url.is_empty() || url.starts_with('-') || url.chars().any(char::is_control) {
                return Err(Failure::new(
                    Exit::Usage,
                    format!("'{url}' is not a URL git takes (none starts with '-')"),
                ));
            }
            if !no_check {
                let out = crate::sync::git(None)
                    .args(["ls-remote", "--heads", &url])
                    .output()
                    .map_err(|e| {
                        Failure::new(
                            Exit::Internal,
                            format!("could not run git (needed to sync): {e}"),
                        )
                    })?;
                if !out.status.success() {
                    return Err(Failure::new(
                        Exit::RemoteFailed,
                        format!(
                            "git cannot reach '{url}': {} (--no-check adds it anyway)",
                            String::from_utf8_lossy(&out.stderr)
                                .trim()
                                .replace('\n', "; ")
                        ),
                    ));
                }
            }
            let dir = remotes_dir(&t, true)?.expect("made");
            let _lock = crate::sync::lock(&dir, &t.layout)?;
            let mut all = Remotes::load(Some(&dir))?;
            if let Some(r) = all.get(&name) {
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "remote '{name}' exists already ({}): remove it first",
                        r.url
                    ),
                ));
            }
            all.remotes.push(Remote {
                name: name.clone(),
                url: url.clone(),
                last_sync: None,
                pushed: None,
                replicas: Vec::new(),
                error: None,
                sign,
                signers: signers.is_some(),
            });
            match &signers {
                Some(text) => crate::sync::trust::save_signers(&dir, &name, text)?,
                None => crate::sync::trust::forget_signers(&dir, &name)?,
            }
            all.save(&dir)?;
            println!("added remote {name} ({url}); `skillfs sync {name}` pushes to it");
            Ok(())
        }
        RemoteCmd::List { at } => {
            let t = super::locate::locate(&at, None)?;
            let all = Remotes::load(remotes_dir(&t, false)?.as_ref())?;
            if all.remotes.is_empty() {
                println!("no remotes (skillfs remote add NAME URL)");
            }
            let now = crate::time::now_ns();
            for r in &all.remotes {
                let field = |t: &str| crate::error::one_line(t.to_string());
                println!(
                    "{}\t{}\t{}",
                    field(&r.name),
                    field(&r.url),
                    field(&describe(r, now))
                );
            }
            Ok(())
        }
        RemoteCmd::Remove { name, at } => {
            let t = super::locate::locate(&at, None)?;
            let Some(dir) = remotes_dir(&t, false)? else {
                return Err(Failure::new(
                    Exit::Usage,
                    format!("no remote named '{name}'"),
                ));
            };
            let _lock = crate::sync::lock(&dir, &t.layout)?;
            let mut all = Remotes::load(Some(&dir))?;
            let before = all.remotes.len();
            all.remotes.retain(|r| r.name != name);
            if all.remotes.len() == before {
                return Err(Failure::new(
                    Exit::Usage,
                    format!("no remote named '{name}'"),
                ));
            }
            all.save(&dir)?;
            crate::sync::trust::forget_signers(&dir, &name)?;
            println!("removed remote {name} (what was pushed to it stays there)");
            Ok(())
        }
    }
}

/// What the last sync with `r` did, in a few words.
pub fn describe(r: &Remote, now: i64) -> String {
    let trust = match (r.sign, r.signers) {
        (true, true) => " (signs what it pushes, merges only what its signers signed)",
        (true, false) => " (signs what it pushes)",
        (false, true) => " (merges only what its signers signed)",
        (false, false) => "",
    };
    let Some(t) = r.last_sync else {
        return format!("never synced{trust}");
    };
    let mut s = format!("synced {}", crate::time::ago(t, now));
    if let Some(e) = &r.error {
        s.push_str(&format!(", failed: {e}{trust}"));
        return s;
    }
    if let Some(p) = r.pushed {
        s.push_str(&format!(", holds this replica's changes to {p}"));
    }
    if !r.replicas.is_empty() {
        let commits: u64 = r.replicas.iter().map(|(_, n)| n).sum();
        s.push_str(&format!(
            ", {} other replica{} ({commits} commits kept)",
            r.replicas.len(),
            if r.replicas.len() == 1 { "" } else { "s" }
        ));
    }
    s.push_str(trust);
    s
}

pub fn sync(
    name: Option<&str>,
    (conflicts, merge): (bool, bool),
    at: &Where,
) -> Result<(), Failure> {
    let t = super::locate::locate(at, None)?;
    if conflicts {
        for line in crate::sync::conflicts(&t.layout)? {
            println!("{}", crate::error::one_line(line));
        }
        return Ok(());
    }
    if merge {
        t.live_mount_for("a merge writes through the mount so that it is versioned")?;
        return pull(&t);
    }
    remotes_dir(&t, false)?;
    let reports = crate::sync::sync(&t.layout, &t.root, name, &Default::default())?;
    let fetched = reports.iter().any(|r| r.error.is_none());
    let mut failed: Vec<Failure> = Vec::new();
    for r in reports {
        match r.error {
            Some((exit, m)) => failed.push(Failure::new(exit, m)),
            None => {
                println!("{}: {}", r.remote, r.summary());
                for line in &r.rewritten {
                    eprintln!("skillfs: {}", crate::error::one_line(line.clone()));
                }
            }
        }
    }
    // Each failure is one line, said before the merge's.
    let last = failed.pop();
    for f in &failed {
        eprintln!("skillfs: {f}");
    }
    // What was fetched (now or before) is merged where the merge can be
    // versioned: through a live mount.
    if fetched {
        match t.live_mount_for("a merge writes through the mount so that it is versioned") {
            Ok(_) => {
                if let Err(f) = pull(&t) {
                    if let Some(l) = &last {
                        eprintln!("skillfs: {l}");
                    }
                    return Err(f);
                }
            }
            Err(f) => eprintln!("skillfs: not merged: {f}"),
        }
    }
    // The last failure is the command's, with its exit code.
    match last {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// `sync --take PATH` / `sync --keep PATH`: resolves the conflict at PATH.
pub fn resolve(
    path: &std::path::Path,
    how: crate::sync::Resolve,
    replica: Option<&str>,
    at: &Where,
) -> Result<(), Failure> {
    let t = super::locate::locate(at, Some(path))?;
    let rel = t.rel(path)?;
    if how == crate::sync::Resolve::Take {
        t.live_mount_for("the other side is written through the mount so that it is versioned")?;
    }
    let said = crate::sync::resolve(&t.layout, &t.root, rel.as_bytes(), replica, how)?;
    println!("{}", crate::error::one_line(said));
    Ok(())
}

/// Merges what was fetched into the mounted tree, and says what it did.
fn pull(t: &Target) -> Result<(), Failure> {
    let mut failed = None;
    for p in crate::sync::pull(&t.layout, &t.root)? {
        if let Some(why) = &p.error {
            let f = Failure::new(
                Exit::Internal,
                format!("the merge of replica {} failed: {why}", p.replica),
            );
            eprintln!("skillfs: {}", crate::error::one_line(f.message.clone()));
            failed = Some(f);
            continue;
        }
        println!("{}", p.summary());
        for (unit, why) in &p.applied.busy {
            eprintln!(
                "skillfs: {}",
                crate::error::one_line(format!(
                    "'{}' is merged at the next sync: {why}",
                    String::from_utf8_lossy(unit)
                ))
            );
        }
        for s in &p.skipped {
            eprintln!(
                "skillfs: left out of the merge: {}",
                crate::error::one_line(s.clone())
            );
        }
    }
    // Each failure was said above; the command exits as they did.
    failed.map_or(Ok(()), |f| {
        Err(Failure::new(
            f.exit,
            "a merge failed (said above); the others were made",
        ))
    })
}
