#!/usr/bin/env bash
# test_serve_tools_v3.sh - tool calls with DeepSeek-V3's chat template
# (serve_tools_v3.py): a tiny deepseek2 made in a temp dir with a V3-style
# template and V3's tool markup as control tokens, served and called
# through both APIs.
# usage (from the repo root): tests/integration/test_serve_tools_v3.sh BUILD_DIR
set -u
export PYTHONDONTWRITEBYTECODE=1
build=${1:?usage: $0 BUILD_DIR}
[ -x "$build/bin/ecs-coordinator" ] || { echo "FAIL setup: $build/bin/ecs-coordinator missing"; exit 1; }
cd tests/integration && exec /usr/bin/python3 serve_tools_v3.py "$(cd ../.. && pwd)" "$build"
