"""The agent's batch rollback, replayed through a mount over its home.

The sequence of `tools/skill_manager_batch.py` after the change "park a
batch rollback outside the skills root" (the agent's own PR text is in the
design notes): a snapshot of the skill is taken before the batch, the batch
edits the skill with atomic writes, fails, and the rollback parks the
half-applied skill by one rename into `.skill-rollback-asides` beside an
ancestor of the skills root -- only where that directory is outside every
loader root and on the entry's own filesystem (st_dev checked against the
nearest existing ancestor, and again after the mkdir) -- copies the
snapshot back, and removes the park. After every step the loader (an
os.walk with followlinks=True for SKILL.md) must see each skill once, at
its live path.

Usage: batch_rollback.py HOME full           the whole sequence
       batch_rollback.py HOME park-and-wait  park, print "parked", sleep
                                              (the test kills it there)
"""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HOME = Path(sys.argv[1])
MODE = sys.argv[2]
SKILLS = HOME / "skills"
ENTRY = SKILLS / "research" / "arxiv"
ASIDES = ".skill-rollback-asides"


def loader():
    """agent.skill_utils.iter_skill_index_files: os.walk(followlinks=True)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(SKILLS, followlinks=True):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".github", ".hub", ".history")]
        if "SKILL.md" in filenames:
            found.append(os.path.relpath(dirpath, SKILLS))
    return sorted(found)


def check_loader(step, expect):
    got = loader()
    assert got == expect, f"after {step}: the loader sees {got}, expected {expect}"


def atomic_write(path, text):
    """The agent's _atomic_write_text: a temp file in the same directory, then os.replace."""
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.tmp.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def nearest_existing(p):
    while not p.exists():
        p = p.parent
    return p


def park_dir_for(entry):
    """_park_dir_for: climb outward from the root that holds the entry."""
    dev = os.lstat(entry).st_dev
    roots = [SKILLS.resolve()]
    for ancestor in SKILLS.resolve().parents:
        cand = ancestor / ASIDES
        if any(cand == r or r in cand.parents for r in roots):
            continue  # inside a loader root
        if os.stat(nearest_existing(cand)).st_dev != dev:
            continue
        cand.mkdir(exist_ok=True)
        if os.stat(cand).st_dev != dev:  # re-checked after the mkdir
            continue
        return cand
    raise SystemExit("ROLLBACK FAILED: no same-filesystem park outside the skills root")


def park(entry):
    d = park_dir_for(entry)
    aside = d / f"{entry.name}-{time.time_ns()}"
    entry.rename(aside)  # one rename: atomic, or nothing moved
    os.utime(aside)  # the park's own mtime, for the stale sweep
    return aside


def remove_path(p):
    """_remove_path: symlink-aware."""
    if p.is_symlink():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()


def batch_and_park():
    base = ["research/arxiv", "research/other"]
    check_loader("set-up", base)
    # Beside the home, in the test's scratch directory (the agent uses the
    # system's temp directory): a park-and-wait run is killed, and its
    # snapshot must not outlive the test.
    snap = Path(tempfile.mkdtemp(prefix="skill-snapshot-", dir=HOME.parent))
    shutil.copytree(ENTRY, snap / "arxiv", symlinks=True)
    # The batch: two edits land, the third op fails.
    atomic_write(ENTRY / "SKILL.md", "---\nname: arxiv\n---\nhalf-applied batch\n")
    (ENTRY / "references").mkdir(exist_ok=True)
    atomic_write(ENTRY / "references" / "new.md", "added by the batch\n")
    check_loader("the failed batch", base)
    aside = park(ENTRY)
    assert os.stat(aside.parent).st_dev == os.stat(SKILLS).st_dev
    assert (aside / "SKILL.md").read_text().endswith("half-applied batch\n")
    check_loader("the park", ["research/other"])
    return snap, aside, base


if MODE == "full":
    snap, aside, base = batch_and_park()
    shutil.copytree(snap / "arxiv", ENTRY, symlinks=True)
    check_loader("the copy-back", base)
    remove_path(aside)
    check_loader("the removal of the park", base)
    # The stale sweep of every rollback: nothing older than a day is left.
    for p in (HOME / ASIDES).iterdir():
        if time.time() - p.lstat().st_mtime > 24 * 3600:
            remove_path(p)
    assert list((HOME / ASIDES).iterdir()) == []
    assert (ENTRY / "SKILL.md").read_text() == "---\nname: arxiv\n---\noriginal\n"
    assert not (ENTRY / "references").exists()
    shutil.rmtree(snap)
    print("rolled back")
elif MODE == "park-and-wait":
    snap, aside, base = batch_and_park()
    print(f"parked {aside}", flush=True)
    time.sleep(600)
else:
    raise SystemExit(f"unknown mode {MODE}")
