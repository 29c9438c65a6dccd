#!/usr/bin/env bash
# test_ops.sh - operating a coordinator: ecsctl (status, workers, placement,
# drain/undrain/restart under load with no failed request), graceful
# shutdown on SIGTERM, the live console in headless Chromium, and the
# admin endpoint behind its own CURVE key.
# usage: tests/integration/test_ops.sh BUILD_DIR   (from the repo root)
set -u
build=${1:?usage: test_ops.sh BUILD_DIR}
root=$(pwd)
fail=0
for t in ops_ecsctl ops_shutdown ops_console ops_curve; do
    (cd tests/integration && PYTHONDONTWRITEBYTECODE=1 timeout 120 /usr/bin/python3 "$t.py" \
        "$root" "$build") || { echo "FAIL $t"; fail=1; }
done
exit $fail
