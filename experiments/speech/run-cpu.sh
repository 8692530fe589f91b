#!/usr/bin/env bash
# The CPU-scale speech runs of experiments/speech/PROTOCOL.md (Table 3 at CPU scale):
# each model trains for the protocol's 40 epochs, then `attnbench decode` writes the
# best paths of the first 5 test utterances beside its run document:
#   results/speech-cpu-MODEL/train.json, decode.json
#
#   bash experiments/speech/run-cpu.sh [MODEL...]   (default: bilstm softmax lsh-4 linear polynomial)
#
# Environment: JOBS (default 2: runs side by side), THREADS (default 1: the protocol's
# CPU times per epoch are at 1 thread), ATTNBENCH (default build/attnbench, built by
# harness/scripts/build.sh when it is the default), OUT (default results). A run that
# stopped (Ctrl-C, a kill: its last checkpoint) continues where it was; a finished one
# is left as it is. Needs data/speech/festvox-ru (experiments/speech/get-data.sh).
set -euo pipefail
export PATH
cd "$(dirname "$0")/../.."

models=(bilstm softmax lsh-4 linear polynomial)
jobs=${JOBS:-2}
threads=${THREADS:-1}
out=${OUT:-results}
exe=${ATTNBENCH:-build/attnbench}
[ $# -gt 0 ] || set -- "${models[@]}"
for m in "$@"; do
    [ -f "experiments/speech/speech-cpu-$m.json" ] || { echo "run-cpu: error: unknown model '$m' (${models[*]})" >&2; exit 2; }
done
[ -d data/speech/festvox-ru/train ] || { echo "run-cpu: error: data/speech/festvox-ru missing: run experiments/speech/get-data.sh" >&2; exit 2; }
if [ -z "${ATTNBENCH:-}" ]; then bash harness/scripts/build.sh; fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# the feature cache once, before runs side by side would each compute and write it
for s in train valid test; do
    "$exe" features "data/speech/festvox-ru/$s" --out "data/speech/festvox-ru/cache/$s" >/dev/null
done

one() {
    local m=$1 dir=$out/speech-cpu-$1
    if [ -f "$dir/decode.json" ]; then
        echo "run-cpu: $m: done before ($dir)"
        return 0
    fi
    if [ -f "$dir/checkpoint.bin" ]; then
        "$exe" --threads "$threads" train --resume --out "$dir" --quiet
    else
        "$exe" --threads "$threads" train "experiments/speech/speech-cpu-$m.json" --out "$dir" --quiet
    fi
    "$exe" --threads "$threads" decode "$dir/checkpoint.bin" --split test --n 5 --out "$dir/decode.json" >/dev/null
    echo "run-cpu: $m: done ($dir)"
}

pids=()
for m in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    one "$m" &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
