#!/usr/bin/env bash
# Packs what a GPU machine without the project's dependencies needs to run
# harness/scripts/gpu-check.sh: a portable CUDA build, the shared libraries it loads,
# the configs and scripts of the runs, and data for the sampling speeds.
#
#   bash harness/scripts/gpu-pack.sh OUT_DIR [--mnist DIR] [--no-tar]
#                                    [--from-build DIR] [--with-emu]
#
#   --mnist DIR        MNIST's four IDX files (raw or .gz; experiments/images/get-data.sh
#                      puts them in data/mnist) go into the pack, gzip-compressed (11
#                      MB); without it gpu-check.sh samples on random images of MNIST's
#                      shape, as it does for CIFAR-10 (the speed does not depend on the
#                      data)
#   --no-tar           the folder only, no OUT_DIR/attnbench-gpu.tar.xz
#   --from-build DIR   pack the binaries of a build folder already built (no configure,
#                      no compilation); tests/scripts/gpu uses it with the plain build
#   --with-emu         pack attnbench-emu and the lab programs' emulated twins too (the
#                      CUDA code on the CPU emulator: `ATTNBENCH=build/attnbench-emu
#                      gpu-check.sh --dry-run` tries the pack on a machine without a GPU)
#
# The target machines (see harness/scripts/gpu-check.sh) run Ubuntu 24.04 with an H100 or
# H200, the NVIDIA driver, CUDA 13 (libcudart, libcublas), python3 with PyTorch and
# numpy, and no jansson, OpenBLAS, Criterion, gnuplot, libsndfile, FFTW or package
# registry. So the build here (in build-gpu/, configured once, ignored by git) is
# release, -march=x86-64-v3 instead of -march=native, with CUDA (sm_80, sm_90 and PTX),
# without the fuzz targets; only what the pack holds is compiled.
#
# Makes OUT_DIR/attnbench-gpu/ (replaced whole; it needs no network and runs from
# wherever it is extracted):
#   build/attnbench, build/libattnbench.so*, build/tests/test_*cuda* (the GPU suites, no
#   emulator ones), the kernel lab programs (executables lab_* or in attention/lab/, and
#   what a target `lab` builds) when the build has them,
#   lib/ (every library `ldd` names but glibc's, libstdc++, libgcc_s and CUDA's),
#   harness/scripts/gpu-check.sh, experiments/sweep/ (configs and scripts, no runs),
#   experiments/images/*.json, tests/crosscheck/, plots/, data/mnist with --mnist, and
#   PACK_INFO (the commit and how the pack was made).
# The binaries find libattnbench beside them ($ORIGIN); gpu-check.sh puts lib/ on
# LD_LIBRARY_PATH for them only (python3 keeps its own libraries), and tells the
# binaries where the pack is through the environment, not through build paths.
# Then OUT_DIR/attnbench-gpu.tar.xz, unless --no-tar. Prints the sizes.
# There:  tar -xJf attnbench-gpu.tar.xz && bash attnbench-gpu/harness/scripts/gpu-check.sh OUT.tar.gz
set -euo pipefail
# A shell started with no PATH in its environment has a default one it does not
# export; the compilers that meson and gcc start need it exported.
export PATH
cd "$(dirname "$0")/../.."
root=$(pwd)

die() {
    echo "gpu-pack: error: $*" >&2
    exit 2
}
out="" mnist="" tar=1 from="" emu=0
while [ $# -gt 0 ]; do
    case "$1" in
    --mnist) mnist=${2:?--mnist needs a folder}; shift 2 ;;
    --no-tar) tar=0; shift ;;
    --from-build) from=${2:?--from-build needs a build folder}; shift 2 ;;
    --with-emu) emu=1; shift ;;
    -h | --help) sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$out" ] || die "one OUT_DIR ('$out' and '$1' given)"; out=$1; shift ;;
    esac
done
[ -n "$out" ] || die "OUT_DIR is required (usage: gpu-pack.sh OUT_DIR [--mnist DIR] [--no-tar])"
if [ -n "$mnist" ]; then
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        [ -f "$mnist/$f" ] || [ -f "$mnist/$f.gz" ] || die "--mnist $mnist: no $f (nor $f.gz)"
    done
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# ---- the build ----
if [ -n "$from" ]; then
    [ -f "$from/build.ninja" ] || die "--from-build $from: not a configured meson build folder"
    bdir=$(cd "$from" && pwd)
else
    if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
        export PATH="$PATH:/usr/local/cuda/bin"
    fi
    command -v nvcc >/dev/null 2>&1 || die "nvcc not found (on PATH or in /usr/local/cuda/bin): the pack is a CUDA build"
    bdir=$root/build-gpu
    if [ ! -f "$bdir/build.ninja" ]; then
        rm -rf "$bdir" # what a failed configure left behind
        # no MPI: the GPU machines lent are single-GPU and lack OpenMPI's runtime (its
        # plugins and helpers are more than the libraries ldd names)
        if ! meson setup "$bdir" --buildtype=release -Dnative=false -Dc_args=-march=x86-64-v3 \
            -Dcpp_args=-march=x86-64-v3 -Dcuda=enabled -Dfuzz=disabled -Dmpi=disabled >"$log" 2>&1; then
            tail -n 30 "$log" >&2
            echo "gpu-pack: meson setup failed (whole log: build-gpu/meson-logs/meson-log.txt)" >&2
            exit 1
        fi
    fi
fi

# What goes in, from meson's list of targets: NAME<TAB>PATH relative to the build.
targets=$(meson introspect "$bdir" --targets | python3 -c '
import json, os, sys
build, emu = sys.argv[1], sys.argv[2] == "1"
for t in json.load(sys.stdin):
    name, kind = t["name"], t["type"]
    for f in t.get("filename", []):
        rel = os.path.relpath(f, build)
        if kind == "shared library" and name == "attnbench":
            print("lib\t" + rel)
        elif kind == "executable" and (name == "attnbench" or (emu and name == "attnbench-emu")):
            print("bin\t" + rel)
        elif kind == "executable" and name.startswith("test_") and "cuda" in name and "emu" not in name:
            print("test\t" + rel)
        elif kind == "executable" and (emu or not name.endswith("_emu")) and (name.startswith("lab_") or rel.startswith("attention/lab/")):
            print("lab\t" + rel)
        elif name == "lab" and kind == "alias":
            print("alias\tlab")
' "$bdir" "$emu")
grep -q '^bin	attnbench$' <<<"$targets" || die "$bdir: meson lists no attnbench executable"
if [ -z "$from" ]; then
    echo "gpu-pack: compiling in build-gpu/ (release, x86-64-v3, CUDA) ..."
    # shellcheck disable=SC2046
    if ! ninja -C "$bdir" $(cut -f2 <<<"$targets") >"$log" 2>&1; then
        grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -n 60 >&2
        echo "gpu-pack: compilation failed" >&2
        exit 1
    fi
    grep -q 'test_cuda_selftest$' <<<"$targets" || die "build-gpu has no test_cuda_selftest: it was configured without CUDA"
fi

# ---- the folder ----
mkdir -p "$out" || die "cannot make $out"
out=$(cd "$out" && pwd)
pack=$out/attnbench-gpu
rm -rf "$pack"
mkdir -p "$pack/build" "$pack/lib"
files=()
while IFS=$'\t' read -r kind rel; do
    [ -n "$rel" ] && [ "$kind" != alias ] || continue
    [ -e "$bdir/$rel" ] || die "$bdir/$rel is not built (build it, or leave out --from-build)"
    mkdir -p "$pack/build/$(dirname "$rel")"
    if [ "$kind" = lib ]; then
        # the library under its soname links too (what the binaries load)
        find "$bdir/$(dirname "$rel")" -maxdepth 1 -name 'libattnbench.so*' ! -name '*.p' \
            -exec cp -a -t "$pack/build/$(dirname "$rel")/" {} +
    else
        cp -a "$bdir/$rel" "$pack/build/$rel"
    fi
    files+=("$bdir/$rel")
done <<<"$targets"

# Every library the binaries load but those the GPU machine has: glibc's, the C++
# runtime, CUDA's (the driver's and the toolkit's), and libattnbench itself.
for f in "${files[@]}"; do
    env LD_LIBRARY_PATH="$bdir" ldd "$f" 2>/dev/null || true
done | awk '$2 == "=>" && $3 ~ /^\// {print $1 "\t" $3}' | sort -u |
    grep -v -E '^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libmvec|ld-linux[^	]*)\.so|^libstdc\+\+|^libgcc_s|^libcuda|^libcublas|^libcudart|^libnvidia|^libattnbench' |
    while IFS=$'\t' read -r name path; do
        cp -L "$path" "$pack/lib/$name"
    done
missing=$(for f in "${files[@]}"; do env LD_LIBRARY_PATH="$bdir" ldd "$f" 2>/dev/null || true; done | grep 'not found' | sort -u || true)
[ -z "$missing" ] || die "libraries not found here: $missing"

# The sources the runs read (no results, no committed runs).
cp --parents -t "$pack" harness/scripts/gpu-check.sh experiments/provenance.py experiments/sweep/*.json \
    experiments/sweep/*.py experiments/sweep/compare-torch.sh experiments/images/*.json tests/crosscheck/*.py \
    plots/*.gp attention/lab/first-runs.sh

# Data: MNIST when given (gpu-check.sh makes random images of MNIST's and CIFAR-10's
# shapes where data/ lacks them: only the shape matters for the sampling speed).
mnist_note="none (gpu-check.sh makes random images of its shape)"
if [ -n "$mnist" ]; then
    mkdir -p "$pack/data/mnist"
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        if [ -f "$mnist/$f.gz" ]; then cp "$mnist/$f.gz" "$pack/data/mnist/"; else gzip -c "$mnist/$f" >"$pack/data/mnist/$f.gz"; fi
    done
    mnist_note="given with --mnist (gzip)"
fi

commit=$(git rev-parse HEAD 2>/dev/null || true)
dirty=""
if [ -n "$commit" ]; then
    dirty=0
    [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=1
fi
diff_sha1=""
[ "$dirty" != 1 ] || diff_sha1=$(git diff HEAD --binary --no-ext-diff --no-color | git hash-object --stdin)
{
    echo "commit=$commit"
    echo "dirty=$dirty"
    echo "diff_sha1=$diff_sha1"
    echo "packed=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "build=$([ -n "$from" ] && echo "$(basename "$bdir") (--from-build)" || echo "build-gpu: release, -march=x86-64-v3, CUDA")"
    echo "nvcc=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n 1)"
    echo "mnist=$mnist_note"
    echo "run=bash harness/scripts/gpu-check.sh [ARCHIVE]   (from this folder; about 8 minutes at most)"
} >"$pack/PACK_INFO"

size_dir=$(du -sk "$pack" | awk '{printf "%.1f", $1 / 1024}')
echo "gpu-pack: $pack: ${size_dir} MB ($(find "$pack/build" -type f | wc -l) binaries, $(find "$pack/lib" -type f | wc -l) libraries; commit ${commit:0:12}$([ "$dirty" = 1 ] && echo ', dirty'))"
if [ "$tar" = 1 ]; then
    tar -C "$out" -cf - attnbench-gpu | xz -T0 -6 >"$out/attnbench-gpu.tar.xz.tmp"
    mv "$out/attnbench-gpu.tar.xz.tmp" "$out/attnbench-gpu.tar.xz"
    echo "gpu-pack: $out/attnbench-gpu.tar.xz: $(stat -c %s "$out/attnbench-gpu.tar.xz" | awk '{printf "%.1f", $1 / 1048576}') MB"
fi
