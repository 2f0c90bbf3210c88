#!/usr/bin/env python3
"""Benchmarks skillfs side by side with the native filesystem and bindfs.

Runs the agent workload (skills_workload.py, from ../shared/bench/ or the
copy beside this file) against, in one run and interleaved (the order
rotates every repeat; every repeat gets fresh directories and fresh mounts):

  native       a plain directory
  bindfs       bindfs --multithreaded over a plain directory (passthrough FUSE)
  skillfs      skillfs mounted as root, classic transport (/dev/fuse reads)
  skillfs-uring skillfs mounted as root, FUSE over io_uring (where the kernel
               has it: Linux 6.14+; the fuse module's enable_uring is switched
               on for the run and put back)
  skillfs-user skillfs mounted by an unprivileged user (with --unprivileged)

and prints every phase as a ratio to native in the same repeat (median of
the repeats), then the extra measurements: store size over bytes written,
mount time of a large tree (first, then unchanged), daemon memory, and
.history at 100,000 versions; and the cost of single calls (calls.py: an
open, an isatty, a stat, a 4 KB write + fsync), which the phases are sums
of, and the FUSE requests each call sends (calls.py --trace).

With --before BIN, skillfs is run a second time with another build of it
(`skillfs@before`, and `skillfs-uring@before`), in the same interleaved
run: a change's before and after, side by side.

usage: bench/run.py [--skills 1000] [--large 5000] [--reps 3] [--unprivileged]
                    [--versions 100000] [--before BIN] [--markdown FILE]
Needs root for bindfs and for the unprivileged variant (setpriv); installs
bindfs with apt-get when it is missing (or says how).
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import roundtrip  # noqa: E402  (bench/roundtrip.py: how the idle CPUs wait)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = REPO / "target" / "release" / "skillfs"
BEFORE = None  # --before: another build, for the systems named `...@before`
NOBODY = 65534

TARGETS = {  # phase key -> (label, skillfs target ratio, io_uring target ratio)
    "walk_first": ("loader walk, first after populate", 5.0, 2.5),
    "walk_warm": ("loader walk, warm (2nd and 3rd)", 3.0, 1.5),
    "readall": ("read every file", 3.0, 2.5),
    "stat_first": ("stat every file, first pass", 4.0, None),
    "stat_again": ("stat every file, again", 1.2, None),
    "edit": ("rewrite SKILL.md (write_text)", 2.5, None),
    "atomic": ("atomic write (mkstemp + os.replace)", 1.6, None),
    "sync": ("bundled-skill update (.bak, copytree, rmtree)", 2.0, 1.5),
    "fsync": ("4 KB write + fsync", 1.5, 1.5),
    "populate": ("populate (mkdir + write_text)", None, None),
}

URING_PARAM = Path("/sys/module/fuse/parameters/enable_uring")


@contextlib.contextmanager
def uring_enabled():
    """Yields whether FUSE over io_uring is available, switching the fuse
    module's enable_uring on (as root) for the run and back at the end."""
    if not URING_PARAM.exists():
        print("bench: this kernel has no FUSE over io_uring: skillfs-uring is left out", file=sys.stderr)
        yield False
        return
    was = URING_PARAM.read_text().strip()
    try:
        if was != "Y":
            URING_PARAM.write_text("1")
        yield True
    except OSError as e:
        print("bench: cannot switch enable_uring on (%s): skillfs-uring is left out" % e, file=sys.stderr)
        yield False
    finally:
        if was != "Y":
            try:
                URING_PARAM.write_text("0")
            except OSError:
                pass


def workload_script():
    shared = REPO.parent / "shared" / "bench" / "skills_workload.py"
    return shared if shared.exists() else HERE / "skills_workload.py"


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def as_user(cmd):
    return ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "--"] + cmd


def ensure_tools(unprivileged):
    if not BIN.exists():
        print("building skillfs (release)...", file=sys.stderr)
        subprocess.run(["cargo", "build", "--release", "--locked"], cwd=REPO, check=True)
    if shutil.which("bindfs") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            print("installing bindfs...", file=sys.stderr)
            subprocess.run("apt-get install -y -qq bindfs >/dev/null 2>&1 || "
                           "(apt-get update -qq && apt-get install -y -qq bindfs)",
                           shell=True, check=True)
        else:
            sys.exit("bench: bindfs is missing: install it (apt-get install bindfs) and rerun")
    if unprivileged:
        if os.geteuid() != 0:
            sys.exit("bench: --unprivileged needs root (it drops to uid %d with setpriv)" % NOBODY)
        if shutil.which("fusermount3") is None:
            sys.exit("bench: --unprivileged needs fusermount3 (apt-get install fuse3)")
        if os.stat("/dev/fuse").st_mode & 0o777 != 0o666:
            os.chmod("/dev/fuse", 0o666)  # as distributions set it


def run_workload(root, skills, phases, label, user=False):
    out = Path(tempfile.mktemp(prefix="bench-", suffix=".jsonl", dir="/tmp"))
    cmd = [sys.executable, str(workload_script()), "--root", str(root), "--skills", str(skills),
           "--phases", phases, "--label", label, "--json-out", str(out)]
    if user:
        os.chmod(workload_script().parent, 0o755)
        cmd = as_user(cmd)
        Path(out).touch()
        os.chown(out, NOBODY, NOBODY)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    recs = [json.loads(l) for l in out.read_text().splitlines()]
    out.unlink()
    return recs


def phase_times(recs):
    """Seconds per phase key from one workload run."""
    t = {}
    walks = [r["seconds"] for r in recs if r["phase"] == "walk"]
    stats = [r["seconds"] for r in recs if r["phase"] == "stat"]
    if walks:
        t["walk_first"] = walks[0]
        if len(walks) > 1:
            t["walk_warm"] = statistics.median(walks[1:])
    if stats:
        t["stat_first"] = stats[0]
        if len(stats) > 1:
            t["stat_again"] = statistics.median(stats[1:])
    for r in recs:
        if r["phase"] in ("populate", "readall", "edit", "atomic", "sync", "fsync"):
            t[r["phase"]] = r["seconds"]
    return t


def daemon_pid(store):
    try:
        return int((store / "LOCK").read_text().strip())
    except (OSError, ValueError):
        return None


def rss_kib(pid):
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total


def bin_of(system):
    """The skillfs binary a system runs: --before's for `...@before`."""
    return BEFORE if system.endswith("@before") else BIN


def versioned_bytes(root, user, binary=BIN):
    cmd = [str(binary), "log", "--json", "--root", str(root)]
    out = subprocess.run(as_user(cmd) if user else cmd, check=True, capture_output=True,
                         text=True).stdout
    total = 0
    for line in out.splitlines():
        r = json.loads(line)
        st = r.get("state") or {}
        if st.get("kind") == "file" and r["op"] in ("write", "scan", "unpark", "truncate", "create"):
            total += st.get("size", 0)
    return total


@contextlib.contextmanager
def mounted(system, base):
    """A fresh, empty directory of `system` (mounted when it is a FUSE one);
    yields (root, store or None, whether it runs as the unprivileged user)."""
    work = base / system
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    root = work / "skills"
    root.mkdir()
    user = system == "skillfs-user"
    if system == "native":
        yield root, None, False
        return
    if system == "bindfs":
        src = work / "src"
        src.mkdir()
        sh(["bindfs", "--multithreaded", str(src), str(root)])
        try:
            yield root, None, False
        finally:
            subprocess.run(["umount", "-l", str(root)], capture_output=True)
        return
    # skillfs, as root or as the unprivileged user
    if user:
        os.chown(work, NOBODY, NOBODY)
        os.chown(root, NOBODY, NOBODY)
    transport = "uring" if system.startswith("skillfs-uring") else "classic"
    binary = bin_of(system)
    mount = [str(binary), "mount", str(root), "--transport", transport]
    sh(as_user(mount) if user else mount)
    try:
        yield root, work / ".skillfs" / "skills", user
    finally:
        umount = [str(binary), "umount", str(root)]
        if subprocess.run(as_user(umount) if user else umount, capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], capture_output=True)


def one_system(system, base, skills, phases, extras):
    """Runs the workload on one system in a fresh directory; returns times."""
    with mounted(system, base) as (root, store, user):
        times = phase_times(run_workload(root, skills, phases, system, user=user))
        if store is None:
            return times
        pid = daemon_pid(store)
        if pid:
            extras.setdefault((system, skills, "rss_kib"), []).append(rss_kib(pid))
        written = versioned_bytes(root, user, bin_of(system))
        extras.setdefault((system, skills, "store_bytes"), []).append(du(store / "blobs") + du(store / "journal"))
        extras.setdefault((system, skills, "versioned_bytes"), []).append(written)
        return times


CALLS = {  # key -> label (see calls.py)
    "open_close": "open + close",
    "isatty": "isatty ioctl on an open file",
    "stat": "stat, cached",
    "py_open_read": "Python open().read() of 2 KiB, as the workload (3.11-3.13)",
    "py_open_read_raw": "the same without isatty (Python 3.14's open)",
    "stat_after_read": "stat right after an open, read, close",
    "rewrite": "Python open('w').write() of 2 KiB over a file",
    "stat_after_write": "stat right after that rewrite",
    "write_fsync": "new file: 4 KB write + fsync + close",
    "walk": "os.walk of 200 directories, listings cached",
    "walk_changed": "os.walk of 200 directories, each just changed",
}


def traces(systems, base):
    """{system: {call: {opcode: requests per call}}} (FUSE systems only)."""
    out = {}
    for s in systems:
        if s == "native":
            continue
        print("  per-call trace: %s" % s, file=sys.stderr)
        with mounted(s, base) as (root, _store, user):
            cmd = [sys.executable, str(HERE / "calls.py"), str(root), "--trace", "--files", "400", "--fsyncs", "40"]
            if user:
                # Root may not enter the user's mount: calls.py opens the
                # tracing files, then makes the calls as the user.
                cmd += ["--as-user", str(NOBODY)]
            res = subprocess.run(cmd, check=True, capture_output=True, text=True)
            out[s] = json.loads(res.stdout)
    return out


def fmt_trace(ops):
    if not ops:
        return "none"
    return ", ".join("%s %s" % (op, ("%g" % k)) for op, k in sorted(ops.items(), key=lambda x: -x[1]))


def per_call(systems, base, reps):
    """{system: {call: [microseconds per repeat]}}, interleaved like the workload."""
    out = {s: {} for s in systems}
    for rep in range(reps):
        order = systems[rep % len(systems):] + systems[:rep % len(systems)]
        for s in order:
            print("  per call, repeat %d: %s" % (rep + 1, s), file=sys.stderr)
            with mounted(s, base) as (root, _store, user):
                cmd = [sys.executable, str(HERE / "calls.py"), str(root)]
                if user:
                    os.chmod(HERE, 0o755)
                    cmd = as_user(cmd)
                res = subprocess.run(cmd, check=True, capture_output=True, text=True)
                for call, us in json.loads(res.stdout).items():
                    out[s].setdefault(call, []).append(us)
    return out


def interleaved(systems, base, skills, phases, reps, extras):
    """{system: {phase: [ratio to native per rep]}}, and native seconds."""
    ratios = {s: {} for s in systems if s != "native"}
    native = {}
    for rep in range(reps):
        order = systems[rep % len(systems):] + systems[:rep % len(systems)]
        times = {}
        for s in order:
            print("  %d skills, repeat %d: %s" % (skills, rep + 1, s), file=sys.stderr)
            times[s] = one_system(s, base, skills, phases, extras)
        for phase, t0 in times["native"].items():
            native.setdefault(phase, []).append(t0)
            for s in ratios:
                if phase in times[s] and t0 > 0:
                    ratios[s].setdefault(phase, []).append(times[s][phase] / t0)
    return ratios, native


def mount_times(base, skills):
    """Mount time of a large tree: first (baseline hashing), then unchanged."""
    work = base / "mounttime"
    if work.exists():
        shutil.rmtree(work)
    root = work / "skills"
    run_workload(root, skills, "populate", "mounttime")
    out = {}
    for which in ("first", "unchanged"):
        t0 = time.perf_counter()
        sh([str(BIN), "mount", str(root)])
        out[which] = time.perf_counter() - t0
        pid = daemon_pid(work / ".skillfs" / "skills")
        out["rss_kib_" + which] = rss_kib(pid) if pid else 0
        sh([str(BIN), "umount", str(root)])
    shutil.rmtree(work)
    return out


def record_line(seq, ts, path, size, blob):
    rec = {"seq": seq, "ts": ts, "op": "write", "path": path,
           "state": {"kind": "file", "blob": blob, "size": size, "mode": 420, "uid": 0, "gid": 0,
                     "mtime_ns": ts},
           "actor": {"uid": 0, "pid": 1, "comm": "bench"}}
    body = json.dumps(rec, separators=(",", ":")).encode()
    crc = zlib.crc32(body) & 0xFFFFFFFF
    return body[:-1] + b',"crc":"%08x"}\n' % crc


def history_at_scale(base, versions):
    """Daemon memory and .history speed with `versions` recorded changes."""
    work = base / "versions"
    if work.exists():
        shutil.rmtree(work)
    root = work / "skills"
    (root / "cat").mkdir(parents=True)
    store = work / ".skillfs" / "skills"
    (store / "journal").mkdir(parents=True)
    files = 100
    t0 = time.time_ns() - versions * 1000
    # Change 1 makes cat/; then `versions - 1` writes over 100 files.
    rec = {"seq": 1, "ts": t0, "op": "mkdir", "path": "cat",
           "state": {"kind": "dir", "size": 0, "mode": 493, "uid": 0, "gid": 0, "mtime_ns": t0},
           "actor": {"uid": 0, "pid": 1, "comm": "bench"}}
    body = json.dumps(rec, separators=(",", ":")).encode()
    lines = [body[:-1] + b',"crc":"%08x"}\n' % (zlib.crc32(body) & 0xFFFFFFFF)]
    for seq in range(2, versions + 1):
        i = seq % files
        lines.append(record_line(seq, t0 + seq * 1000, "cat/f%03d.md" % i, 10, "%064x" % seq))
    (store / "journal" / ("%020d.jsonl" % 1)).write_bytes(b"".join(lines))
    for i in range(files):
        (root / "cat" / ("f%03d.md" % i)).write_text("0123456789")
    t = time.perf_counter()
    sh([str(BIN), "mount", str(root)])
    mount_s = time.perf_counter() - t
    pid = daemon_pid(store)
    rss = rss_kib(pid) if pid else 0
    t = time.perf_counter()
    n = len(os.listdir(root / ".history"))
    list_s = time.perf_counter() - t
    def opens(ids):
        t = time.perf_counter()
        for k, id_ in enumerate(ids):
            try:
                os.stat(root / ".history" / str(id_) / "cat" / ("f%03d.md" % (k % files)))
            except FileNotFoundError:
                pass
        return (time.perf_counter() - t) / len(ids)
    early = opens(list(range(2, 12)) * 50)
    late = opens(list(range(versions - 500, versions)))
    sh([str(BIN), "umount", str(root)])
    shutil.rmtree(work)
    return {"versions": n, "mount_s": mount_s, "rss_kib": rss, "list_s": list_s,
            "lookup_us_early": early * 1e6, "lookup_us_late": late * 1e6}


def describe_fs(path):
    """Type, mount options and (for ext4) whether it has a journal: the
    fsync and allocation costs depend on all three."""
    st = os.stat(path)
    best = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        sep = f.index("-")
        mnt, fstype, dev, opts = f[4], f[sep + 1], f[sep + 2], f[5] + "," + f[sep + 3]
        if str(path).startswith(mnt) and (best is None or len(mnt) > len(best[0])):
            best = (mnt, fstype, dev, opts)
    if best is None:
        return "unknown"
    mnt, fstype, dev, opts = best
    text = "%s (%s)" % (fstype, opts)
    if fstype == "ext4":
        try:
            sysname = os.path.basename(os.readlink("/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))))
            task = Path("/sys/fs/ext4/%s/journal_task" % sysname).read_text().strip()
            text += ", journal: %s" % ("none" if task in ("", "<none>") else "yes")
        except OSError:
            pass
    return text


def fmt_ratio(v):
    return "%.2fx" % v if v is not None else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skills", type=int, default=1000)
    ap.add_argument("--large", type=int, default=5000, help="skills for the walk/stat run (0: skip)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--unprivileged", action="store_true")
    ap.add_argument("--versions", type=int, default=100000, help="for the .history scale run (0: skip)")
    ap.add_argument("--markdown", help="also write the report to this file")
    ap.add_argument("--dir", help="scratch directory (default: a new one under /tmp)")
    ap.add_argument("--before", help="another skillfs binary, run beside this one (before and after a change)")
    args = ap.parse_args()
    global BEFORE
    if args.before:
        BEFORE = Path(args.before).resolve()
        if not BEFORE.is_file():
            sys.exit("bench: --before %s is not a file" % args.before)
    ensure_tools(args.unprivileged)
    base = Path(args.dir or tempfile.mkdtemp(prefix="skillfs-bench-", dir="/tmp"))
    os.chmod(base, 0o755)
    with uring_enabled() as uring:
        run_all(args, base, uring)


def run_all(args, base, uring):
    systems = ["native", "bindfs", "skillfs"] + (["skillfs-uring"] if uring else []) \
        + (["skillfs-user"] if args.unprivileged else [])
    if args.before:
        systems += ["skillfs@before"] + (["skillfs-uring@before"] if uring else [])
    extras = {}
    report = []
    w = report.append
    w("# skillfs benchmarks\n")
    w("machine: %s, %d cores, kernel %s, %s; scratch filesystem: %s; python %s\n" % (
        sh(["uname", "-m"]).stdout.strip(), os.cpu_count(), os.uname().release,
        roundtrip.idle(), describe_fs(base), sys.version.split()[0]))
    w("command: `python3 bench/run.py --skills %d --large %d --reps %d%s --versions %d%s`\n" % (
        args.skills, args.large, args.reps, " --unprivileged" if args.unprivileged else "", args.versions,
        " --before BIN" if args.before else ""))
    all_phases = "populate,walk,readall,edit,atomic,sync,stat,fsync"
    runs = [(args.skills, all_phases)]
    if args.large:
        runs.append((args.large, "populate,walk,stat"))
    for skills, phases in runs:
        ratios, native = interleaved(systems, base, skills, phases, args.reps, extras)
        cols = [s for s in systems if s != "native"]
        w("\n## %d skills (median of %d interleaved repeats; ratio to native in the same repeat)\n" % (skills, args.reps))
        w("| phase | native | " + " | ".join(cols) + " | skillfs target | io_uring target |")
        w("|---|---:|" + "---:|" * len(cols) + "---:|---:|")
        for key, (label, target, uring_target) in TARGETS.items():
            if key not in native:
                continue
            row = "| %s | %.1f ms |" % (label, statistics.median(native[key]) * 1000)
            for s in cols:
                v = ratios[s].get(key)
                row += " %s |" % fmt_ratio(statistics.median(v) if v else None)
            row += " %s |" % (("<= %.1fx" % target) if target else "")
            row += " %s |" % (("<= %.1fx" % uring_target) if uring_target else "")
            w(row)
    calls = per_call(systems, base, args.reps)
    cols = [s for s in systems if s != "native"]
    w("\n## Per call (microseconds, median of %d interleaved repeats; ratio to native)\n" % args.reps)
    w("| call | native | " + " | ".join(cols) + " |")
    w("|---|---:|" + "---:|" * len(cols))
    for key, label in CALLS.items():
        n = statistics.median(calls["native"][key])
        row = "| %s | %.1f us |" % (label, n)
        for s in cols:
            v = statistics.median(calls[s][key])
            row += " %.1f us (%s) |" % (v, fmt_ratio(v / n))
        w(row)
    tr = traces(systems, base)
    tcols = [s for s in systems if s in tr]
    w("\n## FUSE requests per call (calls.py --trace: the kernel's fuse_request_send events)\n")
    w("| call | " + " | ".join(tcols) + " |")
    w("|---|" + "---|" * len(tcols))
    for key, label in CALLS.items():
        w("| %s | " % label + " | ".join(fmt_trace(tr[s].get(key)) for s in tcols) + " |")
    w("\n## Store and memory\n")
    for (system, skills, what), vals in sorted(extras.items()):
        if what == "store_bytes":
            written = statistics.median(extras[(system, skills, "versioned_bytes")])
            stored = statistics.median(vals)
            w("- %s, %d skills: store (blobs + journal) %.1f MiB for %.1f MiB of versioned content: %.2f (deduplicated by content hash; small contents compressed, large ones chunked since b33cb91)" % (
                system, skills, stored / 2**20, written / 2**20, stored / written if written else 0))
        if what == "rss_kib":
            w("- %s, %d skills: daemon resident memory after the workload %.1f MiB" % (system, skills, statistics.median(vals) / 1024))
    if args.large:
        mt = mount_times(base, args.large)
        w("- mount of a %d-skill tree: first (baseline, every file hashed) %.2f s, again unchanged (stat only) %.2f s; daemon memory after mounting %.1f MiB" % (
            args.large, mt["first"], mt["unchanged"], mt["rss_kib_unchanged"] / 1024))
    if args.versions:
        h = history_at_scale(base, args.versions)
        w("- %d versions: mount %.2f s, daemon memory %.1f MiB, `ls .history` (%d entries) %.3f s, stat of `.history/<id>/path` %.0f us at the oldest ids and %.0f us at the newest" % (
            args.versions, h["mount_s"], h["rss_kib"] / 1024, h["versions"], h["list_s"], h["lookup_us_early"], h["lookup_us_late"]))
    shutil.rmtree(base, ignore_errors=True)
    text = "\n".join(report) + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
