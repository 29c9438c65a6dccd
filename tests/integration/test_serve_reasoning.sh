#!/usr/bin/env bash
# test_serve_reasoning.sh - reasoning with a chat template that thinks
# (serve_reasoning.py): a tiny model with a Qwen3-style template made in a
# temp dir, thinking on and off through both APIs, whole and streamed.
# usage (from the repo root): tests/integration/test_serve_reasoning.sh BUILD_DIR
set -u
export PYTHONDONTWRITEBYTECODE=1
build=${1:?usage: $0 BUILD_DIR}
[ -x "$build/bin/ecs-coordinator" ] || { echo "FAIL setup: $build/bin/ecs-coordinator missing"; exit 1; }
cd tests/integration && exec /usr/bin/python3 serve_reasoning.py "$(cd ../.. && pwd)" "$build"
