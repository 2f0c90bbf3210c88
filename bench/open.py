#!/usr/bin/env python3
"""How long a store of many records takes to mount (issue 14: a store of
1,000,000 records opens in under 2 s).

Writes a journal of RECORDS records as a year of the agent's edits would
leave it (one segment; writes to FILES files in 100 directories, each
record's CRC and watermark as skillfs writes them), a live tree that
matches its newest state, then times `skillfs mount` from start to ready
(the journal read, checked and folded, the tree scanned) REPS times, the
page cache dropped before each (root), and prints the median and the
daemon's resident memory. Then the same for `skillfs forget --dry-run`
(the journal read and folded by a command).

usage: bench/open.py [--records 1000000] [--files 2000] [--reps 3] [--dir DIR]
Needs a release build (cargo build --release).
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from verify import drop_caches  # the same page-cache drop (root only)

BIN = Path(__file__).resolve().parent.parent / "target" / "release" / "skillfs"
T0 = 1_700_000_000_000_000_000


def make_store(root, store, records, files):
    os.makedirs(root)
    os.makedirs(store / "journal", mode=0o700)
    os.chmod(store, 0o700)
    seq = 0
    final = {}
    out = open(store / "journal" / f"{1:020}.jsonl", "wb")

    def emit(op, path, state):
        nonlocal seq
        seq += 1
        rec = {"seq": seq, "ts": T0 + seq * 1_000_000_000, "op": op, "path": path,
               "state": state, "actor": {"uid": os.getuid(), "pid": 1, "comm": "agent"},
               "acked_through": seq - 1}
        body = json.dumps(rec, separators=(",", ":")).encode()
        out.write(body[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(body))

    uid, gid = os.getuid(), os.getgid()
    for d in range(100):
        emit("mkdir", f"d{d}", {"kind": "dir", "size": 0, "mode": 0o755, "uid": uid,
                                "gid": gid, "mtime_ns": T0 + d})
    k = 0
    while seq < records:
        f = k % files
        k += 1
        data = f"version {k}\n".encode()
        path = f"d{f % 100}/f{f}.md"
        mt = T0 + k * 1000
        emit("write", path, {"kind": "file", "blob": hashlib.sha256(data).hexdigest(),
                             "size": len(data), "mode": 0o644, "uid": uid, "gid": gid,
                             "mtime_ns": mt})
        final[path] = (data, mt)
    out.close()
    os.chmod(store / "journal" / f"{1:020}.jsonl", 0o600)
    for d in range(100):
        os.makedirs(root / f"d{d}", exist_ok=True)
    for p, (data, mt) in final.items():
        (root / p).write_bytes(data)
        os.utime(root / p, ns=(mt, mt))
    for d in range(100):
        os.utime(root / f"d{d}", ns=(T0 + d, T0 + d))
    return (store / "journal" / f"{1:020}.jsonl").stat().st_size


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    if not BIN.exists():
        sys.exit(f"no release build at {BIN}: run cargo build --release")
    base = Path(tempfile.mkdtemp(prefix="skillfs-open-", dir=a.dir))
    root, store = base / "skills", base / "store"
    try:
        t = time.monotonic()
        size = make_store(root, store, a.records, a.files)
        print(f"store: {a.records} records, journal {size / 2**20:.0f} MiB "
              f"(made in {time.monotonic() - t:.1f} s)")
        # The first mount reads every record (there is no checkpoint yet);
        # its unmount writes the checkpoint the later mounts load.
        drop_caches()
        t = time.monotonic()
        subprocess.run([BIN, "mount", root, "--store", store], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = time.monotonic() - t
        t = time.monotonic()
        subprocess.run([BIN, "umount", root], check=True, stdout=subprocess.DEVNULL)
        unmount = time.monotonic() - t
        cp = store / "journal" / "checkpoint"
        print(f"first mount (every record read and folded): {first:.2f} s; its unmount "
              f"(checkpoint of {cp.stat().st_size / 2**20:.0f} MiB written): {unmount:.2f} s")
        mounts, rss, dry = [], [], []
        for _ in range(a.reps):
            cold = drop_caches()
            t = time.monotonic()
            subprocess.run([BIN, "mount", root, "--store", store], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            mounts.append(time.monotonic() - t)
            pid = int((store / "LOCK").read_text().split()[0])
            rss.append(rss_kib(pid))
            subprocess.run([BIN, "umount", root], check=True, stdout=subprocess.DEVNULL)
            drop_caches()
            t = time.monotonic()
            subprocess.run([BIN, "forget", "--keep-last", "1", "--dry-run", "--root", root,
                            "--store", store], check=True, stdout=subprocess.DEVNULL)
            dry.append(time.monotonic() - t)
        print(f"mount to ready from the checkpoint ({'cold' if cold else 'warm'} cache): median "
              f"{statistics.median(mounts):.2f} s (runs: {', '.join(f'{m:.2f}' for m in mounts)}); "
              f"daemon RSS {statistics.median(rss) / 1024:.0f} MiB")
        print(f"forget --dry-run (read, fold, select): median {statistics.median(dry):.2f} s")
    finally:
        subprocess.run([BIN, "umount", root], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
