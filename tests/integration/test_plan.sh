#!/usr/bin/env bash
# test_plan.sh - ecs-plan runs end to end on a tiny model (deepseek2 and
# qwen3moe): it prints each measured input (link, both coordinator
# timings, the recorded routings, kmoe per thread count, other processes'
# threads, each worker layout's phase with its real workers inside the
# model's own steps, counting every decode call and every prompt call of
# the prompt's rows) and one PLAN line per layout asked for, with positive
# speeds; bad options are refused with a message. No timing is judged
# (the numbers depend on the load).
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
        "expert phase per MoE layer call" "inside the model's own steps" \
        "1 worker x 2 thr: decode" "hand-offs" "outside the phases:" \
        "micro-batch overlap" "memory: " "available to the page cache"; do
        grep -qF "$pat" "$tmp/out" || missing="$missing [$pat]"
    done
    [ -z "$missing" ] && ok "$name: inputs printed" || bad "$name: no line with$missing"
    # the phase timed in the model's own steps (--quick: one round): every
    # MoE layer of 2 x 4 decode tokens, and the prompt's MoE layers but the
    # last (which takes one row, forward.c)
    moe=$(sed -nE '1s/.*layers \(([0-9]+) MoE\).*/\1/p' "$tmp/out")
    calls=$(sed -nE 's/^ +1 worker x 2 thr: decode .*\[([0-9]+), ([0-9]+) calls\]$/\1 \2/p' "$tmp/out")
    if [ -n "$moe" ] && [ "$calls" = "$((8 * moe)) $((moe - 1))" ]; then
        ok "$name: the phase counted $calls calls ($moe MoE layers)"
    else
        bad "$name: phase calls '$calls' for $moe MoE layers, want '$((8 * moe)) $((moe - 1))'"
    fi
    # one PLAN line per layout, speeds > 0; replication is capped at the workers
    got=$(awk '$1 == "PLAN" && $9 > 0 && $11 > 0 && $13 > 0 {printf "%s/%s ", $3, $7}' "$tmp/out")
    if [ "$got" = "0/1 1/1 2/2 " ]; then
        ok "$name: a prediction per layout ($got)"
    else
        bad "$name: PLAN lines '$got', want '0/1 1/1 2/2 '"
    fi
    # the page cache around each worker layout's timing (--no-repack: the
    # GGUF's routed experts, a few MB: resident before and after)
    n=$(grep -c "pages: 0 decode copies .* the GGUF's routed experts.* resident 100.0 % before and 100.0 % after" "$tmp/out")
    [ "$n" -eq 2 ] && ok "$name: both layouts timed with their pages resident" ||
        bad "$name: $n of 2 layouts with a warm pages line: $(grep 'pages:' "$tmp/out")"
    # the workers' loads: 2 workers with replication 2 both get pairs
    n=$(grep -cE '^    w[01]: decode [0-9.]+ pairs' "$tmp/out")
    [ "$n" -ge 3 ] && ok "$name: worker loads printed" || bad "$name: $n worker load lines"
done

# with decode copies (a fresh cache folder: the workers make theirs at
# load): the pages line counts the workers' own copies, read in and
# resident around the timing; no layout is withheld as cold; the folder
# holds the one-process copy, the coordinator's (the worker layouts'
# coordinator is loaded as ecs-run --spawn-workers loads it) and the
# workers' copies: two with --replication 1, then (the default, auto:
# both workers hold every expert) one more, which both map; and the
# shared experts' copy, which every worker holding them maps
model=../shared/models/tiny-ds2-q8_0.gguf
for case in "1:3:5" "auto:2:6"; do
    IFS=: read -r repl ncop nfiles <<<"$case"
    if timeout 300 "$plan" -m "$model" --quick --repack "$tmp/cache" --pp 32 --tg 4 --workers 0,2 \
        --replication "$repl" >"$tmp/out" 2>"$tmp/err"; then
        if grep -q "pages: $ncop decode cop[a-z]* .*(the workers' own) read in .* resident 100.0 % before and 100.0 % after" "$tmp/out" &&
            grep -q "^PLAN workers 2 threads [0-9]* replication $([ "$repl" = auto ] && echo 2 || echo "$repl") " "$tmp/out" &&
            ! grep -q "^PLAN .* cold" "$tmp/out" && [ "$(ls "$tmp/cache"/*.r16 | wc -l)" -eq "$nfiles" ] &&
            [ "$(ls "$tmp/cache"/*.coord.r16 | wc -l)" -eq 1 ]; then
            ok "decode copies, --replication $repl: the workers' $ncop cop(ies) found and resident around the timing"
        else
            bad "decode copies, --replication $repl: $(grep -E 'pages:|^PLAN' "$tmp/out"); $(ls "$tmp/cache")"
        fi
    else
        bad "ecs-plan with --repack, --replication $repl failed: $(tail -2 "$tmp/err")"
    fi
done

for args in "--workers 1,x" "--transport udp" "--pp 0" "--pp 513" "--bogus 1" "--ext-threads -1" \
    "--replication 0" "--replication two" \
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
