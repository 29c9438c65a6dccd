#!/usr/bin/env bash
# make test: unit tests, the same unit tests under ASan+UBSan, fuzz smoke,
# integration tests; prints one closing tally line and fails if anything did.
set -u
# the builds run on every core (the ASan build alone took minutes serially);
# the test runners themselves decide their own parallelism
jobs=-j$(nproc)
export ECS_TALLY=$(mktemp)
status=0
make --no-print-directory "$jobs" unit || status=1
make --no-print-directory "$jobs" asan || status=1
make --no-print-directory "$jobs" fuzz || status=1
make --no-print-directory "$jobs" integration || status=1
read -r p f < <(awk '{p+=$1; f+=$2} END {print p+0, f+0}' "$ECS_TALLY")
rm -f "$ECS_TALLY"
[ "$status" -eq 0 ] || [ "$f" -gt 0 ] || f=1
echo "make test: $p passed, $f failed"
[ "$status" -eq 0 ] && [ "$f" -eq 0 ]
