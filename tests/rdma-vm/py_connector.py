"""tests/rdma-vm/py_connector.py - FerryConnector over real verbs (Soft-RoCE),
inside ferry's RDMA test guest (suite.sh runs it with build-py/venv's python):
transport rdma and transport auto across the two rxe devices ($RDMA_IP0 on
rxe0: the receiving stage, $RDMA_IP1 on rxe1: the sending stage), each a
process of its own (a process must not fork after it opened RDMA devices:
the receiver is started first, with exec). Checks that the route is rdma
(the connector's health and the engine's peer), that an eager payload and
an announced one (RDMA READ) arrive whole, and exits 0 only then; every wait
is bounded. Exit 77: not in the guest.
"""
import json
import os
import subprocess
import sys

RECEIVER = r"""
import json, sys, time
from pyferry.connector import FerryConnector
cfg = json.loads(sys.argv[1])
with FerryConnector(cfg) as c:
    print(c.address(), flush=True)
    got = {}
    deadline = time.monotonic() + 120
    for key in ("small", "large"):
        r = c.get_with_deadline("0", "1", key, deadline=deadline)
        assert r is not None, key
        got[key] = r[0]
    assert got["small"] == {"n": 7, "b": b"x" * 100}, got["small"]
    big = got["large"]["b"]
    assert bytes(big) == (bytes(range(251)) * 12600)[:3 << 20], len(big)
    del got, big
    rd = c.health()["engines"]["stage1.rank0"]["rdma"]
    assert rd["reads"] >= 1 and rd["read_bytes"] >= 3 << 20, rd  # pulled with RDMA READ
    print("received", flush=True)
    sys.stdin.readline()
"""


def case(transport, listen0, listen1, ns):
    from pyferry.connector import FerryConnector
    recv_cfg = {"stage_id": 1, "role": "receiver", "namespace": ns, "transport": transport,
                "listen": listen0, "pool_size": 32 << 20}
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, json.dumps(recv_cfg)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        addr = proc.stdout.readline().strip()
        assert addr, "the receiver printed no address"
        if transport == "auto":
            assert addr.startswith("rdma://") and " tcp://" in addr, addr
        else:
            assert addr.startswith("rdma://") and " " not in addr, addr
        send_cfg = {"stage_id": 0, "role": "sender", "namespace": ns, "transport": transport,
                    "listen": listen1, "peers": {"1": addr}, "pool_size": 32 << 20,
                    "put_timeout": 60}
        with FerryConnector(send_cfg) as p:
            assert p.put("0", "1", "small", {"n": 7, "b": b"x" * 100})[0]  # eager SEND
            big = (bytes(range(251)) * 12600)[:3 << 20]  # announced: RDMA READ
            assert p.put("0", "1", "large", {"b": big})[0]
            h = p.health()
            assert h["routes"] == {"0->1": "rdma"} and h["fell_back"] is False, h
            eng = h["engines"]["stage0.rank0"]
            peer = next(x for x in eng["peers"] if x["name"] == "stage1.rank0")
            assert peer["transport"] == "rdma", peer
            assert eng["rdma"]["eager"] >= 1 and eng["rdma"]["connections_ready"] >= 1, eng
            line = proc.stdout.readline().strip()
            assert line == "received", line
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
        print(f"py_connector: transport {transport}: rdma route, {addr}", flush=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    ip0, ip1 = os.environ.get("RDMA_IP0"), os.environ.get("RDMA_IP1")
    if not ip0 or not ip1:
        print("py_connector: not in the RDMA test guest (RDMA_IP0/RDMA_IP1 unset)")
        return 77
    os.environ.setdefault("FERRY_SECRET", "py-connector-guest-secret")
    os.environ.setdefault("FERRY_RUNTIME_DIR", "/tmp/ferry-rdma/py-run")
    os.makedirs(os.environ["FERRY_RUNTIME_DIR"], mode=0o700, exist_ok=True)
    case("rdma", f"rdma://{ip0}:0", f"rdma://{ip1}:0", "py-rdma")
    case("auto", f"tcp://{ip0}:0", f"tcp://{ip1}:0", "py-auto")
    print("py_connector: 2 case(s) run apart: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
