#!/usr/bin/env python3
"""Replays Hermes Agent's backup, park and rollback call sequences against a
mounted skillfs and checks the loader invariant L after every step: a walk
of the mount with the loader's pruning finds each skill name exactly once,
at its live path. Where stated, contents are checked byte for byte.

usage: agent_sequences.py ROOT SCENARIO [--kill-at K]
  env SKILLFS_BIN: the skillfs binary; SKILLFS_STORE: the mount's store.
With --kill-at K the daemon is SIGKILLed after step K (modulo the number
of steps) and remounted; then L
must hold and no content visible before the kill may be lost (it is live or
in the journal). Prints "N passed, 0 failed" and exits 0, or names the
failed check and exits 1.
"""
import atexit
import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(sys.argv[1])
SCENARIO = sys.argv[2]
KILL_AT = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--kill-at" else None
BIN = os.environ["SKILLFS_BIN"]
STORE = Path(os.environ["SKILLFS_STORE"])

# The loader's pruning (hermes agent skills loader).
PRUNE = {".git", ".github", ".hub", ".archive", ".venv", "venv", "node_modules",
         "site-packages", "__pycache__", ".tox", ".nox", ".pytest_cache", ".mypy_cache",
         ".ruff_cache", "_org"}
SUPPORT = {"references", "templates", "assets", "scripts"}
HIDDEN_PATTERNS = (".bak", ".rollback-broken")


def scratch(prefix):
    """A temporary directory outside the mount, removed when the script ends
    (a scenario stopped by a daemon kill skips its own clean-up)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, d, True)
    return d


def skill_md(name, body="body"):
    return ("---\nname: %s\ndescription: %s skill\n---\n\n# %s\n\n%s\n" % (name, name, name, body)).encode()


def loader_walk():
    """(name, dir relative to ROOT) for every SKILL.md the loader would load,
    in the loader's order (paths sorted as plain strings)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT, followlinks=True):
        dirnames[:] = [d for d in dirnames if d not in PRUNE]
        if "SKILL.md" in filenames:
            dirnames[:] = [d for d in dirnames if d not in SUPPORT]
            found.append(os.path.join(dirpath, "SKILL.md"))
    out = []
    for p in sorted(found):
        with open(p, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
        name = None
        for line in head.splitlines()[1:]:
            if line.startswith("---"):
                break
            if line.startswith("name:"):
                name = line[5:].strip()
                break
        out.append((name, os.path.relpath(os.path.dirname(p), ROOT)))
    return out


def visible_names():
    """Every name a recursive listing of the visible tree shows."""
    names = []
    for dirpath, dirnames, filenames in os.walk(ROOT, followlinks=False):
        for n in dirnames + filenames:
            names.append(os.path.relpath(os.path.join(dirpath, n), ROOT))
    return names


def is_hidden_name(rel):
    parts = rel.split("/")
    for i, n in enumerate(parts):
        if n.endswith(HIDDEN_PATTERNS) or n.startswith(".rollback-staging-") \
                or n in (".skill-rollback-asides", ".history") \
                or (n.startswith(".") and (n.endswith(".tmp") or ".tmp." in n)) \
                or (i == 0 and n in (".curator_backups", ".locks", ".usage.json.lock")):
            return True
    return False


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


def check_L(expected, step):
    got = loader_walk()
    names = [n for n, _ in got]
    for name, where in expected.items():
        check(names.count(name) == 1, "step %s: skill %r found %d times: %r" % (step, name, names.count(name), got))
        check((name, where) in got, "step %s: skill %r not at %r: %r" % (step, name, where, got))
    check(len(got) == len(expected), "step %s: unexpected skills loaded: %r" % (step, got))
    leaked = [n for n in visible_names() if is_hidden_name(n)]
    check(not leaked, "step %s: hidden names listed: %r" % (step, leaked))


def tree_bytes(top):
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, top)] = Path(p).read_bytes()
    return out


def make_skill(path, name, extra=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "SKILL.md").write_bytes(skill_md(name))
    for rel, data in (extra or {}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)


def atomic_write(path, data, prefix, mode=None):
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=prefix, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if mode is not None:
        os.chmod(path, mode)


# ------------------------------------------------------------ daemon kill

def journal_blobs():
    out = subprocess.run([BIN, "log", "--json", "--root", str(ROOT)], check=True,
                         capture_output=True).stdout.decode()
    return {json.loads(l).get("state", {}).get("blob") for l in out.splitlines()}


def kill_daemon_and_remount():
    pid = int((STORE / "LOCK").read_text().strip())
    os.kill(pid, signal.SIGKILL)
    with open(STORE / "LOCK") as lock:
        deadline = time.time() + 10
        while True:  # the lock drops when the dying daemon's files are closed
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(lock, fcntl.LOCK_UN)
                break
            except BlockingIOError:
                check(time.time() < deadline, "daemon did not die")
                time.sleep(0.005)
    subprocess.run(["umount", "-l", str(ROOT)], capture_output=True)
    subprocess.run(["fusermount3", "-u", "-z", str(ROOT)], capture_output=True)
    r = subprocess.run([BIN, "mount", str(ROOT)], capture_output=True)
    check(r.returncode == 0, "remount after SIGKILL failed: %s" % r.stderr.decode())


# ------------------------------------------------------------ scenarios
# Each returns (setup, steps): steps are (name, action, expected skills).

def sc_bundled_update():
    new = {"SKILL.md": skill_md("foo", "v2"), "references/r.md": os.urandom(5000)}
    src = scratch("bundled-")
    for rel, data in new.items():
        (src / "foo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / "foo" / rel).write_bytes(data)
    os.utime(src / "foo" / "SKILL.md", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))

    def setup():
        make_skill(ROOT / "cat" / "foo", "foo", {"references/r.md": b"old ref"})
        make_skill(ROOT / "cat" / "bar", "bar")
        (ROOT / ".bundled_manifest").write_text("foo:1\n")

    def final():
        check(tree_bytes(ROOT / "cat" / "foo") == new, "new version not byte-exact")
        check(os.stat(ROOT / "cat" / "foo" / "SKILL.md").st_mtime_ns == 1_700_000_000_000_000_000, "utime lost")
        check((ROOT / ".bundled_manifest").read_text() == "foo:2\n", "manifest")
        check(os.stat(ROOT / ".bundled_manifest").st_mode & 0o777 == 0o644, "manifest mode")
        check(".bundled_manifest" in os.listdir(ROOT), ".bundled_manifest must stay listed")
        check(not os.path.exists(ROOT / "cat" / "foo.bak"), "backup left")
        shutil.rmtree(src)

    both = {"foo": "cat/foo", "bar": "cat/bar"}
    return setup, [
        ("rename to .bak", lambda: os.rename(ROOT / "cat/foo", ROOT / "cat/foo.bak"), {"bar": "cat/bar"}),
        ("copytree new", lambda: shutil.copytree(src / "foo", ROOT / "cat/foo"), both),
        ("rmtree .bak", lambda: shutil.rmtree(ROOT / "cat/foo.bak"), both),
        ("manifest", lambda: atomic_write(ROOT / ".bundled_manifest", b"foo:2\n", ".bundled_manifest_", 0o644), both),
        ("final", final, both),
    ]


def sc_failed_update():
    state = {}

    def setup():
        make_skill(ROOT / "cat" / "foo", "foo", {"scripts/run.py": b"print(1)\n", "references/a.md": os.urandom(3000)})
        state["orig"] = tree_bytes(ROOT / "cat" / "foo")

    def partial_copy():
        (ROOT / "cat" / "foo").mkdir()
        (ROOT / "cat" / "foo" / "SKILL.md").write_bytes(skill_md("foo", "half-copied v2"))

    def final():
        check(tree_bytes(ROOT / "cat" / "foo") == state["orig"], "restored skill differs")
        check(not os.path.exists(ROOT / "cat" / "foo.bak"), "foo.bak not gone")

    return setup, [
        ("rename to .bak", lambda: os.rename(ROOT / "cat/foo", ROOT / "cat/foo.bak"), {}),
        ("partial copy", partial_copy, {"foo": "cat/foo"}),
        ("remove partial", lambda: shutil.rmtree(ROOT / "cat/foo"), {}),
        ("rename back", lambda: os.rename(ROOT / "cat/foo.bak", ROOT / "cat/foo"), {"foo": "cat/foo"}),
        ("final", final, {"foo": "cat/foo"}),
    ]


def sc_writer_killed_after_rename():
    state = {}

    def setup():
        make_skill(ROOT / "cat" / "foo", "foo", {"references/r.md": b"ref"})
        state["orig"] = tree_bytes(ROOT / "cat" / "foo")

    def crash():
        code = ("import os,sys,time; os.rename(sys.argv[1]+'/cat/foo', sys.argv[1]+'/cat/foo.bak'); "
                "print('renamed', flush=True); time.sleep(60)")
        p = subprocess.Popen([sys.executable, "-c", code, str(ROOT)], stdout=subprocess.PIPE)
        check(p.stdout.readline().strip() == b"renamed", "writer did not rename")
        p.kill()
        p.wait()

    def next_start():
        check(os.path.isdir(ROOT / "cat" / "foo.bak"), "cat/foo.bak not found by stat")
        check(not os.path.exists(ROOT / "cat" / "foo"), "cat/foo still there")
        check("foo.bak" not in os.listdir(ROOT / "cat"), "foo.bak listed")

    def final():
        check(tree_bytes(ROOT / "cat" / "foo") == state["orig"], "restored skill differs")

    return setup, [
        ("writer killed after rename", crash, {}),
        ("next start", next_start, {}),
        ("rename back", lambda: os.rename(ROOT / "cat/foo.bak", ROOT / "cat/foo"), {"foo": "cat/foo"}),
        ("final", final, {"foo": "cat/foo"}),
    ]


def sc_stale_bak():
    src = scratch("bundled-")
    make_skill(src / "foo", "foo")
    (src / "foo" / "SKILL.md").write_bytes(skill_md("foo", "v2"))

    def setup():
        make_skill(ROOT / "cat" / "foo", "foo")
        # A stale backup with the same frontmatter name, sorting first.
        make_skill(ROOT / "cat" / "foo.bak", "foo")
        (ROOT / "cat" / "foo.bak" / "SKILL.md").write_bytes(skill_md("foo", "STALE"))

    def loads_live():
        check(b"STALE" not in (ROOT / "cat/foo/SKILL.md").read_bytes(), "stale copy loaded")
        check((ROOT / "cat/foo.bak/SKILL.md").read_bytes() == skill_md("foo", "STALE"), "stale copy unreachable")

    def final():
        check((ROOT / "cat/foo/SKILL.md").read_bytes() == skill_md("foo", "v2"), "update lost")
        shutil.rmtree(src)

    one = {"foo": "cat/foo"}
    return setup, [
        ("stale present", loads_live, one),
        ("drop stale backup", lambda: shutil.rmtree(ROOT / "cat/foo.bak"), one),
        ("rename to .bak", lambda: os.rename(ROOT / "cat/foo", ROOT / "cat/foo.bak"), {}),
        ("copytree new", lambda: shutil.copytree(src / "foo", ROOT / "cat/foo"), one),
        ("rmtree .bak", lambda: shutil.rmtree(ROOT / "cat/foo.bak"), one),
        ("final", final, one),
    ]


def sc_single_patch():
    skill = ROOT / "cat" / "foo"
    state = {}

    def setup():
        make_skill(skill, "foo")
        (ROOT / ".usage.json").write_text("{}")
        (ROOT / ".curator_ledger.jsonl").write_text('{"event":"created"}\n')

    def lock():
        (ROOT / ".locks").mkdir(exist_ok=True)
        f = open(ROOT / ".locks" / (hashlib.sha256(b"foo").hexdigest()[:16] + ".lock"), "a+")
        fcntl.flock(f, fcntl.LOCK_EX)
        state["lock"] = f

    def temp_written():
        name = ".SKILL.md.tmp.%s" % os.urandom(4).hex()
        fd = os.open(skill / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.write(fd, skill_md("foo", "patched"))
        os.fsync(fd)
        os.close(fd)
        state["tmp"] = skill / name
        check(name not in os.listdir(skill), "temp file listed while it exists")
        check(os.path.exists(skill / name), "temp file not reachable by path")

    def usage():
        atomic_write(ROOT / ".usage.json", json.dumps({"foo": 1}).encode(), ".usage_")

    def ledger():
        with open(ROOT / ".curator_ledger.jsonl", "a") as f:
            f.write('{"event":"patched","skill":"foo"}\n')

    def unlock():
        fcntl.flock(state["lock"], fcntl.LOCK_UN)
        state["lock"].close()

    def final():
        check((skill / "SKILL.md").read_bytes() == skill_md("foo", "patched"), "patch lost")
        check(json.loads((ROOT / ".usage.json").read_text()) == {"foo": 1}, "usage")
        check(len((ROOT / ".curator_ledger.jsonl").read_text().splitlines()) == 2, "ledger")
        listed = os.listdir(ROOT)
        for n in (".usage.json", ".curator_ledger.jsonl"):
            check(n in listed, "%s must stay listed" % n)
        check(".locks" not in listed, ".locks listed")

    one = {"foo": "cat/foo"}
    return setup, [
        ("flock", lock, one),
        ("temp written", temp_written, one),
        ("rename over SKILL.md", lambda: os.rename(state["tmp"], skill / "SKILL.md"), one),
        ("usage rewrite", usage, one),
        ("ledger append", ledger, one),
        ("unlock", unlock, one),
        ("final", final, one),
    ]


SLOW_COPY = r"""
import os, sys, time, shutil
src, dst = sys.argv[1], sys.argv[2]
os.mkdir(dst)
names = sorted(os.listdir(src), key=lambda n: n != 'SKILL.md')
for i, n in enumerate(names):
    s, d = os.path.join(src, n), os.path.join(dst, n)
    (shutil.copytree if os.path.isdir(s) else shutil.copy2)(s, d)
    print('copied', n, flush=True)
    time.sleep(60 if i == 0 else 0)
"""


def sc_batch_rollback(kill_writer):
    snap = scratch("snapshot-")
    make_skill(snap / "probe", "probe", {"references/r.md": b"good ref", "templates/t.txt": b"tpl"})
    good = tree_bytes(snap / "probe")

    def setup():
        make_skill(ROOT / "cat" / "probe", "probe", {"references/r.md": b"BROKEN"})

    def copy_back():
        if not kill_writer:
            shutil.copytree(snap / "probe", ROOT / "cat" / "probe")
            return
        p = subprocess.Popen([sys.executable, "-c", SLOW_COPY, str(snap / "probe"), str(ROOT / "cat/probe")],
                             stdout=subprocess.PIPE)
        check(p.stdout.readline().strip() == b"copied SKILL.md", "copier did not start")
        p.kill()
        p.wait()

    def after():
        park = ROOT / "cat" / "probe.rollback-broken"
        check((park / "references" / "r.md").read_bytes() == b"BROKEN", "park not reachable by path")
        check("probe.rollback-broken" not in os.listdir(ROOT / "cat"), "park listed")
        if not kill_writer:
            shutil.rmtree(park)
            check(tree_bytes(ROOT / "cat" / "probe") == good, "rolled back skill differs")
            check(not os.path.exists(park), "park not removed")
        shutil.rmtree(snap)

    one = {"probe": "cat/probe"}
    return setup, [
        ("park broken", lambda: os.rename(ROOT / "cat/probe", ROOT / "cat/probe.rollback-broken"), {}),
        ("copy back", copy_back, one),
        ("park removed" if not kill_writer else "park kept", after, one),
    ]


def sc_curator():
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    backups = ROOT / ".curator_backups"
    archive = backups / stamp / "skills.tar.gz"
    staging = backups / (".rollback-staging-" + stamp)
    state = {}

    def setup():
        make_skill(ROOT / "cat" / "foo", "foo")
        make_skill(ROOT / "cat" / "bar", "bar")
        make_skill(ROOT / ".archive" / "old", "old")
        (ROOT / ".usage.json").write_text('{"foo": 3}')
        (ROOT / ".curator_state").write_text("state")
        (ROOT / ".bundled_manifest").write_text("foo:1\n")
        (ROOT / "DESCRIPTION.md").write_text("skills")
        state["before"] = tree_bytes(ROOT)

    def snapshot():
        (backups / stamp).mkdir(parents=True)
        with tarfile.open(archive, "w:gz") as tar:
            for entry in sorted(os.listdir(ROOT)):
                tar.add(ROOT / entry, arcname=entry)
        with tarfile.open(archive) as tar:
            members = tar.getnames()
        for need in (".usage.json", ".archive", ".curator_state", ".bundled_manifest", "cat/foo/SKILL.md"):
            check(need in members, "%s missing from the snapshot: %r" % (need, members))
        leaked = [m for m in members if is_hidden_name(m)]
        check(not leaked, "hidden names in the snapshot: %r" % leaked)

    def move_aside():
        staging.mkdir()
        for entry in sorted(os.listdir(ROOT)):
            os.rename(ROOT / entry, staging / entry)
            check_L({k: v for k, v in {"foo": "cat/foo", "bar": "cat/bar"}.items()
                     if os.path.exists(ROOT / v)}, "moving %s aside" % entry)
        check(os.listdir(ROOT) == [], "root not empty after moving aside: %r" % os.listdir(ROOT))
        check(staging.name in os.listdir(backups), "the staging dir must be listed inside .curator_backups")

    def extract():
        with tarfile.open(archive) as tar:
            tar.extractall(ROOT, filter="tar")

    def remove_staging():
        shutil.rmtree(staging)
        check(tree_bytes(ROOT) == state["before"], "rolled back tree differs")
        check(os.path.exists(archive), "snapshot lost")

    both = {"foo": "cat/foo", "bar": "cat/bar"}
    return setup, [
        ("snapshot", snapshot, both),
        ("move aside", move_aside, {}),
        ("extract", extract, both),
        ("remove staging", remove_staging, both),
    ]


def sc_archive():
    def setup():
        make_skill(ROOT / "cat" / "foo", "foo")
        (ROOT / ".archive").mkdir()

    def archived():
        check(".archive" in os.listdir(ROOT), ".archive must stay listed")
        check(os.path.exists(ROOT / ".archive/foo/SKILL.md"), "archived skill missing")

    return setup, [
        ("archive", lambda: os.rename(ROOT / "cat/foo", ROOT / ".archive/foo"), {}),
        ("archived", archived, {}),
        ("restore", lambda: os.rename(ROOT / ".archive/foo", ROOT / "cat/foo"), {"foo": "cat/foo"}),
    ]


SCENARIOS = {
    "bundled_update": sc_bundled_update,
    "failed_update": sc_failed_update,
    "writer_killed_after_rename": sc_writer_killed_after_rename,
    "stale_bak": sc_stale_bak,
    "single_patch": sc_single_patch,
    "batch_rollback": lambda: sc_batch_rollback(False),
    "batch_rollback_writer_killed": lambda: sc_batch_rollback(True),
    "curator": sc_curator,
    "archive": sc_archive,
}


def visible_hashes():
    return {hashlib.sha256(b).hexdigest() for b in tree_bytes(ROOT).values()}


def main():
    setup, steps = SCENARIOS[SCENARIO]()
    kill_at = None if KILL_AT is None else KILL_AT % len(steps)
    setup()
    passed = 0
    try:
        for i, (name, action, expected) in enumerate(steps):
            action()
            check_L(expected, name)
            passed += 1
            if kill_at is not None and i == kill_at:
                before = visible_hashes()
                kill_daemon_and_remount()
                check_L(expected, "after SIGKILL at '%s'" % name)
                live = visible_hashes()
                journaled = journal_blobs()
                lost = [h for h in before if h not in live and h not in journaled]
                check(not lost, "content lost by the daemon kill: %r" % lost)
                passed += 1
                print("killed the daemon after step %d (%s); L holds and nothing was lost" % (i, name))
                break
    except Failed as e:
        print("FAIL %s: %s" % (SCENARIO, e))
        print("%d passed, 1 failed" % passed)
        return 1
    print("%d passed, 0 failed" % passed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
