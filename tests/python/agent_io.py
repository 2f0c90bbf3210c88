#!/usr/bin/env python3
"""Replays the file calls Hermes Agent makes on its skills directory against
a mounted skillfs, checking contents byte-exact and the journal's versions.

usage: agent_io.py ROOT        (SKILLFS_BIN names the skillfs binary)
Exits non-zero on the first failed check, naming it.
"""
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(sys.argv[1])
BIN = os.environ["SKILLFS_BIN"]


def log():
    out = subprocess.run([BIN, "log", "--json", "--root", str(ROOT)],
                         check=True, capture_output=True).stdout.decode()
    return [json.loads(l) for l in out.splitlines()]


def blobs_of(path):
    return [r["state"]["blob"] for r in log()
            if r.get("path") == path and r.get("state", {}).get("blob")]


def sha(b):
    return hashlib.sha256(b).hexdigest()


def atomic_write(path: Path, data: bytes, prefix: str):
    """The agent's atomic write: mkstemp in the same dir, fsync, os.replace."""
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def skill_md(name, body="body"):
    return "---\nname: %s\ndescription: test skill %s\n---\n\n# %s\n\n%s\n" % (name, name, name, body)


def scenario_write_text_versions():
    p = ROOT / "cat" / "alpha" / "SKILL.md"
    p.parent.mkdir(parents=True, exist_ok=True)
    for v in range(3):
        p.write_text(skill_md("alpha", "v%d" % v))
    assert p.read_text() == skill_md("alpha", "v2")
    have = set(blobs_of("cat/alpha/SKILL.md"))
    for v in range(3):
        assert sha(skill_md("alpha", "v%d" % v).encode()) in have, "version %d missing" % v


def scenario_atomic_replace():
    p = ROOT / "cat" / "alpha" / "SKILL.md"
    new = skill_md("alpha", "atomic").encode()
    atomic_write(p, new, ".SKILL.md.tmp.")
    assert p.read_bytes() == new
    assert not [n for n in os.listdir(p.parent) if n.endswith(".tmp")], "temp file left behind"
    # The temp file was hidden; replacing SKILL.md with it makes it visible.
    recs = [r for r in log() if r["op"] == "unpark" and r.get("path") == "cat/alpha/SKILL.md"]
    assert recs, "the replace was not journaled"
    assert recs[-1]["hidden"].startswith("cat/alpha/.SKILL.md.tmp."), recs[-1]
    assert sha(new) in {r["state"]["blob"] for r in log() if r.get("state", {}).get("blob")}


def scenario_copytree_rmtree():
    src = Path(tempfile.mkdtemp(prefix="agent-src-"))
    try:
        (src / "beta" / "references").mkdir(parents=True)
        (src / "beta" / "SKILL.md").write_text(skill_md("beta"))
        (src / "beta" / "references" / "r.md").write_bytes(os.urandom(30000))
        (src / "beta" / "scripts").mkdir()
        (src / "beta" / "scripts" / "run.py").write_text("print('hi')\n")
        os.chmod(src / "beta" / "scripts" / "run.py", 0o755)
        os.utime(src / "beta" / "SKILL.md", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
        dst = ROOT / "cat" / "beta"
        shutil.copytree(src / "beta", dst)
        for f in ["SKILL.md", "references/r.md", "scripts/run.py"]:
            assert (dst / f).read_bytes() == (src / "beta" / f).read_bytes(), f
        assert os.stat(dst / "scripts" / "run.py").st_mode & 0o777 == 0o755
        assert os.stat(dst / "SKILL.md").st_mtime_ns == 1_600_000_000_123_456_789
        # The skills_sync dance: rename to .bak, copy the new version, rmtree.
        os.rename(dst, ROOT / "cat" / "beta.bak")
        (src / "beta" / "SKILL.md").write_text(skill_md("beta", "v2"))
        shutil.copytree(src / "beta", dst)
        shutil.rmtree(ROOT / "cat" / "beta.bak")
        assert not (ROOT / "cat" / "beta.bak").exists()
        assert (dst / "SKILL.md").read_text() == skill_md("beta", "v2")
        # The removed copy's content is still in history.
        assert sha(skill_md("beta").encode()) in set(blobs_of("cat/beta/SKILL.md"))
    finally:
        shutil.rmtree(src)


def scenario_walk_and_load():
    found = {}
    for dirpath, dirnames, filenames in os.walk(ROOT, followlinks=True):
        if "SKILL.md" in filenames:
            with open(os.path.join(dirpath, "SKILL.md")) as f:
                head = f.read(4096)
            name = [l for l in head.splitlines() if l.startswith("name:")][0][5:].strip()
            found.setdefault(name, []).append(os.path.relpath(dirpath, ROOT))
    assert found == {"alpha": ["cat/alpha"], "beta": ["cat/beta"]}, found


def scenario_locks_usage_and_ledger():
    locks = ROOT / ".locks"
    locks.mkdir(exist_ok=True)
    with open(locks / ("%s.lock" % sha(b"alpha")[:16]), "a+") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        usage = ROOT / ".usage.json"
        for n in range(3):
            atomic_write(usage, json.dumps({"alpha": {"uses": n}}).encode(), ".usage_")
        ledger = ROOT / ".curator_ledger.jsonl"
        with open(ledger, "a") as f:
            f.write(json.dumps({"event": "patched", "skill": "alpha"}) + "\n")
        with open(ledger, "a") as f:
            f.write(json.dumps({"event": "used", "skill": "alpha"}) + "\n")
        fcntl.flock(lf, fcntl.LOCK_UN)
    assert json.loads((ROOT / ".usage.json").read_text()) == {"alpha": {"uses": 2}}
    lines = (ROOT / ".curator_ledger.jsonl").read_text().splitlines()
    assert [json.loads(l)["event"] for l in lines] == ["patched", "used"]


def scenario_o_excl_nofollow_patch():
    d = ROOT / "cat" / "alpha"
    tmp = d / (".SKILL.md.tmp.%s" % os.urandom(4).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, skill_md("alpha", "patched").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, d / "SKILL.md")
    assert (d / "SKILL.md").read_text() == skill_md("alpha", "patched")
    try:
        os.open(d / "SKILL.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        raise AssertionError("O_EXCL create of an existing file succeeded")
    except FileExistsError:
        pass


SCENARIOS = [
    scenario_write_text_versions,
    scenario_atomic_replace,
    scenario_copytree_rmtree,
    scenario_walk_and_load,
    scenario_locks_usage_and_ledger,
    scenario_o_excl_nofollow_patch,
]

if __name__ == "__main__":
    passed = 0
    for s in SCENARIOS:
        try:
            s()
        except Exception as e:  # report which scenario and why, then fail
            print("FAIL %s: %r" % (s.__name__, e))
            print("%d passed, 1 failed" % passed)
            sys.exit(1)
        print("ok %s" % s.__name__)
        passed += 1
    print("%d passed, 0 failed" % passed)
