#!/usr/bin/env bash
# test_plan.sh - ecs-plan runs end to end on a tiny model (deepseek2 and
# qwen3moe): it prints each measured input (link, both coordinator
# timings, the recorded routings, kmoe per thread count, other processes'
# threads, each worker layout's phase with its real workers) and one PLAN
# line per layout asked for, with positive speeds; bad options are refused
# with a message. No timing is judged (the numbers depend on the load).
# usage: tests/integration/test_plan.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_plan.sh BUILD_DIR}
plan="$build/bin/ecs-plan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

for model in ../shared/models/tiny-ds2-q8_0.gguf ../shared/models/tiny-qwen3moe-q8_0.gguf; do
    name=$(basename "$model")
    if ! timeout 300 "$plan" -m "$model" --quick --no-repack --pp 32 --tg 4 --workers 0,1,2 \
        --replication 2 >"$tmp/out" 2>"$tmp/err"; then
        bad "$name: ecs-plan failed: $(tail -2 "$tmp/err")"
        continue
    fi
    missing=""
    for pat in "link (ipc" "=> alpha" "returning at once" "whose wait sleeps" "1 thread:" \
        "2 threads:" "other processes' runnable threads" "routings replayed" \
        "expert phase per MoE layer call" "1 worker x 2 thr: decode" "hand-offs" \
        "micro-batch overlap"; do
        grep -qF "$pat" "$tmp/out" || missing="$missing [$pat]"
    done
    [ -z "$missing" ] && ok "$name: inputs printed" || bad "$name: no line with$missing"
    # one PLAN line per layout, speeds > 0; replication is capped at the workers
    got=$(awk '$1 == "PLAN" && $9 > 0 && $11 > 0 && $13 > 0 {printf "%s/%s ", $3, $7}' "$tmp/out")
    if [ "$got" = "0/1 1/1 2/2 " ]; then
        ok "$name: a prediction per layout ($got)"
    else
        bad "$name: PLAN lines '$got', want '0/1 1/1 2/2 '"
    fi
    # the workers' loads: 2 workers with replication 2 both get pairs
    n=$(grep -cE '^    w[01]: decode [0-9.]+ pairs' "$tmp/out")
    [ "$n" -ge 3 ] && ok "$name: worker loads printed" || bad "$name: $n worker load lines"
done

for args in "--workers 1,x" "--transport udp" "--pp 0" "--pp 513" "--bogus 1" "--ext-threads -1" \
    "--threads"; do
    # shellcheck disable=SC2086
    if "$plan" -m ../shared/models/tiny-ds2-q8_0.gguf $args >"$tmp/out" 2>"$tmp/err"; then
        bad "ecs-plan accepted $args"
    elif [ -s "$tmp/err" ]; then
        ok "refused $args: $(head -1 "$tmp/err")"
    else
        bad "refused $args without a message"
    fi
done
if "$plan" -m "$tmp/none.gguf" --quick >"$tmp/out" 2>"$tmp/err"; then
    bad "ecs-plan ran on a missing model"
else
    grep -q "none.gguf" "$tmp/err" && ok "a missing model is named" || bad "missing model: $(cat "$tmp/err")"
fi
exit $fail
