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
if [ "$(id -u)" = 0 ]; then
    # The unprivileged-mount test needs what a user's machine has: fusermount3
    # (package fuse3) and a /dev/fuse that users may open (mode 0666, as every
    # distribution's udev rules set it; some containers leave it 0600).
    if ! command -v fusermount3 >/dev/null 2>&1; then
        echo "test: installing fuse3 (fusermount3) for the unprivileged-mount test" >&2
        apt-get install -y -qq fuse3 >/dev/null 2>&1 || {
            apt-get update -qq >/dev/null && apt-get install -y -qq fuse3 >/dev/null
        }
    fi
    if [ "$(stat -c %a /dev/fuse)" != 666 ]; then
        echo "test: /dev/fuse is mode $(stat -c %a /dev/fuse); setting 0666 as distributions do" >&2
        chmod 0666 /dev/fuse
    fi
elif ! command -v fusermount3 >/dev/null 2>&1; then
    echo "test: not root and no fusermount3: run ./scripts/setup-and-mount.sh first, or run as root" >&2
    exit 1
fi
command -v python3 >/dev/null || { echo "test: python3 is required" >&2; exit 1; }

set -x
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked
