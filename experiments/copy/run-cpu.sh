#!/usr/bin/env bash
# Figure 2 on the CPU: trains the four CPU-scale copy configs (softmax, linear, lsh-1,
# lsh-4) one after another, runs `attnbench generate` on each final checkpoint, draws
# the figure and prints the results table.
#
#   bash experiments/copy/run-cpu.sh            (THREADS=N to change the thread count, default 2)
#
# Writes results/copy-cpu-VARIANT/{train.json,train.tsv,checkpoint.bin,generate.json},
# results/figure2-cpu.{png,svg,plot.tsv}. A run already in results/ is continued from
# its checkpoint (nothing to do when it is complete), so the script can be stopped and
# started again. Extra arguments go to every `attnbench train`.
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
B=build/attnbench
[ -x "$B" ] || bash harness/scripts/build.sh
variants="softmax linear lsh-1 lsh-4"
for v in $variants; do
    out=results/copy-cpu-$v
    if [ -f "$out/checkpoint.bin" ]; then
        "$B" --threads "$THREADS" train experiments/copy/copy-cpu-$v.json --out "$out" --resume "$@"
    else
        "$B" --threads "$THREADS" train experiments/copy/copy-cpu-$v.json --out "$out" --overwrite "$@"
    fi
    "$B" --threads "$THREADS" generate "$out/checkpoint.bin" --n 256 --out "$out/generate.json" > /dev/null
done
"$B" plot $(for v in $variants; do echo results/copy-cpu-$v/train.json; done) --out results/figure2-cpu \
    --title "Sequence copy (CPU scale): training loss per gradient step"
/usr/bin/env python3 experiments/copy/table.py $(for v in $variants; do echo results/copy-cpu-$v; done)
