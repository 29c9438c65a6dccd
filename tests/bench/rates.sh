# shellcheck shell=bash
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

# resident_report MODEL [one|workers]: prints how much of each of the
# model's decode copies (in $ECS_CACHE_DIR, else $XDG_CACHE_HOME/ecs, else
# ~/.cache/ecs) the page cache holds; returns 1 if one of them is not all
# there. Layouts compare fairly only with their copies resident: a copy no
# process maps is paged out here within minutes (the VM's DAMON reclaim),
# other programs' files push it out too, and a layout whose copy is out
# decodes partly from disk (docs/benchmarks.md, "AMD EPYC VM, session 24").
# one: only the one-process copy (MODEL.r16); workers: only the worker
# layouts' (the coordinator's and the shards'); neither: all.
resident_report() {
    local dir=${ECS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ecs} f one short=0
    one="$dir/$(basename "$1").r16"
    if ! command -v fincore >/dev/null; then
        echo "resident: fincore not installed (util-linux-extra): the page cache not checked"
        return 0
    fi
    for f in "${one%.r16}".*; do
        [ -f "$f" ] || continue
        [ "${2:-}" = one ] && [ "$f" != "$one" ] && continue
        [ "${2:-}" = workers ] && [ "$f" = "$one" ] && continue
        fincore -b -n -o RES,SIZE "$f" | awk -v f="$(basename "$f")" '{
            p = $2 ? 100 * $1 / $2 : 100
            printf "resident: %5.1f %% of %s (%.2f GB)%s\n", p, f, $2 / 1e9,
                   p < 99 ? "  [not all in the page cache: a layout reading it decodes partly from disk]" : ""
            exit p < 99}' || short=1
    done
    return $short
}
