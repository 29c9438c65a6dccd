#!/usr/bin/env bash
# test_deploy.sh - the deploy/ folder works as shipped:
#  - launch-workers.sh in CPU mode starts N workers (cores split between
#    them) that register with two coordinators at once (M:N); a request
#    completes on each; `launch-workers.sh stop` stops them by pid;
#  - deploy/haproxy.cfg (its addresses rendered with this test's ports) run
#    by Debian's haproxy in front of the two coordinators: requests with the
#    same X-Session-Id reach the same coordinator every time, and when that
#    coordinator stops its session fails over to the other;
#  - systemd-analyze verify passes on the units (their ExecStart pointed at
#    this build's binaries: verify checks that the programs exist);
#  - promtool check config on deploy/prometheus.yml, promtool check metrics
#    on a real /metrics scrape of a coordinator with workers.
# A tool that is not installed is skipped by name (make deps installs them).
# usage: tests/integration/test_deploy.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_deploy.sh BUILD_DIR}
bin="$PWD/$build/bin"
model="$PWD/../shared/models/tiny-ds2-q8_0.gguf"
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    [ -d "$tmp/run" ] && deploy/launch-workers.sh stop --run-dir "$tmp/run" >/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
skip() { echo "skip $*"; }
port() { /usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

# ---- systemd units ----
if command -v systemd-analyze >/dev/null 2>&1; then
    mkdir -p "$tmp/units"
    for u in deploy/systemd/*.service; do
        sed "s#/usr/local/bin/#$bin/#g" "$u" >"$tmp/units/$(basename "$u")"
    done
    cp "$tmp/units/ecs-worker@.service" "$tmp/units/ecs-worker@0.service"
    if out=$(cd "$tmp/units" && systemd-analyze verify ecs-coordinator.service ecs-worker@0.service 2>&1) \
            && [ -z "$out" ]; then
        ok "systemd-analyze verify: ecs-coordinator.service, ecs-worker@.service (instance 0) clean"
    else
        bad "systemd-analyze verify: $out"
    fi
else
    skip "systemd-analyze: not installed"
fi

# ---- prometheus config ----
have_promtool=0
if command -v promtool >/dev/null 2>&1; then
    have_promtool=1
    if out=$(promtool check config deploy/prometheus.yml 2>&1); then
        ok "promtool check config deploy/prometheus.yml"
    else
        bad "promtool check config: $out"
    fi
else
    skip "promtool: not installed (Debian package prometheus)"
fi

# ---- launch-workers.sh: two CPU workers shared by two coordinators ----
cA="tcp://127.0.0.1:$(port)"; cB="tcp://127.0.0.1:$(port)"
hA=$(port); hB=$(port)
for c in A B; do
    ctl=cA; http=hA; [ $c = B ] && { ctl=cB; http=hB; }
    "$bin/ecs-coordinator" -m "$model" --http "127.0.0.1:${!http}" --threads 1 --no-repack \
        --control "${!ctl}" --min-workers 2 >"$tmp/coord$c.log" 2>&1 &
    pids+=($!)
    eval "pid$c=$!"
done
if ! deploy/launch-workers.sh -m "$model" --coordinator "$cA" --coordinator "$cB" --cpu 2 \
        --bin "$bin" --run-dir "$tmp/run" -- --no-repack >"$tmp/launch.out" 2>&1; then
    bad "launch-workers.sh: $(tail -3 "$tmp/launch.out")"
    exit 1
fi
wpids=$(cat "$tmp"/run/*.pid | tr '\n' ' ')
nw=$(echo $wpids | wc -w)
[ "$nw" -eq 2 ] && ok "launch-workers.sh --cpu 2 started 2 workers (pids $wpids)" \
    || bad "launch-workers.sh started $nw workers"

# a completion on a coordinator; prints the body, headers in $tmp/h
complete() { # port [session]
    local hdr=()
    [ -n "${2:-}" ] && hdr=(-H "X-Session-Id: $2")
    curl -s -m 60 -D "$tmp/h" "${hdr[@]}" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"ignore_eos":true}' \
        "http://127.0.0.1:$1/v1/completions"
}
up() { # port: until /ready answers 200 (the coordinator waits for its workers first)
    for _ in $(seq 600); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/ready")" = 200 ] && return 0
        sleep 0.1
    done
    return 1
}
texts=()
for c in A B; do
    http=hA; [ $c = B ] && http=hB
    if ! up "${!http}"; then
        bad "coordinator $c never became ready: $(tail -3 "$tmp/coord$c.log")"
        exit 1
    fi
    body=$(complete "${!http}")
    if echo "$body" | grep -q '"text"'; then
        texts+=("$(echo "$body" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')")
        ok "coordinator $c answered a completion through the launched workers"
    else
        bad "coordinator $c: $body"
    fi
done
per=$(( $(nproc) / 2 )); [ $per -ge 1 ] || per=1
threads=$(cat "$tmp"/run/*.log | sed -n 's/.*, \([0-9]*\) threads, data on.*/\1/p' | sort -u | tr '\n' ' ')
[ "$threads" = "$per " ] && ok "each worker got $per of the $(nproc) cores" \
    || bad "worker threads: '$threads' (want $per)"
[ "${#texts[@]}" -eq 2 ] && [ "${texts[0]}" = "${texts[1]}" ] \
    && ok "both coordinators, sharing the launched workers, give the same greedy text" \
    || bad "the two coordinators' texts differ: ${texts[*]}"
grep -q "registered (pid" "$tmp/coordA.log" && grep -q "registered (pid" "$tmp/coordB.log" \
    || bad "the workers did not register with both coordinators"

# ---- promtool check metrics on a real scrape ----
if [ $have_promtool = 1 ]; then
    curl -s -m 10 "http://127.0.0.1:$hA/metrics" >"$tmp/metrics"
    if [ ! -s "$tmp/metrics" ]; then
        bad "no /metrics from coordinator A"
    elif out=$(promtool check metrics <"$tmp/metrics" 2>&1); then
        ok "promtool check metrics: a coordinator's /metrics scrape ($(grep -vc '^#' "$tmp/metrics") samples) passes"
    else
        bad "promtool check metrics: $out"
    fi
fi

# ---- haproxy in front of the two coordinators ----
if command -v haproxy >/dev/null 2>&1; then
    hp=$(port)
    sed -e "s/bind 127.0.0.1:8000/bind 127.0.0.1:$hp/" \
        -e "s/server c1 127.0.0.1:8081/server c1 127.0.0.1:$hA/" \
        -e "s/server c2 127.0.0.1:8082/server c2 127.0.0.1:$hB/" deploy/haproxy.cfg >"$tmp/haproxy.cfg"
    n=$(grep -c -e "127.0.0.1:$hp" -e "127.0.0.1:$hA" -e "127.0.0.1:$hB" "$tmp/haproxy.cfg")
    if [ "$n" -ne 3 ]; then
        bad "haproxy.cfg: its addresses did not render ($n of 3 lines): the shipped frontend/server lines changed?"
    elif ! out=$(haproxy -c -f "$tmp/haproxy.cfg" 2>&1); then
        bad "haproxy -c: $out"
    else
        haproxy -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 &
        hpid=$!; pids+=($hpid)
        served_by() { tr -d '\r' <"$tmp/h" | sed -n 's/^[Xx]-[Ee][Cc][Ss]-[Cc]oordinator: //p'; }
        for _ in $(seq 100); do complete "$hp" probe >/dev/null && [ -n "$(served_by)" ] && break; sleep 0.1; done
        sticky=1; seen=""
        for s in s1 s2 s3 s4; do
            first=""
            for _ in 1 2 3; do
                complete "$hp" "$s" >/dev/null; by=$(served_by)
                [ -z "$first" ] && first=$by
                [ -n "$by" ] && [ "$by" = "$first" ] || sticky=0
            done
            seen="$seen $s:$first"
        done
        [ $sticky = 1 ] && ok "haproxy: each session reached one coordinator every time ($seen)" \
            || bad "haproxy: a session moved between coordinators ($seen)"
        # stop the coordinator that holds session s1: s1 goes to the other one
        holder=$(echo "$seen" | sed -n 's/.* s1:\(c[12]\).*/\1/p')
        victim=$pidA; other=c2
        [ "$holder" = c2 ] && { victim=$pidB; other=c1; }
        kill -TERM "$victim"; wait "$victim" 2>/dev/null
        moved=1
        for _ in 1 2 3; do
            body=$(complete "$hp" s1); by=$(served_by)
            echo "$body" | grep -q '"text"' && [ "$by" = "$other" ] || moved=0
        done
        [ $moved = 1 ] && ok "haproxy: after $holder stopped, session s1 was answered by $other, three times" \
            || bad "haproxy: failover of s1 from $holder: served by '$by': $(echo "$body" | head -c 200)"
        kill -TERM "$hpid"; wait "$hpid" 2>/dev/null
    fi
else
    skip "haproxy: not installed"
fi

# ---- the stop path: launch-workers.sh stop, by pid ----
out=$(deploy/launch-workers.sh stop --run-dir "$tmp/run")
left=""
for p in $wpids; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
if [ -z "$left" ] && [ "$out" = "stopped 2 worker(s)" ] && ! ls "$tmp"/run/*.pid >/dev/null 2>&1; then
    ok "launch-workers.sh stop: $out, no pid file left"
else
    bad "launch-workers.sh stop: '$out', still running:$left"
fi
exit $fail
