#!/usr/bin/env bash
# bench_depth.sh - decode speed at depth: tgN from an empty context and after
# a prompt of D tokens, for ECS and, when their binaries are given, for
# ik_llama.cpp and llama.cpp on the same GGUF, engines alternating within
# each round (timings here are noisy: compare within a round).
#
# usage: tests/bench/bench_depth.sh BUILD_DIR [MODEL] [DEPTHS] [ROUNDS]
#   MODEL   default models/ds2-lite-q4_k_m.gguf
#   DEPTHS  comma-separated, default 512,2048,4096 (8192 needs --ctx 8256)
#   ROUNDS  default 1
#   IK_LLAMA_BENCH  ik_llama.cpp's llama-bench (runs -gp D,N -rtr 1 -fa 1
#                   -mla 3 -fmoe 1: tgN after a prompt of D tokens)
#   LLAMA_BENCH     llama.cpp's llama-bench; c392e509 has no depth option, only
#                   -pg D,N, which times prompt and generation together:
#                   printed as such, not comparable to tgN @ D
#   LLAMA_BATCHED_BENCH  llama.cpp's llama-batched-bench: -npp D -ntg N -npl 1
#                   times the N tokens after the D-token prompt apart (S_TG):
#                   llama.cpp's tgN @ D, beside its llama-bench tgN
#   ECS_BENCH_TG    N (default 32)   ECS_BENCH_THREADS (default 2)
#   ECS_BENCH_ARGS  more ecs-run options (e.g. "--kv-type bf16": the cache the
#                   AMX tile unit takes)
# The peers are built beside the project by whoever runs this; nothing here
# builds them. Timed runs hold /tmp/ecs-bench.lock.
set -euo pipefail
build=${1:?usage: bench_depth.sh BUILD_DIR [MODEL] [DEPTHS] [ROUNDS]}
model=${2:-models/ds2-lite-q4_k_m.gguf}
depths=${3:-512,2048,4096}
rounds=${4:-1}
tg=${ECS_BENCH_TG:-32}
threads=${ECS_BENCH_THREADS:-2}
run="$build/bin/ecs-run"
[ -x "$run" ] || { echo "bench_depth: $run is not built" >&2; exit 1; }
[ -f "$model" ] || { echo "bench_depth: no model $model" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ecs-bench-depth.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/bench/rates.sh
. "$(dirname "$0")/rates.sh"

echo "== bench_depth: $(basename "$model"), tg$tg at depths $depths, $threads threads, ECS ${ECS_BENCH_ARGS:-(defaults)}, $(date -u '+%Y-%m-%d %H:%M UTC') =="
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=, read -r -a ds <<<"$depths"
for r in $(seq "$rounds"); do
    for d in "${ds[@]}"; do
        ctx=$((d + tg + 64))
        # shellcheck disable=SC2086
        lock "$run" -m "$model" --bench --pp "$d" --tg "$tg" --ctx "$ctx" --threads "$threads" \
            ${ECS_BENCH_ARGS:-} >"$tmp/ecs" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
        e0=$(ecs_rate "tg$tg" "$tmp/ecs")
        ed=$(awk -v k="tg$tg" -v d="$d" '$1 == k && $2 == "@" && $4 == d {for (f = 5; f < NF; f++) if ($(f + 1) == "tok/s") {print $f; exit}}' "$tmp/ecs")
        printf "round %d  depth %5d  ECS          tg%d %7s tok/s  @depth %7s tok/s  ratio %s\n" \
            "$r" "$d" "$tg" "$e0" "$ed" "$(awk -v a="$ed" -v b="$e0" 'BEGIN {printf "%.2f", a / b}')"
        if [ -n "${IK_LLAMA_BENCH:-}" ]; then
            lock "$IK_LLAMA_BENCH" -m "$model" -t "$threads" -r 1 -p 0 -n "$tg" -gp "$d,$tg" \
                -rtr 1 -fa 1 -mla 3 -fmoe 1 >"$tmp/ik" 2>"$tmp/err" || { tail -5 "$tmp/err" >&2; exit 1; }
            i0=$(peer_rate " tg$tg |" "$tmp/ik")
            id=$(peer_rate "tg$tg@pp$d" "$tmp/ik")
            printf "round %d  depth %5d  ik_llama.cpp tg%d %7s tok/s  @depth %7s tok/s  ratio %s   ECS/ik @depth %s\n" \
                "$r" "$d" "$tg" "$i0" "$id" "$(awk -v a="$id" -v b="$i0" 'BEGIN {printf "%.2f", a / b}')" \
                "$(awk -v a="$ed" -v b="$id" 'BEGIN {printf "%.2f", a / b}')"
        fi
        if [ -n "${LLAMA_BENCH:-}" ]; then
            lock "$LLAMA_BENCH" -m "$model" -t "$threads" -r 1 -p 0 -n "$tg" -pg "$d,$tg" \
                >"$tmp/lc" 2>"$tmp/err" || { tail -5 "$tmp/err" >&2; exit 1; }
            printf "round %d  depth %5d  llama.cpp    tg%d %7s tok/s  pp%d+tg%d (prompt and generation timed together) %s tok/s\n" \
                "$r" "$d" "$tg" "$(peer_rate " tg$tg |" "$tmp/lc")" "$d" "$tg" "$(peer_rate "pp$d+tg$tg" "$tmp/lc")"
        fi
        if [ -n "${LLAMA_BATCHED_BENCH:-}" ]; then
            lock "$LLAMA_BATCHED_BENCH" -m "$model" -t "$threads" -c "$ctx" -b 2048 -ub 512 \
                -npp "$d" -ntg "$tg" -npl 1 >"$tmp/lb" 2>"$tmp/err" || { tail -5 "$tmp/err" >&2; exit 1; }
            lb=$(awk -F'|' -v d="$d" '$2 + 0 == d && $4 + 0 == 1 {gsub(/ /, "", $9); print $9; exit}' "$tmp/lb")
            printf "round %d  depth %5d  llama.cpp    llama-batched-bench tg%d @depth %7s tok/s   ECS/llama.cpp @depth %s\n" \
                "$r" "$d" "$tg" "$lb" "$(awk -v a="$ed" -v b="$lb" 'BEGIN {printf "%.2f", a / b}')"
        fi
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
