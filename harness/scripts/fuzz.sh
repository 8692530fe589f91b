#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ in build-fuzz (clang, AddressSanitizer and
# UBSan, every finding fatal; configured once) and runs each for SECONDS (default 30), or
# only the TARGETs named. test.sh runs all of them for 30 s each: CI's fuzz smoke.
#
#   harness/scripts/fuzz.sh [--jobs N] [SECONDS] [TARGET...]
#     --jobs N   targets run N at a time (default: the number of cores)
#
# Each run starts from the seeds in tests/fuzz/corpus/TARGET/ and from what earlier runs
# kept in build-fuzz/corpus/TARGET/ (new inputs go there, never into the repository).
# A crash, a leak, undefined behaviour, an input that runs over 10 s or an allocation
# over 2 GB stops that target and leaves its input in build-fuzz/artifacts/TARGET/ (to
# replay: build-fuzz/tests/fuzz/fuzz_TARGET FILE). Prints one line per target (runs,
# seconds, corpus, crashes), writes them as a table to build-fuzz/fuzz-summary.tsv, and
# ends with "fuzz: N targets, N runs, N crashed". Exit status 1 if a target crashed;
# 77 when clang with libFuzzer is not installed (setup.sh installs it), 0 otherwise.
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and clang start need it exported.
export PATH
cd "$(dirname "$0")/../.."
root=$(pwd)

jobs=$(nproc 2>/dev/null || echo 1)
if [ "${1:-}" = "--jobs" ]; then
    jobs=${2:?--jobs needs a number}
    shift 2
fi
secs=30
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
    secs=$1
    shift
fi
case "$jobs" in '' | *[!0-9]* | 0) echo "fuzz: --jobs $jobs: need a positive number" >&2; exit 2 ;; esac

if ! command -v clang >/dev/null 2>&1 ||
    ! echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d && n; }' |
        clang -fsanitize=fuzzer -x c - -o /dev/null >/dev/null 2>&1; then
    echo "fuzz: SKIP: needs clang with libFuzzer (Debian: clang libclang-rt-14-dev; harness/scripts/setup.sh)"
    exit 77
fi

# Configure once (a folder without build.ninja is what a failed setup left), then build
# only the fuzz targets and what they need.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [ ! -f build-fuzz/build.ninja ]; then
    rm -rf build-fuzz
    if ! CC=clang CXX=clang++ meson setup build-fuzz --buildtype=debugoptimized -Dfuzz=enabled -Dcuda=disabled -Dmpi=disabled \
        -Db_sanitize=address,undefined -Db_lundef=false \
        -Dc_args=-fno-sanitize-recover=all -Dcpp_args=-fno-sanitize-recover=all >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "fuzz: meson setup failed (whole log: build-fuzz/meson-logs/meson-log.txt)" >&2
        exit 1
    fi
fi
if ! ninja -C build-fuzz fuzz >"$log" 2>&1; then
    grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 60 >&2
    echo "fuzz: compilation failed" >&2
    exit 1
fi

# The targets: those named, else every fuzz_*.c of tests/fuzz/.
if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in tests/fuzz/fuzz_*.c; do
        t=$(basename "$f" .c)
        t=${t#fuzz_}
        [ "$t" = util ] || targets+=("$t")
    done
fi
for t in "${targets[@]}"; do
    if [ ! -x "build-fuzz/tests/fuzz/fuzz_$t" ]; then
        echo "fuzz: no target '$t' (tests/fuzz/fuzz_$t.c and its line in tests/fuzz/meson.build)" >&2
        exit 2
    fi
done

# One target: SECS seconds from a folder of its own (a config's relative data path finds
# nothing there), its result line in build-fuzz/results/TARGET.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_one() {
    local t=$1 out=$root/build-fuzz
    local corpus=$out/corpus/$t art=$out/artifacts/$t work=$out/run/$t
    mkdir -p "$corpus" "$art" "$work" "$out/logs" "$out/results"
    local before
    before=$(find "$art" -type f | wc -l)
    local start=$SECONDS rc=0
    (cd "$work" && "$out/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$art/" "$corpus" "$root/tests/fuzz/corpus/$t") \
        >"$out/logs/$t.log" 2>&1 || rc=$?
    local took=$((SECONDS - start))
    local runs crashes files
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/logs/$t.log" | tail -n 1)
    crashes=$(($(find "$art" -type f | wc -l) - before))
    [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes=1 # stopped without an artifact: still a failure
    files=$(find "$corpus" -type f | wc -l)
    printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$took" "${runs:-0}" "$files" "$crashes" >"$out/results/$t"
    if [ "$crashes" -gt 0 ]; then
        echo "fuzz: $t: CRASHED after $took s (log build-fuzz/logs/$t.log, input in build-fuzz/artifacts/$t/):"
        grep -a -E 'ERROR|runtime error|fuzz: |SUMMARY|Test unit written' "$out/logs/$t.log" | head -n 20
    else
        echo "fuzz: $t: ${runs:-0} runs in $took s, corpus $files, no crash"
    fi
}

rm -rf build-fuzz/results
running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    run_one "$t" &
    running=$((running + 1))
done
wait

summary=build-fuzz/fuzz-summary.tsv
printf 'target\tseconds\truns\tcorpus\tcrashes\n' >"$summary"
total_runs=0
crashed=0
for t in "${targets[@]}"; do
    line=$(cat "build-fuzz/results/$t")
    printf '%s\n' "$line" >>"$summary"
    IFS=$'\t' read -r _ _ runs _ crashes <<<"$line"
    total_runs=$((total_runs + runs))
    [ "$crashes" -gt 0 ] && crashed=$((crashed + 1))
done
echo "fuzz: ${#targets[@]} targets, $total_runs runs, $crashed crashed (table: $summary)"
[ "$crashed" -eq 0 ]
