#!/usr/bin/env bash
# Runs each libFuzzer target for a short fixed time over its seed corpus
# (tests/fuzz/corpus/NAME, made by the unit tests' broken-file generator and
# checked in) with its dictionary tests/fuzz/NAME.dict where there is one; a
# crash, leak or sanitizer report fails the run.
# usage: tests/run_fuzz.sh BIN...
set -u
secs=${FUZZ_SECONDS:-20}
pass=0; fail=0
for bin in "$@"; do
    name=$(basename "$bin")
    work=$(mktemp -d)
    seeds=tests/fuzz/corpus/$name
    [ -d "$seeds" ] && cp "$seeds"/* "$work"/ 2>/dev/null
    log=build/fuzz/$name.log
    dict=() # keys and magic values the decoder looks for
    [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
    "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 "${dict[@]}" "$work" \
        >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q 'Done [0-9]* runs' "$log"; then
        echo "ok   $name ($(grep -o 'Done [0-9]* runs' "$log"))"; pass=$((pass + 1))
    else
        echo "FAIL $name (exit $rc) - log: $log"; tail -n 30 "$log"; fail=$((fail + 1))
    fi
    rm -rf "$work"
done
[ -n "${ECS_TALLY:-}" ] && echo "$pass $fail" >>"$ECS_TALLY"
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
