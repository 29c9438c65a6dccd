#!/usr/bin/env bash
# ab_model.sh - before/after of a change on a shared, noisy machine: runs two
# ecs-run binaries (e.g. a worktree's build of the old commit and the new
# one) in ABBA order on the same model and prints each pair's speeds and
# their ratio, then the median ratio. Only ratios of neighbouring runs mean
# much where the host's load or memory speed moves from minute to minute.
#
# usage: tests/bench/ab_model.sh OLD_ECS_RUN NEW_ECS_RUN MODEL [PAIRS] [-- ECS_RUN_ARGS...]
#   PAIRS defaults to 6; the arguments after -- replace the default
#   `--pp 512 --tg 0 --threads 2 --ctx 4096`; the figure compared is the
#   first ppN / tgN speed ecs-run --bench prints (pp512 by default), or the
#   first line matching the awk regex AB_FIGURE (e.g. AB_FIGURE='^tg[0-9]+x[0-9]+ '
#   with --tg-batch: the batched decode's aggregate tok/s; AB_FIGURE='^tg[0-9]+ @ depth'
#   with --pp N --tg M: decode after the N-token prompt); the speed is the
#   number before "tok/s" on that line.
# Timed runs hold /tmp/ecs-bench.lock, as bench_model.sh's do.
set -euo pipefail
old=${1:?usage: ab_model.sh OLD NEW MODEL [PAIRS] [-- ARGS...]}
new=${2:?usage: ab_model.sh OLD NEW MODEL [PAIRS] [-- ARGS...]}
model=${3:?usage: ab_model.sh OLD NEW MODEL [PAIRS] [-- ARGS...]}
shift 3
pairs=6
if [ $# -gt 0 ] && [ "$1" != "--" ]; then pairs=$1; shift; fi
args=(--pp 512 --tg 0 --threads 2 --ctx 4096)
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; args=("$@"); fi
for b in "$old" "$new"; do
    [ -x "$b" ] || { echo "ab_model: $b is not an executable" >&2; exit 1; }
done
[ -r "$model" ] || { echo "ab_model: cannot read $model" >&2; exit 1; }
case $pairs in ''|*[!0-9]*|0) echo "ab_model: PAIRS must be a positive number" >&2; exit 1;; esac

figure=${AB_FIGURE:-'^(pp|tg)[0-9]+ '}
speed() {
    flock /tmp/ecs-bench.lock setsid bash -c 'echo -20 > /proc/self/autogroup 2>/dev/null; exec "$@"' \
        _ "$1" -m "$model" --bench "${args[@]}" 2>&1 |
        awk -v re="$figure" '$0 ~ re { for (i = 2; i < NF; i++)
                                           if ($(i + 1) == "tok/s" && $i ~ /^[0-9.]+$/) { print $i; exit } }'
}

echo "ab_model: old $old, new $new, $model, ${args[*]}, load $(cut -d' ' -f1 /proc/loadavg)"
ratios=()
for i in $(seq "$pairs"); do
    if [ $((i % 2)) -eq 1 ]; then a=$(speed "$old"); b=$(speed "$new")
    else b=$(speed "$new"); a=$(speed "$old"); fi
    [ -n "$a" ] && [ -n "$b" ] || { echo "ab_model: a run printed no speed" >&2; exit 1; }
    r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", b / a }')
    ratios+=("$r")
    echo "pair $i: old $a  new $b  new/old $r"
done
printf '%s\n' "${ratios[@]}" | sort -n |
    awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
          printf "median new/old over %d pairs: %.4f (min %.4f, max %.4f)\n", NR, m, v[1], v[NR] }'
