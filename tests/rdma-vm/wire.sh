#!/bin/bash
# tests/rdma-vm/wire.sh - inside ferry's RDMA test guest (init.sh runs it):
# two Soft-RoCE devices, rxe0 on rxeth0 (198.18.1.1) and rxe1 on rxeth1
# (198.18.1.2), the two ends of one veth pair, so that a test sees two hosts.
# rdma_rxe of Debian 12's kernel works in the initial network namespace only,
# so both addresses live there; routing rules send traffic between them over
# the veth instead of through lo: the local table is looked up after a rule
# per device (an output device rxethN, which rdma_cm sets once bound to N's
# address, routes to the other end through rxethN), packets from a local
# source are accepted, and neighbour entries are permanent (no ARP).
# Writes /run/ferry-vm/wire.env (RDMA_IP0, RDMA_IP1, RDMA_DEV0, RDMA_DEV1,
# and RDMA_WIRE: this script, for the two commands below).
#
# wire.sh blackhole: each end's neighbour entry for the other points at a
# MAC address nobody has, so every packet between the two devices is sent
# and silently dropped by the receiving end (not for its address): a cable
# cut somewhere between two hosts, with no link event and no error on
# either side.
# wire.sh mend: the neighbour entries as at first: what a test that cut
# the wire runs after it.
# wire.sh unplug: rxe1 deleted (a device removed under its users: the
# command returns once every process let go of it).
# wire.sh replug: rxe1 made again on rxeth1 (after unplug; nothing if it is
# there), once a removal under way has finished (up to 20 s).
set -eu
[ "$(cat /proc/sys/kernel/hostname)" = ferry-rdma-vm ] ||
	{ echo "wire.sh rewrites routing: only inside ferry's RDMA guest" >&2; exit 1; }
A=198.18.1.1 Z=198.18.1.2

neighbours() {
	ip neigh replace $Z lladdr "$(cat /sys/class/net/rxeth1/address)" dev rxeth0 nud permanent
	ip neigh replace $A lladdr "$(cat /sys/class/net/rxeth0/address)" dev rxeth1 nud permanent
}

# The RoCE v2 GIDs of the addresses appear a moment after the link: wait for them.
wait_gids() {
	for _ in $(seq 100); do
		n=$(grep -l "ffff:c612:010[12]" /sys/class/infiniband/rxe[01]/ports/1/gids/* 2>/dev/null | wc -l)
		[ "$n" -ge 2 ] && break
		sleep 0.05
	done
}

if [ "${1:-}" = blackhole ]; then
	ip neigh replace $Z lladdr 02:00:00:00:00:02 dev rxeth0 nud permanent
	ip neigh replace $A lladdr 02:00:00:00:00:01 dev rxeth1 nud permanent
	exit 0
fi
if [ "${1:-}" = mend ]; then
	neighbours
	exit 0
fi
if [ "${1:-}" = unplug ]; then
	rdma link delete rxe1
	exit 0
fi
if [ "${1:-}" = replug ]; then
	# A removal still under way (its command waits for the last user of the
	# device, say a test process that failed and is ending) is let finish.
	for _ in $(seq 400); do
		if [ -e /sys/class/infiniband/rxe1 ]; then
			pgrep -f "rdma link delete rxe1" >/dev/null || break
		elif rdma link add rxe1 type rxe netdev rxeth1 2>/dev/null; then
			break
		fi
		sleep 0.05
	done
	[ -e /sys/class/infiniband/rxe1 ] || { echo "wire.sh replug: no rxe1" >&2; exit 1; }
	wait_gids
	exit 0
fi
modprobe -a rdma_rxe rdma_ucm veth
ip -batch - <<EOT
link add rxeth0 type veth peer name rxeth1
addr add $A/32 dev rxeth0
addr add $Z/32 dev rxeth1
link set rxeth0 mtu 4200 up
link set rxeth1 mtu 4200 up
rule add pref 1000 lookup local
rule del pref 0 lookup local
rule add pref 10 oif rxeth0 lookup 10
rule add pref 11 oif rxeth1 lookup 11
route add $Z dev rxeth0 src $A table 10
route add $A dev rxeth1 src $Z table 11
EOT
for i in all default rxeth0 rxeth1; do
	echo 1 >/proc/sys/net/ipv4/conf/$i/accept_local
	echo 0 >/proc/sys/net/ipv4/conf/$i/rp_filter
done
neighbours
rdma link add rxe0 type rxe netdev rxeth0
rdma link add rxe1 type rxe netdev rxeth1
wait_gids
echo "export RDMA_IP0=$A RDMA_IP1=$Z RDMA_DEV0=rxe0 RDMA_DEV1=rxe1" \
	"RDMA_WIRE=$(readlink -f "$0")" \
	>/run/ferry-vm/wire.env
