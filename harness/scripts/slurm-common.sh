# Sourced by slurm-sweep.sh and slurm-train.sh: the options both take and the checks of
# their values. The caller defines die() and the variables below before parsing.
#
# slurm_option "$@": when $1 is a shared option, stores it (out, sets, device, exe,
# threads, local_run, sbatch_opts, max_parallel, wait_jobs, dry_run, or config for a
# word that is no option) and sets slurm_shift to the words it used; 0 when $1 is the
# caller's own (or unknown) option.
slurm_option() {
    slurm_shift=2
    case "$1" in
        --out|--set|--device|--attnbench|--threads|--partition|--time|--cpus-per-task|--mem|--gres|--max-parallel|--sbatch-arg)
            [ $# -ge 2 ] || die "$1 needs a value" ;;
    esac
    case "$1" in
        --out) out=$2 ;;
        --set) sets+=(--set "$2") ;;
        --device) device=$2 ;;
        --attnbench) exe=$2 ;;
        --threads) threads=$2 ;;
        --partition|--time|--cpus-per-task|--mem|--gres) sbatch_opts+=("$1=$2") ;;
        --max-parallel) max_parallel=$2 ;;
        --sbatch-arg) sbatch_opts+=("$2") ;;
        --local) local_run=1; slurm_shift=1 ;;
        --wait) wait_jobs=1; slurm_shift=1 ;;
        --dry-run) dry_run=1; slurm_shift=1 ;;
        -*) slurm_shift=0 ;;
        *) [ -z "$config" ] || die "more than one config given ('$config' and '$1')"; config=$1; slurm_shift=1 ;;
    esac
}

abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }

# The values after parsing: the config, the device, the numbers and the binary (REPO:
# the repository root, where build/attnbench is by default); config and exe made
# absolute (the jobs run in the folder sbatch was called from).
slurm_check() {
    [ -n "$config" ] || die "a CONFIG.json is required (see --help)"
    [ -f "$config" ] || die "config '$config' is not a file"
    case "$device" in cpu|cuda) ;; *) die "--device $device: must be cpu or cuda" ;; esac
    local v
    for v in "$threads" "$max_parallel"; do
        case "$v" in *[!0-9]*) die "--threads and --max-parallel take a positive integer, not '$v'" ;; esac
    done
    [ -n "$exe" ] || exe="$1/build/attnbench"
    [ -x "$exe" ] || die "no attnbench binary at '$exe' (build it, or --attnbench PATH)"
    config=$(abspath "$config")
    exe=$(abspath "$exe")
}
