# rates.sh - sourced by the benchmark scripts here: the lock that keeps
# timed runs of different people apart, and the figures read off each
# engine's output.

# Runs "$@" holding /tmp/ecs-bench.lock (flock) where flock exists.
lock() {
    if command -v flock >/dev/null; then flock /tmp/ecs-bench.lock "$@"; else "$@"; fi
}

# ecs_rate LABEL FILE: the tok/s of ecs-run --bench's LABEL line (pp512,
# tg64; not the "tg64 @ depth D" lines)
ecs_rate() { awk -v k="$1" '$1 == k && $2 != "@" {for (f = 2; f < NF; f++) if ($(f + 1) == "tok/s") {print $f; exit}}' "$2"; }

# peer_rate KEY FILE: the mean of "mean ± sd" on llama-bench's first table
# row containing KEY
peer_rate() { awk -F'|' -v k="$1" 'index($0, k) {split($(NF - 1), a, " "); print a[1]; exit}' "$2"; }
