"""One writer to N readers: pyferry.MessageQueue against ZeroMQ PUB/SUB
(pyzmq) and, where it imports, vLLM's own shm_broadcast.MessageQueue.

    python python/bench/bcast.py [--readers 1,4,8] [--sizes 64,1048576]
                                 [--msgs 2000] [--gap-us 200] [--impl ferry,zmq,vllm]
                                 (ferry-manual: ferry with caller-driven readers,
                                 MessageQueue.create_from_handle(progress="manual"))
                                 [--json out.json]
                                 [--remote --connect-ip IP [--reader-netns NS --reader-ip IP]]

--remote puts the readers on "another host": through tcp (ferry: the host's
relay; zmq: its tcp socket; vLLM: its remote readers), the writer listening on
--connect-ip; with --reader-netns the readers run in that network namespace
(`ip netns exec`, root; python/bench/bcast_netns.sh makes a veth pair and runs
this) with --reader-ip their address there.

For each implementation, reader count and size: the readers are processes
of this host; the writer sends --msgs messages, each stamped with
CLOCK_MONOTONIC (one clock for the host's processes), --gap-us apart
(latency: p50/p99 from the send to the moment the LAST reader has the
message), then --msgs more back to back (throughput: messages per second
until the last reader has the last one). A message is bytes; every
implementation hands the reader something it can read (ferry: a zero-copy
view of the writer's memory; zmq: a frame; vLLM: the unpickled object).
An implementation that cannot run here is reported as skipped, with why.
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import tempfile
import sys
import time

STAMP = struct.Struct("<qq")  # (send time ns, index)


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ---------------------------------------------------------------- readers

def reader_main(impl, handle, n_total, rank):
    """A reader process: prints "ready", then one JSON line of (index, time)."""
    try:
        recv, close, wait = open_reader(impl, handle, rank)
        # "ready" once attached, before the reader's own barrier: vLLM's
        # reader-side wait_until_ready returns only after the writer's has
        # run, so the writer must not wait for more than the attach.
        print("ready", flush=True)
        wait()
        times = []
        for _ in range(n_total):
            data = recv()
            t = now()
            sent, idx = STAMP.unpack_from(data, 0)
            times.append((idx, t))
        close()
        out = {"times": times}
    except Exception as e:  # reported by the writer
        out = {"error": repr(e)}
    # The result goes through a file named by the writer, not the pipe: a
    # line of 100 KB on stdout came back cut in two once (8 readers).
    with open(os.environ["BCAST_RESULT_DIR"] + f"/r{rank}.json", "w") as f:
        json.dump(out, f)
    print("done", flush=True)


def open_reader(impl, handle, rank):
    if impl in ("ferry", "ferry-manual"):
        import pyferry
        mq = pyferry.MessageQueue.create_from_handle(
            handle.encode(), rank, progress="manual" if impl == "ferry-manual" else "thread")

        def recv():
            with mq.dequeue_bytes(timeout=60) as b:
                return bytes(memoryview(b)[:STAMP.size])
        return recv, mq.close, lambda: mq.wait_until_ready(timeout=60)
    if impl == "zmq":
        import zmq
        ctx = zmq.Context()
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.setsockopt(zmq.RCVHWM, 0)
        s.connect(handle)

        def recv():
            m = s.recv(copy=False)
            return m.buffer
        return recv, lambda: (s.close(0), ctx.term()), lambda: None
    if impl == "vllm":
        import pickle
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
        mq = MessageQueue.create_from_handle(pickle.loads(bytes.fromhex(handle)), rank)

        def recv():
            return mq.dequeue(timeout=60)
        return recv, lambda: None, mq.wait_until_ready
    raise ValueError(impl)


# ---------------------------------------------------------------- writers

def open_writer(impl, n, size, remote, ip):
    local = 0 if remote else n
    if impl in ("ferry", "ferry-manual"):
        import pyferry
        mq = pyferry.MessageQueue(n, local, max_chunk_bytes=max(size, 1 << 16), max_chunks=64,
                                  connect_ip=ip if remote else None)
        return mq.export_handle().decode(), mq.wait_until_ready, mq.enqueue_bytes, mq.close
    if impl == "zmq":
        import zmq
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUB)
        s.setsockopt(zmq.SNDHWM, 0)
        port = s.bind_to_random_port(f"tcp://{ip}")
        handle = f"tcp://{ip}:{port}"

        def ready():
            time.sleep(1.0)  # PUB/SUB has no barrier: give the SUBs time to join

        def send(b):
            s.send(b, copy=len(b) < 65536)
        return handle, ready, send, lambda: (s.close(0), ctx.term())
    if impl == "vllm":
        import pickle
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
        mq = MessageQueue(n, local, max_chunk_bytes=max(size * 2, 1 << 20),
                          connect_ip=ip if remote else None)
        return (pickle.dumps(mq.export_handle()).hex(), mq.wait_until_ready, mq.enqueue,
                lambda: None)
    raise ValueError(impl)


def available(impl):
    try:
        if impl in ("ferry", "ferry-manual"):
            import pyferry  # noqa: F401
        elif impl == "zmq":
            import zmq  # noqa: F401
        elif impl == "vllm":
            from vllm.distributed.device_communicators.shm_broadcast import MessageQueue  # noqa
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def run_one(impl, n, size, msgs, gap_us, a):
    handle, ready, send, close = open_writer(impl, n, size, a.remote,
                                             a.connect_ip or "127.0.0.1")
    total = 2 * msgs
    env = dict(os.environ)
    resdir = tempfile.mkdtemp(prefix="bcast-")
    env["BCAST_RESULT_DIR"] = resdir
    if a.remote:
        env["PYFERRY_MQ_IP"] = a.reader_ip or a.connect_ip or "127.0.0.1"
    prefix = ["ip", "netns", "exec", a.reader_netns] if a.reader_netns else []
    procs = [subprocess.Popen(prefix + [sys.executable, os.path.abspath(__file__), "--reader",
                                        impl, handle, str(total), str(r)],
                              stdout=subprocess.PIPE, text=True, env=env) for r in range(n)]
    for p in procs:
        line = p.stdout.readline().strip()
        if line != "ready":
            close()
            return {"error": f"reader: {line or 'exited'}"}
    ready()
    payload = bytearray(max(size, STAMP.size))
    sent = {}
    for i in range(msgs):
        t = now()
        STAMP.pack_into(payload, 0, t, i)
        sent[i] = t
        send(bytes(payload))
        end = now() + gap_us * 1000
        while now() < end:
            pass
    t_burst = now()
    for i in range(msgs, total):
        t = now()
        STAMP.pack_into(payload, 0, t, i)
        sent[i] = t
        send(bytes(payload))
    results = []
    for r, p in enumerate(procs):
        p.stdout.readline()
        try:
            with open(f"{resdir}/r{r}.json") as f:
                results.append(json.load(f))
        except (OSError, ValueError) as e:
            results.append({"error": f"no result from reader {r}: {e}"})
    shutil.rmtree(resdir, ignore_errors=True)
    for p in procs:
        p.wait(timeout=60)
    close()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        return {"error": errors[0]}
    last = {}
    for times in (r["times"] for r in results):
        for idx, t in times:
            last[idx] = max(last.get(idx, 0), t)
    lat = sorted((last[i] - sent[i]) / 1000.0 for i in range(msgs))
    burst_end = max(last[i] for i in range(msgs, total))
    return {
        "p50_us": round(statistics.median(lat), 2),
        "p99_us": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
        "msgs_per_s": round(msgs / ((burst_end - t_burst) / 1e9), 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readers", default="1,4,8")
    ap.add_argument("--sizes", default="64,1048576")
    ap.add_argument("--msgs", type=int, default=2000)
    ap.add_argument("--gap-us", type=int, default=200)
    ap.add_argument("--impl", default="ferry,zmq,vllm")
    ap.add_argument("--json")
    ap.add_argument("--remote", action="store_true")
    ap.add_argument("--connect-ip")
    ap.add_argument("--reader-netns")
    ap.add_argument("--reader-ip")
    if len(sys.argv) > 1 and sys.argv[1] == "--reader":
        impl, handle, total, rank = sys.argv[2:6]
        reader_main(impl, handle, int(total), int(rank))
        return 0
    a = ap.parse_args()
    os.environ.setdefault("FERRY_LOG", "error")
    out = {"msgs": a.msgs, "gap_us": a.gap_us, "remote": a.remote,
           "reader_netns": a.reader_netns, "results": [], "skipped": {}}
    for impl in a.impl.split(","):
        why = available(impl)
        if why:
            out["skipped"][impl] = why
            print(f"{impl}: skipped ({why})", flush=True)
            continue
        for n in map(int, a.readers.split(",")):
            for size in map(int, a.sizes.split(",")):
                r = run_one(impl, n, size, a.msgs, a.gap_us, a)
                r.update(impl=impl, readers=n, size=size, remote=a.remote)
                out["results"].append(r)
                print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
