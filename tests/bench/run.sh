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
# the peers, built beside the project by whoever runs this (never by it):
# their llama-bench binaries as the variables bench_depth.sh and bench_pp.sh take
peers=${ECS_PEERS:-../peers}
peer_env=()
[ -x "$peers/ik_llama.cpp/build/bin/llama-bench" ] &&
    peer_env+=("IK_LLAMA_BENCH=$peers/ik_llama.cpp/build/bin/llama-bench")
[ -x "$peers/llama.cpp/build/bin/llama-bench" ] &&
    peer_env+=("LLAMA_BENCH=$peers/llama.cpp/build/bin/llama-bench")
[ -x "$peers/llama.cpp/build/bin/llama-batched-bench" ] &&
    peer_env+=("LLAMA_BATCHED_BENCH=$peers/llama.cpp/build/bin/llama-batched-bench")

echo "== bench_matvec: memory bandwidth, matrix-vector and batched products =="
"$build/bench/bench_matvec" "${quick[@]}"
echo "== bench_pipes_avx512: what other operations cost beside vpdpbusd; the float products' peaks =="
"$build/bench/bench_pipes_avx512"
echo "== bench_attn_depth: one layer's decode attention core at depth 4096, two-pass vs one-pass =="
if [ ${#quick[@]} -eq 0 ]; then "$build/bench/bench_attn_depth"; else "$build/bench/bench_attn_depth" 1024 bf16 4 3; fi
echo "== bench_attn_prompt: a prompt step's expanded-form Q.K and P.V at depth, one thread =="
if [ ${#quick[@]} -eq 0 ]; then "$build/bench/bench_attn_prompt"; else "$build/bench/bench_attn_prompt" 1024; fi
echo "== bench_rtt: ExpertCall round trip through proto/mux vs raw libzmq =="
"$build/bench/bench_rtt" "${quick[@]}"
echo "== bench_wake: one futex wake-up, the sleeper on the waker's CPU and on another; two processes taking turns =="
if [ ${#quick[@]} -eq 0 ]; then "$build/bench/bench_wake"; else "$build/bench/bench_wake" 50; fi
"$(dirname "$0")/bench_model.sh" "$build" "${quick[@]}"
"$(dirname "$0")/bench_plan.sh" "$build" "${quick[@]}"
# decode at depth (issue 16): ECS alone from 512 to 8192 tokens, then tg64 at
# 4096 and pp512 side by side with the llama-bench builds beside the project, if any
if [ ${#quick[@]} -eq 0 ]; then
    depth_model=${ECS_BENCH_MODEL:-models/ds2-lite-q4_k_m.gguf}
    ECS_BENCH_TG=32 "$(dirname "$0")/bench_depth.sh" "$build" "$depth_model" 512,2048,4096,8192 1
    if [ ${#peer_env[@]} -gt 0 ]; then
        env ECS_BENCH_TG=64 "${peer_env[@]}" "$(dirname "$0")/bench_depth.sh" "$build" "$depth_model" 4096 1
        env "${peer_env[@]}" "$(dirname "$0")/bench_pp.sh" "$build" "$depth_model" 512 2
    else
        echo "bench_depth: no llama-bench under $peers/{llama.cpp,ik_llama.cpp}/build/bin: peers skipped"
    fi
fi
# experts on 1 and 2 workers against one process, on the model bench_model.sh made
if [ ${#quick[@]} -eq 0 ]; then
    "$(dirname "$0")/bench_workers.sh" "$build" "${ECS_BENCH_MODEL:-models/ds2-lite-q4_k_m.gguf}" 3
    # the same as short runs in rotated order (the host's speed moves within
    # minutes), 1 worker pinned (the default) and not (docs/benchmarks.md, session 35)
    LAYOUTS="--spawn-workers 1;--spawn-workers 1 --pin-threads off;--spawn-workers 2" \
        "$(dirname "$0")/bench_rotate.sh" "$build" "${ECS_BENCH_MODEL:-models/ds2-lite-q4_k_m.gguf}" 6 \
        tg64 -- --pp 0 --tg 64 --threads 2
    TARGET=0.75 "$(dirname "$0")/bench_rotate.sh" "$build" \
        "${ECS_BENCH_MODEL:-models/ds2-lite-q4_k_m.gguf}" 6 pp512 -- --pp 512 --tg 0 --threads 2
fi
# JSON mode's token mask, a decoded token's extra time (the tiny model: the
# mask depends on the vocabulary, not on the model's size)
if [ ${#quick[@]} -eq 0 ] && [ -f ../shared/models/tiny-ds2-q8_0.gguf ]; then
    /usr/bin/python3 "$(dirname "$0")/bench_json_mode.py" "$build" ../shared/models/tiny-ds2-q8_0.gguf 5 128
fi
# serving (issue 17; tests/bench/bench_serve.py): ecs-coordinator, then each
# llama-server built beside the project, on the same model, when it exists
serve_model=${ECS_SERVE_MODEL:-/work/models-cache/ds2-lite-4l.gguf}
if [ ${#quick[@]} -eq 0 ] && [ -f "$serve_model" ]; then
    threads=${ECS_BENCH_THREADS:-2}
    bs="/usr/bin/python3 $(dirname "$0")/bench_serve.py"
    pc=$(mktemp -d "${TMPDIR:-/tmp}/ecs-bench-serve.XXXXXX")
    $bs --restart --label ecs --server-cmd "$build/bin/ecs-coordinator -m $serve_model \
        --http 127.0.0.1:{port} --threads $threads --ctx 9216 --max-running 8 --prefix-cache-dir $pc"
    rm -rf "$pc"
    # an agent's turn alone: 256-row prompt chunks against --idle-chunk's
    # whole batch, alternating, the same bits checked
    /usr/bin/python3 "$(dirname "$0")/bench_chunk.py" "$build" "$serve_model" --threads "$threads"
    for peer in llama.cpp ik_llama.cpp; do
        ls="$peers/$peer/build/bin/llama-server"
        [ -x "$ls" ] || { echo "bench_serve: $ls not built, skipped"; continue; }
        # llama-server splits -c evenly over its slots: 8 short ones for the
        # streams, 2 of 9216 tokens for the conversation and the gap
        $bs --label "$peer" --sections streams --server-cmd "$ls -m $serve_model --host 127.0.0.1 \
            --port {port} -t $threads --parallel 8 -c 4096 ${LLAMA_SERVER_ARGS:-}"
        $bs --label "$peer" --sections ttft,gap --server-cmd "$ls -m $serve_model --host 127.0.0.1 \
            --port {port} -t $threads --parallel 2 -c 18432 ${LLAMA_SERVER_ARGS:-}"
    done
fi
