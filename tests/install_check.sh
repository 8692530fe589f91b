#!/usr/bin/env bash
# Installs the build into a staging folder and builds tests/install_example.c against
# it with pkg-config, as another C program would: header, shared library, .pc file.
# Usage: install_check.sh BUILD_DIR TESTS_DIR [EXTRA_CFLAGS]
set -euo pipefail
build=$1
src=$2
extra_cflags=${3:-}   # a sanitized build's -fsanitize=...: the library needs its runtimes
# A staging folder of its own: pkg-config's flags are split at spaces, so it must not
# sit under a checkout whose path has one.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
DESTDIR="$stage" meson install -C "$build" --no-rebuild --quiet >/dev/null
pc=$(find "$stage" -name attnbench.pc | head -n1)
[ -n "$pc" ] || { echo "no attnbench.pc installed"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs attnbench)
test -f "$stage$prefix/include/attnbench/attention.h" || { echo "header not installed"; exit 1; }
test -x "$stage$prefix/bin/attnbench" || { echo "binary not installed"; exit 1; }
cc -std=c11 $extra_cflags -o "$build/install-example" "$src/install_example.c" $flags -lm
libdir=$(dirname "$(find "$stage" -name 'libattnbench.so' | head -n1)")
LD_LIBRARY_PATH="$libdir" "$build/install-example"
