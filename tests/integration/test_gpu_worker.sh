#!/usr/bin/env bash
# test_gpu_worker.sh - ecs-worker's device path (worker/device.c) without a
# GPU, on kgpu's host emulation (--device emu): a VRAM budget that holds
# only the activation buffers (every expert on the host tier, kernels/moe)
# gives the local backend's logits bit for bit; a budget for some experts
# (resident, streamed and host experts mixed) stays within the tolerance
# of f32 activations against the CPU's quantized ones, reports its hit rate
# and makes no device allocation after the assignment; a budget below the
# buffers is refused with a clear message; --device cuda:N where no GPU is
# visible fails at start with the reason (SKIP by name where one is).
# Tolerance: the device tier multiplies f32 activations by dequantized
# weights while the CPU quantizes activations to q8 first, so logits move
# by about 1e-2 on the tiny models (whose logits are ~1): 0.05 is allowed.
# usage: tests/integration/test_gpu_worker.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_gpu_worker.sh BUILD_DIR}
run="$build/bin/ecs-run"
worker=$(cd "$build/bin" && pwd)/ecs-worker
tmp=$(mktemp -d)
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
model=../shared/models/tiny-ds2-q8_0.gguf
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
skip() { echo "SKIP $*"; }

# spawned workers run this: ecs-worker with the device arguments of $DEV_ARGS
cat >"$tmp/worker.sh" <<EOF
#!/bin/sh
exec "$worker" "\$@" \$DEV_ARGS
EOF
chmod +x "$tmp/worker.sh"

toks=$(/usr/bin/python3 -c "import random; random.seed(11); print(','.join(str(random.randrange(1, 2000)) for _ in range(48)))")
dump() { # out [args...]
    local out=$1; shift
    timeout 120 "$run" -m "$model" --threads 2 --no-repack --tokens "$toks" --dump-logits "$out" \
        --top 8 "$@" 2>"$out.err"
}
dump "$tmp/local.json" || { bad "local run: $(tail -2 "$tmp/local.json.err")"; exit 1; }

# 1. the activation buffers only: every expert on the host tier
export DEV_ARGS="--device emu --vram-budget 5M"
if ! dump "$tmp/host.json" --spawn-workers 1 --worker-bin "$tmp/worker.sh"; then
    bad "emu, 5M: ecs-run failed: $(tail -3 "$tmp/host.json.err")"
elif ! grep -q "0 of 48 experts resident" "$tmp/host.json.err"; then
    bad "emu, 5M: expected no resident expert: $(grep -a resident "$tmp/host.json.err")"
elif cmp -s "$tmp/local.json" "$tmp/host.json"; then
    ok "emu, buffers only: logits identical to the local backend"
else
    bad "emu, buffers only: logits differ from the local backend"
fi

# 2. room for some experts: resident, streamed and host experts in one call
export DEV_ARGS="--device emu --vram-budget 7M"
if ! dump "$tmp/tier.json" --spawn-workers 1 --worker-bin "$tmp/worker.sh"; then
    bad "emu, 7M: ecs-run failed: $(tail -3 "$tmp/tier.json.err")"
else
    if close=$(/usr/bin/python3 tests/integration/logits_close.py "$tmp/local.json" \
            "$tmp/tier.json" 0.05); then
        ok "emu, 7M: $close"
    else
        bad "emu, 7M: $close"
    fi
    lines=$(grep -a "expert cache:" "$tmp/tier.json.err")
    first=$(head -n 1 <<<"$lines"); last=$(tail -n 1 <<<"$lines")
    a0=$(sed -n 's/.* \([0-9]*\) device allocations.*/\1/p' <<<"$first")
    a1=$(sed -n 's/.* \([0-9]*\) device allocations.*/\1/p' <<<"$last")
    uses=$(sed -n 's/.*hits of \([0-9]*\) uses.*/\1/p' <<<"$last")
    resident=$(sed -n 's/.*emulation: \([0-9]*\) of 48 experts resident.*/\1/p' "$tmp/tier.json.err")
    if [ -n "$resident" ] && [ "$resident" -gt 0 ] && [ "$resident" -lt 48 ]; then
        ok "emu, 7M: $resident of 48 experts resident"
    else
        bad "emu, 7M: resident experts '$resident' (want some, not all)"
    fi
    if [ -n "$uses" ] && [ "$uses" -gt 0 ] && grep -q "hit rate [0-9.]*%" <<<"$last"; then
        ok "emu, 7M: hit rate reported: ${last#*expert cache: }"
    else
        bad "emu, 7M: no hit rate after the run: '$last'"
    fi
    if [ -n "$a0" ] && [ "$a0" = "$a1" ]; then
        ok "emu, 7M: no device allocation on the request path ($a0 at assignment and at exit)"
    else
        bad "emu, 7M: device allocations $a0 at assignment, $a1 at exit"
    fi
fi

# 3. a budget below the activation buffers: refused, and the run says why
export DEV_ARGS="--device emu --vram-budget 1M"
if dump "$tmp/small.json" --spawn-workers 1 --worker-bin "$tmp/worker.sh"; then
    bad "emu, 1M: the run succeeded"
elif grep -q "below the .* activation buffers" "$tmp/small.json.err"; then
    ok "emu, 1M: refused: $(grep -a -m1 -o 'the VRAM budget.*buffers' "$tmp/small.json.err")"
else
    bad "emu, 1M: no clear refusal: $(tail -2 "$tmp/small.json.err")"
fi

# 4. bad device names and no GPU: clear errors at start, before registering
out=$(timeout 20 "$worker" -m "$model" --coordinator "ipc://$tmp/none" --device tpu:0 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && grep -q "want cpu, cuda:N or emu" <<<"$out"; then
    ok "--device tpu:0 refused: ${out#ecs-worker: }"
else
    bad "--device tpu:0: exit $rc, '$out'"
fi
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    skip "no_gpu_message: a GPU is visible here (tests/gpu/run.sh checks cuda:0)"
else
    out=$(timeout 20 "$worker" -m "$model" --coordinator "ipc://$tmp/none" --device cuda:0 2>&1)
    rc=$?
    if [ "$rc" -ne 0 ] && grep -q "GPU" <<<"$out" && grep -q -- "--device cpu" <<<"$out"; then
        ok "--device cuda:0 without a GPU: ${out#ecs-worker: }"
    else
        bad "--device cuda:0 without a GPU: exit $rc, '$out'"
    fi
fi
exit $fail
