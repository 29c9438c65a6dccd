#!/usr/bin/env bash
# Runs every tests/integration/test_*.sh with the build directory; each
# script exits non-zero on failure. Up to ECS_TEST_JOBS (default 2) scripts
# run at once: most of them wait on processes and sockets, not on the
# cores. A script whose text contains the line "# ecs-test: serial" runs
# alone, after the others. Results print in the scripts' order.
# usage: tests/run_integration.sh BUILD_DIR
set -u
build=$1
jobs=${ECS_TEST_JOBS:-2}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "ECS_TEST_JOBS must be a positive integer" >&2; exit 2; }
pass=0; fail=0
# decode copies of the test models (ecs-run --repack) go to a scratch cache
export ECS_CACHE_DIR
ECS_CACHE_DIR=$(mktemp -d)
rcdir=$(mktemp -d)
trap 'rm -rf "$ECS_CACHE_DIR" "$rcdir"' EXIT
mkdir -p "$build/logs"

run_one() { # name script: runs it, leaves its exit status and time in rcdir
    local t0=$SECONDS
    bash "$2" "$build" >"$build/logs/$1.log" 2>&1
    echo "$? $((SECONDS - t0))" >"$rcdir/$1"
}

parallel=() serial=()
for t in tests/integration/test_*.sh; do
    [ -e "$t" ] || continue
    if grep -qx '# ecs-test: serial' "$t"; then serial+=("$t"); else parallel+=("$t"); fi
done
for t in "${parallel[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$(basename "$t" .sh)" "$t" &
done
wait
for t in "${serial[@]}"; do run_one "$(basename "$t" .sh)" "$t"; done

for t in "${parallel[@]}" "${serial[@]}"; do
    name=$(basename "$t" .sh)
    read -r rc secs <"$rcdir/$name"
    if [ "$rc" = 0 ]; then
        echo "ok   $name (${secs}s)"; pass=$((pass + 1))
    else
        echo "FAIL $name (${secs}s) - log: $build/logs/$name.log"
        tail -n 40 "$build/logs/$name.log"; fail=$((fail + 1))
    fi
done
[ -n "${ECS_TALLY:-}" ] && echo "$pass $fail" >>"$ECS_TALLY"
echo "integration: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
