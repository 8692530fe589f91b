#!/usr/bin/env bash
# The kernel lab's first runs on a GPU (the lists in attention/lab/README.md), each under
# its own `timeout`, the whole under a budget, one log per run and one summary:
#
#   bash attention/lab/first-runs.sh LAB_DIR LOG_DIR [BUDGET_S]
#
# LAB_DIR holds the nvcc-built lab_* programs (build/attention/lab, or the pack's);
# LOG_DIR gets NN-name.log per run and summary.txt (run, status, seconds). BUDGET_S
# (default 120): a run that would pass it gets what is left, or is not started under
# 5 s. Runs in priority order (the issue's shapes first), so a short budget keeps the
# ones that matter. Exit status 0 when every started run passed its checks, 1 otherwise,
# 2 on bad arguments.
set -uo pipefail
[ $# -ge 2 ] || { echo "first-runs: error: usage: first-runs.sh LAB_DIR LOG_DIR [BUDGET_S]" >&2; exit 2; }
lab=$1 logs=$2 total=${3:-120}
[ -d "$lab" ] || { echo "first-runs: error: no folder $lab" >&2; exit 2; }
case "$total" in '' | *[!0-9]*) echo "first-runs: error: BUDGET_S '$total' is not a whole number" >&2; exit 2 ;; esac
mkdir -p "$logs" || exit 2
t0=$(date +%s) runs=0 bad=0
: >"$logs/summary.txt"
# run EACH_S NAME PROGRAM ARGS... (PROGRAM relative to LAB_DIR; LAB_MAP=.. before it passes on)
run() {
    local each=$1 name=$2 envs=() prog
    shift 2
    while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
    prog=$lab/$1
    shift
    runs=$((runs + 1))
    local log
    log=$logs/$(printf "%02d" "$runs")-$name.log
    local left=$((total - ($(date +%s) - t0)))
    [ "$each" -le "$left" ] || each=$left
    if [ "$each" -lt 5 ]; then
        printf '%-40s %-8s %5s\n' "$name" no-time 0 >>"$logs/summary.txt"
        return
    fi
    if [ ! -x "$prog" ]; then
        printf '%-40s %-8s %5s\n' "$name" missing 0 >>"$logs/summary.txt"
        bad=1
        return
    fi
    local s rc=0 st
    s=$(date +%s)
    {
        echo "\$ ${envs[*]} $(basename "$prog") $*"
        env "${envs[@]}" timeout --kill-after=5 "$each" "$prog" "$@" </dev/null
    } >"$log" 2>&1 || rc=$?
    case "$rc" in 0) st=ok ;; 124 | 137) st=timeout ;; *) st=failed ;; esac
    [ "$st" = ok ] || bad=1
    printf '%-40s %-8s %5d\n' "$name" "$st" $(($(date +%s) - s)) >>"$logs/summary.txt"
}

# the issue's shapes: B=2 H=8 D=M=64 (flash, chunked linear), B=1 (steps); every
# version of each program at its default shape is gpu-check.sh's lab step, not here;
# N = 65536 is the sweeps' (the lab's float64 reference rows there take most of 20 s)
for n in 1024 4096 16384; do run 20 "flash-v10-$n" lab_flash_softmax --shape 2,8,$n,64,64 --version 10 --reps 5; done
for n in 1024 4096 16384; do run 20 "flash-v11-$n" lab_flash_softmax --shape 2,8,$n,64,64 --version 11 --reps 5; done
for m in favor poly; do run 25 "linear-chunk-$m" LAB_MAP=$m lab_linear_chunk; done
for n in 4096 65536; do run 15 "linear-chunk-elu-2x$n" LAB_MAP=elu lab_linear_chunk --shape 2,8,$n,64,64; done
for n in 1024 4096 16384 65536; do run 10 "decode-$n" lab_decode_step --shape 1,8,$n,64,64; done
run 10 decode-cifar-b64 lab_decode_step --shape 64,8,3072,32,32
run 10 linear-step-b1 lab_linear_step --shape 1,8,1,64,64
run 10 linear-step-b256 lab_linear_step --shape 256,8,1,32,32
run 10 copy lab_copy
# tuning questions (README): tiles, atomic dQ, D = 128, local's band
for v in 2 3 4 7 8; do run 15 "flash-v$v-16384" lab_flash_softmax --shape 2,8,16384,64,64 --version $v; done
run 20 flash-d128-4096 lab_flash_softmax --shape 2,8,4096,128,128
run 15 flash-window256-16384 lab_flash_softmax --shape 2,8,16384,64,64 --causal 1 --window 256
cat "$logs/summary.txt"
exit $bad
