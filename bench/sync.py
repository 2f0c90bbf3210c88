#!/usr/bin/env python3
"""Skills across machines: `skillfs sync` against git by hand, one run.

Two replicas on this machine (two mounts, two stores) and one bare
repository, reached over SSH on 127.0.0.1 (an sshd of the bench's own, with
keys made for it) or by path. A tree of SKILLS skills (a SKILL.md of about
1.5 KB and a references/notes.md each) is made on the first replica, then:

  first sync, push     replica A's `skillfs sync`: every version as a
                       commit, pushed
  first sync, pull     replica B's `skillfs sync`: fetch, merge, the whole
                       tree written through B's mount (a version each)
  one file, push       A edits one SKILL.md; A's `skillfs sync`
  one file, pull       B's `skillfs sync`: fetch, merge, one skill swapped

and the same by hand with git on plain directories (what a user of git
would do instead): `git add -A; git commit; git push` in a working tree of
the same files, `git pull` in a clone of it (the first pull: `git clone`).

Then, on B, A's newest version read through B's mount (`.history/REPLICA:ID`,
served by B's daemon from git): the first lookup of the name (the replica's
versions listed, the version's tree read), a `cp -a` of one skill out of it
(each file copied out of git at its open), the same copy again (the tree
kept in memory, small files kept copied), and `skillfs show` of one file of
it for comparison.

Each step is timed as the command's wall time; the median of REPS
repeats (each in fresh directories) is printed, with skillfs/git.

usage: bench/sync.py [--skills 1000] [--reps 3] [--remote ssh|path] [--dir DIR]
Needs root (the mounts, and sshd for --remote ssh), git, openssh-server,
and a release build (cargo build --release; SKILLFS_BIN names another).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("SKILLFS_BIN", REPO / "target" / "release" / "skillfs"))


def run(cmd, **kw):
    kw.setdefault("check", True)
    kw.setdefault("stdout", subprocess.DEVNULL)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("timeout", 600)
    return subprocess.run(cmd, **kw)


def timed(cmd, env=None, cwd=None):
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=600)
    took = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit("%s failed: %s" % (" ".join(map(str, cmd)), out.stderr.decode()))
    return took


class Sshd:
    """An sshd of the bench's own on 127.0.0.1, with its own keys."""

    def __init__(self, d):
        os.makedirs(d, exist_ok=True)
        for key in ("host_key", "client_key"):
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, key)])
        shutil.copy(os.path.join(d, "client_key.pub"), os.path.join(d, "authorized_keys"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = os.path.join(d, "sshd_config")
        with open(conf, "w") as f:
            f.write("Port %d\nListenAddress 127.0.0.1\nHostKey %s/host_key\n"
                    "AuthorizedKeysFile %s/authorized_keys\nPasswordAuthentication no\n"
                    "PermitRootLogin yes\nStrictModes no\nUsePAM no\nPidFile %s/pid\n"
                    % (self.port, d, d, d))
        os.makedirs("/run/sshd", exist_ok=True)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", conf],
                                     stderr=subprocess.DEVNULL)
        self.ssh = ("ssh -i %s/client_key -o StrictHostKeyChecking=no "
                    "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -p %d"
                    % (d, self.port))
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        sys.exit("sshd did not start")

    def url(self, path):
        return "ssh://root@127.0.0.1:%d%s" % (self.port, path)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def make_tree(root, n, seed_line):
    for i in range(n):
        d = os.path.join(root, "cat%02d" % (i % 20), "skill-%04d" % i)
        os.makedirs(os.path.join(d, "references"), exist_ok=True)
        body = "".join("Step %d of skill %d: %s\n" % (k, i, seed_line) for k in range(30))
        with open(os.path.join(d, "SKILL.md"), "w") as f:
            f.write("---\nname: skill-%04d\ndescription: bench skill %d\n---\n%s" % (i, i, body))
        with open(os.path.join(d, "references", "notes.md"), "w") as f:
            f.write("notes of %d\n" % i)


def edit_one(root):
    p = os.path.join(root, "cat07", "skill-0007", "SKILL.md")
    with open(p, "a") as f:
        f.write("One more line.\n")


def one_rep(base, n, remote_kind, sshd):
    top = tempfile.mkdtemp(prefix="sync-bench-", dir=base)
    env = dict(os.environ)
    if sshd:
        env["GIT_SSH_COMMAND"] = sshd.ssh
    bare = os.path.join(top, "hub.git")
    run(["git", "init", "--bare", "--quiet", bare])
    url = sshd.url(bare) if remote_kind == "ssh" else bare
    roots = [os.path.join(top, r, "skills") for r in ("a", "b")]
    for r in roots:
        os.makedirs(r)
    make_tree(roots[0], n, "as written")
    got = {}
    mounted = []
    try:
        for r in roots:
            run([str(BIN), "mount", r], env=env)
            mounted.append(r)
            run([str(BIN), "remote", "add", "hub", url, "--no-check", "--root", r], env=env)
        got["first sync, push"] = timed([str(BIN), "sync", "--root", roots[0]], env)
        got["first sync, pull"] = timed([str(BIN), "sync", "--root", roots[1]], env)
        probe = os.path.join(roots[1], "cat07", "skill-0007", "SKILL.md")
        assert os.path.exists(probe), "the pull merged nothing"
        edit_one(roots[0])
        got["one file, push"] = timed([str(BIN), "sync", "--root", roots[0]], env)
        got["one file, pull"] = timed([str(BIN), "sync", "--root", roots[1]], env)
        with open(probe) as f:
            assert f.read().endswith("One more line.\n"), "the edit did not arrive"
        # A's newest version, through B's `.history`.
        with open(os.path.join(top, "a", ".skillfs", "skills", "REPLICA")) as f:
            rid = f.read().strip()
        out = run([str(BIN), "log", "--replica", rid, "--json", "-n", "1", "--root", roots[1]],
                  env=env, stdout=subprocess.PIPE).stdout
        name = "%s:%d" % (rid[:8], json.loads(out.decode().splitlines()[-1])["id"])
        h = os.path.join(roots[1], ".history", name)
        skill = os.path.join(h, "cat07", "skill-0007")
        got["history: first lookup"] = timed(["stat", "-c", "%i", h])
        got["history: cp -a of a skill"] = timed(["cp", "-a", skill, os.path.join(top, "cp1")])
        got["history: the same again"] = timed(["cp", "-a", skill, os.path.join(top, "cp2")])
        with open(os.path.join(top, "cp1", "SKILL.md")) as f:
            assert f.read().endswith("One more line.\n"), "not the newest version"
        got["show: one file"] = timed(
            [str(BIN), "show", name + ":cat07/skill-0007/SKILL.md", "--root", roots[1]], env)
    finally:
        for r in mounted:
            subprocess.run([str(BIN), "umount", r], timeout=60)
    # The same by hand with git.
    gbare = os.path.join(top, "git-hub.git")
    run(["git", "init", "--bare", "--quiet", gbare])
    gurl = sshd.url(gbare) if remote_kind == "ssh" else gbare
    wa, wb = os.path.join(top, "git-a"), os.path.join(top, "git-b")
    os.makedirs(wa)
    make_tree(wa, n, "as written")
    g = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    run(g + ["init", "--quiet", "-b", "main", wa])
    run(g + ["remote", "add", "hub", gurl], cwd=wa)
    got["git: first push"] = timed(
        ["sh", "-c", "git add -A && git -c user.name=b -c user.email=b@l commit -qm first"
         " && git push -q hub main"], env, wa)
    got["git: first pull (clone)"] = timed(["git", "clone", "-q", "-b", "main", gurl, wb], env)
    edit_one(wa)
    got["git: one file, push"] = timed(
        ["sh", "-c", "git add -A && git -c user.name=b -c user.email=b@l commit -qm one"
         " && git push -q hub main"], env, wa)
    got["git: one file, pull"] = timed(["git", "pull", "-q", "origin", "main"], env, wb)
    shutil.rmtree(top, ignore_errors=True)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skills", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--remote", choices=["ssh", "path"], default="ssh")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    if not BIN.exists():
        sys.exit("no release build: cargo build --release")
    sshd = Sshd(tempfile.mkdtemp(prefix="sync-bench-sshd-", dir=a.dir)) if a.remote == "ssh" else None
    try:
        reps = [one_rep(a.dir, a.skills, a.remote, sshd) for _ in range(a.reps)]
    finally:
        if sshd:
            sshd.stop()
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    print("%d skills, remote over %s, median of %d (seconds)" % (a.skills, a.remote, a.reps))
    print("| step | skillfs sync | git by hand | ratio |")
    print("|---|---:|---:|---:|")
    pairs = [("first sync, push", "git: first push"),
             ("first sync, pull", "git: first pull (clone)"),
             ("one file, push", "git: one file, push"),
             ("one file, pull", "git: one file, pull")]
    for s, g in pairs:
        print("| %s | %.3f | %.3f | %.1fx |" % (s, med[s], med[g], med[s] / med[g]))
    print()
    print("| another replica's version, read on B (ms) | median |")
    print("|---|---:|")
    for s in ("history: first lookup", "history: cp -a of a skill", "history: the same again",
              "show: one file"):
        print("| %s | %.1f |" % (s, med[s] * 1000))


if __name__ == "__main__":
    main()
