#!/usr/bin/env python3
"""tests/gpu/py_check.py - pyferry with real torch CUDA tensors on a GPU
(run by tests/gpu/run.sh after gpu_check, where python3 has torch and sees
a device; the package is the one run.sh --prepare built for that python).

Two processes on one host: this one is engine "pa", a child started from
this file (--child) is "pb"; they talk by keys, as gpu_check does: the
parent PUTs "cmd" (a JSON line: what comes next) then "data", the child
answers "sum" (its checksum of what it received, computed on the device,
and CLOCK_MONOTONIC when its GET completed). Cases: pyferry.cuda.available
and FerryConnector.supports_raw_data; put_tensor -> get_into across the
processes for sizes up to 64 MiB (CUDA IPC when ferry's health says so);
device -> host (a plain get of a device PUT); host -> device; the
producer's stream and event first (a slow kernel on the caller's stream
writes the tensor after put_tensor was called); two engines of one
process; FerryConnector given a CUDA tensor (two connectors of this
process; and stage 0 here, stage 1 in the child: by CUDA IPC, get()
returning a CUDA tensor). Bench: the 190 MiB handoff through pyferry.cuda
and through FerryConnector against torch's device-to-device copy.

Prints one line per case and "N passed, N failed"; writes JSON to argv[1].
"""
import json
import os
import subprocess
import sys
import time

import torch

import pyferry
import pyferry.cuda as fc

MiB = 1 << 20
TIMEOUT = 15.0
SIZES = [1, 63, 4097, MiB + 3, 64 * MiB]
BIG = 190 * MiB


def dsum(t):
    """A position-weighted checksum of a uint8 tensor, on its device (order matters)."""
    if t.numel() == 0:
        return 0
    i = torch.arange(t.numel(), device=t.device, dtype=torch.int64)
    return int((t.to(torch.int64) * (i % 65521 + 1)).sum().item())


def pattern(n, seed):
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i * 7 + seed * 131 + (i >> 16)) & 255).to(torch.uint8)


def child(ns):
    e = pyferry.Engine("pb", ns=ns, pool_size=1024 * MiB)
    out = torch.empty(BIG + 4096, dtype=torch.uint8, device="cuda")
    conn = None
    while True:
        with e.get("pa", "cmd", timeout=60) as b:
            cmd = json.loads(bytes(memoryview(b)))
        if cmd["op"] == "end":
            break
        try:
            if cmd["op"] == "conn":   # FerryConnector stage 1 of this process gets the payload
                if conn is None:
                    from pyferry.connector import FerryConnector
                    conn = FerryConnector({"stage_id": 1, "namespace": ns + "k2",
                                           "pool_size": 256 * MiB})
                got = conn.get_with_deadline("0", "1", cmd["key"],
                                             deadline=time.monotonic() + TIMEOUT)
                done = time.monotonic_ns()
                t = got[0]["kv"] if isinstance(got[0], dict) else got[0]
                torch.cuda.synchronize()
                ans = {"sum": dsum(t.reshape(-1).view(torch.uint8)), "len": got[1],
                       "done": done, "device": t.device.type}
                e.put("pa", "sum", json.dumps(ans).encode())
                continue
            if cmd["op"] == "handout":   # the sender's device memory itself, as a tensor
                b = fc.get_buffer(e, "pa", "data", timeout=TIMEOUT)
                done = time.monotonic_ns()
                t = torch.as_tensor(b, device=f"cuda:{b.device}")
                n, s = t.numel(), dsum(t)
                ans = {"sum": s, "len": n, "done": done, "device": b.device,
                       "same_memory": t.data_ptr() == b.__cuda_array_interface__["data"][0]}
                del t
                torch.cuda.synchronize()
                b.release()             # the sender's put_tensor returns now
                e.put("pa", "sum", json.dumps(ans).encode())
                continue
            if cmd["op"] == "host":   # device (or host) PUT -> a GET for a host buffer
                with e.get("pa", "data", timeout=TIMEOUT) as b:
                    done = time.monotonic_ns()
                    host = torch.frombuffer(bytearray(memoryview(b)), dtype=torch.uint8)
                n, s = host.numel(), dsum(host.cuda())
            else:                     # -> device GET
                n = fc.get_into(e, "pa", "data", out, timeout=TIMEOUT)
                done = time.monotonic_ns()
                s = dsum(out[:n])
            ans = {"sum": s, "len": n, "done": done}
        except Exception as ex:       # said to the parent, which fails the case; the loop goes on
            ans = {"sum": -1, "len": -1, "done": 0, "error": f"{type(ex).__name__}: {ex}"}
        e.put("pa", "sum", json.dumps(ans).encode())
    if conn is not None:
        conn.close()
    e.close()


class Parent:
    def __init__(self, ns, out):
        self.ns, self.out = ns, out
        self.cases, self.bench = [], {}
        self.passed = self.failed = 0

    def result(self, name, ok, detail=""):
        ok = bool(ok)
        self.passed += ok
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} py_{name} {detail}", flush=True)
        self.cases.append({"case": "py_" + name, "ok": ok, "detail": str(detail)})

    def write(self, error=None):
        with open(self.out, "w") as f:
            json.dump({"passed": self.passed, "failed": self.failed, "error": error,
                       "cases": self.cases, "bench": self.bench}, f)

    def send(self, op, **kw):
        self.e.put("pb", "cmd", json.dumps(dict(kw, op=op)).encode(), timeout=TIMEOUT,
                   wait_peer=True)

    def answer(self):
        with self.e.get("pb", "sum", timeout=TIMEOUT) as b:
            return json.loads(bytes(memoryview(b)))

    def case(self, name, fn):
        try:
            fn()
        except Exception as ex:  # a case that raises fails; the others still run
            self.result(name, False, f"{type(ex).__name__}: {ex}")

    def run(self):
        ns = self.ns
        self.result("available", fc.available(), f"features {pyferry.features()}")
        from pyferry.connector import FerryConnector
        c = FerryConnector({"stage_id": 0, "namespace": ns + "c"})
        self.result("connector_supports_raw_data", c.supports_raw_data is True,
                    f"supports_raw_data {c.supports_raw_data}")
        c.close()
        kid = subprocess.Popen([sys.executable, __file__, "--child", ns])
        try:
            self.e = pyferry.Engine("pa", ns=ns, pool_size=1024 * MiB)
            self.parent_cases()
        finally:
            try:
                self.send("end")
            except Exception:
                pass
            try:
                rc = kid.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kid.kill()
                rc = "killed"
            self.result("child_exit", rc == 0, f"status {rc}")
            self.e.close()

    def d2d(self, n, seed):
        t = pattern(n, seed)
        want = dsum(t)
        self.send("dev")
        sent = fc.put_tensor(self.e, "pb", "data", t, timeout=TIMEOUT, replace=True)
        a = self.answer()
        self.result(f"d2d_{n}", sent == n and a["len"] == n and a["sum"] == want,
                    f"sent {sent} got {a['len']} sum {a['sum']:x} want {want:x} {a.get('error', '')}")

    def parent_cases(self):
        for i, n in enumerate(SIZES):
            self.case(f"d2d_{n}", lambda n=n, i=i: self.d2d(n, i + 1))
        h = self.e.health().get("cuda", {})
        self.result("ipc_path_taken", h.get("ipc_puts", 0) >= len(SIZES) - 1,
                    f"ipc_puts {h.get('ipc_puts')} staged_puts {h.get('staged_puts')}")

        def handout():  # fc.get_buffer: the sender's memory itself, viewed by torch
            n = 16 * MiB + 3
            t = pattern(n, 41)
            want = dsum(t)
            self.send("handout")
            sent = fc.put_tensor(self.e, "pb", "data", t, timeout=TIMEOUT, replace=True)
            a = self.answer()
            self.result("get_buffer_handout", sent == n and a.get("len") == n and
                        a.get("sum") == want and a.get("device", -1) >= 0 and
                        a.get("same_memory") is True, f"{a}")
        self.case("get_buffer_handout", handout)

        def d2h():
            n = 5 * MiB + 1
            t = pattern(n, 40)
            want = dsum(t)
            self.send("host")
            fc.put_tensor(self.e, "pb", "data", t, timeout=TIMEOUT, replace=True)
            a = self.answer()
            self.result("d2h", a["len"] == n and a["sum"] == want,
                        f"sum {a['sum']:x} want {want:x} {a.get('error', '')}")
        self.case("d2h", d2h)

        def h2d():
            n = 5 * MiB + 1
            t = pattern(n, 41)
            want = dsum(t)
            host = bytes(t.cpu().numpy())
            self.send("dev")
            self.e.put("pb", "data", host, timeout=TIMEOUT, replace=True)
            a = self.answer()
            self.result("h2d", a["len"] == n and a["sum"] == want, f"sum {a['sum']:x} want {want:x}")
        self.case("h2d", h2d)

        def producer_first(kind):
            n = 16 * MiB
            want = dsum(pattern(n, 42))
            x = torch.zeros(n, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                torch.cuda._sleep(200_000_000)      # ~0.1 s of spinning on the producer's stream
                x.copy_(pattern(n, 42))
            kw = {"stream": s}
            if kind == "event":
                ev = torch.cuda.Event()
                ev.record(s)
                kw = {"event": ev}
            self.send("dev")
            fc.put_tensor(self.e, "pb", "data", x, timeout=TIMEOUT, replace=True, **kw)
            a = self.answer()
            self.result(f"producer_{kind}_first", a["sum"] == want,
                        f"sum {a['sum']:x} want {want:x}")
            s.synchronize()
        self.case("producer_stream_first", lambda: producer_first("stream"))
        self.case("producer_event_first", lambda: producer_first("event"))

        def one_process():
            a = pyferry.Engine("qa", ns=self.ns + "q", pool_size=64 * MiB)
            b = pyferry.Engine("qb", ns=self.ns + "q", pool_size=64 * MiB)
            try:
                t = pattern(3 * MiB + 5, 43)
                out = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
                fc.put_tensor(a, "qb", "kv", t, timeout=TIMEOUT)
                n = fc.get_into(b, "qa", "kv", out, timeout=TIMEOUT)
                self.result("one_process", n == t.numel() and torch.equal(out[:n], t), f"len {n}")
            finally:
                a.close()
                b.close()
        self.case("one_process", one_process)

        def connector_tensor():  # two connectors of this process: in-process, staged
            from pyferry.connector import FerryConnector
            p = FerryConnector({"stage_id": 0, "namespace": self.ns + "k", "pool_size": 256 * MiB})
            r = FerryConnector({"stage_id": 1, "namespace": self.ns + "k", "pool_size": 256 * MiB})
            try:
                t = pattern(8 * MiB + 3, 44)
                ok, size, _ = p.put("0", "1", "kv_req1", {"kv": t.view(8 * MiB + 3)})
                got = r.get_with_deadline("0", "1", "kv_req1", deadline=time.monotonic() + TIMEOUT)
                ten = got[0]["kv"] if got else None
                where = getattr(getattr(ten, "device", None), "type", type(ten).__name__)
                same = isinstance(ten, torch.Tensor) and where == "cuda" and torch.equal(ten, t)
                self.result("connector_cuda_tensor", ok and same,
                            f"put ok {ok} size {size}; get returned {type(ten).__name__} on {where}, "
                            f"size {got[1] if got else None}; device parts "
                            f"{p.health()['device_parts']}")
            finally:
                p.close()
                r.close()
        self.case("connector_cuda_tensor", connector_tensor)

        def connector_two_processes():
            # FerryConnector stage 0 here, stage 1 in the child: a KV-like payload (the
            # tensor itself, as upstream's KV transfer puts it with supports_raw_data) by
            # CUDA IPC; timed from put() to the child's get() done, 190 MiB, best of 5.
            from pyferry.connector import FerryConnector
            p = FerryConnector({"stage_id": 0, "namespace": self.ns + "k2", "pool_size": 256 * MiB})
            try:
                t = pattern(64 * MiB + 5, 45)
                want = dsum(t)
                self.send("conn", key="c0")
                ok, size, _ = p.put("0", "1", "c0", t)
                a = self.answer()
                self.result("connector_two_processes", ok and a["sum"] == want and
                            a["device"] == "cuda" and a["len"] >= t.numel(),
                            f"put ok {ok}; the child got {a['len']} bytes on {a['device']}, sum "
                            f"{a['sum']:x} want {want:x}")
                ipc0 = p.engine().health()["cuda"]["ipc_puts"]
                big = pattern(BIG, 46)
                best = float("inf")
                for i in range(5):
                    self.send("conn", key=f"big{i}")
                    time.sleep(0.02)
                    t0 = time.monotonic_ns()
                    ok, _, _ = p.put("0", "1", f"big{i}", big)
                    a = self.answer()
                    if ok and a["device"] == "cuda" and a["len"] >= BIG:
                        best = min(best, (a["done"] - t0) / 1e6)
                ipc = p.engine().health()["cuda"]["ipc_puts"] - ipc0
                self.result("connector_ipc_path", ipc == 5, f"ipc_puts {ipc} of the 5 big puts")
                self.bench["connector_190MiB_ms"] = round(best, 3)
                print(f"bench connector_190MiB: FerryConnector {best:.3f} ms (put() -> the "
                      f"child's get() returned a CUDA tensor)", flush=True)
                p.reap_consumed()
                print(f"connector device parts: {p.health()['device_parts']}", flush=True)
            finally:
                p.close()
        self.case("connector_two_processes", connector_two_processes)

        def bench():
            t = pattern(BIG, 5)
            best = float("inf")
            for _ in range(5):
                self.send("dev")
                time.sleep(0.02)         # the child's GET waits before the clock starts
                t0 = time.monotonic_ns()
                fc.put_tensor(self.e, "pb", "data", t, timeout=TIMEOUT, replace=True)
                a = self.answer()
                if a["len"] == BIG:
                    best = min(best, (a["done"] - t0) / 1e6)
            dst = torch.empty_like(t)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ref = float("inf")
            for _ in range(5):
                start.record()
                dst.copy_(t)
                end.record()
                end.synchronize()
                ref = min(ref, start.elapsed_time(end))
            self.bench.update(py_d2d_190MiB_ms=round(best, 3), torch_copy_190MiB_ms=round(ref, 3),
                              py_d2d_190MiB_ratio=round(best / ref, 3))
            print(f"bench py_d2d_190MiB: pyferry.cuda {best:.3f} ms (put_tensor -> the child's "
                  f"get_into done), torch copy_ {ref:.3f} ms", flush=True)
            self.result("bench_190MiB", best < float("inf"), f"{best:.3f} ms")
        self.case("bench_190MiB", bench)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    out = sys.argv[1] if len(sys.argv) > 1 else "py_check.json"
    p = Parent(f"pygpu{os.getpid()}", out)
    if not torch.cuda.is_available():
        p.result("torch_cuda", False, "torch sees no CUDA device")
    else:
        try:
            p.run()
        except Exception as ex:
            p.result("run", False, f"{type(ex).__name__}: {ex}")
    p.write()
    print(f"{p.passed} passed, {p.failed} failed", flush=True)
    return 1 if p.failed else 0


if __name__ == "__main__":
    sys.exit(main())
