#!/usr/bin/env bash
# test_curve.sh - CURVE on the coordinator-worker links (--curve-key,
# --curve-server-key, --curve-clients): with the right keys two workers
# over TCP give logits identical to the local backend (and so do spawned
# workers sharing the coordinator's key pair); a worker with a key not on
# the allow list, and one without CURVE, cannot register (refused and
# logged on both sides); on a worker's data socket a pyzmq peer without
# CURVE or with an unlisted key gets nothing back and its message never
# reaches the worker, while the coordinator's key gets an answer; a relay
# on the wire cannot read a marker sent over CURVE (it can without CURVE).
# usage: tests/integration/test_curve.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_curve.sh BUILD_DIR}
run="$build/bin/ecs-run"
wbin="$build/bin/ecs-worker"
model=../shared/models/tiny-ds2-q8_0.gguf
tmp=$(mktemp -d)
pids=()
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
py() { PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 tests/integration/curve_peer.py "$@"; }
free_port() { /usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

k="$tmp/keys"
py keygen "$k" coord w0 w1 bad || { bad "keygen"; exit 1; }
mkdir "$k/clients" && cp "$k/w0.pub" "$k/w1.pub" "$k/clients/"

toks=$(/usr/bin/python3 -c "import random; random.seed(11); print(','.join(str(random.randrange(1, 2000)) for _ in range(40)))")
common=(-m "$model" --threads 1 --no-repack --tokens "$toks" --step 1 --top 8)
timeout 120 "$run" "${common[@]}" --dump-logits "$tmp/local.json" 2>"$tmp/local.err" \
    || { bad "local run: $(tail -2 "$tmp/local.err")"; exit 1; }

# 1. hand-started workers over TCP; two intruders try to register first
port=$(free_port)
ctl="tcp://127.0.0.1:$port"
timeout 120 "$run" "${common[@]}" --dump-logits "$tmp/curve.json" --control "$ctl" \
    --min-workers 2 --curve-key "$k/coord.key" --curve-clients "$k/clients" 2>"$tmp/coord.err" &
r=$!; pids+=("$r")
start_worker() { # id log [curve options...]
    local id=$1 log=$2; shift 2
    "$wbin" -m "$model" --coordinator "$ctl" --id "$id" --threads 1 --no-repack \
        --listen 'tcp://127.0.0.1:*' "$@" 2>"$log" &
    pids+=($!)
}
start_worker intruder "$tmp/intruder.err" --curve-key "$k/bad.key" --curve-server-key "$k/coord.pub"
start_worker plain "$tmp/plain.err"
sleep 1.5 # they try for a while; then the real workers come
start_worker w0 "$tmp/w0.err" --curve-key "$k/w0.key" --curve-server-key "$k/coord.pub"
start_worker w1 "$tmp/w1.err" --curve-key "$k/w1.key" --curve-server-key "$k/coord.pub"
wait "$r"; rc=$?
if [ $rc -ne 0 ]; then bad "CURVE run failed (rc $rc): $(tail -3 "$tmp/coord.err")"
elif cmp -s "$tmp/local.json" "$tmp/curve.json"; then
    ok "CURVE links (control and data, TCP): logits identical to the local backend"
else bad "CURVE run: logits differ from the local backend"; fi
regs=$(grep -o "worker [a-z0-9]* registered" "$tmp/coord.err" | sort -u | tr '\n' ' ')
[ "$regs" = "worker w0 registered worker w1 registered " ] \
    && ok "only w0 and w1 registered" || bad "registrations: '$regs'"
badpub=$(cat "$k/bad.pub")
grep -qF "coordinator control: refused a CURVE peer from 127.0.0.1: its key $badpub is not allowed" \
    "$tmp/coord.err" && ok "the unlisted key was refused and logged with its key" \
    || bad "no refusal of the intruder's key in the log"
# the plaintext worker's failure is logged as "one side does not speak
# CURVE" or "not CURVE with the right server key", depending on which
# handshake event ZeroMQ reports first (and a second failure within the same
# second is folded into the next line's count)
grep -qE "coordinator control: .*failed its CURVE handshake: (one side does not speak CURVE|not CURVE with the right server key)" \
    "$tmp/coord.err" && ok "the plaintext worker's handshake was refused and logged" \
    || bad "no handshake refusal of the plaintext worker in the log"
grep -q "failed its CURVE handshake: its key was refused" "$tmp/intruder.err" \
    && ok "the intruder logs that its key was refused" || bad "the intruder logged no refusal"
for w in intruder plain; do
    grep -q "registered with" "$tmp/$w.err" && bad "$w registered" || ok "$w never registered"
done
grep -E "refused|handshake" "$tmp/coord.err" | head -3 | cut -c1-160 | sed 's/^/     [coord] /'

# 2. a worker's data socket, probed by pyzmq: plaintext, an unlisted key, the
#    coordinator's key (answered), the right key through a relay; and a
#    plaintext worker, where the relay reads the marker
dport=$(free_port)
"$wbin" -m "$model" --coordinator "tcp://127.0.0.1:$(free_port)" --id probe --threads 1 \
    --no-repack --listen "tcp://127.0.0.1:$dport" --curve-key "$k/w0.key" \
    --curve-server-key "$k/coord.pub" 2>"$tmp/probe.err" &
pw=$!; pids+=("$pw")
pport=$(free_port)
"$wbin" -m "$model" --coordinator "tcp://127.0.0.1:$(free_port)" --id open --threads 1 \
    --no-repack --listen "tcp://127.0.0.1:$pport" 2>"$tmp/open.err" &
pids+=($!)
sleep 0.5
ep="tcp://127.0.0.1:$dport"
plain=$(py probe "$ep")
intr=$(py probe "$ep" --key "$k/bad.key" --server-pub "$k/w0.pub")
good=$(py probe "$ep" --key "$k/coord.key" --server-pub "$k/w0.pub")
open=$(py probe "tcp://127.0.0.1:$pport")
echo "     probes: plaintext $plain; unlisted key $intr; coordinator's key $good; no CURVE $open"
has() { echo "$1" | grep -q "$2"; }
has "$plain" '"replied": false' && ok "data socket: a plaintext peer gets nothing back" \
    || bad "data socket answered a plaintext peer: $plain"
has "$intr" '"replied": false' && ok "data socket: a peer with an unlisted key gets nothing back" \
    || bad "data socket answered an unlisted key: $intr"
has "$good" '"replied": true' && ok "data socket: the coordinator's key is answered (the probe works)" \
    || bad "data socket did not answer the coordinator's key: $good"
has "$good" '"marker_on_wire": false' && has "$intr" '"marker_on_wire": false' \
    && ok "a relay on the wire cannot read what is sent over CURVE" || bad "marker readable over CURVE"
has "$open" '"marker_on_wire": true' && has "$open" '"replied": true' \
    && ok "(without CURVE the relay reads the marker: the check can fail)" \
    || bad "plaintext control probe: $open"
grep -qF "worker data: refused a CURVE peer from 127.0.0.1: its key $badpub" "$tmp/probe.err" \
    && grep -q "worker data: .*failed its CURVE handshake" "$tmp/probe.err" \
    && ok "the worker logged both refusals" || bad "worker refusal log: $(head -3 "$tmp/probe.err")"
kill -TERM "$pw"; wait "$pw"; prc=$?
[ $prc -eq 0 ] && ok "the probed worker exits 0 on SIGTERM" || bad "probed worker exit $prc"

# 3. spawned workers share the coordinator's key pair (no allow list needed)
timeout 120 "$run" "${common[@]}" --dump-logits "$tmp/spawn.json" --spawn-workers 2 \
    --worker-threads 1 --curve-key "$k/coord.key" 2>"$tmp/spawn.err"; rc=$?
[ $rc -eq 0 ] && grep -q "CURVE on the worker links" "$tmp/spawn.err" \
    && cmp -s "$tmp/local.json" "$tmp/spawn.json" \
    && ok "spawned workers over CURVE: logits identical" \
    || bad "spawned CURVE run (rc $rc): $(tail -2 "$tmp/spawn.err")"

# 4. bad key files are refused with a clear error
chmod 644 "$k/coord.key"
timeout 60 "$run" "${common[@]}" --dump-logits "$tmp/x.json" --spawn-workers 1 \
    --curve-key "$k/coord.key" 2>"$tmp/perm.err" && bad "a world-readable key file was accepted"
grep -q "coord.key" "$tmp/perm.err" \
    && ok "a world-readable key file is refused: $(tail -1 "$tmp/perm.err" | cut -c1-150)" \
    || bad "unclear error for a world-readable key: $(tail -1 "$tmp/perm.err")"
chmod 600 "$k/coord.key"
timeout 60 "$run" "${common[@]}" --dump-logits "$tmp/x.json" --control \
    "tcp://127.0.0.1:$(free_port)" --curve-key "$k/coord.key" 2>"$tmp/nolist.err" \
    && bad "CURVE without an allow list was accepted"
grep -q "no client key is allowed" "$tmp/nolist.err" \
    && ok "CURVE without an allow list is refused: $(tail -1 "$tmp/nolist.err" | cut -c1-150)" \
    || bad "unclear error without an allow list: $(tail -1 "$tmp/nolist.err")"
exit $fail
