#!/usr/bin/env bash
# Runs Criterion unit-test binaries, checks their output for sanitizer
# reports (Criterion counts a test with a LeakSanitizer report as passing, so
# the harness checks the text itself), names every skipped test with its
# reason (e.g. the GPU tests on a machine without one; Criterion counts a
# skip as neither passed nor failed), and appends totals to $ECS_TALLY.
# usage: tests/run_unit.sh BUILD_DIR BIN...
set -u
build=$1; shift
pass=0; fail=0; skip=0; failed_names=()
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
mkdir -p "$build/logs"
for bin in "$@"; do
    name=$(basename "$bin")
    log="$build/logs/$name.log"
    "$bin" --jobs 2 --verbose >"$log" 2>&1
    rc=$?
    skipped=0 # a binary whose tests were all skipped by name (no AMX here) ran none
    while IFS= read -r line; do
        echo "SKIP $name: ${line#\[SKIP\] }"; skip=$((skip + 1)); skipped=$((skipped + 1))
    done < <(grep -a '^\[SKIP\]' "$log")
    synth=$(grep -a 'Synthesis:' "$log" | tail -n 1)
    t=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<<"$synth"); t=${t:-0}
    p=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$synth"); p=${p:-0}
    san=$(grep -a -c -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log")
    if [ "$rc" -ne 0 ] || [ "$san" -ne 0 ] || { [ "$t" -eq 0 ] && [ "$skipped" -eq 0 ]; } || [ "$p" -ne "$t" ]; then
        f=$((t - p)); [ "$f" -gt 0 ] || f=1
        pass=$((pass + p - (san > 0 ? p : 0))); fail=$((fail + f + (san > 0 ? p : 0)))
        failed_names+=("$name")
        echo "FAIL $name (exit $rc, $p/$t passing, $san sanitizer reports) - log: $log"
        grep -a -E '\[FAIL\]|\[----\]|ERROR:|runtime error:|SUMMARY' "$log" | head -n 40
    else
        pass=$((pass + p))
        echo "ok   $name ($p/$t)"
    fi
done
[ -n "${ECS_TALLY:-}" ] && echo "$pass $fail" >>"$ECS_TALLY"
echo "unit ($build): $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
