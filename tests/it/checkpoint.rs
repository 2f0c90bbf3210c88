//! The journal's checkpoint (`crates/model/src/checkpoint.rs`): a mount that loads the
//! fold from it sees exactly the history a mount that reads every record
//! sees, and a checkpoint that is damaged, stale or contradicted by the
//! journal is passed over, never trusted.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use common::{Mount, Rng, describe, seed, skillfs};
use sha2::Digest;

/// The daemon's setting by which every journal gets a checkpoint, not
/// only long ones.
const EVERY_JOURNAL: &[(&str, &str)] = &[("SKILLFS_CHECKPOINT_MIN", "1")];

/// Every id's tree through `.history/<id>`, and every directory's own
/// `.history` listing.
fn history(m: &Mount) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![m.path(".history")];
    while let Some(d) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(m.root()).unwrap().display().to_string();
            let what = if md.file_type().is_symlink() {
                format!("l {:?}", fs::read_link(&p).unwrap())
            } else if md.is_dir() {
                stack.push(p.clone());
                format!("d {:o} {}", md.mode() & 0o7777, md.mtime_nsec())
            } else {
                format!(
                    "f {:o} {} {:?}",
                    md.mode() & 0o7777,
                    md.mtime(),
                    fs::read(&p).unwrap()
                )
            };
            out.insert(rel, what);
        }
    }
    for d in ["cat", "cat/a", "cat/b"] {
        if let Ok(rd) = fs::read_dir(m.path(&format!("{d}/.history"))) {
            let mut ids: Vec<String> = rd
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            ids.sort();
            out.insert(format!("{d}/.history"), ids.join(" "));
        }
    }
    out
}

fn daemon_log(m: &Mount) -> String {
    fs::read_to_string(m.store().join("daemon.log")).unwrap_or_default()
}

fn churn(m: &Mount, rng: &mut Rng, n: usize) {
    for i in 0..n {
        let d = ["cat/a", "cat/b"][rng.below(2)];
        let f = format!("{d}/f{}.md", rng.below(6));
        match rng.below(10) {
            0 => {
                let _ = fs::remove_file(m.path(&f));
            }
            1 => {
                let _ = fs::rename(m.path(&f), m.path(&format!("{d}/moved{}.md", rng.below(3))));
            }
            2 => {
                let _ = fs::set_permissions(m.path(&f), fs::Permissions::from_mode(0o600));
            }
            3 => {
                let l = m.path(&format!("{d}/link{}", rng.below(2)));
                let _ = fs::remove_file(&l);
                symlink(format!("f{}.md", rng.below(6)), l).unwrap();
            }
            _ => fs::write(m.path(&f), format!("{i} {}\n", rng.next())).unwrap(),
        }
    }
}

fn segment(m: &Mount) -> std::path::PathBuf {
    fs::read_dir(m.store().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .unwrap()
}

fn flip(path: &Path, at: usize) {
    let mut b = fs::read(path).unwrap();
    b[at] ^= 0x20;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(path, b).unwrap();
}

#[test]
fn a_checkpoint_gives_the_same_history_or_is_passed_over() {
    // Every journal gets a checkpoint here, not only long ones.
    let mut m = Mount::with_env("checkpoint", EVERY_JOURNAL, |_| {});
    let mut rng = Rng(seed("SKILLFS_SEED"));
    fs::create_dir_all(m.path("cat/a")).unwrap();
    fs::create_dir_all(m.path("cat/b")).unwrap();
    churn(&m, &mut rng, 150);
    let forget = skillfs(&[
        "forget",
        "--keep-last",
        "60",
        "--root",
        m.root().to_str().unwrap(),
    ]);
    assert!(forget.status.success(), "{}", describe(&forget));
    churn(&m, &mut rng, 40);
    let before = history(&m);
    let log_before = m.log();
    m.umount();
    let cp = m.store().join("journal/checkpoint");
    assert!(cp.exists(), "no checkpoint written at unmount");

    // Loaded: the same trees, listings and log.
    m.remount();
    assert!(
        daemon_log(&m).contains("from the checkpoint"),
        "{}",
        daemon_log(&m)
    );
    assert_eq!(history(&m), before);
    assert_eq!(m.log(), log_before);

    // A stale checkpoint (the daemon killed: none written) and records
    // after it: still the same history as a whole read gives.
    churn(&m, &mut rng, 40);
    let with_more = history(&m);
    m.kill9();
    m.remount();
    let after_kill = history(&m);
    for (k, v) in &with_more {
        assert_eq!(after_kill.get(k), Some(v), "{k} after a kill");
    }
    m.umount();

    // A checkpoint whose bytes hold but whose records do not follow on
    // (its offset cut short, every CRC made to match): not believed, and
    // nothing of the journal is cut off as a torn tail.
    {
        m.remount();
        m.umount();
        let good = fs::read(&cp).unwrap();
        let seg = segment(&m);
        let journal = fs::read(&seg).unwrap();
        let third = journal
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(2)
            .unwrap()
            .0
            + 1;
        let mut forged = good.clone();
        forged[16..24].copy_from_slice(&(third as u64).to_le_bytes());
        let prefix = skillfs::store::journal::crc32(&journal[..third]);
        forged[24..28].copy_from_slice(&prefix.to_le_bytes());
        let n = forged.len() - 4;
        let sum = skillfs::store::journal::crc32(&forged[..n]);
        forged[n..].copy_from_slice(&sum.to_le_bytes());
        fs::write(&cp, &forged).unwrap();
        m.remount();
        assert!(
            daemon_log(&m).contains("does not match"),
            "{}",
            daemon_log(&m)
        );
        assert_eq!(
            fs::read(&seg).unwrap()[..journal.len()],
            journal[..],
            "the journal was cut"
        );
        m.umount();
    }

    // A damaged checkpoint is passed over: the journal is read whole.
    let whole = {
        m.remount();
        let h = history(&m);
        m.umount();
        h
    };
    let len = fs::metadata(&cp).unwrap().len() as usize;
    flip(&cp, len / 2);
    m.remount();
    assert!(daemon_log(&m).contains("fails its checksum"));
    assert_eq!(history(&m), whole);
    m.umount();

    // A journal changed under a sound checkpoint: the checkpoint is not
    // believed; the whole read finds the damage and refuses the mount.
    assert!(cp.exists());
    let seg = segment(&m);
    flip(&seg, 30);
    let root = m.root().display().to_string();
    let out = skillfs(&["mount", &root]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 1"),
        "{}",
        describe(&out)
    );
    flip(&seg, 30);
    m.remount();
    assert_eq!(history(&m), whole);
}

/// A chmod of the root is no version, and never makes the next mount find
/// the root "removed" (it then emptied every later tree), with or without
/// a checkpoint; a FIFO in the checkpoint's place blocks no command.
#[test]
fn the_root_is_never_removed_and_a_fifo_blocks_nothing() {
    // As in the other test of this binary (the same value, set before any
    // mount of either).
    let mut m = Mount::with_env("checkpoint-root", EVERY_JOURNAL, |_| {});
    fs::create_dir(m.path("x")).unwrap();
    fs::write(m.path("x/f"), "hi\n").unwrap();
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o700)).unwrap();
    m.umount();
    let cp = m.store().join("journal/checkpoint");
    let _ = fs::remove_file(&cp);
    m.remount();
    assert_eq!(fs::read(m.path(".history/latest/x/f")).unwrap(), b"hi\n");
    let ops: Vec<String> = m
        .log()
        .iter()
        .map(|r| r["op"].as_str().unwrap().to_string())
        .collect();
    assert!(!ops.contains(&"scan-remove".to_string()), "{ops:?}");
    m.umount();
    let _ = fs::remove_file(&cp);
    let c = std::ffi::CString::new(cp.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let root = m.root().display().to_string();
    let out = std::process::Command::new("timeout")
        .args([
            "20",
            env!("CARGO_BIN_EXE_skillfs"),
            "show",
            "latest:x/f",
            "--root",
            &root,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(out.stdout, b"hi\n");
    fs::remove_file(&cp).unwrap();

    // A checkpoint written whole (its CRCs hold) whose history is not the
    // journal's fold: `verify` names it.
    m.remount();
    m.umount();
    let mut bytes = fs::read(&cp).unwrap();
    let raw = sha2::Sha256::digest(b"hi\n");
    let at = bytes
        .windows(32)
        .position(|w| w == raw.as_slice())
        .expect("the blob of x/f");
    bytes[at] ^= 1;
    let n = bytes.len() - 4;
    let sum = skillfs::store::journal::crc32(&bytes[..n]);
    bytes[n..].copy_from_slice(&sum.to_le_bytes());
    fs::write(&cp, &bytes).unwrap();
    let out = skillfs(&["verify", "--root", &root]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("journal/checkpoint"),
        "{}",
        describe(&out)
    );
}

/// A change dated in the future (an old import, a clock that ran ahead)
/// moves no later change to its date: `@-1s` and `@<now>` name the newest
/// content whether the index is folded from the journal, loaded from a
/// checkpoint, or a checkpoint of the version before that held such a
/// date is passed over; `log` shows the time as recorded.
#[test]
fn a_change_dated_in_the_future_moves_no_later_change() {
    // As in the other tests of this binary.
    let mut m = Mount::with_env("checkpoint-future", EVERY_JOURNAL, |_| {});
    fs::create_dir_all(m.path("cat/s")).unwrap();
    for i in 1..=3 {
        fs::write(m.path("cat/s/SKILL.md"), format!("old {i}\n")).unwrap();
    }
    fs::write(m.path("cat/other.md"), "from the future\n").unwrap();
    m.umount();

    // The last record, dated 2200-01-01, as an import before the fix left it.
    const F: i64 = 7_258_118_400_000_000_000;
    let seg = segment(&m);
    let text = fs::read(&seg).unwrap();
    let mut lines: Vec<Vec<u8>> = text
        .split_inclusive(|&b| b == b'\n')
        .map(Vec::from)
        .collect();
    let last = lines.pop().unwrap();
    let mut rec = skillfs::store::journal::decode(&last[..last.len() - 1]).unwrap();
    assert_eq!(rec.path.to_string(), "cat/other.md");
    rec.ts = F;
    lines.push(skillfs::store::journal::encode(&rec));
    fs::set_permissions(&seg, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&seg, lines.concat()).unwrap();

    m.remount();
    for i in 1..=8 {
        fs::write(m.path("cat/s/SKILL.md"), format!("now v{i}\n")).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let root = m.root().display().to_string();
    let newest = |m: &Mount, how: &str| {
        let now = skillfs::time::format_utc(skillfs::time::now_ns());
        for alias in ["@-1s".to_string(), format!("@{now}")] {
            let p = m.path(&format!(".history/{alias}/cat/s/SKILL.md"));
            assert_eq!(fs::read_to_string(&p).unwrap(), "now v8\n", "{alias} {how}");
        }
        let out = skillfs(&["show", "--root", &root, "@-1s:cat/s/SKILL.md"]);
        assert!(out.status.success(), "{}", describe(&out));
        assert_eq!(out.stdout, b"now v8\n", "show @-1s {how}");
        let log = m.log();
        let future = log.iter().rfind(|r| r["path"] == "cat/other.md").unwrap();
        assert_eq!(future["ts"], F, "log shows the time recorded: {future}");
    };
    newest(&m, "folded from the journal");
    m.umount();

    let cp = m.store().join("journal/checkpoint");
    m.remount();
    assert!(
        daemon_log(&m).contains("from the checkpoint"),
        "{}",
        daemon_log(&m)
    );
    newest(&m, "loaded from a checkpoint");
    m.umount();

    // A checkpoint of the version before: not loaded, the journal is read.
    let mut bytes = fs::read(&cp).unwrap();
    bytes[..8].copy_from_slice(b"SKCKPT01");
    let n = bytes.len() - 4;
    let sum = skillfs::store::journal::crc32(&bytes[..n]);
    bytes[n..].copy_from_slice(&sum.to_le_bytes());
    fs::write(&cp, &bytes).unwrap();
    m.remount();
    assert!(
        daemon_log(&m).contains("another version"),
        "{}",
        daemon_log(&m)
    );
    newest(&m, "with a checkpoint of another version");
}
