#!/usr/bin/env bash
# Builds attnbench in build-san with AddressSanitizer (LeakSanitizer included) and
# UndefinedBehaviorSanitizer, every finding fatal (-fno-sanitize-recover), without CUDA
# (configured once), and runs every test suite there. The sanitizers' options (leaks
# checked at every exit, a finding is exit status 23) come from the test setup
# 'sanitized' of tests/meson.build, so `meson test -C build-san` alone does the same.
# Arguments go to meson test (suite names). test.sh runs this after the plain suites.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [ ! -f build-san/build.ninja ]; then
    rm -rf build-san   # what a failed configure left behind
    if ! meson setup build-san --buildtype=debugoptimized -Dcuda=disabled -Dmpi=disabled -Db_sanitize=address,undefined \
        -Dc_args=-fno-sanitize-recover=all -Dcpp_args=-fno-sanitize-recover=all >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "sanitize: meson setup failed (whole log: build-san/meson-logs/meson-log.txt)" >&2
        exit 1
    fi
fi
if ! ninja -C build-san >"$log" 2>&1; then
    grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 60 >&2
    echo "sanitize: compilation failed" >&2
    exit 1
fi
# Suites asked for that this build does not have (the emulator's strict runs: see
# tests/meson.build) are left out, with a line saying so.
if [ $# -gt 0 ]; then
    have=$(meson test -C build-san --list 2>/dev/null)
    keep=()
    for t in "$@"; do
        if grep -qx -- "$t" <<<"$have"; then keep+=("$t"); else echo "sanitize: no suite '$t' in the sanitized build (left out)"; fi
    done
    [ ${#keep[@]} -gt 0 ] || exit 0
    set -- "${keep[@]}"
fi
# The kernels attnbench runs with for the test programs' OpenBLAS (see test.sh).
[ -n "${OPENBLAS_CORETYPE:-}" ] || export OPENBLAS_CORETYPE="$(build-san/attnbench --blas-core)"
exec meson test -C build-san --print-errorlogs --num-processes 1 "$@"
