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
# model; an NCCL send/recv between two ranks.
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

t0=$(date +%s)
if ! make -j"$(nproc)" "$build/lib/libecs_cuda.so" "$build/tests/test_gpu" \
        "$build/tests/test_tier" BUILD="$build" >"$build/logs/gpu_build.log" 2>&1; then
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
