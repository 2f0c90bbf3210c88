#!/usr/bin/env python3
"""Per-call cost of the calls the agent's workload is made of, in one directory.

The workload's phases are sums of a few calls; this times them one by one, so
that a phase's ratio to native can be read as "native work + N round trips":

  open_close        os.open(O_RDONLY) + os.close: one OPEN round trip on FUSE
                    (the RELEASE is sent in the background)
  isatty            ioctl(TCGETS) on an open regular file: what Python's open()
                    asks before choosing a buffer (up to Python 3.13); every
                    FUSE filesystem gets it as an IOCTL round trip
  stat              os.stat of a cached file
  py_open_read      open(p, "rb").read(), as the workload reads (3.11-3.13)
  py_open_read_raw  the same without the isatty call, as Python 3.14's open()
                    does for regular files
  write_fsync       os.open(O_CREAT|O_TRUNC) + 4 KiB write + fsync + close of a
                    new file, as the workload's fsync phase

usage: calls.py ROOT [--files 2000] [--fsyncs 100] [--reps 5]
Prints one JSON object: microseconds per call (median of the repeats).
"""

import argparse
import fcntl
import json
import os
import statistics
import termios
import time


def per_call(fn, n, reps):
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--fsyncs", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    paths = []
    for i in range(args.files):
        d = os.path.join(args.root, "d%03d" % (i % 200))
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "f%05d.md" % i)
        with open(p, "wb") as f:
            f.write(b"x" * 2048)
        paths.append(p)
    for p in paths:  # every cache warm, as for the workload's later passes
        with open(p, "rb") as f:
            f.read()
        os.stat(p)

    def open_close():
        for p in paths:
            os.close(os.open(p, os.O_RDONLY))

    fds = [os.open(p, os.O_RDONLY) for p in paths]

    def isatty():
        for fd in fds:
            try:
                fcntl.ioctl(fd, termios.TCGETS, bytes(64))
            except OSError:
                pass

    def stat():
        for p in paths:
            os.stat(p)

    def py_open_read():
        for p in paths:
            with open(p, "rb") as f:
                f.read()

    def py_open_read_raw():
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                f.read()

    block = b"y" * 4096
    rounds = iter(range(1_000_000))

    def write_fsync():
        r = next(rounds)
        for k in range(args.fsyncs):
            p = os.path.join(args.root, "d%03d" % (k % 200), ".state-%d-%d.bin" % (r, k))
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, block)
                os.fsync(fd)
            finally:
                os.close(fd)

    n = len(paths)
    out = {
        "open_close": per_call(open_close, n, args.reps),
        "isatty": per_call(isatty, n, args.reps),
        "stat": per_call(stat, n, args.reps),
        "py_open_read": per_call(py_open_read, n, args.reps),
        "py_open_read_raw": per_call(py_open_read_raw, n, args.reps),
        "write_fsync": per_call(write_fsync, args.fsyncs, args.reps),
    }
    for fd in fds:
        os.close(fd)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
