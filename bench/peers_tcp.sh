#!/usr/bin/env bash
# bench/peers_tcp.sh - the peers of bench_tcp on TCP loopback: Debian's
# ucx_perftest (UCX_TLS=tcp), iperf3 (one stream) and qperf (tcp_bw,
# tcp_lat), server on CPU 1 and client on CPU 0, inside `unshare -n` with
# only the loopback interface up when that is allowed (as root), so that
# UCX sees loopback only, as ../shared/LIMITS.md describes.
#
# Usage: bench/peers_tcp.sh [--reps N] [--quick] [--only lat|bw]
#                           [--veth NS_CLIENT NS_SERVER SERVER_IP]
#
# --only lat runs only ucx tag_lat 64 B (for A/B runs against bench_tcp
# --only lat); --only bw only ucx tag_bw 4 MiB and iperf3.
#
# With --veth the servers run in namespace NS_SERVER and the clients in
# NS_CLIENT (`ip netns exec`), the clients calling SERVER_IP across the veth
# pair that joins them (bench_tcp --veth creates both).
#
# Prints machine-readable lines on stdout (bench_tcp parses them):
#   info <text>
#   run <tool> <test> <bytes> <rep> <value>
# where value is the one-way latency in microseconds (ucx tag_lat: its
# one-way p50; qperf tcp_lat: its one-way average) or the bandwidth in GB/s
# (10^9 bytes/s: ucx MiB/s and iperf3/qperf figures are converted).
#   fail <tool> <test> <bytes> <rep> <why>
set -uo pipefail

REPS=3
QUICK=0
ONLY=
INNER=0
HOST=127.0.0.1
SRV=()
CLI=()
while (($# > 0)); do
	case $1 in
	--reps) REPS=$2; shift 2 ;;
	--quick) QUICK=1; shift ;;
	--inner) INNER=1; shift ;;
	--only)
		case $2 in lat | bw) ONLY=$2 ;; *) echo "--only lat|bw" >&2; exit 2 ;; esac
		shift 2
		;;
	--veth)
		CLI=(ip netns exec "$2")
		SRV=(ip netns exec "$3")
		HOST=$4
		INNER=1
		echo "info veth: client in $2, server in $3 at $4"
		shift 4
		;;
	*) echo "usage: $0 [--reps N] [--quick] [--only lat|bw]" >&2; exit 2 ;;
	esac
done
SRV_CPU=1
CLI_CPU=0

if ((INNER == 0)); then
	args=(--reps "$REPS" --inner)
	((QUICK)) && args+=(--quick)
	[[ -n $ONLY ]] && args+=(--only "$ONLY")
	if command -v unshare >/dev/null 2>&1 && unshare -n true 2>/dev/null; then
		echo "info netns: unshare -n, loopback only"
		exec unshare -n bash "$0" "${args[@]}"
	fi
	echo "info netns: none (unshare -n refused)"
	exec bash "$0" "${args[@]}"
fi
((${#SRV[@]} == 0)) && { ip link set lo up 2>/dev/null || true; }
PORT=$((20000 + RANDOM % 20000))

ucx_one() { # test bytes iters rep
	local test=$1 bytes=$2 iters=$3 rep=$4 out srv line
	PORT=$((PORT + 1))
	UCX_TLS=tcp "${SRV[@]}" taskset -c "$SRV_CPU" ucx_perftest -p "$PORT" >/dev/null 2>&1 &
	srv=$!
	out=""
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		sleep 0.2
		out=$(UCX_TLS=tcp "${CLI[@]}" taskset -c "$CLI_CPU" timeout 60 ucx_perftest "$HOST" -p "$PORT" \
			-t "$test" -s "$bytes" -n "$iters" -w $((iters / 10)) 2>&1) && break
		grep -q 'Final:' <<<"$out" && break
		kill -0 "$srv" 2>/dev/null || break
	done
	kill "$srv" 2>/dev/null
	wait "$srv" 2>/dev/null
	line=$(grep 'Final:' <<<"$out" | tail -1)
	if [[ -z $line ]]; then
		echo "fail ucx $test $bytes $rep $(tail -1 <<<"$out" | tr -s ' \t' '__')"
		return
	fi
	# Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
	read -r _ _ p50 _ _ _ bw _ _ _ <<<"$line"
	if [[ $test == tag_lat ]]; then
		echo "run ucx $test $bytes $rep $p50"
	else
		echo "run ucx $test $bytes $rep $(awk -v m="$bw" 'BEGIN{printf "%.4f", m*1048576/1e9}')"
	fi
}

iperf_one() { # rep
	local rep=$1 srv out secs=3
	((QUICK)) && secs=1
	PORT=$((PORT + 1))
	"${SRV[@]}" taskset -c "$SRV_CPU" iperf3 -s -1 -p "$PORT" >/dev/null 2>&1 &
	srv=$!
	sleep 0.3
	out=$("${CLI[@]}" taskset -c "$CLI_CPU" timeout 30 iperf3 -c "$HOST" -p "$PORT" -P 1 -t "$secs" -J 2>&1)
	wait "$srv" 2>/dev/null
	local bps
	bps=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' <<<"$out" 2>/dev/null)
	if [[ -z $bps ]]; then
		echo "fail iperf3 stream 0 $rep no_result"
		return
	fi
	echo "run iperf3 stream 0 $rep $(awk -v b="$bps" 'BEGIN{printf "%.4f", b/8/1e9}')"
}

qperf_one() { # rep
	local rep=$1 srv out secs=3 bw lat
	((QUICK)) && secs=1
	PORT=$((PORT + 1))
	"${SRV[@]}" taskset -c "$SRV_CPU" qperf -lp "$PORT" >/dev/null 2>&1 &
	srv=$!
	sleep 0.3
	out=$("${CLI[@]}" taskset -c "$CLI_CPU" timeout 30 qperf -lp "$PORT" -t "$secs" -m 4M "$HOST" tcp_bw 2>&1)
	bw=$(awk '/^ *bw/ {v=$3; u=$4; if (u ~ /^GB/) v*=1; else if (u ~ /^MB/) v/=1000; else if (u ~ /^KB/) v/=1e6; printf "%.4f", v}' <<<"$out")
	out=$("${CLI[@]}" taskset -c "$CLI_CPU" timeout 30 qperf -lp "$PORT" -t "$secs" -m 64 "$HOST" tcp_lat 2>&1)
	lat=$(awk '/^ *latency/ {v=$3; u=$4; if (u == "ms") v*=1000; else if (u == "ns") v/=1000; printf "%.3f", v}' <<<"$out")
	kill "$srv" 2>/dev/null
	wait "$srv" 2>/dev/null
	[[ -n $bw ]] && echo "run qperf tcp_bw 4194304 $rep $bw" || echo "fail qperf tcp_bw 4194304 $rep no_result"
	[[ -n $lat ]] && echo "run qperf tcp_lat 64 $rep $lat" || echo "fail qperf tcp_lat 64 $rep no_result"
}

if ((QUICK)); then
	LAT_N=20000 BW64_N=5000 BW4M_N=100
else
	LAT_N=100000 BW64_N=40000 BW4M_N=600
fi
have_ucx=0 have_iperf=0 have_qperf=0
command -v ucx_perftest >/dev/null 2>&1 && have_ucx=1 || echo "info ucx_perftest not installed"
command -v iperf3 >/dev/null 2>&1 && have_iperf=1 || echo "info iperf3 not installed"
command -v qperf >/dev/null 2>&1 && have_qperf=1 || echo "info qperf not installed"
for ((r = 0; r < REPS; r++)); do
	if ((have_ucx)); then
		[[ $ONLY != bw ]] && ucx_one tag_lat 64 "$LAT_N" "$r"
		[[ -z $ONLY ]] && ucx_one tag_bw 65536 "$BW64_N" "$r"
		[[ $ONLY != lat ]] && ucx_one tag_bw 4194304 "$BW4M_N" "$r"
	fi
	[[ $ONLY != lat ]] && ((have_iperf)) && iperf_one "$r"
	[[ -z $ONLY ]] && ((have_qperf)) && qperf_one "$r"
done
exit 0
