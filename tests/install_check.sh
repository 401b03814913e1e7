#!/usr/bin/env bash
# tests/install_check.sh BUILD_DIR CONSUMER_DIR [EXTRA_CFLAGS]
#
# Installs the build in BUILD_DIR into a private temporary prefix, then builds
# the consumer in CONSUMER_DIR twice (find_package(ferry), and plain gcc with
# `pkg-config --cflags --libs ferry`) and runs what it built. Everything it
# writes lives under one mktemp directory, so it can run in parallel with
# other tests (and with another build's install_check).
set -euo pipefail

build_dir=${1:?usage: install_check.sh BUILD_DIR CONSUMER_DIR [EXTRA_CFLAGS]}
consumer_dir=${2:?usage: install_check.sh BUILD_DIR CONSUMER_DIR [EXTRA_CFLAGS]}
extra_cflags=${3:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-install-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

step() { printf '\n== install_check: %s\n' "$*"; }

step "cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix"

# The library directory is lib/ unless the build was configured otherwise
# (GNUInstallDirs may pick lib/<multiarch> for /usr): find it from ferry.pc.
pc=$(find "$prefix" -name ferry.pc -path '*/pkgconfig/*' -print -quit)
[[ -n $pc ]] || { echo "install_check: ferry.pc was not installed" >&2; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
for f in "$prefix/include/ferry.h" "$libdir/libferry.a" "$libdir/libferry.so" \
	 "$libdir/cmake/ferry/ferryConfig.cmake" "$libdir/cmake/ferry/ferryConfigVersion.cmake" \
	 "$libdir/cmake/ferry/ferryTargets.cmake"; do
	[[ -e $f ]] || { echo "install_check: missing $f" >&2; exit 1; }
done
shopt -s nullglob
sos=("$libdir"/libferry.so.0*)
[[ -L $libdir/libferry.so && ${#sos[@]} -gt 0 ]] ||
	{ echo "install_check: libferry.so -> libferry.so.0 symlink chain missing" >&2; exit 1; }
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

step "find_package(ferry): configure and build $consumer_dir"
cmake -S "$consumer_dir" -B "$work/cmake-build" \
	-DCMAKE_PREFIX_PATH="$prefix" \
	-Dferry_DIR="$libdir/cmake/ferry" \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DCMAKE_C_FLAGS="$extra_cflags" \
	-DCMAKE_EXE_LINKER_FLAGS="$extra_cflags"
cmake --build "$work/cmake-build"

step "run consumer_shared (find_package, ferry::ferry)"
"$work/cmake-build/consumer_shared"
step "run consumer_static (find_package, ferry::ferry_static)"
"$work/cmake-build/consumer_static"

step "pkg-config: gcc main.c \$(pkg-config --cflags --libs ferry)"
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pc_flags=$(pkg-config --cflags --libs ferry)
pc_libdir=$(pkg-config --variable=libdir ferry)
echo "pkg-config --cflags --libs ferry: $pc_flags"
# shellcheck disable=SC2086 # word splitting of the flags is intended
gcc -std=gnu11 -Wall -Wextra -Werror $extra_cflags \
	"$consumer_dir/main.c" -o "$work/consumer_pc" $pc_flags -Wl,-rpath,"$pc_libdir"
step "run consumer_pc (pkg-config)"
"$work/consumer_pc"

step "OK"
