# Shared by run-seeds.sh and run-longer.sh (sourced): the checks of their settings and
# where a seed's run lives. Messages are prefixed with the calling script's name.

# refuse MESSAGE: one line on stderr, exit status 2.
refuse() { echo "${0##*/}: $1" >&2; exit 2; }

# check_settings: JOBS is 1 or 2; PREFIX, if set, is a plain name (it becomes a folder name).
check_settings() {
    case "$JOBS" in 1|2) ;; *) refuse "JOBS must be 1 or 2, not '$JOBS'";; esac
    case "$PREFIX" in *[!A-Za-z0-9._-]*) refuse "PREFIX must be a plain name, not '$PREFIX'";; esac
}

# seed_run_dir SEED VARIANT: the folder of run-cpu.sh's / run-seeds.sh's run (seed 1
# without PREFIX is run-cpu.sh's results/copy-cpu-VARIANT).
seed_run_dir() {
    if [ -n "$PREFIX" ]; then
        echo "results/$PREFIX-seed$1-$2"
    elif [ "$1" = 1 ]; then
        echo "results/copy-cpu-$2"
    else
        echo "results/copy-cpu-seed$1-$2"
    fi
}
