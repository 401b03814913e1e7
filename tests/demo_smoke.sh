#!/usr/bin/env bash
# tests/demo_smoke.sh DEMO - the Quick start's main job, small: the demo
# pipeline over shm and over tcp (every byte checksummed by the demo itself,
# exit 0 only if all arrived intact), in a runtime directory of its own that
# must be empty afterwards (no name, socket or memory left behind).
set -uo pipefail
demo=$1
dir=$(mktemp -d /tmp/ferry-test-demo-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
export FERRY_RUNTIME_DIR=$dir
rc=0
for transport in shm tcp; do
	echo "== demo --transport $transport"
	if ! timeout -k 5 240 "$demo" --transport "$transport" --requests 3 --chunks 4 \
		--kv-mib 24 --pace-us 500 --quiet; then
		echo "demo over $transport failed" >&2
		rc=1
	fi
	left=$(find "$dir" -mindepth 1 | head -5)
	if [[ -n $left ]]; then
		echo "demo over $transport left files behind: $left" >&2
		rc=1
	fi
done
exit $rc
