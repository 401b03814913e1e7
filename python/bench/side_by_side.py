"""side_by_side.py: vLLM-Omni's own SharedMemoryConnector (the vllm-omni
0.30.0 wheel, unmodified) against pyferry's FerryConnector over shm, in one
run, same harness. Runs in the vllm-omni environment (./run bench
--python-side-by-side builds it and calls this).

Both connectors are made by upstream's OmniConnectorFactory. Two processes
(multiprocessing, spawn): a producer (stage 0) puts, a consumer (stage 1)
calls get(from, to, key) without metadata, again and again until it returns
the payload, as the chunk adapter's receive loop does (by default without
its 1 ms sleep between polls, --poll-sleep-us sets one: that sleep would be
added to both connectors alike and hide what they cost).

Payloads, each size: "bytes" (a bytes object of that size, what the KV
transfer manager sends as packed KV) and "dict" (a chunk-like dict: a float32
torch tensor of that many bytes and a small meta dict). Sizes 64 B, 64 KiB,
1 MiB, 16 MiB, 190 MB by default.

Each case starts with warm-up transfers that are not counted (20; 1 from
16 MiB up): the first put of a connection finds its peer.

  lockstep   the producer puts key i only after the consumer took key i-1;
             latency = the producer's clock before put() -> the consumer's
             clock when get() returned the payload (CLOCK_MONOTONIC, read in
             both processes); p50, p99, mean
  stream     the producer puts N keys back to back (upstream's put returns at
             once; ferry's once the consumer's stage holds the key, up to the
             pool's room), the consumer takes them in order; GB/s = N x size /
             (first put -> last get returned)

Also "raw": pyferry.Engine put / get(nowait) of 64 B bytes between the same
two processes (the binding without the connector's framing), to set the
Python layer's cost beside the C benchmark's 64 B (bench_shm).

--park-ab: also FerryConnector with park_gets: false (every poll a nowait
GET through the engine), each case beside the other two, to see what
parking the polled GETs (pyferry._parked) is worth.

Writes JSON (--json, default bench/results/side_by_side.json), a PNG plot of
p50 latency and throughput against payload size (--plot, default
docs/side_by_side.png) and a markdown table (--markdown, default
bench/results/side_by_side.md). Progress goes to stderr. --quick: a few reps
of each, to check that it all works (figures meaningless).
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SIZES = [64, 64 << 10, 1 << 20, 16 << 20, 190_000_000]
KINDS = ["bytes", "dict"]
CONNECTORS = ["SharedMemoryConnector", "FerryConnector"]
# --park-ab: FerryConnector with park_gets: false (every poll a nowait GET), beside it
NO_PARK = "FerryConnector(park_gets=false)"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def human(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10), ("MB", 10**6), ("kB", 10**3)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# --- the two processes ------------------------------------------------------

def make_payload(kind, size, i):
    if kind == "bytes":
        return bytes([i & 0xFF]) * size
    import torch
    t = torch.full((max(1, size // 4),), float(i), dtype=torch.float32)
    return {"hidden": t, "meta": {"finished": False, "chunk": i}}


def check_payload(kind, size, i, obj):
    if kind == "bytes":
        b = memoryview(obj.data if hasattr(obj, "data") else obj)
        return len(b) == size and b[0] == (i & 0xFF) and b[-1] == (i & 0xFF)
    t = obj["hidden"]
    return t.numel() == max(1, size // 4) and float(t[0]) == float(i) and float(t[-1]) == float(i)


def make_connector(name, stage, case):
    from vllm_omni.distributed.omni_connectors import ConnectorSpec, OmniConnectorFactory
    from vllm_omni.distributed.omni_connectors.utils.initialization import resolve_connector_spec
    import pyferry.connector
    pyferry.connector.register()
    extra = {}
    if name in ("FerryConnector", NO_PARK):
        extra = {"transport": "shm", "namespace": case["ns"], "pool_size": case["pool"],
                 "put_timeout": 120, "park_gets": name == "FerryConnector"}
        name = "FerryConnector"
    spec = resolve_connector_spec(ConnectorSpec(name=name, extra=extra), stage_id=stage,
                                  role="sender" if stage == 0 else "receiver")
    return OmniConnectorFactory.create_connector(spec)


class RawEngine:
    """pyferry.Engine put / get(nowait) shaped like a connector (64 B bytes)."""

    def __init__(self, stage, case):
        import pyferry
        self.pyferry = pyferry
        self.eng = pyferry.Engine(f"stage{stage}", ns=case["ns"], pool_size=case["pool"])
        self.peer = self.eng.peer(f"stage{1 - stage}")

    def put(self, from_stage, to_stage, key, data):
        self.eng.put(self.peer, key, data, timeout=120, wait_peer=True)
        return True, len(data), None

    def get(self, from_stage, to_stage, key, metadata=None):
        try:
            buf = self.eng.get(self.peer, key, nowait=True)
        except self.pyferry.FerryWouldBlockError:
            return None
        return buf, len(buf)

    def close(self):
        self.eng.close()


def open_connector(case, stage):
    if case["connector"] == "raw":
        return RawEngine(stage, case)
    return make_connector(case["connector"], stage, case)


def keys_of(case, n):
    return [f"sbs{case['tag']}_{case['mode'][0]}{j}" for j in range(n)]


def preload():
    """Import up front what the connectors import at their first put / get
    (upstream's OmniSerializer pulls in vllm: tens of seconds), so no case's
    first transfer pays for it."""
    import torch  # noqa: F401
    import pyferry.connector  # noqa: F401
    from vllm_omni.distributed.omni_connectors.utils.serialization import OmniSerializer
    OmniSerializer.deserialize(OmniSerializer.serialize({"warm": b"up"}))


def producer_main(ctl, sync):
    """Stage 0: for each case, put its keys (lockstep: after each ack)."""
    preload()
    while True:
        case = ctl.recv()
        if case is None:
            return
        conn = open_connector(case, 0)
        n, kind, size = case["n"], case["kind"], case["size"]
        payloads = [make_payload(kind, size, j) for j in range(min(n, 2))]
        keys = keys_of(case, n)
        stamps = []
        ok = True
        ctl.send("ready")
        ctl.recv()  # go
        clock = time.monotonic_ns
        for j in range(n):
            if case["mode"] == "lockstep" and j > 0:
                sync.recv_bytes()
            t = clock()
            res = conn.put("0", "1", keys[j], payloads[j % len(payloads)])
            stamps.append(t)
            ok = ok and bool(res[0])
        if case["mode"] == "lockstep":
            sync.recv_bytes()
        ctl.send({"put_ns": stamps, "ok": ok})
        ctl.recv()  # the consumer is done: close
        conn.close()
        ctl.send("closed")


def consumer_main(ctl, sync):
    """Stage 1: for each case, poll get(key) without metadata until it
    returns the payload, key after key; ack each in lockstep."""
    preload()
    while True:
        case = ctl.recv()
        if case is None:
            return
        conn = open_connector(case, 1)
        n, kind, size = case["n"], case["kind"], case["size"]
        keys = keys_of(case, n)
        sleep_s = case["poll_sleep_us"] / 1e6
        stamps, polls, bad = [], 0, 0
        ctl.send("ready")
        ctl.recv()  # go
        clock = time.monotonic_ns
        deadline = time.monotonic() + case["timeout"]
        for j in range(n):
            while True:
                res = conn.get("0", "1", keys[j])
                if res is not None:
                    break
                polls += 1
                if sleep_s:
                    time.sleep(sleep_s)
                if polls & 0x3FF == 0 and time.monotonic() > deadline:
                    raise TimeoutError(f"{keys[j]} did not come in {case['timeout']} s")
            stamps.append(clock())
            obj = res[0]
            if j < 2 or j == n - 1:
                bad += 0 if check_payload(kind, size, j % 2 if n > 1 else 0, obj) else 1
            if hasattr(obj, "release"):
                obj.release()
            del obj, res
            if case["mode"] == "lockstep":
                sync.send_bytes(b"k")
        ctl.send({"get_ns": stamps, "polls": polls, "bad": bad})
        ctl.recv()
        conn.close()
        ctl.send("closed")


# --- the driver ---------------------------------------------------------------

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_case(prod, cons, case):
    prod.send(case)
    cons.send(case)
    assert prod.recv() == "ready" and cons.recv() == "ready"
    cons.send("go")
    prod.send("go")
    p = prod.recv()
    c = cons.recv()
    prod.send("close")
    cons.send("close")
    assert prod.recv() == "closed" and cons.recv() == "closed"
    if not p["ok"] or c["bad"]:
        raise RuntimeError(f"{case['connector']} {case['kind']} {case['size']}: "
                           f"put ok {p['ok']}, {c['bad']} payloads wrong")
    return p["put_ns"], c["get_ns"], c["polls"]


def reps_for(size, mode, quick, scale):
    if quick:
        return 3
    if mode == "lockstep":
        n = 2000 if size <= 64 << 10 else 400 if size <= 1 << 20 else 40 if size <= 16 << 20 else 9
    else:
        n = 2000 if size <= 64 << 10 else 200 if size <= 1 << 20 else 16 if size <= 16 << 20 else 4
    return max(3, int(n * scale))


def pool_for(size, n_stream):
    need = min(n_stream, 8) * (size + (1 << 20)) + (32 << 20)
    return max(64 << 20, min(need, 2 << 30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--quick", action="store_true", help="3 reps of each: a smoke test")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the rep counts")
    ap.add_argument("--poll-sleep-us", type=float, default=0.0,
                    help="sleep between polls (the chunk adapter sleeps 1000)")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench/results/side_by_side.json"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs/side_by_side.png"))
    ap.add_argument("--markdown", default=os.path.join(ROOT, "bench/results/side_by_side.md"))
    ap.add_argument("--no-raw", action="store_true", help="skip the raw pyferry 64 B case")
    ap.add_argument("--park-ab", action="store_true",
                    help="also FerryConnector with park_gets: false, each case beside the others")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    kinds = [k for k in args.kinds.split(",") if k]

    os.environ["FERRY_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ferry-sbs-")
    os.chmod(os.environ["FERRY_RUNTIME_DIR"], 0o700)
    ctx = mp.get_context("spawn")
    pc, pw = ctx.Pipe()
    cc, cw = ctx.Pipe()
    s1, s2 = ctx.Pipe()
    procs = [ctx.Process(target=producer_main, args=(pw, s1), daemon=True),
             ctx.Process(target=consumer_main, args=(cw, s2), daemon=True)]
    for pr in procs:
        pr.start()
    load0 = os.getloadavg()[0]
    t_start = time.time()
    results = []
    cases = []
    if not args.no_raw and 64 in sizes:
        cases.append(("raw", "bytes", 64, "lockstep"))
    for size in sizes:
        for kind in kinds:
            for mode in ("lockstep", "stream"):
                for name in CONNECTORS + ([NO_PARK] if args.park_ab else []):
                    cases.append((name, kind, size, mode))
    try:
        for name, kind, size, mode in cases:
            n = reps_for(size, mode, args.quick, args.scale)
            warm = 1 if args.quick or size >= 16 << 20 else 20
            case = {"connector": name, "kind": kind, "size": size, "mode": mode,
                    "n": n + warm, "warm": warm,
                    "tag": uuid.uuid4().hex[:10], "ns": "sbs-" + uuid.uuid4().hex[:8],
                    "pool": pool_for(size, reps_for(size, "stream", args.quick, args.scale)),
                    "poll_sleep_us": args.poll_sleep_us, "timeout": 600}
            t0 = time.monotonic()
            put_ns, get_ns, polls = run_case(pc, cc, case)
            put_ns, get_ns = put_ns[case["warm"]:], get_ns[case["warm"]:]
            r = {"connector": name, "kind": kind, "size": size, "mode": mode, "n": n,
                 "polls": polls}
            if mode == "lockstep":
                lat = [(g - p) / 1000 for p, g in zip(put_ns, get_ns)]
                r.update(p50_us=pct(lat, 50), p99_us=pct(lat, 99),
                         mean_us=statistics.fmean(lat), min_us=min(lat))
                log(f"{name:22} {kind:5} {human(size):>8} lockstep n={n:5}: "
                    f"p50 {r['p50_us']:10.1f} us  p99 {r['p99_us']:10.1f} us  "
                    f"({time.monotonic() - t0:.1f} s)")
            else:
                # from the first counted put: the warm-up transfers went before
                secs = (get_ns[-1] - put_ns[0]) / 1e9
                r.update(seconds=secs, gb_per_s=n * size / secs / 1e9, msgs_per_s=n / secs)
                log(f"{name:22} {kind:5} {human(size):>8} stream   n={n:5}: "
                    f"{r['gb_per_s']:10.3f} GB/s  {r['msgs_per_s']:12.0f} msg/s  "
                    f"({time.monotonic() - t0:.1f} s)")
            results.append(r)
    finally:
        pc.send(None)
        cc.send(None)
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():
                pr.kill()

    ratios = []
    idx = {(r["connector"], r["kind"], r["size"], r["mode"]): r for r in results}
    for size in sizes:
        for kind in kinds:
            up_l, fe_l = (idx.get((c, kind, size, "lockstep")) for c in CONNECTORS)
            up_s, fe_s = (idx.get((c, kind, size, "stream")) for c in CONNECTORS)
            if up_l and fe_l and up_s and fe_s:
                ratios.append({"kind": kind, "size": size,
                               "p50_speedup": up_l["p50_us"] / fe_l["p50_us"],
                               "p99_speedup": up_l["p99_us"] / fe_l["p99_us"],
                               "throughput_speedup": fe_s["gb_per_s"] / up_s["gb_per_s"]})
    out = {"benchmark": "side_by_side", "quick": args.quick,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
           "seconds": round(time.time() - t_start, 1),
           "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                       "python": platform.python_version(),
                       "loadavg1_start": load0, "loadavg1_end": os.getloadavg()[0]},
           "versions": versions(), "poll_sleep_us": args.poll_sleep_us,
           "results": results, "ratios": ratios,
           "targets": targets(ratios)}
    for path in (args.json, args.plot, args.markdown):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    with open(args.markdown, "w") as f:
        f.write(markdown(out, sizes, kinds))
    plot(out, sizes, kinds, args.plot)
    log(f"wrote {args.json}, {args.markdown}, {args.plot} ({out['seconds']} s)")
    print(json.dumps({"ratios": ratios, "targets": out["targets"]}, indent=1))


def versions():
    from importlib.metadata import version
    v = {}
    for p in ("vllm-omni", "vllm", "torch", "msgpack", "pyferry"):
        try:
            v[p] = version(p)
        except Exception:
            v[p] = None
    return v


def targets(ratios):
    want = {(64, "bytes"): 30, (1 << 20, "bytes"): 10, (190_000_000, "dict"): 100}
    out = []
    for r in ratios:
        t = want.get((r["size"], r["kind"]))
        if t:
            out.append({"what": f"{human(r['size'])} {r['kind']} p50 speed-up >= {t}x",
                        "value": round(r["p50_speedup"], 2),
                        "result": "pass" if r["p50_speedup"] >= t else "FAIL"})
    return out


def fmt_us(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def markdown(out, sizes, kinds):
    idx = {(r["connector"], r["kind"], r["size"], r["mode"]): r for r in out["results"]}
    m = out["machine"]
    lines = [f"Run of {out['started']}, {out['seconds']} s; {m['cpus']} CPUs, kernel "
             f"`{m['kernel']}`, Python {m['python']}; load average {m['loadavg1_start']:.2f} "
             f"at the start, {m['loadavg1_end']:.2f} at the end; vllm-omni "
             f"{out['versions'].get('vllm-omni')}, torch {out['versions'].get('torch')}"
             f"{'; --quick: figures meaningless' if out['quick'] else ''}.", "",
             "| payload | size | upstream p50 | ferry p50 | p50 × | upstream p99 | ferry p99 "
             "| upstream GB/s | ferry GB/s | GB/s × |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size in sizes:
        for kind in kinds:
            ul, fl = (idx.get((c, kind, size, "lockstep")) for c in CONNECTORS)
            us, fs = (idx.get((c, kind, size, "stream")) for c in CONNECTORS)
            if not (ul and fl and us and fs):
                continue
            lines.append(
                f"| {kind} | {human(size)} | {fmt_us(ul['p50_us'])} | {fmt_us(fl['p50_us'])} "
                f"| {ul['p50_us'] / fl['p50_us']:.1f} | {fmt_us(ul['p99_us'])} "
                f"| {fmt_us(fl['p99_us'])} | {us['gb_per_s']:.3f} | {fs['gb_per_s']:.3f} "
                f"| {fs['gb_per_s'] / us['gb_per_s']:.1f} |")
    raw = idx.get(("raw", "bytes", 64, "lockstep"))
    fe = idx.get(("FerryConnector", "bytes", 64, "lockstep"))
    if raw:
        lines += ["", f"pyferry.Engine put / get(nowait), 64 B bytes, the same two processes: "
                  f"p50 {fmt_us(raw['p50_us'])}, p99 {fmt_us(raw['p99_us'])}"
                  + (f"; FerryConnector's framing adds {fe['p50_us'] - raw['p50_us']:.1f} µs "
                     f"at p50" if fe else "") + "."]
    ab = []
    for size in sizes:
        for kind in kinds:
            fl, nl = (idx.get((c, kind, size, "lockstep")) for c in ("FerryConnector", NO_PARK))
            if fl and nl:
                ab.append(f"- {kind} {human(size)}: p50 {fmt_us(nl['p50_us'])} with "
                          f"park_gets: false against {fmt_us(fl['p50_us'])} parked "
                          f"({nl['p50_us'] / fl['p50_us']:.2f}x); polls {nl['polls']} "
                          f"against {fl['polls']}.")
    if ab:
        lines += ["", "FerryConnector with park_gets: false (every poll a nowait GET), "
                  "lockstep, the same run:", ""] + ab
    if out["targets"]:
        lines += ["", "| target | value | result |", "| --- | ---: | --- |"]
        lines += [f"| {t['what']} | {t['value']} | **{t['result']}** |" for t in out["targets"]]
    return "\n".join(lines) + "\n"


def plot(out, sizes, kinds, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    idx = {(r["connector"], r["kind"], r["size"], r["mode"]): r for r in out["results"]}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    style = {"SharedMemoryConnector": ("tab:red", "upstream SharedMemoryConnector"),
             "FerryConnector": ("tab:blue", "FerryConnector (shm)")}
    for name in CONNECTORS:
        color, label = style[name]
        for kind, ls, mk in (("bytes", "-", "o"), ("dict", "--", "s")):
            if kind not in kinds:
                continue
            xs = [s for s in sizes if (name, kind, s, "lockstep") in idx]
            if xs:
                ax1.plot(xs, [idx[(name, kind, s, "lockstep")]["p50_us"] for s in xs],
                         ls, marker=mk, color=color, label=f"{label}, {kind}")
            xs = [s for s in sizes if (name, kind, s, "stream") in idx]
            if xs:
                ax2.plot(xs, [idx[(name, kind, s, "stream")]["gb_per_s"] for s in xs],
                         ls, marker=mk, color=color, label=f"{label}, {kind}")
    for ax, title, ylabel in ((ax1, "lockstep latency, p50", "µs (put → get returned)"),
                              (ax2, "streaming throughput", "GB/s (10⁹ B/s)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([human(s) for s in sizes], rotation=20)
        ax.set_xlabel("payload size")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(f"vLLM-Omni connectors, two processes, get() polled without metadata "
                 f"({out['started']}{', --quick' if out['quick'] else ''})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
