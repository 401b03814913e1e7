#!/usr/bin/env python3
"""bench/ab.py - paired before/after runs of one benchmark.

    python3 bench/ab.py BEFORE_BUILD AFTER_BUILD BENCH [--reps N] [--match REGEX]
                        [--after-args "ARGS"] -- [ARGS...]

Runs BUILD/bench/BENCH ARGS from both builds, alternately, REPS times (the
order flips every rep, so a drift of the machine does not favour one side),
reads each run's JSON and, for every figure whose path matches REGEX (by
default the medians of times, rates and ratios), prints the median over
reps of the per-rep ratio after / before, with the direction that is better
for it (a time: lower; a rate: higher). This machine is noisy: only ratios
of runs interleaved like this are compared (docs/benchmarks.md).
--after-args adds arguments to the after side only (shell words): the same
build twice compares an option, e.g. bench_shm --engine-flags single_poller.
"""
import json
import re
import shlex
import statistics
import subprocess
import sys


def leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            name = v.get("size") or v.get("name") if isinstance(v, dict) else None
            yield from leaves(v, f"{path}[{name if name is not None else i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, float(x)


def run(build, bench, args):
    out = subprocess.run([f"{build}/bench/{bench}", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, check=True, timeout=900).stdout
    return dict(leaves(json.loads(out)))


def lower_is_better(path):
    """A rate (GB/s, ops/s, a ratio) is better higher; a time (ns, us, ms, a
    latency, a cost per transfer) lower."""
    p = path.lower()
    if re.search(r"(gb_?ps|gb_per_s|ops_per_s|ratio|per_s\b)", p):
        return False
    return bool(re.search(r"(_ns|ns_|\bns\b|_us\b|\bus_|\.ms\b|_ms\b|latency|per_transfer|"
                          r"instructions|cpu_s)", p))


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    reps, match = 5, r"\.median$"
    after_args = []
    pos = []
    it = iter(argv)
    for a in it:
        if a == "--reps":
            reps = int(next(it))
        elif a == "--match":
            match = next(it)
        elif a == "--after-args":
            after_args = shlex.split(next(it))
        else:
            pos.append(a)
    if len(pos) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    before, after, bench = pos
    ratios = {}
    for r in range(reps):
        order = [(0, before), (1, after)] if r % 2 == 0 else [(1, after), (0, before)]
        got = {}
        for side, build in order:
            got[side] = run(build, bench, extra + (after_args if side else []))
            print(f"ab: {bench} rep {r + 1}/{reps}: {'after' if side else 'before'} done",
                  file=sys.stderr)
        for k, b in got[0].items():
            a = got[1].get(k)
            if a is None or b == 0 or not re.search(match, k):
                continue
            ratios.setdefault(k, []).append(a / b)
    print(f"# {bench} {' '.join(extra)}: after/before, median of {reps} paired reps"
          + (f" (after: {' '.join(after_args)})" if after_args else ""))
    print(f"{'figure':72s} {'ratio':>7s}  better")
    for k in sorted(ratios):
        v = statistics.median(ratios[k])
        better = "lower" if lower_is_better(k) else "higher"
        print(f"{k:72s} {v:7.3f}  {better}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
