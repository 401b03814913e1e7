#!/usr/bin/env bash
# bench/count_ops.sh [-n N] BUILD_DIR... - instructions per op (callgrind) of
# every window of bench/count_ops.c, over loop and tcp, for each build given
# (e.g. a build of the tree before a change and one after): one line per
# window and transport, the builds side by side, and each build's ratio to
# the first. Deterministic: decide hot-path changes by these counts, then
# confirm on the clock (docs/benchmarks.md, "Instructions per op").
set -euo pipefail
n=20000
if [[ ${1:-} == -n ]]; then n=$2; shift 2; fi
(($# >= 1)) || { echo "usage: $0 [-n N] BUILD_DIR..." >&2; exit 2; }
command -v valgrind >/dev/null || { echo "count_ops.sh: valgrind is needed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-8s %-20s' transport window
for b in "$@"; do printf ' %14s' "$(basename "$b")"; done
printf '\n'
for how in loop tcp; do
	for w in window_nop window_put_get_64 window_put_get_zc window_stream_64; do
		printf '%-8s %-20s' "$how" "$w"
		first=
		for b in "$@"; do
			valgrind --tool=callgrind --collect-atstart=no --toggle-collect="$w" \
				--callgrind-out-file="$tmp/cg.out" "$b/bench/count_ops" "$how" "$n" \
				>"$tmp/log" 2>&1 || { echo " (count_ops failed: $tmp/log)"; cat "$tmp/log" >&2; exit 1; }
			ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$tmp/cg.out")
			per=$(awk -v ir="$ir" -v n="$n" 'BEGIN { printf "%.0f", ir / n }')
			if [[ -z $first ]]; then
				first=$per
				printf ' %14s' "$per"
			else
				printf ' %7s (%.3f)' "$per" "$(awk -v a="$per" -v b="$first" 'BEGIN { print a / b }')"
			fi
		done
		printf '\n'
	done
done
