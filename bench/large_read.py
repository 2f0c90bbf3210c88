#!/usr/bin/env python3
"""Reads of large files: native, skillfs with the kernel reading them
itself (FUSE passthrough, a root daemon's default for a read-only open of a
file of 1 MiB or more) and skillfs serving every read
(SKILLFS_NO_PASSTHROUGH=1), on each transport asked for, in one run.

For each system: FILES files of SIZE MiB are made before the mount; each
repeat drops the page cache (cold) and reads every file whole in 1 MiB
reads, then reads them again (warm). Prints the median of the repeats, in
MiB/s and as a ratio of time to native in the same repeat, with each
daemon's resident memory after the run.

usage: sudo python3 bench/large_read.py [--files 4] [--size 64] [--reps 3]
                                        [--transports classic,uring] [--bin PATH]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_all(paths):
    t = time.perf_counter()
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                total += len(b)
    return total / (1 << 20) / (time.perf_counter() - t)


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--size", type=int, default=64, help="MiB per file")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--transports", default="classic")
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "skillfs"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("large_read: run as root (passthrough and drop_caches need it)")
    scratch = Path(tempfile.mkdtemp(prefix="skillfs-large-"))
    systems = {"native": None}
    for t in args.transports.split(","):
        systems[f"skillfs-{t}"] = (t, False)
        systems[f"skillfs-{t}-nopass"] = (t, True)
    block = os.urandom(1 << 20)
    mounted = []
    try:
        paths = {}
        for name, how in systems.items():
            d = scratch / name / "skills"
            d.mkdir(parents=True)
            for i in range(args.files):
                with open(d / f"asset{i}.bin", "wb") as f:
                    for _ in range(args.size):
                        f.write(block)
            paths[name] = [d / f"asset{i}.bin" for i in range(args.files)]
            if how is None:
                continue
            transport, nopass = how
            env = dict(os.environ)
            env.pop("SKILLFS_NO_PASSTHROUGH", None)
            if nopass:
                env["SKILLFS_NO_PASSTHROUGH"] = "1"
            subprocess.run(
                [args.bin, "mount", str(d), "--transport", transport],
                env=env, check=True, capture_output=True,
            )
            mounted.append(d)
        results = {n: {"cold": [], "warm": []} for n in systems}
        for rep in range(args.reps):
            order = list(systems)
            order = order[rep % len(order):] + order[: rep % len(order)]
            for name in order:
                drop_caches()
                results[name]["cold"].append(read_all(paths[name]))
                results[name]["warm"].append(read_all(paths[name]))
        rss = {}
        for d in mounted:
            lock = d.parent / ".skillfs" / "skills" / "LOCK"
            try:
                rss[d.parent.name] = rss_kib(int(lock.read_text().strip()))
            except (OSError, ValueError):
                pass
        native = {k: statistics.median(v) for k, v in results["native"].items()}
        print(f"{args.files} files of {args.size} MiB, median of {args.reps} repeats (MiB/s; ratio of time to native)\n")
        print("| system | cold read | warm read | daemon RSS |")
        print("|---|---:|---:|---:|")
        for name in systems:
            cells = []
            for kind in ("cold", "warm"):
                v = statistics.median(results[name][kind])
                cells.append(f"{v:,.0f} ({native[kind] / v:.2f}x)")
            r = f"{rss[name] / 1024:.1f} MiB" if name in rss else "-"
            print(f"| {name} | {cells[0]} | {cells[1]} | {r} |")
    finally:
        for d in mounted:
            subprocess.run([args.bin, "umount", str(d)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
