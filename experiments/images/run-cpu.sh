#!/usr/bin/env bash
# The CPU-scale MNIST runs of experiments/images/PROTOCOL.md, one variant after the other:
# each trains to both of its budgets, equal epochs (3 epochs, 11063 steps) and equal
# time (S_v steps, the CPU time of softmax's 3 epochs at the variant's step time), the
# shorter first, then continues (--resume: bit for bit the same run) to the longer. The
# run document at the end of each segment is kept beside it:
#   results/mnist-cpu-VARIANT/train-epochs.json   at 3 epochs
#   results/mnist-cpu-VARIANT/train-time.json     at S_v steps
#
#   bash experiments/images/run-cpu.sh [VARIANT...]     (default: softmax linear lsh-1 lsh-4)
#
# SEED=S (default 1) trains seed S instead of the config's seed 1 (`--set seed=S`), into
# results/mnist-cpu-VARIANT-seedS/, at the equal-epochs budget only (the further seeds
# of PROTOCOL.md's addendum 2: train-epochs.json).
#
# Environment: BUDGET_STEPS (default 11063, the protocol's 3 epochs: the equal-epochs
# step count, from which the equal-time counts follow; PROTOCOL.md's log entry 3 says
# which budget the reported runs used), THREADS (default 1: the protocol's step times are at 1 thread),
# ATTNBENCH (default build/attnbench, built by harness/scripts/build.sh when it is the
# default), OUT (default results). Needs data/mnist (experiments/images/get-data.sh).
set -euo pipefail
export PATH
cd "$(dirname "$0")/../.."

# CPU seconds per step at 1 thread (steptime.json: PROTOCOL.md, log entry 1) and the budgets
declare -A step_s
while read -r name secs; do step_s[$name]=$secs; done < <(python3 -c '
import json, sys
for k, v in json.load(open(sys.argv[1]))["mnist"]["seconds_per_step"].items(): print(k, v)' experiments/images/steptime.json)
epoch_steps=${BUDGET_STEPS:-11063}
[[ "$epoch_steps" =~ ^[1-9][0-9]*$ ]] || { echo "run-cpu: error: BUDGET_STEPS '$epoch_steps' is not a positive step count" >&2; exit 2; }
threads=${THREADS:-1}
seed=${SEED:-1}
[[ "$seed" =~ ^[1-9][0-9]*$ ]] || { echo "run-cpu: error: SEED '$seed' is not a positive integer" >&2; exit 2; }
out=${OUT:-results}
exe=${ATTNBENCH:-build/attnbench}
[ $# -gt 0 ] || set -- softmax linear lsh-1 lsh-4
for v in "$@"; do
    [ -n "${step_s[$v]:-}" ] || { echo "run-cpu: error: unknown variant '$v' (softmax, linear, lsh-1, lsh-4)" >&2; exit 2; }
done
[ -d data/mnist ] || { echo "run-cpu: error: data/mnist missing: run experiments/images/get-data.sh" >&2; exit 2; }
if [ -z "${ATTNBENCH:-}" ]; then bash harness/scripts/build.sh; fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

for v in "$@"; do
    cfg=experiments/images/mnist-cpu-$v.json
    dir=$out/mnist-cpu-$v seedset=()
    if [ "$seed" -ne 1 ]; then dir=$out/mnist-cpu-$v-seed$seed seedset=(--set "seed=$seed"); fi
    # equal time: T = 11063 softmax steps; S_v = round(T / t_v)
    time_steps=$(python3 -c "print(round($epoch_steps * ${step_s[softmax]} / ${step_s[$v]}))")
    if [ "$time_steps" -le "$epoch_steps" ]; then
        first=("time" "$time_steps") second=("epochs" "$epoch_steps")
    else
        first=("epochs" "$epoch_steps") second=("time" "$time_steps")
    fi
    if [ "$seed" -ne 1 ]; then
        first=("epochs" "$epoch_steps") second=("epochs" "$epoch_steps")
        echo "run-cpu: $v, seed $seed: epochs budget $epoch_steps steps"
    else
        echo "run-cpu: $v: ${first[0]} budget $((first[1])) steps, then ${second[0]} budget $((second[1])) steps"
    fi
    # a run interrupted (Ctrl-C, or a kill: the last checkpoint) continues where it was
    if [ -f "$dir/train-${second[0]}.json" ]; then
        echo "run-cpu: $v: done before ($dir/train-${second[0]}.json)"
        continue
    fi
    if [ ! -f "$dir/train-${first[0]}.json" ]; then
        if [ -f "$dir/checkpoint.bin" ]; then
            "$exe" --threads "$threads" train --resume --out "$dir" --set "steps=${first[1]}" --quiet
        else
            "$exe" --threads "$threads" train "$cfg" --out "$dir" --set "steps=${first[1]}" "${seedset[@]}" --quiet
        fi
        cp "$dir/train.json" "$dir/train-${first[0]}.json"
    fi
    if [ "${second[1]}" -ne "${first[1]}" ]; then
        "$exe" --threads "$threads" train --resume --out "$dir" --set "steps=${second[1]}" --quiet
    fi
    cp "$dir/train.json" "$dir/train-${second[0]}.json"
done
