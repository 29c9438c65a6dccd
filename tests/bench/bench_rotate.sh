#!/usr/bin/env bash
# bench_rotate.sh - one figure of `ecs-run --bench` for one process against
# worker layouts, in short runs whose order rotates each round (the host's
# speed moves within minutes here: a fixed order would favour whichever
# layout runs in the fast part of each round). Prints every run, each
# round's ratios to one process, and per layout the median ratio and how
# many rounds reached TARGET.
#
# usage: tests/bench/bench_rotate.sh BUILD_DIR MODEL ROUNDS FIGURE -- ECS-RUN ARGS
#   FIGURE  the label of the line to read, e.g. tg64 (with --pp 0 --tg 64)
#           or pp512 (with --pp 512 --tg 0)
#   LAYOUTS (environment) split at ';' (default "--spawn-workers 1;--spawn-workers 2")
#   TARGET  (environment) a ratio to count rounds against (default 0.90)
# The record (docs/benchmarks.md, "AMD EPYC VM, session 22"):
#   tests/bench/bench_rotate.sh build ds2-lite-q4_k_m.gguf 12 tg64 -- --pp 0 --tg 64 --threads 2
set -euo pipefail
build=${1:?usage: bench_rotate.sh BUILD_DIR MODEL ROUNDS FIGURE -- ARGS}
model=${2:?model}
rounds=${3:?rounds}
figure=${4:?figure}
shift 4
[ "${1:-}" = "--" ] && shift
args=("$@")
run="$build/bin/ecs-run"
[ -x "$run" ] || { echo "bench_rotate: $run is not built" >&2; exit 1; }
[ -f "$model" ] || { echo "bench_rotate: no model $model" >&2; exit 1; }
IFS=';' read -r -a more <<<"${LAYOUTS:---spawn-workers 1;--spawn-workers 2}"
layouts=("" "${more[@]}")
n=${#layouts[@]}
# shellcheck source=tests/bench/rates.sh
. "$(dirname "$0")/rates.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== bench_rotate: $(basename "$model") $figure, ${args[*]}, $rounds rounds, $(date -u '+%Y-%m-%d %H:%M UTC') =="
resident_report "$model" || true
for r in $(seq "$rounds"); do
    for k in $(seq 0 $((n - 1))); do
        i=$(( (k + r) % n ))
        # shellcheck disable=SC2086
        "$run" -m "$model" --bench "${args[@]}" ${layouts[$i]} >"$tmp/out" 2>"$tmp/err" ||
            { cat "$tmp/err" >&2; exit 1; }
        v=$(ecs_rate "$figure" "$tmp/out")
        [ -n "$v" ] || { echo "bench_rotate: no $figure line in ecs-run's output" >&2; exit 1; }
        echo "$r $i $v" >>"$tmp/all"
        printf "round %2d  %-32s %s %8s tok/s  (load %s)\n" "$r" "${layouts[$i]:-one process}" \
            "$figure" "$v" "$(cut -d' ' -f1 /proc/loadavg)"
    done
done
resident_report "$model" || true
awk -v n="$n" -v target="${TARGET:-0.90}" -v names="${LAYOUTS:---spawn-workers 1;--spawn-workers 2}" '
    { v[$1, $2] = $3; if ($1 > R) R = $1 }
    END {
        split(names, nm, ";")
        for (i = 1; i < n; i++) {
            m = 0; hit = 0; line = ""
            for (r = 1; r <= R; r++) {
                x[++m] = v[r, i] / v[r, 0]; hit += x[m] >= target
                line = line sprintf(" %.2f", x[m])
            }
            for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (x[b] < x[a]) { t = x[a]; x[a] = x[b]; x[b] = t }
            med = m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
            printf "%-32s / one process: median %.3f, %d of %d rounds >= %.2f; by round:%s\n", nm[i], med, hit, m, target, line
        }
    }' "$tmp/all"
