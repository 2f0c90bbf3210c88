#!/usr/bin/env bash
# Sets skillfs up on this machine and mounts it over the agent's home,
# versioning its skills directory.
#
#   ./scripts/setup-and-mount.sh [HOME]                 HOME: $HERMES_HOME,
#                                                       else ~/.hermes
#   ./scripts/setup-and-mount.sh --skills-only [ROOT]   a skills directory
#                                                       alone
#
# Directories are created if missing. Builds the release binary, installs
# it as $PREFIX/bin/skillfs (PREFIX defaults to ~/.local), installs fuse3
# (fusermount3) when an unprivileged user needs it (with sudo only where
# there is one), then mounts (see mount-scripts/skillfs-mount). Without
# Rust it says how to get it; with $PREFIX/bin not on PATH it says how to
# add it. Safe to run again: after an update it restarts a daemon still
# running the older binary once nothing is inside its mount; while the
# mount is busy (the agent running) the older daemon keeps serving, every
# write versioned, and `skillfs status` says so.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="${PREFIX:-$HOME/.local}"

# Rust: the rust-version Cargo.toml states, else 1.88 (edition 2024 needs
# 1.85, and the code's `if let … && let …` chains 1.88).
min_rust="$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' Cargo.toml)"
min_rust="${min_rust:-1.88}"
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not installed: skillfs needs Rust $min_rust or newer. Get it with rustup:" >&2
    echo "setup:   curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
    echo "setup: then open a new shell (or run '. \"\$HOME/.cargo/env\"') and run this again" >&2
    exit 1
fi
have_rust="$(rustc --version 2>/dev/null | sed -n 's/^rustc \([0-9][0-9.]*\).*/\1/p')"
if [ -n "$have_rust" ] && [ "$(printf '%s\n%s\n' "$min_rust" "$have_rust" | sort -V | head -n1)" != "$min_rust" ]; then
    echo "setup: Rust $have_rust is too old: skillfs needs $min_rust or newer ('rustup update')" >&2
    exit 1
fi

# Root needs no sudo; a user without sudo is told what to run as root.
as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "setup: this needs root and there is no sudo here: run as root: $*" >&2
        exit 1
    fi
}

if [ ! -e /dev/fuse ]; then
    echo "setup: /dev/fuse is missing: this kernel or container has no FUSE (try 'modprobe fuse')" >&2
    exit 1
fi

if [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null 2>&1; then
    echo "setup: an unprivileged mount needs fusermount3; installing the fuse3 package" >&2
    if command -v apt-get >/dev/null 2>&1; then
        as_root apt-get update -qq && as_root apt-get install -y -qq fuse3
    else
        echo "setup: cannot install fuse3 here (no apt-get); install fuse3 as root, then run this again" >&2
        exit 1
    fi
fi

if [ "$(id -u)" != 0 ] && { [ ! -r /dev/fuse ] || [ ! -w /dev/fuse ]; }; then
    echo "setup: /dev/fuse is not usable by users here (mode $(stat -c %a /dev/fuse)); setting 0666 as distributions do" >&2
    as_root chmod 0666 /dev/fuse
fi

cargo build --release --locked
mkdir -p "$PREFIX/bin"
install -m 0755 target/release/skillfs "$PREFIX/bin/skillfs"
echo "setup: installed $PREFIX/bin/skillfs"
"$PREFIX/bin/skillfs" man --dir "$PREFIX/share/man/man1" >/dev/null
echo "setup: installed the man pages in $PREFIX/share/man/man1 (man skillfs, man skillfs-restore, ...)"
case ":$PATH:" in
    *":$PREFIX/bin:"*) ;;
    *)
        echo "setup: $PREFIX/bin is not on your PATH, so 'skillfs' alone will not be found; add it with:" >&2
        echo "setup:   echo 'export PATH=\"$PREFIX/bin:\$PATH\"' >> ~/.profile   (then open a new shell)" >&2
        ;;
esac
# The systemd user unit, with this binary's real path (not enabled here).
unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
mkdir -p "$unit_dir"
bin_path="$(cd "$PREFIX/bin" && pwd -P)/skillfs"
sed "s|@SKILLFS_BIN@|$bin_path|" mount-scripts/skillfs.service >"$unit_dir/skillfs.service"
echo "setup: wrote $unit_dir/skillfs.service (enable: systemctl --user daemon-reload && systemctl --user enable --now skillfs; to stay mounted after logout: loginctl enable-linger)"

SKILLFS_BIN="$PREFIX/bin/skillfs" exec ./mount-scripts/skillfs-mount "$@"
