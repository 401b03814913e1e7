#!/usr/bin/env bash
# bench/peers_shm.sh - the UCX peers of bench_shm, run the way
# ../shared/LIMITS.md describes: Debian's ucx_perftest, UCX_TLS=shm, server
# on one core and client on the other, inside `unshare -n` with only the
# loopback interface up (as root; otherwise without unshare, and it says so).
#
# Usage: bench/peers_shm.sh [--reps N] [--quick] [--server-cpu C] [--client-cpu C]
#
# Prints machine-readable lines on stdout (bench_shm parses them):
#   ucx installed <version>        | ucx not_installed
#   netns unshare|none <why>
#   run <test> <bytes> <rep> <p50_us> <avg_us> <bw_MBps> <msg_per_s>
#   fail <test> <bytes> <rep> <why>
# ucx_perftest's latency columns are one-way (half the ping-pong round
# trip); its "MB/s" are MiB/s (2^20 bytes).
set -uo pipefail

REPS=3
QUICK=0
SRV_CPU=1
CLI_CPU=0
while (($# > 0)); do
	case $1 in
	--reps) REPS=$2; shift 2 ;;
	--quick) QUICK=1; shift ;;
	--server-cpu) SRV_CPU=$2; shift 2 ;;
	--client-cpu) CLI_CPU=$2; shift 2 ;;
	--inner) INNER=1; shift ;;
	*) echo "usage: $0 [--reps N] [--quick] [--server-cpu C] [--client-cpu C]" >&2; exit 2 ;;
	esac
done
INNER=${INNER:-0}

if ! command -v ucx_perftest >/dev/null 2>&1; then
	echo "ucx not_installed"
	exit 0
fi

# Outer call: re-run this script inside a fresh network namespace when we can.
if ((INNER == 0)); then
	ver=$(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -1)
	echo "ucx installed ${ver:-unknown}"
	args=(--reps "$REPS" --server-cpu "$SRV_CPU" --client-cpu "$CLI_CPU" --inner)
	((QUICK)) && args+=(--quick)
	if command -v unshare >/dev/null 2>&1 && unshare -n true 2>/dev/null; then
		echo "netns unshare only-loopback"
		exec unshare -n bash "$0" "${args[@]}"
	fi
	echo "netns none unshare-n-refused(not-root-or-no-userns)"
	exec bash "$0" "${args[@]}"
fi

# Inner: in the namespace (or not). Bring loopback up if it is down.
if command -v ip >/dev/null 2>&1; then
	ip link set lo up 2>/dev/null || true
fi

export UCX_TLS=shm
# A fresh port per test; in a private namespace nothing else listens.
PORT=$((20000 + RANDOM % 20000))

# run_one test bytes iters warmup rep
run_one() {
	local test=$1 bytes=$2 iters=$3 warm=$4 rep=$5 out srv line i
	local srvlog
	srvlog=$(mktemp)
	PORT=$((PORT + 1))
	taskset -c "$SRV_CPU" ucx_perftest -p "$PORT" >"$srvlog" 2>&1 &
	srv=$!
	out=""
	for i in 1 2 3 4 5 6 7 8 9 10; do
		sleep 0.2
		out=$(taskset -c "$CLI_CPU" timeout 60 ucx_perftest 127.0.0.1 -p "$PORT" \
			-t "$test" -s "$bytes" -n "$iters" -w "$warm" 2>&1) && break
		grep -q 'Final:' <<<"$out" && break
		kill -0 "$srv" 2>/dev/null || break
	done
	kill "$srv" 2>/dev/null
	wait "$srv" 2>/dev/null
	rm -f "$srvlog"
	line=$(grep 'Final:' <<<"$out" | tail -1)
	if [[ -z $line ]]; then
		echo "fail $test $bytes $rep $(tail -1 <<<"$out" | tr -s ' \t' '__')"
		return
	fi
	# Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
	read -r _ _ p50 avg _ bw _ rate _ <<<"$line"
	echo "run $test $bytes $rep $p50 $avg $bw $rate"
}

if ((QUICK)); then
	LAT_N=20000 BW64_N=5000 BW4M_N=100
else
	LAT_N=200000 BW64_N=40000 BW4M_N=600
fi
for ((r = 0; r < REPS; r++)); do
	run_one tag_lat 8 "$LAT_N" $((LAT_N / 10)) "$r"
	run_one tag_lat 64 "$LAT_N" $((LAT_N / 10)) "$r"
	# acknowledged: the send completes once the receiver matched it, as a PUT does
	run_one tag_sync_lat 64 "$LAT_N" $((LAT_N / 10)) "$r"
	run_one tag_bw 65536 "$BW64_N" $((BW64_N / 10)) "$r"
	run_one tag_bw 4194304 "$BW4M_N" $((BW4M_N / 10)) "$r"
done
exit 0
