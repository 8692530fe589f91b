#!/usr/bin/env bash
# Continues the CPU-scale softmax and linear copy runs past the paper's 10000 steps, to
# see whether linear's loss comes closer to softmax's with more training.
#
#   bash experiments/copy/run-longer.sh STEPS SEED...     (THREADS=N, default 2; JOBS=2
#                                                           runs a seed's two variants side by side)
#   PREFIX=copy-cpu-1layer bash experiments/copy/run-longer.sh 20000 1 2 3
#
# For each seed and variant, copies the finished run (results/copy-cpu-VARIANT for seed
# 1, results/copy-cpu-seedS-VARIANT otherwise: run-cpu.sh's and run-seeds.sh's) to
# results/copy-cpu-xNk-seedS-VARIANT (N = STEPS / 1000) and continues the copy from its
# checkpoint to STEPS steps (`train --resume --set steps=STEPS`: the same as one
# uninterrupted run of STEPS steps; the learning-rate schedule does not depend on the
# step count). The original runs stay as they are. A copy already there is continued
# (nothing to do when complete). Then prints the paired comparison at the original and
# the new step count (seeds.py). With PREFIX=NAME the runs continued are run-seeds.sh's
# results/NAME-seedS-VARIANT, copied to results/NAME-xNk-seedS-VARIANT. About 9 minutes
# per 10000 steps and run of the 4-layer config on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
JOBS=${JOBS:-1}
PREFIX=${PREFIX:-}
. experiments/copy/lib.sh
[ $# -ge 2 ] || { echo "usage: run-longer.sh STEPS SEED..." >&2; exit 2; }
steps=$1; shift
case "$steps" in ''|*[!0-9]*) refuse "STEPS must be a step count, not '$steps'";; esac
check_settings
tag=x$steps; [ $((steps % 1000)) = 0 ] && tag=x$((steps / 1000))k
name=${PREFIX:-copy-cpu}-$tag
B=build/attnbench
[ -x "$B" ] || bash harness/scripts/build.sh
for s in "$@"; do
    for v in softmax linear; do
        src=$(seed_run_dir "$s" "$v")
        dst=results/$name-seed$s-$v
        if [ ! -d "$dst" ]; then
            [ -f "$src/checkpoint.bin" ] || refuse "no run $src to continue (run-cpu.sh, run-seeds.sh)"
            cp -r "$src" "$dst.part" && mv "$dst.part" "$dst"
        fi
    done
    pids=()
    for v in softmax linear; do
        run=("$B" --threads "$THREADS" train --resume --out "results/$name-seed$s-$v" --set steps="$steps" --quiet)
        if [ "$JOBS" = 2 ]; then "${run[@]}" & pids+=($!); else "${run[@]}"; fi
    done
    for p in "${pids[@]}"; do wait "$p"; done
done
base=$(/usr/bin/env python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' experiments/copy/copy-cpu-linear.json)
ats=(--at "$steps"); [ "$steps" -gt "$base" ] && ats=(--at "$base" --at "$steps")
/usr/bin/env python3 experiments/copy/seeds.py results --prefix "$name" "${ats[@]}"
