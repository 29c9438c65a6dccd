#!/usr/bin/env bash
# test_serve_http.sh - ecs-coordinator over raw HTTP (serve_http.py): hostile
# requests, simultaneous streams against solo runs, a KV pool smaller than
# the workload, control-token text, API keys.
# usage (from the repo root): tests/integration/test_serve_http.sh BUILD_DIR
set -u
export PYTHONDONTWRITEBYTECODE=1
build=${1:?usage: $0 BUILD_DIR}
[ -x "$build/bin/ecs-coordinator" ] || { echo "FAIL setup: $build/bin/ecs-coordinator missing"; exit 1; }
cd tests/integration && exec /usr/bin/python3 serve_http.py "$(cd ../.. && pwd)" "$build"
