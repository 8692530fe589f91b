#!/usr/bin/env bash
# Builds the speech experiment's Kaldi data directories from the Debian package
# festvox-ru (experiments/speech/README.md). Run by hand; nothing else runs it.
#
#   experiments/speech/get-data.sh [--out DIR] [--deb FILE]
#
#   --out DIR    where the corpus goes (default: data/speech at the top of the project)
#   --deb FILE   use this festvox-ru_0.5+dfsg-6_all.deb instead of `apt-get download`
#
# Makes DIR/festvox-ru/: source/ (the voice's wav/ and lab/ folders, txt.done.data, the
# package's copyright file and md5sums), train/, valid/, test/ (Kaldi data directories:
# wav.scp, text, utt2spk, spk2utt) and phones.txt. The package is unpacked with
# dpkg-deb, never installed. Source files already there whose md5 matches the
# package's md5sums are kept; the data directories are written again (they are a pure
# function of the source). Exit status 0, or 1 with one line "get-data.sh: error: ..."
# on stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$root/data/speech"
deb=""

# festvox-ru 0.5+dfsg-6 (Debian 12): the .deb's checksums
VERSION=0.5+dfsg-6
DEB_MD5=e2e6deba13402723f833b0d1d1b35a74
DEB_SHA256=21ef3f0f2978ecf2e2eddb367cb0ff4a72572196d28dc69feb84f4177af5e6c4
VOICE=usr/share/festival/voices/russian/msu_ru_nsh_clunits

die() {
    echo "get-data.sh: error: $*" >&2
    exit 1
}
usage() {
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --deb) deb=${2:?--deb needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# Debian's python3; the first python3 on PATH may be another installation.
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3) || die "python3 is needed"
command -v dpkg-deb >/dev/null || die "dpkg-deb is needed (Debian's dpkg)"

mkdir -p "$out" || die "cannot make $out"
out=$(cd "$out" && pwd)
dest="$out/festvox-ru"
src="$dest/source"
tmp=$(mktemp -d "$out/.get-data.XXXXXX") || die "cannot make a scratch folder in $out"
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)

# The source files' md5 against the package's md5sums (lines "MD5  usr/share/...",
# mapped to the paths under source/): the number that differ or are missing.
check_source() {
    [ -f "$src/md5sums" ] || { echo 1; return; }
    (cd "$src" && md5sum --quiet -c md5sums 2>/dev/null | wc -l) || echo 1
}

if [ -d "$src" ] && [ "$(check_source)" = 0 ] && [ "$(wc -l <"$src/md5sums")" = 1242 ]; then
    echo "festvox-ru: source already in $src, md5 of its 1242 files verified"
else
    if [ -z "$deb" ]; then
        command -v apt-get >/dev/null || die "apt-get is needed to fetch festvox-ru, or give --deb FILE"
        echo "festvox-ru: apt-get download festvox-ru=$VERSION"
        (cd "$tmp" && apt-get download "festvox-ru=$VERSION" >"$tmp/apt.log" 2>&1) ||
            die "apt-get download festvox-ru=$VERSION failed: $(grep -m 1 -E '^(E|W):' "$tmp/apt.log" || tail -n 1 "$tmp/apt.log")"
        deb=$(ls "$tmp"/festvox-ru_*.deb 2>/dev/null | head -n 1)
        [ -n "$deb" ] || die "apt-get download left no festvox-ru .deb in $tmp"
    fi
    [ -f "$deb" ] || die "$deb: no such file"
    got=$(md5sum "$deb" | cut -d' ' -f1)
    [ "$got" = "$DEB_MD5" ] || die "$deb: md5 $got, expected $DEB_MD5 (festvox-ru $VERSION)"
    got=$(sha256sum "$deb" | cut -d' ' -f1)
    [ "$got" = "$DEB_SHA256" ] || die "$deb: sha256 $got, expected $DEB_SHA256"
    dpkg-deb -x "$deb" "$tmp/x" 2>"$tmp/dpkg.log" || die "$deb: dpkg-deb -x failed: $(head -n 1 "$tmp/dpkg.log")"
    dpkg-deb -e "$deb" "$tmp/ctl" 2>"$tmp/dpkg.log" || die "$deb: dpkg-deb -e failed: $(head -n 1 "$tmp/dpkg.log")"
    # what is kept, with its md5 from the package, at its path under source/
    grep -E "  ($VOICE/(wav/ru_[0-9]+\.wav|lab/ru_[0-9]+\.lab|etc/txt\.done\.data)|usr/share/doc/festvox-ru/copyright)\$" \
        "$tmp/ctl/md5sums" | sed -e "s#  $VOICE/etc/#  #" -e "s#  $VOICE/#  #" -e "s#  usr/share/doc/festvox-ru/#  #" \
        >"$tmp/md5sums"
    [ "$(wc -l <"$tmp/md5sums")" = 1242 ] ||
        die "$deb: its md5sums list $(wc -l <"$tmp/md5sums") of the 1242 files expected (620 WAVs, 620 labels, txt.done.data, copyright)"
    mkdir -p "$tmp/src"
    mv "$tmp/x/$VOICE/wav" "$tmp/x/$VOICE/lab" "$tmp/x/$VOICE/etc/txt.done.data" "$tmp/x/usr/share/doc/festvox-ru/copyright" \
        "$tmp/src/" || die "$deb: the voice's files are not where festvox-ru $VERSION has them"
    mv "$tmp/md5sums" "$tmp/src/md5sums"
    bad=$(cd "$tmp/src" && md5sum --quiet -c md5sums 2>/dev/null | head -n 1) ||
        die "$deb: $bad (md5 differs from the package's md5sums)"
    rm -rf "$src"
    mkdir -p "$dest"
    mv "$tmp/src" "$src"
    echo "festvox-ru: $src: 620 WAVs, 620 label files, txt.done.data ($(du -sh "$src" | cut -f1)), md5 verified"
fi

# The Kaldi directories, checked as they are made (every WAV opened, every label
# file parsed).
"$py" "$here/festvox_dirs.py" "$src" "$dest" 2>"$tmp/py.log" ||
    die "$(grep -m 1 . "$tmp/py.log" | sed 's/^error: //')"
echo "festvox-ru: $dest/{train,valid,test}, phones.txt ($(($(date +%s) - t0)) s)"
