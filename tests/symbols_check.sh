#!/usr/bin/env bash
# tests/symbols_check.sh LIBFERRY.a LIBFERRY.so HEADER... - what the installed
# libraries show a program linked to them:
#   libferry.a   every global symbol it defines is ferry_ and public (the
#                internal names, pool_alloc or ferry__op_complete, are local:
#                a static consumer can not clash with them);
#   libferry.so  it exports exactly the functions api/ferry.h declares with
#                FERRY_API (and the FERRY_INLINE helpers, out of line), each
#                under the version node FERRY_0.
set -uo pipefail
a=$1 so=$2
shift 2
header="$*"
rc=0
# The first identifier followed by '(' on each FERRY_API line is the function;
# FERRY_INLINE ones (the SQE helpers) are exported out of line too.
want=$(cat "$@" | grep -E '^FERRY_(API|INLINE) ' |
	sed -E 's/^FERRY_(API|INLINE) [^(]*[ *]([a-z_0-9]+)\(.*/\2/' | sort -u)
nwant=$(printf '%s\n' "$want" | grep -c .)
if ((nwant < 20)); then
	echo "symbols_check: found only $nwant FERRY_API functions in $header" >&2
	exit 1
fi

bad=$(nm -g --defined-only "$a" | awk 'NF == 3 { print $3 }' | grep -vE '^ferry_[a-z0-9]' | sort -u)
if [[ -n $bad ]]; then
	echo "symbols_check: $a defines globals that are not public ferry_ names:" >&2
	printf '  %s\n' $bad >&2
	rc=1
fi
have_a=$(nm -g --defined-only "$a" | awk 'NF == 3 && $2 == "T" { print $3 }' | sort -u)
if [[ $have_a != "$want" ]]; then
	echo "symbols_check: $a's functions differ from $header's FERRY_API ones:" >&2
	diff <(printf '%s\n' "$want") <(printf '%s\n' "$have_a") >&2
	rc=1
fi

exported=$(nm -D --defined-only "$so" | awk '$2 != "A" { print $3 }')
have_so=$(printf '%s\n' "$exported" | sed 's/@.*//' | sort -u)
if [[ $have_so != "$want" ]]; then
	echo "symbols_check: $so exports other than $header's FERRY_API functions:" >&2
	diff <(printf '%s\n' "$want") <(printf '%s\n' "$have_so") >&2
	rc=1
fi
unversioned=$(printf '%s\n' "$exported" | grep -v '@@FERRY_0$' || true)
if [[ -n $unversioned ]]; then
	echo "symbols_check: $so exports names outside the version node FERRY_0:" >&2
	printf '  %s\n' $unversioned >&2
	rc=1
fi
((rc == 0)) && echo "symbols_check: $nwant public functions; libferry.a and libferry.so show nothing else"
exit $rc
