#!/usr/bin/env bash
# bench/ab_tcp_lat.sh ROUNDS OLD_BENCH_TCP NEW_BENCH_TCP - A/B of the tcp
# transport's 64 B one-way latency against UCX in the same alternation.
#
# Each round runs OLD, then NEW (bench_tcp --quick --only lat64 --reps 1:
# 2,000 round trips, p50 of the last 90 %), then UCX tag_lat 64 B
# (bench/peers_tcp.sh --reps 1 --only lat), each under the machine-wide
# benchmark lock and each only once both CPUs were >= 90 % idle for half a
# second (other worktrees build and test on this machine). This VM lands in
# a fast or a slow mode for seconds at a time, for ferry and UCX alike, so
# compare rounds pairwise rather than single runs.
#
# Prints one line per round (old new ucx, microseconds), then the medians,
# ranges and the per-round differences. docs/benchmarks.md quotes its output.
set -uo pipefail

ROUNDS=${1:?rounds}
OLD=${2:?old bench_tcp}
NEW=${3:?new bench_tcp}
ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
LOCK=/tmp/ferry-bench.lock

idle() {
	local i k t id a b
	for i in $(seq 20); do
		a=($(head -1 /proc/stat))
		sleep 0.5
		b=($(head -1 /proc/stat))
		t=0
		for k in 1 2 3 4 5 6 7 8; do t=$((t + b[k] - a[k])); done
		id=$((b[4] - a[4]))
		((id * 100 >= t * 90)) && return
	done
}

ferry_lat() {
	flock "$LOCK" "$1" --quick --only lat64 --reps 1 2>/dev/null |
		grep -o '"64B":{"p50":{"median":[0-9]*' | grep -o '[0-9]*$' |
		awk '{printf "%.3f", $1 / 1000}'
}

ucx_lat() {
	flock "$LOCK" "$ROOT/bench/peers_tcp.sh" --reps 1 --only lat 2>/dev/null |
		awk '/^run ucx tag_lat/{print $6}'
}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$ROUNDS"); do
	idle; o=$(ferry_lat "$OLD")
	idle; n=$(ferry_lat "$NEW")
	idle; u=$(ucx_lat)
	echo "$r ${o:-nan} ${n:-nan} ${u:-nan}" | tee -a "$out"
done
python3 - "$out" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
rows = [r for r in rows if 'nan' not in r]
o, n, u = ([float(r[i]) for r in rows] for i in (1, 2, 3))
f = lambda v: f"{st.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
print(f"rounds {len(rows)}: old {f(o)}  new {f(n)}  ucx {f(u)} us")
d = [b - a for a, b in zip(o, n)]
e = [b - a for a, b in zip(u, n)]
print(f"new - old per round: median {st.median(d):+.2f} us, new faster in "
      f"{sum(x < 0 for x in d)} of {len(d)}")
print(f"new - ucx per round: median {st.median(e):+.2f} us, new <= ucx in "
      f"{sum(x <= 0 for x in e)} of {len(e)}")
PY
