#!/usr/bin/env python3
"""Render the results tables of the bench_shm section of docs/benchmarks.md.

Usage: python3 bench/report_shm.py [bench/results/bench_shm.json]
Prints Markdown on stdout; paste it under "### Results" of that section.
"""
import json
import sys


def med(x):
    return x["median"]


def lat(x, div=1.0, unit="ns", fmt="{:.0f}"):
    p50, p99 = x["one_way_p50_ns"], x["one_way_p99_ns"]
    f = lambda v: fmt.format(v / div)
    return (f"{f(med(p50))} {unit} [{f(p50['min'])}–{f(p50['max'])}]", f"{f(med(p99))} {unit}")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/bench_shm.json"
    with open(path) as fh:
        r = json.load(fh)
    m, c = r["machine"], r["config"]
    ucx = r["ucx"] if isinstance(r["ucx"], dict) else None
    print(f"Run of {r['date']} — {m['cpus']} vCPU {m['cpu']}, kernel `{m['kernel']}`; load "
          f"average {m['loadavg1_start']} at the start, {m['loadavg1_end']} at the end; parent "
          f"on CPU {c['parent_cpu']}, peer on CPU {c['peer_cpu']}; "
          + (f"UCX {ucx['version']} ({ucx['netns']}); " if ucx else "UCX not run; ")
          + f"medians of {c['reps']} reps, [min–max]; {r['elapsed_s']} s.\n")

    print("#### Targets\n")
    print("| target | value | threshold | result |\n| --- | --- | --- | --- |")
    for t in r["targets"]:
        v, th = t["value"], t["threshold"]
        fv = lambda x: x if isinstance(x, str) else f"{x:.4g}"
        res = {"pass": "**pass**", "fail": "**FAIL**"}.get(t["result"], t["result"])
        print(f"| `{t['name']}`: {t['target']} | {fv(v)} {t['unit']} | {fv(th)} {t['unit']} | {res} |")
    pv = r.get("paired_vs_ucx")
    if pv:
        x = pv["busy_manual_copy_p50_vs_ucx_tag_lat_64B"]
        print(f"\nPaired, rep by rep (a UCX `tag_lat` run right after each rep of ferry's busy "
              f"MANUAL copy ping-pong): ferry / UCX {x['median']:.2f} [{x['min']:.2f}–"
              f"{x['max']:.2f}]; ferry as fast or faster in {pv['reps_ferry_as_fast_or_faster']} "
              f"of {pv['reps']} reps.")
        o = pv.get("busy_one_poller_copy_p50_vs_ucx_tag_lat_64B")
        if o:
            print(f"With one poller (`FERRY_ENGINE_SINGLE_POLLER | FERRY_ENGINE_BUSY_POLL`, the "
                  f"promise of UCX's single-thread worker): {o['median']:.2f} [{o['min']:.2f}–"
                  f"{o['max']:.2f}]; as fast or faster in "
                  f"{pv['reps_one_poller_as_fast_or_faster']} of {pv['reps']} reps.")

    fl, l = r["floor"], r["latency_64B"]
    u64 = med(ucx["tag_lat_64B"]["p50_us"]) * 1000 if ucx else None
    efd = med(fl["eventfd_wakeup_paused"]["one_way_p50_ns"])
    print("\n#### 64 B one-way latency\n")
    print("| | p50 | p99 | p50 ratio |\n| --- | --- | --- | --- |")
    p50, p99 = lat(fl["shm_spin_pingpong_64B"])
    print(f"| floor: shared cache line, both spinning | {p50} | {p99} | |")
    if ucx:
        for k in ("tag_lat_64B", "tag_lat_8B"):
            x = ucx[k]["p50_us"]
            print(f"| UCX shm `{k.replace('_64B', '').replace('_8B', '')}` {k.split('_')[-1]} | "
                  f"{med(x) * 1000:.0f} ns [{x['min'] * 1000:.0f}–{x['max'] * 1000:.0f}] | | |")
    for key, name in (("busy_manual", "busy, MANUAL"),
                      ("busy_manual_one_poller", "busy, MANUAL, one poller"),
                      ("busy_thread", "busy, THREAD + reactor callbacks")):
        if key not in l:
            continue  # a run before the one-poller row
        for v in ("copy", "zero_copy"):
            p50, p99 = lat(l[key][v])
            ratio = f"{med(l[key][v]['one_way_p50_ns']) / u64:.2f} × UCX" if u64 else ""
            print(f"| ferry {name}, {v.replace('_', '-')} | {p50} | {p99} | {ratio} |")
    for k, name in (("eventfd_wakeup", "floor: eventfd wake-up, back to back"),
                    ("eventfd_wakeup_paused", "floor: eventfd wake-up, 200 µs pause (both asleep)")):
        p50, p99 = lat(fl[k], 1000, "µs", "{:.1f}")
        print(f"| {name} | {p50} | {p99} | |")
    for key, name in (("adaptive_manual", "adaptive, MANUAL (callers asleep in `ferry_cq_wait`)"),
                      ("adaptive", "adaptive, THREAD (reactors and callers asleep)")):
        for v in ("copy", "zero_copy"):
            p50, p99 = lat(l[key][v], 1000, "µs", "{:.1f}")
            print(f"| ferry {name}, {v.replace('_', '-')} | {p50} | {p99} | "
                  f"{med(l[key][v]['one_way_p50_ns']) / efd:.2f} × the paused floor |")
    p50, p99 = lat(l["adaptive_spin_1us"]["copy"], 1000, "µs", "{:.1f}")
    print(f"| ferry adaptive, THREAD, spin 1 µs, copy (diagnostic) | {p50} | {p99} | "
          f"{med(l['adaptive_spin_1us']['copy']['one_way_p50_ns']) / efd:.2f} × the paused floor |")

    bw = r["bandwidth"]
    print("\n#### Bandwidth (MANUAL, streamed)\n")
    print("| size | window | memcpy (floor) | memcpy into the pool | copy path | copy / memcpy "
          "(paired) | UCX shm `tag_bw` | zero-copy, per transfer |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in ("64KiB", "4MiB", "64MiB", "1GiB"):
        b = bw.get(k)
        if not b or "skipped" in b:
            continue
        uk = {"64KiB": "tag_bw_64KiB", "4MiB": "tag_bw_4MiB"}.get(k)
        ub = f"{med(ucx[uk]['gb_per_s']):.2f} GB/s" if ucx and uk else ""
        print(f"| {k} | {b['window']} | {med(b['memcpy_gb_per_s']):.2f} GB/s | "
              f"{med(b['memcpy_into_pool_gb_per_s']):.2f} GB/s | {med(b['copy_gb_per_s']):.2f} GB/s | "
              f"{b['ratio_copy_vs_memcpy']:.3f} ({b['ratio_copy_vs_memcpy_paired']:.3f}) | {ub} | "
              f"{med(b['zero_copy_us_per_transfer']):.2f} µs |")

    g = r["put_get_190MB"]
    print("\n#### 190 MB (190,000,000 B) PUT → GET\n")
    print("| path | p50 | [min–max] |\n| --- | --- | --- |")
    for k, name in (("zero_copy_manual", "zero-copy, MANUAL (both spinning)"),
                    ("zero_copy_thread_adaptive", "zero-copy, THREAD default spin, receiver asleep"),
                    ("copy_manual", "copy (PUT of an iovec: one 190 MB copy), MANUAL")):
        x = g[k]["ms"]
        print(f"| {name}, {g[k]['reps']} reps | {med(x):.4f} ms | [{x['min']:.4f}–{x['max']:.4f} ms] |")


if __name__ == "__main__":
    main()
