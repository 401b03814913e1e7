#!/usr/bin/env bash
# bench/count.sh [-n N] [BUILD_DIR] - the fast path, counted: instructions
# per op under callgrind (deterministic: the same count however loaded the
# machine is) for each of ferry's fast paths and UCX's, in one run:
#
#   inproc      in-process 64 B PUT -> GET (loop transport, MANUAL), from the
#               PUT's prep to the GET's CQE (bench_core's timed window);
#               inproc_whole: to the PUT's CQE reaped too (the whole transfer)
#   idle        one ferry_cq_poll on an idle engine (in-process peer); and
#               idle_shm / idle_tcp: with a live shm / tcp connection
#   shm_hop     one-way 64 B hop over shm, PUT of an iovec into a GET into an
#               iovec (copy); shm_zc_hop: pool buffer PUT, zero-copy GET
#   tcp_hop     the same over tcp on loopback (user-space instructions)
#   ucx_shm_hop, ucx_tcp_hop
#               ucx_perftest tag_lat 64 B (UCX_TLS=shm / tcp), per one-way hop
#   ucx_shm_sync_hop, ucx_tcp_sync_hop
#               ucx_perftest tag_sync_lat 64 B: a send that completes once the
#               receiver matched it (its acknowledgement comes back), the
#               promise ferry's PUT makes (it completes once the destination
#               holds the key); tag_lat's send completes when the data left
#
# A hop runs two processes, both counted; per hop = (a + b) / (2 N). The
# busy spin while a side waits for the other is left out (bench/count_hop.c;
# for UCX the idle ucp_worker_progress calls are counted apart and taken
# out, bench/shim/ucx_count.c). Prints a table, then the JSON, which it also
# writes to bench/results/count.json. N defaults to 2000 (~3 min on 2 cores).
# UCX needs ucx_perftest (Debian ucx-utils); without it those rows are null.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
n=2000
if [[ ${1:-} == -n ]]; then n=$2; shift 2; fi
build=${1:-$ROOT/build}
prog=$build/bench/count_hop
[[ -x $prog ]] || { echo "count.sh: $prog not built (cmake --build $build)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "count.sh: valgrind is needed" >&2; exit 2; }
tmp=$(mktemp -d)
[[ -n ${COUNT_KEEP:-} ]] && echo "count.sh: keeping $tmp" >&2 || trap 'rm -rf "$tmp"' EXIT
export FERRY_RUNTIME_DIR=$tmp/rt
mkdir -m 0700 "$FERRY_RUNTIME_DIR"
cg=(valgrind --tool=callgrind --collect-atstart=no --dump-instr=no)

# run NAME ARGS...: count_hop ARGS under callgrind, dumps in $tmp/NAME/
run() {
	local name=$1
	shift
	mkdir -p "$tmp/$name"
	echo "count.sh: $name ($*)" >&2
	if ! timeout -k 10 900 "${cg[@]}" --callgrind-out-file="$tmp/$name/cg.%p" \
		"$prog" "$@" >"$tmp/$name/log" 2>&1; then
		cat "$tmp/$name/log" >&2
		echo "count.sh: $name failed" >&2
		exit 1
	fi
}

run inproc inproc "$n"
run inproc_whole inproc_whole "$n"
run idle idle "$n"
run shm hop shm "$n"
run shm_zc hop shm_zc "$n"
run tcp hop tcp "$n"

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ucx TLS TEST FOLDER: ucx_perftest TEST, server and client, both under callgrind.
ucx() {
	local tls=$1 test=$2 d=$tmp/$3 port spid rc=0
	mkdir -p "$d"
	port=$(free_port)
	echo "count.sh: $3 (ucx_perftest $test 64 B, UCX_TLS=$tls)" >&2
	local envs=(UCX_TLS="$tls" LD_PRELOAD="$tmp/ucx_count.so" COUNT_FROM=300 COUNT_N="$n"
		    COUNT_IDLE="$n")
	env "${envs[@]}" timeout -k 10 900 "${cg[@]}" --callgrind-out-file="$d/cg.%p" \
		ucx_perftest -p "$port" >"$d/srv.log" 2>&1 &
	spid=$!
	local i
	for ((i = 0; i < 100; i++)); do # the server listens once valgrind has started it
		ss -ltn 2>/dev/null | grep -q ":$port " && break
		sleep 0.2
	done
	env "${envs[@]}" timeout -k 10 900 "${cg[@]}" --callgrind-out-file="$d/cg.%p" \
		ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s 64 -n $((n + 500)) -w 200 \
		>"$d/cli.log" 2>&1 || rc=$?
	wait "$spid" || rc=$?
	if ((rc != 0)); then
		cat "$d/cli.log" "$d/srv.log" >&2
		echo "count.sh: $3 failed (rc $rc); its rows are left out" >&2
		rm -rf "$d"
	fi
}

if command -v ucx_perftest >/dev/null; then
	if gcc -O2 -g -shared -fPIC -Wall -Wextra -o "$tmp/ucx_count.so" "$ROOT/bench/shim/ucx_count.c" -ldl; then
		ucx shm tag_lat ucx_shm
		ucx tcp tag_lat ucx_tcp
		ucx shm tag_sync_lat ucx_sync_shm
		ucx tcp tag_sync_lat ucx_sync_tcp
	else
		echo "count.sh: could not build bench/shim/ucx_count.c; UCX rows left out" >&2
	fi
else
	echo "count.sh: ucx_perftest not found (Debian ucx-utils); UCX rows left out" >&2
fi

mkdir -p "$ROOT/bench/results"
python3 "$ROOT/bench/count_report.py" "$tmp" "$n" "$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)" \
	>"$tmp/out.json"
python3 "$ROOT/bench/count_report.py" --table "$tmp/out.json"
cp "$tmp/out.json" "$ROOT/bench/results/count.json"
cat "$tmp/out.json"
