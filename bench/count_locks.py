#!/usr/bin/env python3
"""bench/count_locks.py - locked instructions per op, from callgrind.

    python3 bench/count_locks.py BINARY OPS CALLGRIND_FILE...

BINARY is the program callgrind ran (statically linked with ferry, as
build/bench/count_hop is), the files are its dumps taken with
--dump-instr=yes, OPS what to divide by. Prints the executions of BINARY's
locked instructions (a `lock` prefix, `xchg` with memory, `mfence`) per op,
in all and by function and instruction: the instructions that order memory
between CPUs (about 20 cycles each here, and the only ones a fence or an
atomic costs beyond a plain access on x86-64). Instructions of other
objects (libc) are not counted. For example, per process and round trip of
the 64 B shm ping-pong (docs/benchmarks.md, "One poller"):

    d=$(mktemp -d); export FERRY_RUNTIME_DIR=$d/rt; mkdir -m 0700 $d/rt
    COUNT_ENGINE_FLAGS=busy_poll,single_poller valgrind --tool=callgrind \\
        --collect-atstart=no --dump-instr=yes --callgrind-out-file=$d/cg.%p \\
        build/bench/count_hop hop shm 2000
    python3 bench/count_locks.py build/bench/count_hop 4000 $d/cg.*.1
"""
import collections
import re
import subprocess
import sys


def locked_instructions(binary):
    """{address: (function, instruction)} of binary's locked instructions."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], check=True,
                         capture_output=True, text=True).stdout
    found, fn = {}, None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:", line)
        if m:
            fn = m.group(2)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if not m:
            continue
        ins = m.group(2)
        if (ins.startswith("lock ") or ins.startswith("mfence")
                or re.match(r"xchg\s+%\w+,[-0-9a-fx]*\(", ins)):
            found[int(m.group(1), 16)] = (fn, ins)
    return found


def count(binary, files, locks):
    """Executions of each locked instruction of binary in the dumps."""
    name = "/" + binary.rsplit("/", 1)[-1]
    total = collections.Counter()
    for path in files:
        obs, ours, last, after_call = {}, False, 0, False
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                m = re.match(r"^(c?)ob=\((\d+)\)(?: (.*))?$", line)
                if m:
                    if m.group(3):
                        obs[m.group(2)] = m.group(3)
                    if not m.group(1):
                        ours = obs.get(m.group(2), "").endswith(name)
                    continue
                if line.startswith("calls="):
                    after_call = True  # the next line is the call's cost, not its own
                    continue
                if not line or not (line[0].isdigit() or line[0] in "+-*"):
                    continue
                parts = line.split()
                pos = parts[0]
                if pos.startswith("0x"):
                    addr = int(pos, 16)
                elif pos[0] in "+-":
                    step = int(pos[1:], 16) if pos[1:].startswith("0x") else int(pos[1:])
                    addr = last + step if pos[0] == "+" else last - step
                elif pos == "*":
                    addr = last
                else:
                    addr = int(pos)
                last = addr
                if after_call:
                    after_call = False
                    continue
                if ours and addr in locks:
                    total[locks[addr]] += int(parts[-1])
    return total


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    binary, ops, files = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    total = count(binary, files, locked_instructions(binary))
    print(f"locked instructions per op: {sum(total.values()) / ops:.2f}")
    for (fn, ins), n in total.most_common():
        print(f"{n / ops:8.2f}  {fn}: {ins}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
