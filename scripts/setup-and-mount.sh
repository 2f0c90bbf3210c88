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
# (fusermount3) when an unprivileged user needs it, then mounts (see
# mount-scripts/skillfs-mount). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="${PREFIX:-$HOME/.local}"

if [ ! -e /dev/fuse ]; then
    echo "setup: /dev/fuse is missing: this kernel or container has no FUSE (try 'modprobe fuse')" >&2
    exit 1
fi

if [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null 2>&1; then
    echo "setup: an unprivileged mount needs fusermount3; installing the fuse3 package" >&2
    if command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
        sudo apt-get update -qq && sudo apt-get install -y -qq fuse3
    else
        echo "setup: cannot install fuse3 here (no sudo/apt-get); install it as root, then rerun" >&2
        exit 1
    fi
fi

if [ "$(id -u)" != 0 ] && { [ ! -r /dev/fuse ] || [ ! -w /dev/fuse ]; }; then
    echo "setup: /dev/fuse is not usable by users here (mode $(stat -c %a /dev/fuse)); setting 0666 as distributions do" >&2
    sudo chmod 0666 /dev/fuse
fi

cargo build --release --locked
mkdir -p "$PREFIX/bin"
install -m 0755 target/release/skillfs "$PREFIX/bin/skillfs"
echo "setup: installed $PREFIX/bin/skillfs"
# The systemd user unit, with this binary's real path (not enabled here).
unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
mkdir -p "$unit_dir"
bin_path="$(cd "$PREFIX/bin" && pwd -P)/skillfs"
sed "s|@SKILLFS_BIN@|$bin_path|" mount-scripts/skillfs.service >"$unit_dir/skillfs.service"
echo "setup: wrote $unit_dir/skillfs.service (enable: systemctl --user daemon-reload && systemctl --user enable --now skillfs; to stay mounted after logout: loginctl enable-linger)"

SKILLFS_BIN="$PREFIX/bin/skillfs" exec ./mount-scripts/skillfs-mount "$@"
