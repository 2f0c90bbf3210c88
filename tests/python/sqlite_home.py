"""SQLite through a mount over the agent's home, as on ext4.

WAL mode (its -shm file is mapped shared by every connection), POSIX locks
between two processes, a writer killed in the middle of a transaction, and
the database reopened intact (PRAGMA integrity_check).

Usage: sqlite_home.py DIR
"""

import os
import signal
import sqlite3
import subprocess
import sys
import time

DB = os.path.join(sys.argv[1], "sqlite-home.db")

if len(sys.argv) > 2 and sys.argv[2] == "child-writer":
    # Commits 100 rows, then starts a transaction it never ends.
    c = sqlite3.connect(DB, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    for i in range(100):
        c.execute("INSERT INTO t(v) VALUES (?)", (f"committed {i}",))
    c.execute("BEGIN IMMEDIATE")
    for i in range(5000):
        c.execute("INSERT INTO t(v) VALUES (?)", ("x" * 200,))
    print("mid-transaction", flush=True)
    time.sleep(600)
    sys.exit(0)

if len(sys.argv) > 2 and sys.argv[2] == "child-locker":
    # Holds the write lock until told to stop (a line on stdin).
    c = sqlite3.connect(DB, isolation_level=None)
    c.execute("BEGIN IMMEDIATE")
    c.execute("INSERT INTO t(v) VALUES ('from the other process')")
    print("locked", flush=True)
    sys.stdin.readline()
    c.execute("COMMIT")
    sys.exit(0)

db = sqlite3.connect(DB, isolation_level=None)
assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT)")
for i in range(200):
    db.execute("INSERT INTO t(v) VALUES (?)", (f"row {i}",))
assert os.path.exists(DB + "-wal") and os.path.exists(DB + "-shm")

# Another process takes the write lock: this one must wait, then see its row.
locker = subprocess.Popen(
    [sys.executable, __file__, sys.argv[1], "child-locker"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
)
assert locker.stdout.readline().strip() == "locked"
other = sqlite3.connect(DB, isolation_level=None, timeout=0)
try:
    other.execute("BEGIN IMMEDIATE")
    raise AssertionError("a second writer got the lock another process holds")
except sqlite3.OperationalError as e:
    assert "locked" in str(e), e
other.close()
locker.stdin.write("go\n")
locker.stdin.flush()
assert locker.wait(30) == 0
n = db.execute("SELECT count(*) FROM t").fetchone()[0]
assert n == 201, n
assert db.execute("SELECT count(*) FROM t WHERE v = 'from the other process'").fetchone()[0] == 1

# A writer killed in the middle of a transaction.
writer = subprocess.Popen(
    [sys.executable, __file__, sys.argv[1], "child-writer"], stdout=subprocess.PIPE, text=True
)
assert writer.stdout.readline().strip() == "mid-transaction"
os.kill(writer.pid, signal.SIGKILL)
writer.wait()
db.close()
db = sqlite3.connect(DB, isolation_level=None)
assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
n = db.execute("SELECT count(*) FROM t").fetchone()[0]
assert n == 301, f"{n} rows: the killed transaction must leave none, the commits all"
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.close()
print("sqlite ok")
