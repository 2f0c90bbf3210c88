#!/usr/bin/env bash
# Vendors skillfs's fork of fuser again: fuser 0.18.0 as published on
# crates.io, the files skillfs keeps of it, and the patch series in
# vendor/skillfs-fuser/patches/ applied in order.
#
#   scripts/vendor-fuser.sh           rewrite vendor/skillfs-fuser from them
#   scripts/vendor-fuser.sh --check   exit 1 if the vendored tree differs
#                                     from what they make (nothing written)
#
# The crate is fetched by cargo itself (`cargo fetch` of a scratch project
# that depends on it), into cargo's own registry cache: no other download.
# To change the fork: edit vendor/skillfs-fuser, then make the patch of
# each file again with `diff -u` against the fetched crate (the patches'
# names say which file each holds), and run --check.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.18.0
dest=vendor/skillfs-fuser
check=
[ "${1:-}" = "--check" ] && check=1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/fetch/src"
cat >"$work/fetch/Cargo.toml" <<EOF
[package]
name = "fetch-fuser"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
fuser = "=$version"
EOF
echo 'fn main() {}' >"$work/fetch/src/main.rs"
cargo fetch --quiet --manifest-path "$work/fetch/Cargo.toml"
upstream="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"fuser-$version" | head -n1)"
if [ ! -f "$upstream/Cargo.toml" ]; then
    echo "vendor-fuser: cargo fetched fuser $version, but it is not in the registry cache" >&2
    exit 1
fi

# What skillfs keeps of upstream: the library, its build script, license
# and notes (not its examples, tests, CI or Docker files).
out="$work/out"
mkdir -p "$out"
for f in CHANGELOG.md Cargo.toml LICENSE.md README.md build.rs src; do
    cp -R "$upstream/$f" "$out/"
done
for p in "$dest"/patches/*.patch; do
    (cd "$out" && git apply -p1 "$OLDPWD/$p")
done
# skillfs's own files beside them: the notes, the patches, and the lock file
# that the fork's unit tests build with (scripts/test.sh).
cp "$dest/FORK.md" "$dest/Cargo.lock" "$dest/rustfmt.toml" "$out/"
cp -R "$dest/patches" "$out/"

if [ -n "$check" ]; then
    if diff -r "$out" "$dest" >"$work/diff"; then
        echo "vendor-fuser: $dest is fuser $version with its patches"
    else
        cat "$work/diff" >&2
        echo "vendor-fuser: $dest differs from fuser $version with its patches (above)" >&2
        exit 1
    fi
else
    rm -rf "$dest"
    cp -R "$out" "$dest"
    echo "vendor-fuser: wrote $dest: fuser $version and $(ls "$dest"/patches | wc -l) patches"
fi
