#!/usr/bin/env python3
"""The plain part of a mount over the agent's home, against native and bindfs.

What the agent does in its home outside skills/: its session database
(SQLite in WAL mode, as hermes_state opens it: many small transactions)
and its log appends. Each system runs in a fresh directory (a fresh mount),
the systems interleaved over REPS repeats; the median time of each phase
is printed with its ratio to native in the same repeat.

Phases:
  sqlite, 2,000 small transactions   INSERT + COMMIT each (WAL, synchronous
                                     FULL: SQLite's default, what the agent
                                     runs with)
  sqlite, the same, synchronous=NORMAL  (WAL's usual setting: no fsync per
                                     commit, so every write is a round trip)
  sqlite, 2,000 point reads          SELECT by key on the same database
  log appends                        20,000 lines of ~100 bytes appended to
                                     one file through a line-buffered
                                     logging.FileHandler (what the agent's
                                     logger does), then flushed

usage: bench/home.py [--reps 5] [--systems native,bindfs,skillfs,skillfs-served] [--dir DIR]
(skillfs: the daemon as root, the home's files opened with FUSE passthrough;
skillfs-served: SKILLFS_NO_PASSTHROUGH=1, the daemon serves them, as a
user's daemon does.)
Needs root for bindfs and a release build (cargo build --release).
"""

import argparse
import logging
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target" / "release" / "skillfs"


class System:
    def __init__(self, name, base):
        self.name, self.base = name, base

    def __enter__(self):
        self.top = tempfile.mkdtemp(prefix="home-%s-" % self.name, dir=self.base)
        plain = os.path.join(self.top, "hermes")
        os.makedirs(os.path.join(plain, "skills"))
        self.home = plain
        if self.name == "bindfs":
            self.home = os.path.join(self.top, "mnt")
            os.makedirs(self.home)
            subprocess.run(["bindfs", "--multithreaded", plain, self.home], check=True)
        elif self.name.startswith("skillfs"):
            # skillfs-served: the daemon serves the home's files itself, as
            # a user's daemon does (no passthrough).
            env = dict(os.environ)
            if self.name == "skillfs-served":
                env["SKILLFS_NO_PASSTHROUGH"] = "1"
            subprocess.run([str(BIN), "mount", plain, "--versioned", "skills"], check=True,
                           stdout=subprocess.DEVNULL, env=env)
        return self

    def __exit__(self, *exc):
        if self.name == "bindfs":
            subprocess.run(["umount", "-l", self.home])
        elif self.name.startswith("skillfs"):
            subprocess.run([str(BIN), "umount", self.home], stdout=subprocess.DEVNULL)
        shutil.rmtree(self.top, ignore_errors=True)


def sqlite_txns(home, n, sync):
    db = sqlite3.connect(os.path.join(home, "state-%s.db" % sync), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=%s" % sync)
    db.execute("CREATE TABLE m(id INTEGER PRIMARY KEY, session TEXT, body TEXT)")
    t = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN")
        db.execute("INSERT INTO m(session, body) VALUES (?, ?)", ("s%d" % (i % 7), "m" * 200))
        db.execute("COMMIT")
    el = time.perf_counter() - t
    db.close()
    return el


def sqlite_reads(home, n):
    db = sqlite3.connect(os.path.join(home, "state-FULL.db"), isolation_level=None)
    t = time.perf_counter()
    for i in range(n):
        db.execute("SELECT body FROM m WHERE id = ?", (1 + (i * 7919) % n,)).fetchone()
    el = time.perf_counter() - t
    db.close()
    return el


def log_appends(home, n):
    os.makedirs(os.path.join(home, "logs"), exist_ok=True)
    log = logging.getLogger("bench-%s" % home)
    log.propagate = False
    h = logging.FileHandler(os.path.join(home, "logs", "agent.log"))
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(h)
    log.setLevel(logging.INFO)
    t = time.perf_counter()
    for i in range(n):
        log.info("tool call %d finished in %d ms with status ok", i, i % 997)
    h.flush()
    el = time.perf_counter() - t
    h.close()
    log.removeHandler(h)
    return el


PHASES = [
    ("sqlite, 2,000 small transactions (WAL, synchronous=FULL)", lambda h: sqlite_txns(h, 2000, "FULL")),
    ("sqlite, 2,000 small transactions (WAL, synchronous=NORMAL)", lambda h: sqlite_txns(h, 2000, "NORMAL")),
    ("sqlite, 2,000 point reads", lambda h: sqlite_reads(h, 2000)),
    ("log appends, 20,000 lines", lambda h: log_appends(h, 20000)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--systems", default="native,bindfs,skillfs,skillfs-served")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    systems = args.systems.split(",")
    if any(s.startswith("skillfs") for s in systems) and not BIN.exists():
        sys.exit("bench: build the release binary first: cargo build --release")
    base = args.dir or tempfile.gettempdir()
    times = {(s, p): [] for s in systems for p, _ in PHASES}
    ratios = {(s, p): [] for s in systems for p, _ in PHASES}
    for rep in range(args.reps):
        order = systems[rep % len(systems):] + systems[:rep % len(systems)]
        got = {}
        for s in order:
            with System(s, base) as sysm:
                for p, f in PHASES:
                    got[(s, p)] = f(sysm.home)
        for s in systems:
            for p, _ in PHASES:
                times[(s, p)].append(got[(s, p)])
                if "native" in systems:
                    ratios[(s, p)].append(got[(s, p)] / got[("native", p)])
        print("rep %d: %s" % (rep, {k: round(v * 1000, 1) for k, v in got.items()}), file=sys.stderr)
    print("| phase | " + " | ".join(systems) + " |")
    print("|---|" + "---:|" * len(systems))
    for p, _ in PHASES:
        cells = []
        for s in systems:
            ms = statistics.median(times[(s, p)]) * 1000
            if s == "native" or "native" not in systems:
                cells.append("%.1f ms" % ms)
            else:
                cells.append("%.1f ms (%.2fx)" % (ms, statistics.median(ratios[(s, p)])))
        print("| %s | %s |" % (p, " | ".join(cells)))


if __name__ == "__main__":
    main()
