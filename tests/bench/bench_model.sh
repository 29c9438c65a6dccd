#!/usr/bin/env bash
# bench_model.sh - end-to-end model speed: prompt processing (pp), decoding
# (tg) and memory of `ecs-run --bench` on a DeepSeek-V2-Lite-shaped Q4_K_M
# model (exact shapes and llama-quantize's type mix, random weights), the
# model the targets in docs/benchmarks.md are stated for.
#
# usage: tests/bench/bench_model.sh BUILD_DIR [--quick]
#   ECS_BENCH_MODEL   model path (default models/ds2-lite-q4_k_m.gguf); made
#                     with BUILD_DIR/bin/ecs-mkmodel when absent (~10 GB of
#                     disk, a few minutes), or linked to ECS_BENCH_MODEL_CACHE
#                     (default /work/models-cache/ds2-lite-q4_k_m.gguf) when
#                     that file exists
#   ECS_BENCH_THREADS threads (default 2)   ECS_BENCH_PP / ECS_BENCH_TG (512 / 64)
#   ECS_BENCH_REPS    repetitions (default 1)
#   ECS_BENCH_PROFILE=1 adds the time per phase of the forward pass
#   ECS_BENCH_REPACK  both (default): runs with the decode copy of the weights
#                     (ecs-run --repack, kept in models/ecs-cache) and without
#                     it (--no-repack); on / off: only one of them
# --quick: a smoke run on a tiny model made in a temporary folder.
# Timed runs hold /tmp/ecs-bench.lock (flock) so that benchmarks of different
# people do not overlap; the load average before and after is printed.
set -euo pipefail
build=${1:?usage: tests/bench/bench_model.sh BUILD_DIR [--quick]}
quick=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
run="$build/bin/ecs-run"
mk="$build/bin/ecs-mkmodel"
for b in "$run" "$mk"; do
    [ -x "$b" ] || { echo "bench_model: $b is not built" >&2; exit 1; }
done

echo "== bench_model: end-to-end prompt processing and decoding (ecs-run --bench) =="
threads=${ECS_BENCH_THREADS:-2}
pp=${ECS_BENCH_PP:-512}
tg=${ECS_BENCH_TG:-64}
reps=${ECS_BENCH_REPS:-1}
ctx=4096
if [ "$quick" = "--quick" ]; then
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/ecs-bench-model.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    model="$tmp/tiny-ds2-q8_0.gguf"
    if ! "$mk" --arch deepseek2 --preset tiny --types q8_0 --seed 1 -o "$model" >"$tmp/mk.log" 2>&1; then
        cat "$tmp/mk.log" >&2
        exit 1
    fi
    pp=64 tg=16 ctx=256
else
    model=${ECS_BENCH_MODEL:-$root/models/ds2-lite-q4_k_m.gguf}
    cache=${ECS_BENCH_MODEL_CACHE:-/work/models-cache/ds2-lite-q4_k_m.gguf}
    if [ ! -f "$model" ]; then
        mkdir -p "$(dirname "$model")"
        [ -L "$model" ] && rm -f "$model" # a link to a model that is gone
        if [ -f "$cache" ]; then
            ln -s "$cache" "$model"
        else
            avail=$(df -Pk "$(dirname "$model")" | awk 'NR == 2 {print $4}')
            if [ "${avail:-0}" -lt $((11 * 1024 * 1024)) ]; then
                echo "bench_model: $model needs ~10 GB of disk, $((avail / 1024)) MB free" >&2
                exit 1
            fi
            echo "bench_model: making $model (DeepSeek-V2-Lite shapes, Q4_K_M, ~10 GB)"
            "$mk" --arch deepseek2 --preset ds2-lite --types q4_k_m --seed 1 -o "$model.part"
            mv "$model.part" "$model"
        fi
    fi
fi

# shellcheck source=tests/bench/rates.sh
. "$(dirname "$0")/rates.sh"
echo "load before: $(uptime)"
profile=()
[ "${ECS_BENCH_PROFILE:-0}" = 1 ] && profile=(--profile)
modes=(on off)
case "${ECS_BENCH_REPACK:-both}" in on) modes=(on) ;; off) modes=(off) ;; esac
for mode in "${modes[@]}"; do
    if [ "$mode" = on ]; then
        echo "-- with the decode copy (--repack $(dirname "$model")/ecs-cache)"
        flags=(--repack "$(dirname "$model")/ecs-cache")
    else
        echo "-- decoding from the GGUF (--no-repack)"
        flags=(--no-repack)
    fi
    lock "$run" -m "$model" --bench --pp "$pp" --tg "$tg" --reps "$reps" --threads "$threads" \
        --ctx "$ctx" "${flags[@]}" "${profile[@]}"
done
echo "load after:  $(uptime)"
