"""Two real processes: shared memory (by name) and tcp (by address)."""
import ctypes
import os
import platform

import numpy as np

import pyferry
from conftest import child, finish, mapping_of

PRODUCER = """
import sys, numpy as np, pyferry
ns, mode = sys.argv[1], sys.argv[2]
kw = dict(listen="tcp://127.0.0.1:0") if mode == "tcp" else {}
with pyferry.Engine("child", ns=ns, pool_size=8 << 20, **kw) as e:
    print(e.address() or "-", flush=True)
    peer = e.peer("parent")
    if mode == "tcp":
        peer.connect(sys.stdin.readline().strip())
    buf = e.alloc(1 << 20)
    np.frombuffer(buf, dtype=np.uint8)[:] = np.arange(1 << 20) % 251
    e.put(peer, "big", buf, timeout=20, wait_peer=True)
    e.put(peer, "vec", [b"a" * 10, b"b" * 20], timeout=20, wait_peer=True)
    for i in range(4):
        e.put_chunk(peer, "s", bytes([i]) * 100, end=(i == 3), timeout=20, wait_peer=True)
    e.get(peer, "done", timeout=20).release()   # keep the pool mapped until the parent is done
"""


def expected():
    return (np.arange(1 << 20) % 251).astype(np.uint8)


def test_shm_zero_copy_across_processes(ns):
    with pyferry.Engine("parent", ns=ns, pool_size=8 << 20) as e:
        proc = child(PRODUCER, ns, "shm")
        got = e.get("child", "big", timeout=30)
        # the child's pool, mapped read-only here: no byte was copied
        line = mapping_of(got.address)
        assert line is not None and "memfd:child" in line and line.split()[1].startswith("r-"), line
        assert got.readonly
        assert np.array_equal(np.frombuffer(got, dtype=np.uint8), expected())
        got.release()
        assert e.get("child", "vec", timeout=30).tobytes() == b"a" * 10 + b"b" * 20
        chunks = [b.tobytes() for b in e.stream("child", "s", timeout=30)]
        assert chunks == [bytes([i]) * 100 for i in range(4)]
        e.put("child", "done", b"", timeout=30)
        finish(proc)


def test_tcp_across_processes(ns):
    with pyferry.Engine("parent", ns=ns, pool_size=8 << 20,
                        listen="tcp://127.0.0.1:0") as e:
        proc = child(PRODUCER, ns, "tcp")
        assert proc.stdout.readline().startswith("tcp://127.0.0.1:")
        proc.send(e.address())  # the child reads our address from stdin
        got = e.get("child", "big", timeout=30)
        assert np.array_equal(np.frombuffer(got, dtype=np.uint8), expected())
        assert "memfd:parent" in mapping_of(got.address)  # received into our own pool
        got.release()
        assert e.get("child", "vec", timeout=30).tobytes() == b"a" * 10 + b"b" * 20
        assert [b.tobytes() for b in e.stream("child", "s", timeout=30)] == \
            [bytes([i]) * 100 for i in range(4)]
        e.put("child", "done", b"", timeout=30)
        finish(proc)


PONG = """
import sys, pyferry
ns, n, busy = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
with pyferry.Engine("pong", ns=ns, pool_size=1 << 20, busy_poll=busy) as e:
    print(e.health()["fences"], flush=True)
    for i in range(n):
        got = e.get("ping", f"k{i}", timeout=20).tobytes()
        e.put("ping", f"r{i}", got[::-1], timeout=20, wait_peer=True)
"""


def membarrier_offered():
    """Does this kernel offer membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)? (x86-64 only)"""
    if platform.machine() != "x86_64" or os.environ.get("FERRY_MEMBARRIER") == "0":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    q = libc.syscall(324, 0, 0, 0)  # SYS_membarrier, MEMBARRIER_CMD_QUERY
    return q > 0 and bool(q & 2)    # MEMBARRIER_CMD_GLOBAL_EXPEDITED


def test_busy_poll_across_processes(ns, monkeypatch):
    """busy_poll engines (and one that is not) pass messages across processes, the
    waits sleeping between them; health says which fences each took."""
    n = 300
    # FERRY_MEMBARRIER=1 would put every engine on it (and =0 none): the flag alone decides here
    monkeypatch.delenv("FERRY_MEMBARRIER", raising=False)
    with pyferry.Engine("plain", ns=ns, pool_size=1 << 20) as e:
        assert e.health()["fences"] == "symmetric"
    for ping_busy, pong_busy in ((True, True), (True, False)):
        with pyferry.Engine("ping", ns=ns, pool_size=1 << 20, busy_poll=ping_busy) as e:
            if membarrier_offered():
                assert e.health()["fences"] == "membarrier"
            proc = child(PONG, ns, n, int(pong_busy))
            fences = proc.stdout.readline().strip()
            assert fences == ("symmetric" if not pong_busy else e.health()["fences"]), fences
            for i in range(n):
                e.put("pong", f"k{i}", f"msg{i}".encode(), timeout=20, wait_peer=True)
                assert e.get("pong", f"r{i}", timeout=20).tobytes() == f"msg{i}".encode()[::-1]
            finish(proc)
