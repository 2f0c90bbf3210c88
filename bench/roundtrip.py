#!/usr/bin/env python3
"""One FUSE round trip, alone: an ioctl(TCGETS) that no filesystem answers,
on a file of a mounted skillfs, per transport, with the caller left to the
scheduler, pinned to CPU 0, and pinned to CPU 1; optionally with busy loops
on every CPU (--hogs), and with the worst single call.

usage: bench/roundtrip.py [--calls 20000] [--hogs] [--transports classic,uring]
                          [--halt-poll NS,NS]
Needs root (it mounts in a temporary directory) and a release build
(cargo build --release); switches the fuse module's enable_uring on for the
run and back. Prints how the machine's idle CPUs wait (a guest whose
cpuidle driver is haltpoll polls up to guest_halt_poll_ns before it halts;
at 0 every wake-up of an idle vCPU is a VM exit), then a markdown table:
mean microseconds per call (worst). --halt-poll runs every transport once
per value given, with the guest's halt polling set to it (and put back).
"""

import argparse
import fcntl
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target" / "release" / "skillfs"
PARAM = Path("/sys/module/fuse/parameters/enable_uring")
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle/current_driver")
HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def idle():
    """How this machine's idle CPUs wait, in a few words."""
    try:
        driver = CPUIDLE.read_text().strip()
    except OSError:
        return "cpuidle: none"
    if driver == "haltpoll" and HALT_POLL.exists():
        return "cpuidle: haltpoll, guest_halt_poll_ns %s" % HALT_POLL.read_text().strip()
    return "cpuidle: " + driver


def calls(path, n):
    fd = os.open(path, os.O_RDONLY)
    try:
        worst = 0.0
        t = time.perf_counter()
        for _ in range(n):
            a = time.perf_counter()
            try:
                fcntl.ioctl(fd, termios.TCGETS, bytes(64))
            except OSError:
                pass
            worst = max(worst, time.perf_counter() - a)
        total = time.perf_counter() - t
    finally:
        # (Closed before the unmount, however the run ends.)
        os.close(fd)
    return total / n * 1e6, worst * 1e3


def hog():
    while True:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--hogs", action="store_true")
    ap.add_argument("--transports", default="classic,uring")
    ap.add_argument("--halt-poll", help="guest_halt_poll_ns values to run at, comma-separated")
    args = ap.parse_args()
    polls = [None]
    if args.halt_poll:
        # (The governor's parameter exists wherever it is built in; it
        # decides only under the haltpoll driver.)
        if not idle().startswith("cpuidle: haltpoll,"):
            sys.exit("bench: --halt-poll: this machine's cpuidle driver is not haltpoll")
        polls = [int(n) for n in args.halt_poll.split(",")]
    print(idle())
    if not BIN.exists():
        sys.exit("bench: build the release binary first: cargo build --release")
    # What is put back, read before anything is changed; a SIGTERM or
    # SIGHUP ends the run through the `finally` that puts it back.
    was = PARAM.read_text().strip() if PARAM.exists() else None
    poll_was = HALT_POLL.read_text().strip() if args.halt_poll else None

    def stop(signum, _frame):
        raise SystemExit("bench: ended by signal %d" % signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    cpus = sorted(os.sched_getaffinity(0))
    rows = []
    runs = [(t, p) for p in polls for t in args.transports.split(",")]
    try:
        if was is not None and was != "Y":
            PARAM.write_text("1")
        for transport, poll in runs:
            if poll is not None:
                HALT_POLL.write_text(str(poll))
            top = Path(tempfile.mkdtemp(prefix="roundtrip-"))
            root = top / "skills"
            root.mkdir()
            subprocess.run([str(BIN), "mount", str(root), "--transport", transport], check=True,
                           stdout=subprocess.DEVNULL)
            hogs = []
            try:
                (root / "f").write_text("x")
                if args.hogs:
                    hogs = [mp.Process(target=hog, daemon=True) for _ in cpus]
                    for h in hogs:
                        h.start()
                    time.sleep(0.5)
                row = [transport if poll is None else "%s, halt poll %d ns" % (transport, poll)]
                for pin in [None] + cpus[:2]:
                    os.sched_setaffinity(0, set(cpus) if pin is None else {pin})
                    mean, worst = calls(root / "f", args.calls)
                    row.append("%.1f (%.1f ms)" % (mean, worst))
                os.sched_setaffinity(0, set(cpus))
                rows.append(row)
            finally:
                for h in hogs:
                    h.terminate()
                subprocess.run([str(BIN), "umount", str(root)], stdout=subprocess.DEVNULL)
                shutil.rmtree(top, ignore_errors=True)
    finally:
        try:
            if poll_was is not None:
                HALT_POLL.write_text(poll_was)
        finally:
            if was is not None and was != "Y":
                PARAM.write_text("0")
    print("| transport | caller unpinned | pinned to CPU %d | pinned to CPU %d |" % tuple(cpus[:2]))
    print("|---|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
