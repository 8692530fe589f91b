#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (meson test), then the
# same suites again in a build with AddressSanitizer, LeakSanitizer and UBSan
# (sanitize.sh: build-san, no CUDA), then each fuzz target for 15 s (fuzz.sh: build-fuzz,
# clang). CI runs this. Arguments (suite names) select the suites of both builds and
# leave the fuzz smoke out.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
bash harness/scripts/setup.sh
bash harness/scripts/build.sh
# The test programs load OpenBLAS themselves: give them the kernels attnbench runs with
# (where OpenBLAS falls back to generic ones on a CPU it does not know, attnbench picks
# the CPU's own; harness/blas.h). An OPENBLAS_CORETYPE already set is kept.
[ -n "${OPENBLAS_CORETYPE:-}" ] || export OPENBLAS_CORETYPE="$(build/attnbench --blas-core)"

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

# The fuzz smoke: each target counts as a test, passed when it did not crash.
if [ $# -eq 0 ]; then
    frc=0
    bash harness/scripts/fuzz.sh 15 || frc=$?
    if [ "$frc" -eq 77 ]; then
        skip=$((skip + 1))
    elif [ -f build-fuzz/fuzz-summary.tsv ] && [ "$frc" -le 1 ]; then
        ok=$(awk -F'\t' 'NR > 1 && $5 == 0' build-fuzz/fuzz-summary.tsv | wc -l)
        bad=$(awk -F'\t' 'NR > 1 && $5 != 0' build-fuzz/fuzz-summary.tsv | wc -l)
        pass=$((pass + ok))
        fail=$((fail + bad))
        [ "$frc" -eq 0 ] || rc=1
    else
        fail=$((fail + 1)) # it could not build or run them
        rc=1
    fi
fi

# One closing line in the plain form: "N passed, N failed".
echo "tests: $pass passed, $fail failed, $skip skipped"
exit $rc
