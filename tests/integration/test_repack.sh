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

    # experts on a worker: the coordinator's copy leaves the routed experts
    # out (its own file), the worker has its shard's, the logits are the same
    dump "$model" "$tmp/w1.json" --repack "$cache" --spawn-workers 1 || bad "$arch: run with a worker"
    cmp -s "$tmp/plain.json" "$tmp/w1.json" || bad "$arch: logits differ with a worker and copies"
    full=$(stat -c %s "$cache/$arch.gguf.r16") coord=$(stat -c %s "$cache/$arch.gguf.coord.r16" 2>/dev/null || echo 0)
    [ "$coord" -gt 0 ] && [ "$coord" -lt $((full / 2)) ] ||
        bad "$arch: coordinator copy $coord bytes against $full for the whole model: $(cat "$tmp/w1.json.err")"
    [ $fail -eq 0 ] && echo "ok   $arch: with a worker the coordinator's copy holds no routed expert ($coord of $full bytes)"

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

    # issue 12: a copy is never used for a file it was not made from, damage
    # is found before it changes an output, killed loads leave nothing behind
    # and a special file in the copy's place neither hangs nor is trusted.
    cf="$cache/$arch.gguf.r16"
    # (a) another model (other weights, same shapes) copied over the file with
    # the old name, size and mtime (what cp -p, tar and rsync give)
    other="$tmp/other-$arch.gguf"
    "$mk" --arch $arch --preset tiny --types q4_k_m --seed 4 -o "$other" >/dev/null 2>&1 ||
        bad "$arch: ecs-mkmodel (other)"
    dump "$other" "$tmp/oplain.json" --no-repack || bad "$arch: --no-repack run of the other model"
    cmp -s "$tmp/plain.json" "$tmp/oplain.json" && bad "$arch: two seeds give the same logits"
    [ "$(stat -c %s "$model")" = "$(stat -c %s "$other")" ] || bad "$arch: the two models differ in size"
    cp -p "$model" "$tmp/keep.gguf"
    cp -p "$other" "$model" && touch -r "$tmp/keep.gguf" "$model"
    [ "$(stat -c %Y "$model")" = "$(stat -c %Y "$tmp/keep.gguf")" ] || bad "$arch: mtime not kept"
    dump "$model" "$tmp/a.json" --repack "$cache" || bad "$arch: run on the foreign file"
    cmp -s "$tmp/oplain.json" "$tmp/a.json" || bad "$arch: the first model's copy was used for another"
    grep -q "repack: wrote $cf .*made from another file" "$tmp/a.json.err" ||
        bad "$arch: foreign file, copy not remade: $(cat "$tmp/a.json.err")"
    cp -p "$tmp/keep.gguf" "$model"
    dump "$model" "$tmp/a2.json" --repack "$cache" || bad "$arch: run on the restored file"
    cmp -s "$tmp/plain.json" "$tmp/a2.json" || bad "$arch: logits differ on the restored file"
    # (b) a damaged payload (random bytes in the middle of the copy)
    size=$(stat -c %s "$cf")
    head -c 4096 /dev/urandom | dd of="$cf" bs=4096 seek=$((size / 4096 / 2)) conv=notrunc 2>/dev/null
    dump "$model" "$tmp/b.json" --repack "$cache" || bad "$arch: run with a damaged copy"
    cmp -s "$tmp/plain.json" "$tmp/b.json" || bad "$arch: a damaged copy changed the logits"
    grep -q "repack: wrote $cf .*damaged (chunk [0-9]* of [0-9]* fails its checksum)" "$tmp/b.json.err" ||
        bad "$arch: damaged copy not remade: $(cat "$tmp/b.json.err")"
    dump "$model" "$tmp/b2.json" --repack "$cache" || bad "$arch: run after the repair"
    grep -q "repack:" "$tmp/b2.json.err" && bad "$arch: repaired copy remade again: $(cat "$tmp/b2.json.err")"
    # (c) a load killed while writing leaves <copy>.tmp.<pid>: removed once
    # that process is gone; a live process's is kept (it may be writing)
    sh -c 'exit 0' & dead=$!; wait $dead
    head -c 100000 /dev/zero >"$cf.tmp.$dead"
    head -c 100 /dev/zero >"$cf.tmp.$$"
    dump "$model" "$tmp/c.json" --repack "$cache" || bad "$arch: run with stale temporary files"
    [ -e "$cf.tmp.$dead" ] && bad "$arch: a dead load's temporary copy was left"
    [ -e "$cf.tmp.$$" ] || bad "$arch: a live process's temporary copy was removed"
    grep -q "repack: removed 1 temporary file" "$tmp/c.json.err" || bad "$arch: cleanup not reported"
    cmp -s "$tmp/plain.json" "$tmp/c.json" || bad "$arch: logits differ after the cleanup"
    rm -f "$cf.tmp.$$"
    # (d) a FIFO in the copy's place: replaced by a copy, no hang
    rm -f "$cf" && mkfifo "$cf"
    timeout 120 "$run" -m "$model" --threads 2 --tokens "$toks" --dump-logits "$tmp/d.json" --top 8 \
        --step 1 --repack "$cache" 2>"$tmp/d.json.err" || bad "$arch: run with a FIFO (rc $?)"
    [ -f "$cf" ] && [ ! -p "$cf" ] || bad "$arch: the FIFO was not replaced by a copy"
    grep -q "repack: wrote $cf .*special file" "$tmp/d.json.err" || bad "$arch: FIFO: $(cat "$tmp/d.json.err")"
    cmp -s "$tmp/plain.json" "$tmp/d.json" || bad "$arch: logits differ after the FIFO"
    # a directory there: a clear warning, the directory left alone, no copy
    rm -f "$cf" && mkdir "$cf" && : >"$cf/keep"
    timeout 120 "$run" -m "$model" --threads 2 --tokens "$toks" --dump-logits "$tmp/e.json" --top 8 \
        --step 1 --repack "$cache" 2>"$tmp/e.json.err" || bad "$arch: run with a directory (rc $?)"
    grep -q "warning: repack: $cf is a directory, not a cache file" "$tmp/e.json.err" ||
        bad "$arch: directory: $(cat "$tmp/e.json.err")"
    [ -f "$cf/keep" ] || bad "$arch: the directory in the copy's place was touched"
    cmp -s "$tmp/plain.json" "$tmp/e.json" || bad "$arch: logits differ with a directory there"
    rm -rf "$cf"
    echo "ok   $arch: foreign file with the same name/size/mtime, damaged payload, stale temporary files, FIFO, directory"

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
