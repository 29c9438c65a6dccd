#!/usr/bin/env bash
# test_logits.sh - our logits against llama.cpp's / ik_llama.cpp's on the
# tiny anchor models, teacher forced (see compare_logits.py for the checks).
# usage: tests/integration/test_logits.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_logits.sh BUILD_DIR}
run="$build/bin/ecs-run"
py=/usr/bin/python3
cmp=tests/integration/compare_logits.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# model, reference, extra ecs-run flags (the deepseek2 model runs twice: the
# default absorbed-latent MLA path and llama.cpp's expanded K/V path)
pairs=(
    "../shared/models/tiny-ds2-q8_0.gguf ../shared/reference/tiny-ds2-q8_0.llamacpp.json"
    "../shared/models/tiny-ds2-q8_0.gguf ../shared/reference/tiny-ds2-q8_0.llamacpp.json --mla-expanded"
    "../shared/models/tiny-qwen3moe-q8_0.gguf ../shared/reference/tiny-qwen3moe-q8_0.ik_llama.json"
)
fail=0
if [ ! -x "$run" ]; then
    echo "FAIL: $run not built"
    exit 1
fi
for pair in "${pairs[@]}"; do
    set -- $pair
    model=$1 ref=$2 flags=${3:-}
    for f in "$model" "$ref"; do
        if [ ! -f "$f" ]; then
            echo "FAIL: missing $f"
            fail=1
        fi
    done
    [ -f "$model" ] && [ -f "$ref" ] || continue
    echo "== $(basename "$model") $flags vs $(basename "$ref")"
    names=$($py $cmp names "$ref") || { echo "FAIL: cannot read $ref"; fail=1; continue; }
    for name in $names; do
        { read -r toks; read -r ids; } < <($py $cmp args "$ref" "$name")
        out="$tmp/$(basename "$model" .gguf)-$name.json"
        if ! "$run" -m "$model" $flags --threads 2 --tokens "$toks" --dump-logits "$out" \
                --top 5 --logits-of "$ids" 2>"$tmp/err"; then
            echo "FAIL $name: ecs-run failed:"; cat "$tmp/err"
            fail=1
            continue
        fi
        $py $cmp check "$ref" "$name" "$out" || fail=1
    done
done
if [ "$fail" -ne 0 ]; then
    echo "test_logits: FAIL"
    exit 1
fi
echo "test_logits: ok"
