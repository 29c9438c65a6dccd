#!/usr/bin/env bash
# test_serve_sdk.sh - the official openai and @anthropic-ai/sdk Node SDKs
# (versions pinned by tests/integration/node/package-lock.json, installed
# here with npm ci into the git-ignored node_modules) against an
# ecs-coordinator started here and stopped by pid.
# usage (from the repo root): tests/integration/test_serve_sdk.sh BUILD_DIR
set -u
export PYTHONDONTWRITEBYTECODE=1
build=${1:?usage: $0 BUILD_DIR}
root=$(pwd)
bin="$root/$build/bin/ecs-coordinator"
node_dir="$root/tests/integration/node"
[ -x "$bin" ] || { echo "FAIL setup: $bin missing"; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "FAIL setup: node/npm missing (make deps)"; exit 1; }
if [ ! -f "$node_dir/node_modules/.package-lock.json" ] ||
   [ "$node_dir/package-lock.json" -nt "$node_dir/node_modules/.package-lock.json" ]; then
    (cd "$node_dir" && npm ci --no-audit --no-fund) || { echo "FAIL setup: npm ci"; exit 1; }
fi
model=$(cd tests/integration && /usr/bin/python3 -c \
    "import serve_lib,sys; print(serve_lib.model_path(sys.argv[1], sys.argv[2], 'tiny-ds2-q8_0'))" "$root" "$build")
port=$(/usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
log=$(mktemp)
"$bin" -m "$model" --http "127.0.0.1:$port" --threads 2 --ctx 1024 --no-repack >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 600); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "FAIL setup: the server exited"; cat "$log"; exit 1; }
    sleep 0.1
done
id=$(basename "$model" .gguf)
node "$node_dir/sdk.test.mjs" "$port" "$id"
rc=$?
kill -TERM $pid
wait $pid
src=$?
[ $src -eq 0 ] || { echo "FAIL the server exited with $src on SIGTERM"; cat "$log"; exit 1; }
exit $rc
