#!/usr/bin/env bash
# Runs an attention sweep (attnbench bench CONFIG) as a Slurm job array: one task per
# point (`attnbench bench CONFIG --point I`, one variant at one length or context),
# then a merge job that waits for all of them (--dependency=afterok) and joins their
# documents into the sweep's run document (`attnbench merge`). Points whose documents
# are already there, finished and of this config, are left out, so submitting again
# after a failure runs only what is missing. Without Slurm (no sbatch on PATH) or with
# --local, the points run here one after the other, then the merge.
# experiments/sweep/CLUSTER.md says more.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: harness/scripts/slurm-sweep.sh CONFIG.json [options]

  --out FILE            the merged run document (default results/NAME.json); the
                        points' documents go beside it (FILE without .json, .point-I.json)
  --set KEY=VALUE       a config override, as attnbench bench --set (repeatable)
  --device cpu|cuda     where the attention runs (default cpu)
  --attnbench PATH      the binary (default $ATTNBENCH, else build/attnbench of this
                        checkout)
  --threads N           attnbench --threads in each task (default: the task's
                        SLURM_CPUS_PER_TASK, else all cores)
  --local               run the points here, one after the other, then merge
  --job-dir DIR         the job scripts and logs (default FILE's folder/slurm-NAME)
  --partition P, --time T, --cpus-per-task N, --mem M, --gres G
                        passed to sbatch for every task
  --max-parallel K      at most K tasks at once (--array=...%K)
  --sbatch-arg ARG      any other sbatch option, for every job (repeatable)
  --wait                wait for the merge job to end; exit status 0 when it merged
  --dry-run             write the job scripts and say what would be submitted
  --help                this text
EOF
}

die() { echo "slurm-sweep: error: $*" >&2; exit 2; }
say() { echo "slurm-sweep: $*" >&2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

# shellcheck source=harness/scripts/slurm-common.sh
. "$here/slurm-common.sh"

config="" out="" device="cpu" exe="${ATTNBENCH:-}" threads="" local_run=0 job_dir=""
max_parallel="" wait_jobs=0 dry_run=0
sets=() sbatch_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
        --help|-h) usage; exit 0 ;;
        --job-dir) [ $# -ge 2 ] || die "--job-dir needs a value"; job_dir=$2; shift 2 ;;
        *)
            slurm_option "$@"
            [ "$slurm_shift" -gt 0 ] || die "unknown option '$1' (see --help)"
            shift "$slurm_shift" ;;
    esac
done
# config and exe absolute: the jobs run in the folder sbatch was called from
# (--chdir), but the scripts say where everything is
slurm_check "$repo"

bench_args=(bench "$config" --device "$device")
[ ${#sets[@]} -eq 0 ] || bench_args+=("${sets[@]}")
[ -z "$out" ] || bench_args+=(--out "$(abspath "$out")")

# The points: index, kind, variant, len, document, done (attnbench bench --points).
points_tsv=$("$exe" --threads 1 "${bench_args[@]}" --points) || die "attnbench could not list the points (above)"
count=0 pending=() docs=()
while IFS=$'\t' read -r idx kind variant len doc done_; do
    [ "$idx" = "index" ] && continue
    count=$((count + 1))
    docs+=("$(abspath "$doc")")
    [ "$done_" = "1" ] || pending+=("$idx")
done <<<"$points_tsv"
[ "$count" -gt 0 ] || die "the sweep has no points"
merged=${docs[0]%.point-0.json}.json
name=$(basename "${merged%.json}")
say "$count points, ${#pending[@]} to run, $((count - ${#pending[@]})) already done; merged document $merged"

thread_args=()
[ -z "$threads" ] || thread_args=(--threads "$threads")
merge_cmd=("$exe" merge "${docs[@]}" --out "$merged")

if [ "$local_run" -eq 1 ] || ! command -v sbatch >/dev/null 2>&1; then
    [ "$local_run" -eq 1 ] || say "no sbatch on PATH: running the points here"
    for i in ${pending[@]+"${pending[@]}"}; do
        say "point $i of $count"
        status=0
        "$exe" ${thread_args[@]+"${thread_args[@]}"} "${bench_args[@]}" --point "$i" --quiet || status=$?
        # 1: the point failed (its document says so; merge marks the run failed); any
        # other failure (a bad config, an interrupt) ends the sweep
        [ "$status" -eq 0 ] || [ "$status" -eq 1 ] || die "point $i ended with status $status"
    done
    exec "${merge_cmd[@]}"
fi

[ -n "$job_dir" ] || job_dir="$(dirname "$merged")/slurm-$name"
mkdir -p "$job_dir"
job_dir=$(cd "$job_dir" && pwd)

# A command line as one line of shell, each word quoted.
quoted() { local w s=""; for w in "$@"; do s+=" $(printf '%q' "$w")"; done; printf '%s\n' "${s# }"; }

array_script="$job_dir/points.sbatch"
merge_script="$job_dir/merge.sbatch"
{
    echo "#!/usr/bin/env bash"
    echo "# written by harness/scripts/slurm-sweep.sh: one task per point of $name"
    echo "set -euo pipefail"
    echo "threads=()"
    if [ -n "$threads" ]; then
        echo "threads=(--threads $threads)"
    else
        echo '[ -z "${SLURM_CPUS_PER_TASK:-}" ] || threads=(--threads "$SLURM_CPUS_PER_TASK")'
    fi
    echo "exec $(quoted "$exe") \"\${threads[@]}\" $(quoted "${bench_args[@]}") --point \"\$SLURM_ARRAY_TASK_ID\" --quiet"
} >"$array_script"
{
    echo "#!/usr/bin/env bash"
    echo "# written by harness/scripts/slurm-sweep.sh: the merge of $name's points"
    echo "set -euo pipefail"
    echo "exec $(quoted "${merge_cmd[@]}")"
} >"$merge_script"
chmod +x "$array_script" "$merge_script"

common=(--parsable --chdir="$PWD" ${sbatch_opts[@]+"${sbatch_opts[@]}"})
array_job=""
if [ ${#pending[@]} -gt 0 ]; then
    list=$(IFS=,; echo "${pending[*]}")
    [ -z "$max_parallel" ] || list="$list%$max_parallel"
    array_cmd=(sbatch "${common[@]}" --job-name="ab-$name" --array="$list" --output="$job_dir/point-%a.out"
               "$array_script")
    if [ "$dry_run" -eq 1 ]; then
        say "would submit: $(quoted "${array_cmd[@]}")"
        array_job="ARRAY_JOB"
    else
        array_job=$("${array_cmd[@]}") || die "sbatch refused the array job (above)"
        array_job=${array_job%%;*}
        say "submitted array job $array_job: points $list"
    fi
fi
merge_cmdline=(sbatch "${common[@]}" --job-name="ab-$name-merge" --output="$job_dir/merge.out")
# afterok on an array job waits for every task; a failed task cancels the merge
# (kill-on-invalid-dep) instead of leaving it pending for ever
[ -z "$array_job" ] || merge_cmdline+=(--dependency="afterok:$array_job" --kill-on-invalid-dep=yes)
merge_cmdline+=("$merge_script")
if [ "$dry_run" -eq 1 ]; then
    say "would submit: $(quoted "${merge_cmdline[@]}")"
    exit 0
fi
merge_job=$("${merge_cmdline[@]}") || die "sbatch refused the merge job (above)"
merge_job=${merge_job%%;*}
say "submitted merge job $merge_job${array_job:+ (after job $array_job)}: $merged; logs in $job_dir"
[ "$wait_jobs" -eq 1 ] || exit 0

# --wait: until the merge job has left the queue (it ends, or is cancelled with its
# dependency), then its state as the controller remembers it (MinJobAge).
while [ -n "$(squeue -h -j "$merge_job" -o %i 2>/dev/null)" ]; do sleep 1; done
state=$(scontrol -o show job "$merge_job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
if [ "$state" = "COMPLETED" ] || { [ -z "$state" ] && [ -f "$merged" ]; }; then
    say "merged: $merged"
    exit 0
fi
say "the merge job $merge_job ended ${state:-(forgotten by the controller)} without a merged document; logs in $job_dir"
exit 1
