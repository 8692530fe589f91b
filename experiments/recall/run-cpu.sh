#!/usr/bin/env bash
# The associative-recall study at CPU scale (PROTOCOL.md): the headline configuration
# (recall-cpu.json, eight variants) with seeds 1, 2 and 3, then the width, length and
# pairs configs (recall-wide-cpu.json, recall-length-cpu.json, recall-pairs-cpu.json)
# with seed 1, one training array entry at a time; then the table and the figures.
#
#   bash experiments/recall/run-cpu.sh        (about 70 CPU-minutes at one thread)
#
# Environment: THREADS (default 1), OUT (default results/recall: the committed runs are
# in experiments/recall/runs), PLOT (figure prefix, default OUT/recall-cpu),
# ATTNBENCH (default build/attnbench, built when missing). An entry whose run document
# already says "ok" is skipped, so the script can be stopped and started again (a
# stopped entry starts over). Extra arguments go to every `attnbench train`.
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-1}
OUT=${OUT:-results/recall}
PLOT=${PLOT:-$OUT/recall-cpu}
B=${ATTNBENCH:-build/attnbench}
[ -x "$B" ] || bash harness/scripts/build.sh

# entry CONFIG INDEX DIR [ARGS...]: one array entry into DIR/array-INDEX, unless done
entry() {
    local cfg=$1 i=$2 dir=$3
    shift 3
    if grep -qs '"status": "ok"' "$dir/array-$i/train.json"; then return; fi
    rm -rf "$dir/array-$i"
    "$B" --threads "$THREADS" train "experiments/recall/$cfg.json" --array-index "$i" --out "$dir" --quiet "$@"
}

n=$("$B" train experiments/recall/recall-cpu.json --array-count)
for s in 1 2 3; do
    dir=$OUT/recall-cpu
    [ "$s" = 1 ] || dir=$OUT/recall-cpu-seed$s
    for i in $(seq 0 $((n - 1))); do entry recall-cpu "$i" "$dir" --set "seed=$s" "$@"; done
done
for c in recall-wide-cpu recall-length-cpu recall-pairs-cpu; do
    n=$("$B" train "experiments/recall/$c.json" --array-count)
    for i in $(seq 0 $((n - 1))); do entry "$c" "$i" "$OUT/$c" "$@"; done
done
mkdir -p "$(dirname "$PLOT")"
/usr/bin/env python3 experiments/recall/table.py "$OUT" --plot "$PLOT"
