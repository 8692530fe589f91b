#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (meson test). CI runs this.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
bash harness/scripts/setup.sh
bash harness/scripts/build.sh
set +e
meson test -C build --print-errorlogs --num-processes 1 "$@"
rc=$?
set -e
# One closing line in the plain form: "N passed, N failed".
log=build/meson-logs/testlog.json
if [ -f "$log" ]; then
    pass=$(grep -c '"result": "OK"' "$log" || true)
    fail=$(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR)"' "$log" || true)
    skip=$(grep -c '"result": "SKIP"' "$log" || true)
    echo "tests: $pass passed, $fail failed, $skip skipped"
fi
exit $rc
