#!/usr/bin/env bash
# test_repack.sh - the decode copy of the weights (ecs-run --repack): the
# same logits bit for bit as decoding from the GGUF, made once and found
# again, remade when the GGUF or the cache changes, and a clear warning
# (the model still runs) when it cannot be made.
# usage: tests/integration/test_repack.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_repack.sh BUILD_DIR}
run="$build/bin/ecs-run" mk="$build/bin/ecs-mkmodel"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
toks=1,17,300,5,5,42,7,99,1000,3,64,2,8,250,11,6

# dump MODEL OUT FLAGS...: one token per step (every product a decode one)
dump() {
    local model=$1 out=$2; shift 2
    "$run" -m "$model" --threads 2 --tokens "$toks" --dump-logits "$out" --top 8 --step 1 "$@" \
        2>"$out.err"
}

for arch in deepseek2 qwen3moe; do
    model="$tmp/$arch.gguf" cache="$tmp/cache-$arch"
    "$mk" --arch $arch --preset tiny --types q4_k_m --seed 3 -o "$model" >/dev/null 2>&1 ||
        { bad "$arch: ecs-mkmodel"; continue; }
    dump "$model" "$tmp/plain.json" --no-repack || bad "$arch: --no-repack run"
    dump "$model" "$tmp/r1.json" --repack "$cache" || bad "$arch: first --repack run"
    grep -q "repack: wrote $cache/$arch.gguf.r16" "$tmp/r1.json.err" ||
        bad "$arch: first run did not make the cache: $(cat "$tmp/r1.json.err")"
    cmp -s "$tmp/plain.json" "$tmp/r1.json" || bad "$arch: logits differ with the decode copy"
    dump "$model" "$tmp/r2.json" --repack "$cache" || bad "$arch: second --repack run"
    grep -q "repack:" "$tmp/r2.json.err" && bad "$arch: second run remade the cache"
    cmp -s "$tmp/plain.json" "$tmp/r2.json" || bad "$arch: logits differ from the found cache"
    # batched steps (prompt): the copy's groups, same bits as the rows' tiles
    "$run" -m "$model" --threads 2 --tokens "$toks" --dump-logits "$tmp/pb.json" --top 8 \
        --no-repack 2>/dev/null || bad "$arch: batched --no-repack run"
    "$run" -m "$model" --threads 2 --tokens "$toks" --dump-logits "$tmp/rb.json" --top 8 \
        --repack "$cache" 2>"$tmp/rb.json.err" || bad "$arch: batched --repack run"
    cmp -s "$tmp/pb.json" "$tmp/rb.json" || bad "$arch: batched logits differ with the copy"
    grep -q "warning" "$tmp/rb.json.err" && bad "$arch: warning with ample memory: $(cat "$tmp/rb.json.err")"
    # memory for the copy and the rest of the GGUF only: the copy is still used
    ram=$(( $(stat -c %s "$model") + $(stat -c %s "$cache/$arch.gguf.r16") - 1 ))
    ECS_REPACK_RAM=$ram "$run" -m "$model" --threads 2 --tokens "$toks" --dump-logits "$tmp/tb.json" \
        --top 8 --repack "$cache" 2>"$tmp/tb.err" || bad "$arch: batched run, short memory"
    grep -q "warning" "$tmp/tb.err" && bad "$arch: no copy with memory for it: $(cat "$tmp/tb.err")"
    cmp -s "$tmp/pb.json" "$tmp/tb.json" || bad "$arch: batched logits differ, short memory"
    ECS_REPACK_RAM=$ram dump "$model" "$tmp/t1.json" --repack "$cache" || bad "$arch: decode, short memory"
    cmp -s "$tmp/plain.json" "$tmp/t1.json" || bad "$arch: decode logits differ, short memory"
    echo "ok   $arch: same logits (one token per step and batched), cache made once ($(stat -c %s "$cache/$arch.gguf.r16") bytes)"

    # a newer GGUF: remade
    touch -d '+1 min' "$model"
    dump "$model" "$tmp/r3.json" --repack "$cache" || bad "$arch: run after touch"
    grep -q "repack: wrote" "$tmp/r3.json.err" || bad "$arch: touched GGUF, cache not remade"
    cmp -s "$tmp/plain.json" "$tmp/r3.json" || bad "$arch: logits differ after the remake"
    # a damaged cache (header, then length): remade, same logits
    printf 'XXXXXXXX' | dd of="$cache/$arch.gguf.r16" bs=1 seek=0 conv=notrunc 2>/dev/null
    dump "$model" "$tmp/r4.json" --repack "$cache" || bad "$arch: run with a bad header"
    grep -q "repack: wrote" "$tmp/r4.json.err" || bad "$arch: bad header not noticed"
    truncate -s 8192 "$cache/$arch.gguf.r16"
    dump "$model" "$tmp/r5.json" --repack "$cache" || bad "$arch: run with a short cache"
    grep -q "repack: wrote" "$tmp/r5.json.err" || bad "$arch: short cache not noticed"
    cmp -s "$tmp/plain.json" "$tmp/r5.json" || bad "$arch: logits differ after repair"
    ls "$cache" | grep -q tmp && bad "$arch: temporary files left in $cache"
    echo "ok   $arch: remade after touch, bad header, truncation"

    # a directory that does not exist yet is made, parents included
    dump "$model" "$tmp/r8.json" --repack "$tmp/new/a/b" || bad "$arch: run with a new directory"
    [ -f "$tmp/new/a/b/$arch.gguf.r16" ] || bad "$arch: no copy in a new directory: $(cat "$tmp/r8.json.err")"
    cmp -s "$tmp/plain.json" "$tmp/r8.json" || bad "$arch: logits differ in a new directory"
    rm -rf "$tmp/new"

    # cannot be made: warning, still runs, same logits
    : >"$tmp/not-a-dir"
    dump "$model" "$tmp/r6.json" --repack "$tmp/not-a-dir/sub" || bad "$arch: unwritable cache fails the run"
    grep -q "warning: repack: cannot create $tmp/not-a-dir/sub" "$tmp/r6.json.err" ||
        bad "$arch: no warning for an unwritable cache: $(cat "$tmp/r6.json.err")"
    cmp -s "$tmp/plain.json" "$tmp/r6.json" || bad "$arch: logits differ without a cache"
    echo "ok   $arch: unwritable cache directory is a warning"

    # too little memory for the GGUF and the copy: not made, a warning
    ECS_REPACK_RAM=1000000 dump "$model" "$tmp/r7.json" --repack "$tmp/small-$arch" ||
        bad "$arch: small memory fails the run"
    grep -q "warning: repack: the decode copy (.* GB) and the rest of the GGUF (.* GB) would not stay in memory" \
        "$tmp/r7.json.err" || bad "$arch: no warning for small memory: $(cat "$tmp/r7.json.err")"
    [ -e "$tmp/small-$arch/$arch.gguf.r16" ] && bad "$arch: copy made despite small memory"
    cmp -s "$tmp/plain.json" "$tmp/r7.json" || bad "$arch: logits differ without a copy"
    echo "ok   $arch: too little memory is a warning"
done

# bad flags are clear errors
"$run" -m x.gguf --tokens 1 --dump-logits "$tmp/x.json" --step 0 2>"$tmp/e1" && bad "--step 0 accepted"
grep -q "step: bad count" "$tmp/e1" || bad "--step 0: $(cat "$tmp/e1")"
"$run" -m x.gguf -p hi --step 2 2>"$tmp/e2" && bad "--step without --dump-logits accepted"
grep -q "needs --dump-logits" "$tmp/e2" || bad "--step alone: $(cat "$tmp/e2")"
"$run" -m x.gguf -p hi --repack 2>"$tmp/e3" && bad "--repack without a value accepted"
grep -q "needs a value" "$tmp/e3" || bad "--repack alone: $(cat "$tmp/e3")"
[ $fail -eq 0 ] && echo "test_repack: all passed"
exit $fail
