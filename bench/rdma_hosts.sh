#!/bin/bash
# bench/rdma_hosts.sh - ferry rdma against perftest on real RDMA NICs, for a
# user who has them (NOT run by the project: its machines have no RDMA NIC).
#
#   one host, a NIC in loopback (both ends on one port's address):
#     bench/rdma_hosts.sh --dev mlx5_0 --ip 10.0.0.1
#   two hosts (ferry's bench_rdma runs both engines in one process, so across
#   hosts only perftest runs; use the same device on each):
#     server$ ib_read_bw -d mlx5_0 -x GID -s 4194304 -D 5
#     client$ bench/rdma_hosts.sh --dev mlx5_0 --ip CLIENT_IP --peer SERVER_IP
#
# Prints perftest's ib_read_bw / ib_write_bw (4 MiB, 190 MB, GB/s),
# ib_send_lat (64 B, us), bench_rdma's figures (two engines, rx and tx, both on
# --ip: the NIC's loopback) and the ratios the issue sets as targets (ferry
# 4 MiB >= 0.9 x ib_read_bw, 64 B latency <= 1.3 x ib_send_lat), against the
# port's line rate (ibv_devinfo's active_speed x width).
set -u
dev= ip= peer= gid=${GID:-3}
while (($#)); do
	case $1 in
	--dev) dev=$2; shift 2 ;;
	--ip) ip=$2; shift 2 ;;
	--peer) peer=$2; shift 2 ;;
	--gid) gid=$2; shift 2 ;;
	*) sed -n '2,17p' "$0"; exit 2 ;;
	esac
done
[[ -n $dev && -n $ip ]] || { sed -n '2,17p' "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
target=${peer:-$ip}
ibv_devinfo -d "$dev" -v | grep -E 'active_width|active_speed|link_layer' | sed 's/^/line rate: /'
pt() {
	local tool=$1 size=$2 len=(-D 5)
	[[ $tool == ib_send_lat ]] && len=(-n 10000)
	if [[ -z $peer ]]; then
		$tool -d "$dev" -x "$gid" -s "$size" "${len[@]}" >/dev/null 2>&1 &
		sleep 1
	fi
	$tool -d "$dev" -x "$gid" -s "$size" "${len[@]}" --report_gbits "$target" 2>&1 |
		awk -v s="$size" '$1 == s { print }'
	wait
}
for s in 4194304 199229440; do
	echo "ib_read_bw $s: $(pt ib_read_bw $s)"
	echo "ib_write_bw $s: $(pt ib_write_bw $s)"
done
echo "ib_send_lat 64: $(pt ib_send_lat 64)"
[[ -z $peer ]] && "$root/build/bench/bench_rdma" --ip0 "$ip" --ip1 "$ip"
