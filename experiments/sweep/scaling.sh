#!/usr/bin/env bash
# The scaling of a training step over data-parallel ranks (CLUSTER.md, "Data-parallel
# training"): the copy task at CPU scale (experiments/copy/copy-cpu-linear.json, batch
# 64 of 16 positions) for STEPS steps, as one process with 1 and 2 threads, and under
# mpirun with 2 and 4 ranks of 1 thread each; each run's document is copied to
# experiments/sweep/runs/scaling/ for scaling.py.
#
#   bash experiments/sweep/scaling.sh [STEPS]     (default 60; from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-60}
exe=build/attnbench
config=experiments/copy/copy-cpu-linear.json
out=experiments/sweep/runs/scaling
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -x "$exe" ] || { echo "scaling: build first (bash harness/scripts/build.sh)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "scaling: no mpirun (harness/scripts/setup.sh installs OpenMPI)" >&2; exit 2; }
mkdir -p "$out"
sets=(--set "steps=$steps" --set eval_every=0 --set checkpoint_every=0 --set log_every=20 --quiet)
mpi=(mpirun --oversubscribe -np)
[ "$(id -u)" -eq 0 ] && mpi=(mpirun --allow-run-as-root --oversubscribe -np)

run() { # NAME then the command
    local name=$1
    shift
    echo "scaling: $name" >&2
    "$@" --out "$work/$name"
    cp "$work/$name/train.json" "$out/$name.json"
}
run r1-t1 "$exe" --threads 1 train "$config" "${sets[@]}"
run r1-t2 "$exe" --threads 2 train "$config" "${sets[@]}"
run r2-t1 "${mpi[@]}" 2 "$exe" --threads 1 train "$config" "${sets[@]}" --dist mpi
run r4-t1 "${mpi[@]}" 4 "$exe" --threads 1 train "$config" "${sets[@]}" --dist mpi
echo "scaling: python3 experiments/sweep/scaling.py $out/r1-t1.json $out/r1-t2.json $out/r2-t1.json $out/r4-t1.json" >&2
