"""The Python side of pyferry's per-call overhead measurement (overhead.sh
runs it beside overhead.c): the same loops through the binding. Prints ns
per iteration."""
import os
import sys
import tempfile
import time

import pyferry

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
os.environ.setdefault("FERRY_RUNTIME_DIR", tempfile.mkdtemp())
with pyferry.Engine("ovh-prod", ns="ovh-py", pool_size=8 << 20) as p, \
        pyferry.Engine("ovh-cons", ns="ovh-py", pool_size=8 << 20) as c:
    to, frm, payload = p.peer("ovh-cons"), c.peer("ovh-prod"), b"\x01" * 64
    put, get, nop = p.put, c.get, p.nop
    for rep in range(2):  # the first pass warms up
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            nop()
        t1 = time.perf_counter_ns()
        for _ in range(iters):
            put(to, "k", payload)
            get(frm, "k").release()
        t2 = time.perf_counter_ns()
    print(f"py nop: {(t1 - t0) / iters:.0f} ns")
    print(f"py put+get 64 B: {(t2 - t1) / iters:.0f} ns")

with pyferry.Engine("ovh-manual", ns="ovh-py", progress="manual", pool_size=8 << 20) as m:
    nop = m.nop
    for rep in range(2):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            nop()
        t1 = time.perf_counter_ns()
    print(f"py nop (manual): {(t1 - t0) / iters:.0f} ns")
