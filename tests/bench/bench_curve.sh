#!/usr/bin/env bash
# bench_curve.sh - what CURVE on the worker links costs: `ecs-run --bench`
# with spawned workers, plaintext (A) and with --curve-key (B), alternating
# ABAB round by round (the host is noisy: compare within a round); prints
# each round's decode and prompt speed, the B/A ratios and the load.
#
# usage: tests/bench/bench_curve.sh BUILD_DIR MODEL [ROUNDS] [-- ECS-RUN ARGS]
#   ROUNDS default 3; default args: --pp 64 --tg 32 --spawn-workers 2 --no-repack
set -euo pipefail
build=${1:?usage: bench_curve.sh BUILD_DIR MODEL [ROUNDS] [-- ARGS]}
model=${2:?usage: bench_curve.sh BUILD_DIR MODEL [ROUNDS] [-- ARGS]}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--pp 64 --tg 32 --spawn-workers 2 --no-repack)
run="$build/bin/ecs-run"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 "$(dirname "$0")/../integration/curve_peer.py" keygen "$tmp" coord
speed() { # out-file pp|tg
    awk -v k="$2" '$1 ~ ("^" k "[0-9]+$") && $2 != "@" {for (f = 2; f <= NF; f++) if ($(f + 1) == "tok/s") {print $f; exit}}' "$1"
}
echo "== bench_curve: $(basename "$model"), ${args[*]}, $(date -u '+%Y-%m-%d %H:%M UTC') =="
echo "load before: $(uptime)"
for r in $(seq "$rounds"); do
    for mode in plain curve; do
        extra=()
        [ $mode = curve ] && extra=(--curve-key "$tmp/coord.key")
        "$run" -m "$model" --bench "${args[@]}" "${extra[@]}" >"$tmp/$mode.out" 2>"$tmp/$mode.err" \
            || { tail -3 "$tmp/$mode.err" >&2; exit 1; }
        [ $mode = curve ] && ! grep -q "CURVE on the worker links" "$tmp/$mode.err" \
            && { echo "bench_curve: CURVE was not on" >&2; exit 1; }
        eval "${mode}_pp=$(speed "$tmp/$mode.out" pp) ${mode}_tg=$(speed "$tmp/$mode.out" tg)"
    done
    printf "round %d  plaintext pp %s tg %s tok/s   CURVE pp %s tg %s tok/s   CURVE/plain pp %s tg %s   (%s)\n" \
        "$r" "$plain_pp" "$plain_tg" "$curve_pp" "$curve_tg" \
        "$(awk -v a="$curve_pp" -v b="$plain_pp" 'BEGIN {printf "%.2f", a / b}')" \
        "$(awk -v a="$curve_tg" -v b="$plain_tg" 'BEGIN {printf "%.2f", a / b}')" \
        "$(uptime | sed 's/.*load/load/')"
done
grep -E "per token" "$tmp/plain.err" | sed 's/^/    /' || true
echo "load after: $(uptime)"
