#!/usr/bin/env bash
# tests/api_threads_check.sh HEADER... - every public function and callback
# type says from which threads it may be called or where it runs (what a
# binding holding an interpreter lock must know): the comment just above
# its declaration (or above the group of declarations it belongs to) holds
# a thread-safety sentence. Prints each one that lacks it and fails.
set -uo pipefail
rc=0
for h in "$@"; do
	awk -v file="$h" '
	# A comment block that starts a line: the doc of what follows it.
	/^\/\*/ { doc = ""; incomment = 1 }
	incomment {
		line = $0
		sub(/^[ \t]*\*[ \t]?/, "", line) # a continuation line'"'"'s " * "
		doc = doc " " line
		if ($0 ~ /\*\//)
			incomment = 0
		next
	}
	/^(FERRY_API|FERRY_INLINE) / || /^typedef .*\(/ {
		if (match($0, /ferry_[a-z0-9_]+[ ]*\(/) == 0)
			next
		name = substr($0, RSTART, RLENGTH - 1)
		sub(/[ ]+$/, "", name)
		if (doc !~ /([Aa]ny thread|thread only|queue.s thread|holds the buffer|Safe from several threads|runs on the thread|"Threads" above)/) {
			printf "%s: %s: no thread-safety sentence in its comment\n", file, name
			bad = 1
		}
	}
	END { exit bad }
	' "$h" || rc=1
done
[[ $rc == 0 ]] && echo "api_threads_check: every public function says its threads"
exit $rc
