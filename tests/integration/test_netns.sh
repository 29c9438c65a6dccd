#!/usr/bin/env bash
# test_netns.sh - several hosts, emulated: ecs-coordinator and three
# ecs-workers each in their own network namespace, joined by veth pairs,
# TCP between them (replication 2). Under injected delay and loss of expert
# calls and replies (ECS_TEST_NET, the kernel has no tc netem) the driver
# (netns_chaos.py, inside the coordinator's namespace) streams greedy
# completions while one worker's link is taken down and brought back: every
# request completes with the fault-free text. Then two links go down, so
# some experts have no reachable holder: the request fails at its deadline
# naming the missing experts, and once the links are back the next request
# completes with the fault-free text. No process crashes; each exits 0 on
# SIGTERM. Namespaces and links are made here and removed on exit.
# usage: tests/integration/test_netns.sh BUILD_DIR   (from the repo root, as root)
set -u
build=${1:?usage: test_netns.sh BUILD_DIR}
model=$(cd ../shared/models && pwd)/tiny-ds2-q8_0.gguf
tmp=$(mktemp -d)
tag="e$$"                       # unique per run: tests may run two at a time
nsc="${tag}c"
pids=() nss=() fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
# the processes by pid, then the namespaces (each takes its veth ends along)
remove_all() {
    [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    for n in "${nss[@]}"; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$tmp"
}
trap remove_all EXIT

if ! ip netns add "$nsc" 2>"$tmp/ns.err"; then
    echo "FAIL network namespaces are not available here (ip netns add: $(cat "$tmp/ns.err"));" \
         "this test needs root and iproute2"
    exit 1
fi
nss+=("$nsc")
ip -n "$nsc" link set lo up
for i in 0 1 2; do
    nsw="${tag}w$i"
    ip netns add "$nsw" && nss+=("$nsw") || { bad "ip netns add $nsw"; exit 1; }
    ip -n "$nsw" link set lo up
    # one veth pair per worker: vc$i in the coordinator's namespace, vw in the worker's
    ip link add "${tag}c$i" netns "$nsc" type veth peer name "${tag}w$i" netns "$nsw" \
        || { bad "ip link add veth"; exit 1; }
    ip -n "$nsc" link set "${tag}c$i" name "vc$i"
    ip -n "$nsw" link set "${tag}w$i" name vw
    ip -n "$nsc" addr add "10.77.$i.1/24" dev "vc$i"
    ip -n "$nsw" addr add "10.77.$i.2/24" dev vw
    ip -n "$nsc" link set "vc$i" up
    ip -n "$nsw" link set vw up
done
ok "namespaces $nsc and ${tag}w0..2, veth pairs 10.77.N.1 <-> 10.77.N.2 (the workers' registrations prove the links)"

# the fresh namespaces have every port free: fixed ports cannot collide
ctl="tcp://0.0.0.0:5550"
ip netns exec "$nsc" "$build/bin/ecs-coordinator" -m "$model" --http 127.0.0.1:8081 \
    --threads 1 --no-repack >"$tmp/ref.log" 2>&1 &
pids+=($!)
# --data-plane zmq: the namespaces share the host name and /dev/shm, so the
# default (auto) would give the workers the shared-memory plane, and the
# decode calls would miss the links and the emulated faults under test
ip netns exec "$nsc" env ECS_TEST_NET="delay_ms=2,jitter_ms=3,drop=0.015,seed=17" \
    "$build/bin/ecs-coordinator" -m "$model" --http 127.0.0.1:8080 --threads 1 --no-repack \
    --control "$ctl" --min-workers 3 --replication 2 --call-timeout 8000 --call-retry 150 \
    --data-plane zmq \
    >"$tmp/coord.log" 2>&1 &
coord=$!; pids+=("$coord")
wpids=()
for i in 0 1 2; do
    ip netns exec "${tag}w$i" "$build/bin/ecs-worker" -m "$model" --id "n$i" --threads 1 \
        --no-repack --coordinator "tcp://10.77.$i.1:5550" --listen "tcp://10.77.$i.2:5600" \
        >"$tmp/w$i.log" 2>&1 &
    wpids+=($!); pids+=($!)
done

ip netns exec "$nsc" env PYTHONDONTWRITEBYTECODE=1 timeout 150 /usr/bin/python3 \
    tests/integration/netns_chaos.py "$tmp/coord.log" || fail=1

grep -E "declared dead|is back|experts missing|ECS_TEST_NET" "$tmp/coord.log" | head -8 \
    | sed 's/^/     [coord] /'
# nothing crashed: every process still runs, and stops cleanly on SIGTERM
for p in "$coord" "${wpids[@]}"; do
    kill -0 "$p" 2>/dev/null || bad "process $p is gone before the end"
done
for i in 0 1 2; do
    kill -TERM "${wpids[$i]}"; wait "${wpids[$i]}"; rc=$?
    [ $rc -eq 0 ] || bad "worker n$i exit status $rc on SIGTERM: $(tail -2 "$tmp/w$i.log")"
done
kill -TERM "$coord"; wait "$coord"; rc=$?
[ $rc -eq 0 ] && ok "no process crashed; the coordinator and the three workers exit 0 on SIGTERM" \
    || bad "coordinator exit status $rc: $(tail -3 "$tmp/coord.log")"
grep -q "ECS_TEST_NET injected: [1-9][0-9]* messages dropped, [1-9][0-9]* delayed" "$tmp/coord.log" \
    && ok "loss and delay were injected: $(grep -o 'injected:.*' "$tmp/coord.log")" \
    || bad "no injected loss/delay counted"
exit $fail
