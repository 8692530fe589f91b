#!/usr/bin/env bash
# Configures (once) and builds attnbench in ./build (release). Used by main.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The CUDA backend is built when meson finds nvcc on PATH; the toolkit usually lives
# in /usr/local/cuda/bin, outside it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
if [ ! -f build/build.ninja ]; then
    meson setup build --buildtype=release >/dev/null
fi
ninja -C build >/dev/null
