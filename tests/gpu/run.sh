#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU check of ferry's CUDA memory domain, in one go
# (issue 19): builds libferry and tests/gpu/gpu_check.cu with nvcc, runs
# it (two processes over shm, checksums on the device, the caller's stream
# first, the 190 MiB handoff and latency benchmark), then, where python3
# has torch and sees a device, tests/gpu/py_check.py (pyferry with real
# torch CUDA tensors; the extension built for that python by --prepare);
# prints "N passed, N failed" (both together) and writes JSON
# ($OUT/gpu_check.json and py_check.json, or under build-gpu/). Bounded:
# the build 4 min, gpu_check 220 s, py_check 120 s.
#
#   tests/gpu/run.sh            build (if needed) and run
#   tests/gpu/run.sh --prepare  build only, here, with every library libferry
#                               needs copied next to it (build-gpu/lib), so a
#                               bare GPU machine needs nothing but a driver
#                               (carry build-gpu; on the device tool:
#                               carry ["build-gpu"], command "tests/gpu/run.sh");
#                               and pyferry's extension for the GPU machine's
#                               python (PYFERRY_GPU_PYTHON, default a python3.12
#                               here: the lent machine's is 3.12) in build-gpu/py
# The GPU machine lent here has nvcc and CMake but not ferry's build
# dependencies (liburing, ck, libcrypto's headers): prepare here, run there.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${FERRY_GPU_BUILD:-$src/build-gpu}
out=${OUT:-$build}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
t0=$SECONDS
mkdir -p "$build" "$out"
# libcudart where the toolkit keeps it, for the program and for ferry's dlopen of it.
cudalib=$(cd "$(dirname "$nvcc")/.." 2>/dev/null && pwd)
for d in "$cudalib/lib64" "$cudalib/lib" "$cudalib/targets/x86_64-linux/lib"; do
	[[ -d $d ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}

fail_all() { # why
	local why=${1//\"/\'}
	echo "gpu check: $why" >&2
	printf '{"passed":0,"failed":1,"error":"%s"}\n' "$why" >"$out/gpu_check.json"
	echo "0 passed, 1 failed"
	exit 1
}

# A prepared build that does not load here (another C library, a missing library) is
# built again here, where that can be done.
probe() {
	[[ -x $build/gpu_check ]] && LD_LIBRARY_PATH="$build/lib:$LD_LIBRARY_PATH" "$build/gpu_check" --probe >/dev/null 2>&1
}

build_all() {
	if [[ ${1:-} == --prepare ]]; then
		rm -rf "$build/lib" "$build/gpu_check" # always from the sources as they are now
	elif [[ -x $build/gpu_check ]] && ! probe; then
		echo "gpu check: the prepared build does not load here: building again" >&2
		LD_LIBRARY_PATH="$build/lib:$LD_LIBRARY_PATH" "$build/gpu_check" --probe 2>&1 | head -3 >&2
		rm -rf "$build/lib" "$build/gpu_check"
	fi
	if [[ ! -f $build/lib/libferry.so ]]; then
		timeout 240 cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=OFF \
			-DFERRY_BUILD_BENCH=OFF -DFERRY_BUILD_EXAMPLES=OFF >"$build/cmake.log" 2>&1 ||
			fail_all "cmake failed (see $build/cmake.log)"
		timeout 240 cmake --build "$build" -j"$(nproc)" --target ferry >"$build/build.log" 2>&1 ||
			fail_all "libferry did not build (see $build/build.log)"
		mkdir -p "$build/lib"
		cp -L "$build"/libferry.so* "$build/lib/" 2>/dev/null
		# Its libraries that are not the C library's own travel with it.
		ldd "$build/libferry.so" | awk '/=> \//{print $3}' |
			grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|libresolv|ld-linux[^/]*)\.so' |
			xargs -r -I{} cp -L {} "$build/lib/"
	fi
	if [[ ! -x $build/gpu_check ]]; then
		[[ -x $nvcc ]] || fail_all "no nvcc (set NVCC)"
		timeout 240 "$nvcc" -O2 -std=c++17 -Xcompiler -Wall,-Wformat=2 -cudart shared -I"$src/api" "$src/tests/gpu/gpu_check.cu" \
			-L"$build/lib" -lferry -Xlinker -rpath="\$ORIGIN/lib" -o "$build/gpu_check" \
			>"$build/nvcc.log" 2>&1 || fail_all "nvcc failed (see $build/nvcc.log)"
	fi
	[[ ${1:-} == --prepare ]] && build_py
	echo "==> gpu check build: $((SECONDS - t0))s"
}

# pyferry for the GPU machine's python: build-gpu/py/pyferry (the package's
# modules and its extension built here for that python's version; the
# libraries it needs are libferry's, in build-gpu/lib). Optional: without
# such a python here, py_check is skipped there, and says so.
build_py() {
	local py=${PYFERRY_GPU_PYTHON:-}
	if [[ -z $py ]]; then
		for py in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3 "$(command -v python3.12)"; do
			[[ -x $py ]] && "$py" -c 'import sys' 2>/dev/null && break
			py=
		done
	fi
	rm -rf "$build/py" "$build/py-build"
	if [[ -z $py || ! -x $py ]]; then
		echo "gpu check: no python3.12 here (PYFERRY_GPU_PYTHON): py_check will be skipped" >&2
		return 0
	fi
	if ! timeout 240 cmake -S "$src/python" -B "$build/py-build" -DCMAKE_BUILD_TYPE=Release \
		-DPython_EXECUTABLE="$py" >"$build/py-build.log" 2>&1 ||
		! timeout 240 cmake --build "$build/py-build" -j"$(nproc)" --target _ferry \
			>>"$build/py-build.log" 2>&1; then
		echo "gpu check: pyferry's extension did not build for $py (see $build/py-build.log)" >&2
		return 0
	fi
	mkdir -p "$build/py/pyferry"
	cp "$src"/python/src/pyferry/*.py "$build/py/pyferry/"
	cp "$build"/py-build/_ferry*.so "$build/py/pyferry/"
	rm -rf "$build/py-build"
	echo "gpu check: pyferry built for $("$py" -c 'import sys; print(sys.version.split()[0])')"
}

build_all "${1:-}"
[[ ${1:-} == --prepare ]] && exit 0
probe || fail_all "gpu_check does not load: $(LD_LIBRARY_PATH=$build/lib:$LD_LIBRARY_PATH "$build/gpu_check" --probe 2>&1 | head -1)"

export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset FERRY_CUDA_RUNTIME
FERRY_RUNTIME_DIR=$(mktemp -d /tmp/ferry-gpu-XXXXXX)
export FERRY_RUNTIME_DIR
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
timeout -k 10 220 "$build/gpu_check" "$out/gpu_check.json"
rc=$?
rm -rf "$FERRY_RUNTIME_DIR"
# What gpu_check could not report itself is reported here; the Python check runs anyway.
if ((rc == 124 || rc == 137)); then
	echo "gpu check: gpu_check ran past 220 s" >&2
	printf '{"passed":0,"failed":1,"error":"gpu_check ran past 220 s"}\n' >"$out/gpu_check.json"
elif [[ ! -s $out/gpu_check.json ]]; then
	echo "gpu check: gpu_check wrote no JSON (exit $rc)" >&2
	printf '{"passed":0,"failed":1,"error":"gpu_check wrote no JSON (exit %d)"}\n' "$rc" >"$out/gpu_check.json"
fi
# Which path the device -> device PUTs took (ferry's health, as gpu_check read it).
if grep -q '"case":"ipc_path_taken","ok":true' "$out/gpu_check.json" 2>/dev/null; then
	echo "gpu check: device -> device took CUDA IPC ($(grep -o '"ipc_puts":[0-9-]*' "$out/gpu_check.json"))"
else
	echo "gpu check: device -> device did NOT take CUDA IPC ($(grep -o '"ipc_puts":[0-9-]*' "$out/gpu_check.json")); see the case ipc_path_taken"
fi

# pyferry with torch CUDA tensors, where the python here has torch and a device.
pass_c=$(grep -o '"passed":[0-9]*' "$out/gpu_check.json" | head -1 | cut -d: -f2)
fail_c=$(grep -o '"failed":[0-9]*' "$out/gpu_check.json" | head -1 | cut -d: -f2)
pass_py=0 fail_py=0
if ! ls "$build"/py/pyferry/_ferry*.so >/dev/null 2>&1; then
	echo "gpu check: py_check skipped: no pyferry built by --prepare"
elif ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
	echo "gpu check: py_check skipped: python3 here has no torch that sees a device"
elif ! PYTHONPATH="$build/py" python3 -c 'import pyferry' 2>"$build/py-import.log"; then
	echo "gpu check: py_check skipped: pyferry does not import here: $(tail -1 "$build/py-import.log")"
	fail_py=1
else
	FERRY_RUNTIME_DIR=$(mktemp -d /tmp/ferry-gpu-XXXXXX)
	export FERRY_RUNTIME_DIR
	PYTHONPATH="$build/py" PYTHONUNBUFFERED=1 timeout -k 10 120 python3 "$src/tests/gpu/py_check.py" "$out/py_check.json"
	prc=$?
	rm -rf "$FERRY_RUNTIME_DIR"
	if [[ -s $out/py_check.json ]]; then
		pass_py=$(grep -o '"passed": [0-9]*' "$out/py_check.json" | head -1 | awk '{print $2}')
		fail_py=$(grep -o '"failed": [0-9]*' "$out/py_check.json" | head -1 | awk '{print $2}')
	else
		echo "gpu check: py_check wrote no JSON (exit $prc)"
		fail_py=1
	fi
	((prc != 0 && fail_py == 0)) && fail_py=1
fi
echo "==> gpu check: $((SECONDS - t0))s in all; JSON: $out/gpu_check.json $out/py_check.json"
echo "$((${pass_c:-0} + pass_py)) passed, $((${fail_c:-1} + fail_py)) failed"
((rc == 0 && fail_py == 0)) || exit 1
exit 0
