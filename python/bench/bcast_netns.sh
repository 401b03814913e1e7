#!/usr/bin/env bash
# python/bench/bcast_netns.sh [bcast.py args] - bench/bcast.py with the writer
# in this namespace's side of a veth pair and the readers in a network
# namespace of their own (root): "another host" on one machine. Makes the
# namespace and the pair, runs, removes them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
ns=fbench$$
ip netns add "$ns"
trap 'ip link del fbw$$ 2>/dev/null || true; ip netns del "$ns" 2>/dev/null || true' EXIT
ip link add fbw$$ type veth peer name fbr$$ netns "$ns"
ip addr add 10.231.7.1/24 dev fbw$$
ip link set fbw$$ up
ip -n "$ns" addr add 10.231.7.2/24 dev fbr$$
ip -n "$ns" link set fbr$$ up
ip -n "$ns" link set lo up
export FERRY_SECRET=${FERRY_SECRET:-bcast-bench}
"$py" "$here/bcast.py" --remote --connect-ip 10.231.7.1 --reader-netns "$ns" \
	--reader-ip 10.231.7.2 "$@"
