#!/usr/bin/env python3
"""Render the results tables of the bench_tcp section of docs/benchmarks.md.

Usage: python3 bench/report_tcp.py [bench/results/bench_tcp.json]
Prints Markdown on stdout; paste it under "### Results" of that section.
"""
import json
import sys


def s3(x, fmt="{:.3g}", div=1.0):
    f = lambda v: fmt.format(v / div)
    return f"{f(x['median'])} [{f(x['min'])}–{f(x['max'])}]"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/bench_tcp.json"
    with open(path) as fh:
        r = json.load(fh)
    m = r["machine"]
    print(f"Run of {r['date']} — {m['cpus']} vCPU {m['cpu']}, kernel `{m['kernel']}`; load "
          f"average {m['loadavg1_start']} at the start, {m['loadavg1_end']} at the end; "
          f"{r['mode']}; peers: {r['peers'].get('info', '')}; medians of {r['reps']} reps "
          f"[min–max].\n")
    print("#### Targets\n")
    print("| target | ferry | peer | result |\n| --- | --- | --- | --- |")
    for k, t in r["targets"].items():
        if not isinstance(t, dict):
            continue
        res = {"pass": "**pass**", "fail": "**FAIL**"}.get(t["verdict"], t["verdict"])
        print(f"| `{k}` | {t['ferry']:.3g} | {t['peer']:.3g} | {res} |")
    pr = r.get("paired", {})
    if pr:
        print("\nPaired, rep by rep (each peer rep runs right after ferry's rep): ratio "
              "ferry / peer, median [min–max], and the reps where ferry did as well or better.\n")
        print("| comparison | ferry / peer | reps as good or better |\n| --- | --- | --- |")
        for k, t in pr.items():
            print(f"| `{k}` | {s3(t['ferry_over_peer'], '{:.2f}')} | "
                  f"{t['reps_ferry_as_good_or_better']} of {t['reps']} |")
    print("\n#### Latency, one way (RTT / 2), 64 B and 64 KiB\n")
    print("| who | 64 B p50 | 64 B p99 | 64 KiB p50 | 64 KiB p99 |\n| --- | --- | --- | --- | --- |")
    l = r["latency_one_way_ns"]
    print(f"| ferry tcp (MANUAL, busy) | {s3(l['64B']['p50'], '{:.1f}', 1000)} µs | "
          f"{s3(l['64B']['p99'], '{:.1f}', 1000)} µs | {s3(l['64KiB']['p50'], '{:.1f}', 1000)} µs | "
          f"{s3(l['64KiB']['p99'], '{:.1f}', 1000)} µs |")
    p = r["peers"]
    if "ucx_tag_lat_64" in p:
        print(f"| UCX tcp `tag_lat` (p50 one way) | {s3(p['ucx_tag_lat_64'], '{:.1f}')} µs | | | |")
    if "qperf_tcp_lat_64" in p:
        print(f"| qperf `tcp_lat` (average one way) | {s3(p['qperf_tcp_lat_64'], '{:.1f}')} µs | | | |")
    print("\n#### Bandwidth (GB/s = 10^9 B/s)\n")
    print("| who | 64 KiB | 4 MiB | 1 GiB |\n| --- | --- | --- | --- |")
    b = r["bandwidth_GBps"]
    cell = lambda k: s3(b[k], "{:.2f}") if k in b else "—"
    conns = "default connections (4)" if "connections" in r else "2 connections"
    print(f"| ferry tcp, zero copy, {conns} | {cell('64KiB')} | {cell('4MiB')} | {cell('1GiB')} |")
    g = lambda k: s3(p[k], "{:.2f}") if k in p else "—"
    print(f"| UCX tcp `tag_bw` | {g('ucx_tag_bw_65536')} | {g('ucx_tag_bw_4194304')} | |")
    print(f"| iperf3, one stream | | {g('iperf3_stream_0')} (stream) | |")
    print(f"| qperf `tcp_bw` 4 MiB messages | | {g('qperf_tcp_bw_4194304')} | |")
    v = r.get("veth")
    if v and v.get("ran"):
        print("\n#### Across a veth pair between two namespaces\n")
        print("| who | 64 B one way p50 | 64 KiB one way p50 | 64 KiB GB/s | 4 MiB GB/s |\n"
              "| --- | --- | --- | --- | --- |")
        print(f"| ferry tcp (MANUAL, busy) | {s3(v['latency_64B_one_way_ns_p50'], '{:.1f}', 1000)} µs | "
              f"{s3(v['latency_64KiB_one_way_ns_p50'], '{:.1f}', 1000)} µs | "
              f"{s3(v['bandwidth_64KiB_GBps'], '{:.2f}')} | {s3(v['bandwidth_4MiB_GBps'], '{:.2f}')} |")
        print(f"| UCX tcp `tag_lat` / `tag_bw` | {g('veth_ucx_tag_lat_64')} µs | | "
              f"{g('veth_ucx_tag_bw_65536')} | {g('veth_ucx_tag_bw_4194304')} |")
        print(f"| iperf3, one stream | | | | {g('veth_iperf3_stream_0')} |")
        print(f"| qperf `tcp_lat` / `tcp_bw` 4 MiB | {g('veth_qperf_tcp_lat_64')} µs (avg) | | | "
              f"{g('veth_qperf_tcp_bw_4194304')} |")
    elif v:
        print(f"\n(veth section not run: {v.get('why', '')})")
    print("\n#### Connections per peer, 4 MiB (GB/s)\n")
    print("| connections | GB/s |\n| --- | --- |")
    for k, v in r["conns_4MiB_GBps"].items():
        print(f"| {k} | {s3(v, '{:.2f}')} |")


if __name__ == "__main__":
    main()
