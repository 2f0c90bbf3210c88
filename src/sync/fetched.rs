//! Another replica's versions as this store keeps them (`kept`), for
//! `skillfs log --replica`: one line per version of its history, oldest
//! first, whether or not any of it was merged here, and the versions a
//! signed remote quarantined (kept aside, never merged), and those of
//! histories its branch no longer has (rewound or rewritten by someone
//! after this store fetched them). Read from the
//! store's `sync/repo.git`, mounted or not; each line names the commit
//! whose files `git --git-dir STORE/sync/repo.git show COMMIT:PATH`
//! prints.
//!
//! A replica's own versions are the first-parent line of its branch (the
//! other replicas' commits it merged are parents beside it, and are
//! theirs); a commit without a `skillfs-id` trailer (a seal of `--sign`)
//! is no version and is left out.
//!
//! Locks: none; git reads its repository without them (a sync running
//! meanwhile can only add to it).

use std::path::{Path, PathBuf};

use super::fields::{Field, git_fields};
use super::git::git_output;
use super::kept::{kept_ref, resolve};
use super::origins::AUTHOR_MAX;
use super::remotes::sync_dir;
use super::{git, replica};
use crate::error::{Exit, Failure};
use crate::relpath::RelPath;
use crate::store::Layout;

/// One version of another replica.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Fetched {
    pub replica: String,
    /// Its change id on that replica (`skillfs-id`).
    pub id: u64,
    /// When it was made there (`skillfs-time`), ns since the epoch.
    pub time: i64,
    pub commit: String,
    /// The commit's author: the process that made the change there.
    pub author: String,
    /// What the change was (the commit's subject).
    pub subject: String,
    /// Kept aside by a signed remote's check, never merged here.
    pub quarantined: bool,
    /// On a history of the replica its branch no longer has (rewound or
    /// rewritten by someone, `refs/skillfs/rewound/`).
    pub rewound: bool,
}

/// The replica ids this store keeps a history of (fetched and kept, or
/// only quarantined).
fn kept_ids(repo: &Path) -> Result<Vec<String>, Failure> {
    let mut c = git(Some(repo));
    c.args([
        "for-each-ref",
        "--format=%(refname)",
        "refs/skillfs/kept/",
        "refs/skillfs/quarantine/",
    ]);
    let out = git_output(
        c,
        &format!("read the replicas kept in '{}'", repo.display()),
    )?;
    Ok(replica_ids(&out))
}

/// The replica ids named by the refs `refs` lists (`for-each-ref` lines
/// that start with the ref's name) under `refs/skillfs/kept/` or
/// `refs/skillfs/quarantine/`, sorted, each once.
pub(super) fn replica_ids(refs: &[u8]) -> Vec<String> {
    let mut ids: Vec<String> = String::from_utf8_lossy(refs)
        .lines()
        .filter_map(|l| l.split(' ').next())
        .filter_map(|r| {
            r.strip_prefix("refs/skillfs/kept/")
                .or_else(|| r.strip_prefix("refs/skillfs/quarantine/"))
        })
        .filter(|id| replica::valid(id))
        .map(str::to_string)
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The replica that `prefix` names (its id, or the start of one) among
/// those this store keeps, and the store's sync repository.
pub(super) fn pick(layout: &Layout, prefix: &str) -> Result<(PathBuf, String), Failure> {
    let none = |known: &[String]| {
        Failure::new(
            Exit::NotFound,
            format!(
                "this store keeps no replica '{prefix}' ({}): `skillfs sync` fetches them",
                if known.is_empty() {
                    "it keeps none yet".to_string()
                } else {
                    format!("it keeps {}", known.join(", "))
                }
            ),
        )
    };
    if prefix.is_empty() {
        return Err(Failure::new(
            Exit::Usage,
            "a replica is named by its id, or the start of one",
        ));
    }
    let Some(dir) = sync_dir(layout, false)? else {
        return Err(none(&[]));
    };
    let repo = dir.join("repo.git");
    if !repo.exists() {
        return Err(none(&[]));
    }
    let known = kept_ids(&repo)?;
    let matching: Vec<&String> = known
        .iter()
        .filter(|id| id.starts_with(&prefix.to_ascii_lowercase()))
        .collect();
    match matching.as_slice() {
        [] => Err(none(&known)),
        [one] => Ok((repo, one.to_string())),
        many => Err(Failure::new(
            Exit::Usage,
            format!(
                "'{prefix}' names {} replicas ({}): give more of the id",
                many.len(),
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// The versions of the replica that `prefix` names (its id, or the start
/// of one), at or below `path` if given, oldest first (by the time each
/// says; quarantined ones among them, marked).
pub fn fetched(
    layout: &Layout,
    prefix: &str,
    path: Option<&RelPath>,
) -> Result<Vec<Fetched>, Failure> {
    read(layout, prefix, path, Detail::Full, usize::MAX)
}

/// [`fetched`], as much of each version as `detail` says, at most `max`
/// versions in all (`Err` past that).
pub(super) fn read(
    layout: &Layout,
    prefix: &str,
    path: Option<&RelPath>,
    detail: Detail,
    max: usize,
) -> Result<Vec<Fetched>, Failure> {
    let (repo, replica) = pick(layout, prefix)?;
    let kept = resolve(&repo, &kept_ref(&replica));
    let quarantine = resolve(&repo, &format!("refs/skillfs/quarantine/{replica}"));
    let mut out = Vec::new();
    // Each history once: what an earlier ref listed is left out of the
    // next (a rewound tip shares the versions before the rewrite).
    let mut seen: Vec<String> = Vec::new();
    if let Some(k) = &kept {
        out.extend(versions(
            &repo,
            &replica,
            k,
            &seen,
            path,
            detail,
            max - out.len(),
        )?);
        seen.push(k.clone());
    }
    for r in rewound(&repo, &replica)? {
        for mut v in versions(&repo, &replica, &r, &seen, path, detail, max - out.len())? {
            v.rewound = true;
            out.push(v);
        }
        seen.push(r);
    }
    if let Some(q) = &quarantine {
        for mut v in versions(&repo, &replica, q, &seen, path, detail, max - out.len())? {
            v.quarantined = true;
            out.push(v);
        }
    }
    // In the order they were made there (as the replica said), so that
    // `-n` keeps the newest whichever ref holds them.
    out.sort_by_key(|v| (v.time, v.id));
    Ok(out)
}

/// For each replica this store keeps, how many of its versions (at or
/// below `path`, if given) are fetched and not merged here yet: those on
/// its kept branch past the last of its commits merged (all of them when
/// none was). Replicas with none are left out; a repository that cannot
/// be read, or a count git cannot give, says nothing (this only adds a
/// hint to `log`).
pub fn unmerged(layout: &Layout, path: Option<&RelPath>) -> Vec<(String, u64)> {
    let Ok(Some(dir)) = sync_dir(layout, false) else {
        return Vec::new();
    };
    let repo = dir.join("repo.git");
    if !repo.is_dir() {
        return Vec::new();
    }
    let bases = super::pull::load_bases(&dir).unwrap_or_default();
    let mut out = Vec::new();
    for replica in kept_ids(&repo).unwrap_or_default() {
        let Some(tip) = resolve(&repo, &kept_ref(&replica)) else {
            continue;
        };
        let mut c = git(Some(&repo));
        c.args(["-c", "log.showSignature=false"])
            .args(["rev-list", "--count", "--first-parent"])
            // A version is a commit with an id (a seal of `--sign` is not).
            .arg("--grep=^skillfs-id: ")
            .arg(&tip);
        if let Some(b) = bases.get(&replica) {
            c.arg(format!("^{}", b.commit));
        }
        c.arg("--");
        if let Some(p) = path.filter(|p| !p.is_root()) {
            use std::os::unix::ffi::OsStrExt;
            c.arg(std::ffi::OsStr::from_bytes(
                &[b":(literal)", p.as_bytes()].concat(),
            ));
        }
        let n = git_output(c, "count a replica's versions")
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o).trim().parse::<u64>().ok());
        if let Some(n) = n.filter(|n| *n > 0) {
            out.push((replica, n));
        }
    }
    out
}

/// The tips of `replica`'s histories its branch no longer has
/// (`kept::keep`), in the order they were put aside.
fn rewound(repo: &Path, replica: &str) -> Result<Vec<String>, Failure> {
    let prefix = format!("refs/skillfs/rewound/{replica}/");
    let mut c = git(Some(repo));
    c.args(["for-each-ref", "--format=%(refname) %(objectname)", &prefix]);
    let out = git_output(
        c,
        &format!(
            "read replica {replica}'s rewound histories in '{}'",
            repo.display()
        ),
    )?;
    let mut tips: Vec<(u64, String)> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| {
            let (name, id) = l.split_once(' ')?;
            let n = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((n, id.to_string()))
        })
        .collect();
    tips.sort();
    Ok(tips.into_iter().map(|(_, id)| id).collect())
}

/// The most characters of a version's subject kept (skillfs's own name
/// the change and a path or two; another replica's may be anything).
pub const SUBJECT_MAX: usize = 256;

/// How much of a version is read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Detail {
    /// Everything `log --replica` prints.
    Full,
    /// Its id, time and commit only (the daemon's `.history`): no words
    /// of the replica's are held, nor its id (the caller knows it).
    Brief,
}

/// The versions on the first-parent line of `tip` that none of `seen`
/// reaches, oldest first; `Err` past `max` of them.
fn versions(
    repo: &Path,
    replica: &str,
    tip: &str,
    seen: &[String],
    path: Option<&RelPath>,
    detail: Detail,
    max: usize,
) -> Result<Vec<Fetched>, Failure> {
    // Fields of a commit, each ended by a NUL (`-z` ends the last): no
    // field can hold one, so a hostile replica's subject or author cannot
    // shift the fields of this commit or make another; and each is read
    // cut to its cap (`fields`), so neither costs more than that here.
    let ids = "%H%x00%(trailers:key=skillfs-id,valueonly,separator=%x2c)%x00\
               %(trailers:key=skillfs-time,valueonly,separator=%x2c)";
    let format = match detail {
        Detail::Full => format!("{ids}%x00%an%x00%s"),
        Detail::Brief => ids.to_string(),
    };
    let mut c = git(Some(repo));
    // Nothing of the user's config may add to the output (a signature
    // printed before a signed commit would shift the fields) or change
    // what is listed.
    c.args(["-c", "log.showSignature=false", "-c", "log.follow=false"])
        .args(["-c", "i18n.logOutputEncoding=UTF-8"])
        .args(["log", "-z", "--first-parent", "--reverse"])
        .arg(format!("--format={format}"));
    // What `tip` holds that none of `seen` does (all of it for another
    // history, nothing for an older tip).
    c.arg(tip).args(seen.iter().map(|s| format!("^{s}")));
    c.arg("--");
    if let Some(p) = path.filter(|p| !p.is_root()) {
        use std::os::unix::ffi::OsStrExt;
        // A pathspec taken as it is, with no glob or magic of git's.
        c.arg(std::ffi::OsStr::from_bytes(
            &[b":(literal)", p.as_bytes()].concat(),
        ));
    }
    let doing = format!("read replica {replica}'s history in '{}'", repo.display());
    git_fields(c, &doing, |fields| {
        let mut out = Vec::new();
        let broken = |e: std::io::Error| Failure::new(Exit::Internal, format!("{doing}: {e}"));
        // (Longer than any object id or number: a field cut short is no
        // commit, id or time.)
        const SHORT: usize = 80;
        while let Some(commit) = fields.next(SHORT).map_err(broken)? {
            let mut next = |cap| fields.next(cap).map_err(broken);
            let (Some(id), Some(time)) = (next(SHORT)?, next(SHORT)?) else {
                break;
            };
            let (author, subject) = match detail {
                Detail::Full => {
                    // A character is at most 4 bytes.
                    let (Some(a), Some(s)) = (next(AUTHOR_MAX * 4)?, next(SUBJECT_MAX * 4)?) else {
                        break;
                    };
                    (a.text(AUTHOR_MAX), s.text(SUBJECT_MAX))
                }
                Detail::Brief => (String::new(), String::new()),
            };
            let named = if detail == Detail::Brief { "" } else { replica };
            if let Some(mut v) = version(named, &commit, &id, &time) {
                v.author = author;
                v.subject = subject;
                if out.len() == max {
                    return Err(Failure::new(
                        Exit::Internal,
                        format!(
                            "replica {replica} has more than {max} versions: too many to \
                             show in .history (`skillfs log --replica {replica}` lists them)"
                        ),
                    ));
                }
                out.push(v);
            }
        }
        Ok(out)
    })
}

/// A version from its commit, id and time fields: none if the commit was
/// cut short or is no object id, or the first value of the id is no
/// number (a trailer given many times is cut after its first values: a
/// field cut short counts if a comma ends its first value).
fn version(replica: &str, commit: &Field, id: &Field, time: &Field) -> Option<Fetched> {
    let first_whole = |f: &Field| f.whole || f.bytes.contains(&b',');
    if !(commit.whole && first_whole(id) && first_whole(time)) {
        return None;
    }
    let commit = std::str::from_utf8(&commit.bytes).ok()?;
    let hex = matches!(commit.len(), 40 | 64)
        && commit
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    if !hex {
        return None;
    }
    // (A trailer given twice: the first.)
    let first = |v: &Field| {
        String::from_utf8_lossy(&v.bytes)
            .split(',')
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    };
    Some(Fetched {
        replica: replica.to_string(),
        id: first(id).parse().ok()?,
        time: first(time).parse().unwrap_or(0),
        commit: commit.to_string(),
        author: String::new(),
        subject: String::new(),
        quarantined: false,
        rewound: false,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A store whose sync repository keeps `commits` versions of one
    /// replica, each made by `author` with `subject`; their commits,
    /// oldest first.
    pub(in crate::sync) fn store_with(
        dir: &Path,
        replica: &str,
        commits: &[(&str, &str, &str)],
    ) -> (Layout, Vec<String>) {
        let repo = dir.join("sync").join("repo.git");
        std::fs::create_dir_all(&repo).unwrap();
        let run = |args: &[&str], env: &[(&str, &str)]| {
            let out = git(Some(&repo))
                .args(args)
                .envs(env.iter().copied())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "git {args:?}: {}",
                super::super::git::said(&out)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        run(&["init", "-q", "--bare"], &[]);
        let tree = run(&["mktree"], &[]);
        let mut made: Vec<String> = Vec::new();
        for (i, (author, subject, id)) in commits.iter().enumerate() {
            let message = dir.join("message");
            std::fs::write(
                &message,
                format!(
                    "{subject}\n\nskillfs-id: {id}\nskillfs-time: {}\n",
                    1000 + i
                ),
            )
            .unwrap();
            let mut args = vec!["commit-tree", &tree, "-F", message.to_str().unwrap()];
            if let Some(parent) = made.last() {
                args.extend(["-p", parent.as_str()]);
            }
            let env = [
                ("GIT_AUTHOR_NAME", *author),
                ("GIT_AUTHOR_EMAIL", "a@b"),
                ("GIT_COMMITTER_NAME", "c"),
                ("GIT_COMMITTER_EMAIL", "c@d"),
            ];
            let c = run(&args, &env);
            made.push(c);
        }
        run(
            &[
                "update-ref",
                &kept_ref(replica),
                made.last().unwrap().as_str(),
            ],
            &[],
        );
        (Layout::new(dir.to_path_buf()), made)
    }

    /// Another replica's words are held cut to their caps (a subject and
    /// an author of 1 MiB and 100 KB), the daemon's brief read holds none
    /// of them, an id too long to be one makes no version, and a replica
    /// past the most versions asked is refused, not held.
    #[test]
    fn a_replicas_words_are_cut_and_its_versions_bounded() {
        let dir = std::env::temp_dir().join(format!("skillfs-fetched-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let replica = "0123456789abcdef0123456789abcdef";
        // (An environment string is at most 128 KiB.)
        let long_author = "a".repeat(100_000);
        let long_subject = "s".repeat(1 << 20);
        let long_id = "9".repeat(100);
        // An id given 50 times: its field is cut, its first value whole.
        let repeated = ["5"; 50].join("\nskillfs-id: ");
        let (layout, made) = store_with(
            &dir,
            replica,
            &[
                ("writer", "write a/SKILL.md", "1"),
                (&long_author, &long_subject, "2"),
                ("other", "an id no number holds", &long_id),
                ("ünïcødé", "ok", "4"),
                ("again", "said many times", &repeated),
            ],
        );
        let all = fetched(&layout, "0123", None).unwrap();
        let got: Vec<(u64, usize, usize)> = all
            .iter()
            .map(|v| (v.id, v.author.chars().count(), v.subject.chars().count()))
            .collect();
        assert_eq!(
            got,
            [
                (1, 6, 16),
                (2, AUTHOR_MAX, SUBJECT_MAX),
                (4, 7, 2),
                (5, 5, 15)
            ],
            "{all:?}"
        );
        assert_eq!(all[0].commit, made[0]);
        assert_eq!(
            (all[0].author.as_str(), all[2].author.as_str()),
            ("writer", "ünïcødé")
        );
        assert_eq!(all[1].time, 1001);
        let brief = read(&layout, replica, None, Detail::Brief, 4).unwrap();
        assert_eq!(
            brief
                .iter()
                .map(|v| (v.id, v.commit.as_str()))
                .collect::<Vec<_>>(),
            [
                (1, made[0].as_str()),
                (2, made[1].as_str()),
                (4, made[3].as_str()),
                (5, made[4].as_str())
            ]
        );
        assert!(
            brief
                .iter()
                .all(|v| v.author.is_empty() && v.subject.is_empty() && v.replica.is_empty())
        );
        let e = read(&layout, replica, None, Detail::Brief, 3).unwrap_err();
        assert!(e.to_string().contains("more than 3 versions"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
