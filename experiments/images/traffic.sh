#!/usr/bin/env bash
# The memory traffic of sampling's step on the paper's model shapes, without a GPU:
# `attnbench-emu sample --traffic T --device cuda` (the CPU emulator built with traffic
# counting, harness/scripts/build.sh builds it) counts the device memory that one step
# at position T and its draw move, beside the least such a step must move (the weights,
# each layer's attention state, the values in and out). One point per shape, variant,
# batch and position: linear at T = 1 (its state does not grow: every position moves
# the same), stateful-softmax at T = 1 and at half the row (its cache grows with T: the
# mean over a row's positions).
#
#   bash experiments/images/traffic.sh [OUT]        (default OUT: results/images-traffic)
#
# Writes OUT/SHAPE-VARIANT-bB-tT/sample.json; `python3 experiments/images/table.py
# traffic OUT` prints the table. About 10 minutes of one core (MNIST's batch 1024 is 3
# of them: the emulator runs every GPU thread on the CPU). Environment: ATTNBENCH_EMU
# (default build/attnbench-emu, built by harness/scripts/build.sh when it is the
# default). Needs data/mnist and data/cifar10 (get-data.sh): the task reads its data.
set -euo pipefail
export PATH
cd "$(dirname "$0")/../.."
out=${1:-results/images-traffic}
exe=${ATTNBENCH_EMU:-build/attnbench-emu}
for d in data/mnist data/cifar10; do
    [ -d "$d" ] || { echo "traffic: error: $d missing: run experiments/images/get-data.sh (with --cifar10 SOURCE)" >&2; exit 2; }
done
if [ -z "${ATTNBENCH_EMU:-}" ]; then bash harness/scripts/build.sh; fi
[ -x "$exe" ] || { echo "traffic: error: $exe is not an executable (the emulated build)" >&2; exit 2; }
mkdir -p "$out"

# point SHAPE VARIANT BATCH POSITION
point() {
    local shape=$1 v=$2 b=$3 t=$4 cfg args=()
    case "$v" in
        stateful-softmax) cfg=experiments/images/$shape-softmax.json; args+=(--variant stateful-softmax) ;;
        *) cfg=experiments/images/$shape-$v.json ;;
    esac
    "$exe" --threads 1 sample --config "$cfg" "${args[@]}" --traffic "$t" --device cuda --batch "$b" --n "$b" \
        --seed 1 --out "$out/$shape-$v-b$b-t$t"
}

for b in 1 16 256 1024; do point mnist linear "$b" 1; done
for b in 1 16; do point mnist stateful-softmax "$b" 1; point mnist stateful-softmax "$b" 392; done
for b in 1 16 256; do point cifar10 linear "$b" 1; done
echo "traffic: done; python3 experiments/images/table.py traffic $out"
