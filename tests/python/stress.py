#!/usr/bin/env python3
"""A multi-process stress on one shared subtree (in the spirit of fsstress,
which is not used: it ships only in xfstests and LTP).

    stress.py run ROOT --procs 4 --seconds 8 --seed N
    stress.py tree ROOT

`run`: PROCS processes, each with its own seeded random stream, for SECONDS,
on the same few directories (a, b, a/c, b/d, a/c/e and ROOT itself, and x, a/y, b/d/z for directories alone): each
writes files of its own names (p<i>-<k>) by O_TRUNC rewrites, with and
without fsync, by temp file + fsync + rename over (the temp hidden by
skillfs's default rules), by a rewrite in place then ftruncate, and through
mmap; truncates them to nothing, renames them (across directories too),
removes them, makes symlinks, reads them with read() and mmap; and every
process makes, removes and renames the shared directories under the others'
feet, fsyncs directories and lists them. Every content is self-checking
(`SKF1 <len> <sha256>` then the bytes), so a read of one of its own files
(which only that process writes) must be empty or whole. ENOENT, EEXIST,
ENOTEMPTY and EINVAL (a directory renamed into itself) are what a shared
tree answers; any other errno, and any bad read, fails the run. Prints one
JSON object: operations done and errnos seen per kind, and the failures.

`tree`: every entry below ROOT, as JSON (a file's size and sha256, whether
its content is whole; a symlink's target; a directory), and exit 1 if a
regular file is neither empty nor whole.
"""

import errno
import hashlib
import json
import mmap
import multiprocessing as mp
import os
import random
import sys
import time

DIRS = ["", "a", "b", "a/c", "b/d", "a/c/e"]
SHARED = DIRS[1:] + ["x", "a/y", "b/d/z"]  # the last ones hold no file of a process's own
EXPECTED = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.EINVAL}


def body(rng, tag):
    # Mostly small files, some past 64 KiB and a few of several hundred.
    size = rng.choice([rng.randint(0, 2000), rng.randint(2000, 20000), rng.randint(60000, 70000),
                       rng.randint(100000, 300000)])
    data = (tag + " ").encode() * (size // (len(tag) + 1) + 1)
    data = data[:size]
    return b"SKF1 %d %s\n" % (len(data), hashlib.sha256(data).hexdigest().encode()) + data


def whole(blob):
    if not blob:
        return True
    head, sep, data = blob.partition(b"\n")
    parts = head.split()
    return bool(sep) and len(parts) == 3 and parts[0] == b"SKF1" and parts[1].isdigit() \
        and int(parts[1]) == len(data) and hashlib.sha256(data).hexdigest().encode() == parts[2]


class Worker:
    def __init__(self, root, proc, seed):
        self.root = root
        self.p = proc
        self.rng = random.Random(seed * 1000 + proc)
        self.n = 0
        self.bad = []

    def path(self, rel):
        return os.path.join(self.root, rel) if rel else self.root

    def own(self):
        d = self.rng.choice(DIRS)
        return self.path(os.path.join(d, "p%d-%d" % (self.p, self.rng.randrange(8))))

    def content(self):
        self.n += 1
        return body(self.rng, "p%d-v%d" % (self.p, self.n))

    def check(self, path, blob, how):
        if not whole(blob):
            self.bad.append("%s of %s: %d bytes, neither empty nor whole: %r"
                            % (how, path, len(blob), blob[:60]))

    # The operations; each may raise OSError.
    def write(self, sync=False):
        p = self.own()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, self.content())
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def write_fsync(self):
        self.write(sync=True)

    def atomic(self):
        p = self.own()
        d, name = os.path.split(p)
        tmp = os.path.join(d, ".%s.tmp.%d" % (name, self.n))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, self.content())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, p)
        except OSError:
            os.unlink(tmp)
            raise

    def in_place(self):
        p = self.own()
        fd = os.open(p, os.O_RDWR)
        try:
            new = self.content()
            os.pwrite(fd, new, 0)
            os.ftruncate(fd, len(new))
        finally:
            os.close(fd)

    def mmap_write(self):
        p = self.own()
        new = self.content()
        if not new:
            return
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, len(new))
            with mmap.mmap(fd, len(new)) as m:
                m[:] = new
                m.flush()
        finally:
            os.close(fd)

    def read(self):
        p = self.own()
        with open(p, "rb") as f:
            self.check(p, f.read(), "read")

    def mmap_read(self):
        p = self.own()
        fd = os.open(p, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size:
                with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
                    self.check(p, m[:], "mmap read")
        finally:
            os.close(fd)

    def read_any(self):
        d = self.path(self.rng.choice(DIRS))
        for name in os.listdir(d):
            q = os.path.join(d, name)
            if not os.path.islink(q) and os.path.isfile(q):
                with open(q, "rb") as f:
                    f.read()

    def truncate(self):
        os.truncate(self.own(), 0)

    def rename(self):
        os.rename(self.own(), self.own())

    def unlink(self):
        os.unlink(self.own())

    def symlink(self):
        p = self.own() + "-l"
        os.symlink(self.rng.choice(["../a", "p%d-0" % self.p, "nowhere"]), p)
        os.readlink(p)

    def unlink_symlink(self):
        os.unlink(self.own() + "-l")

    def mkdir(self):
        os.mkdir(self.path(self.rng.choice(SHARED)))

    def rmdir(self):
        os.rmdir(self.path(self.rng.choice(SHARED)))

    def rename_dir(self):
        os.rename(self.path(self.rng.choice(SHARED)), self.path(self.rng.choice(SHARED)))

    def fsync_dir(self):
        fd = os.open(self.path(self.rng.choice(DIRS)), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def listdir(self):
        os.listdir(self.path(self.rng.choice(DIRS)))


OPS = [("write", 20), ("write_fsync", 6), ("atomic", 6), ("in_place", 5), ("mmap_write", 5),
       ("read", 12), ("mmap_read", 5), ("read_any", 3), ("truncate", 3), ("rename", 8),
       ("unlink", 5), ("symlink", 2), ("unlink_symlink", 2), ("mkdir", 6), ("rmdir", 3),
       ("rename_dir", 3), ("fsync_dir", 2), ("listdir", 3)]


def worker(root, proc, seed, seconds, out):
    w = Worker(root, proc, seed)
    names = [n for n, _ in OPS]
    weights = [k for _, k in OPS]
    done, errs, unexpected = {}, {}, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        op = w.rng.choices(names, weights)[0]
        try:
            getattr(w, op)()
            done[op] = done.get(op, 0) + 1
        except OSError as e:
            key = "%s %s" % (op, errno.errorcode.get(e.errno, e.errno))
            errs[key] = errs.get(key, 0) + 1
            if e.errno not in EXPECTED:
                unexpected.append("process %d: %s: %s" % (proc, op, e))
    out.put((done, errs, unexpected, w.bad))


def run(root, procs, seconds, seed):
    for d in DIRS[1:]:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    q = mp.Queue()
    ps = [mp.Process(target=worker, args=(root, i, seed, seconds, q)) for i in range(procs)]
    for p in ps:
        p.start()
    results = [q.get(timeout=seconds + 120) for _ in ps]
    for p in ps:
        p.join()
    total, errs, unexpected, bad = {}, {}, [], []
    for d, e, u, b in results:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
        for k, v in e.items():
            errs[k] = errs.get(k, 0) + v
        unexpected += u
        bad += b
    print(json.dumps({"ops": sum(total.values()), "done": total, "errors": errs,
                      "unexpected": unexpected[:20], "bad_reads": bad[:20]}, sort_keys=True))
    return 1 if unexpected or bad else 0


def tree(root):
    entries, broken = {}, []
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                entries[rel] = "link " + os.readlink(p)
            elif os.path.isdir(p):
                entries[rel] = "dir"
            else:
                with open(p, "rb") as f:
                    blob = f.read()
                entries[rel] = "file %d %s" % (len(blob), hashlib.sha256(blob).hexdigest())
                if not whole(blob):
                    broken.append(rel)
    print(json.dumps({"entries": entries, "broken": broken}, sort_keys=True))
    return 1 if broken else 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "tree":
        return tree(sys.argv[2])
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        args = dict(zip(sys.argv[3::2], sys.argv[4::2]))
        return run(sys.argv[2], int(args.get("--procs", 4)), float(args.get("--seconds", 8)),
                   int(args.get("--seed", 1)))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
