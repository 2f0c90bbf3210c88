//! The agent's own history imported (issue 14): curator snapshots (made by
//! the agent's own `agent.curator_backup` where `SKILLFS_HERMES_PYTHON`
//! names its interpreter) and skill-ledger entries become the first ids,
//! and `.history/<id>` of each is the tree the agent had then, byte for
//! byte; damaged parts are one line each and leave no record, a hostile
//! snapshot member is refused alone; a kill
//! before the import's records are in place leaves nothing of it; `log`
//! shows the agent's words.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

/// The agent's interpreter if scripts/test.sh installed it, else python3
/// (the script then takes snapshots with the same `tarfile` calls).
fn python() -> String {
    std::env::var("SKILLFS_HERMES_PYTHON").unwrap_or_else(|_| {
        if std::env::var_os("CI").is_some() {
            panic!("SKILLFS_HERMES_PYTHON is not set: scripts/test.sh installs the agent for CI");
        }
        eprintln!("note: SKILLFS_HERMES_PYTHON not set: snapshots made without the agent's code");
        "python3".into()
    })
}

/// Runs tests/python/agent_history.py over the home `home`; its last
/// stdout line, as JSON.
fn make_history(home: &Path, mode: &str) -> Value {
    let script = format!(
        "{}/tests/python/agent_history.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = Command::new(python())
        .arg(script)
        .arg(home)
        .arg(mode)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "agent_history.py: {}", describe(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

/// `dir` as the script describes a tree: path -> kind, sha256, mode, target.
fn walk(dir: &Path) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_str().unwrap().to_string();
            let md = fs::symlink_metadata(&p).unwrap();
            let mode = std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o7777;
            let v = if md.file_type().is_symlink() {
                serde_json::json!({"type": "symlink", "target": fs::read_link(&p).unwrap()})
            } else if md.is_dir() {
                stack.push(p.clone());
                serde_json::json!({"type": "dir", "mode": mode})
            } else {
                let sha = sha256_hex(&fs::read(&p).unwrap());
                serde_json::json!({"type": "file", "sha256": sha, "mode": mode})
            };
            out.insert(rel, v);
        }
    }
    out
}

/// `got` equals the script's `want`: every path, kind, content and target;
/// modes too where `modes` (a snapshot keeps them; a ledger entry does
/// not say them).
fn same_tree(got: &BTreeMap<String, Value>, want: &Value, modes: bool, what: &str) {
    let want = want.as_object().unwrap();
    let paths = |m: Vec<&String>| m.into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(
        paths(got.keys().collect()),
        paths(want.keys().collect()),
        "{what}: the paths differ"
    );
    for (p, w) in want {
        let g = &got[p];
        assert_eq!(g["type"], w["type"], "{what}: {p}");
        assert_eq!(g["sha256"], w["sha256"], "{what}: the bytes of {p}");
        assert_eq!(g["target"], w["target"], "{what}: the target of {p}");
        if modes {
            assert_eq!(g["mode"], w["mode"], "{what}: the mode of {p}");
        }
    }
}

/// The id whose tree is the part `id`'s: its last record.
fn id_of(log: &[Value], part: &str) -> Option<u64> {
    log.iter()
        .filter(|r| r["origin"]["id"] == part)
        .map(|r| r["seq"].as_u64().unwrap())
        .max()
}

fn log_text(root: &Path) -> String {
    let out = skillfs(&["log", "--no-pager", "--root", root.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_agents_history_is_the_start_of_history_at_the_first_mount() {
    let s = Scratch::home("import");
    let made = make_history(&s.dir.join("home"), "good");
    let m = Mount::over(s, Vec::new());
    let log = m.log();
    let steps = made["steps"].as_array().unwrap();
    let mut last = 0;
    for step in steps {
        let part = step["id"].as_str().unwrap();
        let id = id_of(&log, part).unwrap_or_else(|| panic!("no record of {part}"));
        assert!(id > last, "{part} comes after the part before it");
        last = id;
        let snapshot = step["kind"] == "snapshot";
        let at = walk(&m.path(&format!(".history/{id}")));
        same_tree(
            &at,
            &step["tree"],
            snapshot,
            &format!("{} {part}", step["kind"]),
        );
    }
    // Imported records come first, then the scan of the live tree.
    let first_scan = log
        .iter()
        .position(|r| r["op"] != "import" && r["op"] != "import-remove");
    assert!(
        log[..first_scan.unwrap_or(log.len())]
            .iter()
            .all(|r| r["origin"].is_object() && r["actor"]["pid"] == 0)
    );
    assert_eq!(
        log.iter().filter(|r| r["origin"].is_object()).count(),
        first_scan.unwrap()
    );
    // The hand edit that no ledger entry tells: recorded by the scan.
    let scans: Vec<&Value> = log.iter().filter(|r| r["op"] == "scan").collect();
    assert!(
        scans.iter().any(|r| r["path"] == "cat/foo/references/a.md"),
        "{scans:?}"
    );
    same_tree(
        &walk(&m.path(".history/latest")),
        &made["live"],
        true,
        "latest",
    );
    // Times: each part at its own, oldest first, before the mount's.
    let ts: Vec<i64> = log.iter().map(|r| r["ts"].as_i64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");

    // log: the agent's words beside each imported operation.
    let text = log_text(&m.root());
    let words = [
        format!(
            "snapshot {}: pre-curator-run",
            steps[0]["id"].as_str().unwrap()
        ),
        format!(
            "ledger {}: agent patch foo",
            steps[1]["id"].as_str().unwrap()
        ),
        format!(
            "ledger {}: curator delete bar",
            steps[4]["id"].as_str().unwrap()
        ),
        format!(
            "ledger {}: user create baz",
            steps[5]["id"].as_str().unwrap()
        ),
    ];
    for w in &words {
        assert!(text.contains(w.as_str()), "log lacks '{w}':\n{text}");
    }
    let out = skillfs(&[
        "log",
        "--actor",
        "curator",
        "--root",
        m.root().to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("delete bar"));

    // undo finds the removal of a directory above a path (the ledger's
    // delete of cat/bar), not the snapshot that made the path.
    let root = m.root().to_str().unwrap().to_string();
    let out = skillfs(&[
        "undo",
        "--dry-run",
        "cat/bar/scripts/run.sh",
        "--root",
        &root,
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    // What the undo would do: bring the removed file back.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("restore cat/bar/scripts/run.sh") && text.contains("+echo bar"),
        "{text}"
    );

    // A version made through the mount, then the agent's ledger entry for
    // it: log pairs them when it is read.
    let skill = m.path("cat/foo/SKILL.md");
    let bytes = b"---\nname: foo\n---\nv3, through the mount\n";
    fs::write(&skill, bytes).unwrap();
    let entry = serde_json::json!({
        "id": "live00000001",
        "ts": chrono_now(),
        "actor": "agent",
        "action": "edit",
        "skill": "foo",
        "before": [],
        "after": [{"path": skill.to_str().unwrap(), "sha256": sha256_hex(bytes)}],
    });
    let mut ledger = fs::OpenOptions::new()
        .append(true)
        .open(m.path(".curator_ledger.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut ledger, format!("{entry}\n").as_bytes()).unwrap();
    let text = log_text(&m.root());
    let line = text.lines().last().unwrap();
    assert!(
        line.contains("cat/foo/SKILL.md") && line.contains("ledger live00000001: agent edit foo"),
        "{text}"
    );
}

/// Now as Python's `isoformat()` writes it.
fn chrono_now() -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let secs = skillfs::time::format_utc(ns);
    format!(
        "{}.{:06}+00:00",
        secs.trim_end_matches('Z'),
        (ns % 1_000_000_000) / 1000
    )
}

#[test]
fn damaged_parts_are_one_line_each_and_leave_no_record() {
    let s = Scratch::new("import-bad");
    let made = make_history(&s.dir, "damaged");
    let root = s.root().to_str().unwrap().to_string();
    let bad: Vec<&str> = made["bad"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap())
        .collect();
    let stderr_parts = |out: &std::process::Output| {
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let skipped: Vec<String> = err
            .lines()
            .filter(|l| l.ends_with("(skipped)"))
            .map(String::from)
            .collect();
        assert_eq!(skipped.len(), bad.len(), "{err}");
        for b in &bad {
            assert!(
                skipped
                    .iter()
                    .any(|l| l.starts_with(&format!("skillfs: {b}: "))),
                "no line for {b}:\n{err}"
            );
        }
        err
    };

    // A dry run says the same and makes nothing.
    let out = skillfs(&["import", &root, "--dry-run"]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    stderr_parts(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("would import")
            .count(),
        3
    );
    common::assert_enoent(s.store());

    let out = skillfs(&["import", &root]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let err = stderr_parts(&out);
    assert!(err.contains("absolute") && err.contains("'..'"), "{err}");
    assert!(
        err.contains("holds other bytes") && err.contains("missing"),
        "{err}"
    );
    // Into a store with history, never.
    let again = skillfs(&["import", &root]);
    assert_refused(&again, 4, &["already holds history"]);
    let imported: usize = fs::read_dir(s.store().join("journal"))
        .unwrap()
        .map(|e| fs::read(e.unwrap().path()).unwrap())
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .sum();

    let m = Mount::over(s, Vec::new());
    let log = m.log();
    let origins: Vec<&str> = log
        .iter()
        .filter_map(|r| r["origin"]["id"].as_str())
        .collect();
    let good: Vec<&str> = made["good"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap())
        .collect();
    assert!(origins.iter().all(|o| good.contains(o)), "{origins:?}");
    for g in &good {
        assert!(origins.contains(g), "{g} was not imported: {origins:?}");
    }
    // The good entry's content is history.
    let id = id_of(&log, "good00000001").unwrap();
    assert_eq!(
        fs::read(m.path(&format!(".history/{id}/cat/foo/SKILL.md"))).unwrap(),
        b"---\nname: foo\n---\nv2\n"
    );
    // The snapshot with one member out of the root kept its other one.
    assert!(
        err.contains("member '../evil' climbs out with '..' (refused)"),
        "{err}"
    );
    assert!(
        log.iter()
            .any(|r| r["path"] == "cat/ok.md" && r["origin"]["id"] == "2020-01-01T00-00-02Z")
    );
    // The import went in before this mount, which imported nothing more.
    assert!(imported > 0);
    assert!(log[..imported].iter().all(|r| r["origin"].is_object()));
    assert!(log[imported..].iter().all(|r| r["origin"].is_null()));
}

#[test]
fn an_import_killed_before_its_records_are_in_place_leaves_nothing_of_it() {
    let s = Scratch::new("import-kill");
    make_history(&s.dir, "good");
    let root = s.root().to_str().unwrap().to_string();
    let out = skillfs(&["import", &root]);
    assert!(out.status.success(), "{}", describe(&out));
    let journal = s.store().join("journal");
    let seg = fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .unwrap();
    let whole = fs::read(&seg).unwrap();
    let lines = whole.iter().filter(|&&b| b == b'\n').count();
    // As a kill leaves it before the rename: the records half written in
    // tmp/import/, the journal empty.
    fs::create_dir_all(s.store().join("tmp/import")).unwrap();
    fs::write(
        s.store().join("tmp/import").join(seg.file_name().unwrap()),
        &whole[..whole.len() / 2],
    )
    .unwrap();
    fs::write(&seg, b"").unwrap();
    let m = Mount::over(s, Vec::new());
    let log = m.log();
    let imported = log.iter().filter(|r| r["origin"].is_object()).count();
    assert_eq!(imported, lines, "the whole import, once");
    common::assert_enoent(m.store().join("tmp/import"));
    assert!(log[imported..].iter().all(|r| r["origin"].is_null()));
}

/// A ledger entry dated in the future is recorded as of the import, and
/// says so: the journal holds no future time, and `@-1s` after changes
/// made since names the newest content, not the last before that date.
#[test]
fn a_part_dated_in_the_future_is_recorded_as_of_the_import() {
    let s = Scratch::home("import-future");
    let root = s.root();
    let home = s.mount_point();
    let blobs = home.join(".curator_backups/blobs");
    fs::create_dir_all(&blobs).unwrap();
    fs::create_dir_all(root.join("cat/s")).unwrap();
    let mut ledger = String::new();
    let dated = [
        ("2026-05-01T10:00:00+00:00", "cat/s/SKILL.md", "old 1\n"),
        ("2026-05-02T10:00:00+00:00", "cat/s/SKILL.md", "old 2\n"),
        ("2026-05-03T10:00:00+00:00", "cat/s/SKILL.md", "old 3\n"),
        ("2200-01-01T00:00:00+00:00", "cat/s/other.md", "future\n"),
    ];
    for (i, (ts, path, text)) in dated.iter().enumerate() {
        let sha = sha256_hex(text.as_bytes());
        fs::write(blobs.join(&sha), text).unwrap();
        let entry = serde_json::json!({
            "id": format!("fut{i:09}"),
            "ts": ts,
            "actor": "agent",
            "action": "edit",
            "skill": "s",
            "before": [],
            "after": [{"path": root.join(path).to_str().unwrap(), "sha256": sha}],
        });
        ledger.push_str(&format!("{entry}\n"));
    }
    fs::write(root.join(".curator_ledger.jsonl"), ledger).unwrap();
    fs::write(root.join("cat/s/SKILL.md"), "old 3\n").unwrap();
    fs::write(root.join("cat/s/other.md"), "future\n").unwrap();

    let before = skillfs::time::now_ns();
    let out = skillfs(&["import", home.to_str().unwrap(), "--versioned", "skills"]);
    assert!(out.status.success(), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("fut000000003") && said.contains("dated 2200-01-01T00:00:00Z, after now"),
        "{said}"
    );

    let m = Mount::over(s, Vec::new());
    let log = m.log();
    let future = log
        .iter()
        .find(|r| r["origin"]["id"] == "fut000000003")
        .expect("the entry is imported");
    let ts = future["ts"].as_i64().unwrap();
    assert!(
        ts >= before && ts <= skillfs::time::now_ns(),
        "recorded as of the import: {future}"
    );
    for i in 1..=8 {
        fs::write(m.path("cat/s/SKILL.md"), format!("now v{i}\n")).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let now = skillfs::time::format_utc(skillfs::time::now_ns());
    for alias in ["@-1s".to_string(), format!("@{now}")] {
        let p = m.path(&format!(".history/{alias}/cat/s/SKILL.md"));
        assert_eq!(fs::read_to_string(&p).unwrap(), "now v8\n", "{alias}");
    }
}

/// An entry that names one large blob many times reads it as a stream,
/// once to check and once to store: the import's memory stays a buffer's
/// (here under an address-space limit far below the blob times the names).
#[test]
fn an_entry_naming_one_large_blob_many_times_holds_none_of_it_in_memory() {
    let s = Scratch::home("import-amplified");
    let root = s.root();
    let home = s.mount_point();
    let blobs = home.join(".curator_backups/blobs");
    fs::create_dir_all(&blobs).unwrap();
    let big: Vec<u8> = (0..32u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let sha = sha256_hex(&big);
    fs::write(blobs.join(&sha), &big).unwrap();
    let after: Vec<Value> = (0..20)
        .map(|i| serde_json::json!({"path": root.join(format!("cat/s/f{i}.bin")), "sha256": sha}))
        .collect();
    let entry = serde_json::json!({
        "id": "big000000001",
        "ts": "2026-05-01T10:00:00+00:00",
        "actor": "agent",
        "action": "edit",
        "skill": "s",
        "before": [],
        "after": after,
    });
    fs::write(root.join(".curator_ledger.jsonl"), format!("{entry}\n")).unwrap();
    let home = home.to_str().unwrap();
    let import = |dry: &str| {
        // 384 MiB of address space: 20 copies of the blob are 640 MiB.
        let script =
            format!("ulimit -v 393216; exec \"$0\" import \"$1\" --versioned skills {dry}");
        Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_skillfs"), home])
            .output()
            .unwrap()
    };
    let out = import("--dry-run");
    assert!(out.status.success(), "{}", describe(&out));
    let out = import("");
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("big000000001"),
        "{}",
        describe(&out)
    );
    let m = Mount::over(s, Vec::new());
    let id = id_of(&m.log(), "big000000001").unwrap();
    for i in [0, 19] {
        let p = m.path(&format!(".history/{id}/cat/s/f{i}.bin"));
        assert!(fs::read(&p).unwrap() == big, "f{i}.bin");
    }
}

/// A curator snapshot that unpacks to far more than its size (a gzip bomb)
/// is one damaged part, found before its content is stored: the store does
/// not fill the disk, and the other parts are imported.
#[test]
fn a_gzip_bomb_snapshot_is_skipped_before_it_is_stored() {
    let s = Scratch::home("import-bomb");
    let root = s.root();
    let home = s.mount_point();
    let src = s.dir.join("src");
    fs::create_dir_all(src.join("cat/s")).unwrap();
    fs::write(src.join("cat/s/SKILL.md"), "x\n").unwrap();
    for (id, bomb) in [
        ("2026-05-01T13-00-00Z", true),
        ("2026-05-02T13-00-00Z", false),
    ] {
        let dir = root.join(".curator_backups").join(id);
        fs::create_dir_all(&dir).unwrap();
        let f = fs::File::create(src.join("cat/s/bomb.bin")).unwrap();
        // 32 MiB of zeros: a few tens of KB gzipped.
        f.set_len(if bomb { 32 << 20 } else { 0 }).unwrap();
        let out = Command::new("sh")
            .args(["-c", "cd \"$0\" && tar cf - cat | gzip -1 > \"$1\""])
            .arg(&src)
            .arg(dir.join("skills.tar.gz"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", describe(&out));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_skillfs"))
        .args(["import", home.to_str().unwrap(), "--versioned", "skills"])
        .env("SKILLFS_UNPACK_MIN", (4u64 << 20).to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("snapshot 2026-05-01T13-00-00Z: it unpacks to more than")
            && err.contains("gzip bomb"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("snapshot 2026-05-02T13-00-00Z"),
        "{}",
        describe(&out)
    );
    let stored: u64 = walk_sizes(&s.store());
    assert!(stored < 4 << 20, "the store holds {stored} bytes");
}

fn walk_sizes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            let md = fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                walk_sizes(&e.path())
            } else {
                md.len()
            }
        })
        .sum()
}

/// A snapshot with one hostile member of each kind: an absolute name, a
/// `..`, a symlink leading out of the root and a member through it.
const HOSTILE: &str = r#"
import io, sys, tarfile
dest, outside, absolute = sys.argv[1:4]
def member(tf, name, data=None, link=None):
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.size = len(data)
    tf.addfile(info, io.BytesIO(data) if data is not None else None)
with tarfile.open(dest, "w:gz") as tf:
    member(tf, "cat")
    member(tf, "cat/foo")
    member(tf, "cat/foo/SKILL.md", b"---\nname: foo\n---\ngood\n")
    member(tf, "../evil", b"evil")
    member(tf, absolute, b"evil")
    member(tf, "cat/out", link=outside)
    member(tf, "cat/out/evil", b"evil")
    member(tf, "cat/foo/notes.md", b"after the hostile ones\n")
"#;

#[test]
fn a_snapshot_with_hostile_members_imports_the_others_and_refuses_each_by_name() {
    let s = Scratch::new("import-hostile");
    let root = s.root();
    let outside = s.dir.join("outside");
    fs::create_dir(&outside).unwrap();
    // A name no test could own; the import must not create it.
    let absolute = format!("/skillfs-hostile-{}/evil", std::process::id());
    let id = "2020-01-01T00-00-05Z";
    let snap = root.join(".curator_backups").join(id);
    fs::create_dir_all(&snap).unwrap();
    let out = Command::new(python())
        .args(["-c", HOSTILE])
        .arg(snap.join("skills.tar.gz"))
        .arg(&outside)
        .arg(&absolute)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{}", describe(&out));

    let refused_lines = |out: &std::process::Output| {
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let refused: Vec<&str> = err.lines().filter(|l| l.ends_with("(refused)")).collect();
        assert_eq!(refused.len(), 3, "{err}");
        for name in ["'../evil'", &format!("'{absolute}'"), "'cat/out/evil'"] {
            assert!(
                refused
                    .iter()
                    .any(|l| l.starts_with(&format!("skillfs: snapshot {id}: member {name}"))),
                "no line for {name}:\n{err}"
            );
        }
        assert!(!err.contains("(skipped)"), "{err}");
        err
    };
    let r = root.to_str().unwrap();
    let dry = skillfs(&["import", r, "--dry-run"]);
    assert_eq!(dry.status.code(), Some(5), "{}", describe(&dry));
    refused_lines(&dry);
    let out = skillfs(&["import", r]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    let err = refused_lines(&out);
    assert!(err.contains("3 member(s) refused"), "{err}");

    // Nothing landed outside the root.
    assert_eq!(names(&outside), Vec::<String>::new());
    assert!(!s.dir.join("evil").exists() && !root.join("evil").exists());
    assert!(!Path::new(&absolute).exists());

    // Every good member is history; the link is kept as a link.
    let m = Mount::over(s, Vec::new());
    let log = m.log();
    let last = id_of(&log, id).expect("the snapshot was imported");
    let h = |p: &str| m.path(&format!(".history/{last}/{p}"));
    assert_eq!(
        fs::read(h("cat/foo/SKILL.md")).unwrap(),
        b"---\nname: foo\n---\ngood\n"
    );
    assert_eq!(
        fs::read(h("cat/foo/notes.md")).unwrap(),
        b"after the hostile ones\n"
    );
    assert_eq!(fs::read_link(h("cat/out")).unwrap(), outside);
    let paths: Vec<&str> = log.iter().filter_map(|r| r["path"].as_str()).collect();
    assert!(!paths.iter().any(|p| p.contains("evil")), "{paths:?}");
    assert_eq!(names(&outside), Vec::<String>::new());
}
