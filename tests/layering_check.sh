#!/usr/bin/env bash
# tests/layering_check.sh SRCDIR - the layers keep to themselves:
#   engine/   names no transport and no control plane: it includes none of
#             their headers, and calls none of their functions; only
#             engine/registry.c lists the transports' tables;
#   stage/    includes only the public headers (api/) and its own (the
#             build compiles it with nothing else on its include path too);
#   channel/  the same.
set -uo pipefail
src=$1
rc=0
for f in "$src"/engine/*.[ch]; do
	[[ $(basename "$f") == registry.c ]] && continue
	if grep -nE '#include "(ctl|ctl_[a-z]+|shm|shm_[a-z]+|tcp|tcp_[a-z]+|loop|security|netaddr)\.h"' "$f"; then
		echo "layering_check: $f includes a transport's or the control plane's header" >&2
		rc=1
	fi
	if grep -nE '\b(ferry__(ctl|tcp|shm|loop)_[a-z_]+|(ctl|tcp|shm|loop)_[a-z_]+\()' "$f" |
		grep -vE '^[0-9]+:\s*(/?\*|//)'; then
		echo "layering_check: $f calls into a transport or the control plane" >&2
		rc=1
	fi
done
for layer in stage channel; do
	for f in "$src"/$layer/*.[ch]; do
		[[ -e $f ]] || continue
		while read -r inc; do
			h=${inc#*\"}
			h=${h%\"*}
			if [[ $h != ferry.h && $h != ferry/* && ! -f $src/$layer/$h ]]; then
				echo "layering_check: $f includes \"$h\", which is neither public nor the $layer layer's" >&2
				rc=1
			fi
		done < <(grep -E '^#include "' "$f")
	done
done
((rc == 0)) && echo "layering_check: engine/ names no transport; stage/ and channel/ see only api/ and themselves"
exit $rc
