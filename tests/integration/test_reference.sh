#!/usr/bin/env bash
# test_reference.sh BUILD_DIR - ecs-run's logits against the independent
# float64 reference forward (tests/reference/ref_forward.py).
#
# 1. The reference itself is checked against llama.cpp / ik_llama.cpp outputs
#    on the shared Q8_0 tiny models (teacher forcing, top-5 logits; Q8_0
#    activation noise makes ~0.03 the expected worst case, so tol 0.05).
# 2. ecs-mkmodel makes F32 tiny models (deepseek2 with q-LoRA, qwen3moe, and
#    the 27-layer deepseek2 without q-LoRA); ecs-run dumps the top-8 logits
#    of every position of a token sequence; the reference must agree within
#    REF_TOL on every dumped logit and on the top-8 sets (ties within the
#    tolerance may come in either order). deepseek2 runs three times:
#    the latent cache with its prompt step in the expanded form (the
#    default: the sequence is longer than MODEL_MLA_EXPAND_ROWS), latent
#    and absorbed throughout (--mla-absorbed), and --mla-expanded.
#    ecs-run keeps its KV cache in F32 here (--kv-f32: no F16 rounding of
#    K, V, the query or the probabilities), so with F32 weights the only
#    difference from the float64 reference is F32 arithmetic, and REF_TOL
#    defaults to 1e-4 (measured worst case 7e-7). Expert choices whose
#    margin is below 1e-4 may follow the engine (see follow_ties in
#    ref_forward.py); the PASS line names any such choice.
#
# Missing binaries or reference data are failures, never skips.
# Prints one PASS/FAIL line per check; exits non-zero if any failed.
# (its numpy reference runs under a 600 s timeout: it runs alone, after the others)
# ecs-test: serial
set -u

BUILD=${1:?usage: test_reference.sh BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${ECS_SHARED:-$ROOT/../shared}
PY=${PYTHON:-/usr/bin/python3}
REF="$ROOT/tests/reference/ref_forward.py"
TOL=${REF_TOL:-1e-4}
TOP=8
N_TOKENS=72 # more than MODEL_MLA_EXPAND_ROWS: the default latent path expands
STEP_TIMEOUT=600

failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/ecs-ref.XXXXXX") || { echo "FAIL mktemp"; exit 1; }
trap 'rm -rf "$TMP"' EXIT

# run NAME LOG CMD...: runs CMD with a timeout, output to LOG; on failure
# prints a FAIL line with the log's tail.
run() {
    local name=$1 log=$2
    shift 2
    timeout "$STEP_TIMEOUT" "$@" >"$log" 2>&1 && return 0
    local rc=$?
    fail "$name (exit $rc: $*)"
    tail -n 15 "$log" | sed 's/^/    /'
    return 1
}

# ---- 0. prerequisites ----
if ! "$PY" -c 'import numpy' 2>/dev/null; then
    fail "python with numpy ($PY)"
    exit 1
fi
MKMODEL="$BUILD/bin/ecs-mkmodel"
ECSRUN="$BUILD/bin/ecs-run"
have_bins=1
for b in "$MKMODEL" "$ECSRUN"; do
    if [ ! -x "$b" ]; then
        fail "binary $b is missing (build it first)"
        have_bins=0
    fi
done

# ---- 1. the reference against llama.cpp's own outputs ----
for pair in "tiny-ds2-q8_0.gguf tiny-ds2-q8_0.llamacpp.json" \
            "tiny-qwen3moe-q8_0.gguf tiny-qwen3moe-q8_0.ik_llama.json"; do
    set -- $pair
    model="$SHARED/models/$1" refjson="$SHARED/reference/$2"
    if [ ! -f "$model" ] || [ ! -f "$refjson" ]; then
        fail "reference data $model / $refjson missing"
        continue
    fi
    log="$TMP/against-$1.log"
    if run "ref_forward vs $2" "$log" "$PY" "$REF" "$model" --against "$refjson" --tol 0.05; then
        pass "ref_forward vs $2: $(tail -n 1 "$log")"
    fi
done

[ "$have_bins" = 1 ] || exit 1

# ---- 2. ecs-run against the reference on F32 models ----
n_vocab_of() {
    "$PY" - "$1" <<EOF
import sys
sys.path.insert(0, "$ROOT/tests/reference")
from gguf_read import GGUFReader
print(GGUFReader(sys.argv[1]).info("token_embd.weight").ne[1])
EOF
}

# A fixed, seed-dependent token sequence spread over the vocabulary.
tokens_for() {
    local n_vocab=$1 seed=$2 out="" i
    for ((i = 0; i < N_TOKENS; i++)); do
        out+="${out:+,}$(( (seed * 7919 + i * 104729 + i * i * 31) % n_vocab ))"
    done
    echo "$out"
}

for spec in "deepseek2 tiny 11" "qwen3moe tiny 12" "deepseek2 tiny-27l 13"; do
    set -- $spec
    arch=$1 preset=$2 seed=$3 name="$1-$2"
    model="$TMP/$name.gguf"
    run "ecs-mkmodel $name" "$TMP/$name.mk.log" \
        "$MKMODEL" --arch "$arch" --preset "$preset" --types f32 --seed "$seed" -o "$model" ||
        continue
    if ! n_vocab=$(n_vocab_of "$model" 2>"$TMP/$name.vocab.log"); then
        fail "$name: cannot read the model ecs-mkmodel wrote"
        sed 's/^/    /' "$TMP/$name.vocab.log"
        continue
    fi
    toks=$(tokens_for "$n_vocab" "$seed")
    variants="default:expanded"
    [ "$arch" = deepseek2 ] &&
        variants="default:expanded --mla-absorbed:absorbed --mla-expanded:expanded"
    for v in $variants; do
        flag=${v%%:*} mla=${v#*:} tag="$name${flag#default}"
        extra=()
        [ "$flag" = default ] || extra=("$flag")
        run "ecs-run $tag" "$TMP/$tag.run.log" \
            "$ECSRUN" -m "$model" --kv-f32 --tokens "$toks" --dump-logits "$TMP/$tag.ecs.json" \
            --top "$TOP" "${extra[@]}" || continue
        if [ ! -s "$TMP/$tag.ecs.json" ]; then
            fail "ecs-run $tag wrote no --dump-logits file"
            continue
        fi
        log="$TMP/$tag.cmp.log"
        if run "$tag: ecs-run vs reference" "$log" "$PY" "$REF" "$model" --tokens "$toks" \
            --compare "$TMP/$tag.ecs.json" --top "$TOP" --tol "$TOL" --mla "$mla"; then
            pass "$tag: ecs-run vs reference, $(tail -n 1 "$log" | sed 's/^ok: //')"
        fi
    done
done

exit "$failed"
