#!/usr/bin/env bash
# test_cli.sh - ecs-run's edges: prompts from a file or standard input, flag
# ranges checked at parse time, output that cannot be written (closed
# stdout, full disk) is an error, --dump-logits files appear whole or not at
# all, and SIGINT / SIGTERM stop a run with 128 + signal and no leftovers.
# usage: tests/integration/test_cli.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_cli.sh BUILD_DIR}
run="$build/bin/ecs-run" mk="$build/bin/ecs-mkmodel"
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
model="$tmp/m.gguf"
"$mk" --arch deepseek2 --preset tiny --types q8_0 --seed 2 --n-layer 2 -o "$model" >/dev/null 2>&1 ||
    { echo "FAIL: ecs-mkmodel"; exit 1; }
r() { "$run" -m "$model" --threads 2 --no-repack "$@"; }
closed() { "$@" >&-; } # runs a command with standard output closed

# expect_err NAME REGEX CMD...: exit 1 and REGEX on stderr
expect_err() {
    local name=$1 re=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 1 ] || bad "$name: exit $rc, expected 1: $(head -c 300 "$tmp/err")"
    grep -Eq -- "$re" "$tmp/err" || bad "$name: stderr lacks /$re/: $(head -c 300 "$tmp/err")"
}

# 8: -f FILE and -f - give the prompt -p gives
text=$'The capital of France is\nParis, and "quotes" stay.'
printf '%s' "$text" >"$tmp/prompt.txt"
r -p "$text" --tokenize >"$tmp/p.ids" || bad "-p --tokenize"
r -f "$tmp/prompt.txt" --tokenize >"$tmp/f.ids" || bad "-f --tokenize"
r -f - --tokenize <"$tmp/prompt.txt" >"$tmp/s.ids" || bad "-f - --tokenize"
[ -s "$tmp/p.ids" ] && cmp -s "$tmp/p.ids" "$tmp/f.ids" && cmp -s "$tmp/p.ids" "$tmp/s.ids" ||
    bad "-f FILE / -f - tokenize differently from -p"
r -f "$tmp/prompt.txt" -n 3 --temp 0 >"$tmp/gen_f" 2>/dev/null || bad "-f generation"
r -p "$text" -n 3 --temp 0 >"$tmp/gen_p" 2>/dev/null || bad "-p generation"
cmp -s "$tmp/gen_f" "$tmp/gen_p" || bad "-f generation differs from -p"
expect_err "-f missing" "^ecs-run: -f $tmp/none: No such file" r -f "$tmp/none" -n 1
: >"$tmp/empty.txt"
expect_err "-f empty" "empty prompt" r -f "$tmp/empty.txt" -n 1
expect_err "-f fifo" "not a regular file" r -f /dev/null -n 1
expect_err "-f and -p" "exactly one of -p PROMPT, -f FILE" r -f "$tmp/prompt.txt" -p hi
# --chat-template: a built-in template instead of the model's (DeepSeek-V2's here)
r -p hi --chat --tokenize >"$tmp/c.ids" && r -p hi --chat-template deepseek2 --tokenize >"$tmp/c2.ids" &&
    r -p hi --chat-template chatml --tokenize >"$tmp/c3.ids" || bad "--chat-template --tokenize"
cmp -s "$tmp/c.ids" "$tmp/c2.ids" || bad "--chat-template deepseek2 differs from the model's own"
cmp -s "$tmp/c.ids" "$tmp/c3.ids" && bad "--chat-template chatml renders like deepseek2"
expect_err "--chat-template x" "--chat-template: bad value 'x' \(expected deepseek2, deepseek3 or chatml\)" \
    "$run" -m "$tmp/none.gguf" -p hi --chat-template x
# parse-time ranges name the flag (no model is opened: it does not exist)
expect_err "--threads 1000" "^ecs-run: --threads: bad count '1000' \(1\.\.256\)" \
    "$run" -m "$tmp/none.gguf" -p hi --threads 1000
expect_err "--threads 0" "--threads: bad count '0'" "$run" -m "$tmp/none.gguf" -p hi --threads 0
expect_err "--pin-threads x" "--pin-threads: bad value 'x' \(auto, on or off\)" \
    "$run" -m "$tmp/none.gguf" -p hi --spawn-workers 1 --pin-threads x
# more threads than the CPUs this process may use: nothing to pin them to
ncpu=$(nproc)
expect_err "--pin-threads on, too many threads" "--pin-threads: thread pool: $((ncpu + 1)) threads to pin" \
    r -p hi -n 1 --threads $((ncpu + 1)) --spawn-workers 1 --pin-threads on
# the dump mode's context error does not mention -n
expect_err "dump context" "^ecs-run: 9 tokens do not fit in the context of 8" \
    r --ctx 8 --tokens 1,2,3,4,5,6,7,8,9 --dump-logits "$tmp/d.json"
grep -q -- "-n" "$tmp/err" && bad "dump context error mentions -n: $(cat "$tmp/err")"

# 7: output that cannot be written is an error
expect_err "closed stdout" "standard output is closed" closed r -p hi -n 2 --temp 0
expect_err "closed stdout, tokenize" "standard output is closed" closed r -p hi --tokenize
expect_err "full stdout" "standard output: No space left" bash -c \
    "\"$run\" -m \"$model\" --threads 2 --no-repack -p hi -n 4 --temp 0 --ignore-eos >/dev/full"
expect_err "full dump" "/dev/full: writing failed: No space left" \
    r --tokens 1,2,3 --dump-logits /dev/full
# --dump-logits with stdout closed still writes its file
closed r --tokens 1,2,3 --dump-logits "$tmp/ok.json" 2>"$tmp/err" || bad "dump with stdout closed: $(cat "$tmp/err")"
[ -s "$tmp/ok.json" ] || bad "dump with stdout closed wrote nothing"
# a dump replaces the target whole and leaves no temporary file
echo stale >"$tmp/ok.json"
r --tokens 1,2,3 --dump-logits "$tmp/ok.json" 2>/dev/null || bad "dump over an old file"
/usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/ok.json" ||
    bad "dump is not complete JSON"
ls "$tmp" | grep -q '\.tmp\.' && bad "temporary files left: $(ls "$tmp")"

# signals: a dump stopped half-way leaves neither a truncated target nor a
# temporary file; generation stops with 128 + signal
toks=$(seq -s, 1 2000),$(seq -s, 1 1000)
for sig in INT TERM; do
    out="$tmp/sig.json"
    rm -f "$out"
    # ecs-run itself in the background (a function would run in a subshell)
    "$run" -m "$model" --threads 2 --no-repack --ctx 4096 --tokens "$toks" --step 1 \
        --dump-logits "$out" 2>"$tmp/err" &
    pid=$!
    # the temporary file exists from the start of the evaluation to its end
    for _ in $(seq 600); do
        ls "$tmp" | grep -q '^sig\.json\.tmp\.' && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    kill -$sig $pid
    wait $pid
    rc=$?
    pid=
    want=$((128 + $(kill -l $sig)))
    [ $rc -eq $want ] || bad "SIG$sig during --dump-logits: exit $rc, expected $want"
    [ -e "$out" ] && bad "SIG$sig left $out"
    ls "$tmp" | grep -q '\.tmp\.' && bad "SIG$sig left temporary files: $(ls "$tmp")"
done
"$run" -m "$model" --threads 2 --no-repack -p hi -n 4000 --ctx 4096 --ignore-eos --temp 0 \
    >"$tmp/gen" 2>/dev/null &
pid=$!
for _ in $(seq 600); do
    [ -s "$tmp/gen" ] && break
    sleep 0.05
done
kill -INT $pid
wait $pid
rc=$?
pid=
[ $rc -eq 130 ] || bad "SIGINT during generation: exit $rc, expected 130"

[ $fail -eq 0 ] && echo "test_cli: all passed"
exit $fail
