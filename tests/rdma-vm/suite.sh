#!/bin/bash
# tests/rdma-vm/suite.sh BUILD_DIR [PROGRAM...] - inside ferry's RDMA test
# guest (vm.sh run): run each RDMA test program of BUILD_DIR/tests (by
# default tests/rdma-vm/tests.list), each bounded by FERRY_RDMA_TEST_TIMEOUT
# seconds (300), its output kept in /tmp/ferry-rdma/NAME.log and shown when
# it fails; print "rdma guest: N passed, M failed, K skipped"; exit 0 only
# when none failed. A program that skips (77) inside the guest is a
# failure: here it has everything it needs. An entry NAME.py is a Python
# script of tests/rdma-vm run with $FERRY_RDMA_PYTHON (by default the
# checkout's build-py/venv/bin/python, which ./run pytest makes); without a
# python that imports pyferry it is skipped, and said so. An entry san:NAME
# is NAME of the ASan+UBSan build ($FERRY_RDMA_SAN_BUILD, by default
# build-san/ beside BUILD_DIR), run with leak checks and stopping at the
# first sanitizer report; skipped, and said so, where that build is not.
set -u
[ "$(cat /proc/sys/kernel/hostname)" = ferry-rdma-vm ] ||
	{ echo "suite.sh runs inside ferry's RDMA guest (tests/rdma-vm/vm.sh run)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
build=$1
shift
progs=("$@")
if ((${#progs[@]} == 0)); then
	while read -r p; do
		[[ -n $p && $p != \#* ]] && progs+=("$p")
	done <"$here/tests.list"
fi
mkdir -p /tmp/ferry-rdma
# TCG emulates the guest: as slow as valgrind, so the tests take its sizes and bounds.
export FERRY_TEST_SLOW=1
pass=0 fail=0 skip=0
py=${FERRY_RDMA_PYTHON:-$here/../../build-py/venv/bin/python}
for p in "${progs[@]}"; do
	t0=$(date +%s)
	cmd=("$build/tests/$p")
	if [[ $p == san:* ]]; then
		san=${FERRY_RDMA_SAN_BUILD:-$build/../build-san}
		if [[ ! -x $san/tests/${p#san:} ]]; then
			skip=$((skip + 1))
			echo "rdma guest: SKIP $p (no $san/tests/${p#san:}: ./run test builds build-san/)"
			continue
		fi
		cmd=(env "ASAN_OPTIONS=detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
		     "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
		     "$san/tests/${p#san:}")
	fi
	if [[ $p == *.py ]]; then
		if ! "$py" -c 'import pyferry' >/dev/null 2>&1; then
			skip=$((skip + 1))
			echo "rdma guest: SKIP $p (no python with pyferry at $py: ./run pytest makes it)"
			continue
		fi
		cmd=("$py" "$here/$p")
	fi
	log=/tmp/ferry-rdma/${p//:/_}.log
	timeout -k 5 "${FERRY_RDMA_TEST_TIMEOUT:-300}" "${cmd[@]}" >"$log" 2>&1
	rc=$?
	dt=$(($(date +%s) - t0))
	cases=$(grep -E 'case\(s\) run apart' "$log" | tail -n 1 | sed 's/^.*: //')
	if ((rc == 0)); then
		pass=$((pass + 1))
		echo "rdma guest: PASS $p (${dt}s; $cases)"
	else
		fail=$((fail + 1))
		echo "rdma guest: FAIL $p (exit $rc, ${dt}s; $cases)"
		if [[ $p == *.py ]]; then
			tail -n 40 "$log"
		else
			grep -E 'FAILED|ERROR|error:|rdma:|Sanitizer|runtime error' "$log" | head -n 60
		fi
	fi
done
echo "rdma guest: $pass passed, $fail failed, $skip skipped"
((fail == 0))
