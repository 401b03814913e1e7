#!/usr/bin/env bash
# tests/cuda_rt_build_check.sh CC SRCDIR - engine/cuda_rt.c builds without the CUDA
# toolkit's headers (as on a machine without it) and, where they are found, with
# them: then its static asserts hold ferry's own declarations of the runtime's
# types and constants (engine/cuda_rt.h) to the toolkit's.
set -uo pipefail
cc=$1 src=$2
flags=(-std=gnu11 -Wall -Wextra -Werror -fsyntax-only -I"$src/engine" -I"$src/api")
if ! "$cc" "${flags[@]}" "$src/engine/cuda_rt.c"; then
	echo "cuda_rt_build_check: engine/cuda_rt.c does not build without the CUDA headers" >&2
	exit 1
fi
inc=""
for d in "${CUDA_HOME:-}/include" "${CUDA_PATH:-}/include" /usr/local/cuda/include /opt/cuda/include; do
	[[ -f $d/cuda_runtime_api.h ]] && { inc=$d; break; }
done
if [[ -z $inc ]]; then
	echo "cuda_rt_build_check: built without the CUDA headers; no toolkit here to check against"
	exit 0
fi
if ! "$cc" "${flags[@]}" -DFERRY_HAVE_CUDA_H=1 -I"$inc" "$src/engine/cuda_rt.c"; then
	echo "cuda_rt_build_check: engine/cuda_rt.h disagrees with $inc" >&2
	exit 1
fi
echo "cuda_rt_build_check: built without the CUDA headers and checked against $inc"
