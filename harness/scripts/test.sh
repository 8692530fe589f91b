#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (meson test), then the
# same suites again in a build with AddressSanitizer, LeakSanitizer and UBSan
# (sanitize.sh: build-san, no CUDA). CI runs this. Arguments (suite names) select the
# suites of both builds.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
bash harness/scripts/setup.sh
bash harness/scripts/build.sh

pass=0
fail=0
skip=0
# Adds the results of a meson test run (its testlog.json) and prints them as "WHAT: ...".
count() {
    local what=$1 log=$2/meson-logs/testlog.json p=0 f=0 s=0
    if [ -f "$log" ]; then
        p=$(grep -c '"result": "OK"' "$log" || true)
        f=$(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR)"' "$log" || true)
        s=$(grep -c '"result": "SKIP"' "$log" || true)
    fi
    echo "$what: $p passed, $f failed, $s skipped"
    pass=$((pass + p))
    fail=$((fail + f))
    skip=$((skip + s))
}

rc=0
meson test -C build --print-errorlogs --num-processes 1 "$@" || rc=1
count "tests (plain build)" build

rm -f build-san/meson-logs/testlog.json # counted only if this run writes it
bash harness/scripts/sanitize.sh "$@" || rc=1
count "tests (sanitizers)" build-san

# One closing line in the plain form: "N passed, N failed".
echo "tests: $pass passed, $fail failed, $skip skipped"
exit $rc
