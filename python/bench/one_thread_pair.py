"""python/bench/one_thread_pair.py: two FerryConnector stages driven by one
thread (two stages of one process): put key i into stage 1 from stage 0,
then get it from stage 1, 2000 times after 200 not counted. Prints the mean
time of a put, of a get and of the pair, and each engine's poll_leases
(health): a thread that goes from one engine to another must not leave
either waiting on a lease (docs/design.md, section 5).

    python python/bench/one_thread_pair.py [--n 2000] [--tensor]

--tensor: the payload is a dict holding a 16-float torch tensor (the chunk
form; needs torch), else a dict holding 64 bytes.
"""
import argparse
import time

from pyferry.connector import FerryConnector


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--tensor", action="store_true")
    args = ap.parse_args()
    if args.tensor:
        import torch
        body = torch.zeros(16, dtype=torch.float32)
    else:
        body = b"x" * 64
    payload = {"hidden": body, "meta": {"req": "r1", "chunk": 3, "final": False}}
    ns = f"otp{time.time_ns()}"
    conns = [FerryConnector({"transport": "shm", "namespace": ns, "stage_id": s,
                             "pool_size": 64 << 20}) for s in (0, 1)]
    a, b = conns
    put_ns = get_ns = 0
    try:
        for i in range(200 + args.n):
            t0 = time.perf_counter_ns()
            if not a.put("0", "1", f"k{i}", payload)[0]:
                raise RuntimeError(f"put k{i} failed")
            t1 = time.perf_counter_ns()
            deadline = time.monotonic() + 10
            while b.get("0", "1", f"k{i}") is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"k{i}")
            t2 = time.perf_counter_ns()
            if i >= 200:
                put_ns += t1 - t0
                get_ns += t2 - t1
        n = args.n
        print(f"put {put_ns / n / 1e3:.1f} us, get {get_ns / n / 1e3:.1f} us, "
              f"pair {(put_ns + get_ns) / n / 1e3:.1f} us")
        for c in conns:
            for name, h in c.health()["engines"].items():
                print(f"{name}: poll_leases {h['ops'].get('poll_leases', 'n/a')}")
    finally:
        for c in conns:
            c.close()


if __name__ == "__main__":
    main()
