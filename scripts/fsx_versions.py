#!/usr/bin/env python3
"""Check every version skillfs recorded during an fsx run against fsx's own log.

fsx (the Rust port on crates.io) is deterministic: the bytes of a write or a
mapped write at step S, offset O are S % 256 at even offsets and
(S + R[O]) % 256 at odd ones, R being bytes drawn from its seed before the
first step. This script replays the operations of fsx's log (`fsx -v`, one
line per operation) on a buffer, from R (read from ORIG, a file fsx itself
wrote at step 1 over the whole length: ORIG[O] = 1 + R[O] at odd O), and
checks that:

  - the file's versions in the journal (`skillfs log --json --all FILE`, in
    order) are the contents the file had between operations, in the same
    order, each one (a subsequence of the states fsx went through: no version
    holds bytes the file never had, and none is out of order);
  - at every point where a version is due (a close, an fsync, an fdatasync,
    the msync after each mapped write, the end), the newest version matched
    so far is the content at that point;
  - the live file after the run is the content fsx ends with.

usage: fsx_versions.py --orig ORIG --log LOG --journal JOURNAL --live FILE
                       [--no-msync]
"""

import argparse
import hashlib
import json
import re
import sys

NUM = r"(0x[0-9a-f]+)"
RE_WRITE = re.compile(r"^\s*(\d+) (write|mapwrite)\s+%s \.\.\s+%s \(\s*%s bytes\)" % (NUM, NUM, NUM))
RE_TRUNC = re.compile(r"^\s*(\d+) truncate\s+%s =>\s+%s" % (NUM, NUM))
RE_CFR = re.compile(r"^\s*(\d+) copy_file_range \[\s*%s:\s*%s\] => \[\s*%s:\s*%s\] \(\s*%s bytes\)" % ((NUM,) * 5))
RE_FALLOC = re.compile(r"^\s*(\d+) posix_fallocate\s+%s \.\.\s+%s \(\s*%s bytes\)" % (NUM, NUM, NUM))
RE_PUNCH = re.compile(r"^\s*(\d+) punch_hole\s+%s \.\.\s+%s \(\s*%s bytes\)" % (NUM, NUM, NUM))
RE_SYNC = re.compile(r"^\s*(\d+) (close/open|fsync|fdatasync)$")
RE_OTHER = re.compile(r"^\s*(\d+) (read|mapread|sendfile|posix_fadvise|msync)")


def digest(buf):
    return hashlib.sha256(buf).hexdigest()


class Checker:
    def __init__(self, versions):
        self.versions = versions  # blob hashes, journal order
        self.matched = 0  # versions matched so far
        self.problems = []

    def state(self, buf, where):
        """The file holds buf between operations: match the next versions."""
        h = digest(buf)
        while self.matched < len(self.versions) and self.versions[self.matched] == h:
            self.matched += 1
        return h

    def due(self, h, where):
        """A version of the content h must have been recorded by now."""
        if self.matched == 0 or self.versions[self.matched - 1] != h:
            self.problems.append("%s: no version of the content the file had (sha256 %s); "
                                 "%d of %d versions matched so far" % (where, h[:16], self.matched, len(self.versions)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orig", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--journal", required=True)
    ap.add_argument("--live", required=True)
    ap.add_argument("--no-msync", action="store_true", help="fsx ran with nomsyncafterwrite")
    args = ap.parse_args()

    with open(args.orig, "rb") as f:
        first = f.read()
    # R at odd offsets (even ones are never used), from fsx's own step-1 write.
    orig = bytes((b - 1) % 256 for b in first)
    tables = [bytes((i + s) % 256 for i in range(256)) for s in range(256)]

    versions = []
    with open(args.journal) as f:
        for line in f:
            rec = json.loads(line)
            st = rec.get("state") or {}
            if st.get("kind") == "file" and st.get("blob"):
                versions.append(st["blob"])
    chk = Checker(versions)

    buf = bytearray()
    h = chk.state(buf, "the create")
    ops = changes = syncs = 0
    with open(args.log, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            i = line.find("] ")
            if not line.startswith("[INFO") or i < 0:
                continue
            text = line[i + 2:]
            m = RE_WRITE.match(text)
            if m:
                step, kind = int(m.group(1)), m.group(2)
                off, size = int(m.group(3), 16), int(m.group(5), 16)
                if len(buf) < off:
                    buf.extend(bytes(off - len(buf)))
                if len(buf) < off + size:
                    buf.extend(bytes(off + size - len(buf)))
                data = bytearray([step % 256]) * size
                o1 = off + (off % 2 == 0)  # first odd offset
                if o1 < off + size:
                    data[o1 - off::2] = orig[o1:off + size:2].translate(tables[step % 256])
                buf[off:off + size] = data
                ops += 1
                changes += 1
                h = chk.state(buf, "step %d" % step)
                if kind == "mapwrite" and not args.no_msync:
                    syncs += 1
                    chk.due(h, "step %d (the msync of a mapped write)" % step)
                continue
            m = RE_TRUNC.match(text)
            if m:
                new = int(m.group(3), 16)
                if new < len(buf):
                    del buf[new:]
                else:
                    buf.extend(bytes(new - len(buf)))
                ops += 1
                changes += 1
                h = chk.state(buf, "step %s" % m.group(1))
                continue
            m = RE_CFR.match(text)
            if m:
                src, dst, size = int(m.group(2), 16), int(m.group(4), 16), int(m.group(6), 16)
                data = bytes(buf[src:src + size])
                if len(buf) < dst + size:
                    buf.extend(bytes(dst + size - len(buf)))
                buf[dst:dst + size] = data
                ops += 1
                changes += 1
                h = chk.state(buf, "step %s" % m.group(1))
                continue
            m = RE_FALLOC.match(text)
            if m:
                end = int(m.group(2), 16) + int(m.group(4), 16)
                if len(buf) < end:
                    buf.extend(bytes(end - len(buf)))
                ops += 1
                changes += 1
                h = chk.state(buf, "step %s" % m.group(1))
                continue
            m = RE_PUNCH.match(text)
            if m:
                off, size = int(m.group(2), 16), int(m.group(4), 16)
                buf[off:off + size] = bytes(size)
                ops += 1
                changes += 1
                h = chk.state(buf, "step %s" % m.group(1))
                continue
            m = RE_SYNC.match(text)
            if m:
                ops += 1
                syncs += 1
                chk.due(h, "step %s (%s)" % (m.group(1), m.group(2)))
                continue
            if RE_OTHER.match(text):
                ops += 1
                continue
            chk.problems.append("a line of fsx's log this script does not know: %r" % line)

    syncs += 1
    chk.due(h, "the end of the run (the last close)")
    with open(args.live, "rb") as f:
        live = f.read()
    if live != bytes(buf):
        chk.problems.append("the live file (%d bytes) is not the content fsx ends with (%d bytes)" % (len(live), len(buf)))
    if chk.matched != len(versions):
        chk.problems.append("version %d of %d (blob %s) is no content the file had at that point of fsx's run"
                            % (chk.matched + 1, len(versions), versions[chk.matched][:16]))
    print("fsx_versions: %d operations logged, %d changes, %d points where a version is due, "
          "%d versions: %s" % (ops, changes, syncs, len(versions),
                              "all matched" if not chk.problems else "MISMATCH"))
    for p in chk.problems[:20]:
        print("fsx_versions: " + p, file=sys.stderr)
    return 1 if chk.problems else 0


if __name__ == "__main__":
    sys.exit(main())
