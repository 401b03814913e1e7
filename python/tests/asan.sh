#!/usr/bin/env bash
# asan.sh [pytest args]: pyferry's test suite against an ASan+UBSan build of
# ferry and of the extension (FERRY_SANITIZE=ON; CMake build in
# build-py/cmake-asan/, installed into its own virtual environment
# build-py/venv-asan with the pinned test requirements). The interpreter is
# not instrumented: libasan and libubsan are preloaded; PYTHONMALLOC=malloc
# puts Python's own allocations where ASan sees them. Leak checking is off
# (the interpreter does not free everything at exit); a heap error, a
# use-after-free or undefined behaviour fails the run (exit 1 from ASan's
# abort, or pytest's status).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$root/build-py/venv-asan
py=${FERRY_PYTHON:-python3}
if [[ ! -x $venv/bin/python ]]; then
	"$py" -m venv "$venv"
	"$venv/bin/python" -m pip install -q -r "$root/python/requirements-build.txt" \
		-r "$root/python/requirements-test.txt"
fi
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} "$venv/bin/python" -m pip install -q \
	--no-build-isolation --no-deps --force-reinstall \
	--config-settings=cmake.define.FERRY_SANITIZE=ON \
	--config-settings='build-dir=../build-py/cmake-asan/{wheel_tag}' "$root/python"
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
[[ -f $libasan && -f $libubsan ]] || { echo "asan.sh: no libasan/libubsan for gcc" >&2; exit 1; }
# Reports go to files (pytest captures the test's stderr, and an abort loses
# it): build-py/asan-logs/, printed below.
logs=$root/build-py/asan-logs
rm -rf "$logs" && mkdir -p "$logs"
cd "$root/python"
rc=0
# FERRY_TEST_ASAN: tests whose bound is the process's RSS leave it out (ASan's
# quarantine keeps freed memory, by design).
LD_PRELOAD="$libasan $libubsan" PYTHONMALLOC=malloc FERRY_TEST_ASAN=1 \
	ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:log_path=$logs/asan${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
	UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
	timeout -k 10 1200 "$venv/bin/python" -m pytest -q -p no:cacheprovider -o timeout=300 tests "$@" ||
	rc=$?
if compgen -G "$logs/*" >/dev/null; then
	cat "$logs"/*
	echo "asan.sh: sanitizer reports above (build-py/asan-logs/)" >&2
	exit 1
fi
exit "$rc"
