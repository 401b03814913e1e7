#!/usr/bin/env bash
# bench/cpu_gb.sh [-s SIZE] [-n COUNT] [BUILD_DIR] - the CPU cost of bandwidth
# over tcp on loopback: user + system CPU seconds per GB (10^9 bytes) moved,
# both ends, for ferry (bench/cpu_gb.c: COUNT pool buffers of SIZE bytes, zero
# copy, THREAD mode, getrusage of each process) and iperf3 (one stream, the
# same bytes: -n, its -J cpu_utilization_percent of each end times its
# duration), in one run, then their ratio. A clock benchmark: run it on a
# quiet machine (docs/benchmarks.md, "CPU per GB"). Defaults: 4 MiB x 1000.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
size=$((4 << 20)) count=1000
while (($# > 0)); do
	case $1 in
	-s) size=$2; shift 2 ;;
	-n) count=$2; shift 2 ;;
	*) break ;;
	esac
done
build=${1:-$ROOT/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export FERRY_RUNTIME_DIR=$tmp/rt
mkdir -m 0700 "$FERRY_RUNTIME_DIR"
ferry=$("$build/bench/cpu_gb" tcp "$size" "$count")
echo "$ferry"
iperf=null
if command -v iperf3 >/dev/null; then
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
	spid=$!
	for ((i = 0; i < 50; i++)); do
		ss -ltn 2>/dev/null | grep -q ":$port " && break
		sleep 0.1
	done
	if timeout 300 iperf3 -c 127.0.0.1 -p "$port" -P 1 -n $((size * (count - 1))) -J >"$tmp/iperf.json"; then
		iperf=$(python3 - "$tmp/iperf.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["end"]
secs = r["sum_received"]["seconds"]
gb = r["sum_received"]["bytes"] / 1e9
cpu = r["cpu_utilization_percent"]
s, c = cpu["remote_total"] / 100 * secs, cpu["host_total"] / 100 * secs
print(json.dumps({"bytes": gb * 1e9, "wall_s": round(secs, 4), "gbps": round(gb / secs, 3),
                  "cpu_s_sender": round(c, 4), "cpu_s_receiver": round(s, 4),
                  "cpu_s_per_gb": round((s + c) / gb, 4)}))
PY
)
	fi
	wait "$spid" 2>/dev/null || true
fi
echo "$iperf"
python3 - "$ferry" "$iperf" <<'PY'
import json, sys
f, i = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"ferry": f, "iperf3": i,
       "cpu_s_per_gb_ferry_over_iperf3": round(f["cpu_s_per_gb"] / i["cpu_s_per_gb"], 3) if i else None}
print(json.dumps(out))
PY
