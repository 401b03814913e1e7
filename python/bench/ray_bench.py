#!/usr/bin/env python3
"""ray_bench.py: RayConnector (ferry's data plane) against RayConnector
mode object_store (the RFC's design: ray.put + a named actor) against
FerryConnector (no Ray), one harness, one run, JSON out.

Two processes, a producer (stage 0) and a consumer (stage 1), per
connector; for each size:
  lockstep   N rounds of put(key i) -> get_with_deadline(key i) (no
             metadata); the latency of a round is the producer's put call
             start -> the consumer's get returning the payload (one
             CLOCK_MONOTONIC for both processes); the next put waits for
             the consumer's ack (a pipe, outside the measured interval).
             p50 and p99.
  streaming  M chunks ({req}_{stage}_{n} keys) put back to back and got in
             order; bytes / (first put start -> last get return).
Payloads are bytes (a RawPayload on arrival, the KV path); the consumer
releases each one before the next get.

    sudo ray_bench.py [--nodes 1|2] [--sizes 64,65536,...] [--quick] [--out F.json]
        starts its own cluster (python/tests/raycluster.py: network
        namespaces, so root), on one node or across two joined by a veth
        (the consumer on the second: ferry tcp and Ray's object transfer
        cross it; FerryConnector then runs over tcp)
    ray_bench.py --address HOST:PORT   an existing cluster, both processes here

Run it with build-py/venv-ray/bin/python (./run raytest makes it).
"""
import argparse
import json
import os
import secrets
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

SIZES = [64, 64 << 10, 1 << 20, 16 << 20, 190_000_000]
CONNECTORS = ["ray-ferry", "ray-object_store", "ferry"]


def rounds(size, quick):
    if quick:
        return 5, 4
    n = 300 if size <= 1 << 16 else 100 if size <= 1 << 20 else 30 if size <= 16 << 20 else 8
    m = max(4, min(200, (512 << 20) // max(size, 1)))
    return n, m


# --- a worker process --------------------------------------------------------

def worker(args):
    cfg = json.loads(args.config)
    role, sizes, quick = args.role, [int(s) for s in args.sizes.split(",")], args.quick
    if args.kind.startswith("ray"):
        import ray
        kw = {"address": args.ray_address, "log_to_driver": False, "namespace": "vllm_omni"}
        if args.node_ip:
            kw["_node_ip_address"] = args.node_ip
        ray.init(**kw)
        from pyferry.ray_connector import RayConnector as C
    else:
        from pyferry.connector import FerryConnector as C
    conn = C(cfg)
    ack_r, ack_w = args.ack_r, args.ack_w
    info = {"ready": True}
    if role == "consumer":
        try:
            info["address"] = conn.address(1) if args.kind == "ferry" else None
        except Exception:
            info["address"] = None
    print(json.dumps(info), flush=True)
    sys.stdin.readline()  # go
    out = {"role": role, "times": {}}
    if role == "producer":
        for size in sizes:
            n, m = rounds(size, quick)
            data = (os.urandom(1 << 20) * (size // (1 << 20) + 1))[:size]
            t0s = []
            for i in range(n):
                if i:
                    os.read(ack_r, 1)
                t = time.monotonic()
                ok, _, _ = conn.put(0, 1, f"ls{size}_{i}", data)
                assert ok, f"put ls{size}_{i} failed"
                t0s.append(t)
            os.read(ack_r, 1)
            t = time.monotonic()
            for j in range(m):
                ok, _, _ = conn.put(0, 1, f"st{size}_0_{j}", data)
                assert ok, f"put st{size}_0_{j} failed"
            out["times"][size] = {"put": t0s, "stream_start": t}
            os.read(ack_r, 1)
    else:
        for size in sizes:
            n, m = rounds(size, quick)
            t1s = []
            for i in range(n):
                r = conn.get_with_deadline(0, 1, f"ls{size}_{i}", deadline=time.monotonic() + 120)
                t1s.append(time.monotonic())
                assert r is not None and r[1] >= size, f"get ls{size}_{i}: {r}"
                _release(r[0])
                os.write(ack_w, b"a")
            for j in range(m):
                r = conn.get_with_deadline(0, 1, f"st{size}_0_{j}", deadline=time.monotonic() + 120)
                assert r is not None, f"get st{size}_0_{j}"
                _release(r[0])
            out["times"][size] = {"got": t1s, "stream_end": time.monotonic(), "chunks": m}
            os.write(ack_w, b"a")
    conn.close()
    print(json.dumps(out), flush=True)
    return 0


def _release(p):
    rel = getattr(p, "release", None)
    if rel is not None:
        rel()


# --- the orchestrator -------------------------------------------------------

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def run_pair(kind, sizes, quick, cluster, address, nodes):
    # Room for every chunk of a stream in flight (a producer may run ahead
    # of the consumer by all of them) and one more.
    pool = max(64 << 20, max((rounds(z, quick)[1] + 1) * z for z in sizes) + (32 << 20))
    base = {"pool_size": pool, "put_timeout": 120, "zero_copy_min": 65536}
    if kind == "ray-ferry":
        base.update(mode="ferry", actor_name=f"bench_{secrets.token_hex(4)}")
    elif kind == "ray-object_store":
        base.update(mode="object_store", actor_name=f"bench_{secrets.token_hex(4)}")
    else:
        base.update(namespace=f"bench-{secrets.token_hex(4)}",
                    transport="tcp" if nodes == 2 else "shm")
    env = dict(cluster.env() if cluster else os.environ)
    env.setdefault("FERRY_SECRET", secrets.token_hex(32))
    procs = {}
    pr, pw = os.pipe()  # consumer -> producer acks
    try:
        for role, stage, node in (("consumer", 1, nodes - 1), ("producer", 0, 0)):
            cfg = dict(base, stage_id=stage)
            if kind == "ferry" and nodes == 2:
                if role == "consumer":
                    cfg["listen"] = f"tcp://{cluster.ips[1]}:0"
                else:
                    cfg["peers"] = {"1": procs["consumer"][1]["address"]}
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--role", role,
                   "--kind", kind, "--config", json.dumps(cfg), "--sizes",
                   ",".join(map(str, sizes)), "--ack-r", str(pr), "--ack-w", str(pw)]
            if quick:
                cmd.append("--quick")
            if cluster:
                cmd += ["--ray-address", cluster.address, "--node-ip", cluster.ips[node]]
                cmd = ["ip", "netns", "exec", cluster.netns[node]] + cmd
            else:
                cmd += ["--ray-address", address]
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env, pass_fds=(pr, pw))
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{kind} {role} did not start")
            procs[role] = (p, json.loads(line))
        for p, _ in procs.values():
            p.stdin.write("go\n")
            p.stdin.flush()
        res = {}
        for role, (p, _) in procs.items():
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{kind} {role} failed (exit {p.wait()})")
            res[role] = json.loads(line)["times"]
            p.wait(60)
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        os.close(pr)
        os.close(pw)
    rows = []
    for size in sizes:
        put, got = res["producer"][str(size)], res["consumer"][str(size)]
        lat = [(b - a) * 1e6 for a, b in zip(put["put"], got["got"])]
        secs = got["stream_end"] - put["stream_start"]
        rows.append({"connector": kind, "size": size, "rounds": len(lat),
                     "lockstep_p50_us": round(pct(lat, 0.5), 1),
                     "lockstep_p99_us": round(pct(lat, 0.99), 1),
                     "stream_chunks": got["chunks"],
                     "stream_MBps": round(got["chunks"] * size / secs / 1e6, 4),
                     "stream_chunks_per_s": round(got["chunks"] / secs, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--role")
    ap.add_argument("--kind", default=None)
    ap.add_argument("--config")
    ap.add_argument("--ack-r", type=int)
    ap.add_argument("--ack-w", type=int)
    ap.add_argument("--ray-address", default=None)
    ap.add_argument("--node-ip", default=None)
    ap.add_argument("--address", default=None, help="an existing Ray cluster (one node)")
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--connectors", default=",".join(CONNECTORS))
    ap.add_argument("--quick", action="store_true", help="5 rounds, 4 chunks: proves it runs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    cluster = None
    if args.address is None:
        from raycluster import Cluster
        import raycluster
        raycluster.OBJECT_STORE = max(raycluster.OBJECT_STORE, max(
            (rounds(z, args.quick)[1] + 2) * z for z in sizes) + (200 << 20))
        cluster = Cluster(nodes=args.nodes)
    t0 = time.time()
    try:
        rows = []
        for kind in args.connectors.split(","):
            rows += run_pair(kind, sizes, args.quick, cluster, args.address, args.nodes)
    finally:
        if cluster:
            cluster.stop()
    by = {(r["connector"], r["size"]): r for r in rows}
    ratios = {}

    def div(a, b):
        return round(a / b, 2) if b else None
    for size in sizes:
        f, o, c = (by.get((k, size)) for k in CONNECTORS)
        if f and o:
            ratios[f"object_store_over_ray_ferry.p50.{size}"] = div(
                o["lockstep_p50_us"], f["lockstep_p50_us"])
            ratios[f"ray_ferry_over_object_store.stream.{size}"] = div(
                f["stream_MBps"], o["stream_MBps"])
        if f and c:
            ratios[f"ray_ferry_over_ferry.p50.{size}"] = div(
                f["lockstep_p50_us"], c["lockstep_p50_us"])
    doc = {"benchmark": "ray_bench", "nodes": args.nodes, "quick": args.quick,
           "existing_cluster": args.address is not None, "seconds": round(time.time() - t0, 1),
           "load_average": os.getloadavg(), "results": rows, "ratios": ratios}
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
