#!/bin/bash
# bench/rdma_guest.sh [--quick] - ferry rdma against bare verbs, perftest
# and ferry tcp, in ferry's RDMA test guest (run from the repository root):
#   tests/rdma-vm/vm.sh run -m 3G -t 600 -- bench/rdma_guest.sh [--quick]
# perftest (Debian's perftest: ib_read_bw, ib_write_bw, ib_send_lat) runs
# between rxe1 and rxe0 (server on $RDMA_DEV0, client on $RDMA_DEV1, RoCE v2
# GID of each address), then build/bench/rdma_raw (bare verbs READ and SEND
# between the same addresses, timed with CLOCK_MONOTONIC: perftest times
# itself with the cycle counter, which TCG does not keep, so its figures are
# shown but not used), then build/bench/bench_rdma; prints their figures and
# the issue's ratios (ferry 4 MiB bandwidth / bare READ 4 MiB, ferry 64 B
# latency / bare SEND 64 B; and the same against perftest) as one JSON
# object. Soft-RoCE under TCG: the figures are emulation's, only the ratios
# of one run compare anything.
set -u
[ "$(cat /proc/sys/kernel/hostname 2>/dev/null)" = ferry-rdma-vm ] ||
	{ echo "rdma_guest.sh runs in the RDMA guest: tests/rdma-vm/vm.sh run -- $0" >&2; exit 2; }
quick=${1:-}
gid() { # the RoCE v2 GID index of address $2 on device $1
	local hex
	hex=$(printf '%02x%02x:%02x%02x' ${2//./ })
	for g in /sys/class/infiniband/$1/ports/1/gids/*; do
		[ "$(cat "$g")" = "0000:0000:0000:0000:0000:ffff:$hex" ] || continue
		[ "$(cat /sys/class/infiniband/$1/ports/1/gid_attrs/types/${g##*/})" = "RoCE v2" ] &&
			{ echo "${g##*/}"; return; }
	done
}
g0=$(gid "$RDMA_DEV0" "$RDMA_IP0") g1=$(gid "$RDMA_DEV1" "$RDMA_IP1")
dur=2
[ "$quick" = --quick ] && dur=1
pt() { # pt TOOL SIZE: a perftest pair; prints GB/s (BW average, MB/sec / 1000) or t_typical us
	local tool=$1 size=$2 out port=$((18515 + RANDOM % 1000)) len=(-D "$dur")
	[ "$tool" = ib_send_lat ] && len=(-n 1000)
	timeout 60 $tool -d "$RDMA_DEV0" -x "$g0" -s "$size" "${len[@]}" -p $port >/tmp/pt_s.log 2>&1 &
	local spid=$!
	sleep 1
	out=$(timeout 50 $tool -d "$RDMA_DEV1" -x "$g1" -s "$size" "${len[@]}" -p $port "$RDMA_IP0" 2>&1)
	kill $spid 2>/dev/null
	wait $spid 2>/dev/null
	echo "$out" >>/tmp/perftest.log
	case $tool in
	ib_send_lat) echo "$out" | awk '$1 == '"$size"' { print $5 }' | tail -n 1 ;;
	*) echo "$out" | awk '$1 == '"$size"' { print $4 / 1000 }' | tail -n 1 ;;
	esac
}
sizes="65536 4194304"
[ "$quick" = --quick ] || sizes="$sizes 199229440"
json="{\"perftest\":{"
sep=
for s in $sizes; do
	r=$(pt ib_read_bw "$s"); w=$(pt ib_write_bw "$s")
	json+="$sep\"ib_read_bw_${s}_GBps\":${r:-null},\"ib_write_bw_${s}_GBps\":${w:-null}"
	sep=,
	echo "perftest $s: read ${r:-?} GB/s, write ${w:-?} GB/s" >&2
done
l=$(pt ib_send_lat 64)
json+=",\"ib_send_lat_64B_us\":${l:-null}}"
echo "perftest ib_send_lat 64 B: ${l:-?} us" >&2
raw=$(timeout 300 build/bench/rdma_raw $quick) || { echo "rdma_raw failed" >&2; exit 1; }
json+=",\"raw_verbs\":$raw"
f=$(timeout 300 build/bench/bench_rdma $quick) || { echo "bench_rdma failed" >&2; exit 1; }
json+=",\"ferry\":$f"
json+="}"
echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
p, f, v = d["perftest"], d["ferry"], d["raw_verbs"]
r = {}
try: r["bw_4MiB_ferry_over_raw_read"] = round(f["rdma"]["bw_4194304_GBps"] / v["read_bw_4194304_GBps"], 3)
except Exception: pass
try: r["lat_64B_ferry_over_raw_send"] = round(f["rdma"]["latency_64B_us"]["p50"] / v["send_lat_64B_us"]["p50"], 3)
except Exception: pass
try: r["bw_4MiB_ferry_over_ib_read_bw"] = round(f["rdma"]["bw_4194304_GBps"] / p["ib_read_bw_4194304_GBps"], 3)
except Exception: pass
try: r["lat_64B_ferry_over_ib_send_lat"] = round(f["rdma"]["latency_64B_us"]["p50"] / p["ib_send_lat_64B_us"], 3)
except Exception: pass
try: r["bw_4MiB_rdma_over_tcp"] = round(f["rdma"]["bw_4194304_GBps"] / f["tcp"]["bw_4194304_GBps"], 3)
except Exception: pass
d["ratios"] = r
d["targets"] = {"bw_4MiB >= 0.9 x bare READ (same clock)": r.get("bw_4MiB_ferry_over_raw_read", 0) >= 0.9,
                "lat_64B <= 1.3 x bare SEND (same clock)": 0 < r.get("lat_64B_ferry_over_raw_send", 99) <= 1.3,
                "bw_4MiB >= 0.9 x ib_read_bw (cycle clock)": r.get("bw_4MiB_ferry_over_ib_read_bw", 0) >= 0.9,
                "lat_64B <= 1.3 x ib_send_lat (cycle clock)": 0 < r.get("lat_64B_ferry_over_ib_send_lat", 99) <= 1.3}
print(json.dumps(d, indent=1))'
