#!/usr/bin/env bash
# The GPU check in one command, on a GPU machine, in at most about 8 minutes: correctness
# first (one attention call on the device, then the GPU suites and the float64
# cross-check through --device cuda, side by side;
# then the kernel lab programs, when the build has them), then speed, one step at a time
# (the Figure 1 sweep on the GPU, the side by side with PyTorch, the linear-RNN family's
# sweep, the sampling speeds at
# the paper's MNIST and CIFAR-10 shapes). Each step runs under its own `timeout`, logs to
# one folder, and what it measured is kept whatever the others do; at the end everything
# goes into ONE archive and a summary is printed (each step: ok, failed, timeout,
# skipped (exit status 77, or nothing to run) or no-time, and its seconds).
#
#   bash harness/scripts/gpu-check.sh [--dry-run] [ARCHIVE]
#
# ARCHIVE: the .tar.gz to write (default $OUT/gpu-check.tar.gz when OUT is set, else
# gpu-check.tar.gz in the current folder). Runs from the pack of
# harness/scripts/gpu-pack.sh (wherever it was extracted: the pack's lib/ goes on
# LD_LIBRARY_PATH of our binaries only, and PACK_INFO gives the run documents their
# commit), or from a checkout built with CUDA on a machine that has the dependencies.
# Nothing here draws (the machines have no gnuplot): the figures are drawn afterwards
# from the JSON (attnbench plot, experiments/sweep/table.py, experiments/images/table.py).
#
# --dry-run: tiny sizes (the same steps, seconds each), to try the script's logic on a
# machine without a GPU: the GPU suites skip, and with ATTNBENCH=build/attnbench-emu the
# --device cuda steps run on the CPU emulator of the CUDA code (tests/scripts/gpu does).
#
# Environment:
#   ATTNBENCH  the binary (default build/attnbench beside this script's pack or checkout)
#   TESTS      the folder of the GPU suites (default build/tests)
#   THREADS    host threads of attnbench and PyTorch (default: all cores)
#   PYTHON     a python3 with numpy for the cross-check (default: the first of python3
#              and /usr/bin/python3 that imports numpy); compare-torch.sh finds the one
#              that imports torch itself
#   WORK       the folder of logs and results (default gpu-check/ beside build/; replaced)
#   XCHECK_PARTS, XCHECK_CASES, XCHECK_JOBS  the cross-check: PARTS runs side by side,
#              seeds 20240607, 20240608, .., of CASES cases each, JOBS cases at a time
#              in each (default 4 x 25, 3 at a time: on an H200 100 cases beside the
#              suites, and 40 alone in 44 s, gave no verdict one case at a time, each
#              case starting CUDA anew), a progress line every 5 cases
#   MNIST_BATCH, CIFAR_BATCH  the sampling batches of the recurrent modes (1024, 256:
#              the largest that ran on an H200 before `sample` sized its model for one
#              position; 4096 and 1024 ran out of its memory then);
#   MNIST_BIG_BATCH, CIFAR_BIG_BATCH  linear's batches after them (4096, 1024: its
#              recurrent sampling model holds one position's activations now, so the
#              batch is bounded by the state and the logits, not the whole sequence);
#   MNIST_RECOMPUTE_BATCH, CIFAR_RECOMPUTE_BATCH  those of softmax and lsh-1, which
#              cost the same per image at any batch (16, 4; as experiments/images/speed.sh)
#   BENCH_SET  --set options for both sweeps (default "time_budget_s=2": a point whose
#              single forward+backward takes over 2 s is "timeout" and the variant's
#              longer ones "skipped", and repeats shrink to stay near that, so one slow
#              variant cannot eat the sweep's budget)
#
# Time budgets (seconds; each step's `timeout`; the whole is held under TOTAL_BUDGET: a
# step that would pass it gets what is left, or is not run under 10 s: no-time):
#   the probe: `attnbench op --device cuda` on a tiny input (without a working
#   device the cross-check is left out: every step needing one fails in a second)   30
#   correctness, side by side: each GPU suite 110, each cross-check part 110, machine
#   facts 30                                                                      110
#   the lab programs (each at most LAB_EACH 20)                                    60
#   the chunked linear kernels with and without prefetch (lab versions 2, 13, 3, 14
#   at B=2 H=8 N=65536)                                                             30
#   figure1-gpu sweep (attnbench bench --device cuda)                             100
#   compare-torch.sh cuda (both sides and the table)                               80
#   rnn-family-gpu sweep (retention, gla, deltanet's two forms beside linear)       60
#   sampling: MNIST linear, stateful-softmax, softmax and lsh-1 (estimated), 15 each;
#   CIFAR-10 linear, stateful-softmax, softmax (estimated), 30 each (a whole-image
#   point that times out is measured again by --estimate 256, from what is left)  150
#   a profile of MNIST linear's sampling (nsys, where the machine has it: kernels and
#   CUDA calls by time)                                                             40
#   a profile of the chunked linear kernels (ncu, where the machine has it and lets it
#   read the counters: speed of light, stalls, memory), without and with prefetch  40 + 40
#   MNIST linear at batch 1 with and without a CUDA graph of the step (sample --graph),
#   and with it at the batches above: 15, 15, 15, 30; then linear's larger batches   75
#   archive                                                                         ~5
#   in all (TOTAL_BUDGET; the probe takes a second or two on a GPU; the H200's
#   run took 306 s of it)                                                          460
# Exit status 0 when every step is ok or skipped, 1 otherwise, 2 on bad arguments.
# Budgets, batches and sizes can be changed through the environment (B_PHASE1, B_BENCH,
# ..., TOTAL_BUDGET: the names in the code below).
set -uo pipefail
export PATH
caller=$(pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

dry=0 archive=""
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) dry=1; shift ;;
    -h | --help) sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-check: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$archive" ] || { echo "gpu-check: error: one ARCHIVE ('$archive' and '$1' given)" >&2; exit 2; }
       archive=$1; shift ;;
    esac
done
[ -n "$archive" ] || archive=${OUT:+$OUT/}gpu-check.tar.gz
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
archive=$(abspath "$archive")
mkdir -p "$(dirname "$archive")" || { echo "gpu-check: error: cannot make the folder of $archive" >&2; exit 2; }
exe=$(abspath "${ATTNBENCH:-$root/build/attnbench}")
tests=$(abspath "${TESTS:-$root/build/tests}")
work=$(abspath "${WORK:-$root/gpu-check}")
[ -x "$exe" ] || { echo "gpu-check: error: no attnbench binary at $exe (ATTNBENCH names one)" >&2; exit 2; }
if [ -e "$work" ] && [ ! -d "$work/steps" ]; then # replaced only when an earlier check made it
    echo "gpu-check: error: WORK=$work exists and is not the folder of an earlier gpu-check" >&2
    exit 2
fi
cd "$root"

# ---- budgets (seconds) ----
B_PHASE1=${B_PHASE1:-110} B_INFO=${B_INFO:-30} B_LAB=${B_LAB:-60} LAB_EACH=${LAB_EACH:-20} B_BENCH=${B_BENCH:-100}
B_TORCH=${B_TORCH:-80} B_RNN=${B_RNN:-60} B_MNIST=${B_MNIST:-15} B_CIFAR=${B_CIFAR:-30} B_FALLBACK=${B_FALLBACK:-15}
B_PROFILE=${B_PROFILE:-40} B_NCU=${B_NCU:-40} B_PF=${B_PF:-30}
TOTAL_BUDGET=${TOTAL_BUDGET:-460}

rm -rf "$work"
mkdir -p "$work/logs" "$work/results" "$work/tmp" "$work/bin" "$work/steps" || exit 2
logs=$work/logs res=$work/results
t_start=$(date +%s)

say() { echo "$*" | tee -a "$work/gpu-check.log"; }

# Our binaries load the pack's libraries (and CUDA's); python3 and the rest keep theirs.
libs=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d "$root/lib" ] && libs=$root/lib:$libs
{
    echo '#!/usr/bin/env bash'
    printf 'LD_LIBRARY_PATH=%q exec %q "$@"\n' "$libs" "$exe"
} >"$work/bin/attnbench"
chmod +x "$work/bin/attnbench"
ab=$work/bin/attnbench

export ATTNBENCH_PLOTS=$root/plots ATTNBENCH_TEST_DIR=$work/tmp
if [ -f "$root/PACK_INFO" ]; then
    ATTNBENCH_GIT_COMMIT=$(sed -n 's/^commit=//p' "$root/PACK_INFO")
    ATTNBENCH_GIT_DIRTY=$(sed -n 's/^dirty=//p' "$root/PACK_INFO")
    ATTNBENCH_GIT_DIFF_SHA1=$(sed -n 's/^diff_sha1=//p' "$root/PACK_INFO")
    [ -n "$ATTNBENCH_GIT_COMMIT" ] && export ATTNBENCH_GIT_COMMIT ATTNBENCH_GIT_DIRTY ATTNBENCH_GIT_DIFF_SHA1
    cp "$root/PACK_INFO" "$work/"
fi
threads=${THREADS:-$(nproc 2>/dev/null || echo 4)}
python=${PYTHON:-}
if [ -z "$python" ]; then
    for p in python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import numpy' >/dev/null 2>&1; then python=$p; break; fi
    done
fi
torch_python=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    # compare-torch cuda needs PyTorch with CUDA and a device (Debian's python3-torch has no CUDA)
    if command -v "$p" >/dev/null 2>&1 &&
        "$p" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
        torch_python=$p
        break
    fi
done

# ---- steps ----
# Each step: NAME, a budget, a command; its output in logs/NAME.log, its result in
# steps/NAME (status seconds budget exit-status note). `order` lists the names.
order=()
# The budget a step gets: its own, or what is left of TOTAL_BUDGET (0: none left).
budget() {
    local left=$((TOTAL_BUDGET - ($(date +%s) - t_start) - 5))
    [ "$1" -le "$left" ] && echo "$1" || echo $((left < 10 ? 0 : left))
}
record() { # NAME STATUS MS BUDGET RC NOTE
    printf '%s\t%s\t%d.%d\t%s\t%s\t%s\n' "$1" "$2" $(($3 / 1000)) $(($3 % 1000 / 100)) "$4" "$5" "$6" >"$work/steps/$1"
    say "gpu-check: $(printf '%-36s %-8s %6d.%d s (budget %s s)%s' "$1" "$2" $(($3 / 1000)) $(($3 % 1000 / 100)) "$4" "${6:+: $6}")"
}
run_step() { # NAME BUDGET COMMAND...
    local name=$1 b=$2
    shift 2
    if [ "$b" -le 0 ]; then
        record "$name" no-time 0 0 - "no time left in TOTAL_BUDGET=$TOTAL_BUDGET"
        return
    fi
    local t0 rc=0 st
    t0=$(date +%s%N)
    # in a subshell whose stderr is the log too: the shell's "Killed" line goes there
    (
        timeout --kill-after=10 "$b" "$@" </dev/null
        exit $?
    ) >"$logs/$name.log" 2>&1 || rc=$?
    local ms=$((($(date +%s%N) - t0) / 1000000))
    case "$rc" in
    0) st=ok ;;
    77) st=skipped ;;
    124 | 137) st=timeout ;;
    *) st=failed ;;
    esac
    local note
    note=$(grep -v '^[[:space:]]*$' "$logs/$name.log" | tail -n 1 | cut -c1-150)
    record "$name" "$st" "$ms" "$b" "$rc" "$([ "$st" = ok ] || echo "$note")"
}
skip_step() { # NAME WHY
    order+=("$1")
    record "$1" skipped 0 0 - "$2"
}
# In the foreground, or (bg) in the background with its PID in `pids`.
step() {
    order+=("$1")
    run_step "$@"
}
pids=()
bg_step() {
    order+=("$1")
    run_step "$@" &
    pids+=($!)
}

say "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ) $root$([ "$dry" = 1 ] && echo ' (dry run: tiny sizes)')"
say "gpu-check: attnbench $exe, $threads threads, python3 for numpy: ${python:-none}, for torch: ${torch_python:-none}"

# ---- 1. correctness, side by side ----
# First one attention call on the device: without a usable one, each step that needs it
# fails at once with the same one line, and the cross-check (500 failing cases) is left out.
probe() {
    "$ab" inputs --shape 1,2,5,3,3 --seed 1 --out "$work/tmp/probe" >/dev/null &&
        "$ab" op --variant softmax --causal --q "$work/tmp/probe/q.npy" --k "$work/tmp/probe/k.npy" \
            --v "$work/tmp/probe/v.npy" --device cuda --out "$work/tmp/probe/out"
}
export -f probe
export work ab
step cuda-probe "$(budget 30)" bash -c probe
cuda_ok=0
grep -q '^[^	]*	ok' "$work/steps/cuda-probe" && cuda_ok=1
info() {
    echo "== nvidia-smi"
    nvidia-smi 2>&1 || echo "(no nvidia-smi)"
    echo "== cpu"
    nproc
    grep -m1 'model name' /proc/cpuinfo
    echo "== os"
    cat /etc/os-release 2>/dev/null | head -n 2
    echo "== python"
    for p in "$python" "$torch_python"; do
        [ -n "$p" ] && "$p" -c 'import sys; print(sys.executable, sys.version.split()[0])
try:
    import numpy; print("numpy", numpy.__version__)
except Exception as e: print("numpy:", e)
try:
    import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
except Exception as e: print("torch:", e)'
    done
    echo "== libraries of attnbench"
    LD_LIBRARY_PATH=$libs ldd "$exe"
    echo "== attnbench list"
    "$ab" list | head -n 20
}
export -f info
export python torch_python libs exe ab
bg_step machine "$(budget $B_INFO)" bash -c info
b1=$(budget $B_PHASE1)
suites=()
if [ -d "$tests" ]; then
    while IFS= read -r t; do suites+=("$t"); done < <(find "$tests" -maxdepth 1 -type f -perm -u+x -name 'test_*cuda*' ! -name '*emu*' | sort)
fi
if [ ${#suites[@]} -eq 0 ]; then
    skip_step suites "no GPU suites (test_*cuda*) in $tests"
fi
for t in "${suites[@]}"; do
    bg_step "suite-$(basename "$t")" "$b1" env LD_LIBRARY_PATH="$libs" OMP_NUM_THREADS=2 "$t" --jobs 1
done
parts=${XCHECK_PARTS:-4} cases=${XCHECK_CASES:-25} xjobs=${XCHECK_JOBS:-3}
[ "$dry" = 1 ] && parts=${XCHECK_PARTS:-2} cases=${XCHECK_CASES:-3}
if [ -z "$python" ]; then
    skip_step crosscheck "no python3 with numpy"
elif [ "$cuda_ok" = 0 ]; then
    skip_step crosscheck "--device cuda does not work here (step cuda-probe)"
else
    for k in $(seq 1 "$parts"); do
        bg_step "crosscheck-$k" "$b1" env OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1 "$python" tests/crosscheck/xcheck.py "$ab" --device cuda \
            --cases "$cases" --seed $((20240606 + k)) --progress 5 --jobs "$xjobs"
    done
fi
# each by its number: a bare `wait` would also wait for tee and the like
for pid in "${pids[@]}"; do wait "$pid"; done

# ---- 2. the kernel lab programs (lab_* executables, or in attention/lab/), at their defaults ----
# The real programs (nvcc); in a dry run their emulated twins (lab_*_emu) instead, at a
# small shape and validation only (--check), as the lab_* tests run them.
labs=() lab_args=()
if [ "$dry" = 1 ]; then
    lab_pick=(-name 'lab_*_emu')
    lab_args=(--check --shape 1,2,64,16,16)
else
    lab_pick=(! -name '*_emu' \( -name 'lab_*' -o -path '*/attention/lab/*' \))
fi
while IFS= read -r l; do labs+=("$l"); done < <(find "$(dirname "$exe")" -type f -perm -u+x ! -name '*.so*' \
    "${lab_pick[@]}" 2>/dev/null | sort)
if [ ${#labs[@]} -eq 0 ]; then
    skip_step lab "no lab programs (lab_*) in this build"
else
    lab_end=$(($(date +%s) + B_LAB))
    for l in "${labs[@]}"; do
        left=$((lab_end - $(date +%s)))
        b=$(budget $((left < LAB_EACH ? left : LAB_EACH)))
        step "lab-$(basename "$l")" "$b" env LD_LIBRARY_PATH="$libs" "$l" "${lab_args[@]}"
    done
fi
# The chunked linear kernels with and without prefetch (lab versions 2, 13 fp32; 3, 14
# tf32) at the issue's shape B=2 H=8 N=65536, D=M=64: whether a chunk's loads were what
# the 20-40 us a chunk went to (attention/linear_cuda.cu, the fused path's notes).
lab_lc=$(find "$(dirname "$exe")" -type f -perm -u+x -name lab_linear_chunk 2>/dev/null | head -n 1)
pf_lab=$lab_lc pf_args=(--shape 2,8,65536,64,64 --reps 10)
if [ "$dry" = 1 ]; then
    pf_lab=$(find "$(dirname "$exe")" -type f -perm -u+x -name lab_linear_chunk_emu 2>/dev/null | head -n 1)
    pf_args=(--check --shape 1,2,100,16,16)
fi
if [ -z "$pf_lab" ]; then
    skip_step lab-linear-chunk-prefetch "no lab_linear_chunk in this build"
else
    step lab-linear-chunk-prefetch "$(budget $B_PF)" env LD_LIBRARY_PATH="$libs" bash -c \
        'l=$1; shift; rc=0; for v in 2 13 3 14; do "$l" "$@" --version $v || rc=1; done; exit $rc' _ "$pf_lab" "${pf_args[@]}"
fi

# ---- 3. speed, one at a time ----
read -r -a bench_set <<<"${BENCH_SET-time_budget_s=2}"
sets=()
for s in "${bench_set[@]}"; do sets+=(--set "$s"); done
# figure1-gpu's batch rule is scaled (tokens), compare-torch-gpu's fixed (size)
fig_sets=() cmp_sets=()
if [ "$dry" = 1 ]; then
    sets+=(--set 'lengths=[16,32]' --set heads=1 --set qk_dim=4 --set v_dim=4 --set repeats=1
        --set warmup=0 --set gemm.size=16 --set 'recurrent.contexts=[8]' --set recurrent.steps=2)
    fig_sets=(--set batch.tokens=32) cmp_sets=(--set batch.size=1)
fi
step bench-figure1-gpu "$(budget $B_BENCH)" "$ab" --threads "$threads" bench experiments/sweep/figure1-gpu.json \
    --device cuda --out "$res/figure1-gpu.json" "${sets[@]}" ${fig_sets[@]+"${fig_sets[@]}"}
if [ -z "$torch_python" ]; then
    skip_step compare-torch-cuda "no python3 here has PyTorch with a CUDA device"
else
    step compare-torch-cuda "$(budget $B_TORCH)" env THREADS="$threads" OUT="$res" ATTNBENCH="$ab" \
        PYTHON="$torch_python" bash experiments/sweep/compare-torch.sh cuda "${sets[@]}" ${cmp_sets[@]+"${cmp_sets[@]}"}
fi

step bench-rnn-family-gpu "$(budget $B_RNN)" "$ab" --threads "$threads" bench experiments/sweep/rnn-family-gpu.json \
    --device cuda --out "$res/rnn-family-gpu.json" "${sets[@]}"

# sampling speed: images/s at a batch, with initialised weights (the time does not
# depend on them; `sample --config`), each variant in its own mode: linear as an RNN,
# stateful-softmax with its key/value cache (softmax's weights), softmax and lsh by
# recomputing every prefix, estimated from every E-th position (`--estimate E`)
mb=${MNIST_BATCH:-1024} cb=${CIFAR_BATCH:-256} mrb=${MNIST_RECOMPUTE_BATCH:-16} crb=${CIFAR_RECOMPUTE_BATCH:-4}
mbb=${MNIST_BIG_BATCH:-4096} cbb=${CIFAR_BIG_BATCH:-1024}
tiny=()
if [ "$dry" = 1 ]; then
    mb=2 cb=2 mrb=2 crb=2 mbb=4 cbb=4
    tiny=(--set model.layers=1 --set model.d_model=16 --set model.heads=2 --set model.d_ff=16 --set model.dropout=0)
fi
# The task reads its data even for an initialised model: data/SHAPE of the pack or
# checkout when it holds the files (gpu-pack.sh --mnist, experiments/images/get-data.sh),
# else random images of the shape in WORK/data (16 MNIST training and 8 test images; 2
# records per CIFAR-10 file): only the shape matters for speed.
make_data() { # SHAPE -> the folder (SHAPE tiny: MNIST's files of 4 x 4 images)
    local shape=$1 d=$root/data/$1
    if [ "$shape" = mnist ] && { [ -f "$d/t10k-labels-idx1-ubyte" ] || [ -f "$d/t10k-labels-idx1-ubyte.gz" ]; }; then
        echo "$d"
        return
    fi
    if [ "$shape" = cifar10 ] && { [ -f "$d/test_batch.bin" ] || [ -f "$d/cifar-10-batches-bin/test_batch.bin" ]; }; then
        echo "$d"
        return
    fi
    d=$work/data/$shape
    mkdir -p "$d"
    "${python:-python3}" - "$shape" "$d" <<'EOF'
import random, struct, sys
shape, d = sys.argv[1], sys.argv[2]
rng = random.Random(20240607)
rand = lambda n: bytes(rng.getrandbits(8) for _ in range(n))
if shape in ("mnist", "tiny"):
    side = 28 if shape == "mnist" else 4
    for prefix, n in (("train", 16), ("t10k", 8)):
        with open("%s/%s-images-idx3-ubyte" % (d, prefix), "wb") as f:
            f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, side, side) + rand(n * side * side))
        with open("%s/%s-labels-idx1-ubyte" % (d, prefix), "wb") as f:
            f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + bytes(rng.randrange(10) for _ in range(n)))
else:
    for name in ["data_batch_%d.bin" % i for i in range(1, 6)] + ["test_batch.bin"]:
        with open("%s/%s" % (d, name), "wb") as f:
            for _ in range(2):
                f.write(bytes([rng.randrange(10)]) + rand(3 * 32 * 32))
EOF
    echo "$d"
}
if [ "$dry" = 1 ]; then
    # both shapes read 4 x 4 images (cifar10's configs with dataset mnist): seconds on
    # the emulator, where the paper's 784 and 3,072 values take minutes
    mnist_dir=$(make_data tiny) cifar10_dir=$mnist_dir
    tiny+=(--set task.dataset=mnist)
else
    mnist_dir=$(make_data mnist) cifar10_dir=$(make_data cifar10)
fi
say "gpu-check: data for the sampling speeds: $mnist_dir, $cifar10_dir"
# sample_point SHAPE VARIANT BATCH BUDGET [ESTIMATE_EVERY] [graph]
sample_point() {
    local shape=$1 v=$2 b=$3 bud=$4 every=${5:-} graph=${6:-} cfg args=() data=$mnist_dir
    [ "$shape" = cifar10 ] && data=$cifar10_dir
    case "$v" in
    stateful-softmax) cfg=experiments/images/$shape-softmax.json; args+=(--variant stateful-softmax) ;;
    *) cfg=experiments/images/$shape-$v.json ;;
    esac
    [ -n "$graph" ] && args+=(--graph)
    local name=sample-$shape-$v-b$b${every:+-e$every}${graph:+-graph}
    step "$name" "$(budget "$bud")" "$ab" --threads "$threads" sample --config "$cfg" --set "task.path=$data" \
        --set eval_rows=0 "${tiny[@]}" "${args[@]}" ${every:+--estimate "$every"} --device cuda --n "$b" --batch "$b" \
        --seed 1 --out "$res/$name"
    # a whole image that takes too long (sample keeps nothing when stopped): the estimate
    if [ -z "$every" ] && grep -q '^[^	]*	timeout' "$work/steps/$name"; then
        step "$name-e256" "$(budget $B_FALLBACK)" "$ab" --threads "$threads" sample --config "$cfg" \
            --set "task.path=$data" --set eval_rows=0 "${tiny[@]}" "${args[@]}" --estimate 256 --device cuda \
            --n "$b" --batch "$b" --seed 1 --out "$res/$name-e256"
    fi
}
sample_point mnist linear "$mb" $B_MNIST
sample_point mnist stateful-softmax "$mb" $B_MNIST
sample_point mnist softmax "$mrb" $B_MNIST 49
sample_point mnist lsh-1 "$mrb" $B_MNIST 49
sample_point cifar10 linear "$cb" $B_CIFAR
sample_point cifar10 stateful-softmax "$cb" $B_CIFAR
sample_point cifar10 softmax "$crb" $B_CIFAR 384
# Where a sampling step's time goes: nsys's summary tables (GPU kernels, CUDA API calls,
# memory copies) of MNIST linear sampling whole images at its batch (as the step above);
# the report itself stays in WORK/tmp (too large to keep), the tables are the step's log.
# Optional: nsys failing or running out of its time is recorded as skipped, with why.
profile_sample() { # BUDGET NSYS COMMAND...
    local b=$1 rc=0
    shift
    timeout --kill-after=5 $((b > 15 ? b - 10 : 5)) "$@" || rc=$?
    [ "$rc" = 0 ] && return 0
    echo "gpu-check: the profile ended with status $rc (optional: recorded as skipped)"
    return 77
}
export -f profile_sample
nsys_bin=$(command -v nsys 2>/dev/null || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys \
    2>/dev/null | head -n 1)
if [ "$dry" = 1 ] || [ -z "$nsys_bin" ]; then
    skip_step profile-sample-mnist-linear "$([ "$dry" = 1 ] && echo "dry run" || echo "no nsys on this machine")"
else
    b=$(budget $B_PROFILE)
    step profile-sample-mnist-linear "$b" bash -c 'profile_sample "$@"' _ "$b" "$nsys_bin" profile --stats=true --force-overwrite true \
        -o "$work/tmp/profile-mnist-linear" "$ab" --threads "$threads" sample --config experiments/images/mnist-linear.json \
        --set "task.path=$mnist_dir" --set eval_rows=0 --device cuda --n "$mb" --batch "$mb" --seed 1 \
        --out "$work/tmp/profile-mnist-linear-sample"
fi
# Why the chunked linear kernels run at 1.6-4.6 TFLOP/s (attention/lab/README.md): Nsight
# Compute's speed of light, occupancy, warp stall reasons and memory tables of the first
# launches of the fused path (state, scan, forward, then the backward's), where the
# machine has ncu and lets it read the counters. Optional, like the profile above.
ncu_bin=$(command -v ncu 2>/dev/null || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null |
    head -n 1)
if [ "$dry" = 1 ]; then
    skip_step profile-linear-chunk "dry run"
elif [ -z "$ncu_bin" ]; then
    skip_step profile-linear-chunk "no ncu on this machine"
elif [ -z "$lab_lc" ]; then
    skip_step profile-linear-chunk "no lab_linear_chunk in this build"
else
    b=$(budget $B_NCU)
    step profile-linear-chunk "$b" bash -c 'profile_sample "$@"' _ "$b" env LD_LIBRARY_PATH="$libs" "$ncu_bin" \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section LaunchStats -k regex:lc_ -c 8 "$lab_lc" --shape 2,8,65536,64,64 --version 2 --reps 1
    # the same with prefetch (lab version 13): what bounds a chunk once its loads overlap
    b=$(budget $B_NCU)
    step profile-linear-chunk-prefetch "$b" bash -c 'profile_sample "$@"' _ "$b" env LD_LIBRARY_PATH="$libs" \
        "$ncu_bin" --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section LaunchStats -k regex:lc_ -c 8 "$lab_lc" --shape 2,8,65536,64,64 \
        --version 13 --reps 1
fi
# the steps' layers and head as one CUDA graph (sample --graph) beside the plain steps:
# at batch 1, where a step is its launches, and at the batches above
sample_point mnist linear 1 $B_MNIST
sample_point mnist linear 1 $B_MNIST "" graph
sample_point mnist linear "$mb" $B_MNIST "" graph
sample_point cifar10 linear "$cb" $B_CIFAR "" graph
# linear at the larger batches last: what is left of the budget, after the points above
sample_point mnist linear "$mbb" $B_MNIST
sample_point cifar10 linear "$cbb" $B_CIFAR

# ---- summary and archive ----
summary() {
    local total=$(($(date +%s) - t_start))
    echo "gpu-check: summary ($total s in all; logs and results in $(basename "$work")/)"
    printf '  %-36s %-8s %8s %8s\n' step status seconds budget
    for n in "${order[@]}"; do
        IFS=$'\t' read -r _ st secs b _ _ <"$work/steps/$n"
        printf '  %-36s %-8s %8s %8s\n' "$n" "$st" "$secs" "$b"
    done
    # the numbers worth a glance: suites' tallies, cross-check verdicts, the sweep's
    # points, images/s
    grep -h 'Synthesis' "$logs"/suite-*.log 2>/dev/null | sed 's/^/  /'
    grep -h -E '^crosscheck: (OK|FAILED|[0-9]+ cases)' "$logs"/crosscheck-*.log 2>/dev/null | sed 's/^/  /'
    local py=${python:-$torch_python}
    [ -n "$py" ] || py=python3
    "$py" - "$res" <<'EOF' 2>/dev/null || true
import collections, glob, json, os, sys
res = sys.argv[1]
for path in sorted(glob.glob(os.path.join(res, "*.json"))):
    if path.endswith("-torch.json"):
        continue
    try:
        doc = json.load(open(path))
    except Exception:
        continue
    st = collections.Counter(r.get("status") for r in doc.get("records", []))
    print("  %s: status %s, %d records (%s)" % (os.path.basename(path), doc.get("status"), sum(st.values()),
                                              ", ".join("%d %s" % (n, s) for s, n in sorted(st.items()))))
for path in sorted(glob.glob(os.path.join(res, "sample-*", "sample.json"))):
    d = json.load(open(path))
    g = d.get("graph") or {}
    print("  %-34s %10.4g images/s at batch %d (%s, %s%s)" % (os.path.basename(os.path.dirname(path)) + ":",
          d["images_per_s"] or float("nan"), d["batch"], d["mode"], d["method"],
          ", graph: %d launches" % g["launches"] if g.get("asked") and not g.get("note")
          else ", graph not used: %s" % g["note"] if g.get("asked") else ""))
EOF
}
summary | tee "$work/summary.txt"
tar -C "$(dirname "$work")" -czf "$archive.tmp" "$(basename "$work")" && mv "$archive.tmp" "$archive" &&
    say "gpu-check: wrote $archive ($(du -k "$archive" | cut -f1) KB)"
bad=0
for n in "${order[@]}"; do
    IFS=$'\t' read -r _ st _ <"$work/steps/$n"
    case "$st" in ok | skipped) ;; *) bad=1 ;; esac
done
exit $bad
