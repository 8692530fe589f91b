#!/usr/bin/env bash
# For a GPU machine that HAS the project's dependencies. The machines lent to this
# project do not (no jansson, OpenBLAS, Criterion, gnuplot, no package registry): there,
# use harness/scripts/gpu-pack.sh here and harness/scripts/gpu-check.sh there (the same
# suites, cross-check, sweep and side by side, plus the sampling speeds, under 8
# minutes, into one archive). This script is kept for a machine of one's own.
#
# On a machine with an NVIDIA GPU (compute capability 8.0+), CUDA toolkit and the
# project's dependencies (harness/scripts/setup.sh installs them on Debian): builds,
# runs the GPU test suites and the float64 cross-check on the GPU (needs numpy), the
# Figure 1 sweep on the GPU and the side-by-side with PyTorch
# (experiments/sweep/compare-torch.sh cuda: needs a python3 whose torch is a CUDA build,
# PyTorch 2.x for scaled_dot_product_attention; PYTHON names it when python3 is not
# that one). Writes under results/:
#   figure1-gpu.json/.tsv/.png/.svg, compare-torch-gpu.json (ours),
#   compare-torch-gpu-torch.json (PyTorch), compare-torch-gpu.md (the table),
#   gpu-tests.log.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
bash harness/scripts/build.sh
mkdir -p results
set +e
meson test -C build --print-errorlogs cuda cuda_selftest model_cuda ctc_cuda 2>&1 | tee results/gpu-tests.log
python3 tests/crosscheck/xcheck.py build/attnbench --device cuda 2>&1 | tee -a results/gpu-tests.log
set -e
build/attnbench bench experiments/sweep/figure1-gpu.json --device cuda --out results/figure1-gpu.json
# without gnuplot the figure is not drawn; the sweep is kept and the side by side runs
build/attnbench plot results/figure1-gpu.json || echo "gpu-bench: results/figure1-gpu.png not drawn (the sweep's JSON is kept)"
# Both sides with the same host thread count (all cores unless THREADS is set).
THREADS="${THREADS:-$(nproc)}" OUT=results ATTNBENCH=build/attnbench bash experiments/sweep/compare-torch.sh cuda
