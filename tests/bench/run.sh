#!/usr/bin/env bash
# Runs the benchmarks built in BUILD_DIR and prints their results; `make
# bench` calls it. Each benchmark prints its own header and one line per
# measurement. Results and how to read them: docs/benchmarks.md.
# usage: tests/bench/run.sh BUILD_DIR [--quick]
set -euo pipefail
build=${1:?usage: tests/bench/run.sh BUILD_DIR [--quick]}
shift
quick=()
if [ "${1:-}" = "--quick" ]; then quick=(--quick); fi

echo "== bench_matvec: memory bandwidth, matrix-vector and batched products =="
"$build/bench/bench_matvec" "${quick[@]}"
echo "== bench_pipes_avx512: what other operations cost beside vpdpbusd =="
"$build/bench/bench_pipes_avx512"
echo "== bench_rtt: ExpertCall round trip through proto/mux vs raw libzmq =="
"$build/bench/bench_rtt" "${quick[@]}"
"$(dirname "$0")/bench_model.sh" "$build" "${quick[@]}"
"$(dirname "$0")/bench_plan.sh" "$build" "${quick[@]}"
# experts on 1 and 2 workers against one process, on the model bench_model.sh made
if [ ${#quick[@]} -eq 0 ]; then
    "$(dirname "$0")/bench_workers.sh" "$build" "${ECS_BENCH_MODEL:-models/ds2-lite-q4_k_m.gguf}" 3
fi
