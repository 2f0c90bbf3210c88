#!/usr/bin/env bash
# Readies this machine for the whole test suite (scripts/test.sh), which
# itself changes nothing on the host. As root it:
#   - installs what the suite runs when it is missing: fuse3 (fusermount3)
#     for the unprivileged-mount tests, what the C pjdfstest suite is built
#     and run with (autoconf, automake, make, gcc, perl, openssl),
#     e2fsprogs (the journaled ext4 image), git (export and sync),
#     openssh-server and -client (the sync tests run an sshd of their own
#     on 127.0.0.1; the package's service is not started where there is no
#     init system, and is left as it was elsewhere) and python3-venv (the
#     agent's venv);
#   - makes /dev/fuse mode 0666, as every distribution's udev rules do
#     (some containers leave it 0600), so a user's mount can open it;
#   - switches the fuse module's enable_uring on, so the suite runs on both
#     transports (FUSE over io_uring: Linux 6.14+ with CONFIG_FUSE_IO_URING).
# Each change is printed with how to put it back. As a user it changes
# nothing and says what is missing. .ci/run calls it before the suite.
set -euo pipefail

uring_param=/sys/module/fuse/parameters/enable_uring
missing=0

if [ ! -e /dev/fuse ]; then
    echo "test-machine: /dev/fuse is missing: load the fuse module (modprobe fuse); the mount tests cannot run" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    command -v fusermount3 >/dev/null 2>&1 ||
        { echo "test-machine: fusermount3 is missing: install the fuse3 package (as root, run this script)" >&2; missing=1; }
    [ -r /dev/fuse ] && [ -w /dev/fuse ] ||
        { echo "test-machine: /dev/fuse is not open to users (mode $(stat -c %a /dev/fuse))" >&2; missing=1; }
    if [ -e "$uring_param" ] && [ "$(cat "$uring_param")" != Y ]; then
        echo "test-machine: $uring_param is off: the suite tests the classic transport only" >&2
    fi
    exit "$missing"
fi

# The Debian packages of the commands the suite runs: fusermount3, and
# what the C pjdfstest suite is built and run with.
packages=()
need() { command -v "$1" >/dev/null 2>&1 || packages+=("$2"); }
need fusermount3 fuse3
need autoreconf autoconf
need aclocal automake
need make make
need cc gcc
need prove perl
need openssl openssl
need mkfs.ext4 e2fsprogs
need git git
# The sync tests' own sshd on 127.0.0.1 and its client (never started as
# a service here: the tests run one of their own and stop it).
need ssh openssh-client
need ssh-keygen openssh-client
[ -x /usr/sbin/sshd ] || packages+=(openssh-server)
# Debian's python3 makes no venv without python3-venv (the agent's venv).
python3 -c 'import ensurepip' >/dev/null 2>&1 || packages+=(python3-venv)
if [ ${#packages[@]} -gt 0 ]; then
    echo "test-machine: installing ${packages[*]}" >&2
    apt-get install -y -qq "${packages[@]}" >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null && apt-get install -y -qq "${packages[@]}" >/dev/null
    }
fi
# sshd, run as root, wants its privilege separation directory, which its
# service makes at boot (not running here).
if [ ! -d /run/sshd ]; then
    mkdir -p /run/sshd && chmod 0755 /run/sshd
    echo "test-machine: made /run/sshd (sshd's privilege separation directory); remove with: rmdir /run/sshd" >&2
fi
mode=$(stat -c %a /dev/fuse)
if [ "$mode" != 666 ]; then
    echo "test-machine: /dev/fuse was mode $mode, now 0666 as distributions set it; put back with: chmod $mode /dev/fuse" >&2
    chmod 0666 /dev/fuse
fi
if [ -e "$uring_param" ]; then
    was=$(cat "$uring_param")
    if [ "$was" != Y ]; then
        if echo 1 >"$uring_param" 2>/dev/null; then
            echo "test-machine: $uring_param was $was, now Y; put back with: echo $was > $uring_param" >&2
        else
            echo "test-machine: $uring_param is off and cannot be switched: the suite tests the classic transport only" >&2
        fi
    fi
else
    echo "test-machine: this kernel has no FUSE over io_uring: the suite tests the classic transport only" >&2
fi
echo "test-machine: ready" >&2
