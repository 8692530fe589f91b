#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: the CPU attention sweep of
# Figure 1 (experiments/sweep/figure1-cpu.json), then draws its figure.
# Writes results/figure1-cpu.json, .tsv, .png, .svg (and .plot.tsv, the figure's data).
# Extra arguments go to `attnbench bench` (e.g. --set lengths=[512,1024]).
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
bash harness/scripts/setup.sh
bash harness/scripts/build.sh
build/attnbench bench experiments/sweep/figure1-cpu.json --out results/figure1-cpu.json "$@"
build/attnbench plot results/figure1-cpu.json
