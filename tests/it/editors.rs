//! Editors leave no noise: the swap, backup, lock and probe files of vim,
//! neovim, emacs, nano, VS Code and JetBrains IDEs are untracked by
//! default (listed and usable, never versioned, never in `log`), and a
//! save of the edited file is one version of it, even when the editor
//! renames the original to its backup name and writes a new file.
//!
//! Each editor's save is replayed with the system calls it makes (taken
//! from strace of vim 9.0 and from the editors' sources; see
//! `hide::DEFAULT_UNTRACKED`), so the tests run with no editor installed.
//! A real vim, where there is one, is driven as well.

use crate::common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::Path;

use common::{Mount, Scratch, names};

const SKILL: &str = "cat/demo/SKILL.md";
const DIR: &str = "cat/demo";

fn with_skill(tag: &str) -> Mount {
    Mount::with_tree(tag, |root| {
        fs::create_dir_all(root.join(DIR)).unwrap();
        fs::write(root.join(SKILL), "---\nname: demo\n---\nv0\n").unwrap();
    })
}

/// The records that name `path` (as their path or target).
fn records_of(m: &Mount, path: &str) -> Vec<serde_json::Value> {
    m.log()
        .into_iter()
        .filter(|r| r["path"] == path || r["to"] == path)
        .collect()
}

/// No record of the whole journal names an editor's scratch file.
fn assert_no_scratch_in_log(m: &Mount) {
    for r in m.log() {
        for field in ["path", "to", "hidden"] {
            let Some(p) = r[field].as_str() else { continue };
            let name = p.rsplit('/').next().unwrap();
            let scratch = name.ends_with('~')
                || name.starts_with(".#")
                || (name.starts_with('#') && name.ends_with('#'))
                || name == "4913"
                || name.ends_with(".swp")
                || name.ends_with(".swx")
                || name.ends_with(".vsctmp")
                || name.contains("___jb_");
            assert!(!scratch, "the log names the editor's file {p}: {r}");
        }
    }
}

/// One save was one new version of the skill, holding `content`, seen as
/// such live and in `.history/latest`.
fn assert_one_version(m: &Mount, before: usize, content: &str) -> usize {
    let recs = records_of(m, SKILL);
    assert_eq!(
        recs.len(),
        before + 1,
        "one save must be one version of {SKILL}: {recs:#?}"
    );
    assert!(
        recs.last().unwrap()["state"]["blob"].is_string(),
        "the save's record is a version: {:?}",
        recs.last()
    );
    assert_eq!(fs::read_to_string(m.path(SKILL)).unwrap(), content);
    let latest = m.path(&format!(".history/latest/{SKILL}"));
    assert_eq!(fs::read_to_string(latest).unwrap(), content);
    assert_no_scratch_in_log(m);
    recs.len()
}

/// `name` is listed in the skill's directory and can be opened (the
/// editor checks that its swap or lock file is there).
fn assert_visible(m: &Mount, name: &str) {
    assert!(
        names(&m.path(DIR)).contains(&name.to_string()),
        "{name} must stay listed: {:?}",
        names(&m.path(DIR))
    );
    fs::symlink_metadata(m.path(DIR).join(name)).unwrap();
}

fn open(p: &Path, flags: i32, mode: u32) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => o.read(true),
        libc::O_WRONLY => o.write(true),
        _ => o.read(true).write(true),
    };
    o.custom_flags(flags & !libc::O_ACCMODE).mode(mode);
    if flags & libc::O_CREAT != 0 {
        // OpenOptions wants create() for O_CREAT to be honoured.
        if flags & libc::O_EXCL != 0 {
            o.create_new(true);
        } else {
            o.create(true);
        }
    }
    if flags & libc::O_TRUNC != 0 {
        o.truncate(true);
    }
    o.open(p)
}

fn gone(p: &Path) -> bool {
    fs::symlink_metadata(p).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

/// vim's swap file made at the start of an edit, as strace shows vim 9.0:
/// `.NAME.swp` and `.NAME.swx` tried exclusively and removed, then the
/// swap file made again, written and made readable like the original.
fn vim_open(m: &Mount) -> File {
    let d = m.path(DIR);
    let (swp, swx) = (d.join(".SKILL.md.swp"), d.join(".SKILL.md.swx"));
    drop(open(&swp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600).unwrap());
    drop(open(&swx, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600).unwrap());
    fs::remove_file(&swx).unwrap();
    fs::remove_file(&swp).unwrap();
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let mut f = open(&swp, flags, 0o600).unwrap();
    f.write_all(&[b'b'; 4096]).unwrap();
    fs::set_permissions(&swp, fs::Permissions::from_mode(0o644)).unwrap();
    assert_visible(m, ".SKILL.md.swp");
    f
}

/// vim's `:w`, as strace shows vim 9.0 doing it on a skillfs mount.
/// `copy`: `backupcopy=yes` (the backup is a copy, the file rewritten in
/// place); else `auto`/`no`: the probe `4913`, the original renamed to
/// `NAME~`, a new file written. `keep`: `backup` is set (else only
/// `writebackup`, and the backup is removed once written).
fn vim_write(m: &Mount, swap: &mut File, text: &str, copy: bool, keep: bool) {
    let d = m.path(DIR);
    let (file, backup) = (m.path(SKILL), d.join("SKILL.md~"));
    swap.write_all(&[b't'; 8192]).unwrap();
    swap.sync_all().unwrap();
    let excl = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    if copy {
        let old = fs::read(&file).unwrap();
        let _ = fs::remove_file(&backup);
        let mut b = open(&backup, excl, 0o644).unwrap();
        b.write_all(&old).unwrap();
        drop(b);
        let then = fs::metadata(&file).unwrap().modified().unwrap();
        File::options()
            .write(true)
            .open(&backup)
            .unwrap()
            .set_modified(then)
            .unwrap();
        assert_visible(m, "SKILL.md~");
    } else {
        let probe = d.join("4913");
        assert!(gone(&probe));
        let p = open(&probe, excl, 0o100644).unwrap();
        std::os::unix::fs::fchown(&p, Some(0), Some(0)).unwrap();
        assert_visible(m, "4913");
        fs::metadata(&probe).unwrap();
        drop(p);
        fs::remove_file(&probe).unwrap();
        let _ = fs::remove_file(&backup);
        fs::rename(&file, &backup).unwrap();
        assert_visible(m, "SKILL.md~");
    }
    // The file (new, or the original) opened without O_TRUNC, emptied,
    // written, synced, and given its mode.
    let mut f = open(&file, libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    f.set_len(0).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.sync_all().unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o100644))
        .unwrap();
    drop(f);
    if !copy && !keep {
        fs::remove_file(&backup).unwrap();
    }
    swap.write_all(&[b'b'; 4096]).unwrap();
}

fn vim_close(m: &Mount, swap: File) {
    drop(swap);
    fs::remove_file(m.path(DIR).join(".SKILL.md.swp")).unwrap();
}

/// Two sessions of vim, each saving twice, with the options given.
fn vim_sessions(tag: &str, copy: bool, keep: bool) {
    let m = with_skill(tag);
    let mut n = records_of(&m, SKILL).len();
    let mut texts = vec!["---\nname: demo\n---\nv0\n".to_string()];
    for session in 0..2 {
        let mut swap = vim_open(&m);
        for save in 0..2 {
            let text = format!("---\nname: demo\n---\nsession {session} save {save}\n");
            vim_write(&m, &mut swap, &text, copy, keep);
            n = assert_one_version(&m, n, &text);
            texts.push(text);
        }
        vim_close(&m, swap);
    }
    // One unbroken history: every save's text, in order, none removed.
    let history: Vec<String> = records_of(&m, SKILL)
        .iter()
        .map(|r| {
            let blob = r["state"]["blob"]
                .as_str()
                .expect("a version, not a removal");
            String::from_utf8(m.blob(blob)).unwrap()
        })
        .collect();
    assert_eq!(history, texts);
    let left = names(&m.path(DIR));
    let expected: &[&str] = if keep || copy {
        &["SKILL.md", "SKILL.md~"]
    } else {
        &["SKILL.md"]
    };
    assert_eq!(left, expected);
    if keep || copy {
        // The backup holds the save before the last, as vim left it.
        let backup = fs::read_to_string(m.path(DIR).join("SKILL.md~")).unwrap();
        assert!(backup.ends_with("session 1 save 0\n"), "{backup}");
    }
    assert_no_scratch_in_log(&m);
}

#[test]
fn vim_default_save_renames_to_a_backup_and_is_one_version() {
    vim_sessions("vim-auto", false, false);
}

#[test]
fn vim_backup_kept_by_rename_is_one_version_per_save() {
    vim_sessions("vim-rename-keep", false, true);
}

#[test]
fn vim_backupcopy_yes_is_one_version_per_save() {
    vim_sessions("vim-copy", true, true);
}

/// emacs: the lock symlink `.#NAME` at the first change, the auto-save
/// `#NAME#`, and at the first save of a session the original renamed to
/// `NAME~` and a new file written (`write-region`: `O_WRONLY | O_CREAT |
/// O_TRUNC`, then fsync); later saves write in place. The auto-save and
/// the lock go once saved.
#[test]
fn emacs_save_with_lock_autosave_and_backup_is_one_version() {
    let m = with_skill("emacs");
    let d = m.path(DIR);
    let (lock, autosave) = (d.join(".#SKILL.md"), d.join("#SKILL.md#"));
    let mut n = records_of(&m, SKILL).len();
    for save in 0..3 {
        symlink("root@host.4242:1796200000", &lock).unwrap();
        assert_visible(&m, ".#SKILL.md");
        assert_eq!(
            fs::read_link(&lock).unwrap().to_str(),
            Some("root@host.4242:1796200000")
        );
        let text = format!("---\nname: demo\n---\nemacs {save}\n");
        let trunc = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        let mut a = open(&autosave, trunc, 0o600).unwrap();
        a.write_all(b"auto-saved text").unwrap();
        drop(a);
        assert_visible(&m, "#SKILL.md#");
        if save == 0 {
            fs::rename(m.path(SKILL), d.join("SKILL.md~")).unwrap();
            assert_visible(&m, "SKILL.md~");
        }
        let mut f = open(&m.path(SKILL), trunc, 0o644).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f.sync_all().unwrap();
        drop(f);
        fs::remove_file(&autosave).unwrap();
        fs::remove_file(&lock).unwrap();
        n = assert_one_version(&m, n, &text);
    }
    assert_eq!(names(&d), ["SKILL.md", "SKILL.md~"]);
    assert_eq!(
        fs::read_to_string(d.join("SKILL.md~")).unwrap(),
        "---\nname: demo\n---\nv0\n"
    );
}

/// nano with `--locking --backup`: the lock file `.NAME.swp`, a copy of
/// the original to `NAME~`, the file rewritten in place.
#[test]
fn nano_save_with_lock_and_backup_is_one_version() {
    let m = with_skill("nano");
    let d = m.path(DIR);
    let (lock, backup) = (d.join(".SKILL.md.swp"), d.join("SKILL.md~"));
    let mut n = records_of(&m, SKILL).len();
    for save in 0..2 {
        let trunc = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        let mut l = open(&lock, trunc, 0o644).unwrap();
        l.write_all(&[0u8; 1024]).unwrap();
        drop(l);
        assert_visible(&m, ".SKILL.md.swp");
        let old = fs::read(m.path(SKILL)).unwrap();
        let mut b = open(&backup, trunc, 0o644).unwrap();
        b.write_all(&old).unwrap();
        drop(b);
        let text = format!("---\nname: demo\n---\nnano {save}\n");
        let mut f = open(&m.path(SKILL), trunc, 0o644).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f.sync_all().unwrap();
        drop(f);
        fs::remove_file(&lock).unwrap();
        n = assert_one_version(&m, n, &text);
    }
    assert_eq!(names(&d), ["SKILL.md", "SKILL.md~"]);
}

/// VS Code's atomic save: `NAME.vsctmp` written, renamed over `NAME`.
#[test]
fn vscode_atomic_save_is_one_version() {
    let m = with_skill("vscode");
    let tmp = m.path(DIR).join("SKILL.md.vsctmp");
    let mut n = records_of(&m, SKILL).len();
    for save in 0..2 {
        let text = format!("---\nname: demo\n---\nvscode {save}\n");
        let trunc = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        let mut f = open(&tmp, trunc, 0o644).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        drop(f);
        assert_visible(&m, "SKILL.md.vsctmp");
        fs::rename(&tmp, m.path(SKILL)).unwrap();
        n = assert_one_version(&m, n, &text);
    }
    assert_eq!(names(&m.path(DIR)), ["SKILL.md"]);
}

/// JetBrains' safe write: the new text to `NAME___jb_tmp___`, the
/// original renamed to `NAME___jb_old___`, the new one into place, the
/// old one removed.
#[test]
fn jetbrains_safe_write_is_one_version() {
    let m = with_skill("jetbrains");
    let d = m.path(DIR);
    let (tmp, old) = (
        d.join("SKILL.md___jb_tmp___"),
        d.join("SKILL.md___jb_old___"),
    );
    let mut n = records_of(&m, SKILL).len();
    for save in 0..2 {
        let text = format!("---\nname: demo\n---\njetbrains {save}\n");
        fs::write(&tmp, &text).unwrap();
        fs::rename(m.path(SKILL), &old).unwrap();
        fs::rename(&tmp, m.path(SKILL)).unwrap();
        fs::remove_file(&old).unwrap();
        n = assert_one_version(&m, n, &text);
    }
    assert_eq!(names(&d), ["SKILL.md"]);
}

/// A file renamed to a backup name with no new file after it was removed:
/// the log says so once the moment has passed (within three seconds), and
/// at unmount at the latest. Renamed back meanwhile, nothing happened.
#[test]
fn a_backup_rename_with_no_new_file_is_a_removal_in_time() {
    let mut m = with_skill("backup-only");
    let (file, backup) = (m.path(SKILL), m.path(DIR).join("SKILL.md~"));
    let n = records_of(&m, SKILL).len();
    // Renamed away and back: no record at all.
    fs::rename(&file, &backup).unwrap();
    fs::rename(&backup, &file).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(3500));
    assert_eq!(
        records_of(&m, SKILL).len(),
        n,
        "{:#?}",
        records_of(&m, SKILL)
    );
    let latest = m.path(&format!(".history/latest/{SKILL}"));
    assert_eq!(
        fs::read_to_string(&latest).unwrap(),
        "---\nname: demo\n---\nv0\n"
    );

    // Renamed away for good: a removal, naming no backup.
    fs::rename(&file, &backup).unwrap();
    let t = std::time::Instant::now();
    loop {
        let recs = records_of(&m, SKILL);
        if recs.len() == n + 1 {
            assert_eq!(recs[n]["op"], "park");
            assert!(recs[n].get("hidden").is_none(), "{}", recs[n]);
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the removal is not in the log: {recs:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(gone(&latest));
    assert_no_scratch_in_log(&m);

    // Renamed away, then a directory made at its name: the removal comes
    // first. And one still held back at unmount is journaled then.
    fs::rename(&backup, &file).unwrap();
    let n = records_of(&m, SKILL).len();
    fs::rename(&file, &backup).unwrap();
    fs::create_dir(&file).unwrap();
    let ops: Vec<_> = records_of(&m, SKILL)[n..]
        .iter()
        .map(|r| r["op"].clone())
        .collect();
    assert_eq!(ops, ["park", "mkdir"]);
    fs::remove_dir(&file).unwrap();
    fs::rename(&backup, &file).unwrap();
    let n = records_of(&m, SKILL).len();
    fs::rename(&file, &backup).unwrap();
    m.umount();
    let recs = records_of(&m, SKILL);
    assert_eq!(recs.len(), n + 1);
    assert_eq!(recs[n]["op"], "park");
    m.remount();
    assert_eq!(
        records_of(&m, SKILL).len(),
        n + 1,
        "the scan found nothing more"
    );
}

/// The editor rules are precise: a skill named `4913`, a directory
/// `notes~` and their files are versioned; `--tracked` and `config.json`
/// give a default back.
#[test]
fn editor_rules_keep_skills_and_can_be_changed() {
    let m = Mount::new("editor-rules");
    fs::create_dir_all(m.path("cat/4913")).unwrap();
    fs::write(m.path("cat/4913/SKILL.md"), "a skill named 4913").unwrap();
    fs::create_dir_all(m.path("cat/4913/notes~")).unwrap();
    fs::write(m.path("cat/4913/notes~/a.md"), "kept").unwrap();
    fs::write(m.path("cat/4913/.SKILL.md.swp"), "swap").unwrap();
    let log = m.log();
    for p in [
        "cat/4913",
        "cat/4913/SKILL.md",
        "cat/4913/notes~",
        "cat/4913/notes~/a.md",
    ] {
        assert!(log.iter().any(|r| r["path"] == p), "{p} is versioned");
    }
    assert!(records_of(&m, "cat/4913/.SKILL.md.swp").is_empty());
    drop(m);

    let scratch = Scratch::new("editor-tracked");
    fs::create_dir_all(scratch.root().join(DIR)).unwrap();
    fs::create_dir_all(scratch.store()).unwrap();
    fs::write(
        scratch.store().join("config.json"),
        r#"{"tracked": ["4913:file"]}"#,
    )
    .unwrap();
    let m = Mount::over(scratch, vec!["--tracked".into(), "*~".into()]);
    fs::write(m.path(DIR).join("SKILL.md~"), "backup").unwrap();
    fs::write(m.path(DIR).join("4913"), "probe").unwrap();
    fs::write(m.path(DIR).join(".SKILL.md.swp"), "swap").unwrap();
    for p in ["cat/demo/SKILL.md~", "cat/demo/4913"] {
        assert_eq!(records_of(&m, p).len(), 2, "{p}: create and write");
    }
    assert!(records_of(&m, "cat/demo/.SKILL.md.swp").is_empty());
}

/// The real vim, where there is one (the replays above run regardless):
/// two sessions, each saving twice, with vim's defaults (`writebackup`:
/// the original renamed to `SKILL.md~`, removed after the write) and with
/// `backup` and `backupcopy=yes`.
#[test]
fn a_real_vim_save_is_one_version() {
    let Some(vim) = ["vim", "nvim"].into_iter().find(|v| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {v}")])
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        eprintln!("no vim or nvim here: only the replays ran");
        return;
    };
    let m = with_skill("real-vim");
    let mut n = records_of(&m, SKILL).len();
    for (i, opts) in ["", "set backup backupcopy=yes"].iter().enumerate() {
        for save in 0..2 {
            let text = format!("session {i} save {save}");
            let out = std::process::Command::new(vim)
                .current_dir(m.path(DIR))
                // No vimrc, no viminfo; 'backupskip' would skip /tmp.
                .args(["-Es", "-u", "NONE", "-i", "NONE", "-N"])
                .args(["-c", "set backupskip= directory=. backupdir=."])
                .args(["-c", opts, "-c", &format!("$s/.*/{text}/"), "-c", "wq"])
                .arg("SKILL.md")
                .output()
                .unwrap();
            assert!(out.status.success(), "{vim}: {out:?}");
            let want = format!("---\nname: demo\n---\n{text}\n");
            n = assert_one_version(&m, n, &want);
        }
    }
    assert_eq!(names(&m.path(DIR)), ["SKILL.md", "SKILL.md~"]);
}

/// A file still open for writing when it is renamed to a backup name:
/// what it holds then is its version, kept before it leaves the versioned
/// tree (as for a rename to a hidden name).
#[test]
fn bytes_being_written_are_kept_when_renamed_to_a_backup_name() {
    let m = with_skill("backup-writer");
    let backup = m.path(DIR).join("SKILL.md~");
    let mut w = OpenOptions::new().write(true).open(m.path(SKILL)).unwrap();
    w.write_all(b"---\nname: demo\n---\nnot closed yet\n")
        .unwrap();
    fs::rename(m.path(SKILL), &backup).unwrap();
    let recs = records_of(&m, SKILL);
    let last = recs.iter().rev().find_map(|r| r["state"]["blob"].as_str());
    assert_eq!(
        m.blob(last.unwrap()),
        b"---\nname: demo\n---\nnot closed yet\n",
        "{recs:#?}"
    );
    drop(w);
    assert_no_scratch_in_log(&m);
}
