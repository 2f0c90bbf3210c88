//! The command line as a user meets it, through the real binary on real
//! mounts: commands that find their mount from the current directory or a
//! PATH (git-style), `log`'s filters, grouping, paging and colour, `undo`,
//! `status`, the help, completions and man page, and the errors of each.

use crate::common;

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// `skillfs ARGS` run in `dir`, with no HERMES_HOME and a HOME that holds
/// nothing: whatever it finds, it found from the directory or the PATH.
fn skillfs_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("HERMES_HOME")
        .env("HOME", "/nonexistent-home")
        .output()
        .expect("run skillfs")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", describe(out));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The paths of `log --json` lines.
fn json_paths(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["path"].as_str().unwrap().to_string()
        })
        .collect()
}

/// The id of the mount's first scan's last record: the tree as it was
/// mounted.
fn mounted_state(m: &Mount) -> String {
    m.log()
        .iter()
        .filter(|r| r["op"] == "scan")
        .map(|r| r["seq"].as_u64().unwrap())
        .max()
        .unwrap()
        .to_string()
}

fn home_mount(tag: &str) -> Mount {
    let s = Scratch::home(tag);
    fs::create_dir_all(s.root().join("cat/foo")).unwrap();
    fs::write(s.root().join("cat/foo/SKILL.md"), "v1\n").unwrap();
    fs::create_dir_all(s.root().join("cat/bar")).unwrap();
    fs::write(s.root().join("cat/bar/SKILL.md"), "bar\n").unwrap();
    Mount::over(s, Vec::new())
}

#[test]
fn commands_find_their_mount_from_the_current_directory_or_a_path() {
    let m = home_mount("cwd");
    fs::write(m.path("cat/foo/SKILL.md"), "v2\n").unwrap();
    fs::write(m.path("cat/bar/SKILL.md"), "bar2\n").unwrap();
    let foo = m.path("cat/foo");

    // `cd cat/foo && skillfs log SKILL.md`: that file's versions only.
    let text = ok(&skillfs_in(&foo, &["log", "SKILL.md", "--json"]));
    let paths = json_paths(&text);
    assert!(
        !paths.is_empty() && paths.iter().all(|p| p == "cat/foo/SKILL.md"),
        "{text}"
    );
    // `..` counts from the current directory too.
    let text = ok(&skillfs_in(&foo, &["log", "../bar", "--json"]));
    assert!(
        json_paths(&text).iter().all(|p| p.starts_with("cat/bar")),
        "{text}"
    );
    // From the home around ROOT: a path inside ROOT, or one counted from ROOT.
    for p in ["skills/cat/foo", "cat/foo"] {
        let text = ok(&skillfs_in(&m.mount_point(), &["log", p, "--json"]));
        assert!(
            json_paths(&text).iter().all(|x| x.starts_with("cat/foo")),
            "{p}: {text}"
        );
    }
    // An absolute PATH inside the mount, from anywhere.
    let abs = m.path("cat/foo/SKILL.md").display().to_string();
    let text = ok(&skillfs_in(Path::new("/"), &["log", &abs, "--json"]));
    assert_eq!(json_paths(&text), paths);

    // show, diff, status, from inside.
    assert_eq!(ok(&skillfs_in(&foo, &["show", "latest:SKILL.md"])), "v2\n");
    let first = mounted_state(&m);
    let text = ok(&skillfs_in(&foo, &["diff", &first, "SKILL.md"]));
    assert!(
        text.contains("-v1\n+v2\n") && !text.contains("bar"),
        "{text}"
    );
    let text = ok(&skillfs_in(&foo, &["status"]));
    assert!(text.contains(&m.root().display().to_string()), "{text}");
    assert!(text.contains("mounted (daemon pid"), "{text}");

    // `--store` wherever `--root` is.
    let (r, s) = (
        m.mount_point().display().to_string(),
        m.store().display().to_string(),
    );
    for args in [
        vec!["log", "-n", "1"],
        vec!["status"],
        vec!["show", "latest:cat/foo/SKILL.md"],
        vec!["diff", "1"],
    ] {
        let mut a = args.clone();
        a.extend(["--root", &r, "--store", &s]);
        ok(&skillfs_in(Path::new("/"), &a));
        let mut a = args.clone();
        a.extend(["--store", &s]);
        ok(&skillfs_in(Path::new("/"), &a));
    }

    // A PATH outside ROOT is refused, naming it.
    let out = skillfs_in(&foo, &["log", "/etc"]);
    assert_refused(&out, 2, &["'/etc'", "not inside the versioned directory"]);
    let out = skillfs_in(&foo, &["log", "../../../.."]);
    assert_refused(&out, 2, &["not inside the versioned directory"]);
}

#[test]
fn outside_any_mount_commands_fall_back_to_the_home_and_say_what_is_missing() {
    let s = Scratch::new("nomount");
    // No mount holds the directory and HOME holds nothing.
    let out = skillfs_in(&s.dir, &["log"]);
    assert_refused(
        &out,
        4,
        &[
            "/nonexistent-home/.hermes/skills",
            "not mounted",
            "no store",
        ],
    );
    // HERMES_HOME is the fallback.
    let out = Command::new(BIN)
        .arg("status")
        .current_dir(&s.dir)
        .env("HERMES_HOME", s.dir.join("agent"))
        .output()
        .unwrap();
    assert_refused(&out, 4, &["agent/skills"]);
    // A store that does not exist is named.
    for cmd in ["log", "status"] {
        let out = skillfs_in(&s.dir, &[cmd, "--store", "/nonexistent/dir"]);
        assert_refused(&out, 4, &["store '/nonexistent/dir' does not exist"]);
    }
}

/// `sed -i` on `p`: one operation of several records (a temp file, written,
/// renamed over `p`).
fn sed(p: &Path, expr: &str) {
    let st = Command::new("sed")
        .arg("-i")
        .arg(expr)
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn log_groups_each_operation_and_filters_by_count_time_and_actor() {
    let m = home_mount("logfilters");
    let f = m.path("cat/foo/SKILL.md");
    for (i, e) in ["s/v1/v2/", "s/v2/v3/", "s/v3/v4/"].iter().enumerate() {
        sed(&f, e);
        if i < 2 {
            // Three operations, not one: further apart than the grouping gap.
            std::thread::sleep(Duration::from_millis(2100));
        }
    }
    let root = m.mount_point();
    let all = ok(&skillfs_in(&root, &["log", "--all"]));
    let grouped = ok(&skillfs_in(&root, &["log"]));
    let seds: Vec<&str> = grouped.lines().filter(|l| l.contains("sed[")).collect();
    assert_eq!(seds.len(), 3, "one line per sed -i:\n{grouped}");
    for l in &seds {
        assert!(
            l.contains("cat/foo/SKILL.md") && l.contains(" changes "),
            "{l}"
        );
        assert!(
            !l.contains("sed") || !l.contains("/sed"),
            "temp names are not shown: {l}"
        );
    }
    assert!(
        all.lines().filter(|l| l.contains("sed[")).count() > 3,
        "--all shows every record:\n{all}"
    );
    // -n: the newest N operations.
    let last = ok(&skillfs_in(&root, &["log", "-n", "1"]));
    assert_eq!(last.lines().collect::<Vec<_>>(), [seds[2]]);
    assert_eq!(
        ok(&skillfs_in(&root, &["log", "-n", "2"])).lines().count(),
        2
    );
    // --since/--until: an age or a UTC time.
    assert_eq!(ok(&skillfs_in(&root, &["log", "--since", "1h"])), grouped);
    assert_eq!(
        ok(&skillfs_in(
            &root,
            &["log", "--until", "2000-01-01T00:00:00Z"]
        )),
        ""
    );
    assert_eq!(ok(&skillfs_in(&root, &["log", "--until", "1h"])), "");
    // --actor: by process name.
    let by_sed = ok(&skillfs_in(&root, &["log", "--actor", "sed"]));
    assert_eq!(by_sed.lines().collect::<Vec<_>>(), seds);
    assert_eq!(
        ok(&skillfs_in(&root, &["log", "--actor", "nobody-at-all"])),
        ""
    );
    // Piped: no colour.
    assert!(!all.contains('\x1b'), "{all}");
    // A time that is none is a usage error.
    let out = skillfs_in(&root, &["log", "--since", "yesterday"]);
    assert_refused(&out, 2, &["'yesterday' is not a time"]);
}

/// `skillfs ARGS` in `dir` with stdout on a new terminal, and `env`;
/// what the terminal showed.
fn on_terminal(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let (mut master, mut slave) = (0, 0);
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("HERMES_HOME")
        .env_remove("NO_COLOR")
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    drop(cmd); // our copies of the terminal's slave side
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break; // EIO: every slave side is closed
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    assert!(child.wait().unwrap().success());
    String::from_utf8_lossy(&out).replace("\r\n", "\n")
}

#[test]
fn log_pages_and_colours_on_a_terminal_only() {
    let m = home_mount("logtty");
    fs::write(m.path("cat/foo/SKILL.md"), "v2\n").unwrap();
    let root = m.mount_point();
    let shown = on_terminal(&root, &["log"], &[("PAGER", "sed s/^/PAGED:/")]);
    let lines: Vec<&str> = shown.lines().collect();
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.starts_with("PAGED:")),
        "{shown}"
    );
    assert!(shown.contains("\x1b[33m"), "ids in colour: {shown:?}");
    // --no-pager and NO_COLOR, as git.
    let shown = on_terminal(
        &root,
        &["log", "--no-pager"],
        &[("PAGER", "sed s/^/PAGED:/"), ("NO_COLOR", "1")],
    );
    assert!(
        !shown.contains("PAGED:") && !shown.contains('\x1b'),
        "{shown:?}"
    );
    assert!(shown.contains("cat/foo/SKILL.md"), "{shown}");
}

#[test]
fn undo_puts_back_the_state_before_the_newest_change_and_can_itself_be_undone() {
    let mut m = home_mount("undo");
    let foo = m.path("cat/foo");
    fs::write(m.path("cat/foo/SKILL.md"), "v2\n").unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    sed(&m.path("cat/foo/SKILL.md"), "s/v2/v3/");

    // --dry-run: what the undo would do (not what the sed did), and
    // nothing changed.
    let n = m.log().len();
    let text = ok(&skillfs_in(&foo, &["undo", "--dry-run"]));
    assert!(
        text.contains("undo would put back the state before changes")
            && text.contains("\n  restore cat/foo/SKILL.md as of change ")
            && text.contains("-v3\n+v2\n"),
        "{text}"
    );
    assert_eq!(m.log().len(), n);
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v3\n");

    // The whole sed -i goes in one undo, and the undo is itself undone.
    let text = ok(&skillfs_in(&foo, &["undo"]));
    assert!(text.starts_with("undid changes"), "{text}");
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v2\n");
    ok(&skillfs_in(&foo, &["undo"]));
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v3\n");
    assert_eq!(
        names(&m.path("cat/foo")),
        ["SKILL.md"],
        "no staging name is listed"
    );

    // PATH: only that path's newest change, whatever came after elsewhere.
    std::thread::sleep(Duration::from_millis(2100));
    fs::write(m.path("cat/bar/SKILL.md"), "bar2\n").unwrap();
    ok(&skillfs_in(&foo, &["undo", "SKILL.md"]));
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v2\n");
    assert_eq!(fs::read(m.path("cat/bar/SKILL.md")).unwrap(), b"bar2\n");

    // A creation is undone by taking the entry out; a rename by moving back.
    std::thread::sleep(Duration::from_millis(2100));
    fs::create_dir(m.path("cat/new")).unwrap();
    ok(&skillfs_in(&m.root(), &["undo"]));
    assert_eq!(names(&m.path("cat")), ["bar", "foo"]);
    std::thread::sleep(Duration::from_millis(2100));
    fs::rename(m.path("cat/foo"), m.path("cat/moved")).unwrap();
    ok(&skillfs_in(&m.root(), &["undo"]));
    assert_eq!(names(&m.path("cat")), ["bar", "foo"]);
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v2\n");

    // Errors: a path with no change, and no mount to write through.
    let out = skillfs_in(&m.root(), &["undo", "cat/nothing"]);
    assert_refused(&out, 8, &["'cat/nothing' has no change to undo"]);
    let r = m.mount_point().display().to_string();
    m.umount();
    let out = skillfs_in(Path::new("/"), &["undo", "--root", &r]);
    assert_refused(&out, 3, &["is not mounted"]);
}

#[test]
fn undo_of_an_empty_history_and_restore_on_a_dead_mount_are_refused() {
    let mut m = Mount::new("undoempty");
    let out = skillfs_in(&m.root(), &["undo"]);
    assert_refused(&out, 8, &["no change to undo"]);
    fs::write(m.path("a"), "x").unwrap();
    let r = m.root().display().to_string();
    m.kill_daemon();
    for args in [
        vec!["restore", "1", "a", "--root", &r],
        vec!["undo", "--root", &r],
    ] {
        let out = skillfs_in(Path::new("/"), &args);
        assert_refused(&out, 3, &["daemon died", "skillfs mount"]);
    }
    m.detach();
}

#[test]
fn restore_takes_store_and_refuses_a_store_not_the_mounts() {
    let m = home_mount("restorestore");
    fs::write(m.path("cat/foo/SKILL.md"), "v2\n").unwrap();
    let s = m.store().display().to_string();
    let first = mounted_state(&m);
    let text = ok(&skillfs_in(
        &m.path("cat"),
        &["restore", &first, "foo", "--store", &s],
    ));
    assert!(
        text.contains(&format!("restored cat/foo as of change {first}")),
        "{text}"
    );
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v1\n");
    let other = Scratch::new("otherstore");
    fs::create_dir_all(other.dir.join("journal")).unwrap();
    let o = other.dir.display().to_string();
    let out = skillfs_in(&m.path("cat"), &["restore", &first, "foo", "--store", &o]);
    assert_refused(&out, 4, &["is not the store of the mount"]);
}

#[test]
fn status_reads_like_df_and_restic_stats() {
    let m = home_mount("status");
    // The same content twice: stored once.
    fs::write(m.path("cat/foo/a.md"), vec![b'x'; 10_000]).unwrap();
    fs::write(m.path("cat/bar/a.md"), vec![b'x'; 10_000]).unwrap();
    // A park: a backup directory the rules hide.
    fs::create_dir(m.path("cat/old.bak")).unwrap();
    let text = ok(&skillfs_in(&m.root(), &["status"]));
    for want in [
        "state:     mounted (daemon pid",
        "mount:",
        "KiB on disk",
        "file versions",
        "9.8 KiB saved by dedup",
        "oldest:    id 1 at ",
        "seconds ago)",
        "newest:",
        "parks:     1: old.bak (touched ",
        "parks swept after: 7d",
    ] {
        assert!(text.contains(want), "'{want}' missing:\n{text}");
    }
}

#[test]
fn help_teaches_and_typos_are_corrected() {
    let text = ok(&skillfs(&["--help"]));
    for want in [
        ".history",
        "@-10m",
        "Exit codes",
        "skillfs undo",
        "8 not in history",
    ] {
        assert!(text.contains(want), "'{want}' missing:\n{text}");
    }
    for cmd in [
        "mount",
        "log",
        "undo",
        "status",
        "show",
        "diff",
        "restore",
        "umount",
        "completions",
        "man",
        "export",
    ] {
        let text = ok(&skillfs(&[cmd, "--help"]));
        assert!(
            text.contains("Example"),
            "{cmd} --help has no example:\n{text}"
        );
    }
    let out = skillfs(&["stauts"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("'status'"),
        "{}",
        describe(&out)
    );
    let text = ok(&skillfs(&["unmount", "--help"]));
    assert!(text.contains("Usage: skillfs umount"), "{text}");
}

#[test]
fn unmount_is_umount() {
    let mut m = Mount::new("unmount");
    let r = m.root().display().to_string();
    let text = ok(&skillfs(&["unmount", &r]));
    assert!(text.contains("unmounted"), "{text}");
    assert!(!is_mounted(&m.root()));
    m.remount();
}

#[test]
fn completions_and_man_page_come_from_the_same_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let text = ok(&skillfs(&["completions", shell]));
        assert!(
            text.contains("undo") && text.contains("since"),
            "{shell}:\n{text}"
        );
    }
    let out = skillfs(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let text = ok(&skillfs(&["man"]));
    assert!(
        text.contains(".TH skillfs") && text.contains("undo"),
        "{text}"
    );
}

#[test]
fn commands_say_what_is_wrong_and_what_to_type_instead() {
    let m = home_mount("whatswrong");
    fs::write(m.path("cat/foo/SKILL.md"), "v2\n").unwrap();
    let first = mounted_state(&m);
    let root = m.root();
    let r = root.display().to_string();
    let abs = |p: &str| m.path(p).display().to_string();

    // A path never seen: named as resolved, with a near name if one is.
    let out = skillfs_in(&root, &["log", "cat/foo/SKIL.md"]);
    assert_refused(
        &out,
        8,
        &[
            "no change was ever recorded at 'cat/foo/SKIL.md'",
            &abs("cat/foo/SKIL.md"),
            "did you mean 'cat/foo/SKILL.md'?",
        ],
    );
    let out = skillfs_in(&root, &["log", "no/such/path"]);
    assert_refused(&out, 8, &[&abs("no/such/path"), "`skillfs log` lists"]);
    for args in [
        vec!["show", "latest:no/such/path"],
        vec!["restore", &first, "no/such/path"],
        vec!["diff", &first, "no/such/path"],
    ] {
        let out = skillfs_in(&root, &args);
        assert_refused(
            &out,
            8,
            &["no change was ever recorded", &abs("no/such/path")],
        );
    }
    // A path history has, but not at that id: the ids it has.
    fs::write(m.path("cat/foo/late.md"), "x").unwrap();
    let out = skillfs_in(&root, &["show", &format!("{first}:cat/foo/late.md")]);
    assert_refused(
        &out,
        8,
        &[
            &format!("did not exist just after change {first}"),
            "has versions from change",
            "skillfs log cat/foo/late.md",
        ],
    );

    // An id where a path belongs: `log 29`.
    let out = skillfs_in(&root, &["log", &first]);
    let n: u64 = first.parse().unwrap();
    assert_refused(
        &out,
        2,
        &[
            &format!("'{first}' is a change id, not a path"),
            &format!("`skillfs diff {} {first}`", n - 1),
            &format!("`skillfs show {first}:PATH`"),
        ],
    );
    let out = skillfs_in(&root, &["log", "latest"]);
    assert_refused(&out, 2, &["is a change id", "`skillfs diff latest`"]);

    // An id that does not exist, and one that is no id.
    let out = skillfs_in(&root, &["restore", "99999", "cat/foo"]);
    assert_refused(&out, 8, &["'99999' names no change", "ids 1 to"]);
    let out = skillfs_in(&root, &["show", "3x:cat/foo"]);
    assert_refused(&out, 8, &["'3x' is not an id or alias"]);

    // A PATH outside the mount.
    let out = skillfs_in(&root, &["restore", &first, "/etc/passwd"]);
    assert_refused(
        &out,
        2,
        &[
            "'/etc/passwd'",
            "not inside the versioned directory",
            "give a path under it, or --root",
        ],
    );

    // `show ID PATH`, the form of diff and restore, is taken too; an id
    // alone says both forms.
    let text = ok(&skillfs_in(&root, &["show", &first, "cat/foo/SKILL.md"]));
    assert_eq!(text, "v1\n");
    let out = skillfs_in(&root, &["show", &first]);
    assert_refused(
        &out,
        2,
        &[
            &format!("`skillfs show {first}:PATH`"),
            &format!("`skillfs show {first} PATH`"),
        ],
    );

    // A relative PATH from outside the mount counts from ROOT, and the
    // message says so.
    let out = skillfs_in(
        &m.scratch.dir,
        &["restore", &first, "skillfs/README.md", "--root", &r],
    );
    assert_refused(
        &out,
        8,
        &[
            "'skillfs/README.md'",
            &abs("skillfs/README.md"),
            "counted from ROOT",
        ],
    );

    // From inside `.history/<id>/…`, a relative PATH means the live path.
    let inside = m.path(&format!(".history/{first}/cat/foo"));
    let text = ok(&skillfs_in(&inside, &["log", "SKILL.md", "--json"]));
    let paths = json_paths(&text);
    assert!(
        !paths.is_empty() && paths.iter().all(|p| p == "cat/foo/SKILL.md"),
        "{text}"
    );
    assert_eq!(
        ok(&skillfs_in(&inside, &["show", "latest:SKILL.md"])),
        "v2\n"
    );
    let text = ok(&skillfs_in(&inside, &["restore", &first, "SKILL.md"]));
    assert!(text.contains("restored cat/foo/SKILL.md"), "{text}");
    assert_eq!(fs::read(m.path("cat/foo/SKILL.md")).unwrap(), b"v1\n");
    let out = skillfs_in(&inside, &["show", &format!("{first}:late.md")]);
    assert_refused(&out, 8, &["'late.md'", &abs("cat/foo/late.md"), ".history"]);
}

#[test]
fn id_arguments_have_help() {
    for cmd in ["restore", "diff", "show"] {
        let text = ok(&skillfs(&[cmd, "--help"]));
        let line = text
            .lines()
            .skip_while(|l| !l.starts_with("Arguments:"))
            .nth(1)
            .unwrap_or_default()
            .to_string();
        assert!(
            line.contains("<ID") && line.contains("alias"),
            "{cmd}: the first argument has no help:\n{text}"
        );
    }
}

#[test]
fn man_dir_writes_a_page_per_command_and_every_page_cited_exists() {
    let s = Scratch::new("manpages");
    let dir = s.dir.join("man1");
    let d = dir.display().to_string();
    let text = ok(&skillfs(&["man", "--dir", &d]));
    assert!(text.starts_with("wrote "), "{text}");
    let top = fs::read_to_string(dir.join("skillfs.1")).unwrap();
    assert!(top.contains(".TH skillfs 1"), "{top}");
    // Every page the top page cites, as `skillfs\-restore(1)`.
    let cited: Vec<String> = top
        .split("skillfs\\-")
        .skip(1)
        .filter_map(|t| t.split_once("(1)").map(|(name, _)| name.to_string()))
        .collect();
    assert!(cited.len() > 10, "{cited:?}");
    assert!(
        !cited.contains(&"help".to_string()),
        "no help page: {cited:?}"
    );
    for name in &cited {
        let page = fs::read_to_string(dir.join(format!("skillfs-{name}.1")))
            .unwrap_or_else(|e| panic!("skillfs-{name}.1 is cited but not written: {e}"));
        assert!(
            page.contains(&format!(".TH skillfs-{name} 1")) && page.contains(".SH NAME"),
            "{page}"
        );
    }
    // Every command of the help has its page; nothing else was written.
    for cmd in [
        "mount", "umount", "log", "show", "diff", "restore", "undo", "man",
    ] {
        assert!(cited.contains(&cmd.to_string()), "{cmd}: {cited:?}");
    }
    assert_eq!(fs::read_dir(&dir).unwrap().count(), cited.len() + 1);
    // One command's page on stdout, by name or alias.
    let page = ok(&skillfs(&["man", "restore"]));
    assert!(page.contains(".TH skillfs-restore 1"), "{page}");
    let out = skillfs(&["man", "nosuch"]);
    assert_refused(&out, 2, &["'nosuch' is not a skillfs command"]);
}
