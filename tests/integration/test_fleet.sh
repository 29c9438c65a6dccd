#!/usr/bin/env bash
# test_fleet.sh - several coordinators share one expert pool (M:N): three
# workers started by hand serve two coordinators at once; outputs equal
# those of one coordinator alone (fleet_mn.py says what is checked).
# usage: tests/integration/test_fleet.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_fleet.sh BUILD_DIR}
cd tests/integration && PYTHONDONTWRITEBYTECODE=1 exec timeout 170 /usr/bin/python3 fleet_mn.py \
    "$(cd ../.. && pwd)" "$build"
