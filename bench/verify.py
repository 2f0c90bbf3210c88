#!/usr/bin/env python3
"""How fast `skillfs verify --full` reads a store (issue 14: at disk speed).

Makes a store with VERSIONS versions of 64 KiB files (packed) and LARGE
versions of 4 MiB files (loose blobs), unmounts it, then times
`skillfs verify` and `skillfs verify --full` with the page cache dropped
(root: /proc/sys/vm/drop_caches) and warm, and prints MiB/s.

usage: bench/verify.py [--versions 3000] [--large 40] [--dir DIR]
Needs a release build (cargo build --release).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(__file__).resolve().parent.parent / "target" / "release" / "skillfs"


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=3000)
    ap.add_argument("--large", type=int, default=40)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    if not BIN.exists():
        sys.exit("bench: build the release binary first: cargo build --release")
    top = tempfile.mkdtemp(prefix="verify-bench-", dir=args.dir)
    root = os.path.join(top, "skills")
    os.makedirs(root)
    subprocess.run([str(BIN), "mount", root], check=True, stdout=subprocess.DEVNULL)
    try:
        for i in range(args.versions):
            with open(os.path.join(root, "f%d.md" % (i % 50)), "wb") as f:
                f.write(os.urandom(64 * 1024))
        for i in range(args.large):
            with open(os.path.join(root, "big%d.bin" % (i % 4)), "wb") as f:
                f.write(os.urandom(4 << 20))
    finally:
        subprocess.run([str(BIN), "umount", root], check=True, stdout=subprocess.DEVNULL)
    store = os.path.join(top, ".skillfs", "skills")
    size = sum(p.stat().st_size for p in Path(store).rglob("*") if p.is_file())
    print("store: %.0f MiB (%d versions of 64 KiB, %d of 4 MiB)"
          % (size / 2**20, args.versions, args.large))
    print("| run | cache | seconds | MiB read | MiB/s |")
    print("|---|---|---:|---:|---:|")
    for full in (False, True):
        for cold in (True, False):
            if cold and not drop_caches():
                continue
            cmd = [str(BIN), "verify", "--root", root] + (["--full"] if full else [])
            t = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True)
            el = time.perf_counter() - t
            if out.returncode != 0:
                sys.exit("verify failed: " + out.stdout + out.stderr)
            m = re.search(r"([\d.]+) MiB read", out.stdout)
            mib = float(m.group(1)) if m else 0.0
            print("| verify%s | %s | %.2f | %.0f | %.0f |"
                  % (" --full" if full else "", "cold" if cold else "warm", el, mib,
                     mib / el if el else 0))
    shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
