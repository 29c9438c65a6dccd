#!/usr/bin/env bash
# bench_workers.sh - prompt (pp) and decode (tg) speed with the routed
# experts in-process against 1 and 2 spawned ecs-worker processes on the
# same cores, alternating the layouts round by round (timings here are
# noisy: compare within a round), with the dispatcher's bytes per token.
#
# usage: tests/bench/bench_workers.sh BUILD_DIR [MODEL] [ROUNDS] [-- ECS-RUN ARGS]
#   MODEL   default models/ds2-lite-q4_k_m.gguf (made by bench_model.sh)
#   ROUNDS  default 3
#   LAYOUTS (environment) other layouts to compare with one process, split
#           at ';', e.g. LAYOUTS="--spawn-workers 2 --replication 1;
#           --spawn-workers 2" (default: 1 worker; 2 workers uniform, each
#           half the experts; 2 workers with the default replication,
#           auto: each holds every expert). Name --replication in each
#           layout whose figures must stay comparable across versions.
set -euo pipefail
build=${1:?usage: bench_workers.sh BUILD_DIR [MODEL] [ROUNDS] [-- ARGS]}
model=${2:-models/ds2-lite-q4_k_m.gguf}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
extra=("$@")
run="$build/bin/ecs-run"
[ -f "$model" ] || { echo "bench_workers: no model $model (run make bench once)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
layouts=("" "--spawn-workers 1" "--spawn-workers 2 --replication 1"
         "--spawn-workers 2 --replication auto")
names=("one-process" "1 worker" "2 workers uniform" "2 workers auto (replicated)")
if [ -n "${LAYOUTS:-}" ]; then
    IFS=';' read -r -a more <<<"$LAYOUTS"
    layouts=("" "${more[@]}")
    names=("one-process" "${more[@]}")
fi

echo "== bench_workers: $(basename "$model"), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC') =="
echo "load before: $(uptime)"
declare -A pp tg
for r in $(seq "$rounds"); do
    for i in "${!layouts[@]}"; do
        # shellcheck disable=SC2086
        "$run" -m "$model" --bench --pp 512 --tg 32 --threads "$(nproc)" ${layouts[$i]} \
            "${extra[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
        p=$(awk '$1 ~ /^pp[0-9]+$/ {for (f = 2; f <= NF; f++) if ($(f + 1) == "tok/s") {print $f; exit}}' "$tmp/out")
        t=$(awk '$1 ~ /^tg[0-9]+$/ && $2 != "@" {for (f = 2; f <= NF; f++) if ($(f + 1) == "tok/s") {print $f; exit}}' "$tmp/out")
        pp[$r,$i]=$p
        tg[$r,$i]=$t
        printf "round %d  %-45s pp512 %8s tok/s   tg32 %8s tok/s\n" "$r" "${names[$i]}" "$p" "$t"
        [ "$r" = "$rounds" ] && grep -E "per token|imbalance" "$tmp/err" | sed 's/^/    /' || true
    done
    for i in "${!layouts[@]}"; do
        [ "$i" = 0 ] && continue
        printf "round %d  ratio to one-process  %-45s pp512 %s  tg32 %s  (load %s)\n" "$r" "${names[$i]}" \
            "$(awk -v a="${pp[$r,$i]}" -v b="${pp[$r,0]}" 'BEGIN {printf "%.2f", a / b}')" \
            "$(awk -v a="${tg[$r,$i]}" -v b="${tg[$r,0]}" 'BEGIN {printf "%.2f", a / b}')" \
            "$(cut -d' ' -f1 /proc/loadavg)"
    done
done
echo "load after: $(uptime)"
