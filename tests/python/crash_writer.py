#!/usr/bin/env python3
"""Writer for the crash test: rewrites files under ROOT until the mount dies.

Every content it writes is self-checking: a body followed by a footer line
`END <sha256 of body>`, so a reader can tell one complete version from a
torn mix. After each fsync returns, the (file, sha) pair is appended to the
ACK log (outside the mount) and the ACK log is fsynced: those versions were
acknowledged as durable and must be in the journal after any crash.

usage: crash_writer.py ROOT ACKLOG ROUND SEED
"""
import errno
import hashlib
import os
import random
import sys
import tempfile


def content(rnd, i, v, rng):
    filler = ("round %d file %d version %d " % (rnd, i, v)) * rng.randint(10, 3000)
    body = ("---\nname: crash-%d\n---\n%s\n" % (i, filler)).encode()
    return body + b"END " + hashlib.sha256(body).hexdigest().encode() + b"\n"


def main():
    root, acklog, rnd, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    ack = open(acklog, "ab")
    v = 0
    try:
        while True:
            v += 1
            i = rng.randrange(8)
            path = os.path.join(root, "f%d.md" % i)
            data = content(rnd, i, v, rng)
            how = rng.randrange(3)
            if how == 0:  # write_text-style: O_TRUNC rewrite, no fsync
                with open(path, "wb") as f:
                    f.write(data)
            elif how == 1:  # rewrite with fsync
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    half = len(data) // 2
                    os.write(fd, data[:half])
                    os.write(fd, data[half:])
                    os.fsync(fd)
                finally:
                    os.close(fd)
                acked = True
            else:  # atomic write: temp file, fsync, replace
                fd, tmp = tempfile.mkstemp(dir=root, prefix=".f%d.md." % i, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                acked = True
            if how != 0 and acked:
                ack.write(("f%d.md %s\n" % (i, hashlib.sha256(data).hexdigest())).encode())
                ack.flush()
                os.fsync(ack.fileno())
    except OSError as e:
        # The daemon died under us: expected, and told apart from any other
        # error (EIO, EINVAL from a bug), which fails the round. (Over
        # io_uring a call in flight at the kill fails with ECANCELED: the
        # kernel cancels the ring's commands as the daemon's rings close.)
        if e.errno in (errno.ENOTCONN, errno.ECONNABORTED, errno.ECANCELED):
            return 0
        raise


if __name__ == "__main__":
    sys.exit(main())
