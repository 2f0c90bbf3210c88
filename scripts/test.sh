#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and the integration
# tests that mount real FUSE filesystems (run as root, or with fusermount3).
# Exits non-zero on any failure. This is what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -e /dev/fuse ]; then
    echo "test: /dev/fuse is missing; the mount tests cannot run, so the suite fails" >&2
    exit 1
fi
# This script changes nothing on the host; scripts/test-machine.sh readies
# it (fuse3, /dev/fuse open to users, FUSE over io_uring on), and .ci/run
# calls that first. What it would need and cannot find fails the run here.
if ! command -v fusermount3 >/dev/null 2>&1; then
    echo "test: fusermount3 is missing (the unprivileged-mount tests need it): run ./scripts/test-machine.sh as root first" >&2
    exit 1
fi
if [ "$(id -u)" = 0 ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
    echo "test: /dev/fuse is mode $(stat -c %a /dev/fuse), not open to users as distributions set it: run ./scripts/test-machine.sh first" >&2
    exit 1
fi
command -v python3 >/dev/null || { echo "test: python3 is required" >&2; exit 1; }

# The real agent (hermes-agent from PyPI, Python >= 3.11) in a venv of its
# own, for the tests that drive its own code through a mount.
venv=target/hermes-venv
if ! "$venv/bin/python" -c "import hermes_state, tools.skills_sync" >/dev/null 2>&1; then
    echo "test: installing hermes-agent 0.19.0 into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check hermes-agent==0.19.0
fi
SKILLFS_HERMES_PYTHON="$PWD/$venv/bin/python"
export SKILLFS_HERMES_PYTHON

# Transports: the mount suites run once per transport the kernel allows.
# FUSE over io_uring needs Linux 6.14+ with CONFIG_FUSE_IO_URING, and the
# fuse module's enable_uring on (scripts/test-machine.sh switches it on).
uring_param=/sys/module/fuse/parameters/enable_uring
# (tests/it/transport.rs switches kernel.io_uring_disabled for one test and puts
# it back; a run killed midway would leave it set: put back here too. A
# test's own change undone, not the host's set-up.)
uring_disabled=/proc/sys/kernel/io_uring_disabled
uring_disabled_was=$(cat "$uring_disabled" 2>/dev/null || true)
restore_uring() {
    [ -z "$uring_disabled_was" ] || echo "$uring_disabled_was" > "$uring_disabled" 2>/dev/null || true
}
trap restore_uring EXIT
transports=classic
if [ ! -e "$uring_param" ]; then
    echo "test: this kernel has no FUSE over io_uring ($uring_param is missing): io_uring is not tested" >&2
elif [ "$(cat "$uring_param")" = Y ]; then
    transports="classic uring"
else
    echo "test: $uring_param is off (./scripts/test-machine.sh switches it on as root): io_uring is not tested" >&2
fi
echo "test: transports: $transports" >&2

set -x
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
CARGO_TARGET_DIR=target/fork cargo test --locked --manifest-path vendor/skillfs-fuser/Cargo.toml --lib
# As root, a file's reads with no writer are the kernel's own (FUSE
# passthrough) on the classic pass; the io_uring pass has the daemon serve
# every read, as a user's daemon does (the unprivileged tests do too).
for transport in $transports; do
    if [ "$transport" = uring ]; then
        SKILLFS_NO_PASSTHROUGH=1 SKILLFS_TRANSPORT=$transport cargo test --locked
        # (and the suites of the kernel's own reads, with them)
        SKILLFS_TRANSPORT=$transport cargo test --locked --test it -- cache:: home::
    else
        SKILLFS_TRANSPORT=$transport cargo test --locked
    fi
done

# fsx with mapped reads and writes, a short run on each transport, two at
# once on one mount, every version checked against fsx's log (the long run,
# millions of operations, is `scripts/fsx.sh --ops 1000000 --seeds "1 2 3"`;
# docs/testing.md). fsx 0.3.2 is installed from crates.io into target/fsx.
fsx_transport=both
[ "$transports" = classic ] && fsx_transport=classic
./scripts/fsx.sh --ops 10000 --seeds 1 --parallel 2 --transport $fsx_transport --bin target/debug/skillfs

# Every fuzz target for a few seconds (docs/testing.md, "Fuzzing"), built
# without ASan: its build would add minutes. The crash inputs kept in
# fuzz/regressions/ are replayed by `cargo test` above (tests/it/fuzz_replay.rs).
SKILLFS_FUZZ_SANITIZER=none ./scripts/fuzz.sh 5

# pjdfstest on a plain directory and on a --allow-other mount, as root (it
# acts as other users): skillfs may fail only its documented limits. Both
# suites: the C one pinned at 85a8aea (vendored; issue 11 names it), and the
# Rust rewrite, which also runs posix_fallocate (the C one only on FreeBSD)
# and takes under a minute.
# (The C suite on the default transport, io_uring where there is one; the
# Rust one on each.)
if [ "$(id -u)" = 0 ]; then
    ./scripts/pjdfstest-c.sh
    for transport in $transports; do
        SKILLFS_TRANSPORT=$transport ./scripts/pjdfstest.sh
    done
fi

# The plain files of a home mount are served by the kernel on backing files
# (FUSE passthrough) when the daemon runs as root; run those tests again
# with the daemon serving them itself, as for an unprivileged user.
SKILLFS_NO_PASSTHROUGH=1 cargo test --locked --test it -- home:: agent::

# The suites that mount through the harness, again over an agent's home
# (`--versioned skills`): skills/ must behave exactly as a skills-only mount.
# (The others mount ROOT by hand, or keep a plain tree beside ROOT, which
# over a home would be inside the mount.)
SKILLFS_TEST_HOME=1 cargo test --locked --test it -- posix:: versioning:: history:: crash:: agent:: cache:: export::

# Both fsync strategies: the one-commit path runs where the filesystem has a
# journal (ext4 with its journal, XFS), the step-by-step path elsewhere.
# Force the step-by-step one here, and, as root, run the durability tests
# again on a journaled ext4 image so the one-commit path runs too.
SKILLFS_PORTABLE_FSYNC=1 SKILLFS_CRASH_ROUNDS=20 cargo test --locked --test it -- posix:: versioning:: crash::
if [ "$(id -u)" = 0 ]; then
    command -v mkfs.ext4 >/dev/null 2>&1 || {
        echo "test: mkfs.ext4 is missing (the journaled ext4 pass needs it): run ./scripts/test-machine.sh" >&2
        exit 1
    }
    img=$(mktemp /tmp/skillfs-ext4.XXXXXX)
    mnt=$(mktemp -d /tmp/skillfs-ext4-mnt.XXXXXX)
    trap 'umount -l "$mnt" 2>/dev/null; rm -rf "$img" "$mnt"; restore_uring' EXIT
    # Room for the concurrency tests' 512 MiB park and its blob, one at a time.
    truncate -s 3G "$img"
    mkfs.ext4 -q -F "$img"
    mount -o loop "$img" "$mnt"
    TMPDIR="$mnt" SKILLFS_CRASH_ROUNDS=20 cargo test --locked --test it -- posix:: versioning:: crash:: history:: trust:: concurrency:: cache::
fi

set +x
echo "test: passed on transports: $transports" >&2
