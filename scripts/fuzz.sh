#!/usr/bin/env bash
# Fuzzes every parser of bytes skillfs did not write (docs/testing.md,
# "Fuzzing"): each target in fuzz/fuzz_targets/ runs for SECONDS (default
# 60) under libFuzzer, from its seeds (fuzz/seeds/<target>/) and the
# corpus kept by earlier runs (fuzz/corpus/<target>/, not committed).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# A crash, a hang (-timeout), an allocation past -malloc_limit_mb or a
# process past -rss_limit_mb is written to fuzz/regressions/<target>/
# (commit it with its fix: tests/it/fuzz_replay.rs replays it under plain
# `cargo test`), and the script exits non-zero after running the rest.
#
# Environment: SKILLFS_FUZZ_SANITIZER (address, the default, or none:
# no ASan, much quicker to build; CI's bounded run uses none, see
# scripts/test.sh), SKILLFS_FUZZ_JOBS (libFuzzer -jobs, default 1).
# Needs cargo-fuzz 0.13.2 (installed with `cargo install` if missing,
# from crates.io) and the unstable flags of stable Rust it asks for
# (RUSTC_BOOTSTRAP=1: sanitizer and coverage instrumentation).
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
sanitizer=${SKILLFS_FUZZ_SANITIZER:-address}
jobs=${SKILLFS_FUZZ_JOBS:-1}
version=0.13.2

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version 2>/dev/null | grep -qF " $version"; then
    # Into cargo's own bin directory (~/.cargo/bin): built once a machine,
    # not once a clone.
    echo "fuzz: installing cargo-fuzz $version (cargo install, from crates.io)" >&2
    cargo install --locked --quiet cargo-fuzz --version "$version"
fi

if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_targets/*.rs; do
        targets+=("$(basename "$f" .rs)")
    done
fi

# Files the targets write, in a directory of this run's own.
tmp=$PWD/target/fuzz-tmp
rm -rf "$tmp"
mkdir -p "$tmp"
logs=$PWD/target/fuzz-logs
mkdir -p "$logs"
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
if [ ${#targets[@]} = 1 ]; then
    cargo fuzz build --sanitizer "$sanitizer" "${targets[0]}"
else
    cargo fuzz build --sanitizer "$sanitizer"
fi
echo "fuzz: built with sanitizer $sanitizer in $(($(date +%s) - start)) s" >&2

# -jobs runs the fuzzer in child processes, each logging to fuzz-<n>.log.
parallel=()
if [ "$jobs" -gt 1 ]; then
    parallel=(-jobs="$jobs" -workers="$jobs")
fi
failed=()
printf '%-18s %12s %8s %s\n' target execs seconds result >&2
for t in "${targets[@]}"; do
    corpus=fuzz/corpus/$t
    out=fuzz/regressions/$t
    mkdir -p "$corpus" "$out"
    t0=$(date +%s)
    # -rss_limit_mb and -malloc_limit_mb: an input that makes skillfs
    # allocate without bound is a crash; -timeout: one that takes more
    # than 10 s is a hang. Leaks are not looked for (caches live on).
    if TMPDIR=$tmp cargo fuzz run --sanitizer "$sanitizer" "$t" "$corpus" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -detect_leaks=0 "${parallel[@]}" -print_final_stats=1 \
        -artifact_prefix="$PWD/$out/" >"$logs/$t.log" 2>&1; then
        result=ok
    else
        result="FAILED (see $logs/$t.log; input in $out/)"
        failed+=("$t")
    fi
    # With -jobs, each job logs to fuzz-<n>.log in the current directory.
    execs=$(cat "$logs/$t.log" fuzz-*.log |
        grep -o 'stat::number_of_executed_units: *[0-9]*' | awk '{s += $2} END {print s + 0}')
    rm -f fuzz-*.log
    printf '%-18s %12s %8s %s\n' "$t" "$execs" "$(($(date +%s) - t0))" "$result" >&2
done
echo "fuzz: all done in $(($(date +%s) - start)) s" >&2

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: crashed: ${failed[*]}" >&2
    exit 1
fi
