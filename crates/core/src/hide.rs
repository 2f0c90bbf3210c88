//! `HideRules`: which names are hidden from the listings of visible
//! directories (contract G3), and which hidden entries are parks to sweep.
//!
//! A rule is a glob on one name plus scope flags. Its text form, used by
//! `--hide`, `--show` and the store's `config.json`:
//!
//! ```text
//! [/]GLOB[:FLAG,FLAG…]     FLAG: dir | file | root | outside-skills | keep
//! ```
//!
//! A leading `/` (or `root`) limits the rule to entries directly in the
//! root; `dir`/`file` to one kind; `outside-skills` to entries none of whose
//! ancestors is a skill package (a directory holding `SKILL.md`); `keep`
//! exempts the entries from the sweep of old parks. `*` and `?` are the only
//! wildcards. Only the *placement* of a new name (create, mkdir, symlink,
//! rename target) consults the rules: where an entry physically lives is the
//! truth afterwards, so a listing never evaluates a rule.
//!
//! Untracked rules (`--untracked`, `--tracked`, `"untracked"` and
//! `"tracked"` in `config.json`) take the same form; of the flags, `dir`,
//! `file` and `root` apply to them. An untracked entry is visible and
//! written like any other, but never versioned (see `DEFAULT_UNTRACKED`).
//!
//! Invariants: no rule may hide `SKILL.md`, a name the agent's snapshot
//! code needs listed (`MUST_STAY_VISIBLE`), or every name.
//!
//! Locks: none; the rules are built once at mount and read-only after.

use crate::config::Config;
use skillfs_base::relpath::RelPath;
use skillfs_store::journal::Kind;

/// Names the agent's own snapshot code lists and backs up from the root.
pub const MUST_STAY_VISIBLE: &[&str] = &[
    ".usage.json",
    ".curator_state",
    ".bundled_manifest",
    ".curator_suppressed",
    ".curator_ledger.jsonl",
    ".archive",
    ".hub",
    "_org",
    "DESCRIPTION.md",
];

/// Names that probe a pattern for hiding "everything".
const EVERYDAY_NAMES: &[&str] = &["SKILL.md", "references", "skill-one", "notes.txt", "a"];

/// Visible files that churn and keep their own history: written
/// copy-on-write like any file (never torn), but no version is kept.
///
/// The agent's per-device files: `.usage.json` (rewritten at every skill
/// load), `.curator_ledger.jsonl` (its own history), and the state of its
/// own Skill Sync, `.sync_state` and `.sync_device_id`, which must never
/// travel to another machine nor be revived by a restore (two devices
/// would share one id and one head). Then the scratch files of the common
/// editors, which
/// the editor must still see and use by name (so they are untracked, not
/// hidden), and which are never a version of anything. The names, as each
/// editor makes them beside the file it edits:
/// - vim (and neovim, when `'directory'` or `'backupdir'` is `.`):
///   the swap file `.NAME.swp` (then `.swo` … `.swa` while one exists) and
///   the `.NAME.swx` that tests the directory (memline.c, `makeswapname`,
///   `modname` with a dot prepended); the backup `NAME~` (`'backupext'`),
///   renamed from the original or copied (`'backupcopy'`) and, with the
///   defaults `nobackup` and `writebackup`, removed after the write;
///   the undo file `.NAME.un~`; the probe `4913` (bufwrite.c: `for (i =
///   4913; ; i += 123)` names a file in the edited file's directory,
///   created `O_CREAT|O_EXCL|O_NOFOLLOW`, fchown'd, stat'd and removed,
///   to learn whether the owner survives a new file; the next names only
///   if `4913` exists already);
/// - emacs: the lock `.#NAME` (a symlink, or a file where links fail),
///   the auto-save `#NAME#`, the backup `NAME~` (renamed from the
///   original at the first save unless `backup-by-copying`), numbered
///   backups `NAME.~N~`;
/// - nano: the lock file `.NAME.swp` (files.c, `do_lockfile`:
///   `locking_prefix` "." and `locking_suffix` ".swp") and the backup
///   `NAME~` of `--backup`;
/// - VS Code's atomic save: `NAME.vsctmp` written, then renamed over
///   `NAME` (diskFileSystemProvider.ts, `doWriteFileAtomic` with the
///   postfix `.vsctmp`);
/// - JetBrains' "safe write": `NAME___jb_tmp___` written, the original
///   renamed to `NAME___jb_old___`, the new one renamed into place.
///
/// Each is scoped as narrowly as the editor's use: files only (a
/// directory `foo~` or a skill named `4913` stays versioned), exact
/// shapes (`.NAME.sw?` needs the leading dot). None matches a name the
/// agent writes (`.bak`, `.rollback-*`, `.curator_*`, `.usage*`, `.tmp*`).
/// `--tracked PATTERN` (or `"tracked"` in `config.json`) removes one.
pub const DEFAULT_UNTRACKED: &[&str] = &[
    "/.usage.json",
    "/.curator_ledger.jsonl",
    "/.sync_state:file",
    "/.sync_device_id:file",
    ".*.sw?:file",
    "*~:file",
    "4913:file",
    ".#*",
    "#*#:file",
    "*.vsctmp:file",
    "*___jb_tmp___:file",
    "*___jb_old___:file",
];

/// What a rule is for: hiding is refused for names that must stay listed;
/// untracking is allowed for them (that is what it is for).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Hide,
    Untrack,
}

/// The defaults for Hermes Agent (docs/design.md, "Hide rules").
pub const DEFAULT_RULES: &[&str] = &[
    "*.bak:dir,outside-skills",
    "*.rollback-broken:dir,outside-skills",
    ".rollback-staging-*:dir",
    "/.curator_backups:keep",
    ".skill-rollback-asides",
    "/.locks:keep",
    "/.usage.json.lock:keep",
    ".*.tmp.*:file",
    ".*.tmp:file",
    ".history",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub glob: String,
    pub kind: Option<Kind>,
    pub root_only: bool,
    pub outside_skills: bool,
    /// Not a park: never swept (backups and lock files the agent keeps).
    pub keep: bool,
    /// The text it was parsed from, for display and `--show`.
    pub text: String,
}

impl Rule {
    pub fn parse(text: &str) -> Result<Rule, String> {
        Rule::parse_for(text, Purpose::Hide)
    }

    pub fn parse_for(text: &str, purpose: Purpose) -> Result<Rule, String> {
        check_text("hide rule", text)?;
        let (pat, flags) = match text.split_once(':') {
            Some((p, f)) => (p, f),
            None => (text, ""),
        };
        let (root_only, glob) = match pat.strip_prefix('/') {
            Some(g) => (true, g),
            None => (false, pat),
        };
        let mut rule = Rule {
            glob: glob.to_string(),
            kind: None,
            root_only,
            outside_skills: false,
            keep: false,
            text: text.to_string(),
        };
        if glob.is_empty() {
            return Err(format!(
                "hide rule '{text}' has an empty pattern (it would hide the root)"
            ));
        }
        if glob.contains('/') {
            return Err(format!(
                "hide rule '{text}' must match one name, not a path"
            ));
        }
        for f in flags.split(',').map(str::trim).filter(|f| !f.is_empty()) {
            match f {
                "dir" => rule.kind = Some(Kind::Dir),
                "file" => rule.kind = Some(Kind::File),
                "root" => rule.root_only = true,
                "outside-skills" => rule.outside_skills = true,
                "keep" => rule.keep = true,
                other => {
                    return Err(format!(
                        "hide rule '{text}': unknown flag '{other}' (known: dir, file, root, outside-skills, keep)"
                    ));
                }
            }
        }
        if glob == "." || glob == ".." {
            return Err(format!("hide rule '{text}' would hide the root"));
        }
        if EVERYDAY_NAMES
            .iter()
            .all(|m| glob_match(glob.as_bytes(), m.as_bytes()))
        {
            return Err(format!("hide rule '{text}' would hide everything"));
        }
        if glob_match(glob.as_bytes(), b"SKILL.md") {
            return Err(format!("hide rule '{text}' would hide SKILL.md"));
        }
        for n in MUST_STAY_VISIBLE
            .iter()
            .filter(|_| purpose == Purpose::Hide)
        {
            if glob_match(glob.as_bytes(), n.as_bytes()) {
                return Err(format!(
                    "hide rule '{text}' would hide '{n}', which the agent's snapshots must list"
                ));
            }
        }
        Ok(rule)
    }

    fn matches(&self, name: &[u8], kind: Kind, in_root: bool) -> bool {
        if self.root_only && !in_root {
            return false;
        }
        if self.kind.is_some_and(|k| k != kind) {
            return false;
        }
        glob_match(self.glob.as_bytes(), name)
    }
}

/// Longest rule (or `--show`/`--tracked` text) accepted.
pub const RULE_MAX_BYTES: usize = 4096;
/// Refuses a control character (a newline would forge lines in `RULES`
/// and the log) and an outsized text.
fn check_text(what: &str, text: &str) -> Result<(), String> {
    if text.len() > RULE_MAX_BYTES {
        return Err(format!(
            "{what} of {} bytes is longer than {RULE_MAX_BYTES}",
            text.len()
        ));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{what} {:?} holds the control character {:?}",
            text, c
        ));
    }
    Ok(())
}

/// The rule changes given on the command line.
#[derive(Default, Clone, Debug)]
pub struct RuleArgs {
    pub hide: Vec<String>,
    pub show: Vec<String>,
    pub untracked: Vec<String>,
    pub tracked: Vec<String>,
    pub park_max_age: Option<String>,
    /// Accept a park age below [`PARK_MAX_AGE_FLOOR`] (tests only: it
    /// sweeps atomic writers' temp files before their rename).
    pub allow_short_park_max_age: bool,
}

/// Why the rules (or the park age) given cannot be used: one line naming
/// the rule and the reason. The command line answers it with exit 7.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesError(pub String);

impl std::fmt::Display for RulesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RulesError {}

#[derive(Clone, Debug)]
pub struct HideRules {
    pub rules: Vec<Rule>,
    pub untracked: Vec<Rule>,
    /// Parks untouched this long are swept.
    pub park_max_age_ns: i64,
}

pub const DEFAULT_PARK_MAX_AGE: &str = "7d";
/// The shortest park age accepted: a shorter one would sweep the temp file
/// of an atomic writer (or a lock file) still in use.
pub const PARK_MAX_AGE_FLOOR: &str = "1h";

impl HideRules {
    /// The defaults, then the config file, then the command line.
    pub fn build(config: &Config, args: &RuleArgs) -> Result<HideRules, RulesError> {
        let bad = RulesError;
        let rules = layer(
            DEFAULT_RULES,
            Purpose::Hide,
            config.hide.iter().chain(args.hide.iter()),
            config.show.iter().chain(args.show.iter()),
            "--show",
        )
        .map_err(bad)?;
        let untracked = layer(
            DEFAULT_UNTRACKED,
            Purpose::Untrack,
            config.untracked.iter().chain(args.untracked.iter()),
            config.tracked.iter().chain(args.tracked.iter()),
            "--tracked",
        )
        .map_err(bad)?;
        let age_text = args
            .park_max_age
            .clone()
            .or_else(|| config.park_max_age.clone())
            .unwrap_or_else(|| DEFAULT_PARK_MAX_AGE.to_string());
        check_text("park max age", &age_text).map_err(bad)?;
        let park_max_age_ns = skillfs_base::time::parse_age(&age_text).ok_or_else(|| {
            bad(format!(
                "park max age '{age_text}' is not a duration like 30m, 12h or 7d"
            ))
        })?;
        let floor = skillfs_base::time::parse_age(PARK_MAX_AGE_FLOOR).expect("the floor parses");
        if park_max_age_ns < floor && !args.allow_short_park_max_age {
            return Err(bad(format!(
                "park max age '{age_text}' is below {PARK_MAX_AGE_FLOOR}: it would sweep an \
                 atomic writer's temp file before its rename"
            )));
        }
        Ok(HideRules {
            rules,
            untracked,
            park_max_age_ns,
        })
    }

    pub fn defaults() -> HideRules {
        HideRules::build(&Config::default(), &RuleArgs::default()).expect("defaults are valid")
    }

    /// Whether the visible `path`, an entry of `kind`, is untracked (no
    /// versions kept).
    pub fn is_untracked(&self, path: &RelPath, kind: Kind) -> bool {
        let in_root = path.parent().is_some_and(|p| p.is_root());
        let name = path.file_name();
        self.untracked
            .iter()
            .any(|r| r.matches(name, kind, in_root))
    }

    /// The first rule hiding `name` (of `kind`) in a visible directory.
    /// `in_root`: the directory is the root. `inside_skill`: the directory
    /// or one of its ancestors holds a `SKILL.md` (asked only when needed).
    pub fn hiding_rule(
        &self,
        name: &[u8],
        kind: Kind,
        in_root: bool,
        inside_skill: &mut dyn FnMut() -> bool,
    ) -> Option<&Rule> {
        let mut inside: Option<bool> = None;
        self.rules.iter().find(|r| {
            if !r.matches(name, kind, in_root) {
                return false;
            }
            if r.outside_skills {
                let i = *inside.get_or_insert_with(&mut *inside_skill);
                return !i;
            }
            true
        })
    }

    pub fn is_hidden(
        &self,
        name: &[u8],
        kind: Kind,
        in_root: bool,
        inside_skill: &mut dyn FnMut() -> bool,
    ) -> bool {
        self.hiding_rule(name, kind, in_root, inside_skill)
            .is_some()
    }

    /// Whether an entry that is hidden may be swept when old: only when the
    /// rule that hides it is not `keep`.
    pub fn sweepable(&self, name: &[u8], kind: Kind, in_root: bool) -> bool {
        match self.hiding_rule(name, kind, in_root, &mut || false) {
            Some(r) => !r.keep,
            None => true, // hidden by a rule no longer in force: a stray park
        }
    }

    pub fn describe(&self) -> Vec<String> {
        self.rules.iter().map(|r| r.text.clone()).collect()
    }

    pub fn describe_untracked(&self) -> Vec<String> {
        self.untracked.iter().map(|r| r.text.clone()).collect()
    }
}

/// Defaults, minus the `remove`d ones (by text or pattern), plus `add`.
fn layer<'a>(
    defaults: &[&str],
    purpose: Purpose,
    add: impl Iterator<Item = &'a String>,
    remove: impl Iterator<Item = &'a String>,
    flag: &str,
) -> Result<Vec<Rule>, String> {
    let mut rules: Vec<Rule> = defaults
        .iter()
        .map(|t| Rule::parse_for(t, purpose).expect("default rules parse"))
        .collect();
    for s in remove {
        check_text(flag, s)?;
        let before = rules.len();
        rules.retain(|r| r.text != *s && r.glob != s.trim_start_matches('/'));
        if rules.len() == before {
            return Err(format!("{flag} '{s}' matches no rule in force"));
        }
    }
    for t in add {
        rules.push(Rule::parse_for(t, purpose)?);
    }
    Ok(rules)
}

/// `*` matches any run of bytes, `?` one byte; everything else itself.
pub fn glob_match(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while n < name.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some(p);
            mark = n;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            n = mark;
        } else {
            return false;
        }
    }
    while p < pat.len() && pat[p] == b'*' {
        p += 1;
    }
    p == pat.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hidden(r: &HideRules, name: &str, kind: Kind, in_root: bool, inside: bool) -> bool {
        r.is_hidden(name.as_bytes(), kind, in_root, &mut || inside)
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"*.bak", b"foo.bak"));
        assert!(!glob_match(b"*.bak", b"foo.bak2"));
        assert!(glob_match(b".*.tmp.*", b".SKILL.md.tmp.a1b2c3d4"));
        assert!(glob_match(b".*.tmp", b".usage_abcd1234.tmp"));
        assert!(!glob_match(b".*.tmp", b"x.tmp"));
        assert!(glob_match(b"a?c", b"abc"));
        assert!(glob_match(b"*", b""));
    }

    #[test]
    fn default_rules_with_their_scopes() {
        let r = HideRules::defaults();
        use Kind::*;
        assert!(hidden(&r, "foo.bak", Dir, false, false));
        assert!(
            !hidden(&r, "foo.bak", Dir, false, true),
            "inside a skill package it is user data"
        );
        assert!(
            !hidden(&r, "foo.bak", File, false, false),
            "only directories"
        );
        assert!(hidden(&r, "python3.bak", Dir, true, false));
        assert!(hidden(&r, "probe.rollback-broken", Dir, false, false));
        assert!(hidden(&r, ".rollback-staging-20261130", Dir, false, true));
        assert!(hidden(&r, ".curator_backups", Dir, true, false));
        assert!(
            !hidden(&r, ".curator_backups", Dir, false, false),
            "root only"
        );
        assert!(hidden(&r, ".skill-rollback-asides", Dir, false, false));
        assert!(hidden(&r, ".locks", Dir, true, false));
        assert!(hidden(&r, ".usage.json.lock", File, true, false));
        assert!(!hidden(&r, "yarn.lock", File, true, false));
        assert!(hidden(&r, ".SKILL.md.tmp.a1b2c3d4", File, false, true));
        assert!(hidden(&r, ".usage_a1b2c3d4.tmp", File, true, false));
        assert!(hidden(
            &r,
            ".bundled_manifest_a1b2c3d4.tmp",
            File,
            true,
            false
        ));
        assert!(hidden(&r, ".history", Dir, false, true));
        for n in MUST_STAY_VISIBLE {
            for k in [File, Dir] {
                assert!(!hidden(&r, n, k, true, false), "{n} must stay visible");
            }
        }
        assert!(!hidden(&r, "SKILL.md", File, false, true));
    }

    /// The editors' scratch names are untracked, each only in the shape
    /// and kind its editor makes; the agent's names and skills are not.
    #[test]
    fn editor_scratch_files_are_untracked_and_nothing_else() {
        let r = HideRules::defaults();
        let untracked =
            |p: &str, kind| r.is_untracked(&RelPath::parse(p.as_bytes()).unwrap(), kind);
        use Kind::*;
        for p in [
            "cat/demo/.SKILL.md.swp",
            "cat/demo/.SKILL.md.swo",
            "cat/demo/.SKILL.md.swx",
            "cat/demo/SKILL.md~",
            "cat/demo/.SKILL.md.un~",
            "cat/demo/SKILL.md.~3~",
            "cat/demo/4913",
            "cat/demo/#SKILL.md#",
            "cat/demo/SKILL.md.vsctmp",
            "cat/demo/SKILL.md___jb_tmp___",
            "cat/demo/SKILL.md___jb_old___",
            "DESCRIPTION.md~",
        ] {
            assert!(untracked(p, File), "{p}");
            assert!(!untracked(p, Dir), "{p}: only files");
        }
        // emacs's lock is a symlink (a file where links fail).
        for k in [Symlink, File] {
            assert!(untracked("cat/demo/.#SKILL.md", k));
        }
        for (p, kind) in [
            ("cat/4913", Dir), // a skill named 4913
            ("cat/4913/SKILL.md", File),
            ("cat/demo/49130", File),
            ("cat/demo/notes~", Dir),
            ("cat/demo/SKILL.md", File),
            ("cat/demo/.swp", File),
            ("cat/demo/x.swp", File),
            ("cat/demo/#notes", File),
            ("cat/demo/.SKILL.md.tmp.a1b2c3d4", File),
            (".bundled_manifest", File),
            (".curator_state", File),
            (".curator_suppressed", File),
            ("cat/foo.bak", Dir),
            ("cat/foo.rollback-broken", Dir),
            ("cat/demo/.tmp-a1b2c3d4-0123abcd", File),
        ] {
            assert!(!untracked(p, kind), "{p} must stay versioned");
        }
        // A user takes a default back by its pattern.
        let args = RuleArgs {
            tracked: vec!["*~".into(), "4913".into()],
            ..RuleArgs::default()
        };
        let r = HideRules::build(&Config::default(), &args).unwrap();
        let p = |s: &str| RelPath::parse(s.as_bytes()).unwrap();
        assert!(!r.is_untracked(&p("cat/demo/SKILL.md~"), File));
        assert!(!r.is_untracked(&p("cat/demo/4913"), File));
        assert!(r.is_untracked(&p("cat/demo/.SKILL.md.swp"), File));
    }

    #[test]
    fn bad_rules_are_refused() {
        for (t, why) in [
            ("*", "everything"),
            ("SKILL.*", "SKILL.md"),
            ("/", "root"),
            (".*", ".usage.json"),
            ("*.md", "SKILL.md"),
            ("a/b", "one name"),
            ("x:bogus", "unknown flag"),
            ("zz\ncurl x|sh\n#", "control character"),
            ("a\tb", "control character"),
            ("a\u{85}b", "control character"),
        ] {
            let e = Rule::parse(t).unwrap_err();
            assert!(e.contains(why), "{t}: {e}");
        }
    }

    #[test]
    fn config_and_command_line_change_the_rules() {
        let cfg: Config = serde_json::from_str(
            r#"{"hide": ["*.orig:file"], "show": ["*.bak"], "park_max_age": "2h"}"#,
        )
        .unwrap();
        let args = RuleArgs {
            hide: vec!["/.cache:dir,keep".into()],
            ..RuleArgs::default()
        };
        let r = HideRules::build(&cfg, &args).unwrap();
        assert!(!hidden(&r, "foo.bak", Kind::Dir, false, false));
        assert!(hidden(&r, "x.orig", Kind::File, false, true));
        assert!(hidden(&r, ".cache", Kind::Dir, true, false));
        assert_eq!(r.park_max_age_ns, 2 * 3600 * 1_000_000_000);
        let show_nothing = RuleArgs {
            show: vec!["nothing-like-this".into()],
            ..RuleArgs::default()
        };
        assert!(HideRules::build(&Config::default(), &show_nothing).is_err());
        let long = "y".repeat(RULE_MAX_BYTES + 1);
        assert!(Rule::parse(&long).unwrap_err().contains("longer than"));
        let show_ctl = RuleArgs {
            show: vec!["*.bak\n".into()],
            ..RuleArgs::default()
        };
        assert!(HideRules::build(&Config::default(), &show_ctl).is_err());
        for (age, ok) in [("0s", false), ("59m", false), ("1h", true), ("7d", true)] {
            let args = RuleArgs {
                park_max_age: Some(age.into()),
                ..RuleArgs::default()
            };
            assert_eq!(
                HideRules::build(&Config::default(), &args).is_ok(),
                ok,
                "{age}"
            );
            let allowed = RuleArgs {
                allow_short_park_max_age: true,
                ..args
            };
            assert!(
                HideRules::build(&Config::default(), &allowed).is_ok(),
                "{age}"
            );
        }
        let d = HideRules::defaults();
        let untracked =
            |p: &str| d.is_untracked(&RelPath::parse(p.as_bytes()).unwrap(), Kind::File);
        assert!(untracked(".usage.json"));
        assert!(!untracked("cat/.usage.json"));
        assert!(!untracked("cat/foo/SKILL.md"));
        assert!(serde_json::from_str::<Config>(r#"{"hyde": []}"#).is_err());
    }
}
