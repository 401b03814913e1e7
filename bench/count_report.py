#!/usr/bin/env python3
"""Instructions per op from bench/count.sh's callgrind dumps.

Usage: count_report.py DIR N COMMIT   -> JSON on stdout
       count_report.py --table JSON   -> the Markdown table of docs/benchmarks.md

DIR holds one folder per run (inproc, inproc_whole, idle, shm, shm_zc, tcp, ucx_shm,
ucx_tcp, ucx_sync_shm, ucx_sync_tcp), each with callgrind files cg.<pid>[.<k>]; a file's "desc: Trigger:
Client Request: NAME" line names the window it dumped, its "totals:" line
the instructions collected in it (only collection windows are ever on).

Each figure is also split (per_op_driver, per_op_library): the driver is
the program around the library, whose instructions the rows include:
count_hop's own code (functions in bench/, inlined ones included, found
with callgrind_annotate), and for UCX ucx_perftest's code and our shim's
(bench/shim/ucx_count.c); the library is the rest (its libc calls too).
"""
import glob
import json
import os
import re
import subprocess
import sys

DRIVER_OBJECTS = ("/ucx_perftest", "/ucx_count.so")


def driver_ir(path):
    """Instructions of a dump spent in the driver's own functions (None: no callgrind_annotate)."""
    try:
        out = subprocess.run(["callgrind_annotate", "--threshold=100", path],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    total, drv = None, 0
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(PROGRAM TOTALS|(\S+?):(\S+)(?:\s+\[(.*)\])?)\s*$",
                     line)
        if not m:
            continue
        ir = int(m.group(1).replace(",", ""))
        if m.group(2) == "PROGRAM TOTALS":
            total = ir
            continue
        if ir == total:
            continue  # a frame the window started inside of (main and above): not its own cost
        fl, ob = m.group(3), m.group(5) or ""
        if fl.startswith("bench/") or "/bench/" in fl or ob.endswith(DRIVER_OBJECTS):
            drv += ir
    return drv


def dump(path):
    """(window name, Ir) of one callgrind dump; either is None when it says none."""
    name, ir = None, None
    with open(path) as f:
        for line in f:
            m = re.match(r"desc: Trigger: Client Request: (\S+)", line)
            if m:
                name = m.group(1)
            m = re.match(r"(?:totals|summary): (\d+)", line)
            if m:
                ir = int(m.group(1))
    return name, ir


def dumps(folder, driver=False):
    """{window name: [Ir, ...]} over every file of folder (one per process);
    driver: the driver's share of each instead."""
    out = {}
    for path in glob.glob(os.path.join(folder, "cg.*")):
        name, ir = dump(path)
        if name and ir is not None:
            out.setdefault(name, []).append(driver_ir(path) if driver else ir)
    return out


def ucx_hop(folder, n, driver=False):
    """Per one-way hop: each side's window less its idle progress calls, averaged
    (driver: of the driver's instructions only)."""
    sides = []
    logs = [os.path.join(folder, x) for x in ("srv.log", "cli.log")]
    files = {}
    for path in glob.glob(os.path.join(folder, "cg.*")):
        pid = os.path.basename(path).split(".")[1]
        files.setdefault(pid, []).append(path)
    stats = []
    for log in logs:
        with open(log) as f:
            for line in f:
                m = re.search(r"ucx_count: window ops=(\d+) progress_calls=(\d+) idle_calls=(\d+); "
                              r"idle ops=(\d+) of which returned 0: (\d+)", line)
                if m:
                    stats.append([int(x) for x in m.groups()])
    for pid, paths in files.items():
        d = dumps_of(paths, driver)
        if "ucx_window" in d and "ucx_idle" in d:
            sides.append(d)
    if len(sides) != 2 or len(stats) != 2:
        return None
    # match a side's dumps to its log line: the process's idle window is the same
    # size on both, so pair them by the order of the idle-call counts (either works
    # for the sum; each side is reported with its own calls)
    per = []
    idle_costs = []
    for d, st in zip(sorted(sides, key=lambda d: d["ucx_window"] or 0),
                     sorted(stats, key=lambda s: s[2])):
        if d["ucx_window"] is None or d["ucx_idle"] is None:
            return None
        ops, calls, idle_calls, idle_ops, _ = st
        idle_cost = d["ucx_idle"] / idle_ops
        idle_costs.append(idle_cost)
        per.append((d["ucx_window"] - idle_calls * idle_cost) / ops)
    return {"hop": sum(per) / 2, "sides": per, "idle_progress": sum(idle_costs) / 2}


def dumps_of(paths, driver=False):
    """{window name: Ir} of the dumps of one process (driver: the driver's share)."""
    out = {}
    for path in paths:
        name, ir = dump(path)
        if name and ir is not None:
            out[name] = driver_ir(path) if driver else ir
    return out


def per_op(dirname, n, driver=False):
    """{row: instructions per op} (driver: of the driver's own code only)."""
    p = {}

    def one(folder, window):
        d = dumps(os.path.join(dirname, folder), driver)
        if window not in d or None in d[window]:
            return None
        return sum(d[window]) / len(d[window]) / n

    p["inproc_put_get_64"] = one("inproc", "inproc")
    p["inproc_whole_64"] = one("inproc_whole", "inproc_whole")
    p["idle_poll"] = one("idle", "idle")
    for how in ("shm", "shm_zc", "tcp"):
        d = dumps(os.path.join(dirname, how), driver)
        if how in d and len(d[how]) == 2 and None not in d[how]:
            p[how + "_hop_64"] = sum(d[how]) / (2 * n)
        idle = [v for k, vs in d.items() if k.startswith("idle_") for v in vs]
        if idle and how != "shm_zc" and None not in idle:
            p["idle_poll_" + how] = sum(idle) / len(idle) / n
    for tls in ("shm", "tcp"):
        folder = os.path.join(dirname, "ucx_" + tls)
        u = ucx_hop(folder, n, driver) if os.path.isdir(folder) else None
        p["ucx_%s_hop_64" % tls] = u["hop"] if u else None
        p["ucx_%s_idle_progress" % tls] = u["idle_progress"] if u else None
        # tag_sync_lat: the send completes once the receiver matched it, as a PUT does
        folder = os.path.join(dirname, "ucx_sync_" + tls)
        u = ucx_hop(folder, n, driver) if os.path.isdir(folder) else None
        p["ucx_%s_sync_hop_64" % tls] = u["hop"] if u else None
    for k, v in p.items():
        if v is not None:
            p[k] = round(v, 1)
    return p


def collect(dirname, n, commit):
    r = {"tool": "callgrind (Ir: instructions executed, user space)", "n": n, "commit": commit,
         "per_op": per_op(dirname, n), "targets": {}}
    p = r["per_op"]
    r["per_op_driver"] = per_op(dirname, n, driver=True)
    r["per_op_library"] = {k: (round(v - r["per_op_driver"][k], 1)
                               if v is not None and r["per_op_driver"].get(k) is not None
                               else None) for k, v in p.items()}
    t = r["targets"]

    def target(name, value, limit):
        if value is not None and limit is not None:
            t[name] = {"value": value, "limit": limit, "met": value <= limit}

    target("shm_hop_64 <= 1100", p.get("shm_hop_64"), 1100)
    target("shm_zc_hop_64 <= 1400", p.get("shm_zc_hop_64"), 1400)
    target("inproc_put_get_64 <= 800", p.get("inproc_put_get_64"), 800)
    target("idle_poll <= 150", p.get("idle_poll"), 150)
    target("tcp_hop_64 <= ucx_tcp_hop_64", p.get("tcp_hop_64"), p.get("ucx_tcp_hop_64"))
    return r


def table(path):
    with open(path) as f:
        r = json.load(f)
    rows = [
        ("in-process 64 B PUT → GET (PUT prep → GET CQE)", "inproc_put_get_64"),
        ("in-process 64 B PUT → GET, whole (both CQEs reaped)", "inproc_whole_64"),
        ("idle `ferry_cq_poll` (in-process peer)", "idle_poll"),
        ("idle `ferry_cq_poll` (live shm connection)", "idle_poll_shm"),
        ("idle `ferry_cq_poll` (live tcp connection)", "idle_poll_tcp"),
        ("shm 64 B one-way hop, copy", "shm_hop_64"),
        ("shm 64 B one-way hop, zero copy", "shm_zc_hop_64"),
        ("tcp 64 B one-way hop (user space)", "tcp_hop_64"),
        ("UCX `tag_lat` 64 B hop, shm", "ucx_shm_hop_64"),
        ("UCX idle `ucp_worker_progress`, shm", "ucx_shm_idle_progress"),
        ("UCX `tag_lat` 64 B hop, tcp (user space)", "ucx_tcp_hop_64"),
        ("UCX idle `ucp_worker_progress`, tcp", "ucx_tcp_idle_progress"),
        ("UCX `tag_sync_lat` 64 B hop, shm (acknowledged, as a PUT)", "ucx_shm_sync_hop_64"),
        ("UCX `tag_sync_lat` 64 B hop, tcp (acknowledged; user space)", "ucx_tcp_sync_hop_64"),
    ]
    def fmt(v):
        return "—" if v is None else "{:,.0f}".format(v)

    print("| path | instructions per op | of which the driver | the library |\n"
          "| --- | ---: | ---: | ---: |")
    for label, key in rows:
        print("| %s | %s | %s | %s |" % (label, fmt(r["per_op"].get(key)),
                                         fmt(r.get("per_op_driver", {}).get(key)),
                                         fmt(r.get("per_op_library", {}).get(key))))
    print()
    for name, t in r["targets"].items():
        print("target %-32s %10.0f  limit %8.0f  %s" % (name, t["value"], t["limit"],
                                                       "met" if t["met"] else "NOT met"))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        table(sys.argv[2])
        return
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    print(json.dumps(collect(sys.argv[1], int(sys.argv[2]), sys.argv[3]), indent=1))


if __name__ == "__main__":
    main()
