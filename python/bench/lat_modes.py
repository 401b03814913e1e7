"""python/bench/lat_modes.py: 64 B lockstep latency between two processes,
THREAD against MANUAL progress, interleaved rep by rep: pyferry.Engine, and
with --connector FerryConnector too (park_gets on, as shipped).

The producer puts key i (wait_peer: it returns once the consumer's engine
holds it) after the consumer acknowledged key i-1 over a pipe; the consumer
polls get(nowait=True) until key i is there. Latency: the producer's
CLOCK_MONOTONIC before put -> the consumer's when get returned (the first
200 of each rep dropped). THREAD: each engine has its reactor thread, so four
threads run on the machine's CPUs; MANUAL: the callers drive their engines
(two threads). FerryConnector has no MANUAL option: "connector-manual" makes
its engines MANUAL from here (a measurement of where its time goes, not a
configuration to run: a put to a MANUAL receiver waits until the receiver's
process next calls into the connector). Prints one line per mode and rep,
then the medians, and writes JSON with --json.

    python python/bench/lat_modes.py [--reps 5] [--n 3000] [--connector] [--json OUT]
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

MODES = ("thread", "manual")
CONNECTOR_MODES = ("connector-thread", "connector-manual")


def _connector(mode, ns, stage):
    from pyferry.connector import FerryConnector
    if mode == "connector-manual":
        settings = FerryConnector._engine_settings

        def manual(self, st):
            key, kw = settings(self, st)
            return key + ("manual",), dict(kw, progress="manual")
        FerryConnector._engine_settings = manual
    return FerryConnector({"transport": "shm", "namespace": ns, "stage_id": stage,
                           "pool_size": 64 << 20})


def _lockstep_put(put, n, sync, out):
    """Producer: put key i once the consumer acknowledged i-1; the stamps to out."""
    data = b"x" * 64
    sync.recv_bytes()
    stamps = []
    for j in range(n):
        if j:
            sync.recv_bytes()
        t = time.monotonic_ns()
        put(f"k{j}", data)
        stamps.append(t)
    sync.recv_bytes()
    out.send(stamps)
    out.recv()


def _lockstep_take(take, n, sync, out):
    """Consumer: poll take(key) until it has key i, acknowledge; the stamps to out."""
    sync.send_bytes(b"go")
    stamps = []
    deadline = time.monotonic() + 120
    for j in range(n):
        key = f"k{j}"
        while not take(key):
            if time.monotonic() > deadline:
                raise TimeoutError(key)
        stamps.append(time.monotonic_ns())
        sync.send_bytes(b"a")
    out.send(stamps)
    out.recv()


def _connector_producer(mode, ns, n, sync, out):
    c = _connector(mode, ns, 0)

    def put(key, data):
        if not c.put("0", "1", key, data)[0]:
            raise RuntimeError(f"put {key} failed")
    try:
        _lockstep_put(put, n, sync, out)
    finally:
        c.close()


def _connector_consumer(mode, ns, n, sync, out):
    c = _connector(mode, ns, 1)
    try:
        _lockstep_take(lambda key: c.get("0", "1", key) is not None, n, sync, out)
    finally:
        c.close()


def _producer(mode, ns, n, sync, out):
    import pyferry
    with pyferry.Engine("lm0", ns=ns, pool_size=64 << 20, progress=mode) as e:
        peer = e.peer("lm1")
        _lockstep_put(lambda key, data: e.put(peer, key, data, timeout=60, wait_peer=True),
                      n, sync, out)


def _consumer(mode, ns, n, sync, out):
    import pyferry
    with pyferry.Engine("lm1", ns=ns, pool_size=64 << 20, progress=mode) as e:
        peer = e.peer("lm0")

        def take(key):
            try:
                e.get(peer, key, nowait=True).release()
                return True
            except pyferry.FerryWouldBlockError:
                return False
        _lockstep_take(take, n, sync, out)


def one_rep(mode, n):
    ns = f"latmodes{os.getpid()}{mode}{time.monotonic_ns()}"
    a, b = mp.Pipe()
    pa, pb = mp.Pipe()
    ca, cb = mp.Pipe()
    prod, cons = ((_connector_producer, _connector_consumer) if mode.startswith("connector")
                  else (_producer, _consumer))
    procs = [mp.Process(target=prod, args=(mode, ns, n, a, pb)),
             mp.Process(target=cons, args=(mode, ns, n, b, cb))]
    for p in procs:
        p.start()
    try:
        if not (pa.poll(180) and ca.poll(180)):
            raise TimeoutError(f"{mode}: no result within 180 s")
        put_ns, got_ns = pa.recv(), ca.recv()
        pa.send(1)
        ca.send(1)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    lat = sorted((g - p) / 1000 for p, g in zip(put_ns[200:], got_ns[200:]))
    return {"p50_us": lat[len(lat) // 2], "p99_us": lat[int(len(lat) * 0.99)]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=3000, help="transfers per rep")
    ap.add_argument("--connector", action="store_true",
                    help="FerryConnector too (its engines THREAD, and made MANUAL here)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    modes = MODES + (CONNECTOR_MODES if args.connector else ())
    if args.n <= 200:
        ap.error("--n must be above 200 (the first 200 are dropped)")
    mp.set_start_method("spawn")
    res = {m: [] for m in modes}
    for rep in range(args.reps):
        for mode in modes:
            r = one_rep(mode, args.n)
            res[mode].append(r)
            print(f"rep {rep} {mode:16s} p50 {r['p50_us']:.2f} us  p99 {r['p99_us']:.2f} us",
                  file=sys.stderr)
    summary = {m: {"p50_us_median": statistics.median(x["p50_us"] for x in res[m]),
                   "p99_us_median": statistics.median(x["p99_us"] for x in res[m])}
               for m in modes}
    for m in modes:
        print(f"{m:16s} p50 median {summary[m]['p50_us_median']:.2f} us, "
              f"p99 median {summary[m]['p99_us_median']:.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "lat_modes", "cpus": os.cpu_count(), "n": args.n,
                       "reps": res, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
