#!/usr/bin/env python3
"""What the store keeps, against what was written and what the agent's own
backups would keep for the same history, for one or more builds side by
side.

Two histories, each on a fresh mount and store per build:

  fsx       fsx 0.3.2 (scripts/fsx.toml, as scripts/fsx.sh runs it: writes,
            mapped writes, truncates, fsyncs... on one file of at most
            256 KiB) for --fsx-ops operations of seed --fsx-seed; every
            close, fsync and msync is a version
  workload  the agent workload (skills_workload.py: populate --skills
            skills, then walk, readall, edit, atomic, sync, stat, fsync),
            one phase at a time

For each it prints the store's bytes (blobs + journal, as `du -sb`), the
versions recorded (journal records that name a new content of a path),
their bytes (the sum of each such version's size: what keeping every
version whole costs), and what the agent's curator would keep for the same
history: `agent.curator_backup` snapshots the whole skills tree as a
tar.gz (gzip level 6) before each mutating pass. For the workload, the
agent's own `snapshot_skills()` makes one after each phase (with
--agent-python, the interpreter of a venv holding hermes-agent, as
scripts/test.sh makes it; else the same tarball made here, as its code
does). For fsx, one tarball per version (made here; estimated from every
--sample-th version, read back from .history, times the number of
versions).

usage: bench/store_size.py [--bin BIN ...] [--fsx-ops 8000] [--fsx-seed 1]
                           [--skills 1000] [--sample 50] [--json FILE]
                           [--agent-python PY]
  --bin: a skillfs binary; repeat it to compare builds (default: the
  release build). fsx is installed into target/fsx as scripts/fsx.sh does.
Needs root (the mounts); the machine's default transport is used.
"""

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PHASES = ["populate", "walk", "readall", "edit", "atomic", "sync", "stat", "fsync"]


def fsx_bin():
    tools = Path(os.environ.get("FSX_ROOT", REPO / "target" / "fsx"))
    fsx = tools / "bin" / "fsx"
    if not fsx.exists():
        print("store_size: installing fsx 0.3.2 into", tools, file=sys.stderr)
        subprocess.run(["cargo", "install", "--locked", "--quiet", "fsx", "--version", "0.3.2",
                        "--root", str(tools)], check=True)
    return fsx


def du(path):
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def versions(store):
    """(count, bytes) of the records that name a new content of a path."""
    last = {}
    n = size = 0
    for seg in sorted((store / "journal").glob("*.jsonl")):
        for line in seg.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            st = r.get("state") or {}
            if st.get("kind") != "file" or not st.get("blob"):
                continue
            path = r.get("path")
            if last.get(path) != st["blob"]:
                last[path] = st["blob"]
                n += 1
                size += st.get("size", 0)
    return n, size


def tarball(members):
    """The bytes of a curator-style snapshot (tar.gz, level 6) of `members`:
    (name, bytes) pairs, or a directory to add whole."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tf:
        if isinstance(members, Path):
            tf.add(str(members), arcname="skills",
                   filter=lambda ti: None if ti.name.startswith("skills/.history") else ti)
        else:
            for name, data in members:
                ti = tarfile.TarInfo("skills/" + name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return len(buf.getvalue())


class Mount:
    def __init__(self, binary, base):
        self.bin = binary
        self.root = base / "skills"
        self.root.mkdir(parents=True)
        self.store = base / ".skillfs" / "skills"
        subprocess.run([binary, "mount", str(self.root)], check=True, timeout=60,
                       stdout=subprocess.DEVNULL)

    def umount(self):
        if self.root is not None:
            r = subprocess.run([self.bin, "umount", str(self.root)], timeout=60,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(self.root)])
            self.root_done, self.root = self.root, None

    def ids(self, name):
        out = subprocess.run([self.bin, "log", "--json", "--all", name], cwd=self.root,
                             capture_output=True, text=True, check=True)
        return [json.loads(l)["seq"] for l in out.stdout.splitlines() if l.strip()]


def run_fsx(binary, base, ops, seed, sample):
    m = Mount(binary, base)
    try:
        toml = REPO / "scripts" / "fsx.toml"
        subprocess.run([str(fsx_bin()), "-f", str(toml), "-S", str(seed), "-N", str(ops),
                        "-P", str(base), str(m.root / "fsx.0")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
        ids = m.ids("fsx.0")
        picked = ids[::max(1, sample)]
        tars = [tarball([("fsx.0", (m.root / ".history" / str(i) / "fsx.0").read_bytes())])
                for i in picked]
        curator = int(sum(tars) / max(1, len(tars)) * len(ids))
    finally:
        m.umount()
    n, size = versions(m.store)
    return {"store": du(m.store / "blobs") + du(m.store / "journal"), "versions": n,
            "version_bytes": size, "curator": curator}


SNAPSHOT = """
import sys
from agent.curator_backup import snapshot_skills
d = snapshot_skills("bench")
if d is None:
    sys.exit("snapshot_skills made no snapshot")
print((d / "skills.tar.gz").stat().st_size)
"""


def curator_snapshot(agent_python, home):
    """Bytes of the agent's own snapshot of HOME/skills."""
    out = subprocess.run([agent_python, "-c", SNAPSHOT], env=dict(os.environ, HERMES_HOME=str(home)),
                         capture_output=True, text=True, check=True, timeout=600)
    return int(out.stdout.split()[-1])


def run_workload(binary, base, skills, agent_python):
    m = Mount(binary, base)
    curator = 0
    try:
        for phase in PHASES:
            out = base / "wl.jsonl"
            subprocess.run([sys.executable, str(HERE / "skills_workload.py"), "--root", str(m.root),
                            "--skills", str(skills), "--phases", phase, "--label", "size",
                            "--json-out", str(out)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if agent_python:
                curator += curator_snapshot(agent_python, base)
            else:
                curator += tarball(m.root)
    finally:
        m.umount()
    n, size = versions(m.store)
    return {"store": du(m.store / "blobs") + du(m.store / "journal"), "versions": n,
            "version_bytes": size, "curator": curator}


def mib(b):
    return "%.1f MiB" % (b / 1048576)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append")
    ap.add_argument("--fsx-ops", type=int, default=8000)
    ap.add_argument("--fsx-seed", type=int, default=1)
    ap.add_argument("--skills", type=int, default=1000)
    ap.add_argument("--sample", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--agent-python", help="a venv's python with hermes-agent (its own curator snapshots)")
    args = ap.parse_args()
    bins = args.bin or [str(REPO / "target" / "release" / "skillfs")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="skillfs-size-") as tmp:
        for k, b in enumerate(bins):
            for what, run in [("fsx", lambda base: run_fsx(b, base, args.fsx_ops, args.fsx_seed, args.sample)),
                              ("workload", lambda base: run_workload(b, base, args.skills, args.agent_python))]:
                base = Path(tmp) / f"{what}-{k}"
                base.mkdir()
                results[(b, what)] = run(base)
                subprocess.run(["rm", "-rf", str(base)])
    print("| history | build | store | versions | bytes of the versions | store / versions | curator tarballs | store / tarballs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (b, what), r in results.items():
        print("| %s | %s | %s | %d | %s | %.3f | %s | %.3f |" % (
            what, b, mib(r["store"]), r["versions"], mib(r["version_bytes"]),
            r["store"] / max(1, r["version_bytes"]), mib(r["curator"]),
            r["store"] / max(1, r["curator"])))
    if args.json:
        Path(args.json).write_text(json.dumps({f"{b} {w}": r for (b, w), r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
