#!/usr/bin/env python3
"""Render the results table of the bench_stream section of docs/benchmarks.md.

Usage: python3 bench/report_stream.py [bench/results/bench_stream.json]
Prints Markdown on stdout; paste it under "### Results" of that section.
"""
import json
import sys

NAMES = {
    "lat_4k": "latency, 4 KiB chunks (paced)",
    "lat_1m": "latency, 1 MiB chunks (paced)",
    "bw_4k": "throughput, 4 KiB chunks",
    "bw_1m": "throughput, 1 MiB chunks",
}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/bench_stream.json"
    with open(path) as fh:
        r = json.load(fh)
    m = r["machine"]
    print(f"Run of {r['date']} over {r.get('transport', 'shm')} — {m['cpus']} vCPU, kernel `{m['kernel']}`; load average "
          f"{m['loadavg1_start']} at the start, {m['loadavg1_end']} at the end; medians of "
          f"{r['reps']} alternating reps [min–max].\n")
    print("| case | raw p50 / p99 | stream p50 / p99 | raw chunks/s | stream chunks/s "
          "| stream / raw p50 | p99 | time per chunk | target ≤ 1.10 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k, c in r["cases"].items():
        raw, st, q = c["raw"], c["stream"], c["stream_over_raw"]
        lat = lambda x: (f"{x['p50_ns']['median']:.0f} ns [{x['p50_ns']['min']:.0f}–"
                         f"{x['p50_ns']['max']:.0f}] / {x['p99_ns']['median']:.0f} ns")
        worst = q["p50"] if k.startswith("lat") else q["time_per_byte"]
        verdict = "**pass**" if worst <= 1.10 else "**FAIL**"
        def rate(x):
            v = x["gbps"]["median"] * 1e9 / c["size"]
            return f"{v / 1e6:.2f} M" if v >= 1e5 else f"{v / 1e3:.1f} k"
        print(f"| {NAMES.get(k, k)} | {lat(raw)} | {lat(st)} | {rate(raw)} "
              f"| {rate(st)} | {q['p50']:.3f} | {q['p99']:.3f} "
              f"| {q['time_per_byte']:.3f} | {verdict} |")


if __name__ == "__main__":
    main()
