#!/usr/bin/env bash
# bench_pp.sh - prompt processing (ppN) of ECS and, when their llama-bench
# binaries are given, of llama.cpp and ik_llama.cpp on the same GGUF, the
# engines in turn within each round (timings here are noisy: compare
# within a round).
#
# usage: tests/bench/bench_pp.sh BUILD_DIR MODEL [N] [ROUNDS]
#   N       prompt tokens (default 512)   ROUNDS (default 2)
#   LLAMA_BENCH     llama.cpp's llama-bench (-p N -n 0 -r 2)
#   IK_LLAMA_BENCH  ik_llama.cpp's llama-bench (-p N -n 0 -r 2 -rtr 1 -fa 1
#                   -mla 3 -fmoe 1)
#   ECS_BENCH_THREADS (default 2)
# The record (docs/benchmarks.md, "AMD EPYC VM, session 23"):
#   LLAMA_BENCH=... IK_LLAMA_BENCH=... tests/bench/bench_pp.sh build ds2-lite-q4_k_m.gguf
set -euo pipefail
build=${1:?usage: bench_pp.sh BUILD_DIR MODEL [N] [ROUNDS]}
model=${2:?usage: bench_pp.sh BUILD_DIR MODEL [N] [ROUNDS]}
n=${3:-512}
rounds=${4:-2}
threads=${ECS_BENCH_THREADS:-2}
run="$build/bin/ecs-run"
[ -x "$run" ] || { echo "bench_pp: $run is not built" >&2; exit 1; }
[ -f "$model" ] || { echo "bench_pp: no model $model" >&2; exit 1; }
# shellcheck source=tests/bench/rates.sh
. "$(dirname "$0")/rates.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ecs-bench-pp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2fx", a / b; else print "-"}'; }

echo "== bench_pp: $(basename "$model"), pp$n, $threads threads, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg) =="
for r in $(seq "$rounds"); do
    lock "$run" -m "$model" --bench --pp "$n" --tg 0 --threads "$threads" >"$tmp/ecs" 2>"$tmp/err" ||
        { cat "$tmp/err" >&2; exit 1; }
    e=$(ecs_rate "pp$n" "$tmp/ecs")
    line="round $r  ECS pp$n $e tok/s"
    if [ -n "${LLAMA_BENCH:-}" ]; then
        lock "$LLAMA_BENCH" -m "$model" -t "$threads" -r 2 -p "$n" -n 0 >"$tmp/lc" 2>"$tmp/err" ||
            { tail -5 "$tmp/err" >&2; exit 1; }
        l=$(peer_rate " pp$n |" "$tmp/lc")
        line="$line   llama.cpp $l ($(ratio "$e" "$l"))"
    fi
    if [ -n "${IK_LLAMA_BENCH:-}" ]; then
        lock "$IK_LLAMA_BENCH" -m "$model" -t "$threads" -r 2 -p "$n" -n 0 -rtr 1 -fa 1 -mla 3 -fmoe 1 \
            >"$tmp/ik" 2>"$tmp/err" || { tail -5 "$tmp/err" >&2; exit 1; }
        i=$(peer_rate " pp$n |" "$tmp/ik")
        line="$line   ik_llama.cpp $i ($(ratio "$e" "$i"))"
    fi
    echo "$line"
done
