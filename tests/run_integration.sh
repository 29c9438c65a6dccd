#!/usr/bin/env bash
# Runs every tests/integration/test_*.sh with the build directory; each
# script exits non-zero on failure.
# usage: tests/run_integration.sh BUILD_DIR
set -u
build=$1
pass=0; fail=0
# decode copies of the test models (ecs-run --repack) go to a scratch cache
export ECS_CACHE_DIR
ECS_CACHE_DIR=$(mktemp -d)
trap 'rm -rf "$ECS_CACHE_DIR"' EXIT
for t in tests/integration/test_*.sh; do
    [ -e "$t" ] || continue
    name=$(basename "$t" .sh)
    log="$build/logs/$name.log"; mkdir -p "$build/logs"
    if bash "$t" "$build" >"$log" 2>&1; then
        echo "ok   $name"; pass=$((pass + 1))
    else
        echo "FAIL $name - log: $log"; tail -n 40 "$log"; fail=$((fail + 1))
    fi
done
[ -n "${ECS_TALLY:-}" ] && echo "$pass $fail" >>"$ECS_TALLY"
echo "integration: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
