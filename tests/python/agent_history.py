"""The agent's own history, made as the agent makes it, for the import tests.

Usage: agent_history.py HERMES_HOME (good|damaged)

Curator snapshots come from the agent's own agent.curator_backup when this
interpreter has it (the venv of scripts/test.sh), else from the same calls
it makes (tarfile "w:gz", one member per top-level entry, arcname relative
to skills/, manifest.json). Ledger entries are written in the agent's
skill-ledger format (hermes-agent 0.19.0 has no ledger module yet): one
JSON object a line with id, ts (isoformat, UTC), actor, action, skill,
evidence and before/after lists of {path, sha256}, every content stored as
HERMES_HOME/.curator_backups/blobs/<sha256>.

"good": prints one JSON object: "steps", each a part of the history in
order (kind snapshot or ledger, its id, and the tree the skills directory
had just after it, as the mount versions it), and "agent" (whether the
agent's own snapshot code ran). "damaged": good parts and damaged ones;
prints {"good": [ids], "bad": [parts]}.
"""

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

HOME = Path(sys.argv[1])
MODE = sys.argv[2]
SKILLS = HOME / "skills"
BACKUPS = SKILLS / ".curator_backups"
LEDGER = SKILLS / ".curator_ledger.jsonl"
BLOBS = HOME / ".curator_backups" / "blobs"
os.environ["HERMES_HOME"] = str(HOME)

try:
    from agent import curator_backup  # the real agent's
except ImportError:
    curator_backup = None


def utc_id():
    s = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    return s[:-6].replace(":", "-") + "Z"


def snapshot(reason):
    """A curator snapshot; returns its id."""
    if curator_backup is not None:
        dest = curator_backup.snapshot_skills(reason=reason)
        assert dest is not None, "the agent took no snapshot"
        return dest.name
    base = utc_id()
    snap_id, n = base, 1
    while (BACKUPS / snap_id).exists():
        snap_id, n = f"{base}-{n:02d}", n + 1
    dest = BACKUPS / snap_id
    dest.mkdir(parents=True)
    with tarfile.open(dest / "skills.tar.gz", "w:gz", compresslevel=6) as tf:
        for entry in sorted(SKILLS.iterdir()):
            if entry.name in {".curator_backups", ".hub"}:
                continue
            tf.add(str(entry), arcname=entry.name, recursive=True)
    manifest = {
        "id": snap_id,
        "reason": reason,
        "created_at": datetime.now(timezone.utc).isoformat(),
        "archive": "skills.tar.gz",
        "archive_bytes": (dest / "skills.tar.gz").stat().st_size,
        "skill_files": sum(1 for _ in SKILLS.rglob("SKILL.md")),
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return snap_id


def store_blob(data):
    digest = hashlib.sha256(data).hexdigest()
    BLOBS.mkdir(parents=True, exist_ok=True)
    (BLOBS / digest).write_bytes(data)
    return digest


def capture(root):
    """{path, sha256} of every file under root (the ledger's snapshot_paths)."""
    root = Path(root)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file())
    else:
        return []
    return [{"path": str(f), "sha256": store_blob(f.read_bytes())} for f in files]


def append(action, skill, before, after, actor="agent", entry_id=None):
    entry = {
        "id": entry_id or uuid.uuid4().hex[:12],
        "ts": datetime.now(timezone.utc).isoformat(),
        "actor": actor,
        "action": action,
        "skill": skill,
        "evidence": {},
        "before": before or [],
        "after": after or [],
    }
    with open(LEDGER, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return entry["id"]


def tree():
    """The skills directory as the mount versions it (hidden and untracked out)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(SKILLS):
        rel_dir = os.path.relpath(dirpath, SKILLS)
        dirnames[:] = [d for d in dirnames if not (rel_dir == "." and d == ".curator_backups")
                       and not d.endswith(".bak")]
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel in (".curator_ledger.jsonl", ".usage.json"):
                continue
            st = os.lstat(full)
            if os.path.islink(full):
                out[rel] = {"type": "symlink", "target": os.readlink(full)}
            elif os.path.isdir(full):
                out[rel] = {"type": "dir", "mode": st.st_mode & 0o7777}
            else:
                data = open(full, "rb").read()
                out[rel] = {"type": "file", "sha256": hashlib.sha256(data).hexdigest(),
                            "mode": st.st_mode & 0o7777}
    return out


def write(rel, text, mode=None):
    p = SKILLS / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    if mode is not None:
        os.chmod(p, mode)


def tick():
    # Python's clock and the snapshot ids: keep each part in its own instant.
    time.sleep(0.05)


def good():
    steps = []
    write("cat/DESCRIPTION.md", "a category\n")
    write("cat/foo/SKILL.md", "---\nname: foo\n---\nv1\n")
    write("cat/foo/references/a.md", "reference a\n")
    write("cat/bar/SKILL.md", "---\nname: bar\n---\nbar\n")
    write("cat/bar/scripts/run.sh", "#!/bin/sh\necho bar\n", 0o755)
    os.symlink("foo", SKILLS / "cat/link")
    write("cat/old.bak/SKILL.md", "stale backup, hidden\n")
    write(".usage.json", "{}\n")
    write(".curator_state", "last run\n")
    steps.append({"kind": "snapshot", "id": snapshot("pre-curator-run"), "tree": tree()})
    tick()

    foo = SKILLS / "cat/foo"
    before = capture(foo / "SKILL.md")
    write("cat/foo/SKILL.md", "---\nname: foo\n---\nv2, patched\n")
    steps.append({"kind": "ledger", "id": append("patch", "foo", before, capture(foo / "SKILL.md")),
                  "tree": tree()})
    tick()

    before = capture(foo)
    write("cat/foo/scripts/x.py", "print('x')\n")
    steps.append({"kind": "ledger", "id": append("write_file", "foo", before, capture(foo)),
                  "tree": tree()})
    tick()

    steps.append({"kind": "snapshot", "id": snapshot("manual"), "tree": tree()})
    tick()

    bar = SKILLS / "cat/bar"
    before = capture(bar)
    shutil.rmtree(bar)
    steps.append({"kind": "ledger", "id": append("delete", "bar", before, [], actor="curator"),
                  "tree": tree()})
    tick()

    write("cat/baz/SKILL.md", "---\nname: baz\n---\nnew\n")
    steps.append({"kind": "ledger",
                  "id": append("create", "baz", [], capture(SKILLS / "cat/baz"), actor="user"),
                  "tree": tree()})
    tick()

    # Edited by hand with no ledger entry: only the mount's scan sees it.
    write("cat/foo/references/a.md", "reference a, edited by hand\n")
    print(json.dumps({"steps": steps, "agent": curator_backup is not None, "live": tree()}))


def bad_snapshot(snap_id, members):
    """A snapshot directory whose archive holds `members` (name, bytes)."""
    dest = BACKUPS / snap_id
    dest.mkdir(parents=True)
    with tarfile.open(dest / "skills.tar.gz", "w:gz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def damaged():
    write("cat/foo/SKILL.md", "---\nname: foo\n---\nv1\n")
    good_ids = [snapshot("pre-curator-run")]
    bad = []
    # A snapshot cut short: its gzip trailer missing.
    cut = BACKUPS / "2020-01-01T00-00-01Z"
    cut.mkdir(parents=True)
    whole = (BACKUPS / good_ids[0] / "skills.tar.gz").read_bytes()
    (cut / "skills.tar.gz").write_bytes(whole[: len(whole) - 9])
    bad.append("snapshot 2020-01-01T00-00-01Z")
    # A hostile member is refused, the rest taken; with no other member,
    # the snapshot is damaged.
    bad_snapshot("2020-01-01T00-00-02Z", [("cat/ok.md", b"ok"), ("../evil", b"evil")])
    good_ids.append("2020-01-01T00-00-02Z")
    bad_snapshot("2020-01-01T00-00-03Z", [("/etc/evil", b"evil")])
    bad.append("snapshot 2020-01-01T00-00-03Z")
    (BACKUPS / "2020-01-01T00-00-04Z").mkdir()
    bad.append("snapshot 2020-01-01T00-00-04Z")
    tick()

    skill = SKILLS / "cat/foo/SKILL.md"
    before = capture(skill)
    write("cat/foo/SKILL.md", "---\nname: foo\n---\nv2\n")
    good_ids.append(append("patch", "foo", before, capture(skill), entry_id="good00000001"))
    with open(LEDGER, "a") as fh:
        fh.write("this line is not JSON\n")
    bad.append("ledger line 2")
    missing = {"path": str(skill), "sha256": "0" * 64}
    append("patch", "foo", [], [missing], entry_id="missingblob1")
    bad.append("ledger entry missingblob1 (line 3)")
    liar = "1" * 64
    BLOBS.mkdir(parents=True, exist_ok=True)
    (BLOBS / liar).write_bytes(b"these bytes do not hash to the name\n")
    append("patch", "foo", [], [{"path": str(skill), "sha256": liar}], entry_id="wronghash001")
    bad.append("ledger entry wronghash001 (line 4)")
    outside = {"path": "/somewhere/else/SKILL.md", "sha256": store_blob(b"x")}
    append("patch", "foo", [], [outside], entry_id="outside00001")
    bad.append("ledger entry outside00001 (line 5)")
    print(json.dumps({"good": good_ids, "bad": bad}))


if MODE == "good":
    good()
else:
    damaged()
