#!/usr/bin/env bash
# test_mkmodel.sh - ecs-mkmodel against the reference models and llama.cpp's
# quantization rules. Files are inspected with gguf_inspect.py, a parser
# independent of the project's C reader.
# usage (from the repo root): tests/integration/test_mkmodel.sh BUILD_DIR
set -u
build=${1:?usage: $0 BUILD_DIR}
root=$(pwd)
bin="$root/$build/bin/ecs-mkmodel"
py=/usr/bin/python3
ins="$py $root/tests/integration/gguf_inspect.py"
vocab="$root/../shared/reference/tokenizer/ggml-vocab-deepseek-llm.gguf"
refs="$root/../shared/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
# check NAME CMD...: PASS if CMD succeeds; its output goes to the log.
check() {
    local name=$1; shift
    if "$@" >"$tmp/out" 2>&1; then pass "$name"; else fail "$name" "$(tail -n 20 "$tmp/out")"; fi
}

[ -x "$bin" ] || { echo "FAIL setup: $bin missing (make BUILD=$build $build/bin/ecs-mkmodel)"; exit 1; }
for f in "$vocab" "$refs/tiny-ds2-q8_0.gguf" "$refs/tiny-qwen3moe-q8_0.gguf"; do
    [ -r "$f" ] || { echo "FAIL setup: reference file $f missing"; exit 1; }
done

mk() { "$bin" "$@" 2>>"$tmp/mk.log"; }
get() { $ins get "$1" "$2"; }
# ne1 of a tensor ("256x102400" -> 102400)
rows() { $ins tensors "$1" | awk -v n="$2" '$1 == n { split($3, d, "x"); print d[2] }'; }

# ---- the tiny presets reproduce the reference models' keys, tensors, types
mk --arch deepseek2 --preset tiny --types q8_0 --vocab "$vocab" --seed 1 -o "$tmp/ds2.gguf"
check ds2_tiny_q8_0_matches_reference \
    $ins compare "$tmp/ds2.gguf" "$refs/tiny-ds2-q8_0.gguf" --ignore general.name
check ds2_tiny_layout $ins check "$tmp/ds2.gguf"

mk --arch qwen3moe --preset tiny --types q8_0 --vocab "$vocab" --seed 1 -o "$tmp/qw.gguf"
check qwen3moe_tiny_q8_0_matches_reference \
    $ins compare "$tmp/qw.gguf" "$refs/tiny-qwen3moe-q8_0.gguf" --ignore general.name
check qwen3moe_tiny_layout $ins check "$tmp/qw.gguf"

# ---- determinism: same seed -> same bytes (any thread count), other seed differs
mk --arch deepseek2 --preset tiny --types q8_0 --vocab "$vocab" --seed 1 --threads 1 \
    -o "$tmp/ds2-again.gguf"
check same_seed_identical_bytes cmp "$tmp/ds2.gguf" "$tmp/ds2-again.gguf"
mk --arch deepseek2 --preset tiny --types q8_0 --vocab "$vocab" --seed 2 -o "$tmp/ds2-seed2.gguf"
if [ -f "$tmp/ds2-seed2.gguf" ] && ! cmp -s "$tmp/ds2.gguf" "$tmp/ds2-seed2.gguf" &&
    $ins compare "$tmp/ds2.gguf" "$tmp/ds2-seed2.gguf" >/dev/null; then
    pass different_seed_differs_same_layout
else
    fail different_seed_differs_same_layout "seed 2 file missing, identical, or laid out differently"
fi

# ---- weights: N(0, 0.02) matrices, norms 1.0 (Q8_0 dequantized)
read -r n mean std < <($ins qstats "$tmp/qw.gguf" token_embd.weight)
if $py -c "import sys; sys.exit(not (abs($mean) < 2e-4 and 0.0198 < $std < 0.0202))"; then
    pass weights_normal_0_0.02
else
    fail weights_normal_0_0.02 "token_embd mean $mean std $std"
fi
read -r n mean std < <($ins qstats "$tmp/qw.gguf" blk.3.attn_k_norm.weight)
[ "$mean" = "1.000000" ] && [ "$std" = "0.000000" ] && pass norms_are_one ||
    fail norms_are_one "attn_k_norm mean $mean std $std"

# ---- tiny-27l: V2-Lite attention (attn_q, no q-LoRA)
mk --arch deepseek2 --preset tiny-27l --types q8_0 --vocab "$vocab" --seed 1 -o "$tmp/ds27.gguf"
$ins tensors "$tmp/ds27.gguf" >"$tmp/ds27.t" 2>&1
if [ "$(wc -l <"$tmp/ds27.t")" -eq 377 ] && ! grep -q attn_q_a "$tmp/ds27.t" &&
    [ "$(grep -c 'attn_q.weight Q8_0 256x192$' "$tmp/ds27.t")" -eq 27 ] &&
    [ "$(get "$tmp/ds27.gguf" deepseek2.block_count)" = 27 ] &&
    ! get "$tmp/ds27.gguf" deepseek2.attention.q_lora_rank >/dev/null 2>&1; then
    pass tiny_27l_attn_q_no_q_lora
else
    fail tiny_27l_attn_q_no_q_lora "$(head -c 600 "$tmp/ds27.t")"
fi

# ---- q4_k_m follows llama-quantize's rules. Tiny: 4 layers, so the
# use_more_bits layers are 2 and 3; rows of 64/128 fall back to Q5_0 (from
# Q4_K) or Q8_0 (from Q6_K).
ds2_q4km_expected() {
    echo "token_embd.weight Q4_K 256x102400"
    echo "output.weight Q6_K 256x102400"
    echo "output_norm.weight F32 256"
    for i in 0 1 2 3; do
        b="blk.$i"
        echo "$b.attn_norm.weight F32 256"
        echo "$b.attn_q_a.weight Q4_K 256x128"
        echo "$b.attn_q_a_norm.weight F32 128"
        echo "$b.attn_q_b.weight Q5_0 128x192"
        echo "$b.attn_kv_a_mqa.weight Q4_K 256x80"
        echo "$b.attn_kv_a_norm.weight F32 64"
        echo "$b.attn_kv_b.weight Q5_0 64x256"
        echo "$b.attn_output.weight Q5_0 128x256"
        echo "$b.ffn_norm.weight F32 256"
        if [ $i -eq 0 ]; then
            echo "$b.ffn_gate.weight Q4_K 256x512"
            echo "$b.ffn_up.weight Q4_K 256x512"
            echo "$b.ffn_down.weight Q4_K 512x256"
            continue
        fi
        if [ $i -ge 2 ]; then down=Q8_0; sh=Q6_K; else down=Q5_0; sh=Q4_K; fi
        echo "$b.ffn_gate_inp.weight F32 256x16"
        echo "$b.ffn_gate_exps.weight Q4_K 256x128x16"
        echo "$b.ffn_up_exps.weight Q4_K 256x128x16"
        echo "$b.ffn_down_exps.weight $down 128x256x16"
        echo "$b.ffn_gate_shexp.weight Q4_K 256x256"
        echo "$b.ffn_up_shexp.weight Q4_K 256x256"
        echo "$b.ffn_down_shexp.weight $sh 256x256"
    done
}
qwen_q4km_expected() {
    echo "token_embd.weight Q4_K 256x102400"
    echo "output.weight Q6_K 256x102400"
    echo "output_norm.weight F32 256"
    for i in 0 1 2 3; do
        b="blk.$i"
        if [ $i -ge 2 ]; then v=Q6_K; down=Q8_0; else v=Q4_K; down=Q5_0; fi
        echo "$b.attn_norm.weight F32 256"
        echo "$b.attn_q.weight Q4_K 256x256"
        echo "$b.attn_k.weight Q4_K 256x64"
        echo "$b.attn_v.weight $v 256x64"
        echo "$b.attn_output.weight Q4_K 256x256"
        echo "$b.attn_q_norm.weight F32 32"
        echo "$b.attn_k_norm.weight F32 32"
        echo "$b.ffn_norm.weight F32 256"
        echo "$b.ffn_gate_inp.weight F32 256x16"
        echo "$b.ffn_gate_exps.weight Q4_K 256x128x16"
        echo "$b.ffn_up_exps.weight Q4_K 256x128x16"
        echo "$b.ffn_down_exps.weight $down 128x256x16"
    done
}
q4km_check() { # NAME ARCH EXPECTED_FN
    mk --arch "$2" --preset tiny --types q4_k_m --vocab "$vocab" --seed 5 -o "$tmp/q4.gguf"
    $ins tensors "$tmp/q4.gguf" 2>&1 | LC_ALL=C sort >"$tmp/q4.got"
    "$3" | LC_ALL=C sort >"$tmp/q4.want"
    if diff "$tmp/q4.want" "$tmp/q4.got" >"$tmp/q4.diff" &&
        [ "$(get "$tmp/q4.gguf" general.file_type)" = 15 ] && $ins check "$tmp/q4.gguf" >/dev/null; then
        pass "$1"
    else
        fail "$1" "$(head -n 20 "$tmp/q4.diff") file_type $(get "$tmp/q4.gguf" general.file_type)"
    fi
}
q4km_check ds2_tiny_q4_k_m_types deepseek2 ds2_q4km_expected
q4km_check qwen3moe_tiny_q4_k_m_types qwen3moe qwen_q4km_expected

# ---- the full-size plans (no weights written): ds2-lite must reproduce the
# Q4_K_M mix llama-quantize chose (model-shapes-deepseek2.md)
layers_of() { # PLAN TENSOR TYPE -> sorted layer numbers
    awk -v t="$2" -v ty="$3" '$1 == "tensor" && $3 == ty && index($2, "." t ".weight") {
        split($2, p, "."); print p[2] }' "$1" | sort -n | tr '\n' ' '
}
"$bin" --arch deepseek2 --preset ds2-lite --types q4_k_m --vocab "$vocab" -o "$tmp/lite.gguf" \
    --dry-run >"$tmp/lite.plan" 2>>"$tmp/mk.log"
more_bits_27="1 2 5 8 11 14 17 20 23 24 25 26 "
if [ "$(layers_of "$tmp/lite.plan" ffn_down_exps q8_0)" = "$more_bits_27" ] &&
    [ "$(layers_of "$tmp/lite.plan" ffn_down_shexp q6_K)" = "$more_bits_27" ] &&
    [ "$(grep -c 'ffn_down_exps.weight q5_0 1408x2048x64$' "$tmp/lite.plan")" -eq 14 ] &&
    grep -q '^tensor blk.0.ffn_down.weight q8_0 10944x2048$' "$tmp/lite.plan" &&
    grep -q '^tensor output.weight q6_K 2048x102400$' "$tmp/lite.plan" &&
    grep -q '^tensor token_embd.weight q4_K 2048x102400$' "$tmp/lite.plan" &&
    [ "$(grep -c '^tensor' "$tmp/lite.plan")" -eq 377 ] && [ ! -e "$tmp/lite.gguf" ]; then
    pass ds2_lite_q4_k_m_plan
else
    fail ds2_lite_q4_k_m_plan "$(grep -v '^tensor' "$tmp/lite.plan")"
fi
# by bytes: Q4_K 57.6 %, Q8_0 22.9 %, Q5_0 17.1 %, Q6_K 2.2 % (the doc's table)
if grep -q '^bytes q4_K .* 57.6%$' "$tmp/lite.plan" && grep -q '^bytes q8_0 .* 22.9%$' "$tmp/lite.plan" &&
    grep -q '^bytes q5_0 .* 17.1%$' "$tmp/lite.plan" && grep -q '^bytes q6_K .* 2.2%$' "$tmp/lite.plan"; then
    pass ds2_lite_q4_k_m_byte_mix
else
    fail ds2_lite_q4_k_m_byte_mix "$(grep '^bytes' "$tmp/lite.plan")"
fi
"$bin" --arch qwen3moe --preset qwen3-30b-a3b --types q4_k_m --vocab "$vocab" -o "$tmp/q30.gguf" \
    --dry-run >"$tmp/q30.plan" 2>>"$tmp/mk.log"
more_bits_48="0 1 2 3 4 5 8 11 14 17 20 23 26 29 32 35 38 41 42 43 44 45 46 47 "
if [ "$(layers_of "$tmp/q30.plan" attn_v q6_K)" = "$more_bits_48" ] &&
    [ "$(layers_of "$tmp/q30.plan" ffn_down_exps q6_K)" = "$more_bits_48" ] &&
    grep -q '^tensor blk.47.ffn_gate_exps.weight q4_K 2048x768x128$' "$tmp/q30.plan" &&
    grep -q '^tensor blk.0.attn_q.weight q4_K 2048x4096$' "$tmp/q30.plan" &&
    grep -q '^tensor blk.0.attn_k.weight q4_K 2048x512$' "$tmp/q30.plan" &&
    [ "$(grep -c '^tensor' "$tmp/q30.plan")" -eq $((3 + 48 * 12)) ]; then
    pass qwen3_30b_q4_k_m_plan
else
    fail qwen3_30b_q4_k_m_plan "$(grep -E 'attn_v|bytes' "$tmp/q30.plan" | head -n 12)"
fi

# ---- no --vocab: a tokenizer trained on the corpus sets the vocab size
mk --arch deepseek2 --preset tiny --types f32 --seed 3 -o "$tmp/nv.gguf"
if [ -f "$tmp/nv.gguf" ]; then
    ntok=$(get "$tmp/nv.gguf" tokenizer.ggml.tokens | sed -n 's/.*\] x\([0-9]*\) .*/\1/p')
    if [ -n "$ntok" ] && [ "$ntok" -gt 256 ] && [ "$(get "$tmp/nv.gguf" deepseek2.vocab_size)" = "$ntok" ] &&
        [ "$(rows "$tmp/nv.gguf" token_embd.weight)" = "$ntok" ] &&
        [ "$(rows "$tmp/nv.gguf" output.weight)" = "$ntok" ] &&
        [ "$(get "$tmp/nv.gguf" general.file_type)" = 0 ] &&
        ! $ins tensors "$tmp/nv.gguf" | grep -qv ' F32 ' && $ins check "$tmp/nv.gguf" >/dev/null; then
        pass no_vocab_trained_tokenizer
    else
        fail no_vocab_trained_tokenizer "tokens '$ntok' vocab_size $(get "$tmp/nv.gguf" deepseek2.vocab_size)"
    fi
    read -r n mean std < <($ins qstats "$tmp/nv.gguf" blk.1.ffn_gate_exps.weight)
    if $py -c "import sys; sys.exit(not (abs($mean) < 3e-4 and 0.0195 < $std < 0.0205))"; then
        pass f32_weights_normal
    else
        fail f32_weights_normal "mean $mean std $std"
    fi
else
    fail no_vocab_trained_tokenizer "$(tail -n 3 "$tmp/mk.log")"
fi
# from another directory the corpus is found next to the executable; a larger
# --vocab-size pads with [PAD<i>] tokens, as llama.cpp's converter does
if [ -n "${ntok:-}" ]; then
    want=$((ntok + 100))
    (cd "$tmp" && "$bin" --arch qwen3moe --preset tiny --types q8_0 --seed 3 --vocab-size $want \
        -o "$tmp/pad.gguf" 2>>"$tmp/mk.log")
    if [ -f "$tmp/pad.gguf" ] && [ "$(rows "$tmp/pad.gguf" token_embd.weight)" = $want ] &&
        [ "$($ins elem "$tmp/pad.gguf" tokenizer.ggml.tokens $((want - 1)))" = "[PAD$((want - 1))]" ] &&
        [ "$($ins elem "$tmp/pad.gguf" tokenizer.ggml.token_type $((want - 1)))" = 5 ] &&
        [ "$($ins elem "$tmp/pad.gguf" tokenizer.ggml.tokens 0)" = "$($ins elem "$tmp/nv.gguf" tokenizer.ggml.tokens 0)" ]; then
        pass no_vocab_padded_vocab_size
    else
        fail no_vocab_padded_vocab_size "$(tail -n 3 "$tmp/mk.log")"
    fi
else
    fail no_vocab_padded_vocab_size "no trained token count"
fi

# ---- bad input: non-zero exit, a message naming the problem, no output file
bad() { # NAME EXPECTED_MESSAGE_PART ARGS...
    local name=$1 msg=$2; shift 2
    rm -f "$tmp/bad.gguf"
    "$bin" "$@" >"$tmp/bad.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && grep -q "error:.*$msg" "$tmp/bad.out" && [ ! -e "$tmp/bad.gguf" ] &&
        [ ! -e "$tmp/bad.gguf.part" ]; then
        pass "bad_flag_$name"
    else
        fail "bad_flag_$name" "rc $rc: $(head -n 2 "$tmp/bad.out")"
    fi
}
o=(-o "$tmp/bad.gguf" --vocab "$vocab")
bad unknown_preset "unknown --preset 'huge'" --arch deepseek2 --preset huge "${o[@]}"
bad preset_wrong_arch "unknown --preset 'tiny-27l'" --arch qwen3moe --preset tiny-27l "${o[@]}"
bad unknown_arch "unknown --arch" --arch llama "${o[@]}"
bad unknown_types "unknown --types" --arch deepseek2 --types q3_k "${o[@]}"
bad zero_layers "n-layer 0 out of range" --arch deepseek2 --n-layer 0 "${o[@]}"
bad used_gt_experts "n-expert-used 17 out of range" --arch qwen3moe --n-expert-used 17 "${o[@]}"
bad not_integer "not an integer" --arch qwen3moe --n-embd 12x "${o[@]}"
bad q8_block "not a multiple of 32" --arch qwen3moe --types q8_0 --n-embd 100 "${o[@]}"
bad vocab_size_with_vocab "vocab-size cannot be combined" --arch deepseek2 --vocab-size 5000 "${o[@]}"
bad unknown_flag "unknown flag '--bogus'" --arch deepseek2 --bogus 1 "${o[@]}"
bad missing_output "-o OUT.gguf is required" --arch deepseek2 --vocab "$vocab"
bad missing_value "needs a value" --arch deepseek2 "${o[@]}" --seed
bad ds2_needs_q_lora "needs --q-lora-rank" --arch deepseek2 --preset tiny-27l --n-layer 5 "${o[@]}"
bad ds2_27_no_q_lora "no q-LoRA" --arch deepseek2 --n-layer 27 --q-lora-rank 64 "${o[@]}"
bad ds2_head_kv "must equal --n-head" --arch deepseek2 --n-head-kv 2 "${o[@]}"
bad qwen_gqa "multiple of --n-head-kv" --arch qwen3moe --n-head 8 --n-head-kv 3 "${o[@]}"
bad missing_vocab_file "cannot open\|No such file" --arch deepseek2 -o "$tmp/bad.gguf" --vocab "$tmp/none.gguf"
bad missing_chat_template "chat-template .*No such file" --arch qwen3moe --chat-template "$tmp/none.jinja" "${o[@]}"
bad specials_no_room "need as many padding rows" --arch deepseek2 --special-tokens "<a>" "${o[@]}"
bad specials_known "'<｜begin▁of▁sentence｜>' is already token" --arch deepseek2 --vocab-size 5000 \
    --special-tokens "<a>,<｜begin▁of▁sentence｜>" -o "$tmp/bad.gguf"
bad specials_empty "an empty token" --arch deepseek2 --vocab-size 5000 --special-tokens "<a>,,<b>" \
    -o "$tmp/bad.gguf"

echo "mkmodel: $fails failed"
[ $fails -eq 0 ]
