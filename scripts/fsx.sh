#!/usr/bin/env bash
# fsx (the Rust port on crates.io, 0.3.2) on files of a skillfs mount,
# with mapped reads and writes, per seed and per transport, and on a plain
# directory beside it for the time. After each run it checks what fsx can
# tell: every version skillfs recorded is a content the file had at that
# point of fsx's run, in order, and one was recorded at every close, fsync,
# fdatasync and msync (scripts/fsx_versions.py replays fsx's log); the live
# file is fsx's final content, the same bytes as the plain directory's run
# and as `.history/latest/`; and `skillfs verify --full` passes after the
# unmount. fsx itself checks every read against what it wrote.
#
# A long run is cut into runs of --chunk operations, each on a fresh mount
# and store that is checked and removed before the next: every msync and
# close keeps a version of the 256 KiB file (about 64 KiB of store per
# operation). The first run of seed S is fsx's seed S, the next ones seeds
# S*1000+1, S*1000+2... (fsx's own way to start at a later step, -b, runs
# copy_file_range in the steps it skips and panics on the empty file.)
#
# usage: scripts/fsx.sh [--ops N] [--seeds "1 2 3"] [--transport classic|uring|both]
#                       [--chunk N] [--bin BIN] [--no-msync] [--parallel P]
#   defaults: --ops 20000 --seeds 1 --transport both --chunk 50000, BIN the
#   debug build (built when older than the source, as cargo decides).
# --parallel P runs P fsx at once on P files of the one mount (and of the
# plain directory), seeds S, S+1000000, ...; each is checked as above.
# --no-msync leaves mapped writes to be written back at close or by the
# kernel (fsx's nomsyncafterwrite) instead of msync'ed each time.
# --transport both runs io_uring where the kernel has it; uring alone needs
# it (as root the fuse module's enable_uring is switched on for the run and
# put back). The long run named in docs/testing.md:
#   scripts/fsx.sh --ops 1000000 --seeds "1 2 3"
set -euo pipefail
cd "$(dirname "$0")/.."

ops=20000 seeds=1 transport=both chunk=50000 bin= nomsync=false parallel=1
while [ $# -gt 0 ]; do
    case $1 in
        --ops) ops=$2; shift 2 ;;
        --seeds) seeds=$2; shift 2 ;;
        --transport) transport=$2; shift 2 ;;
        --chunk) chunk=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --no-msync) nomsync=true; shift ;;
        --parallel) parallel=$2; shift 2 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
case $transport in classic | uring | both) ;; *) echo "fsx: --transport classic|uring|both" >&2; exit 2 ;; esac

if [ -z "$bin" ]; then
    cargo build --locked --quiet
    bin=target/debug/skillfs
fi
BIN=$(realpath "$bin")
TOOLS=${FSX_ROOT:-target/fsx}
if [ ! -x "$TOOLS/bin/fsx" ]; then
    echo "fsx: installing fsx 0.3.2 into $TOOLS" >&2
    cargo install --locked --quiet fsx --version 0.3.2 --root "$TOOLS"
fi
FSX=$(realpath "$TOOLS/bin/fsx")
CHECK=$(realpath scripts/fsx_versions.py)

# Transports.
uring_param=/sys/module/fuse/parameters/enable_uring
uring_was=
transports=classic
if [ "$transport" != classic ]; then
    if [ -e "$uring_param" ] && [ "$(cat "$uring_param")" = Y ]; then
        transports="classic uring"
    elif [ -e "$uring_param" ] && [ "$(id -u)" = 0 ]; then
        uring_was=$(cat "$uring_param")
        echo Y >"$uring_param"
        echo "fsx: switched $uring_param on for the run (it was $uring_was)" >&2
        transports="classic uring"
    elif [ "$transport" = uring ]; then
        echo "fsx: FUSE over io_uring is not available here ($uring_param missing or off, and not root)" >&2
        exit 1
    else
        echo "fsx: FUSE over io_uring is not available here: classic only" >&2
    fi
    [ "$transport" = uring ] && transports=uring
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/skillfs-fsx.XXXXXX")
mounted= daemon= keep=
cleanup() {
    if [ -n "$mounted" ]; then
        timeout 30 "$BIN" umount "$mounted" >/dev/null 2>&1 || umount -l "$mounted" 2>/dev/null || true
    fi
    if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then kill -9 "$daemon" 2>/dev/null || true; fi
    [ -z "$uring_was" ] || echo "$uring_was" >"$uring_param" || true
    if [ -n "$keep" ]; then echo "fsx: kept $work for the failure above" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The operations and their weights (scripts/fsx.toml, which
# bench/store_size.py runs too): every kind the Rust fsx has but hole
# punching (skillfs has no fallocate; docs/limits.md).
sed "s/^nomsyncafterwrite = .*/nomsyncafterwrite = $nomsync/" scripts/fsx.toml >"$work/fsx.toml"
# One write of the whole length at step 1: the bytes fsx draws from its seed
# (scripts/fsx_versions.py).
cat >"$work/orig.toml" <<'EOF'
flen = 262144
[opsize]
max = 262144
min = 262144
align = 262144
[weights]
write = 1
read = 0
mapread = 0
mapwrite = 0
truncate = 0
EOF

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
status=0
fail() { echo "fsx: FAILED: $*" >&2; status=1; keep=1; }
# fsx on FILE (seed SEED, $n_ops operations), its log in LOG; returns its status.
run_fsx() { # SEED FILE LOG
    timeout --kill-after=10 $((120 + n_ops / 20)) \
        "$FSX" -v -f "$work/fsx.toml" -S "$1" -N "$n_ops" -P "$(dirname "$3")" "$2" 2>"$3" >/dev/null
}
# run_fsx on files 0..P-1 of DIR at once (logs NAME-J.log); fails for each that failed.
run_all() { # DIR NAME
    local j pids=()
    for j in $(seq 0 $((parallel - 1))); do
        run_fsx $((fseed + j * 1000000)) "$1/fsx.$j" "$run/$2-$j.log" &
        pids+=($!)
    done
    for j in $(seq 0 $((parallel - 1))); do
        wait "${pids[$j]}" || fail "$what, file $j (seed $((fseed + j * 1000000))) on $2: fsx failed: $(grep -v '^\[INFO' "$run/$2-$j.log" | tail -5)"
    done
}

for seed in $seeds; do
    for t in $transports; do
        total_s=0 native_s=0 versions=0 store=0 done_ops=0 k=0
        while [ "$done_ops" -lt "$ops" ]; do
            n_ops=$chunk
            [ $((done_ops + n_ops)) -gt "$ops" ] && n_ops=$((ops - done_ops))
            fseed=$seed
            [ "$k" -gt 0 ] && fseed=$((seed * 1000 + k))
            run="$work/$t-$fseed"
            what="fsx seed $fseed ($n_ops ops, $parallel at once), $t"
            mkdir -p "$run/plain" "$run/skills" "$run/orig"
            for j in $(seq 0 $((parallel - 1))); do
                "$FSX" -f "$work/orig.toml" -S $((fseed + j * 1000000)) -N 1 "$run/orig/$j" >/dev/null 2>&1
            done
            # The plain directory, for the time and the final bytes.
            t0=$(now)
            run_all "$run/plain" plain
            native_s=$(secs "$t0" "$(now)" | awk -v s="$native_s" '{ print s + $1 }')
            timeout 60 "$BIN" mount --transport "$t" "$run/skills" >/dev/null
            mounted=$run/skills
            daemon=$("$BIN" status --root "$run/skills" | awk '/daemon pid/ { sub(/\)/, "", $NF); print $NF }')
            t0=$(now)
            run_all "$run/skills" skillfs
            total_s=$(secs "$t0" "$(now)" | awk -v s="$total_s" '{ print s + $1 }')
            for j in $(seq 0 $((parallel - 1))); do
                cmp -s "$run/skills/fsx.$j" "$run/skills/.history/latest/fsx.$j" ||
                    fail "$what: the live file fsx.$j is not .history/latest/fsx.$j"
                cmp -s "$run/skills/fsx.$j" "$run/plain/fsx.$j" ||
                    fail "$what: the live file fsx.$j is not what the same run left in a plain directory"
                (cd "$run/skills" && "$BIN" log --json --all "fsx.$j") >"$run/journal-$j.jsonl"
                python3 "$CHECK" --orig "$run/orig/$j" --log "$run/skillfs-$j.log" --journal "$run/journal-$j.jsonl" \
                    --live "$run/skills/fsx.$j" $([ $nomsync = true ] && echo --no-msync) >"$run/check-$j.out" 2>&1 ||
                    fail "$what, file $j: $(cat "$run/check-$j.out")"
                n=$(wc -l <"$run/journal-$j.jsonl")
                [ "$n" -gt 0 ] || fail "$what: no version of fsx.$j recorded"
                versions=$((versions + n))
            done
            timeout 60 "$BIN" umount "$run/skills" >/dev/null
            mounted= daemon=
            "$BIN" verify --full --root "$run/skills" >"$run/verify.out" 2>&1 ||
                fail "$what: skillfs verify --full: $(cat "$run/verify.out")"
            store=$((store + $(du -sb "$run/.skillfs/skills" | cut -f1)))
            [ "$status" = 0 ] && rm -rf "$run"
            done_ops=$((done_ops + n_ops))
            k=$((k + 1))
        done
        printf 'fsx: seed %s, %s: %d ops x %d at once in %s s (plain directory %s s, %.1fx); %d versions, %s MiB of store; %s\n' \
            "$seed" "$t" "$ops" "$parallel" "$total_s" "$native_s" "$(awk -v a="$total_s" -v b="$native_s" 'BEGIN { print (b > 0 ? a / b : 0) }')" \
            "$versions" "$((store / 1048576))" "$([ "$status" = 0 ] && echo "every check passed" || echo FAILED)"
    done
done
exit $status
