#!/usr/bin/env bash
# The GPU check's two scripts on a machine without a GPU, in seconds:
# harness/scripts/gpu-pack.sh packs this build (--from-build, with attnbench-emu), the
# pack is moved elsewhere (nothing may depend on where it was made), and the packed
# harness/scripts/gpu-check.sh runs its dry run there (tiny sizes, the --device cuda steps
# on the CPU emulator) with a gnuplot on PATH that fails. Checked: the pack's contents and
# that its binaries resolve every library they need from the pack (but glibc's, the C++
# runtime and CUDA's); the dry run's exit status, its summary, and the archive: every
# step's log, the sweep and the sampling documents complete (the commit from PACK_INFO,
# images/s), nothing lost to the failing gnuplot; refusals of bad arguments.
#
#   test_gpu_scripts.sh SOURCE_ROOT BUILD_ROOT [SANITIZE]
#
# Exit status 0, 1 with the failed checks listed, 77 (skipped) in a sanitized build.
set -uo pipefail
src=$1 build=$2 sanitize=${3:-none}
if [ -n "$sanitize" ] && [ "$sanitize" != none ]; then
    echo "gpu_scripts: SKIP: the pack is of a plain build (this one is sanitized: $sanitize)"
    exit 77
fi
pack_sh=$src/harness/scripts/gpu-pack.sh check_sh=$src/harness/scripts/gpu-check.sh
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
check() { # WHAT COMMAND...: the command must succeed
    local what=$1
    shift
    "$@" >/dev/null 2>&1 || fail "$what"
}

for s in "$pack_sh" "$check_sh"; do
    bash -n "$s" || fail "bash -n $s"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- bad arguments: one line, exit status 2 ----
refused() { # WHAT NEEDLE COMMAND...
    local what=$1 needle=$2 rc=0
    shift 2
    "$@" >"$tmp/refused.out" 2>"$tmp/refused.err" || rc=$?
    [ "$rc" = 2 ] || fail "$what: exit status $rc, want 2"
    [ "$(wc -l <"$tmp/refused.err")" = 1 ] && grep -q "error: .*$needle" "$tmp/refused.err" ||
        fail "$what: stderr $(cat "$tmp/refused.err")"
}
refused "gpu-pack without OUT_DIR" "OUT_DIR is required" bash "$pack_sh"
refused "gpu-pack --frob" "unknown option '--frob'" bash "$pack_sh" "$tmp/x" --frob
refused "gpu-pack --mnist of a folder without MNIST" "no train-images-idx3-ubyte" bash "$pack_sh" "$tmp/x" --mnist "$tmp"
refused "gpu-pack --from-build of a folder that is not a build" "not a configured meson build" \
    bash "$pack_sh" "$tmp/x" --from-build "$tmp"
refused "gpu-check two archives" "one ARCHIVE" bash "$check_sh" a.tar.gz b.tar.gz
refused "gpu-check without the binary" "no attnbench binary" \
    env ATTNBENCH="$tmp/none" bash "$check_sh" --dry-run "$tmp/x.tar.gz"
mkdir -p "$tmp/mine" && echo keep >"$tmp/mine/file"
refused "gpu-check with WORK a folder of something else" "not the folder of an earlier gpu-check" \
    env WORK="$tmp/mine" bash "$check_sh" --dry-run "$tmp/x.tar.gz"
[ -f "$tmp/mine/file" ] || fail "gpu-check removed a WORK folder it had not made"
[ ! -e "$tmp/x" ] || fail "a refused gpu-pack made its OUT_DIR"

# ---- the pack ----
if ! bash "$pack_sh" "$tmp/out" --from-build "$build" --with-emu --no-tar >"$tmp/pack.log" 2>&1; then
    cat "$tmp/pack.log"
    fail "gpu-pack.sh --from-build failed"
    exit 1
fi
grep -q '^gpu-pack: .*attnbench-gpu: [0-9.]* MB' "$tmp/pack.log" || fail "gpu-pack printed no size: $(cat "$tmp/pack.log")"
[ ! -e "$tmp/out/attnbench-gpu.tar.xz" ] || fail "--no-tar wrote an archive"
mkdir -p "$tmp/else/where"
mv "$tmp/out/attnbench-gpu" "$tmp/else/where/pk" # moved: nothing may point at the old place
p=$tmp/else/where/pk
for f in build/attnbench build/attnbench-emu build/libattnbench.so.0 build/tests/test_cuda build/tests/test_model_cuda \
    build/tests/test_ctc_cuda harness/scripts/gpu-check.sh experiments/sweep/figure1-gpu.json \
    experiments/sweep/compare-torch-gpu.json experiments/sweep/compare-torch.sh experiments/sweep/torch_bench.py \
    experiments/images/mnist-linear.json experiments/images/cifar10-softmax.json tests/crosscheck/xcheck.py \
    tests/crosscheck/xref.py plots/samples.gp PACK_INFO lib/libjansson.so.4; do
    [ -e "$p/$f" ] || fail "the pack lacks $f"
done
[ -e "$build/tests/test_cuda_selftest" ] && { [ -e "$p/build/tests/test_cuda_selftest" ] || fail "the pack lacks test_cuda_selftest"; }
[ -z "$(find "$p/build" -name '*emu*' -path '*tests*')" ] || fail "emulator suites packed: $(find "$p/build/tests" -name '*emu*')"
[ -z "$(find "$p/build" -name '*.p')" ] || fail "object folders packed"
[ ! -e "$p/experiments/sweep/runs" ] || fail "committed runs packed"
for l in libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 libcudart.so.13; do
    [ ! -e "$p/lib/$l" ] || fail "lib/$l packed (the GPU machine has its own)"
done
commit=$(sed -n 's/^commit=//p' "$p/PACK_INFO")
want=$(git -C "$src" rev-parse HEAD 2>/dev/null || true)
[ "$commit" = "$want" ] || fail "PACK_INFO commit '$commit', the checkout's '$want'"
# Every library of every packed binary comes from the pack (libattnbench too, beside the
# binaries), but the system's own.
for b in "$p"/build/attnbench "$p"/build/attnbench-emu "$p"/build/tests/test_*; do
    LD_LIBRARY_PATH=$p/lib ldd "$b" | awk '$2 == "=>" {print $1, $3}' |
        grep -v -E '^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libmvec)\.so|^ld-linux|^libstdc\+\+|^libgcc_s|^libcud|^libcublas' |
        while read -r name path; do
            case "$path" in "$p"/*) ;; *) echo "$(basename "$b"): $name from $path" ;; esac
        done
done >"$tmp/outside"
[ ! -s "$tmp/outside" ] || fail "libraries from outside the pack: $(cat "$tmp/outside")"

# ---- the dry run, from the moved pack, with a gnuplot that fails ----
# The run documents take their commit from PACK_INFO (here the build's source folder
# still answers git, so a commit of its own shows where it came from).
commit=0123456789abcdef0123456789abcdef01234567
sed -i "s/^commit=.*/commit=$commit/" "$p/PACK_INFO"
mkdir -p "$tmp/fakebin"
printf '#!/bin/sh\nprintf half > "$4"\nexit 1\n' >"$tmp/fakebin/gnuplot"
chmod +x "$tmp/fakebin/gnuplot"
rc=0
# (meson puts its build folder on LD_LIBRARY_PATH: away with it, the pack has its own)
(cd "$tmp" && env -u LD_LIBRARY_PATH PATH="$tmp/fakebin:$PATH" ATTNBENCH="$p/build/attnbench-emu" THREADS=2 \
    timeout 100 bash "$p/harness/scripts/gpu-check.sh" --dry-run gc.tar.gz) >"$tmp/check.log" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
    cat "$tmp/check.log"
    fail "the dry run: exit status $rc"
fi
a=$tmp/gc.tar.gz
[ -f "$a" ] || { fail "no archive $a"; exit 1; }
mkdir -p "$tmp/x" && tar -xzf "$a" -C "$tmp/x" || fail "the archive does not extract"
g=$tmp/x/gpu-check
steps="machine cuda-probe crosscheck-1 crosscheck-2 bench-figure1-gpu compare-torch-cuda bench-rnn-family-gpu
sample-mnist-linear-b2
sample-mnist-stateful-softmax-b2 sample-mnist-softmax-b2-e49 sample-mnist-lsh-1-b2-e49 sample-cifar10-linear-b2
sample-cifar10-stateful-softmax-b2 sample-cifar10-softmax-b2-e384 sample-mnist-linear-b4 sample-cifar10-linear-b4
sample-mnist-linear-b1 sample-mnist-linear-b1-graph sample-mnist-linear-b2-graph sample-cifar10-linear-b2-graph
suite-test_cuda suite-test_model_cuda
suite-test_ctc_cuda"
for s in $steps; do
    [ -f "$g/steps/$s" ] || { fail "no step $s"; continue; }
    st=$(cut -f2 "$g/steps/$s")
    case "$st" in ok | skipped) ;; *) fail "step $s: $st ($(cut -f6 "$g/steps/$s"))" ;; esac
    grep -q "^  $s  *$st " "$g/summary.txt" || fail "the summary lacks $s $st"
    [ "$s" = lab ] || [ "$s" = compare-torch-cuda ] || [ -f "$g/logs/$s.log" ] || fail "no log of $s"
done
# the lab programs: in a dry run their emulated twins, each validated (--check)
labs=$(cd "$g/steps" && ls lab-* 2>/dev/null)
[ -n "$labs" ] || fail "no lab steps"
for s in $labs; do
    [ "$(cut -f2 "$g/steps/$s")" = ok ] || fail "step $s: $(cut -f2 "$g/steps/$s")"
done
# linear's chunked kernels with and without prefetch: each of the four versions checked
for v in 2 13 3 14; do
    [ "$(grep -c "^version $v .*fwd+bwd .* ok" "$g/logs/lab-linear-chunk-prefetch.log" 2>/dev/null)" = 1 ] ||
        fail "lab-linear-chunk-prefetch: no checked fwd+bwd line of version $v"
done
for s in bench-figure1-gpu bench-rnn-family-gpu sample-mnist-linear-b2 sample-cifar10-softmax-b2-e384; do
    [ "$(cut -f2 "$g/steps/$s")" = ok ] || fail "$s did not run"
done
grep -q 'gpu-check: wrote .*gc.tar.gz' "$tmp/check.log" || fail "no line naming the archive"
python3 - "$g" "$commit" <<'EOF' || fail "the documents in the archive"
import glob, json, math, sys
g, commit = sys.argv[1], sys.argv[2]
bad = []
for name in ("figure1-gpu", "rnn-family-gpu"):
    d = json.load(open(g + "/results/%s.json" % name))
    if d["status"] != "ok" or not d["records"] or any(r["status"] != "ok" for r in d["records"]):
        bad.append("%s.json: status %s, %d records" % (name, d["status"], len(d["records"])))
    if d["git"]["commit"] != (commit or None):
        bad.append("%s.json: git %s, PACK_INFO %s" % (name, d["git"], commit))
samples = sorted(glob.glob(g + "/results/sample-*/sample.json"))
if len(samples) != 13:
    bad.append("%d sample.json, want 13" % len(samples))
for p in samples: # the steps as a CUDA graph where asked (the emulator records and launches it)
    gr = json.load(open(p)).get("graph") or {}
    want = p.endswith("-graph/sample.json")
    if bool(gr.get("asked")) != want or (want and (gr.get("note") is not None or not gr.get("launches"))):
        bad.append("%s: graph %s" % (p, gr))
for p in samples:
    s = json.load(open(p))
    if s["device"] != "cuda" or not (isinstance(s["images_per_s"], float) and s["images_per_s"] > 0):
        bad.append("%s: device %s, images/s %s" % (p, s["device"], s["images_per_s"]))
for p in glob.glob(g + "/results/sample-*/samples.png") + glob.glob(g + "/results/sample-*/*.tmp.*"):
    bad.append("%s: a failed drawing left a file" % p)
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
EOF
# the failing gnuplot was a warning in the sampling steps' logs, not an error
grep -q 'attnbench: warning: sample: .*samples.png not drawn' "$g/logs/sample-mnist-linear-b2.log" ||
    fail "no warning about the grid: $(cat "$g/logs/sample-mnist-linear-b2.log")"

# ---- back here: gpu_import.py takes the GPU machine's paths out of the documents ----
[ -f "$p/experiments/provenance.py" ] || fail "the pack lacks experiments/provenance.py (compare_torch.py imports it)"
imp=$src/harness/scripts/gpu_import.py
python3 "$imp" "$g" test-card --sweep "$tmp/imp/sweep" --images "$tmp/imp/images" >"$tmp/imp.log" 2>&1 ||
    fail "gpu_import: $(cat "$tmp/imp.log")"
[ -f "$tmp/imp/sweep/test-card/figure1-gpu.json" ] || fail "gpu_import wrote no figure1-gpu.json"
[ "$(ls "$tmp/imp/images/speed-gpu-test-card" | wc -l)" = 13 ] || fail "gpu_import: not 13 sample points"
! grep -rq -e "$p" -e 'attnbench-gpu/' "$tmp/imp" || fail "an imported document still names the pack's folder"
grep -q '"command": "build/attnbench-emu ' "$tmp/imp/sweep/test-card/figure1-gpu.json" ||
    fail "the imported command is not relative: $(grep -m1 '"command"' "$tmp/imp/sweep/test-card/figure1-gpu.json")"
echo '{"not": "a run"}' >"$tmp/imp/sweep/test-card/figure1-gpu.json"
rc=0
python3 "$imp" "$g" test-card --sweep "$tmp/imp/sweep" --images "$tmp/imp/images" >"$tmp/imp.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q 'not a bench run document: not replaced' "$tmp/imp.log" ||
    fail "gpu_import replaced a file that is no run document (exit $rc): $(cat "$tmp/imp.log")"
rc=0
python3 "$imp" "$tmp" Bad >"$tmp/imp.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "gpu_import with a bad card name: exit $rc"

if [ "$fails" -gt 0 ]; then
    echo "gpu_scripts: $fails checks failed"
    exit 1
fi
echo "gpu_scripts: OK (pack and dry run; $(sed -n 's/^gpu-check: summary (\([0-9]*\) s.*/\1/p' "$tmp/check.log") s of dry run)"
