#!/usr/bin/env python3
"""The transport's cost against the C one: skillfs and libfuse's own
`passthrough_hp` (3.18, `--nopassthrough --nosplice`: every call a round
trip to the daemon, as skillfs's versioned files are), each over the
classic /dev/fuse transport and over io_uring, beside native, in one run.

  roundtrip     ioctl(TCGETS) on an open file: one round trip that no
                filesystem answers (the bare cost of the transport)
  py_read       Python open(p, "rb").read() of a 2 KiB file, warm
  open_close    os.open(O_RDONLY) + os.close
  walk          os.walk of 50 directories of 2 files each, listings
                cached (per walk)

usage: bench/transport.py [--reps 5] [--passthrough-hp PATH]
                          [--systems native,skillfs,skillfs-uring,libfuse,libfuse-uring]
Needs root (it mounts in a temporary directory), a release build of skillfs
(cargo build --release) and libfuse 3.18's example/passthrough_hp (built as
BENCHMARKS.md says; found by --passthrough-hp, $PASSTHROUGH_HP or PATH).
Switches the fuse module's enable_uring on for the run and back. Each
repeat mounts every system afresh in a fresh directory, in an order rotated
every repeat; a figure is the median over the repeats of the mean
microseconds per call. Prints a markdown table, then, for each transport,
whether skillfs's round trip is at most libfuse's in this run.
"""

import argparse
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target" / "release" / "skillfs"
PARAM = Path("/sys/module/fuse/parameters/enable_uring")
DIRS = 50
CALLS = ["roundtrip", "py_read", "open_close", "walk"]
LABELS = {
    "roundtrip": "bare round trip (TCGETS ioctl)",
    "py_read": "Python open().read() 2 KiB, warm",
    "open_close": "open + close",
    "walk": "walk of 50 directories",
}


def mounted(path):
    """Whether `path` is a mount point (by /proc/self/mountinfo)."""
    p = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == p for line in f)


def wait_mounted(path, proc=None, seconds=20):
    end = time.monotonic() + seconds
    while not mounted(path):
        if proc is not None and proc.poll() is not None:
            sys.exit("bench: %s ended before it mounted (exit %s)" % (proc.args[0], proc.returncode))
        if time.monotonic() > end:
            sys.exit("bench: %s was not mounted after %ds" % (path, seconds))
        time.sleep(0.05)


class System:
    """One system in a fresh directory: `start` gives the directory the
    calls run in, `stop` unmounts and removes it."""

    def __init__(self, name, hp):
        self.name = name
        self.hp = hp
        self.proc = None
        self.top = Path(tempfile.mkdtemp(prefix="transport-"))

    def start(self):
        if self.name == "native":
            self.dir = self.top / "native"
            self.dir.mkdir()
        elif self.name.startswith("skillfs"):
            self.dir = self.top / "skills"
            self.dir.mkdir()
            transport = "uring" if self.name.endswith("uring") else "classic"
            subprocess.run([str(BIN), "mount", str(self.dir), "--transport", transport],
                           check=True, stdout=subprocess.DEVNULL)
        else:
            src = self.top / "src"
            src.mkdir()
            self.dir = self.top / "mnt"
            self.dir.mkdir()
            args = [self.hp, "--foreground", "--nopassthrough", "--nosplice"]
            if self.name.endswith("uring"):
                args += ["-o", "io_uring"]
            self.proc = subprocess.Popen(args + [str(src), str(self.dir)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            wait_mounted(self.dir, self.proc)
        return self.dir

    def stop(self):
        if self.name.startswith("skillfs"):
            subprocess.run([str(BIN), "umount", str(self.dir)], stdout=subprocess.DEVNULL)
        elif self.proc is not None:
            if mounted(self.dir):
                subprocess.run(["umount", "-l", str(self.dir)])
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            err = self.proc.stderr.read().decode(errors="replace")
            if self.proc.returncode not in (0, None) and err.strip():
                print("bench: %s said: %s" % (self.name, err.strip()[:300]), file=sys.stderr)
        shutil.rmtree(self.top, ignore_errors=True)


def make_tree(root):
    files = []
    for d in range(DIRS):
        sub = root / ("d%02d" % d)
        sub.mkdir()
        for i in range(2):
            p = sub / ("f%d.md" % i)
            with open(p, "wb") as f:
                f.write(bytes([65 + d % 26]) * 2048)
            files.append(p)
    os.sync()
    return files


def measure(root):
    """{call: mean microseconds per call} for the tree under `root`."""
    files = make_tree(root)
    out = {}
    fd = os.open(files[0], os.O_RDONLY)
    n = 4000
    for _ in range(200):
        try:
            fcntl.ioctl(fd, termios.TCGETS, bytes(64))
        except OSError:
            pass
    t = time.perf_counter()
    for _ in range(n):
        try:
            fcntl.ioctl(fd, termios.TCGETS, bytes(64))
        except OSError:
            pass
    out["roundtrip"] = (time.perf_counter() - t) / n * 1e6
    os.close(fd)
    for p in files:  # warm: the first read of each file untimed
        with open(p, "rb") as f:
            f.read()
    passes = 10
    t = time.perf_counter()
    for _ in range(passes):
        for p in files:
            with open(p, "rb") as f:
                f.read()
    out["py_read"] = (time.perf_counter() - t) / (passes * len(files)) * 1e6
    t = time.perf_counter()
    for _ in range(passes):
        for p in files:
            os.close(os.open(p, os.O_RDONLY))
    out["open_close"] = (time.perf_counter() - t) / (passes * len(files)) * 1e6
    for _ in os.walk(root):
        pass
    walks = 20
    t = time.perf_counter()
    for _ in range(walks):
        for _ in os.walk(root):
            pass
    out["walk"] = (time.perf_counter() - t) / walks * 1e6
    return out


def find_hp(given):
    for c in [given, os.environ.get("PASSTHROUGH_HP"), shutil.which("passthrough_hp")]:
        if c and os.access(c, os.X_OK):
            return c
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--passthrough-hp")
    ap.add_argument("--systems", default="native,skillfs,skillfs-uring,libfuse,libfuse-uring")
    args = ap.parse_args()
    systems = args.systems.split(",")
    if not BIN.exists():
        sys.exit("bench: build the release binary first: cargo build --release")
    hp = find_hp(args.passthrough_hp)
    if hp is None and any(s.startswith("libfuse") for s in systems):
        sys.exit("bench: libfuse's passthrough_hp not found (--passthrough-hp PATH, "
                 "$PASSTHROUGH_HP, or PATH; BENCHMARKS.md says how to build it)")
    was = PARAM.read_text().strip() if PARAM.exists() else None
    if any(s.endswith("uring") for s in systems):
        if was is None:
            sys.exit("bench: this kernel has no FUSE over io_uring (%s missing)" % PARAM)
        PARAM.write_text("1")
    results = {s: {c: [] for c in CALLS} for s in systems}
    try:
        for rep in range(args.reps):
            order = systems[rep % len(systems):] + systems[:rep % len(systems)]
            for name in order:
                s = System(name, hp)
                try:
                    got = measure(s.start())
                finally:
                    s.stop()
                for c in CALLS:
                    results[name][c].append(got[c])
    finally:
        if was is not None:
            PARAM.write_text("1" if was == "Y" else "0")
    med = {s: {c: statistics.median(results[s][c]) for c in CALLS} for s in systems}
    print("| call | " + " | ".join(systems) + " |")
    print("|---|" + "---:|" * len(systems))
    for c in CALLS:
        print("| %s | %s |" % (LABELS[c], " | ".join("%.1f" % med[s][c] for s in systems)))
    for ours, theirs in [("skillfs", "libfuse"), ("skillfs-uring", "libfuse-uring")]:
        if ours in med and theirs in med:
            a, b = med[ours]["roundtrip"], med[theirs]["roundtrip"]
            print("\n%s round trip %.1f us, %s %.1f us: %s" % (
                ours, a, theirs, b, "at most libfuse's" if a <= b else "ABOVE libfuse's"))


if __name__ == "__main__":
    main()
