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
free_port() { /usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
# a second model for reasoning: a tiny qwen3moe with a template whose
# assistant prompt opens the think block (Qwen3's thinking-only models')
tmp=$(mktemp -d)
printf '%s\n' "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}" >"$tmp/qwen3.jinja"
"$root/$build/bin/ecs-mkmodel" --arch qwen3moe --preset tiny --types q8_0 --seed 1 --threads 1 \
    --chat-template "$tmp/qwen3.jinja" -o "$tmp/think.gguf" >"$tmp/mk.log" 2>&1 ||
    { echo "FAIL setup: ecs-mkmodel --chat-template"; cat "$tmp/mk.log"; rm -rf "$tmp"; exit 1; }
port=$(free_port)
tport=$(free_port)
"$bin" -m "$model" --http "127.0.0.1:$port" --threads 2 --ctx 1024 --no-repack >"$tmp/log" 2>&1 &
pid=$!
"$bin" -m "$tmp/think.gguf" --http "127.0.0.1:$tport" --threads 1 --ctx 512 --no-repack >"$tmp/tlog" 2>&1 &
tpid=$!
trap 'kill $pid $tpid 2>/dev/null; rm -rf "$tmp"' EXIT
for p in "$pid:$port:log" "$tpid:$tport:tlog"; do
    IFS=: read -r spid sport slog <<<"$p"
    for _ in $(seq 600); do
        curl -fs "http://127.0.0.1:$sport/health" >/dev/null 2>&1 && break
        kill -0 "$spid" 2>/dev/null || { echo "FAIL setup: a server exited"; cat "$tmp/$slog"; exit 1; }
        sleep 0.1
    done
done
id=$(basename "$model" .gguf)
node "$node_dir/sdk.test.mjs" "$port" "$id" "$tport" think
rc=$?
for p in "$pid:log" "$tpid:tlog"; do
    IFS=: read -r spid slog <<<"$p"
    kill -TERM "$spid"
    wait "$spid"
    src=$?
    [ $src -eq 0 ] || { echo "FAIL the server exited with $src on SIGTERM"; cat "$tmp/$slog"; exit 1; }
done
exit $rc
