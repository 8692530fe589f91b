#!/usr/bin/env bash
# Runs a training array (attnbench train CONFIG --array-index I: entry I of the
# config's "array" of overrides, e.g. one seed each) as a Slurm job array, one task per
# entry, each in DIR/array-I. Entries whose run is finished (train.json with status
# "ok") are left out, so submitting again runs only the rest; a task whose folder
# holds a checkpoint continues it (--resume), one that stopped before its first
# checkpoint starts again (--overwrite). Without Slurm (no sbatch on PATH) or with
# --local, the entries run here one after the other. experiments/sweep/CLUSTER.md.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: harness/scripts/slurm-train.sh CONFIG.json [options]

  --out DIR             the array's folder (default results/CONFIG's file name without
                        .json); entry I runs in DIR/array-I
  --set KEY=VALUE       an override for every entry, after the entry's (repeatable)
  --device cpu|cuda     where it trains (default cpu)
  --attnbench PATH      the binary (default $ATTNBENCH, else build/attnbench of this
                        checkout)
  --threads N           attnbench --threads (default: SLURM_CPUS_PER_TASK, else all)
  --local               run the entries here, one after the other
  --partition P, --time T, --cpus-per-task N, --mem M, --gres G
                        passed to sbatch
  --max-parallel K      at most K tasks at once (--array=...%K)
  --sbatch-arg ARG      any other sbatch option (repeatable)
  --wait                wait until the array has left the queue; status 0 when every
                        entry finished ok
  --dry-run             write the job script and say what would be submitted
  --help                this text
USAGE
}

die() { echo "slurm-train: error: $*" >&2; exit 2; }
say() { echo "slurm-train: $*" >&2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

# shellcheck source=harness/scripts/slurm-common.sh
. "$here/slurm-common.sh"

config="" out="" device="cpu" exe="${ATTNBENCH:-}" threads="" local_run=0 max_parallel="" wait_jobs=0 dry_run=0
sets=() sbatch_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
        --help|-h) usage; exit 0 ;;
        *)
            slurm_option "$@"
            [ "$slurm_shift" -gt 0 ] || die "unknown option '$1' (see --help)"
            shift "$slurm_shift" ;;
    esac
done
slurm_check "$repo"
[ -n "$out" ] || out="results/$(basename "${config%.json}")"
out=$(abspath "$out")

count=$("$exe" train "$config" --array-count) || die "attnbench could not read the array (above)"
finished() { [ -f "$1/train.json" ] && grep -q '^ "status": "ok",\{0,1\}$' "$1/train.json"; }
pending=()
for ((i = 0; i < count; i++)); do finished "$out/array-$i" || pending+=("$i"); done
say "$count entries, ${#pending[@]} to run, $((count - ${#pending[@]})) finished; folders $out/array-I"

train_args=(train "$config" --device "$device" --out "$out" --quiet)
[ ${#sets[@]} -eq 0 ] || train_args+=("${sets[@]}")
# how a task starts in its folder: continue a checkpoint, replace a run that stopped
# before its first one, or start
task_mode='d=$1; mode=(); if [ -f "$d/checkpoint.bin" ]; then mode=(--resume); elif [ -f "$d/train.json" ]; then mode=(--overwrite); fi'

if [ "$local_run" -eq 1 ] || ! command -v sbatch >/dev/null 2>&1; then
    [ "$local_run" -eq 1 ] || say "no sbatch on PATH: running the entries here"
    failed=0
    for i in ${pending[@]+"${pending[@]}"}; do
        say "entry $i of $count"
        mode=()
        if [ -f "$out/array-$i/checkpoint.bin" ]; then mode=(--resume); elif [ -f "$out/array-$i/train.json" ]; then mode=(--overwrite); fi
        status=0
        "$exe" ${threads:+--threads "$threads"} "${train_args[@]}" --array-index "$i" ${mode[@]+"${mode[@]}"} || status=$?
        [ "$status" -eq 0 ] || { say "entry $i ended with status $status"; failed=$((failed + 1)); }
    done
    [ "$failed" -eq 0 ] || { say "$failed entries failed"; exit 1; }
    exit 0
fi
[ ${#pending[@]} -gt 0 ] || { say "nothing to run"; exit 0; }

job_dir="$out/slurm"
mkdir -p "$job_dir"
quoted() { local w s=""; for w in "$@"; do s+=" $(printf '%q' "$w")"; done; printf '%s\n' "${s# }"; }
script="$job_dir/train.sbatch"
{
    echo "#!/usr/bin/env bash"
    echo "# written by harness/scripts/slurm-train.sh: one task per entry of $(printf '%q' "$config")'s array"
    echo "set -euo pipefail"
    echo "i=\$SLURM_ARRAY_TASK_ID"
    echo "set -- $(printf '%q' "$out")/array-\$i"
    echo "$task_mode"
    echo "threads=()"
    if [ -n "$threads" ]; then echo "threads=(--threads $threads)"
    else echo '[ -z "${SLURM_CPUS_PER_TASK:-}" ] || threads=(--threads "$SLURM_CPUS_PER_TASK")'; fi
    echo "exec $(quoted "$exe") \"\${threads[@]}\" $(quoted "${train_args[@]}") --array-index \"\$i\" \"\${mode[@]}\""
} >"$script"
chmod +x "$script"
list=$(IFS=,; echo "${pending[*]}")
[ -z "$max_parallel" ] || list="$list%$max_parallel"
cmd=(sbatch --parsable --chdir="$PWD" ${sbatch_opts[@]+"${sbatch_opts[@]}"} --job-name="ab-train"
     --array="$list" --output="$job_dir/array-%a.out" "$script")
if [ "$dry_run" -eq 1 ]; then
    say "would submit: $(quoted "${cmd[@]}")"
    exit 0
fi
job=$("${cmd[@]}") || die "sbatch refused the array job (above)"
job=${job%%;*}
say "submitted array job $job: entries $list; logs in $job_dir"
[ "$wait_jobs" -eq 1 ] || exit 0
while [ -n "$(squeue -h -j "$job" -o %i 2>/dev/null)" ]; do sleep 1; done
bad=0
for i in "${pending[@]}"; do finished "$out/array-$i" || { say "entry $i did not finish (log $job_dir/array-$i.out)"; bad=1; }; done
[ "$bad" -eq 0 ] || exit 1
say "every entry finished"
