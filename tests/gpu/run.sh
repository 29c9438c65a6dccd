#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU checks, for a machine with an NVIDIA GPU (the
# time lent on one is short: this builds only what the checks need and
# runs in a few minutes). One line per check:
#   ok / CHECK   a check that ran and passed (CHECK lines carry the numbers)
#   FAIL         a check that failed, with its assertion
#   SKIP         a check that could not run here, with the reason
# Checks: the CUDA kernels against the CPU reference for every weight type
# and every row count 1..256 (relative tolerance GPU_TOL = 1e-3 of the
# call's largest output, tests/unit/gpu_fixture.h says why); the tiered
# path with a VRAM budget of a quarter of the shard (hit rate, streamed and
# CPU experts, outputs within the same tolerance) and the measured cost
# model; expert GEMM throughput against the copy bandwidth for 1, 8 and 64
# rows; an NCCL send/recv between two ranks, raw and through proto/dplane's
# ordered channel; ecs-worker --device cuda:0 against the CPU worker on
# generated tiny models (teacher-forced logits within 0.05 and the same top
# token wherever the CPU's top two are further apart: the GPU multiplies
# f32 activations, the CPU q8-quantized ones, so bit-exactness is not
# possible; greedy text compared too), and with a VRAM budget for half the
# experts (the tiered path in the real worker: same tolerance, hit rate).
# Needs what `make deps` installs (gcc, libcriterion-dev, libpcre2-dev)
# and the CUDA toolkit with NCCL (nvcc on PATH or in /usr/local/cuda/bin).
# usage: tests/gpu/run.sh [BUILD_DIR]   (exit status 0 when nothing failed)
set -u
cd "$(dirname "$0")/../.." || exit 1
build=${1:-build}
mkdir -p "$build/logs" "$build/gpu"
start=$(date +%s)
pass=0; fail=0; skip=0

nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
if [ -z "$nvcc" ]; then
    echo "FAIL build: no nvcc (on PATH or /usr/local/cuda/bin)"; exit 1
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L

# only this card's architecture: a build for four takes minutes of the lent time
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
t0=$(date +%s)
if ! make -j"$(nproc)" "$build/lib/libecs_cuda.so" "$build/tests/test_gpu" \
        "$build/tests/test_tier" "$build/tests/test_gpu_bw" "$build/tests/test_dplane" \
        "$build/bin/ecs-worker" "$build/bin/ecs-run" "$build/bin/ecs-mkmodel" \
        BUILD="$build" ${cap:+CUDA_ARCHS=$cap} >"$build/logs/gpu_build.log" 2>&1; then
    echo "FAIL build - log: $build/logs/gpu_build.log"; tail -n 30 "$build/logs/gpu_build.log"
    exit 1
fi
echo "ok   build: libecs_cuda.so and the tests in $(( $(date +%s) - t0 )) s"

# Runs the Criterion tests matching $2 in binary $1 one at a time (one GPU
# context at a time) and prints one line per test, with its CHECK line.
run_tests() {
    local bin=$1 filter=$2 log="$build/logs/gpu_$(basename "$1").log"
    timeout 300 "$bin" --jobs 1 --verbose --filter "$filter" >"$log" 2>&1
    local rc=$?
    grep -a '^CHECK' "$log"
    while IFS= read -r line; do
        case "$line" in
        "[PASS]"*) pass=$((pass + 1)); echo "ok   ${line#\[PASS\] }" ;;
        "[SKIP]"*) skip=$((skip + 1)); echo "SKIP ${line#\[SKIP\] }" ;;
        "[FAIL]"*) fail=$((fail + 1)); echo "FAIL ${line#\[FAIL\] } - log: $log"
                   grep -a -A3 'Assertion Failed' "$log" | grep -a -v -E '^\[----\] *$' |
                       head -n 8 ;;
        esac
    done < <(grep -a -E '^\[(PASS|SKIP|FAIL)\]' "$log" | grep -a -v ': Test is disabled$')
    if [ "$rc" -ne 0 ] && ! grep -q -a '^\[FAIL\]' "$log"; then
        fail=$((fail + 1)); echo "FAIL $(basename "$bin") (exit $rc) - log: $log"; tail -n 20 "$log"
    fi
}
run_tests "$build/tests/test_gpu" 'gpu_device/*'
run_tests "$build/tests/test_tier" 'tier_exec/gpu_*'
run_tests "$build/tests/test_gpu_bw" 'gpu_device/*'
run_tests "$build/tests/test_dplane" 'dplane/gpu_*'

# ecs-worker on cuda:0 against the CPU worker, then with half the experts in VRAM
wk=$(pwd)/$build/gpu/worker-cuda.sh
printf '#!/bin/sh\nexec "%s" "$@" --device cuda:0 $GPU_WORKER_ARGS\n' \
    "$(pwd)/$build/bin/ecs-worker" >"$wk"
chmod +x "$wk"
toks=$(seq 7 37 2000 | head -n 48 | paste -s -d,)
worker_check() { # arch types
    local name="$1-$2" m="$build/gpu/tiny-$1-$2.gguf" d="$build/gpu/$1-$2" r a b
    mkdir -p "$d"
    if ! "$build/bin/ecs-mkmodel" --arch "$1" --preset tiny --types "$2" --seed 5 -o "$m" \
            >"$d/mk.log" 2>&1; then
        fail=$((fail + 1)); echo "FAIL worker_cuda $name: ecs-mkmodel - log: $d/mk.log"; return
    fi
    local run=("$build/bin/ecs-run" -m "$m" --threads 4 --no-repack --spawn-workers 1)
    timeout 120 "${run[@]}" --tokens "$toks" --dump-logits "$d/cpu.json" --top 8 2>"$d/cpu.err"
    GPU_WORKER_ARGS="" timeout 120 "${run[@]}" --worker-bin "$wk" --tokens "$toks" \
        --dump-logits "$d/gpu.json" --top 8 2>"$d/gpu.err"
    a=$(timeout 120 "${run[@]}" -p "The quick brown fox" -n 32 --temp 0 2>/dev/null)
    b=$(GPU_WORKER_ARGS="" timeout 120 "${run[@]}" --worker-bin "$wk" -p "The quick brown fox" \
        -n 32 --temp 0 2>/dev/null)
    local same="greedy text identical"
    [ -n "$a" ] && [ "$a" = "$b" ] || same="greedy text differs (after a near-tie)"
    if r=$(python3 tests/integration/logits_close.py "$d/cpu.json" "$d/gpu.json" 0.05 2>&1); then
        pass=$((pass + 1)); echo "CHECK worker_cuda $name: $r; $same"
    else
        fail=$((fail + 1)); echo "FAIL worker_cuda $name: $r - log: $d/gpu.err"
        tail -n 5 "$d/gpu.err"; return
    fi
    # half the experts: buffers + per-expert bytes from the first run's log
    local line fixed per n budget hit res
    line=$(grep -a -m1 'experts resident' "$d/gpu.err")
    fixed=$(sed -n 's/.*buffers \([0-9]*\) bytes.*/\1/p' <<<"$line")
    per=$(sed -n 's/.*, \([0-9]*\) per expert.*/\1/p' <<<"$line")
    n=$(sed -n 's/.* of \([0-9]*\) experts resident.*/\1/p' <<<"$line")
    if [ -z "$fixed" ] || [ -z "$per" ] || [ -z "$n" ]; then
        fail=$((fail + 1)); echo "FAIL worker_tiered $name: no tier line in $d/gpu.err"; return
    fi
    budget=$((fixed + per * n / 2))
    GPU_WORKER_ARGS="--vram-budget $budget" timeout 120 "${run[@]}" --worker-bin "$wk" \
        --tokens "$toks" --dump-logits "$d/half.json" --top 8 2>"$d/half.err"
    hit=$(grep -a 'expert cache:' "$d/half.err" | tail -n 1 | sed 's/.*expert cache: //')
    res=$(grep -a -m1 -o '[0-9]* of [0-9]* experts resident' "$d/half.err")
    if r=$(python3 tests/integration/logits_close.py "$d/cpu.json" "$d/half.json" 0.05 2>&1) &&
            [ -n "$hit" ] && [ -n "$res" ]; then
        pass=$((pass + 1)); echo "CHECK worker_tiered $name: budget $budget bytes, $res; $hit; $r"
    else
        fail=$((fail + 1)); echo "FAIL worker_tiered $name: $r ${hit:-no hit rate} - log: $d/half.err"
        tail -n 5 "$d/half.err"
    fi
}
if command -v python3 >/dev/null; then
    worker_check deepseek2 q8_0
    worker_check deepseek2 q4_k_m
    worker_check qwen3moe q4_k_m
else
    skip=$((skip + 1)); echo "SKIP worker_cuda: no python3 to compare logits"
fi

# NCCL: its own small program, the only thing that links libnccl
cuda_lib=$(dirname "$(dirname "$nvcc")")/lib64
if "$nvcc" -std=c++17 -O2 -gencode arch=compute_90,code=sm_90 \
        -gencode arch=compute_80,code=sm_80 -o "$build/gpu/nccl_pair" tests/gpu/nccl_pair.cu \
        -lnccl -lpthread -Xlinker -rpath,"$cuda_lib" >"$build/logs/gpu_nccl_build.log" 2>&1; then
    out=$(timeout 120 "$build/gpu/nccl_pair" 2>&1); rc=$?
    line=$(grep -E '^(CHECK|SKIP|FAIL) nccl_pair' <<<"$out" | tail -n 1)
    case "$line" in
    CHECK*) pass=$((pass + 1)); echo "$line" ;;
    SKIP*) skip=$((skip + 1)); echo "$line" ;;
    *) fail=$((fail + 1)); echo "${line:-FAIL nccl_pair: exit $rc, no result}"
       [ -n "$line" ] || tail -n 10 <<<"$out" ;;
    esac
else
    fail=$((fail + 1)); echo "FAIL nccl_pair build - log: $build/logs/gpu_nccl_build.log"
fi

echo "gpu checks: $pass passed, $fail failed, $skip skipped in $(( $(date +%s) - start )) s"
[ "$fail" -eq 0 ]
