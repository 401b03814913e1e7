#!/usr/bin/env python3
"""Render the results tables of docs/benchmarks.md from bench_core's JSON.

Usage: python3 bench/report.py [bench/results/bench_core.json]
Prints Markdown on stdout; paste it under "## Results".
"""
import json
import sys


def med(x):
    return x["median"]


def rng(x, fmt="{:.1f}"):
    return "[" + fmt.format(x["min"]) + "–" + fmt.format(x["max"]) + "]"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/bench_core.json"
    with open(path) as f:
        r = json.load(f)
    m = r["machine"]
    print(f"Run of {r['date']} — {m['cpus']} vCPU {m['cpu']}, kernel `{m['kernel']}`; "
          f"load average {m['loadavg1_start']} at the start, {m['loadavg1_end']} at the end; "
          f"medians of {r['config']['reps']} reps, [min–max].\n")

    print("### Targets\n")
    print("| target | value | result |\n| --- | --- | --- |")
    for t in r["targets"]:
        print(f"| `{t['name']}` {t['target']} | {t['value']} | "
              f"{'**pass**' if t['pass'] else '**FAIL**'} |")

    n, fl = r["nop"], r["floor"]
    print("\n### NOP submit → complete\n")
    print("| | ns/op | ops/s | time vs io_uring, same batch |\n| --- | --- | --- | --- |")
    rows = [("io_uring NOP, batch 1 (floor)", fl["io_uring_nop_batch1"], None),
            ("ferry MANUAL, batch 1", n["manual_batch1"], fl["io_uring_nop_batch1"]),
            ("io_uring NOP, batch 32 (floor)", fl["io_uring_nop_batch32"], None),
            ("ferry MANUAL, batch 32", n["manual_batch32"], fl["io_uring_nop_batch32"]),
            ("ferry THREAD, batch 32", n["thread_batch32"], fl["io_uring_nop_batch32"])]
    for name, x, ref in rows:
        ratio = "1" if ref is None else f"{med(x['ns_per_op']) / med(ref['ns_per_op']):.2f} ×"
        print(f"| {name} | {med(x['ns_per_op']):.1f} {rng(x['ns_per_op'])} | "
              f"{med(x['ops_per_s']) / 1e6:.2f} M | {ratio} |")

    lat = r["latency_64B"]
    print("\n### 64 B PUT → GET latency (PUT submit → GET complete)\n")
    print("| mode | GET into an iovec p50 / p99 | zero-copy GET p50 / p99 |\n| --- | --- | --- |")
    mm, th = lat["manual"], lat["thread"]
    print(f"| MANUAL, both engines driven by one thread | {med(mm['get_iovec']['p50_ns'])} / "
          f"{med(mm['get_iovec']['p99_ns'])} ns | {med(mm['get_zero_copy']['p50_ns'])} / "
          f"{med(mm['get_zero_copy']['p99_ns'])} ns |")
    print(f"| THREAD, caller polling | {med(th['get_iovec']['p50_ns']) / 1e3:.1f} / "
          f"{med(th['get_iovec']['p99_ns']) / 1e3:.1f} µs | "
          f"{med(th['get_zero_copy']['p50_ns']) / 1e3:.1f} / "
          f"{med(th['get_zero_copy']['p99_ns']) / 1e3:.1f} µs |")
    w = th["get_zero_copy_caller_in_cq_wait"]
    print(f"| THREAD, caller asleep in `ferry_cq_wait` | | {med(w['p50_ns']) / 1e3:.1f} / "
          f"{med(w['p99_ns']) / 1e3:.1f} µs |")

    bw = r["bandwidth"]
    print("\n### PUT → GET bandwidth (MANUAL mode)\n")
    print("| size | memcpy (floor) | memcpy into the pool | copy PUT→GET | copy / memcpy "
          "(paired) | zero-copy cycle |\n| --- | --- | --- | --- | --- | --- |")
    for size in ("4MiB", "64MiB"):
        b = bw[size]
        cyc = b["bytes"] / med(b["zero_copy_put_get_gb_per_s"]) / 1e9 * 1e6
        print(f"| {size} | {med(b['memcpy_gb_per_s']):.2f} GB/s {rng(b['memcpy_gb_per_s'], '{:.2f}')} | "
              f"{med(b['memcpy_into_pool_gb_per_s']):.2f} GB/s | "
              f"{med(b['copy_put_get_gb_per_s']):.2f} GB/s {rng(b['copy_put_get_gb_per_s'], '{:.2f}')} | "
              f"{b['ratio_copy_put_get_vs_memcpy']:.3f} ({med(b['ratio_copy_put_get_vs_memcpy_paired']):.3f}) | "
              f"{cyc:.2f} µs |")

    z = r["zero_copy_put_get"]
    print(f"\n### Zero-copy PUT → GET against size\n\nPool of {z['pool_bytes'] >> 20} MiB, "
          f"{'prefaulted' if z['prefault'] else 'not prefaulted'} at creation "
          f"({z['pool_create_s']:.2f} s).\n")
    print("| buffer | p50 | p99 | `ferry_buf_alloc` p50 | `ferry_buf_release` mean |\n"
          "| --- | --- | --- | --- | --- |")
    for s in z["sizes"]:
        b = s["bytes"]
        name = f"{b >> 30} GiB" if b >= 1 << 30 else f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        print(f"| {name} | {med(s['p50_ns'])} ns | {med(s['p99_ns'])} ns | "
              f"{med(s['buf_alloc_p50_ns'])} ns | {med(s['buf_release_mean_ns'])} ns |")
    print(f"\n1 GiB / 4 KiB time: {z['growth_1GiB_vs_4KiB']}.")


if __name__ == "__main__":
    main()
