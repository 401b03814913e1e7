#!/usr/bin/env bash
# overhead.sh [ITERS]: pyferry's per-call overhead: overhead.py (through the
# binding, in build-py/venv) beside overhead.c (the same loops in C, built
# here against the libferry.a of pyferry's own build). Run ./run pytest first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
lib=$(find "$root/build-py/cmake" -name libferry.a | head -n 1)
[[ -n $lib ]] || { echo "no build-py/cmake/*/libferry.a: run ./run pytest first" >&2; exit 1; }
out=$(mktemp -d)
mods="liburing ck libcrypto"
for m in libzmq yaml-0.1; do pkg-config --exists $m && mods="$mods $m"; done
gcc -O2 -I"$root/api" "$here/overhead.c" "$lib" $(pkg-config --libs $mods) -lpthread -lm \
	-o "$out/overhead"
FERRY_RUNTIME_DIR=$out "$out/overhead" "${1:-200000}"
FERRY_RUNTIME_DIR=$out "$root/build-py/venv/bin/python" "$here/overhead.py" "${1:-200000}"
rm -rf "$out"
