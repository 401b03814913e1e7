"""An executor shaped like vLLM's MultiprocExecutor on pyferry.MessageQueue:
the driver broadcasts every call to its workers on one queue, each worker
answers on a response queue of its own (one reader: the driver).

    python python/examples/executor.py [WORKERS]

prints one line per call with the workers' answers. The queues' handles are
bytes: here they travel through a pipe, in vLLM through the workers' process
arguments or Ray actor constructor arguments.
"""
import multiprocessing as mp
import sys

import pyferry


def worker(rank, handle, conn):
    rpc = pyferry.MessageQueue.create_from_handle(handle, rank)       # the broadcast
    resp = pyferry.MessageQueue(1, 1, ns=rpc._ns, name=f"resp{rank}")  # my answers
    conn.send(resp.export_handle())
    rpc.wait_until_ready(timeout=30)
    resp.wait_until_ready(timeout=30)
    while True:
        method, args = rpc.dequeue(timeout=30)
        if method == "shutdown":
            break
        result = {"square": lambda x: x * x, "rank": lambda _: rank}[method](args)
        resp.enqueue((rank, result))
    resp.flush(timeout=10)
    resp.close()
    rpc.close()


class Executor:
    def __init__(self, n):
        self.rpc = pyferry.MessageQueue(n, n)
        ctx = mp.get_context("spawn")
        self.procs, self.resps = [], []
        for rank in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker, args=(rank, self.rpc.export_handle(), child))
            p.start()
            self.procs.append(p)
            self.resps.append(pyferry.MessageQueue.create_from_handle(parent.recv()))
        self.rpc.wait_until_ready(timeout=30)
        for r in self.resps:
            r.wait_until_ready(timeout=30)

    def collective_rpc(self, method, args=None, timeout=30):
        self.rpc.enqueue((method, args))                  # one write, every worker
        return [r.dequeue(timeout=timeout) for r in self.resps]

    def shutdown(self):
        self.rpc.enqueue(("shutdown", None))
        for p in self.procs:
            p.join(timeout=30)
        for r in self.resps:
            r.close()
        self.rpc.close()


if __name__ == "__main__":
    ex = Executor(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print("rank:", ex.collective_rpc("rank"))
    print("square(7):", ex.collective_rpc("square", 7))
    ex.shutdown()
