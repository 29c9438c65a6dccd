#!/usr/bin/env bash
# test_damaged.sh - damaged models (tests/integration/damage.py makes them
# from small valid ones) each get their specific error or warning from
# ecs-run built with ASan+UBSan, and no sanitizer report (ecs-worker too,
# for the metadata's ranges); special files in place of a model fail at
# once instead of blocking.
# usage: tests/integration/test_damaged.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_damaged.sh BUILD_DIR}
mk="$build/bin/ecs-mkmodel"
san=build/asan
mkdir -p "$build/logs"
# the sanitized ecs-run (make asan builds its libraries for the unit tests);
# a make of its own, not a sub-make of the caller's jobserver
env -u MAKEFLAGS -u MFLAGS make --no-print-directory -s -j2 BUILD=$san SAN=1 OPT=-O1 \
    "$san/bin/ecs-run" "$san/bin/ecs-worker" >"$build/logs/asan-ecs-run.log" 2>&1 ||
    { echo "FAIL: cannot build $san/bin/ecs-run"; tail -20 "$build/logs/asan-ecs-run.log"; exit 1; }
run="$san/bin/ecs-run"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1

# check NAME WANT_RC REGEX ARGS...: exit status WANT_RC ("fail": 1), REGEX
# on stderr, no sanitizer report, no hang; bin=PROGRAM check ... runs
# another program than ecs-run
check() {
    local name=$1 want=$2 re=$3; shift 3
    timeout 120 "${bin:-$run}" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if grep -Eq 'runtime error|AddressSanitizer|LeakSanitizer' "$tmp/err"; then
        bad "$name: sanitizer report: $(grep -m3 -E 'runtime error|Sanitizer|SUMMARY' "$tmp/err")"
    elif [ "$rc" -eq 124 ]; then
        bad "$name: $(basename "${bin:-$run}") did not finish"
    elif [ "$rc" -ne "$([ "$want" = fail ] && echo 1 || echo "$want")" ]; then
        bad "$name: exit $rc, expected $want: $(head -c 600 "$tmp/err")"
    elif [ -n "$re" ] && ! grep -Eq -- "$re" "$tmp/err"; then
        bad "$name: stderr lacks /$re/: $(head -c 600 "$tmp/err")"
    else
        echo "ok $name"
    fi
}

for arch in deepseek2 qwen3moe; do
    src="$tmp/$arch.gguf" dir="$tmp/$arch"
    mkdir -p "$dir"
    "$mk" --arch $arch --preset tiny --types q8_0 --seed 5 --n-layer 3 -o "$src" >/dev/null 2>&1 ||
        { bad "$arch: ecs-mkmodel"; continue; }
    /usr/bin/python3 tests/integration/damage.py "$src" "$dir" || { bad "$arch: damage.py"; continue; }
    while IFS=$'\t' read -r name want re; do
        check "$arch/$name" "$want" "$re" -m "$dir/$name.gguf" -p "Hello there" -n 3 --temp 0 \
            --threads 2 --no-repack
    done <"$dir/cases.tsv"
    # ecs-worker reads the keys through the same checks (common/arch.c):
    # the same refusals, before it looks for a coordinator
    while IFS=$'\t' read -r name want re; do
        case $re in *"out of range"*) ;; *) continue ;; esac
        bin="$san/bin/ecs-worker" check "$arch/worker-$name" 2 "$re" -m "$dir/$name.gguf" \
            --coordinator "ipc://$tmp/none" --threads 1
    done <"$dir/cases.tsv"
    # byte-aligned tensors are copied, not read misaligned: the same logits
    toks=1,17,300,5,42,7,99
    check "$arch/align1-logits" 0 "" -m "$dir/align1.gguf" --tokens $toks --dump-logits \
        "$tmp/a.json" --threads 2 --no-repack
    check "$arch/original-logits" 0 "" -m "$src" --tokens $toks --dump-logits "$tmp/b.json" \
        --threads 2 --no-repack
    cmp -s "$tmp/a.json" "$tmp/b.json" || bad "$arch: general.alignment 1 changes the logits"
done

# 6: special files in place of the model
mkfifo "$tmp/fifo"
check "fifo" fail "not a regular file" -m "$tmp/fifo" -p hi -n 1
check "directory" fail "not a regular file" -m "$tmp" -p hi -n 1
check "missing" fail "cannot open" -m "$tmp/none.gguf" -p hi -n 1

[ $fail -eq 0 ] && echo "test_damaged: all passed"
exit $fail
