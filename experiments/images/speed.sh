#!/usr/bin/env bash
# The sampling-speed tables (the paper's Tables 1 and 2, images/s at a large batch, and
# Table 5, seconds per image at batch 1), measured in one run on the paper's model
# shapes (experiments/images/{mnist,cifar10}-*.json: 8 or 16 layers, d_model 256, 784
# or 3,072 values) with initialised weights (`attnbench sample --config`: the time does
# not depend on the weights), every variant in its own mode: linear as an RNN,
# stateful-softmax with its key/value cache (softmax's weights, --variant), softmax,
# lsh-1 and lsh-4 by recomputing the prefix for every value.
#
#   bash experiments/images/speed.sh [OUT]        (default OUT: results/images-speed)
#
# Writes OUT/SHAPE-VARIANT-bB/sample.json for each point. Whole images are sampled
# where that takes minutes (the recurrent modes, and the recompute modes on MNIST at
# batch 1); elsewhere the recompute modes are timed at every E-th position and
# integrated (`sample --estimate E`, "method": "estimated" in the document). MNIST's
# softmax at batch 1 is measured both ways, as a check of the estimate.
# Every sample.json holds the wall-clock and the process's CPU seconds of the timed
# part; on a machine shared with other work run it with THREADS=1 and print the tables
# on the CPU clock (table.py speed OUT cpu): what one quiet core would take.
# Environment: THREADS (default: all cores), ATTNBENCH (default build/attnbench, built
# by harness/scripts/build.sh when it is the default). Needs data/mnist and
# data/cifar10 (get-data.sh): the task reads its data even for an initialised model.
# experiments/images/table.py speed OUT prints the tables.
set -euo pipefail
export PATH
cd "$(dirname "$0")/../.."
out=${1:-results/images-speed}
exe=${ATTNBENCH:-build/attnbench}
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
for d in data/mnist data/cifar10; do
    [ -d "$d" ] || { echo "speed: error: $d missing: run experiments/images/get-data.sh (with --cifar10 SOURCE)" >&2; exit 2; }
done
if [ -z "${ATTNBENCH:-}" ]; then bash harness/scripts/build.sh; fi
mkdir -p "$out"

# point SHAPE VARIANT BATCH [ESTIMATE_EVERY]
point() {
    local shape=$1 v=$2 b=$3 every=${4:-} cfg args=()
    case "$v" in
        stateful-softmax) cfg=experiments/images/$shape-softmax.json; args+=(--variant stateful-softmax) ;;
        *) cfg=experiments/images/$shape-$v.json ;;
    esac
    local dir=$out/$shape-$v-b$b${every:+-e$every}
    [ -n "$every" ] && args+=(--estimate "$every")
    "$exe" "${threads[@]}" sample --config "$cfg" "${args[@]}" --n "$b" --batch "$b" --seed 1 --out "$dir"
}

# MNIST (784 values, 8 layers): batch 1, 16 and 64 (softmax's recomputation costs the
# same per image at any batch; linear's and the cache's steps get cheaper with it)
for v in linear stateful-softmax; do point mnist $v 1; point mnist $v 16; point mnist $v 64; done
point mnist softmax 1              # whole images, the estimate's check
for v in softmax lsh-1 lsh-4; do point mnist $v 1 49; point mnist $v 16 49; done
point mnist softmax 64 49
# CIFAR-10 (3,072 values, 16 layers): batch 1 and 16 (recompute: batch 4, estimated)
for v in linear stateful-softmax; do point cifar10 $v 1; point cifar10 $v 16; done
for v in softmax lsh-1 lsh-4; do point cifar10 $v 1 384; point cifar10 $v 4 384; done
echo "speed: done; python3 experiments/images/table.py speed $out [cpu]"
