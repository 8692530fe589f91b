#!/usr/bin/env bash
# Configures (once) and builds attnbench in ./build (release). Used by main.sh and test.sh.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
# The CUDA backend is built when meson finds nvcc on PATH; the toolkit usually lives
# in /usr/local/cuda/bin, outside it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
# Quiet when all is well; on a failure, the end of what meson or ninja said.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [ ! -f build/build.ninja ]; then
    rm -rf build   # what a failed configure left behind
    if ! meson setup build --buildtype=release >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "build: meson setup failed (whole log: build/meson-logs/meson-log.txt)" >&2
        exit 1
    fi
fi
# meson 1.0's CUDA rules write no dependency files, so ninja does not rebuild a .cu that
# nvcc compiles when only a header it includes changed (the emulated build of the same
# sources, by g++, tracks them): when a CUDA header is newer than the library nvcc made,
# every .cu is touched (all nvcc objects are rebuilt, a few minutes on 2 cores).
lib=$(readlink -f build/libattnbench.so 2>/dev/null || true)
if [ -f "$lib" ] && grep -q '^rule cuda_COMPILER' build/build.ninja &&
    [ -n "$(find attention harness models \( -name '*.cuh' -o -name '*.h' \) -newer "$lib" | head -n 1)" ]; then
    find attention harness models tests -name '*.cu' -exec touch {} +
fi
if ! ninja -C build >"$log" 2>&1; then
    grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 60 >&2
    echo "build: compilation failed" >&2
    exit 1
fi
