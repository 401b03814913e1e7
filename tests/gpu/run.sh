#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU check of ferry's CUDA memory domain, in one go
# (issue 19): builds libferry and tests/gpu/gpu_check.cu with nvcc, runs
# it (two processes over shm, checksums on the device, the caller's stream
# first, the 190 MiB handoff and latency benchmark), prints
# "N passed, N failed" and writes JSON ($OUT/gpu_check.json, or
# build-gpu/gpu_check.json). Bounded: the build 4 min, the run 7 min.
#
#   tests/gpu/run.sh            build (if needed) and run
#   tests/gpu/run.sh --prepare  build only, here, with every library libferry
#                               needs copied next to it (build-gpu/lib), so a
#                               bare GPU machine needs nothing but a driver
#                               (carry build-gpu; on the device tool:
#                               carry ["build-gpu"], command "tests/gpu/run.sh")
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
		timeout 240 "$nvcc" -O2 -std=c++17 -cudart shared -I"$src/api" "$src/tests/gpu/gpu_check.cu" \
			-L"$build/lib" -lferry -Xlinker -rpath="\$ORIGIN/lib" -o "$build/gpu_check" \
			>"$build/nvcc.log" 2>&1 || fail_all "nvcc failed (see $build/nvcc.log)"
	fi
	echo "==> gpu check build: $((SECONDS - t0))s"
}

build_all "${1:-}"
[[ ${1:-} == --prepare ]] && exit 0
probe || fail_all "gpu_check does not load: $(LD_LIBRARY_PATH=$build/lib:$LD_LIBRARY_PATH "$build/gpu_check" --probe 2>&1 | head -1)"

export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset FERRY_CUDA_RUNTIME
FERRY_RUNTIME_DIR=$(mktemp -d /tmp/ferry-gpu-XXXXXX)
export FERRY_RUNTIME_DIR
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
timeout -k 10 420 "$build/gpu_check" "$out/gpu_check.json"
rc=$?
rm -rf "$FERRY_RUNTIME_DIR"
if ((rc == 124 || rc == 137)); then
	fail_all "gpu_check ran past 7 minutes"
fi
[[ -s $out/gpu_check.json ]] || fail_all "gpu_check wrote no JSON (exit $rc)"
echo "==> gpu check: $((SECONDS - t0))s in all; JSON: $out/gpu_check.json"
exit $rc
