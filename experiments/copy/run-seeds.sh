#!/usr/bin/env bash
# Softmax against linear over several seeds, at CPU scale: the copy task's final loss
# differs between seeds of one variant by more than the difference the comparison is
# about, so one run per variant cannot decide it.
#
#   bash experiments/copy/run-seeds.sh 2 3 4 5
#   PREFIX=copy-cpu-1layer SET="model.layers=1" JOBS=2 THREADS=1 bash experiments/copy/run-seeds.sh 1 2 3
#
# THREADS=N (default 2) per run; JOBS=2 runs a seed's two variants side by side;
# VARIANTS (default "softmax linear"). Trains experiments/copy/copy-cpu-VARIANT.json with
# `--set seed=S` into results/copy-cpu-seedS-VARIANT/ (seed 1 is run-cpu.sh's
# results/copy-cpu-VARIANT/). With PREFIX=NAME the runs go to results/NAME-seedS-VARIANT/
# for every seed, and SET="KEY=VALUE ..." adds those --set overrides to every run (a
# variation of the config, e.g. one layer). A run already there is continued from its
# checkpoint (nothing to do when complete). Then prints the paired comparison
# (experiments/copy/seeds.py). About 9 minutes per run of the 4-layer config on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
JOBS=${JOBS:-1}
VARIANTS=${VARIANTS:-"softmax linear"}
PREFIX=${PREFIX:-}
SET=${SET:-}
. experiments/copy/lib.sh
[ $# -ge 1 ] || { echo "usage: run-seeds.sh SEED..." >&2; exit 2; }
check_settings
[ -z "$SET" ] || [ -n "$PREFIX" ] || refuse "SET changes the config: give the runs their own PREFIX"
for s in "$@"; do
    case "$s" in ''|*[!0-9]*) refuse "a seed must be a number, not '$s'";; esac
done
sets=()
for kv in $SET; do sets+=(--set "$kv"); done
B=build/attnbench
[ -x "$B" ] || bash harness/scripts/build.sh
for s in "$@"; do
    pids=()
    for v in $VARIANTS; do
        out=$(seed_run_dir "$s" "$v")
        run=("$B" --threads "$THREADS" train experiments/copy/copy-cpu-$v.json --set seed="$s" ${sets[@]+"${sets[@]}"} --out "$out" --quiet)
        if [ -f "$out/checkpoint.bin" ]; then run+=(--resume); else run+=(--overwrite); fi
        if [ "$JOBS" = 2 ]; then "${run[@]}" & pids+=($!); else "${run[@]}"; fi
    done
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p"; done
done
if [ -n "$PREFIX" ]; then
    /usr/bin/env python3 experiments/copy/seeds.py results --prefix "$PREFIX"
else
    /usr/bin/env python3 experiments/copy/seeds.py results
fi
