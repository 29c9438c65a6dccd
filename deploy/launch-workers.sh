#!/usr/bin/env bash
# launch-workers.sh - start the expert workers of one host.
#
#   launch-workers.sh -m MODEL --coordinator ADDR [--coordinator ADDR2 ...]
#                     [--cpu N] [--bin DIR] [--run-dir DIR] [-- EXTRA WORKER ARGS]
#   launch-workers.sh stop [--run-dir DIR]
#
# With GPUs (nvidia-smi -L lists them) it starts one worker per GPU, each
# seeing only its card (CUDA_VISIBLE_DEVICES) and run as --device cuda:0.
# Without GPUs, or with --cpu N, it starts N CPU workers and splits the
# host's cores between them (--threads), so that they do not fight over
# cores. Workers get ids HOST-gpuI / HOST-cpuI, write logs and pid files to
# the run directory, and are stopped by pid with `stop`. Several
# --coordinator: every worker registers with each and serves them all (M:N,
# docs/operations.md). Under systemd use deploy/systemd/ecs-worker@.service.
set -euo pipefail

die() { echo "launch-workers.sh: $*" >&2; exit 2; }

run_dir=${ECS_RUN_DIR:-/tmp/ecs-workers}
bin=$(cd "$(dirname "$0")/.." && pwd)/build/bin
model="" ncpu="" cmd=start extra=() coords=()

[ "${1:-}" = stop ] && { cmd=stop; shift; }
while [ $# -gt 0 ]; do
    case "$1" in
    -m) model=${2:?-m needs a model}; shift 2 ;;
    --coordinator) coords+=(--coordinator "${2:?--coordinator needs an address}"); shift 2 ;;
    --cpu) ncpu=${2:?--cpu needs a count}; shift 2 ;;
    --bin) bin=${2:?--bin needs a directory}; shift 2 ;;
    --run-dir) run_dir=${2:?--run-dir needs a directory}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
done

if [ "$cmd" = stop ]; then
    shopt -s nullglob
    pids=()
    for f in "$run_dir"/*.pid; do
        pid=$(cat "$f")
        if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" && pids+=("$pid")
        fi
        rm -f "$f"
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    done
    echo "stopped ${#pids[@]} worker(s)"
    exit 0
fi

[ -n "$model" ] || die "-m MODEL is required"
[ ${#coords[@]} -gt 0 ] || die "--coordinator ADDR is required"
[ -r "$model" ] || die "cannot read model '$model'"
[ -x "$bin/ecs-worker" ] || die "no ecs-worker in $bin (build with make, or give --bin)"
mkdir -p "$run_dir"
host=$(hostname -s 2>/dev/null || echo host)

gpus=0
if [ -z "$ncpu" ] && command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi

start_one() { # id, env..., then -- worker args
    local id=$1; shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" "$bin/ecs-worker" -m "$model" "${coords[@]}" --id "$id" \
        "$@" "${extra[@]}" >"$run_dir/$id.log" 2>&1 &
    echo $! >"$run_dir/$id.pid"
    echo "started $id (pid $!, log $run_dir/$id.log)"
}

if [ "$gpus" -gt 0 ]; then
    for i in $(seq 0 $((gpus - 1))); do
        start_one "$host-gpu$i" CUDA_VISIBLE_DEVICES="$i" -- --device cuda:0
    done
else
    n=${ncpu:-1}
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--cpu: bad count '$n'"
    cores=$(nproc)
    per=$(( cores / n )); [ "$per" -ge 1 ] || per=1
    for i in $(seq 0 $((n - 1))); do
        start_one "$host-cpu$i" -- --threads "$per"
    done
fi
