#!/usr/bin/env python3
"""Concurrency benchmark: 8 writers and 2 readers on native, bindfs and skillfs
(classic transport, and FUSE over io_uring as skillfs-uring).

Each writer rewrites its own 3 SKILL.md files and 4 shared ones, choosing at
random (seeded) between a plain O_TRUNC rewrite, a rewrite + fsync, and an
atomic write (hidden temp file, fsync, rename over). Two readers walk the
tree and read every file meanwhile. Every content is self-checking (a
header `SKF1 <len> <sha256>`), so a torn read is counted; errors are counted
by errno. Each system runs for SECONDS on a fresh directory (fresh mount),
the systems interleaved over REPS repeats; the median writes/s is printed
for each, with its ratio to native.

usage: bench/load.py [--seconds 20] [--reps 2] [--writers 8] [--readers 2]
                     [--systems native,bindfs,skillfs,skillfs-uring] [--dir DIR]
                     [--also NAME=PATH-TO-ANOTHER-SKILLFS]
Needs root for bindfs (installed with apt-get when missing) and a release
build of skillfs (cargo build --release). skillfs-uring needs Linux 6.14+ with
the fuse module's enable_uring on (switched on for the run, as root, and put
back).
"""

import argparse
import errno
import hashlib
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target" / "release" / "skillfs"
OTHER_BINS = {}  # system name -> another skillfs binary (--also NAME=PATH)
KINDS = ("plain", "fsync", "atomic")


def body(writer, n, rng):
    text = ("writer %d version %d " % (writer, n)) * rng.randint(20, 200)
    data = text.encode()
    return b"SKF1 %d %s\n" % (len(data), hashlib.sha256(data).hexdigest().encode()) + data


def check(blob):
    if not blob:
        return True  # a plain O_TRUNC rewrite caught between open and write
    head, _, data = blob.partition(b"\n")
    parts = head.split()
    return len(parts) == 3 and parts[0] == b"SKF1" and int(parts[1]) == len(data) \
        and hashlib.sha256(data).hexdigest().encode() == parts[2]


def writer(root, w, seconds, seed, out):
    rng = random.Random(seed * 100 + w)
    own = [os.path.join(root, "w%d" % w, "s%d" % i, "SKILL.md") for i in range(3)]
    shared = [os.path.join(root, "shared", "s%d" % i, "SKILL.md") for i in range(4)]
    counts = {"plain": 0, "fsync": 0, "atomic": 0}
    errors = {}
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        path = rng.choice(own + shared)
        data = body(w, n, rng)
        how = rng.choice(KINDS)
        try:
            if how == "plain":
                with open(path, "wb") as f:
                    f.write(data)
            elif how == "fsync":
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:
                d = os.path.dirname(path)
                tmp = os.path.join(d, ".SKILL.md.tmp.%d.%d" % (w, n))
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, path)
            counts[how] += 1
        except OSError as e:
            k = errno.errorcode.get(e.errno, str(e.errno))
            errors[k] = errors.get(k, 0) + 1
    out.put(("w", counts, errors))


def reader(root, seconds, out):
    reads = torn = 0
    errors = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for d, _, files in os.walk(root):
            for name in files:
                if name != "SKILL.md":
                    continue
                try:
                    with open(os.path.join(d, name), "rb") as f:
                        blob = f.read()
                    reads += 1
                    torn += not check(blob)
                except OSError as e:
                    k = errno.errorcode.get(e.errno, str(e.errno))
                    errors[k] = errors.get(k, 0) + 1
    out.put(("r", reads, torn, errors))


def populate(root, writers):
    rng = random.Random(0)
    for w in list(range(writers)) + ["shared"]:
        for i in range(4 if w == "shared" else 3):
            d = os.path.join(root, "shared" if w == "shared" else "w%d" % w, "s%d" % i)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "SKILL.md"), "wb") as f:
                f.write(body(0, 0, rng))


def run_load(root, args, seed):
    q = mp.Queue()
    ps = [mp.Process(target=writer, args=(root, w, args.seconds, seed, q))
          for w in range(args.writers)]
    ps += [mp.Process(target=reader, args=(root, args.seconds, q)) for _ in range(args.readers)]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    writes = sum(sum(r[1].values()) for r in res if r[0] == "w")
    werr, rerr = {}, {}
    for r in res:
        for k, v in (r[2] if r[0] == "w" else r[3]).items():
            (werr if r[0] == "w" else rerr)[k] = (werr if r[0] == "w" else rerr).get(k, 0) + v
    reads = sum(r[1] for r in res if r[0] == "r")
    torn = sum(r[2] for r in res if r[0] == "r")
    return writes / args.seconds, reads, torn, werr, rerr


class System:
    def __init__(self, name, base):
        self.name, self.base = name, base

    def __enter__(self):
        top = tempfile.mkdtemp(prefix="load-%s-" % self.name, dir=self.base)
        self.top = top
        plain = os.path.join(top, "skills")
        os.makedirs(plain)
        self.root = plain
        if self.name == "bindfs":
            self.root = os.path.join(top, "mnt")
            os.makedirs(self.root)
            subprocess.run(["bindfs", "--multithreaded", plain, self.root], check=True)
        elif self.name in ("skillfs", "skillfs-uring") or self.name in OTHER_BINS:
            self.bin = str(OTHER_BINS.get(self.name, BIN))
            transport = ["--transport", "uring" if self.name == "skillfs-uring" else "classic"]
            if self.name in OTHER_BINS:
                transport = []
            subprocess.run([self.bin, "mount", plain] + transport, check=True, stdout=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        if self.name == "bindfs":
            subprocess.run(["umount", "-l", self.root])
        elif self.name in ("skillfs", "skillfs-uring") or self.name in OTHER_BINS:
            subprocess.run([self.bin, "umount", self.root], stdout=subprocess.DEVNULL)
        shutil.rmtree(self.top, ignore_errors=True)


def main():
    global KINDS
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--systems", default="native,bindfs,skillfs,skillfs-uring")
    ap.add_argument("--dir", default=None, help="where to make the test directories")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PATH",
                    help="another skillfs binary to run beside (e.g. an older build)")
    ap.add_argument("--only", choices=KINDS, help="one kind of write instead of the mix")
    args = ap.parse_args()
    if args.only:
        KINDS = (args.only,)
    systems = args.systems.split(",")
    for a in args.also:
        name, _, path = a.partition("=")
        OTHER_BINS[name] = Path(path)
        systems.append(name)
    if "skillfs" in systems and not BIN.exists():
        sys.exit("bench: build the release binary first: cargo build --release")
    if "bindfs" in systems and shutil.which("bindfs") is None:
        subprocess.run("apt-get install -y -qq bindfs >/dev/null 2>&1 || "
                       "(apt-get update -qq && apt-get install -y -qq bindfs)", shell=True)
    param = Path("/sys/module/fuse/parameters/enable_uring")
    uring_was = param.read_text().strip() if param.exists() else None
    if "skillfs-uring" in systems:
        try:
            param.write_text("1")
        except OSError as e:
            print("bench: no FUSE over io_uring here (%s): skillfs-uring left out" % e, file=sys.stderr)
            systems.remove("skillfs-uring")
    try:
        run(args, systems)
    finally:
        if uring_was is not None and uring_was != "Y":
            param.write_text("0")


def run(args, systems):
    base = args.dir or tempfile.gettempdir()
    rates = {s: [] for s in systems}
    details = {s: [] for s in systems}
    for rep in range(args.reps):
        order = systems[rep % len(systems):] + systems[:rep % len(systems)]
        for s in order:
            with System(s, base) as sysm:
                populate(sysm.root, args.writers)
                r = run_load(sysm.root, args, rep)
                rates[s].append(r[0])
                details[s].append(r)
                print("rep %d %-8s %8.0f writes/s  reads %d  torn %d  writer errors %s  reader errors %s"
                      % (rep, s, *r), file=sys.stderr)
    native = statistics.median(rates["native"]) if "native" in rates else None
    print("| system | writes/s (median of %d x %gs) | ratio to native | torn reads | errors |"
          % (args.reps, args.seconds))
    print("|---|---:|---:|---:|---|")
    for s in systems:
        med = statistics.median(rates[s])
        ratio = "%.2fx" % (native / med) if native and med else "-"
        torn = sum(d[2] for d in details[s])
        errs = {}
        for d in details[s]:
            for m in (d[3], d[4]):
                for k, v in m.items():
                    errs[k] = errs.get(k, 0) + v
        print("| %s | %.0f | %s | %d | %s |" % (s, med, ratio, torn, errs or "none"))


if __name__ == "__main__":
    main()
