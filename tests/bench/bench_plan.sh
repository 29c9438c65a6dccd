#!/usr/bin/env bash
# bench_plan.sh - the capacity planner against the measured figures: runs
# ecs-plan, then `ecs-run --bench --pp 512 --tg 32 --spawn-workers N` for
# every layout, alternating (plan, runs, plan, runs, ...) so that both see
# the same load on a shared machine, and prints predicted vs measured with
# the ratio for decode (tg32 from empty, tg32 after the prompt) and pp512.
#
# usage: tests/bench/bench_plan.sh BUILD_DIR [MODEL.gguf] [--quick]
#   MODEL.gguf, or ECS_PLAN_MODEL: the model (default: a deepseek2 tiny-27l
#                     q4_k_m made in a temporary folder; the record:
#                     tests/bench/bench_plan.sh build /work/models-cache/ds2-lite-q4_k_m.gguf)
#   ECS_PLAN_WORKERS  layouts (default 0,1,2,3; 0 = one process)
#   ECS_PLAN_ROUNDS   rounds of runs (default 2; --quick: 1)
#   ECS_PLAN_REPS     ecs-run --reps per round (default 3)
#   ECS_PLAN_BASE     another build folder whose ecs-plan runs beside this
#                     one's at every plan point (the same load), for a
#                     before/after table of the planner itself
# --quick: a smoke run (tiny model, pp 64, tg 8, one round).
# A layout whose phase ecs-plan timed from cold copies (its files not
# resident: docs/planner.md, "The page cache") has no prediction; its rows
# say "cold" instead of a ratio.
set -euo pipefail
build=${1:?usage: tests/bench/bench_plan.sh BUILD_DIR [MODEL.gguf] [--quick]}
shift
quick='' model=${ECS_PLAN_MODEL:-}
for arg in "$@"; do
    case $arg in
    --quick) quick=--quick ;;
    -*) echo "bench_plan: unknown option $arg" >&2; exit 2 ;;
    *) model=$arg ;;
    esac
done
if [ -n "$model" ] && [ ! -f "$model" ]; then
    echo "bench_plan: no model at $model" >&2
    exit 1
fi
plan="$build/bin/ecs-plan"
run="$build/bin/ecs-run"
mk="$build/bin/ecs-mkmodel"
for b in "$plan" "$run" "$mk" "$build/bin/ecs-worker"; do
    [ -x "$b" ] || { echo "bench_plan: $b is not built" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ecs-bench-plan.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
workers=${ECS_PLAN_WORKERS:-0,1,2,3}
rounds=${ECS_PLAN_ROUNDS:-2}
pp=512 tg=32 pflags=() reps=${ECS_PLAN_REPS:-3}
if [ "$quick" = "--quick" ]; then
    pp=64 tg=8 rounds=1 pflags=(--quick) reps=1
fi
if [ -z "$model" ]; then
    model="$tmp/m.gguf"
    preset=tiny-27l types=q4_k_m
    [ "$quick" = "--quick" ] && preset=tiny types=q8_0
    if ! "$mk" --arch deepseek2 --preset $preset --types $types --seed 1 -o "$model" \
        >"$tmp/mk.log" 2>&1; then
        cat "$tmp/mk.log" >&2
        exit 1
    fi
fi
# shellcheck source=tests/bench/rates.sh
. "$(dirname "$0")/rates.sh"

echo "== bench_plan: ecs-plan's predictions against ecs-run --bench (model $model) =="
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  cores: $(nproc)  load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# plan_R.txt: ecs-plan's output before round R (and after round R-1)
base=${ECS_PLAN_BASE:-}
if [ -n "$base" ] && [ ! -x "$base/bin/ecs-plan" ]; then
    echo "bench_plan: $base/bin/ecs-plan is not built" >&2
    exit 1
fi
do_plan() {
    lock "$plan" -m "$model" --workers "$workers" --pp $pp --tg $tg "${pflags[@]}" \
        >"$tmp/plan_$1.txt" 2>"$tmp/plan_$1.err" || { cat "$tmp/plan_$1.err" >&2; exit 1; }
    if [ -n "$base" ]; then
        lock "$base/bin/ecs-plan" -m "$model" --workers "$workers" --pp $pp --tg $tg \
            "${pflags[@]}" >"$tmp/base_$1.txt" 2>"$tmp/base_$1.err" ||
            { cat "$tmp/base_$1.err" >&2; exit 1; }
    fi
}
do_plan 0
cat "$tmp/plan_0.txt"
for r in $(seq 1 "$rounds"); do
    for n in ${workers//,/ }; do
        sp=()
        [ "$n" -gt 0 ] && sp=(--spawn-workers "$n")
        lock "$run" -m "$model" --bench --pp $pp --tg $tg --reps $reps --ctx $((pp + tg + 16)) "${sp[@]}" \
            >"$tmp/run_${r}_$n.txt" 2>"$tmp/run_${r}_$n.err" ||
            { cat "$tmp/run_${r}_$n.err" >&2; exit 1; }
        # a copy the run's own prefault could not keep in the page cache
        # (ecs-plan's timings evict them): the run decoded partly from disk
        resident_report "$model" "$([ "$n" -gt 0 ] && echo workers || echo one)" >/dev/null ||
            echo "$n" >>"$tmp/spilled"
    done
    do_plan "$r"
done

# ecs-plan builds its inputs from medians of its repetitions, ecs-run runs
# --reps times per round; the medians are the comparison, the best figures
# (the moments a run had the cores) say how far the load moved them.
table() { # $1: plan file prefix
echo
echo "predicted by $1 ($((rounds + 1)) plans) vs measured ($rounds x $reps runs), tok/s, best and median:"
printf '%-8s %-12s %10s %10s %7s | %10s %10s %7s\n' layout figure "pred best" "meas best" ratio \
    "pred med" "meas med" ratio
# best and median of the numbers on stdin
stats() { sort -g | awk '{v[NR] = $1} END {if (!NR) {print 0, 0; exit}
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print v[NR], m}'; }
for n in ${workers//,/ }; do
    for fig in decode decode_depth pp; do
        case $fig in
        decode) pat="^tg$tg +[0-9]" label="tg$tg" ;;
        decode_depth) pat="^tg$tg @ depth" label="tg$tg@$pp" ;;
        pp) pat="^pp$pp +[0-9]" label="pp$pp" ;;
        esac
        meas=$(cat "$tmp"/run_*_"$n".txt | grep -E "$pat" | awk '
            {for (i = 1; i < NF; i++) if ($(i+1) == "tok/s") print $i}' | stats)
        pred=$(cat "$tmp"/"$1"_*.txt | awk -v n="$n" -v fig="$fig" '$1 == "PLAN" && $3 == n {
                   for (i = 2; i < NF; i++) if ($i == fig) print $(i+1)}' | stats)
        name=$([ "$n" -eq 0 ] && echo "1-proc" || echo "$n wrk")
        # plans that withheld the layout (its phase timed from cold copies)
        cold=$(cat "$tmp"/"$1"_*.txt | awk -v n="$n" '$1 == "PLAN" && $3 == n && $8 == "cold"' | wc -l)
        if [ "$cold" -gt 0 ]; then
            printf '%-8s %-12s %s of %s plans: cold (the phase read copies not resident: no prediction)\n' \
                "$name" "$label" "$cold" "$((rounds + 1))"
        fi
        spilled=$(grep -cx "$n" "$tmp/spilled" 2>/dev/null || true)
        if [ "$fig" = decode ] && [ "${spilled:-0}" -gt 0 ]; then
            printf '%-8s %-12s %s of %s runs ended with a decode copy not all resident (fincore)\n' \
                "$name" "" "$spilled" "$rounds"
        fi
        awk -v name="$name" -v lab="$label" -v p="$pred" -v m="$meas" 'BEGIN {
            split(p, P, " "); split(m, M, " ")
            printf "%-8s %-12s %10.2f %10.2f %7.2f | %10.2f %10.2f %7.2f\n", name, lab, P[1], M[1],
                   (M[1] > 0 ? P[1] / M[1] : 0), P[2], M[2], (M[2] > 0 ? P[2] / M[2] : 0)}'
    done
done
}
table plan
[ -n "$base" ] && table base
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
