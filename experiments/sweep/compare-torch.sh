#!/usr/bin/env bash
# The side by side with PyTorch, from the repository alone: attnbench bench and its
# PyTorch eager peer (experiments/sweep/torch_bench.py) on the same sweep config, one
# after the other, with the same OPENBLAS_CORETYPE (whatever the environment has, or
# unset: both documents record it and the core type OpenBLAS chose) and the same thread
# count, then the ratio table (experiments/sweep/compare_torch.py).
#
#   bash experiments/sweep/compare-torch.sh [cpu|cuda] [--set KEY=VALUE]...
#
# --set options go to both sides (e.g. --set 'lengths=[256,512]' --set repeats=3).
# Environment:
#   THREADS     threads of both sides (attnbench --threads, torch_bench.py --threads,
#               OMP_NUM_THREADS); default 2
#   CONFIG      the sweep config; default experiments/sweep/compare-torch.json (cpu),
#               experiments/sweep/compare-torch-gpu.json (cuda)
#   OUT         folder of the results; default results
#   ATTNBENCH   an attnbench binary to use; default build/attnbench, built (or brought
#               up to date) with harness/scripts/build.sh
#   PYTHON      a python3 that imports torch; default the first of python3 and
#               /usr/bin/python3 that does. On cpu, when none does, Debian's
#               python3-torch (PyTorch 1.13, CPU only; large, so not in setup.sh's
#               list) is installed with apt-get. On cuda a CUDA build of PyTorch is
#               needed (Debian's has no CUDA): set PYTHON to a python3 that has one.
# Writes OUT/NAME.json and .tsv (ours), OUT/NAME-torch.json and .tsv (PyTorch) and
# OUT/NAME.md (the table), NAME from the config. Exit status: compare_torch.py's
# (2 when the two runs' BLAS core type or thread count differ), else the first
# failing step's.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the programs started here need it exported.
export PATH
cd "$(dirname "$0")/../.."

device=cpu
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    device=$1
    shift
fi
case "$device" in
    cpu) default_config=experiments/sweep/compare-torch.json ;;
    cuda) default_config=experiments/sweep/compare-torch-gpu.json ;;
    *) echo "compare-torch: error: device '$device': must be cpu or cuda" >&2; exit 2 ;;
esac
for a in "$@"; do
    case "$a" in
        --set|*=*) ;;
        *) echo "compare-torch: error: '$a': only --set KEY=VALUE options are passed on to both sides" >&2; exit 2 ;;
    esac
done
threads=${THREADS:-2}
if ! [[ "$threads" =~ ^[1-9][0-9]*$ ]]; then
    echo "compare-torch: error: THREADS=$threads: must be a positive integer" >&2
    exit 2
fi
config=${CONFIG:-$default_config}
out=${OUT:-results}
if [ ! -f "$config" ]; then
    echo "compare-torch: error: no config $config" >&2
    exit 2
fi
has_torch() { "$1" -c 'import torch' >/dev/null 2>&1; }
python=${PYTHON:-}
if [ -n "$python" ]; then
    if ! has_torch "$python"; then
        echo "compare-torch: error: PYTHON=$python cannot import torch" >&2
        exit 2
    fi
else
    for p in python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && has_torch "$p"; then
            python=$p
            break
        fi
    done
fi
if [ -z "$python" ]; then
    if [ "$device" = cuda ]; then
        echo "compare-torch: error: no python3 here imports torch; on cuda set PYTHON to a python3 with a CUDA build of PyTorch (Debian's python3-torch has no CUDA)" >&2
        exit 2
    fi
    echo "compare-torch: installing python3-torch (Debian's PyTorch, CPU only)"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
    python=/usr/bin/python3
    if ! has_torch "$python"; then
        echo "compare-torch: error: python3-torch is installed but $python cannot import torch" >&2
        exit 1
    fi
fi

name=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("name", ""))' "$config" 2>/dev/null || true)
if [ -z "$name" ]; then
    echo "compare-torch: error: $config is not a sweep config with a \"name\"" >&2
    exit 2
fi

exe=${ATTNBENCH:-}
if [ -z "$exe" ]; then
    bash harness/scripts/build.sh
    exe=build/attnbench
fi
if [ ! -x "$exe" ]; then
    echo "compare-torch: error: no attnbench binary at $exe" >&2
    exit 2
fi

mkdir -p "$out"
export OMP_NUM_THREADS=$threads
# Both sides on the same OpenBLAS kernels: the core attnbench runs with (it sets one
# where OpenBLAS falls back to generic kernels on a CPU it does not know; harness/blas.h).
[ -n "${OPENBLAS_CORETYPE:-}" ] || export OPENBLAS_CORETYPE="$("$exe" --blas-core)"
echo "compare-torch: $device, $threads threads, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}, config $config"
echo "compare-torch: attnbench ($exe)"
"$exe" --threads "$threads" bench "$config" --device "$device" --out "$out/$name.json" "$@"
echo "compare-torch: PyTorch ($python experiments/sweep/torch_bench.py)"
"$python" experiments/sweep/torch_bench.py "$config" --device "$device" --threads "$threads" \
    --out "$out/$name-torch.json" "$@"
echo
set +e
"$python" experiments/sweep/compare_torch.py "$out/$name.json" "$out/$name-torch.json" >"$out/$name.md"
rc=$?
set -e
cat "$out/$name.md"
[ "$rc" -eq 0 ] && echo "compare-torch: wrote $out/$name.json, $out/$name-torch.json, $out/$name.md"
exit "$rc"
