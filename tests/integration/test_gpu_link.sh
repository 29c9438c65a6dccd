#!/usr/bin/env bash
# test_gpu_link.sh - the CUDA backend stays out of every other binary: no
# program or test links libcudart or libnccl (they load libecs_cuda.so with
# dlopen when asked for a GPU); where nvcc exists the .so is built, exports
# the kcuda_api entry and needs libcudart; without it there is no .so.
# usage (from the repo root): tests/integration/test_gpu_link.sh BUILD_DIR
set -u
build=${1:?usage: $0 BUILD_DIR}
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

n=0
for f in "$build"/bin/* "$build"/tests/*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    n=$((n + 1))
    if needed "$f" | grep -q -E '^lib(cudart|cuda|nccl)\.'; then
        fail "no_cuda_link" "$f needs $(needed "$f" | grep -E 'cuda|nccl' | tr '\n' ' ')"
    fi
done
[ "$n" -gt 0 ] && pass "no_cuda_link ($n binaries)" || fail "no_cuda_link" "no binaries in $build"

so="$build/lib/libecs_cuda.so"
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    if [ ! -f "$so" ]; then
        fail "cuda_so" "nvcc exists but $so was not built"
    else
        before=$fails
        nm -D --defined-only "$so" | grep -q ' T kcuda_api$' || fail "cuda_so" "no kcuda_api in $so"
        needed "$so" | grep -q '^libcudart\.so' || fail "cuda_so" "$so does not need libcudart"
        needed "$so" | grep -q '^libnccl' && fail "cuda_so" "$so needs libnccl"
        [ "$fails" -eq "$before" ] && pass "cuda_so"
    fi
else
    [ -e "$so" ] && fail "cuda_so" "no nvcc, yet $so exists" || pass "cuda_so (no nvcc: not built)"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
