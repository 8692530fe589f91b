#!/usr/bin/env bash
# harness/scripts/slurm-sweep.sh, in seconds, on a small sweep (sweep.json here: 8
# points of milliseconds each):
#
#   local: --local runs the points one after the other and merges; the merged document
#          holds an unsharded `attnbench bench` run's records point for point (apart
#          from times, rates and memory peaks: same_records.py); a resubmission runs
#          only the points whose documents are missing or damaged; the merged
#          document is drawn by `attnbench plot` and read by experiments/sweep/table.py;
#          the script's refusals of bad arguments; the training array
#          (train-array.json) with slurm-train.sh --local, again after an entry is lost.
#   slurm: the same sweep through a real Slurm: a one-node cluster of its own
#          (munged with its own key and socket, slurmctld and slurmd with a slurm.conf
#          in a temporary folder, loopback addresses, in a network namespace of its own
#          where one can be made, else on ports nobody listens on),
#          slurm-sweep.sh submits the array (one task per point) and the dependent
#          merge job; the merged document as above; a resubmission after two point
#          documents are lost submits only those two; the training array
#          (train-array.json, 3 seeds) through slurm-train.sh, each entry's losses
#          those of a run by hand. Every daemon it started is stopped on exit, also on
#          failure or SIGTERM (meson's timeout). Skipped (77) where they cannot run: not
#          root, Slurm or munge not installed, a daemon that does not start.
#
#   test_slurm.sh SOURCE_ROOT BUILD_ROOT SANITIZE local|slurm
#
# Exit status 0, 1 with the failed checks listed, 77 skipped (also in a sanitized build:
# the sanitized binary is tested by the Criterion suites sweep_merge and train_array).
set -uo pipefail
src=$1 build=$2 sanitize=${3:-none} mode=${4:-local}
name="slurm_scripts"
[ "$mode" = local ] && name="slurm_local_scripts"
skip() {
    echo "$name: SKIP: $*"
    exit 77
}
if [ -n "$sanitize" ] && [ "$sanitize" != none ]; then
    skip "the scripts are tested on the plain build (this one is sanitized: $sanitize)"
fi
# The Slurm part runs in a network namespace of its own where one can be made (root,
# unshare and ip: iproute2): its only interface is the loopback, so the daemons'
# ports (they listen on every address) are reachable from nowhere else and meet no
# one else's. Elsewhere it runs on the host's network, on ports nobody listens on.
if [ "$mode" = slurm ] && [ -z "${AB_SLURM_NETNS:-}" ] && [ "$(id -u)" -eq 0 ] &&
    command -v unshare >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 && unshare -n true 2>/dev/null; then
    exec unshare -n env AB_SLURM_NETNS=1 bash "$0" "$@"
fi
if [ -n "${AB_SLURM_NETNS:-}" ]; then
    # Slurm asks getaddrinfo for its listening address with AI_ADDRCONFIG, which wants
    # an IPv4 address besides 127/8: one of TEST-NET-1 (RFC 5737, never routed) on the
    # loopback, inside the namespace only
    { ip link set lo up && ip addr add 192.0.2.1/32 dev lo; } ||
        skip "the loopback of the test's network namespace would not come up"
fi
script=$src/harness/scripts/slurm-sweep.sh
train_script=$src/harness/scripts/slurm-train.sh
config=$src/tests/scripts/slurm/sweep.json
train_config=$src/tests/scripts/slurm/train-array.json
same=$src/tests/scripts/slurm/same_records.py
same_training=$src/tests/scripts/slurm/same_training.py
exe=$build/attnbench
export ATTNBENCH=$exe OMP_NUM_THREADS=1
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

tmp=$(mktemp -d)
chmod 711 "$tmp" # munged wants every folder above its socket searchable
pids=()          # the daemons started here, stopped in this order's reverse
cleanup() {
    if [ -n "${SLURM_CONF:-}" ] && [ ${#pids[@]} -gt 1 ]; then
        # the cluster is this test's own: every job on it is one of ours
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        [ -z "${jobs// /}" ] || scancel $jobs 2>/dev/null
    fi
    local i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill "${pids[i]}" 2>/dev/null
    done
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        local n=0
        while kill -0 "${pids[i]}" 2>/dev/null && [ $n -lt 50 ]; do
            sleep 0.1
            n=$((n + 1))
        done
        kill -9 "${pids[i]}" 2>/dev/null
        wait "${pids[i]}" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM # meson's timeout: the daemons are stopped all the same
trap 'exit 130' INT
trap 'exit 129' HUP

bash -n "$script" || fail "bash -n $script"
bash -n "$train_script" || fail "bash -n $train_script"

# An unsharded run of the sweep: what the merged documents are compared with; and
# the training array's entries run by hand, what the scripts' runs are compared with.
"$exe" --threads 1 bench "$config" --quiet --out "$tmp/full/slurm-test.json" || fail "the unsharded run"
n_train=$("$exe" train "$train_config" --array-count)
[ "$n_train" = 3 ] || fail "train --array-count: '$n_train', not 3"
for ((i = 0; i < 3; i++)); do
    "$exe" --threads 1 train "$train_config" --array-index "$i" --out "$tmp/tref" --quiet || fail "train --array-index $i"
done

if [ "$mode" = local ]; then
    # ---- bad arguments: one line, exit status 2 ----
    refused() { # WHAT NEEDLE COMMAND...
        local what=$1 needle=$2 out rc
        shift 2
        out=$("$@" 2>&1)
        rc=$?
        [ $rc -eq 2 ] || fail "$what: exit status $rc, not 2"
        case "$out" in *"$needle"*) ;; *) fail "$what: no '$needle' in: $out" ;; esac
    }
    refused "no config" "a CONFIG.json is required" bash "$script"
    refused "unknown option" "unknown option '--bogus'" bash "$script" "$config" --bogus
    refused "missing config" "is not a file" bash "$script" "$tmp/none.json"
    refused "bad device" "must be cpu or cuda" bash "$script" "$config" --device tpu
    refused "no binary" "no attnbench binary" bash "$script" "$config" --attnbench "$tmp/none"
    refused "bad config" "attnbench could not list" bash "$script" "$config" --set heads=0 --local

    out=$tmp/local/slurm-test.json
    bash "$script" "$config" --local --threads 1 --out "$out" 2>"$tmp/local1.err" || fail "--local: $(cat "$tmp/local1.err")"
    python3 "$same" "$out" "$tmp/full/slurm-test.json" || fail "--local: the merged document is not the full run's"
    grep -q "8 points, 8 to run, 0 already done" "$tmp/local1.err" || fail "--local: $(head -1 "$tmp/local1.err")"
    # a resubmission runs only what is missing: a point lost, one truncated
    rm -f "$out" "$tmp/local/slurm-test.point-3.json"
    head -c 100 "$tmp/local/slurm-test.point-7.json" >"$tmp/cut" && mv "$tmp/cut" "$tmp/local/slurm-test.point-7.json"
    bash "$script" "$config" --local --threads 1 --out "$out" 2>"$tmp/local2.err" || fail "--local again: $(cat "$tmp/local2.err")"
    grep -q "8 points, 2 to run, 6 already done" "$tmp/local2.err" || fail "--local again: $(head -1 "$tmp/local2.err")"
    grep -q "point 3 of 8" "$tmp/local2.err" && grep -q "point 7 of 8" "$tmp/local2.err" ||
        fail "--local again: not points 3 and 7: $(cat "$tmp/local2.err")"
    python3 "$same" "$out" "$tmp/full/slurm-test.json" || fail "--local again: the merged document is not the full run's"
    # as a normal run: table.py reads it, plot draws it (with gnuplot)
    python3 "$src/experiments/sweep/table.py" "$out" >"$tmp/table.md" || fail "table.py on the merged document"
    grep -q "lsh-1" "$tmp/table.md" || fail "table.py: no lsh-1 row"
    if command -v gnuplot >/dev/null 2>&1; then
        "$exe" plot "$out" --out "$tmp/local/fig" >/dev/null 2>&1 || fail "plot of the merged document"
        [ -s "$tmp/local/fig.png" ] || fail "plot: no fig.png"
    fi

    # the training array: every entry, then again after one was lost (only it runs)
    refused "train: no config" "a CONFIG.json is required" bash "$train_script"
    refused "train: no array" "no 'array'" bash "$train_script" "$config" --local
    bash "$train_script" "$train_config" --local --threads 1 --out "$tmp/tlocal" 2>"$tmp/t1.err" ||
        fail "slurm-train.sh --local: $(cat "$tmp/t1.err")"
    python3 "$same_training" 3 "$tmp/tref" "$tmp/tlocal" || fail "slurm-train.sh --local: not the entries' runs"
    rm -rf "$tmp/tlocal/array-1"
    bash "$train_script" "$train_config" --local --threads 1 --out "$tmp/tlocal" 2>"$tmp/t2.err" ||
        fail "slurm-train.sh --local again: $(cat "$tmp/t2.err")"
    grep -q "3 entries, 1 to run, 2 finished" "$tmp/t2.err" || fail "slurm-train.sh again: $(head -n 1 "$tmp/t2.err")"
    python3 "$same_training" 3 "$tmp/tref" "$tmp/tlocal" || fail "slurm-train.sh --local again: not the entries' runs"

    [ $fails -eq 0 ] && echo "$name: ok" || echo "$name: $fails failed"
    [ $fails -eq 0 ]
    exit
fi

# ---- a one-node Slurm of this test's own ----
[ "$(id -u)" -eq 0 ] || skip "starting slurmd and munged needs root (this is uid $(id -u))"
for c in munged slurmctld slurmd sbatch squeue sinfo scontrol scancel; do
    command -v "$c" >/dev/null 2>&1 || skip "no $c (Debian: munge slurmctld slurmd slurm-client; harness/scripts/setup.sh installs them)"
done
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/run"
chmod 700 "$tmp/munge"
head -c 1024 /dev/urandom >"$tmp/munge/munge.key"
chmod 600 "$tmp/munge/munge.key"
sock=$tmp/munge/munge.socket
munged -F -f --socket="$sock" --key-file="$tmp/munge/munge.key" --log-file="$tmp/log/munged.log" \
    --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" >"$tmp/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || skip "munged did not start: $(tail -n 3 "$tmp/log/munged.out" | tr '\n' ' ')"

# Two ports nobody listens on (a connection to them is refused), from one that
# depends on this process, so that two such tests apart do not meet.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=$((20000 + ($$ % 4000) * 2))
for _ in $(seq 200); do
    port_free "$port" && port_free $((port + 1)) && break
    port=$((port + 2))
done
hw=$(slurmd -C 2>/dev/null | head -n 1)
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
[ -n "$cpus" ] && [ -n "$mem" ] || skip "slurmd -C gave no CPUs and RealMemory: $hw"
cat >"$tmp/slurm.conf" <<EOF
# a one-node cluster for tests/scripts/slurm/test_slurm.sh
ClusterName=abtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
SlurmctldPort=$port
SlurmdPort=$((port + 1))
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=abtest Nodes=localhost Default=YES MaxTime=10 State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -i >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
idle=""
for _ in $(seq 150); do # 30 s
    idle=$(sinfo -h -n localhost -o %T 2>/dev/null)
    [ "$idle" = idle ] && break
    sleep 0.2
done
[ "$idle" = idle ] || skip "the node did not become idle in 30 s (state '${idle:-none}'): $(tail -n 2 "$tmp/log/slurmctld.out" "$tmp/log/slurmd.out" | tr '\n' ' ')"

t0=$(date +%s)
out=$tmp/sharded/slurm-test.json
timeout 120 bash "$script" "$config" --threads 1 --out "$out" --time 2 --wait 2>"$tmp/sbatch1.err" ||
    fail "slurm-sweep.sh --wait: $(cat "$tmp/sbatch1.err")"
grep -q "submitted array job [0-9]*: points 0,1,2,3,4,5,6,7$" "$tmp/sbatch1.err" || fail "no array of 8 tasks: $(cat "$tmp/sbatch1.err")"
n_logs=$(ls "$tmp/sharded/slurm-slurm-test"/point-*.out 2>/dev/null | wc -l)
[ "$n_logs" -eq 8 ] || fail "$n_logs task logs, not 8"
python3 "$same" "$out" "$tmp/full/slurm-test.json" || fail "the merged document is not the full run's"

# a resubmission: two points lost, only they are submitted
rm -f "$out" "$tmp/sharded/slurm-test.point-2.json" "$tmp/sharded/slurm-test.point-6.json"
timeout 120 bash "$script" "$config" --threads 1 --out "$out" --wait 2>"$tmp/sbatch2.err" ||
    fail "slurm-sweep.sh again: $(cat "$tmp/sbatch2.err")"
grep -q "8 points, 2 to run, 6 already done" "$tmp/sbatch2.err" || fail "again: $(head -n 1 "$tmp/sbatch2.err")"
grep -q "submitted array job [0-9]*: points 2,6$" "$tmp/sbatch2.err" || fail "again: not points 2,6: $(cat "$tmp/sbatch2.err")"
python3 "$same" "$out" "$tmp/full/slurm-test.json" || fail "again: the merged document is not the full run's"

# the training array on Slurm: a task per entry, each the entry's run
timeout 120 bash "$train_script" "$train_config" --threads 1 --out "$tmp/tslurm" --time 2 --wait 2>"$tmp/t3.err" ||
    fail "slurm-train.sh --wait: $(cat "$tmp/t3.err")"
grep -q "submitted array job [0-9]*: entries 0,1,2;" "$tmp/t3.err" || fail "slurm-train.sh: $(cat "$tmp/t3.err")"
python3 "$same_training" 3 "$tmp/tref" "$tmp/tslurm" || fail "slurm-train.sh: not the entries' runs"
echo "$name: the sweeps and the training array on Slurm took $(($(date +%s) - t0)) s${AB_SLURM_NETNS:+ (in a network namespace of its own)}"

[ $fails -eq 0 ] && echo "$name: ok" || echo "$name: $fails failed"
[ $fails -eq 0 ]
