#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job.
# Main job (until the Figure 1 sweep lands): a demonstration of `attnbench op`:
# every variant, causal, forward + backward and (where it has one) the recurrent mode,
# on seeded random tensors B=1, H=8, N=1024, D=M=64. Writes results/demo/.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash harness/scripts/setup.sh
bash harness/scripts/build.sh
exe=build/attnbench
out=results/demo
$exe list
$exe inputs --shape 1,8,1024,64,64 --seed 1 --out "$out/inputs"
for v in softmax stateful-softmax linear polynomial lsh; do
    t0=$(date +%s%N)
    $exe op --variant "$v" --causal --q "$out/inputs/q.npy" --k "$out/inputs/k.npy" --v "$out/inputs/v.npy" \
        --dout "$out/inputs/dout.npy" --out "$out/$v"
    t1=$(date +%s%N)
    printf 'op %-17s forward+backward, file I/O included: %6d ms -> %s/{out,dq,dk,dv}.npy\n' "$v" $(( (t1 - t0) / 1000000 )) "$out/$v"
done
for v in stateful-softmax linear polynomial; do
    $exe op --variant "$v" --causal --mode recurrent --q "$out/inputs/q.npy" --k "$out/inputs/k.npy" \
        --v "$out/inputs/v.npy" --out "$out/$v-recurrent"
    echo "op $v recurrent (1024 steps) -> $out/$v-recurrent/out.npy"
done
