#!/usr/bin/env bash
# Softmax against linear over several seeds, at CPU scale: the copy task's final loss
# differs between seeds of one variant by more than the difference the comparison is
# about, so one run per variant cannot decide it.
#
#   bash experiments/copy/run-seeds.sh 2 3 4 5     (THREADS=N, default 2; VARIANTS="softmax linear")
#
# Trains experiments/copy/copy-cpu-VARIANT.json with `--set seed=S` into
# results/copy-cpu-seedS-VARIANT/ (seed 1 is run-cpu.sh's results/copy-cpu-VARIANT/).
# A run already there is continued from its checkpoint (nothing to do when complete).
# Then prints the paired comparison (experiments/copy/seeds.py). About 9 minutes per run
# on 2 idle cores.
set -euo pipefail
export PATH
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
VARIANTS=${VARIANTS:-"softmax linear"}
[ $# -ge 1 ] || { echo "usage: run-seeds.sh SEED..." >&2; exit 2; }
B=build/attnbench
[ -x "$B" ] || bash harness/scripts/build.sh
for s in "$@"; do
    for v in $VARIANTS; do
        out=results/copy-cpu-seed$s-$v
        [ "$s" = 1 ] && out=results/copy-cpu-$v
        if [ -f "$out/checkpoint.bin" ]; then
            "$B" --threads "$THREADS" train experiments/copy/copy-cpu-$v.json --set seed="$s" --out "$out" --resume
        else
            "$B" --threads "$THREADS" train experiments/copy/copy-cpu-$v.json --set seed="$s" --out "$out" --overwrite
        fi
    done
done
/usr/bin/env python3 experiments/copy/seeds.py results
