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
if ! ninja -C build >"$log" 2>&1; then
    grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 60 >&2
    echo "build: compilation failed" >&2
    exit 1
fi
