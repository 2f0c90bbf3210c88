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
  stat_after_read   os.stat right after the file was opened, read and closed
                    (only the stat is timed)
  rewrite           open(p, "w").write(2 KiB), as the workload's edit
  stat_after_write  os.stat right after the file was rewritten (only the stat
                    is timed)
  write_fsync       os.open(O_CREAT|O_TRUNC) + 4 KiB write + fsync + close of a
                    new file, as the workload's fsync phase
  walk              os.walk of the 200 directories, listings cached (by a walk
                    just before, untimed; per walk)
  walk_changed      the same right after a new file was made in every
                    directory (only the walk is timed; per walk)

usage: calls.py ROOT [--files 2000] [--fsyncs 100] [--reps 5] [--trace [--as-user UID]]
Prints one JSON object: microseconds per call (median of the repeats). With
--trace (root; tracefs), instead the FUSE requests each call sends, per call,
from the kernel's fuse_request_send tracepoint: {call: {opcode: count}}.
--as-user: the calls are made as UID (a mount of that user's, which root may
not enter): the tracing files are opened first, then the process drops to it.
"""

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import termios
import time

TRACING = "/sys/kernel/tracing"


class Clock:
    """Sums the time spent inside `timed()` blocks; in trace mode, turns the
    tracepoint on only inside them."""

    def __init__(self, tracer=None):
        self.total = 0.0
        self.tracer = tracer

    @contextlib.contextmanager
    def timed(self):
        if self.tracer:
            self.tracer.on()
        t = time.perf_counter()
        try:
            yield
        finally:
            self.total += time.perf_counter() - t
            if self.tracer:
                self.tracer.off()


class Tracer:
    """The kernel's fuse_request_send events of one FUSE connection. Every
    tracing file it uses is opened here, so that the process may then drop
    to another user (`--as-user`) and go on tracing."""

    def __init__(self):
        if not os.path.isdir(os.path.join(TRACING, "events")):
            subprocess.run(["mount", "-t", "tracefs", "nodev", TRACING], check=True)
            self.mounted = True
        else:
            self.mounted = False
        self.connection = None
        self.was_on = self.read("tracing_on")
        self.was_enabled = self.read("events/fuse/fuse_request_send/enable")
        self.write("tracing_on", "0")
        self.write("trace", "")
        self.write("events/fuse/fuse_request_send/enable", "1")
        self.on_fd = os.open(os.path.join(TRACING, "tracing_on"), os.O_WRONLY)
        self.enable_fd = os.open(os.path.join(TRACING, "events/fuse/fuse_request_send/enable"),
                                 os.O_WRONLY)
        # Read as it is consumed: what `take` read is gone from it.
        self.pipe_fd = os.open(os.path.join(TRACING, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)

    def watch(self, root):
        """Counts only the requests of the connection mounted at `root`."""
        st = os.stat(root)
        self.connection = os.minor(st.st_dev) if os.major(st.st_dev) == 0 else None

    def read(self, name):
        with open(os.path.join(TRACING, name)) as f:
            return f.read().strip()

    def write(self, name, value):
        with open(os.path.join(TRACING, name), "w") as f:
            f.write(value)

    def on(self):
        os.write(self.on_fd, b"1")

    def off(self):
        os.write(self.on_fd, b"0")

    def lines(self):
        """What the trace holds now, consumed."""
        chunks = []
        while True:
            try:
                chunk = os.read(self.pipe_fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        lines = b"".join(chunks).decode(errors="replace").splitlines()
        lost = [l for l in lines if "LOST" in l and "EVENTS" in l]
        if lost:
            print("calls.py: the trace lost events: %s" % lost[0].strip(), file=sys.stderr)
        return lines

    def take(self):
        """Opcode counts since the last take."""
        counts = {}
        for line in self.lines():
            if "fuse_request_send" not in line:
                continue
            # "... connection 52 req 10 opcode 3 (FUSE_GETATTR) len 56"
            parts = line.split()
            try:
                conn = int(parts[parts.index("connection") + 1])
                name = parts[parts.index("opcode") + 2].strip("()").replace("FUSE_", "")
            except (ValueError, IndexError):
                continue
            if self.connection is not None and conn != self.connection:
                continue
            counts[name] = counts.get(name, 0) + 1
        return counts

    def close(self):
        """Puts the tracing back as it was."""
        os.write(self.enable_fd, self.was_enabled.encode())
        os.write(self.on_fd, self.was_on.encode())
        for fd in (self.on_fd, self.enable_fd, self.pipe_fd):
            os.close(fd)
        if self.mounted:
            subprocess.run(["umount", TRACING])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--fsyncs", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--as-user", type=int, help="with --trace: make the calls as this uid")
    args = ap.parse_args()
    if args.as_user is not None and not args.trace:
        ap.error("--as-user goes with --trace")
    if not args.trace:
        print(json.dumps(measure(args, None)))
        return
    tracer = Tracer()
    try:
        if args.as_user is None:
            out = measure(args, tracer)
        else:
            # The calls in a child at the user's ids, tracing through the
            # files opened above; this process stays root to put the
            # tracing back however the child ends.
            child = os.fork()
            if child == 0:
                code = 1
                try:
                    uid = args.as_user
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                    print(json.dumps(measure(args, tracer)), flush=True)
                    code = 0
                except BaseException:
                    import traceback
                    traceback.print_exc()
                finally:
                    os._exit(code)
            _, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                sys.exit("calls.py: the calls as uid %d failed (%d)" % (args.as_user, code))
            return
    finally:
        tracer.close()
    print(json.dumps(out))


def measure(args, tracer):
    """{call: microseconds per call}, or with `tracer` {call: {opcode:
    requests per call}}."""
    dirs = [os.path.join(args.root, "d%03d" % i) for i in range(200)]
    paths = []
    for i in range(args.files):
        d = dirs[i % 200]
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "f%05d.md" % i)
        with open(p, "wb") as f:
            f.write(b"x" * 2048)
        paths.append(p)
    for p in paths:  # every cache warm, as for the workload's later passes
        with open(p, "rb") as f:
            f.read()
        os.stat(p)
    for _ in os.walk(args.root):
        pass

    block = b"y" * 4096
    text = "z" * 2048
    rounds = iter(range(1_000_000))

    def open_close(c):
        with c.timed():
            for p in paths:
                os.close(os.open(p, os.O_RDONLY))

    def isatty(c):
        # Opened for this call only: a file held open for reading while it
        # is rewritten makes skillfs's writer wait for that reader (up to
        # 50 ms, as root: docs/limits.md), which is not what `rewrite` times.
        fds = [os.open(p, os.O_RDONLY) for p in paths]
        try:
            with c.timed():
                for fd in fds:
                    try:
                        fcntl.ioctl(fd, termios.TCGETS, bytes(64))
                    except OSError:
                        pass
        finally:
            for fd in fds:
                os.close(fd)

    def stat(c):
        with c.timed():
            for p in paths:
                os.stat(p)

    def py_open_read(c):
        with c.timed():
            for p in paths:
                with open(p, "rb") as f:
                    f.read()

    def py_open_read_raw(c):
        with c.timed():
            for p in paths:
                with open(p, "rb", buffering=0) as f:
                    f.read()

    def stat_after_read(c):
        for p in paths:
            with open(p, "rb") as f:
                f.read()
            with c.timed():
                os.stat(p)

    def rewrite(c):
        with c.timed():
            for p in paths:
                with open(p, "w") as f:
                    f.write(text)

    def stat_after_write(c):
        for p in paths:
            with open(p, "w") as f:
                f.write(text)
            with c.timed():
                os.stat(p)

    def write_fsync(c):
        r = next(rounds)
        with c.timed():
            for k in range(args.fsyncs):
                p = os.path.join(dirs[k % 200], ".state-%d-%d.bin" % (r, k))
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, block)
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def walk(c):
        for _ in os.walk(args.root):  # listings cached by this one
            pass
        with c.timed():
            for _ in os.walk(args.root):
                pass

    def walk_changed(c):
        r = next(rounds)
        for d in dirs:
            with open(os.path.join(d, "new-%d.md" % r), "w") as f:
                f.write("n")
        with c.timed():
            for _ in os.walk(args.root):
                pass

    n = len(paths)
    calls = {
        "open_close": (open_close, n),
        "isatty": (isatty, n),
        "stat": (stat, n),
        "py_open_read": (py_open_read, n),
        "py_open_read_raw": (py_open_read_raw, n),
        "stat_after_read": (stat_after_read, n),
        "rewrite": (rewrite, n),
        "stat_after_write": (stat_after_write, n),
        "write_fsync": (write_fsync, args.fsyncs),
        "walk": (walk, 1),
        "walk_changed": (walk_changed, 1),
    }
    out = {}
    if tracer:
        tracer.watch(args.root)
        for name, (fn, count) in calls.items():
            tracer.take()
            fn(Clock(tracer))
            out[name] = {op: round(k / count, 2) for op, k in sorted(tracer.take().items())}
    else:
        for name, (fn, count) in calls.items():
            runs = []
            for _ in range(args.reps):
                c = Clock()
                fn(c)
                runs.append(c.total)
            out[name] = statistics.median(runs) / count * 1e6
    return out


if __name__ == "__main__":
    main()
